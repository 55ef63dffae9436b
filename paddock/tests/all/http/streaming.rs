//! `?stream=true`: NDJSON lines as output is produced.

use std::time::Duration;

use serde_json::json;

use crate::http::client::Request;
use crate::http::support::{finish_stream, open_stream, sh, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_delivers_output_as_it_is_produced() {
    let t = TestServer::start();
    let mut s = Request::post("/v1/executions?stream=true")
        .json(&sh("echo a; echo e >&2; sleep 1; echo b"))
        .stream(t.addr)
        .await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(s.header("transfer-encoding"), Some("chunked"));
    let mut lines = Vec::new();
    while let Some(line) = s.next_line().await {
        lines.push(line);
    }
    let (_, started) = &lines[0];
    assert_eq!(started["type"], "started", "{started}");
    let id = started["id"].as_str().unwrap();
    let (result_at, result) = lines.last().unwrap();
    assert_eq!(result["type"], "result", "{result}");
    assert_eq!(result["id"], id);
    assert_eq!(result["outcome"], "completed");
    assert_eq!(result["exit_code"], 0);
    assert_eq!(result["stdout"], "a\nb\n");
    assert_eq!(result["stderr"], "e\n");

    let middle = &lines[1..lines.len() - 1];
    let data = |kind: &str| -> String {
        middle
            .iter()
            .filter(|(_, l)| l["type"] == kind)
            .map(|(_, l)| l["data"].as_str().unwrap())
            .collect()
    };
    for (_, l) in middle {
        assert!(l["type"] == "stdout" || l["type"] == "stderr", "{l}");
    }
    assert_eq!(data("stdout"), "a\nb\n");
    assert_eq!(data("stderr"), "e\n");
    let (first_out_at, first_out) = middle.iter().find(|(_, l)| l["type"] == "stdout").unwrap();
    assert_eq!(
        first_out["data"], "a\n",
        "`a` arrives on its own, before `b` exists"
    );
    let gap = result_at.duration_since(*first_out_at);
    assert!(
        gap >= Duration::from_millis(500),
        "the first stdout line came only {gap:?} before the result"
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_ends_with_an_error_line() {
    let t = TestServer::start();
    // A request wrong in itself is a 400 before any stream, as without `stream`.
    for path in ["/v1/executions?stream=true", "/v1/executions"] {
        let r = Request::post(path)
            .json(&json!({"program": {"command": ["true"]}, "limits": {"timeout_ms": 0}}))
            .send(t.addr)
            .await;
        let msg = r.expect_error(400, "INVALID_OPTIONS");
        assert!(msg.contains("limits.timeout_ms"), "{msg}");
    }
    // One refused once it is under way ends its stream with an error line.
    let (s, _) = open_stream(
        t.addr,
        "/v1/executions",
        &json!({"engine": "no-such-engine", "program": {"command": ["true"]}}),
    )
    .await;
    let (out, err, last) = finish_stream(s).await;
    assert_eq!((out.as_str(), err.as_str()), ("", ""));
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["error"]["code"], "CAPABILITY_NOT_SUPPORTED", "{last}");

    // A streamed execution that runs and fails still ends with its result.
    let (s, id) = open_stream(t.addr, "/v1/executions", &sh("echo partial; exit 4")).await;
    let (out, _, last) = finish_stream(s).await;
    assert_eq!(out, "partial\n");
    assert_eq!(last["type"], "result");
    assert_eq!(last["id"], id.as_str());
    assert_eq!(last["exit_code"], 4);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_output_streams_losslessly() {
    use base64::Engine as _;
    let t = TestServer::start();
    // Text, a character split across two writes, then bytes that are not UTF-8: a NUL,
    // 0xff, and the first two bytes of a three-byte character that never ends.
    let script =
        "printf 'caf\\303'; sleep 0.2; printf '\\251 '; sleep 0.2; printf '\\000\\377x\\342\\202'";
    let mut s = Request::post("/v1/executions?stream=true")
        .json(&sh(script))
        .stream(t.addr)
        .await;
    assert_eq!(s.status, 200);
    let mut bytes = Vec::new();
    let mut kinds = Vec::new();
    while let Some((_, line)) = s.next_line().await {
        if line["type"] != "stdout" {
            continue;
        }
        match (line.get("data"), line.get("data_base64")) {
            (Some(d), None) => {
                kinds.push("data");
                bytes.extend_from_slice(d.as_str().unwrap().as_bytes());
            }
            (None, Some(b)) => {
                kinds.push("data_base64");
                bytes.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(b.as_str().unwrap())
                        .expect("base64"),
                );
            }
            other => panic!("a chunk has exactly one of data and data_base64: {other:?}"),
        }
    }
    assert_eq!(bytes, b"caf\xc3\xa9 \x00\xffx\xe2\x82", "{kinds:?}");
    assert!(kinds.contains(&"data_base64"), "{kinds:?}");
    assert_eq!(
        kinds[0], "data",
        "text stays text, the split character included: {kinds:?}"
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_is_validated_once_streamed_or_not() {
    let t = TestServer::start();
    let tenant = format!("once-{}", paddock_core::ExecutionId::new());
    let probe = paddock_core::ValidationProbe::watch_tenant(&tenant);
    let r = Request::post("/v1/executions")
        .header("X-Paddock-Tenant", &tenant)
        .json(&sh("echo hi"))
        .send(t.addr)
        .await;
    assert_eq!(r.expect(200)["stdout"], "hi\n");
    assert_eq!(probe.count(), 1, "validated by the scheduler alone");

    let mut s = Request::post("/v1/executions?stream=true")
        .header("X-Paddock-Tenant", &tenant)
        .json(&sh("echo hi"))
        .stream(t.addr)
        .await;
    assert_eq!(s.status, 200);
    let mut last = None;
    while let Some((_, line)) = s.next_line().await {
        last = Some(line);
    }
    let last = last.expect("lines");
    assert_eq!(last["type"], "result", "{last}");
    assert_eq!(probe.count(), 2, "a streamed one too: once");

    // Refused before its stream, by that one validation.
    let r = Request::post("/v1/executions?stream=true")
        .header("X-Paddock-Tenant", &tenant)
        .json(&json!({"program": {"command": ["true"]}, "limits": {"timeout_ms": 0}}))
        .send(t.addr)
        .await;
    r.expect_error(400, "INVALID_OPTIONS");
    assert_eq!(probe.count(), 3);
    t.stop().await;
}

//! `POST /v1/executions`, `GET` and `DELETE /v1/executions/{id}`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::client::{delete, get, post_json, Request};
use crate::http::support::{
    finish_stream, open_stream, sh, wait_for_stdout, without_type, TestServer,
};

fn assert_result_shape(r: &Value) {
    let id = r["id"].as_str().expect("id");
    assert_eq!(id.len(), 36, "a UUID: {r}");
    assert_eq!(r["engine"], "subprocess", "{r}");
    for field in ["stdout_truncated", "stderr_truncated"] {
        assert!(r[field].is_boolean(), "{field}: {r}");
    }
    assert!(r["usage"]["wall_ms"].is_u64(), "{r}");
    let t = &r["timings"];
    let (q, s, f) = (
        t["queued_at_ms"].as_u64().unwrap(),
        t["started_at_ms"].as_u64().unwrap(),
        t["finished_at_ms"].as_u64().unwrap(),
    );
    assert!(q <= s && s <= f, "timings in order: {t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_answers_its_result() {
    let t = TestServer::start();
    let body = json!({
        "engine": "subprocess",
        "program": {"command": ["sh", "-c", "read line; echo \"$line-$GREETING\"; echo warn >&2; exit 3"]},
        "stdin": "in\n",
        "env": {"GREETING": "hello"},
        "limits": {"timeout_ms": 10000, "memory_bytes": 268435456, "pids": 64, "max_output_bytes": 65536},
        "network": "none",
        "level": "none"
    });
    let r = post_json(t.addr, "/v1/executions", &body).await;
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = r.expect(200);
    assert_result_shape(&r);
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["exit_code"], 3);
    assert!(r["signal"].is_null(), "{r}");
    assert_eq!(r["stdout"], "in-hello\n");
    assert_eq!(r["stderr"], "warn\n");
    assert_eq!(r["stdout_truncated"], false);
    assert_eq!(r["stderr_truncated"], false);

    // Only `program` is required; code runs with the language's interpreter.
    let r = post_json(
        t.addr,
        "/v1/executions",
        &json!({"program": {"language": "python", "code": "print(6 * 7)"}}),
    )
    .await
    .expect(200);
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["stdout"], "42\n", "{r}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_signal_timeout_and_truncation_reach_the_caller() {
    let t = TestServer::start();
    let r = post_json(t.addr, "/v1/executions", &sh("kill -KILL $$"))
        .await
        .expect(200);
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["exit_code"], 128 + 9);
    assert_eq!(r["signal"], 9);

    let started = Instant::now();
    let r = post_json(
        t.addr,
        "/v1/executions",
        &json!({"program": {"command": ["sleep", "10"]}, "limits": {"timeout_ms": 300}}),
    )
    .await
    .expect(200);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_result_shape(&r);
    assert_eq!(r["outcome"], "timed_out", "{r}");
    assert!(r["exit_code"].is_null(), "{r}");

    let r = post_json(
        t.addr,
        "/v1/executions",
        &json!({
            "program": {"command": ["sh", "-c", "head -c 1000 /dev/zero | tr '\\0' a"]},
            "limits": {"max_output_bytes": 16}
        }),
    )
    .await
    .expect(200);
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["stdout_truncated"], true, "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(out.starts_with(&"a".repeat(16)), "{out:?}");
    assert!(!out.contains(&"a".repeat(17)), "{out:?}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_returns_running_then_the_same_result() {
    let t = TestServer::start();
    let (mut s, id) = open_stream(
        t.addr,
        "/v1/executions",
        &sh("echo up; sleep 0.5; echo done"),
    )
    .await;
    wait_for_stdout(&mut s, "up").await;
    let running = get(t.addr, &format!("/v1/executions/{id}"))
        .await
        .expect(200);
    assert_eq!(running["status"], "running", "{running}");
    assert_eq!(running["id"], id.as_str());
    let (out, _, last) = finish_stream(s).await;
    assert_eq!(out, "done\n");
    assert_eq!(last["type"], "result");
    assert_eq!(last["stdout"], "up\ndone\n");
    let kept = get(t.addr, &format!("/v1/executions/{id}"))
        .await
        .expect(200);
    assert_eq!(kept, without_type(last));

    // A plain POST's answer is kept the same way.
    let answer = post_json(t.addr, "/v1/executions", &sh("echo kept"))
        .await
        .expect(200);
    let id = answer["id"].as_str().unwrap();
    let kept = get(t.addr, &format!("/v1/executions/{id}"))
        .await
        .expect(200);
    assert_eq!(kept, answer);
    assert_eq!(kept["stdout"], "kept\n");

    // Unknown and malformed ids.
    let r = get(
        t.addr,
        "/v1/executions/01a2299e-3e83-714b-8bc9-412c5fb1452d",
    )
    .await;
    r.expect_error(404, "NOT_FOUND");
    let r = get(t.addr, "/v1/executions/not-a-uuid").await;
    let msg = r.expect_error(400, "INVALID_OPTIONS");
    assert!(msg.contains("`id`"), "{msg}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_cancels_a_running_execution() {
    let t = TestServer::start();
    let started = Instant::now();
    let (mut s, id) = open_stream(t.addr, "/v1/executions", &sh("echo up; sleep 30")).await;
    wait_for_stdout(&mut s, "up").await;
    let r = delete(t.addr, &format!("/v1/executions/{id}"))
        .await
        .expect(200);
    assert_eq!(r["cancelled"], true, "{r}");
    assert_eq!(r["id"], id.as_str());
    let (_, _, last) = finish_stream(s).await;
    assert_eq!(last["type"], "result", "{last}");
    assert_eq!(last["outcome"], "cancelled", "{last}");
    assert_eq!(last["id"], id.as_str());
    assert!(started.elapsed() < Duration::from_secs(10));

    // Deleted: the id is unknown now, to GET and DELETE alike.
    get(t.addr, &format!("/v1/executions/{id}"))
        .await
        .expect_error(404, "NOT_FOUND");
    delete(t.addr, &format!("/v1/executions/{id}"))
        .await
        .expect_error(404, "NOT_FOUND");
    // A finished execution cancels nothing, and its kept result is deleted.
    let done = post_json(t.addr, "/v1/executions", &sh("true"))
        .await
        .expect(200);
    let done = done["id"].as_str().unwrap();
    let r = delete(t.addr, &format!("/v1/executions/{done}"))
        .await
        .expect(200);
    assert_eq!(r["cancelled"], false, "{r}");
    get(t.addr, &format!("/v1/executions/{done}"))
        .await
        .expect_error(404, "NOT_FOUND");
    delete(
        t.addr,
        "/v1/executions/01a2299e-3e83-714b-8bc9-412c5fb1452d",
    )
    .await
    .expect_error(404, "NOT_FOUND");

    // A plain POST waiting on the same execution (attached by its idempotency key;
    // the streamed request that runs it reports the id) answers `cancelled` too.
    let (mut s, id) = crate::http::support::open_stream_with(
        t.addr,
        Request::post("/v1/executions?stream=true")
            .header("Idempotency-Key", "cancel-me")
            .json(&sh("echo up; sleep 30")),
    )
    .await;
    wait_for_stdout(&mut s, "up").await;
    let plain = {
        let req = Request::post("/v1/executions")
            .header("Idempotency-Key", "cancel-me")
            .json(&sh("echo up; sleep 30"));
        let addr = t.addr;
        tokio::spawn(async move { req.send(addr).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !plain.is_finished(),
        "the attached POST waits for the execution"
    );
    let r = delete(t.addr, &format!("/v1/executions/{id}"))
        .await
        .expect(200);
    assert_eq!(r["cancelled"], true, "{r}");
    let answer = plain.await.unwrap().expect(200);
    assert_eq!(answer["outcome"], "cancelled", "{answer}");
    assert_eq!(answer["id"], id.as_str());
    let (_, _, last) = finish_stream(s).await;
    assert_eq!(without_type(last), answer);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_runs_in_an_isolate_with_a_value() {
    let t = TestServer::start();
    let r = post_json(
        t.addr,
        "/v1/executions",
        &json!({"engine": "isolate", "program": {"handler": "(a, b) => a * b", "input": [6, 7]}}),
    )
    .await
    .expect(200);
    assert_eq!(r["engine"], "isolate", "{r}");
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["value"], 42, "{r}");
    // The level alone picks the isolate engine; a blocked import is a typed failure.
    let r = post_json(
        t.addr,
        "/v1/executions",
        &json!({"level": "context-isolated", "program": {"language": "javascript", "code": "import fs from 'fs'"}}),
    )
    .await
    .expect(200);
    assert_eq!(r["engine"], "isolate", "{r}");
    assert_eq!(r["outcome"], "failed", "{r}");
    assert_eq!(r["error"]["code"], "BLOCKED_MODULE", "{r}");
}

/// A json-stdio handler that suspends on `approve-<id>` and answers the resume value.
const APPROVAL: &str = r#"
import json, sys
for line in sys.stdin:
    f = json.loads(line)
    if f["kind"] == "invoke":
        out = {"v": 1, "kind": "suspend", "id": f["id"], "token_id": "approve-" + f["id"]}
    elif f["kind"] == "resume":
        out = {"v": 1, "kind": "output", "id": f["id"], "output": {"approved": f["value"]}}
    else:
        continue
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_execution_that_suspends_is_resumed_by_another_execution() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("approval.py");
    std::fs::write(&script, APPROVAL).unwrap();
    let mut config = paddock::PaddockConfig::default();
    config.subprocess.handlers.insert(
        "approval".into(),
        paddock_engines::HandlerConfig {
            command: vec!["python3".into(), script.to_string_lossy().into_owned()],
        },
    );
    let t = TestServer::start_config(config, crate::http::support::server_config());
    let suspended = Request::post("/v1/executions")
        .header("x-paddock-tenant", "acme")
        .json(&json!({"program": {"handler": "approval", "input": {"change": 7}}}))
        .send(t.addr)
        .await
        .expect(200);
    assert_eq!(suspended["outcome"], "suspended", "{suspended}");
    let token = suspended["token_id"]
        .as_str()
        .expect("token_id")
        .to_string();
    assert_eq!(
        token,
        format!("approve-{}", suspended["id"].as_str().unwrap())
    );

    let resume = json!({"program": {"resume": token, "value": "yes"}});
    // Another tenant's resume finds nothing.
    Request::post("/v1/executions")
        .header("x-paddock-tenant", "mallory")
        .json(&resume)
        .send(t.addr)
        .await
        .expect_error(404, "NOT_FOUND");
    let done = Request::post("/v1/executions")
        .header("x-paddock-tenant", "acme")
        .json(&resume)
        .send(t.addr)
        .await
        .expect(200);
    assert_eq!(done["outcome"], "completed", "{done}");
    assert_eq!(done["value"], json!({"approved": "yes"}), "{done}");
    // A token resumes once.
    Request::post("/v1/executions")
        .header("x-paddock-tenant", "acme")
        .json(&resume)
        .send(t.addr)
        .await
        .expect_error(404, "NOT_FOUND");
    t.stop().await;
}

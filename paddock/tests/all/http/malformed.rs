//! Malformed bodies get 400 and leave executions in flight alone.

use serde_json::json;

use crate::http::client::{get, Request};
use crate::http::support::{finish_stream, open_stream, sh, wait_for_stdout, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_are_400_and_do_not_disturb_a_running_execution() {
    let t = TestServer::start();
    let (mut s, id) =
        open_stream(t.addr, "/v1/executions", &sh("echo up; sleep 1; echo done")).await;
    wait_for_stdout(&mut s, "up").await;

    let deep_array = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_input = format!(
        r#"{{"program":{{"handler":"h","input":{}{}}}}}"#,
        "{\"a\":".repeat(50_000),
        "}".repeat(50_000)
    );
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        (
            "truncated JSON",
            br#"{"program":{"command":["true"]"#.to_vec(),
        ),
        ("not JSON", b"program=true".to_vec()),
        ("null", b"null".to_vec()),
        ("an array", b"[1,2,3]".to_vec()),
        (
            "invalid UTF-8",
            b"{\"program\":{\"command\":[\"\xff\xfe\"]}}".to_vec(),
        ),
        (
            "command not a list",
            br#"{"program":{"command":"ls"}}"#.to_vec(),
        ),
        (
            "command of numbers",
            br#"{"program":{"command":[1,2]}}"#.to_vec(),
        ),
        (
            "stdin a number",
            br#"{"program":{"command":["true"]},"stdin":5}"#.to_vec(),
        ),
        (
            "timeout a string",
            br#"{"program":{"command":["true"]},"limits":{"timeout_ms":"soon"}}"#.to_vec(),
        ),
        (
            "negative limit",
            br#"{"program":{"command":["true"]},"limits":{"pids":-1}}"#.to_vec(),
        ),
        (
            "env not a map",
            br#"{"program":{"command":["true"]},"env":["A=1"]}"#.to_vec(),
        ),
        (
            "unknown field",
            br#"{"program":{"command":["true"]},"priority":9}"#.to_vec(),
        ),
        (
            "unknown program form",
            br#"{"program":{"script":"true"}}"#.to_vec(),
        ),
        ("huge nesting", deep_array.into_bytes()),
        ("huge nesting in a field", deep_input.into_bytes()),
    ];
    for (what, body) in &bodies {
        for path in ["/v1/executions", "/v1/executions?stream=true"] {
            let r = Request::post(path)
                .header("Content-Type", "application/json")
                .body(body.clone())
                .send(t.addr)
                .await;
            assert_eq!(r.status, 400, "{what} to {path}: {}", r.text());
            let v = r.json();
            assert_eq!(v["error"]["code"], "INVALID_OPTIONS", "{what}: {v}");
            assert!(v["error"]["message"].is_string(), "{what}: {v}");
        }
    }
    // A content type that is not what it claims does not matter either.
    let r = Request::post("/v1/executions")
        .header("Content-Type", "text/plain")
        .body(br#"{"program":{"command":"#.to_vec())
        .send(t.addr)
        .await;
    assert_eq!(r.status, 400, "{}", r.text());

    // The execution in flight completes normally.
    let (out, _, last) = finish_stream(s).await;
    assert_eq!(out, "done\n");
    assert_eq!(last["stdout"], "up\ndone\n");
    assert_eq!(last["type"], "result");
    assert_eq!(last["id"], id.as_str());
    assert_eq!(last["outcome"], "completed", "{last}");
    assert_eq!(last["exit_code"], 0);
    // And the server serves on.
    assert_eq!(get(t.addr, "/healthz").await.status, 200);
    let r = crate::http::client::post_json(
        t.addr,
        "/v1/executions",
        &json!({"program": {"command": ["echo", "after"]}}),
    )
    .await
    .expect(200);
    assert_eq!(r["stdout"], "after\n");
    t.stop().await;
}

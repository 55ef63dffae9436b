//! `/v1/sandboxes`: open, exec (plain and streamed), files, status, destroy, and
//! 409 for every call on a destroyed sandbox.

use serde_json::json;

use crate::http::client::{delete, get, post_json, Request};
use crate::http::support::{finish_stream, open_stream, sh, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_lifecycle_over_http() {
    let t = TestServer::start();
    let r = post_json(
        t.addr,
        "/v1/sandboxes",
        &json!({"engine": "subprocess", "limits": {"timeout_ms": 10000}, "network": "none"}),
    )
    .await
    .expect(201);
    let id = r["id"].as_str().expect("id").to_string();
    assert_eq!(r["engine"], "subprocess", "{r}");
    assert_eq!(r["status"], "ready", "{r}");
    let root = r["root_dir"].as_str().expect("root_dir").to_string();
    assert!(root.starts_with('/'), "{root}");
    let base = format!("/v1/sandboxes/{id}");

    let status = get(t.addr, &base).await.expect(200);
    assert_eq!(status["status"], "ready", "{status}");

    // Files: raw bytes in and out, parents created, listing with absolute paths.
    let bytes: Vec<u8> = (0..=255u8).chain(b"tail\n".iter().copied()).collect();
    let r = Request::put(&format!("{base}/files/data/in.bin"))
        .header("Content-Type", "application/octet-stream")
        .body(bytes.clone())
        .send(t.addr)
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(r.body.is_empty());
    let r = get(t.addr, &format!("{base}/files/data/in.bin")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.body, bytes);

    let list = get(t.addr, &format!("{base}/files?dir=data"))
        .await
        .expect(200);
    assert_eq!(
        list,
        json!([{"path": format!("{root}/data/in.bin"), "size": bytes.len(), "is_dir": false}])
    );
    let list = get(t.addr, &format!("{base}/files?dir=missing"))
        .await
        .expect(200);
    assert_eq!(list, json!([]));
    let list = get(t.addr, &format!("{base}/files")).await.expect(200);
    let entries = list.as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["path"] == format!("{root}/data") && e["is_dir"] == true),
        "{list}"
    );

    // Exec runs in the workdir and sees the files; what it writes can be read back.
    let r = post_json(
        t.addr,
        &format!("{base}/exec"),
        &sh("tail -c 5 data/in.bin; echo made > out.txt; pwd"),
    )
    .await
    .expect(200);
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["stdout"], format!("tail\n{root}\n"), "{r}");
    let r = get(t.addr, &format!("{base}/files/out.txt")).await;
    assert_eq!((r.status, r.text().as_str()), (200, "made\n"));

    // Streamed exec in the same sandbox: state persists between executions.
    let (s, exec_id) = open_stream(
        t.addr,
        &format!("{base}/exec"),
        &sh("cat out.txt; echo oops >&2"),
    )
    .await;
    let (out, err, last) = finish_stream(s).await;
    assert_eq!((out.as_str(), err.as_str()), ("made\n", "oops\n"));
    assert_eq!(last["type"], "result", "{last}");
    assert_eq!(last["id"], exec_id.as_str());
    assert_eq!(last["stdout"], "made\n");

    // Paths stay inside the workdir; missing files are 404.
    get(t.addr, &format!("{base}/files/../escape"))
        .await
        .expect_error(400, "PATH_ESCAPE");
    get(t.addr, &format!("{base}/files/nothing-here"))
        .await
        .expect_error(404, "NOT_FOUND");

    // Destroy: 204, idempotent, then every call is refused with 409.
    let r = delete(t.addr, &base).await;
    assert_eq!(r.status, 204, "{}", r.text());
    let r = delete(t.addr, &base).await;
    assert_eq!(r.status, 204, "{}", r.text());
    get(t.addr, &base)
        .await
        .expect_error(409, "ENGINE_DISPOSED");
    post_json(t.addr, &format!("{base}/exec"), &sh("true"))
        .await
        .expect_error(409, "ENGINE_DISPOSED");
    // Streamed: refused up front (409), or, like any refused stream, a 200 whose
    // only line after `started` is the error.
    let r = Request::post(&format!("{base}/exec?stream=true"))
        .json(&sh("true"))
        .send(t.addr)
        .await;
    if r.status == 409 {
        r.expect_error(409, "ENGINE_DISPOSED");
    } else {
        assert_eq!(r.status, 200, "{}", r.text());
        let lines: Vec<serde_json::Value> = r
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0]["type"], "started");
        assert_eq!(lines[1]["type"], "error");
        assert_eq!(lines[1]["error"]["code"], "ENGINE_DISPOSED", "{lines:?}");
    }
    let r = Request::put(&format!("{base}/files/x"))
        .body("x")
        .send(t.addr)
        .await;
    r.expect_error(409, "ENGINE_DISPOSED");
    get(t.addr, &format!("{base}/files/out.txt"))
        .await
        .expect_error(409, "ENGINE_DISPOSED");
    get(t.addr, &format!("{base}/files?dir=data"))
        .await
        .expect_error(409, "ENGINE_DISPOSED");
    // Its instance is recycled for the next sandbox: its files are gone.
    let root = std::path::Path::new(&root);
    assert!(
        !root.exists() || std::fs::read_dir(root).unwrap().next().is_none(),
        "the workdir is emptied on destroy"
    );

    // An unknown sandbox is 404 everywhere.
    let unknown = "/v1/sandboxes/sp-unknown";
    get(t.addr, unknown).await.expect_error(404, "NOT_FOUND");
    delete(t.addr, unknown).await.expect_error(404, "NOT_FOUND");
    post_json(t.addr, &format!("{unknown}/exec"), &sh("true"))
        .await
        .expect_error(404, "NOT_FOUND");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_opens_with_an_empty_body_and_refuses_unknown_fields() {
    let t = TestServer::start();
    let r = Request::post("/v1/sandboxes")
        .send(t.addr)
        .await
        .expect(201);
    assert_eq!(r["status"], "ready", "{r}");
    let msg = post_json(t.addr, "/v1/sandboxes", &json!({"limitz": {}}))
        .await
        .expect_error(400, "INVALID_OPTIONS");
    assert!(msg.contains("limitz"), "{msg}");
    let msg = post_json(t.addr, "/v1/sandboxes", &json!({"limits": {"pids": 0}}))
        .await
        .expect_error(400, "INVALID_OPTIONS");
    assert!(msg.contains("limits.pids"), "{msg}");
    let id = r["id"].as_str().unwrap();
    assert_eq!(
        delete(t.addr, &format!("/v1/sandboxes/{id}")).await.status,
        204
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_sandbox_pauses_and_unpauses_over_http() {
    let t = TestServer::start();
    let r = post_json(t.addr, "/v1/sandboxes", &json!({"engine": "container"})).await;
    if r.status != 201 {
        // No OCI runtime on this host: the engine is not configured.
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "{}",
            r.text()
        );
        r.expect_error(400, "CAPABILITY_NOT_SUPPORTED");
        t.stop().await;
        return;
    }
    let id = r.json()["id"].as_str().expect("id").to_string();
    let base = format!("/v1/sandboxes/{id}");
    let paused = post_json(t.addr, &format!("{base}/pause"), &json!({}))
        .await
        .expect(200);
    assert_eq!(paused["status"], "paused");
    assert_eq!(get(t.addr, &base).await.expect(200)["status"], "paused");
    post_json(t.addr, &format!("{base}/exec"), &sh("echo hi"))
        .await
        .expect_error(409, "SANDBOX_PAUSED");
    post_json(t.addr, &format!("{base}/unpause"), &json!({}))
        .await
        .expect(200);
    let r = post_json(t.addr, &format!("{base}/exec"), &sh("echo hi"))
        .await
        .expect(200);
    assert_eq!(r["stdout"], "hi\n", "{r}");
    // A subprocess sandbox cannot pause.
    let sp = post_json(t.addr, "/v1/sandboxes", &json!({"engine": "subprocess"}))
        .await
        .expect(201);
    let sp_id = sp["id"].as_str().unwrap();
    post_json(t.addr, &format!("/v1/sandboxes/{sp_id}/pause"), &json!({}))
        .await
        .expect_error(400, "CAPABILITY_NOT_SUPPORTED");
    delete(t.addr, &base).await;
    delete(t.addr, &format!("/v1/sandboxes/{sp_id}")).await;
    t.stop().await;
}

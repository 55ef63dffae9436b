//! Every error status: 400, 401, 404, 413, 429 and 503 (409 is in `sandboxes`).

use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::IsolationLevel;
use paddock_pool::http::ApiKey;
use paddock_pool::limiter::LimiterConfig;
use paddock_pool::PoolConfig;
use serde_json::{json, Value};

use crate::http::client::{get, post_json, Request, Response};
use crate::http::support::{
    eventually, finish_stream, open_stream, server_config, sh, wait_for_stdout, TestServer,
};

/// `Retry-After` in whole seconds, at least 1.
#[track_caller]
fn retry_after(r: &Response) -> u64 {
    let v = r
        .header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After on a {}: {}", r.status, r.text()));
    let secs: u64 = v.parse().unwrap_or_else(|_| panic!("Retry-After {v:?}"));
    assert!(secs >= 1, "Retry-After {secs}");
    secs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_are_400_naming_the_field() {
    let t = TestServer::start();
    let cases: [(Value, &str); 8] = [
        (
            json!({"program": {"command": ["true"]}, "limits": {"timeout_ms": 0}}),
            "limits.timeout_ms",
        ),
        (
            json!({"program": {"command": ["true"]}, "limits": {"pids": 0}}),
            "limits.pids",
        ),
        (
            json!({"program": {"command": ["true"]}, "limits": {"memory_bytes": 5}}),
            "limits.memory_bytes",
        ),
        (json!({"program": {"command": []}}), "program.command"),
        (
            json!({"program": {"command": ["true"]}, "progam": 1}),
            "progam",
        ),
        (
            json!({"program": {"command": ["true"]}, "limits": {"timeout": 5}}),
            "timeout",
        ),
        (json!({"stdin": "x"}), "program"),
        (
            json!({"program": {"command": ["true"]}, "level": "paranoid"}),
            "paranoid",
        ),
    ];
    for (body, field) in cases {
        let r = post_json(t.addr, "/v1/executions", &body).await;
        let msg = r.expect_error(400, "INVALID_OPTIONS");
        assert!(
            msg.contains(field),
            "{body}: the message names `{field}`: {msg}"
        );
    }
    // Isolation the engine lacks, and a program kind it does not run, are 400 too.
    post_json(
        t.addr,
        "/v1/executions",
        &json!({"program": {"command": ["true"]}, "engine": "subprocess", "level": "strict"}),
    )
    .await
    .expect_error(400, "LEVEL_NOT_SUPPORTED");
    post_json(
        t.addr,
        "/v1/executions",
        &json!({"program": {"handler": "h", "input": {}}}),
    )
    .await
    .expect_error(400, "CAPABILITY_NOT_SUPPORTED");
    // Query parameters are checked as well.
    let msg = Request::post("/v1/executions?stream=maybe")
        .json(&sh("true"))
        .send(t.addr)
        .await
        .expect_error(400, "INVALID_OPTIONS");
    assert!(msg.contains("query"), "{msg}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_required_and_name_the_tenant() {
    let key = "key-acme-0123456789";
    let mut server = server_config();
    server.api_keys = vec![
        ApiKey::new(key, "acme"),
        ApiKey::new("key-other-0123456789", "other"),
    ];
    // These tenants may use the subprocess engine (level `none`), which a server with
    // API keys refuses unless its operator allows it.
    server.allowed_levels = Some(vec![IsolationLevel::None]);
    let t = TestServer::start_with(paddock::builder(), server);
    let body = sh("echo authed");
    let unauthorized = |r: Response| {
        let v = r.expect(401);
        assert_eq!(v["error"]["code"], "UNAUTHORIZED", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("Authorization: Bearer"), "{msg}");
    };
    // Missing, wrong, a prefix of the right one, and the wrong scheme.
    unauthorized(post_json(t.addr, "/v1/executions", &body).await);
    for auth in [
        "Bearer wrong-key-0123456789",
        "Bearer key-acme-012345678",
        "Bearer ",
        "key-acme-0123456789",
        "Basic key-acme-0123456789",
    ] {
        let r = Request::post("/v1/executions")
            .header("Authorization", auth)
            .json(&body)
            .send(t.addr)
            .await;
        unauthorized(r);
    }
    // Every API route needs the key; health and metrics do not.
    for path in [
        "/v1/audit",
        "/v1/stats",
        "/v1/executions/01a2299e-3e83-714b-8bc9-412c5fb1452d",
        "/v1/sandboxes/sp-x",
        "/v1/sandboxes/sp-x/files?dir=",
    ] {
        unauthorized(get(t.addr, path).await);
    }
    unauthorized(Request::post("/v1/sandboxes").send(t.addr).await);
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(get(t.addr, path).await.status, 200, "{path}");
    }

    // The right key works, and the tenant is the key's, whatever the header says.
    let answer = Request::post("/v1/executions")
        .header("Authorization", &format!("Bearer {key}"))
        .header("X-Paddock-Tenant", "other")
        .json(&body)
        .send(t.addr)
        .await
        .expect(200);
    assert_eq!(answer["stdout"], "authed\n");
    let id = answer["id"].as_str().unwrap();
    let entries = Request::get("/v1/audit?tenant=acme")
        .header("Authorization", &format!("Bearer {key}"))
        .send(t.addr)
        .await
        .expect(200);
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["id"], id);
    assert_eq!(entries[0]["tenant"], "acme");
    let other = Request::get("/v1/audit?tenant=other")
        .header("Authorization", &format!("Bearer {key}"))
        .send(t.addr)
        .await
        .expect(200);
    assert_eq!(other, json!([]));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_ids_are_404() {
    let t = TestServer::start();
    for (method, path) in [
        ("GET", "/v1/nothing-here"),
        ("GET", "/"),
        ("POST", "/v1/executions/extra/segments"),
        ("GET", "/v2/executions"),
    ] {
        let r = Request::new(method, path).send(t.addr).await;
        r.expect_error(404, "NOT_FOUND");
    }
    // A known path with a method it does not take: 405, saying which it takes.
    for (method, path, allow) in [
        ("PATCH", "/v1/executions", "POST"),
        ("TRACE", "/v1/stats", "GET"),
        ("POST", "/v1/sandboxes/sp-x", "DELETE, GET"),
        ("DELETE", "/v1/sandboxes/sp-x/files/a/b.txt", "GET, PUT"),
    ] {
        let r = Request::new(method, path).send(t.addr).await;
        assert_eq!(r.header("allow"), Some(allow), "{method} {path}");
        r.expect_error(405, "INVALID_OPTIONS");
    }
    get(
        t.addr,
        "/v1/executions/01a2299e-3e83-714b-8bc9-412c5fb1452d",
    )
    .await
    .expect_error(404, "NOT_FOUND");
    get(t.addr, "/v1/sandboxes/sp-none")
        .await
        .expect_error(404, "NOT_FOUND");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_and_uploads_over_the_limits_are_413() {
    let mut server = server_config();
    server.max_body_bytes = 1024;
    server.max_file_bytes = 2048;
    let t = TestServer::start_with(paddock::builder(), server);

    let big = json!({"program": {"command": ["cat"]}, "stdin": "x".repeat(4096)});
    let msg = post_json(t.addr, "/v1/executions", &big)
        .await
        .expect_error(413, "INVALID_OPTIONS");
    assert!(msg.contains("server.max_body_bytes"), "{msg}");
    let stream = Request::post("/v1/executions?stream=true")
        .json(&big)
        .send(t.addr)
        .await;
    stream.expect_error(413, "INVALID_OPTIONS");
    // Just under the limit runs.
    let fits = json!({"program": {"command": ["cat"]}, "stdin": "y".repeat(900)});
    assert!(serde_json::to_vec(&fits).unwrap().len() <= 1024);
    let r = post_json(t.addr, "/v1/executions", &fits).await.expect(200);
    assert_eq!(r["stdout"], "y".repeat(900));

    let sb = post_json(t.addr, "/v1/sandboxes", &json!({}))
        .await
        .expect(201);
    let base = format!("/v1/sandboxes/{}", sb["id"].as_str().unwrap());
    post_json(t.addr, &format!("{base}/exec"), &big)
        .await
        .expect_error(413, "INVALID_OPTIONS");
    post_json(
        t.addr,
        "/v1/sandboxes",
        &json!({"limits": {}, "pad": "z".repeat(2000)}),
    )
    .await
    .expect_error(413, "INVALID_OPTIONS");
    // Uploads: exactly the limit is fine, one byte more is not (and writes nothing).
    let r = Request::put(&format!("{base}/files/ok.bin"))
        .body(vec![7u8; 2048])
        .send(t.addr)
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let msg = Request::put(&format!("{base}/files/big.bin"))
        .body(vec![7u8; 2049])
        .send(t.addr)
        .await
        .expect_error(413, "INVALID_OPTIONS");
    assert!(msg.contains("server.max_file_bytes"), "{msg}");
    get(t.addr, &format!("{base}/files/big.bin"))
        .await
        .expect_error(404, "NOT_FOUND");
    assert_eq!(
        get(t.addr, &format!("{base}/files/ok.bin"))
            .await
            .body
            .len(),
        2048
    );
    // The server is unharmed.
    assert_eq!(get(t.addr, "/healthz").await.status, 200);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_rate_gets_429_with_retry_after() {
    let limiter = LimiterConfig {
        max_executions_per_window: Some(1),
        ..LimiterConfig::default()
    };
    let t = TestServer::start_with(paddock::builder().limiter(limiter), server_config());
    let post = |tenant: &'static str| {
        Request::post("/v1/executions")
            .header("X-Paddock-Tenant", tenant)
            .json(&sh("echo ok"))
    };
    let r = post("t1").send(t.addr).await.expect(200);
    assert_eq!(r["stdout"], "ok\n");
    let refused = post("t1").send(t.addr).await;
    refused.expect_error(429, "RATE_LIMITED");
    let secs = retry_after(&refused);
    assert!(secs <= 60, "within the 60 s window: {secs}");
    assert!(refused.json()["error"]["retry_after_ms"].as_u64().unwrap() > 0);
    // Streamed, the refusal is the stream's error line.
    let (s, _) = crate::http::support::open_stream_with(
        t.addr,
        Request::post("/v1/executions?stream=true")
            .header("X-Paddock-Tenant", "t1")
            .json(&sh("echo ok")),
    )
    .await;
    let (_, _, last) = finish_stream(s).await;
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["error"]["code"], "RATE_LIMITED", "{last}");
    // Another tenant has its own quota.
    post("t2").send(t.addr).await.expect(200);
    // Refusals are not executions: the audit log holds only the accepted one.
    let entries = Request::get("/v1/audit")
        .header("X-Paddock-Tenant", "t1")
        .send(t.addr)
        .await
        .expect(200);
    assert_eq!(entries.as_array().unwrap().len(), 1, "{entries}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_is_503_at_once_with_retry_after() {
    let config = PaddockConfig {
        pool: PoolConfig {
            min_idle: 1,
            max_size: 1,
            max_waiting: 0,
            ..PoolConfig::default()
        },
        ..PaddockConfig::default()
    };
    let t = TestServer::start_config(config, server_config());
    // The one instance is prewarmed; while it is being created, a caller finds the
    // pool full already.
    let paddock = t.paddock.clone();
    eventually(
        Duration::from_secs(20),
        "the subprocess instance to be prewarmed",
        || {
            let paddock = paddock.clone();
            async move {
                paddock.stats().await.is_ok_and(|s| {
                    s.pools
                        .iter()
                        .any(|p| p.engine == paddock_core::EngineName::SUBPROCESS && p.idle == 1)
                })
            }
        },
    )
    .await;
    let (mut s, id) = open_stream(t.addr, "/v1/executions", &sh("echo up; sleep 30")).await;
    wait_for_stdout(&mut s, "up").await;

    let started = Instant::now();
    let r = post_json(t.addr, "/v1/executions", &sh("echo second")).await;
    let waited = started.elapsed();
    r.expect_error(503, "POOL_EXHAUSTED");
    retry_after(&r);
    assert!(
        waited < Duration::from_secs(2),
        "refused at once, not after {waited:?}"
    );
    // A sandbox needs an instance too.
    let r = post_json(t.addr, "/v1/sandboxes", &json!({})).await;
    r.expect_error(503, "POOL_EXHAUSTED");
    retry_after(&r);

    // The long one is unharmed; cancel it, and the pool serves again.
    let r = crate::http::client::delete(t.addr, &format!("/v1/executions/{id}")).await;
    assert_eq!(r.expect(200)["cancelled"], true);
    let (_, _, last) = finish_stream(s).await;
    assert_eq!(last["outcome"], "cancelled", "{last}");
    let addr = t.addr;
    eventually(
        Duration::from_secs(10),
        "the pool to serve again",
        || async move {
            let r = post_json(addr, "/v1/executions", &sh("echo again")).await;
            match r.status {
                200 => {
                    assert_eq!(r.json()["stdout"], "again\n");
                    true
                }
                503 => false,
                s => panic!("unexpected {s}: {}", r.text()),
            }
        },
    )
    .await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_refuses_new_work_with_503_and_finishes_the_running() {
    let t = TestServer::start();
    let ready = get(t.addr, "/readyz").await.expect(200);
    assert_eq!(ready["status"], "ready");
    let sb = post_json(t.addr, "/v1/sandboxes", &json!({}))
        .await
        .expect(201);
    let base = format!("/v1/sandboxes/{}", sb["id"].as_str().unwrap());
    let (mut s, _) = open_stream(
        t.addr,
        "/v1/executions",
        &sh("echo up; sleep 0.7; echo done"),
    )
    .await;
    wait_for_stdout(&mut s, "up").await;

    t.begin_drain();
    let r = get(t.addr, "/readyz").await.expect(503);
    assert_eq!(r["status"], "draining");
    assert_eq!(get(t.addr, "/healthz").await.status, 200);
    let refused = [
        post_json(t.addr, "/v1/executions", &sh("echo late")).await,
        Request::post("/v1/executions?stream=true")
            .json(&sh("echo late"))
            .send(t.addr)
            .await,
        post_json(t.addr, "/v1/sandboxes", &json!({})).await,
        post_json(t.addr, &format!("{base}/exec"), &sh("echo late")).await,
        Request::put(&format!("{base}/files/late.txt"))
            .body("late")
            .send(t.addr)
            .await,
    ];
    for r in refused {
        let v = r.expect(503);
        assert!(v["error"]["code"].is_string(), "{v}");
    }
    // Reads still work while draining.
    assert_eq!(get(t.addr, "/v1/stats").await.status, 200);
    assert_eq!(get(t.addr, &base).await.status, 200);

    let (out, _, last) = finish_stream(s).await;
    assert_eq!(out, "done\n");
    assert_eq!(last["outcome"], "completed", "{last}");
    assert_eq!(last["stdout"], "up\ndone\n");
    // Nothing late ran: only the first execution is in the audit log.
    let entries = get(t.addr, "/v1/audit").await.expect(200);
    assert_eq!(entries.as_array().unwrap().len(), 1, "{entries}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_admitted_before_the_drain_and_run_after_it_gets_503() {
    let t = TestServer::start();
    let (mut long, _) = open_stream(t.addr, "/v1/executions", &sh("echo up; sleep 30")).await;
    wait_for_stdout(&mut long, "up").await;
    // Two requests get in (head and part of the body) while the server admits...
    let late = Request::post("/v1/executions").json(&sh("echo late"));
    let during = late.send_partial(t.addr, 10).await;
    let after = late.send_partial(t.addr, 10).await;
    let sandbox = Request::post("/v1/sandboxes")
        .json(&json!({}))
        .send_partial(t.addr, 1)
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ...then the drain begins, as `paddock serve` does it: stop admitting, then
    // shut Paddock down, letting the running execution finish for up to 1 s.
    t.begin_drain();
    let shutdown = {
        let paddock = t.paddock.clone();
        tokio::spawn(async move { paddock.shutdown(Duration::from_secs(1)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!shutdown.is_finished(), "still draining the long execution");
    // Their bodies arrive while Paddock drains, and after it stopped.
    let r = during.finish().await;
    assert!(r.expect(503)["error"]["code"].is_string(), "{}", r.text());
    let r = sandbox.finish().await;
    assert!(r.expect(503)["error"]["code"].is_string(), "{}", r.text());
    let report = shutdown.await.unwrap().unwrap();
    assert_eq!(report.cancelled, 1, "{report:?}");
    let r = after.finish().await;
    assert!(r.expect(503)["error"]["code"].is_string(), "{}", r.text());
    let (_, _, last) = finish_stream(long).await;
    assert_eq!(last["outcome"], "cancelled", "{last}");
    t.stop_server().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_sandbox_is_invisible_to_other_tenants() {
    let (acme, other) = ("key-acme-0123456789", "key-other-0123456789");
    let mut server = server_config();
    server.api_keys = vec![ApiKey::new(acme, "acme"), ApiKey::new(other, "other")];
    // These tenants may use the subprocess engine (level `none`), which a server with
    // API keys refuses unless its operator allows it.
    server.allowed_levels = Some(vec![IsolationLevel::None]);
    let t = TestServer::start_with(paddock::builder(), server);
    let as_ = |key: &str, r: Request| r.header("Authorization", &format!("Bearer {key}"));
    let created = as_(acme, Request::post("/v1/sandboxes"))
        .send(t.addr)
        .await
        .expect(201);
    let id = created["id"].as_str().unwrap().to_string();
    let base = format!("/v1/sandboxes/{id}");
    // Every sandbox route answers the other tenant as if the sandbox did not exist.
    let routes: Vec<Request> = vec![
        Request::get(&base),
        Request::post(&format!("{base}/exec")).json(&sh("echo leaked")),
        Request::get(&format!("{base}/files?dir=")),
        Request::get(&format!("{base}/files/a.txt")),
        Request::put(&format!("{base}/files/a.txt")).body(b"x".to_vec()),
        Request::post(&format!("{base}/pause")),
        Request::post(&format!("{base}/unpause")),
        Request::post(&format!("{base}/processes")).json(&json!({"argv": ["true"]})),
        Request::get(&format!("{base}/processes")),
        Request::get(&format!("{base}/processes/p1")),
        Request::post(&format!("{base}/terminals")).json(&json!({})),
        Request::get(&format!("{base}/tcp/8000")),
        Request::delete(&base),
    ];
    for r in routes {
        let answer = as_(other, r.clone()).send(t.addr).await;
        answer.expect_error(404, "NOT_FOUND");
    }
    // Its owner still has it, untouched.
    let r = as_(
        acme,
        Request::post(&format!("{base}/exec")).json(&sh("echo mine")),
    )
    .send(t.addr)
    .await
    .expect(200);
    assert_eq!(r["stdout"], "mine\n", "{r}");
    let r = as_(acme, Request::delete(&base)).send(t.addr).await;
    assert_eq!(r.status, 204, "{}", r.text());
    t.stop().await;
}

//! Tenants are walls: a two-tenant matrix over every route of the route table, the
//! operator role, per-tenant fair shares, the operator's ceilings and allowances.
//!
//! The matrix walks `paddock_pool::http::route_table()`, so a route added later
//! joins it: tenant B, holding its own valid key, must get 404 `NOT_FOUND` for every
//! object of tenant A, and never one byte of A's output, ids or code hashes from any
//! route.

use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{IsolationLevel, NetworkKind};
use paddock_pool::http::ApiKey;
use paddock_pool::limiter::LimiterConfig;
use serde_json::{json, Value};

use crate::http::client::{Request, Response};
use crate::http::support::{eventually, server_config, sh, TestServer};

const ALICE: &str = "key-alice-0123456789";
const BOB: &str = "key-bob-0123456789ab";
const OPS: &str = "key-ops-0123456789abc";

fn as_(key: &str, r: Request) -> Request {
    r.header("Authorization", &format!("Bearer {key}"))
}

/// A server with keys for alice, bob and an operator, whose tenants may use the
/// subprocess engine.
fn keyed_server(config: PaddockConfig) -> TestServer {
    let mut server = server_config();
    let mut ops = ApiKey::new(OPS, "ops");
    ops.admin = true;
    server.api_keys = vec![ApiKey::new(ALICE, "alice"), ApiKey::new(BOB, "bob"), ops];
    server.allowed_levels = Some(vec![
        IsolationLevel::None,
        IsolationLevel::ContextIsolated,
        IsolationLevel::Strict,
    ]);
    TestServer::start_with(paddock::builder().config(config), server)
}

/// What of alice's must never reach bob.
struct Secrets {
    markers: Vec<String>,
}

impl Secrets {
    /// Checks an answer to bob; `asked` is what bob's request named itself (an id
    /// an error may quote back).
    fn check_except(&self, route: &str, r: &Response, asked: &str) {
        let text = r.text();
        for m in self.markers.iter().filter(|m| m.as_str() != asked) {
            assert!(
                !text.contains(m.as_str()),
                "{route} answered bob with alice's `{m}`: {} {text}",
                r.status
            );
        }
    }

    fn check(&self, route: &str, r: &Response) {
        self.check_except(route, r, "")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_b_sees_nothing_of_tenant_a_on_any_route() {
    let t = keyed_server(PaddockConfig::default());
    let addr = t.addr;
    let secret = format!("alice-secret-output-{}", std::process::id());

    // Alice's objects: a finished execution, a running one, a sandbox with a file
    // and a background process.
    let done = as_(ALICE, Request::post("/v1/executions"))
        .json(&sh(&format!("echo {secret}")))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(done["stdout"], format!("{secret}\n"), "{done}");
    let done_id = done["id"].as_str().unwrap().to_string();
    let running = {
        let r = as_(ALICE, Request::post("/v1/executions?stream=true"))
            .json(&sh("sleep 30"))
            .stream(addr)
            .await;
        assert_eq!(r.status, 200);
        r
    };
    let mut running = running;
    let (_, started) = running.next_line().await.expect("a started line");
    let running_id = started["id"].as_str().unwrap().to_string();
    let sandbox = as_(ALICE, Request::post("/v1/sandboxes"))
        .send(addr)
        .await
        .expect(201);
    let sandbox_id = sandbox["id"].as_str().unwrap().to_string();
    let base = format!("/v1/sandboxes/{sandbox_id}");
    let put = as_(ALICE, Request::put(&format!("{base}/files/a.txt")))
        .body(secret.clone().into_bytes())
        .send(addr)
        .await;
    assert_eq!(put.status, 204, "{}", put.text());
    let process = as_(ALICE, Request::post(&format!("{base}/processes")))
        .json(&json!({"argv": ["sh", "-c", format!("echo {secret}; sleep 30")]}))
        .send(addr)
        .await
        .expect(201);
    let process_id = process["id"].as_str().unwrap().to_string();
    let process_exec = process["execution_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let audit = as_(ALICE, Request::get("/v1/audit"))
        .send(addr)
        .await
        .expect(200);
    let alice_hash = audit
        .as_array()
        .and_then(|a| a.iter().find(|e| e["id"] == done_id.as_str()))
        .map(|e| e["code_hash"].as_str().unwrap().to_string())
        .expect("alice's own audit has her execution");

    let mut markers = vec![
        secret.clone(),
        done_id.clone(),
        running_id.clone(),
        sandbox_id.clone(),
        alice_hash.clone(),
        "alice".to_string(),
    ];
    if !process_exec.is_empty() {
        markers.push(process_exec);
    }
    let secrets = Secrets { markers };

    // Every route of the table, with alice's ids where it takes ids, and the same
    // route with ids that never existed: bob's two answers must be the same.
    let never_sandbox = "sp-00000000000000000000000000000000-0";
    let never_execution = paddock_core::ExecutionId::new().to_string();
    let bob_request = |method: &str, pattern: &str, path: &str| {
        let req = as_(BOB, Request::new(method, path));
        match (method, pattern) {
            ("POST", "/v1/executions") => req.json(&sh("echo bob")),
            ("POST", p) if p.ends_with("/exec") => req.json(&sh("cat a.txt")),
            ("POST", p) if p.ends_with("/processes") => req.json(&json!({"argv": ["true"]})),
            ("POST", p) if p.ends_with("/terminals") => req.json(&json!({})),
            ("POST", p) if p.ends_with("/signal") => req.json(&json!({"signal": 9})),
            ("PUT", _) => req.body(b"bob".to_vec()),
            _ => req,
        }
    };
    let fill = |pattern: &str, id: &str, process: &str| {
        pattern
            .replace("{id}", id)
            .replace("{process}", process)
            .replace("{path}", "a.txt")
            .replace("{port}", "8000")
    };
    // What bob's answer says once the ids it named are taken out.
    let shape = |r: &Response, ids: &[&str]| {
        let v = r.json();
        let mut text = v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for id in ids {
            text = text.replace(id, "<id>");
        }
        (r.status, v["error"]["code"].clone(), text)
    };
    let mut walked = 0;
    for (method, pattern) in paddock_pool::http::route_table() {
        let method = method.to_uppercase();
        let route = format!("{method} {pattern}");
        if !pattern.contains('{') {
            let r = bob_request(&method, pattern, pattern).send(addr).await;
            secrets.check(&route, &r);
            if method == "POST" && pattern == "/v1/sandboxes" {
                // Bob's own sandbox: fine, and closed again.
                let id = r.expect(201)["id"].as_str().unwrap().to_string();
                let d = as_(BOB, Request::delete(&format!("/v1/sandboxes/{id}")))
                    .send(addr)
                    .await;
                assert_eq!(d.status, 204, "{}", d.text());
            }
            walked += 1;
            continue;
        }
        let (targets, never): (Vec<&str>, &str) = if pattern.starts_with("/v1/executions/{id}") {
            (vec![&done_id, &running_id], &never_execution)
        } else {
            (vec![&sandbox_id], never_sandbox)
        };
        for target in targets {
            let r = bob_request(&method, pattern, &fill(pattern, target, &process_id))
                .send(addr)
                .await;
            secrets.check_except(&route, &r, target);
            let code = r.json()["error"]["code"].clone();
            assert_eq!(
                (r.status, code.as_str()),
                (404, Some("NOT_FOUND")),
                "{route} on alice's object answered bob: {}",
                r.text()
            );
            let unknown = bob_request(&method, pattern, &fill(pattern, never, "p999"))
                .send(addr)
                .await;
            assert_eq!(
                shape(&r, &[target, &process_id]),
                shape(&unknown, &[never, "p999"]),
                "{route}: alice's id and an id that never existed answer bob differently"
            );
            walked += 1;
        }
    }
    // Alice's process id inside bob's own sandbox is an unknown process too.
    let own = as_(BOB, Request::post("/v1/sandboxes"))
        .send(addr)
        .await
        .expect(201);
    let own_base = format!("/v1/sandboxes/{}", own["id"].as_str().unwrap());
    let r = as_(
        BOB,
        Request::get(&format!("{own_base}/processes/{process_id}")),
    )
    .send(addr)
    .await;
    let unknown = as_(BOB, Request::get(&format!("{own_base}/processes/p999")))
        .send(addr)
        .await;
    secrets.check("GET bob's sandbox with alice's process id", &r);
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(shape(&r, &[&process_id]), shape(&unknown, &["p999"]));
    as_(BOB, Request::delete(&own_base)).send(addr).await;
    assert!(
        walked > 25,
        "the route table was walked ({walked} requests)"
    );

    // The tenant filter cannot widen bob's view.
    let r = as_(BOB, Request::get("/v1/audit?tenant=alice"))
        .send(addr)
        .await;
    secrets.check("GET /v1/audit?tenant=alice", &r);
    assert_eq!(r.expect(200), json!([]));
    // Bob's statistics are his own.
    let stats = as_(BOB, Request::get("/v1/stats"))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(stats["scheduler"]["tenant"], "bob", "{stats}");
    assert!(
        stats["scheduler"].get("accepted_total").is_none(),
        "{stats}"
    );
    assert_eq!(stats["scheduler"]["sandboxes"], 0, "{stats}");

    // Nothing of alice's was touched: her running execution still runs, her sandbox
    // and process are there, her file says what she wrote.
    let r = as_(ALICE, Request::get(&format!("/v1/executions/{running_id}")))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["status"], "running", "bob's DELETE cancelled it: {r}");
    let file = as_(ALICE, Request::get(&format!("{base}/files/a.txt")))
        .send(addr)
        .await;
    assert_eq!(file.status, 200);
    assert_eq!(file.text(), secret);
    let p = as_(
        ALICE,
        Request::get(&format!("{base}/processes/{process_id}")),
    )
    .send(addr)
    .await
    .expect(200);
    assert!(p["exit"].is_null(), "{p}");

    // The operator sees both tenants, and its use is recorded.
    let r = as_(OPS, Request::get(&format!("/v1/executions/{done_id}")))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["stdout"], format!("{secret}\n"));
    let all = as_(OPS, Request::get("/v1/audit?limit=1000"))
        .send(addr)
        .await
        .expect(200);
    let tenants: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["tenant"].as_str())
        .collect();
    assert!(
        tenants.contains(&"alice") && tenants.contains(&"bob"),
        "{tenants:?}"
    );
    let ops_stats = as_(OPS, Request::get("/v1/stats"))
        .send(addr)
        .await
        .expect(200);
    assert!(ops_stats["scheduler"]["accepted_total"].as_u64().unwrap() >= 3);
    let accesses = eventually_accesses(addr, &done_id).await;
    assert!(
        accesses.iter().any(|a| a["operator"] == "ops"
            && a["action"] == "execution.get"
            && a["target"] == done_id.as_str()),
        "{accesses:?}"
    );
    assert!(accesses.iter().any(|a| a["action"] == "audit.search"));
    // Tenants do not see the operator record.
    as_(BOB, Request::get("/v1/audit/operator"))
        .send(addr)
        .await
        .expect_error(404, "NOT_FOUND");
    // /metrics carries no tenant names.
    let metrics = Request::get("/metrics").send(addr).await;
    assert_eq!(metrics.status, 200);
    for name in ["alice", "bob", "ops"] {
        assert!(!metrics.text().contains(name), "/metrics names `{name}`");
    }

    // Alice ends her work.
    let c = as_(
        ALICE,
        Request::delete(&format!("/v1/executions/{running_id}")),
    )
    .send(addr)
    .await
    .expect(200);
    assert_eq!(c["cancelled"], true, "{c}");
    let (_, end) = running.lines().await.pop().expect("a last line");
    assert_eq!(end["outcome"], "cancelled", "{end}");
    let d = as_(ALICE, Request::delete(&base)).send(addr).await;
    assert_eq!(d.status, 204);
    // Destroyed, it stays invisible to bob and known to alice.
    as_(BOB, Request::get(&base))
        .send(addr)
        .await
        .expect_error(404, "NOT_FOUND");
    as_(BOB, Request::delete(&base))
        .send(addr)
        .await
        .expect_error(404, "NOT_FOUND");
    let d = as_(ALICE, Request::delete(&base)).send(addr).await;
    assert_eq!(d.status, 204, "a repeated destroy by the owner is fine");
    t.stop().await;
}

/// The operator-access record, once it shows the operator's look at `id`.
async fn eventually_accesses(addr: std::net::SocketAddr, id: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = as_(OPS, Request::get("/v1/audit/operator"))
            .send(addr)
            .await
            .expect(200);
        let list = r.as_array().cloned().unwrap_or_default();
        if list.iter().any(|a| a["target"] == id) || Instant::now() > deadline {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_caps_does_not_starve_the_others() {
    let config = PaddockConfig {
        limiter: LimiterConfig {
            max_sandboxes_per_tenant: Some(3),
            max_slots_per_tenant: Some(4),
            ..LimiterConfig::default()
        },
        ..PaddockConfig::default()
    };
    let mut config = config;
    config.pool.max_size = 6;
    config.subprocess.warm.enabled = false;
    let mut server = server_config();
    server.max_websockets_per_tenant = 2;
    server.api_keys = vec![ApiKey::new(ALICE, "alice"), ApiKey::new(BOB, "bob")];
    server.allowed_levels = Some(vec![IsolationLevel::None]);
    let t = TestServer::start_with(paddock::builder().config(config), server);
    let addr = t.addr;

    // Bob opens sandboxes up to his cap; the next is refused at once.
    let mut bobs = Vec::new();
    for _ in 0..3 {
        let r = as_(BOB, Request::post("/v1/sandboxes")).send(addr).await;
        bobs.push(r.expect(201)["id"].as_str().unwrap().to_string());
    }
    let started = Instant::now();
    let r = as_(BOB, Request::post("/v1/sandboxes")).send(addr).await;
    let msg = r.expect_error(429, "RATE_LIMITED");
    assert!(msg.contains("max_sandboxes_per_tenant = 3"), "{msg}");
    assert!(r.json()["error"]["retry_after_ms"].as_u64().is_some());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once"
    );
    // His fourth slot is one pooled execution; a fifth is refused.
    let long = tokio::spawn(async move {
        as_(BOB, Request::post("/v1/executions"))
            .json(&sh("sleep 3"))
            .send(addr)
            .await
    });
    eventually(Duration::from_secs(10), "bob's execution runs", || async {
        let s = as_(BOB, Request::get("/v1/stats")).send(addr).await.json();
        s["scheduler"]["in_flight"] == 1
    })
    .await;
    let r = as_(BOB, Request::post("/v1/executions"))
        .json(&sh("echo more"))
        .send(addr)
        .await;
    let msg = r.expect_error(503, "POOL_EXHAUSTED");
    assert!(msg.contains("max_slots_per_tenant = 4"), "{msg}");
    assert!(r.json()["error"]["retry_after_ms"].as_u64().is_some());
    // WebSockets: bob's first two attach sockets open, the third is refused.
    let base = format!("/v1/sandboxes/{}", bobs[0]);
    let p = as_(BOB, Request::post(&format!("{base}/processes")))
        .json(&json!({"argv": ["sleep", "30"]}))
        .send(addr)
        .await
        .expect(201);
    let url = format!(
        "ws://{addr}{base}/processes/{}/attach",
        p["id"].as_str().unwrap()
    );
    let mut sockets = Vec::new();
    for _ in 0..2 {
        sockets.push(ws_connect(&url, BOB).await.expect("within the cap"));
    }
    let refused = ws_connect(&url, BOB).await.expect_err("over the cap");
    assert!(refused.contains("429"), "{refused}");

    // Alice is unaffected: she opens a sandbox and runs an execution promptly.
    let started = Instant::now();
    let s = as_(ALICE, Request::post("/v1/sandboxes"))
        .send(addr)
        .await
        .expect(201);
    let r = as_(ALICE, Request::post("/v1/executions"))
        .json(&sh("echo fine"))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["stdout"], "fine\n");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "alice waited {:?} behind bob",
        started.elapsed()
    );
    let id = s["id"].as_str().unwrap();
    as_(ALICE, Request::delete(&format!("/v1/sandboxes/{id}")))
        .send(addr)
        .await;

    // Bob's places come back when his work ends: exactly his caps again.
    drop(sockets);
    let done = long.await.unwrap();
    assert_eq!(done.status, 200, "{}", done.text());
    // The server sees the sockets close a moment later.
    let deadline = Instant::now() + Duration::from_secs(5);
    let first = loop {
        match ws_connect(&url, BOB).await {
            Ok(ws) => break ws,
            Err(e) => assert!(Instant::now() < deadline, "no place came back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let second = loop {
        match ws_connect(&url, BOB).await {
            Ok(ws) => break ws,
            Err(e) => assert!(Instant::now() < deadline, "only one place came back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ws_connect(&url, BOB)
        .await
        .expect_err("the cap holds again after the places came back");
    drop((first, second));
    let d = as_(BOB, Request::delete(&format!("/v1/sandboxes/{}", bobs[1])))
        .send(addr)
        .await;
    assert_eq!(d.status, 204);
    // Sandboxes: 2 open, 1 more fits, then the cap (3) refuses.
    as_(BOB, Request::post("/v1/sandboxes"))
        .send(addr)
        .await
        .expect(201);
    as_(BOB, Request::post("/v1/sandboxes"))
        .send(addr)
        .await
        .expect_error(429, "RATE_LIMITED");
    // Slots: 3 sandboxes hold 3 of 4; the pooled execution's slot came back, so one
    // more execution runs.
    let r = as_(BOB, Request::post("/v1/executions"))
        .json(&sh("echo slot"))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["stdout"], "slot\n");
    t.stop().await;
}

/// Opens a WebSocket as `key`; the error names the refusal's status.
async fn ws_connect(
    url: &str,
    key: &str,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    String,
> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("Authorization", format!("Bearer {key}").parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ceilings_and_allowances_are_refused_by_name() {
    let mut config: PaddockConfig = PaddockConfig::from_toml_str(
        "[limits]\ntimeout_ms = 2000\nmemory_bytes = 67108864\n\
         [limits.max]\ntimeout_ms = 10000\nmemory_bytes = 134217728\n",
    )
    .unwrap();
    config.subprocess.warm.enabled = false;
    // No allowances given: the multi-tenant defaults.
    let mut server = server_config();
    let mut open = ApiKey::new(ALICE, "alice");
    open.allowed_levels = Some(vec![IsolationLevel::None, IsolationLevel::ContextIsolated]);
    open.allowed_networks = Some(vec![NetworkKind::None, NetworkKind::Unrestricted]);
    server.api_keys = vec![open, ApiKey::new(BOB, "bob")];
    let t = TestServer::start_with(paddock::builder().config(config), server);
    let addr = t.addr;

    // Above a ceiling: refused with the field and the bound, for executions and
    // sandboxes alike.
    for (field, value, bound) in [
        ("timeout_ms", json!(86_400_000u64), "10000"),
        ("memory_bytes", json!(70_368_744_177_664u64), "134217728"),
        ("max_output_bytes", json!(4_294_967_296u64), "67108864"),
    ] {
        let mut body = sh("echo hi");
        body["limits"] = json!({ field: value });
        let msg = as_(ALICE, Request::post("/v1/executions"))
            .json(&body)
            .send(addr)
            .await
            .expect_error(400, "INVALID_OPTIONS");
        assert!(
            msg.contains(&format!("limits.{field}")) && msg.contains(bound),
            "{msg}"
        );
        let msg = as_(ALICE, Request::post("/v1/sandboxes"))
            .json(&json!({"limits": { field: value }}))
            .send(addr)
            .await
            .expect_error(400, "INVALID_OPTIONS");
        assert!(msg.contains(bound), "{msg}");
    }
    // At the ceiling it runs.
    let mut body = sh("echo at-the-bound");
    body["limits"] = json!({"timeout_ms": 10_000});
    let r = as_(ALICE, Request::post("/v1/executions"))
        .json(&body)
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["stdout"], "at-the-bound\n");

    // Bob has the defaults of a server with keys: no level `none` (the subprocess
    // engine), no unrestricted network.
    let msg = as_(BOB, Request::post("/v1/executions"))
        .json(&json!({"engine": "subprocess", "program": {"command": ["true"]}}))
        .send(addr)
        .await
        .expect_error(400, "INVALID_OPTIONS");
    assert!(
        msg.contains("level `none`") && msg.contains("`bob`"),
        "{msg}"
    );
    let msg = as_(BOB, Request::post("/v1/sandboxes"))
        .json(&json!({"engine": "subprocess"}))
        .send(addr)
        .await
        .expect_error(400, "INVALID_OPTIONS");
    assert!(msg.contains("level `none`"), "{msg}");
    let msg = as_(BOB, Request::post("/v1/executions"))
        .json(&json!({"engine": "isolate", "network": "unrestricted", "program": {"language": "javascript", "code": "1"}}))
        .send(addr)
        .await
        .expect_error(400, "INVALID_OPTIONS");
    assert!(msg.contains("network `unrestricted`"), "{msg}");
    // With no engine named, bob's JavaScript goes to an engine he may use.
    let r = as_(BOB, Request::post("/v1/executions"))
        .json(&json!({"program": {"language": "javascript", "code": "6*7"}}))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["value"], 42, "{r}");
    assert_ne!(r["engine"], "subprocess", "{r}");
    // Alice's key allows level `none`.
    let r = as_(ALICE, Request::post("/v1/executions"))
        .json(&sh("echo alice"))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["stdout"], "alice\n");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_results_are_bounded_in_bytes_per_tenant() {
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = false;
    let mut server = server_config();
    server.max_result_bytes = 8 << 20;
    server.max_result_bytes_per_tenant = 3 << 20;
    let t = TestServer::start_with(paddock::builder().config(config), server);
    let addr = t.addr;
    let tenant = |name: &str, r: Request| r.header("X-Paddock-Tenant", name);
    // Alice keeps one small result; bob floods 1 MiB outputs.
    let a = tenant("alice", Request::post("/v1/executions"))
        .json(&sh("echo small"))
        .send(addr)
        .await
        .expect(200);
    let alice_id = a["id"].as_str().unwrap().to_string();
    let mut ids = Vec::new();
    for _ in 0..8 {
        let mut body = sh("head -c 1048576 /dev/zero | tr '\\0' x");
        body["limits"] = json!({"max_output_bytes": 2 << 20});
        let r = tenant("bob", Request::post("/v1/executions"))
            .json(&body)
            .send(addr)
            .await
            .expect(200);
        assert_eq!(r["stdout"].as_str().unwrap().len(), 1 << 20);
        ids.push(r["id"].as_str().unwrap().to_string());
        let stats = tenant("bob", Request::get("/v1/stats"))
            .send(addr)
            .await
            .expect(200);
        let held = stats["results"]["bytes"].as_u64().unwrap();
        assert!(held <= 3 << 20, "bob's kept results hold {held} bytes");
    }
    // His oldest went, his newest and alice's stayed.
    tenant("bob", Request::get(&format!("/v1/executions/{}", ids[0])))
        .send(addr)
        .await
        .expect_error(404, "NOT_FOUND");
    tenant("bob", Request::get(&format!("/v1/executions/{}", ids[7])))
        .send(addr)
        .await
        .expect(200);
    let r = tenant("alice", Request::get(&format!("/v1/executions/{alice_id}")))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["stdout"], "small\n");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_progress_are_capped_per_tenant() {
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = false;
    let mut server = server_config();
    server.max_requests_per_tenant = 2;
    let t = TestServer::start_with(paddock::builder().config(config), server);
    let addr = t.addr;
    let as_tenant = |name: &str, r: Request| r.header("X-Paddock-Tenant", name);
    let slow: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                as_tenant("bob", Request::post("/v1/executions"))
                    .json(&sh("sleep 2"))
                    .send(addr)
                    .await
            })
        })
        .collect();
    // Watched through the handle: a request of bob's would take one of his places.
    let paddock = t.paddock.clone();
    eventually(Duration::from_secs(10), "bob's two executions run", || {
        let paddock = paddock.clone();
        async move { paddock.stats().await.unwrap().in_flight == 2 }
    })
    .await;
    let r = as_tenant("bob", Request::post("/v1/executions"))
        .json(&sh("echo third"))
        .send(addr)
        .await;
    let msg = r.expect_error(429, "RATE_LIMITED");
    assert!(msg.contains("server.max_requests_per_tenant = 2"), "{msg}");
    let r = as_tenant("alice", Request::post("/v1/executions"))
        .json(&sh("echo alice"))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["stdout"], "alice\n");
    for s in slow {
        assert_eq!(s.await.unwrap().status, 200);
    }
    // The places came back.
    as_tenant("bob", Request::post("/v1/executions"))
        .json(&sh("true"))
        .send(addr)
        .await
        .expect(200);
    t.stop().await;

    // A streamed answer takes one place, not two, and holds it until it ends.
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = false;
    let mut server = server_config();
    server.max_requests_per_tenant = 1;
    let t = TestServer::start_with(paddock::builder().config(config), server);
    let addr = t.addr;
    let mut s = as_tenant("bob", Request::post("/v1/executions?stream=true"))
        .json(&sh("echo streamed; sleep 1"))
        .stream(addr)
        .await;
    assert_eq!(s.status, 200, "a stream alone is within a cap of one");
    s.next_line().await.expect("the started line");
    as_tenant("bob", Request::get("/v1/stats"))
        .send(addr)
        .await
        .expect_error(429, "RATE_LIMITED");
    let (_, last) = s.lines().await.pop().expect("a result line");
    assert_eq!(last["type"], "result", "{last}");
    eventually(
        Duration::from_secs(5),
        "the stream's place comes back",
        || async {
            as_tenant("bob", Request::get("/v1/stats"))
                .send(addr)
                .await
                .status
                == 200
        },
    )
    .await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_where_the_operator_says() {
    let keys = || {
        let mut ops = ApiKey::new(OPS, "ops");
        ops.admin = true;
        vec![ApiKey::new(ALICE, "alice"), ops]
    };
    let mut server = server_config();
    server.api_keys = keys();
    server.metrics = "operator".into();
    let t = TestServer::start_with(paddock::builder(), server);
    assert_eq!(Request::get("/metrics").send(t.addr).await.status, 401);
    as_(ALICE, Request::get("/metrics"))
        .send(t.addr)
        .await
        .expect_error(404, "NOT_FOUND");
    let m = as_(OPS, Request::get("/metrics")).send(t.addr).await;
    assert_eq!(m.status, 200);
    assert!(m.text().contains("paddock_pool_size"), "{}", m.text());
    t.stop().await;

    let mut server = server_config();
    server.api_keys = keys();
    server.metrics = "127.0.0.1:0".into();
    let t = TestServer::start_with(paddock::builder(), server);
    let own = t.metrics_addr().expect("an address of its own");
    assert!(own.ip().is_loopback());
    as_(OPS, Request::get("/metrics"))
        .send(t.addr)
        .await
        .expect_error(404, "NOT_FOUND");
    let m = Request::get("/metrics").send(own).await;
    assert_eq!(m.status, 200);
    assert!(m.text().contains("paddock_pool_size"));
    assert!(!m.text().contains("alice"));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_stream_both_ways_past_the_old_in_memory_limit() {
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = false;
    let mut server = server_config();
    server.max_file_bytes = 8 << 20;
    let t = TestServer::start_with(paddock::builder().config(config), server);
    let addr = t.addr;
    let sb = Request::post("/v1/sandboxes").send(addr).await.expect(201);
    let base = format!("/v1/sandboxes/{}", sb["id"].as_str().unwrap());
    // 300 MiB, past the 256 MiB a whole-file read returns: it streams, with its size.
    let size: u64 = 300 << 20;
    let r = Request::post(&format!("{base}/exec"))
        .json(&json!({"program": {"command": ["truncate", "-s", size.to_string(), "big.bin"]}}))
        .send(addr)
        .await
        .expect(200);
    assert_eq!(r["exit_code"], 0, "{r}");
    let mut s = Request::get(&format!("{base}/files/big.bin"))
        .stream(addr)
        .await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-length"), Some(size.to_string().as_str()));
    let mut read = 0usize;
    while read < (1 << 20) {
        let piece = s.next_bytes().await.expect("more of the file");
        assert!(piece.iter().all(|b| *b == 0));
        read += piece.len();
    }
    drop(s);
    // An upload streams in, at most server.max_file_bytes.
    let data: Vec<u8> = (0..(6u32 << 20)).map(|i| (i % 251) as u8).collect();
    let r = Request::put(&format!("{base}/files/up.bin"))
        .body(data.clone())
        .send(addr)
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let back = Request::get(&format!("{base}/files/up.bin"))
        .send(addr)
        .await;
    assert_eq!(back.status, 200);
    assert!(back.body == data, "the upload came back different");
    // One byte over the bound: 413, and no file.
    let over = vec![1u8; (8 << 20) + 1];
    let msg = Request::put(&format!("{base}/files/over.bin"))
        .body(over)
        .send(addr)
        .await
        .expect_error(413, "INVALID_OPTIONS");
    assert!(msg.contains("server.max_file_bytes"), "{msg}");
    Request::get(&format!("{base}/files/over.bin"))
        .send(addr)
        .await
        .expect_error(404, "NOT_FOUND");
    // Streamed out piece by piece, the whole file arrives.
    let mut s = Request::get(&format!("{base}/files/up.bin"))
        .stream(addr)
        .await;
    let mut all = Vec::new();
    while let Some(piece) = s.next_bytes().await {
        all.extend_from_slice(&piece);
    }
    assert!(all == data, "the streamed download differs");
    t.stop().await;
}

//! `/healthz`, `/readyz`, `/metrics`, `/v1/stats` and `/v1/audit`.

use paddock_core::IsolationLevel;
use paddock_pool::http::ApiKey;
use serde_json::Value;

use crate::http::client::{get, Request, Response};
use crate::http::support::{server_config, sh, TestServer};

const ALPHA: &str = "key-alpha-0123456789";
const BETA: &str = "key-beta-01234567890";
const OPS: &str = "key-ops-012345678901";

async fn run_with_key(t: &TestServer, key: &str, script: &str) -> Value {
    Request::post("/v1/executions")
        .header("Authorization", &format!("Bearer {key}"))
        .json(&sh(script))
        .send(t.addr)
        .await
        .expect(200)
}

async fn ops_get(addr: std::net::SocketAddr, path: &str) -> Response {
    Request::get(path)
        .header("Authorization", &format!("Bearer {OPS}"))
        .send(addr)
        .await
}

async fn run_as(t: &TestServer, tenant: &str, script: &str) -> Value {
    Request::post("/v1/executions")
        .header("X-Paddock-Tenant", tenant)
        .json(&sh(script))
        .send(t.addr)
        .await
        .expect(200)
}

fn ids(entries: &Value) -> Vec<&str> {
    entries
        .as_array()
        .unwrap_or_else(|| panic!("a list: {entries}"))
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_metrics_and_stats() {
    let t = TestServer::start();
    let r = get(t.addr, "/healthz").await.expect(200);
    assert_eq!(r["status"], "ok");
    let r = get(t.addr, "/readyz").await.expect(200);
    assert_eq!(r["status"], "ready");

    run_as(&t, "ops", "echo one").await;
    run_as(&t, "ops", "exit 1").await;

    let m = get(t.addr, "/metrics").await;
    assert_eq!(m.status, 200);
    assert!(
        m.header("content-type").unwrap().starts_with("text/plain"),
        "{:?}",
        m.header("content-type")
    );
    let text = m.text();
    let completed = text
        .lines()
        .find(|l| {
            l.starts_with("paddock_executions_total{")
                && l.contains("engine=\"subprocess\"")
                && l.contains("outcome=\"completed\"")
        })
        .unwrap_or_else(|| panic!("no completed counter in:\n{text}"));
    assert!(completed.ends_with(" 2"), "{completed}");
    for family in [
        "# TYPE paddock_execution_duration_ms histogram",
        "# TYPE paddock_pool_acquisitions_total counter",
        "paddock_pool_size{engine=\"subprocess\"",
        "paddock_pool_idle{engine=\"subprocess\"",
    ] {
        assert!(text.contains(family), "{family} missing from:\n{text}");
    }

    // Without keys, the caller sees the figures of the tenant it claims.
    let s = Request::get("/v1/stats")
        .header("X-Paddock-Tenant", "ops")
        .send(t.addr)
        .await
        .expect(200);
    let sched = &s["scheduler"];
    assert_eq!(sched["tenant"], "ops", "{s}");
    assert!(sched.get("accepted_total").is_none(), "{s}");
    assert_eq!(sched["in_flight"], 0, "{s}");
    assert_eq!(sched["admitting"], true, "{s}");
    let pools = sched["pools"].as_array().expect("pools");
    assert!(
        pools.iter().any(|p| p["engine"] == "subprocess"
            && p["network"] == "none"
            && p["max_size"] == paddock_pool::PoolConfig::default().max_size),
        "{s}"
    );
    let audit = &s["audit"];
    assert_eq!(audit["total"], 2, "{s}");
    // Another tenant's view has none of them.
    let other = get(t.addr, "/v1/stats").await.expect(200);
    assert_eq!(other["audit"]["total"], 0, "{other}");
    assert_eq!(audit["success"], 1, "{s}");
    assert_eq!(audit["failure"], 1, "{s}");
    assert_eq!(audit["success_rate"], 0.5, "{s}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_filters() {
    // Across tenants the audit answers an operator key only.
    let mut server = server_config();
    let mut ops = ApiKey::new(OPS, "ops");
    ops.admin = true;
    server.api_keys = vec![ApiKey::new(ALPHA, "alpha"), ApiKey::new(BETA, "beta"), ops];
    server.allowed_levels = Some(vec![IsolationLevel::None]);
    let t = TestServer::start_with(paddock::builder(), server);
    let a_ok = run_with_key(&t, ALPHA, "true").await;
    let b_fail = run_with_key(&t, BETA, "exit 2").await;
    let b_ok = run_with_key(&t, BETA, "true").await;
    let id = |v: &Value| v["id"].as_str().unwrap().to_string();
    let (a_ok, b_fail, b_ok) = (id(&a_ok), id(&b_fail), id(&b_ok));

    // Newest first.
    let all = ops_get(t.addr, "/v1/audit").await.expect(200);
    assert_eq!(ids(&all), [&b_ok, &b_fail, &a_ok]);
    let first = &all.as_array().unwrap()[1];
    assert_eq!(first["tenant"], "beta");
    assert_eq!(first["engine"], "subprocess");
    assert_eq!(first["outcome"], "completed");
    assert_eq!(first["exit_code"], 2);

    let q = |query: &'static str| ops_get(t.addr, query);
    assert_eq!(ids(&q("/v1/audit?tenant=alpha").await.expect(200)), [&a_ok]);
    assert_eq!(
        ids(&q("/v1/audit?tenant=beta&success=false").await.expect(200)),
        [&b_fail]
    );
    assert_eq!(
        ids(&q("/v1/audit?success=true").await.expect(200)),
        [&b_ok, &a_ok]
    );
    assert_eq!(
        ids(&q("/v1/audit?engine=subprocess&limit=1").await.expect(200)),
        [&b_ok]
    );
    assert_eq!(
        ids(&q("/v1/audit?tenant=nobody").await.expect(200)).len(),
        0
    );
    assert_eq!(
        ids(&q("/v1/audit?after=2000-01-01T00:00:00Z").await.expect(200)).len(),
        3
    );
    assert_eq!(
        ids(&q("/v1/audit?before=2000-01-01T00:00:00Z").await.expect(200)).len(),
        0
    );
    assert_eq!(
        ids(&q("/v1/audit?after=2999-01-01T00:00:00%2B01:00")
            .await
            .expect(200))
        .len(),
        0
    );
    // The window between two entries' own timestamps holds exactly what it should.
    let stamp = all.as_array().unwrap()[1]["timestamp"]
        .as_str()
        .unwrap()
        .to_string();
    let between = ops_get(
        t.addr,
        &format!("/v1/audit?after={stamp}&tenant=beta&success=false"),
    )
    .await;
    assert_eq!(ids(&between.expect(200)), [&b_fail]);
    let before = ops_get(t.addr, &format!("/v1/audit?before={stamp}"))
        .await
        .expect(200);
    assert!(
        !ids(&before).contains(&b_fail.as_str()),
        "before is exclusive"
    );

    // Bad parameters are 400 and name themselves.
    for (query, field) in [
        ("/v1/audit?after=yesterday", "after"),
        ("/v1/audit?before=2024-13-45", "before"),
        ("/v1/audit?success=maybe", "query"),
        ("/v1/audit?limit=-1", "query"),
        ("/v1/audit?engine=vm", "query"),
        ("/v1/audit?tenat=alpha", "query"),
    ] {
        let msg = q(query).await.expect_error(400, "INVALID_OPTIONS");
        assert!(msg.contains(field), "{query}: {msg}");
    }
    // A tenant's own key sees its own entries, whatever it filters by.
    let own = Request::get("/v1/audit")
        .header("Authorization", &format!("Bearer {BETA}"))
        .send(t.addr)
        .await
        .expect(200);
    assert_eq!(ids(&own), [&b_ok, &b_fail]);
    let other = Request::get("/v1/audit?tenant=alpha")
        .header("Authorization", &format!("Bearer {BETA}"))
        .send(t.addr)
        .await
        .expect(200);
    assert_eq!(ids(&other).len(), 0);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_say_what_each_can_do_and_whether_the_caller_may_use_it() {
    // Without keys every level is allowed.
    let t = TestServer::start();
    let r = Request::get("/v1/engines").send(t.addr).await.expect(200);
    let engines = r["engines"].as_array().expect("a list");
    let names: Vec<&str> = engines
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"subprocess") && names.contains(&"isolate"),
        "{r}"
    );
    let of = |name: &str| engines.iter().find(|e| e["name"] == name).unwrap().clone();
    let sp = of("subprocess");
    assert_eq!(sp["max_level"], "none", "{sp}");
    assert!(
        sp["programs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "command"),
        "{sp}"
    );
    assert!(
        sp["features"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "terminal"),
        "{sp}"
    );
    assert!(
        sp["network"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "none"),
        "{sp}"
    );
    assert_eq!(of("isolate")["max_level"], "context-isolated");
    // The limits each enforces (a refusal of one not enforced is tested with an
    // engine that lists fewer): the deadline everywhere, CPU time on both.
    let limits = |e: &serde_json::Value| -> Vec<String> {
        e["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap().to_string())
            .collect()
    };
    for e in engines {
        assert!(limits(e).contains(&"timeout_ms".to_string()), "{e}");
    }
    // The shared vocabulary: the isolate is context-isolated and not strict, the
    // subprocess engine offers the host's network, both stream; the pools prewarm.
    let named = |e: &serde_json::Value| -> Vec<String> {
        e["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap().to_string())
            .collect()
    };
    let iso = named(&of("isolate"));
    assert!(iso.contains(&"context-isolated".to_string()), "{iso:?}");
    assert!(!iso.contains(&"strict".to_string()), "{iso:?}");
    assert!(iso.contains(&"warm-pool".to_string()), "{iso:?}");
    let sub = named(&sp);
    assert!(sub.contains(&"streaming".to_string()), "{sub:?}");
    assert!(sub.contains(&"network-unrestricted".to_string()), "{sub:?}");
    assert!(!sub.contains(&"context-isolated".to_string()), "{sub:?}");
    assert!(limits(&sp).contains(&"cpu_ms".to_string()), "{sp}");
    assert!(
        limits(&of("isolate")).contains(&"cpu_ms".to_string()),
        "{r}"
    );
    assert!(engines.iter().all(|e| e["usable"] == true), "{r}");
    t.stop().await;

    // With keys, level `none` is not a tenant's unless the operator allows it: the
    // subprocess engine is listed but not usable for alpha; an operator's default is
    // the same rule.
    let mut server = server_config();
    server.api_keys = vec![ApiKey::new(ALPHA, "alpha")];
    let t = TestServer::start_with(paddock::builder(), server);
    Request::get("/v1/engines")
        .send(t.addr)
        .await
        .expect_error(401, "UNAUTHORIZED");
    let r = Request::get("/v1/engines")
        .header("Authorization", &format!("Bearer {ALPHA}"))
        .send(t.addr)
        .await
        .expect(200);
    let engines = r["engines"].as_array().expect("a list");
    let usable = |name: &str| engines.iter().find(|e| e["name"] == name).unwrap()["usable"].clone();
    assert_eq!(usable("subprocess"), false, "{r}");
    assert_eq!(usable("isolate"), true, "{r}");
    t.stop().await;
}

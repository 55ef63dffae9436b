//! Pooled executions that suspend: the instance is parked for the resume, which is a
//! plain execution routed to it; parking is bounded in count and time.

use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{ErrorCode, ExecRequest, Outcome, Program};
use paddock_pool::audit::AuditOutcome;
use paddock_pool::{Paddock, PoolConfig};
use serde_json::json;

/// A long-running json-stdio handler: `invoke` suspends on `input.token` (or
/// `ok-<id>`), `resume` answers with the value and how many turns this process ran.
const APPROVAL: &str = r#"
import json, sys
turns = 0
for line in sys.stdin:
    f = json.loads(line)
    turns += 1
    if f["kind"] == "invoke":
        token = (f.get("input") or {}).get("token") or ("ok-" + f["id"])
        out = {"v": 1, "kind": "suspend", "id": f["id"], "token_id": token}
    elif f["kind"] == "resume":
        out = {"v": 1, "kind": "output", "id": f["id"], "output": {"value": f["value"], "turns": turns}}
    else:
        continue
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"#;

struct Fixture {
    paddock: Paddock,
    _dir: tempfile::TempDir,
}

fn start(pool: PoolConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("approval.py");
    std::fs::write(&script, APPROVAL).unwrap();
    let mut config = PaddockConfig {
        pool,
        ..PaddockConfig::default()
    };
    config.subprocess.handlers.insert(
        "approval".into(),
        paddock_engines::HandlerConfig {
            command: vec!["python3".into(), script.to_string_lossy().into_owned()],
        },
    );
    let paddock = paddock::builder()
        .config(config)
        .without_isolate()
        .start()
        .unwrap();
    Fixture { paddock, _dir: dir }
}

fn invoke(tenant: &str, input: serde_json::Value) -> ExecRequest {
    let mut r = ExecRequest::new(Program::Invoke {
        handler: "approval".into(),
        input,
    });
    r.tenant = Some(tenant.into());
    r
}

fn resume(tenant: &str, token: &str, value: serde_json::Value) -> ExecRequest {
    let mut r = ExecRequest::new(Program::Resume {
        token_id: token.into(),
        value,
    });
    r.tenant = Some(tenant.into());
    r
}

async fn suspend(paddock: &Paddock, tenant: &str, input: serde_json::Value) -> String {
    let r = paddock.execute(invoke(tenant, input)).await.unwrap();
    match r.outcome {
        Outcome::Suspended { token_id } => token_id,
        _ => panic!("expected a suspension: {r:?}"),
    }
}

async fn subprocess_pool(paddock: &Paddock) -> paddock_pool::PoolStats {
    paddock
        .stats()
        .await
        .unwrap()
        .pools
        .into_iter()
        .find(|p| p.engine == paddock_core::EngineName::SUBPROCESS)
        .expect("a subprocess pool")
}

async fn suspended_count(paddock: &Paddock) -> usize {
    paddock.stats().await.unwrap().suspended
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_suspension_resumes_on_the_same_process_and_only_once() {
    let f = start(PoolConfig::default());
    let p = &f.paddock;
    let token = suspend(p, "acme", json!({})).await;
    assert_eq!(suspended_count(p).await, 1);

    let r = p
        .execute(resume("acme", &token, json!({"approved": true})))
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    // The second turn of one process: the resume reached the instance that suspended.
    assert_eq!(
        r.value,
        Some(json!({"value": {"approved": true}, "turns": 2}))
    );
    assert_eq!(suspended_count(p).await, 0);

    let again = p
        .execute(resume("acme", &token, json!(1)))
        .await
        .unwrap_err();
    assert_eq!(again.code, ErrorCode::NotFound);
    assert!(again.message.contains("resumed"), "{again}");

    let audit = p
        .audit(&paddock_pool::Caller::Embedder, Default::default())
        .await
        .unwrap();
    let outcomes: Vec<AuditOutcome> = audit.iter().map(|e| e.outcome).collect();
    assert_eq!(audit.len(), 2, "the invoke and the resume: {audit:?}");
    assert!(outcomes.contains(&AuditOutcome::Suspended), "{outcomes:?}");
    assert!(outcomes.contains(&AuditOutcome::Completed), "{outcomes:?}");
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_cannot_resume_or_disturb_a_suspension() {
    let f = start(PoolConfig::default());
    let p = &f.paddock;
    let token = suspend(p, "acme", json!({})).await;
    let e = p
        .execute(resume("mallory", &token, json!({"approved": true})))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    assert_eq!(suspended_count(p).await, 1, "still parked for its tenant");
    let r = p
        .execute(resume("acme", &token, json!("yes")))
        .await
        .unwrap();
    assert_eq!(r.value, Some(json!({"value": "yes", "turns": 2})));
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parking_is_bounded_by_count_and_the_oldest_expires() {
    let f = start(PoolConfig {
        max_suspended: 2,
        ..PoolConfig::default()
    });
    let p = &f.paddock;
    let first = suspend(p, "acme", json!({})).await;
    let second = suspend(p, "acme", json!({})).await;
    let third = suspend(p, "acme", json!({})).await;
    assert_eq!(suspended_count(p).await, 2);

    let e = p
        .execute(resume("acme", &first, json!(1)))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(e.message.contains("expired"), "{e}");
    for token in [second, third] {
        let r = p.execute(resume("acme", &token, json!(2))).await.unwrap();
        assert!(r.is_success(), "{r:?}");
    }
    assert_eq!(suspended_count(p).await, 0);
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_instance_expires_after_the_ttl_and_leaves_the_pool() {
    let f = start(PoolConfig {
        suspend_ttl_ms: 200,
        ..PoolConfig::default()
    });
    let p = &f.paddock;
    let token = suspend(p, "acme", json!({})).await;
    let retired_before = subprocess_pool(p).await.retired_total;
    let deadline = Instant::now() + Duration::from_secs(10);
    while suspended_count(p).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the parked instance never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let e = p
        .execute(resume("acme", &token, json!(1)))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(e.message.contains("expired"), "{e}");
    let pool = subprocess_pool(p).await;
    assert!(
        pool.retired_total > retired_before,
        "the expired instance was retired: {pool:?}"
    );
    assert_eq!(pool.busy, 0, "{pool:?}");
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_suspension_on_a_held_token_fails_and_the_first_survives() {
    let f = start(PoolConfig::default());
    let p = &f.paddock;
    let token = suspend(p, "acme", json!({"token": "same"})).await;
    assert_eq!(token, "same");
    let r = p
        .execute(invoke("acme", json!({"token": "same"})))
        .await
        .unwrap();
    assert_eq!(
        r.outcome.error_code(),
        Some(ErrorCode::WorkerFailed),
        "{r:?}"
    );
    // Another tenant may use the same token: tokens are scoped to their tenant.
    assert_eq!(suspend(p, "other", json!({"token": "same"})).await, "same");
    let r = p
        .execute(resume("acme", "same", json!("first")))
        .await
        .unwrap();
    assert_eq!(r.value, Some(json!({"value": "first", "turns": 2})));
    let r = p
        .execute(resume("other", "same", json!("second")))
        .await
        .unwrap();
    assert_eq!(r.value, Some(json!({"value": "second", "turns": 2})));
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_parking_a_suspension_says_it_cannot_be_resumed() {
    let f = start(PoolConfig {
        max_suspended: 0,
        ..PoolConfig::default()
    });
    let p = &f.paddock;
    let r = p.execute(invoke("acme", json!({}))).await.unwrap();
    let Outcome::Suspended { token_id } = &r.outcome else {
        panic!("{r:?}");
    };
    assert!(
        r.warnings.iter().any(|w| w.contains("max_suspended")),
        "{r:?}"
    );
    assert_eq!(suspended_count(p).await, 0);
    let e = p
        .execute(resume("acme", token_id, json!(1)))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_retires_parked_instances() {
    let f = start(PoolConfig::default());
    let p = &f.paddock;
    suspend(p, "acme", json!({})).await;
    suspend(p, "acme", json!({})).await;
    assert_eq!(suspended_count(p).await, 2);
    let script = f._dir.path().join("approval.py");
    // Two parked, plus the handler of the prewarmed idle instance.
    assert!(handler_processes(&script) >= 2);
    p.shutdown(Duration::from_secs(5)).await.unwrap();
    // The handler processes that held the suspensions die with their instances.
    let deadline = Instant::now() + Duration::from_secs(10);
    while handler_processes(&script) > 0 {
        assert!(
            Instant::now() < deadline,
            "suspended handlers outlived shutdown"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Live processes whose command line names `script`.
fn handler_processes(script: &std::path::Path) -> usize {
    let needle = script.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(&needle))
        .count()
}

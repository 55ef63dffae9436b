//! An allowlist sandbox through the facade: its executions' audit entries list their
//! egress decisions, tenant by tenant, and telemetry counts them.

#[path = "../../../egress/tests/internet/mod.rs"]
mod internet;

use paddock::PaddockConfig;
use paddock_core::egress::EgressVerdict;
use paddock_core::{ExecRequest, NetworkPolicy, Program, SandboxSpec};
use paddock_engines::EgressConfig;
use paddock_pool::audit::AuditQuery;
use paddock_pool::Caller;
use paddock_telemetry::Telemetry;

fn curl(url: &str) -> ExecRequest {
    let mut req = ExecRequest::new(Program::Command {
        argv: ["curl", "-sS", "--max-time", "5", url]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    });
    req.limits.timeout_ms = Some(20_000);
    req
}

#[actix_rt::test]
async fn an_executions_audit_entry_lists_its_egress_and_telemetry_counts_it() {
    let why = internet::unavailable().or_else(|| {
        paddock_egress::find_nft()
            .is_none()
            .then(|| "no nft".to_string())
    });
    if let Some(why) = why {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "the egress tests must run: {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let net = internet::Internet::start("p").expect("the test's internet");
    let config = PaddockConfig {
        egress: EgressConfig {
            resolvers: vec![net.resolver().to_string()],
            ..EgressConfig::default()
        },
        ..PaddockConfig::default()
    };
    let telemetry = Telemetry::prometheus().unwrap();
    let paddock = paddock::builder()
        .config(config)
        .telemetry(telemetry.clone())
        .start()
        .expect("Paddock starts");
    let spec = SandboxSpec {
        tenant: Some("alice".into()),
        network: NetworkPolicy::Allowlist {
            hosts: vec!["allowed.test".into()],
            ports: vec![],
        },
        ..SandboxSpec::default()
    };
    let sb = paddock.open_sandbox(spec, None).await.expect("a sandbox");
    let ok = sb.exec(curl("http://allowed.test/")).await.unwrap();
    assert_eq!(
        ok.stdout, "hello from 198.51.100.2 for allowed.test\n",
        "{ok:?}"
    );
    let no = sb.exec(curl("http://denied.test/")).await.unwrap();
    assert!(no.stdout.contains("matches no rule"), "{no:?}");

    let entries = paddock
        .audit(&Caller::Tenant(Some("alice".into())), AuditQuery::default())
        .await
        .unwrap();
    let of = |id: &paddock_core::ExecutionId| {
        entries
            .iter()
            .find(|e| &e.id == id)
            .and_then(|e| e.egress.clone())
            .unwrap_or_else(|| panic!("no egress in the audit entry of {id}: {entries:#?}"))
    };
    let allowed = of(&ok.id);
    assert!(
        allowed.events.iter().any(|e| e.host == "allowed.test"
            && e.verdict == EgressVerdict::Allowed
            && e.bytes_in > 0),
        "{allowed:#?}"
    );
    assert_eq!(allowed.denied, 0, "{allowed:#?}");
    let denied = of(&no.id);
    assert!(
        denied
            .events
            .iter()
            .any(|e| e.host == "denied.test" && e.verdict == EgressVerdict::Denied),
        "{denied:#?}"
    );
    assert_eq!(denied.allowed, 0, "{denied:#?}");
    // Another tenant sees none of it.
    let bob = paddock
        .audit(&Caller::Tenant(Some("bob".into())), AuditQuery::default())
        .await
        .unwrap();
    assert!(bob.is_empty(), "{bob:#?}");

    let text = telemetry.render_prometheus();
    let series = |verdict: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("paddock_egress_decisions_total")
                    && l.contains(&format!("verdict=\"{verdict}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {verdict} series in:\n{text}"))
    };
    assert!(
        series("allowed") >= 1.0 && series("denied") >= 1.0,
        "{text}"
    );
    sb.destroy().await.unwrap();
}

/// Pools of allowlists (and of executions' own disk quotas) are each tenant's own:
/// bob filling all of his with distinct allowlists is refused the next, naming
/// him, while alice still opens hers.
#[actix_rt::test]
async fn one_tenants_allowlist_pools_never_take_anothers_place() {
    if let Some(why) = paddock_egress::find_nft()
        .is_none()
        .then(|| "no nft".to_string())
        .or_else(internet::unavailable)
    {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "the egress tests must run: {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = false;
    config.pool.min_idle = 0;
    let paddock = paddock::builder()
        .config(config)
        .without_isolate()
        .without_container()
        .start()
        .expect("Paddock starts");
    let spec = |tenant: &str, i: usize| SandboxSpec {
        tenant: Some(tenant.into()),
        network: NetworkPolicy::Allowlist {
            hosts: vec![format!("h{i}.example.org")],
            ports: vec![],
        },
        ..SandboxSpec::default()
    };
    let mut held = Vec::new();
    for i in 0..16 {
        held.push(
            paddock
                .open_sandbox(spec("bob", i), None)
                .await
                .unwrap_or_else(|e| panic!("bob's allowlist {i}: {e}")),
        );
    }
    let e = paddock
        .open_sandbox(spec("bob", 16), None)
        .await
        .map(drop)
        .unwrap_err();
    assert_eq!(e.code, paddock_core::ErrorCode::PoolExhausted, "{e}");
    assert!(e.message.contains("tenant `bob`"), "{e}");
    let alice = paddock
        .open_sandbox(spec("alice", 99), None)
        .await
        .expect("alice's allowlist sandbox opens beside bob's sixteen");
    alice.destroy().await.unwrap();
    for sb in held {
        sb.destroy().await.unwrap();
    }
}

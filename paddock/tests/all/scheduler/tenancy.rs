//! The facade takes the tenant: cancel, lookups, audit and statistics on behalf of a
//! `Caller`; sandbox lifetimes; fair shares and the operator's ceilings, through the
//! `Paddock` handle with no HTTP in between.

use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{
    AccessRules, Allowed, EngineName, ErrorCode, ExecRequest, IsolationLevel, Limits,
    NetworkPolicy, Program, SandboxSpec, SandboxStatus,
};
use paddock_pool::audit::AuditQuery;
use paddock_pool::limiter::LimiterConfig;
use paddock_pool::{Caller, Execute, Paddock};

fn sh_as(tenant: &str, script: &str) -> ExecRequest {
    let mut r = ExecRequest::new(Program::command(["sh", "-c", script]));
    r.tenant = Some(tenant.into());
    r
}

fn spec_for(tenant: &str) -> SandboxSpec {
    SandboxSpec {
        tenant: Some(tenant.into()),
        ..SandboxSpec::default()
    }
}

fn quiet_config() -> PaddockConfig {
    let mut c = PaddockConfig::default();
    c.subprocess.warm.enabled = false;
    c
}

fn start(config: PaddockConfig) -> Paddock {
    paddock::builder()
        .config(config)
        .without_isolate()
        .without_container()
        .start()
        .expect("starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_audit_stats_and_lookups_answer_for_the_callers_tenant() {
    let p = start(quiet_config());
    let alice = Caller::tenant("alice");
    let bob = Caller::tenant("bob");
    // Alice's execution runs; bob cannot cancel it, alice can.
    let req = sh_as("alice", "sleep 20");
    let id = req.id.clone();
    let running = {
        let p = p.clone();
        tokio::spawn(async move { p.execute(req).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.running_tenant(&Caller::Embedder, &id).is_none() {
        assert!(Instant::now() < deadline, "the execution never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        p.running_tenant(&bob, &id),
        None,
        "bob sees alice's execution"
    );
    assert_eq!(
        p.running_tenant(&alice, &id),
        Some(Some("alice".to_string()))
    );
    assert!(!p.cancel(&bob, &id), "bob cancelled alice's execution");
    assert!(!p.cancel(&Caller::of(None), &id));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(p.running_tenant(&alice, &id).is_some(), "it still runs");
    assert!(p.cancel(&alice, &id));
    let r = running.await.unwrap().unwrap();
    assert_eq!(r.outcome.name(), "cancelled");
    p.execute(sh_as("bob", "true")).await.unwrap();

    // The audit: a tenant gets its own entries, whatever it filters by.
    let own = p.audit(&bob, AuditQuery::default()).await.unwrap();
    assert_eq!(own.len(), 1);
    assert!(own.iter().all(|e| e.tenant.as_deref() == Some("bob")));
    let widened = p
        .audit(
            &bob,
            AuditQuery {
                tenant: Some("alice".into()),
                ..AuditQuery::default()
            },
        )
        .await
        .unwrap();
    assert!(widened.is_empty(), "{widened:?}");
    let all = p
        .audit(&Caller::Embedder, AuditQuery::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 2);
    // Statistics likewise.
    let s = p.stats_for(&bob).await.unwrap();
    assert_eq!(s.tenant.as_deref(), Some("bob"));
    assert_eq!(s.accepted_total, None);
    let a = p.audit_statistics(&bob).await.unwrap();
    assert_eq!((a.total, a.success), (1, 1));
    let everyone = p.audit_statistics(&Caller::Embedder).await.unwrap();
    assert_eq!(everyone.total, 2);

    // Sandboxes by id: another tenant's is NOT_FOUND, open or destroyed.
    let sb = p.open_sandbox(spec_for("alice"), None).await.unwrap();
    let e = p.sandbox(&bob, sb.id()).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    let mine = p.sandbox(&alice, sb.id()).await.unwrap();
    assert_eq!(mine.id(), sb.id());
    sb.destroy().await.unwrap();
    assert_eq!(
        p.sandbox(&bob, sb.id()).await.unwrap_err().code,
        ErrorCode::NotFound
    );
    assert_eq!(
        p.sandbox(&alice, sb.id()).await.unwrap_err().code,
        ErrorCode::EngineDisposed
    );

    // An operator sees everything, and each look is recorded; a tenant may not read
    // the record.
    let ops = Caller::Operator("ops".into());
    assert_eq!(p.audit(&ops, AuditQuery::default()).await.unwrap().len(), 2);
    assert!(p.may_see(&ops, Some("alice"), &id));
    let deadline = Instant::now() + Duration::from_secs(5);
    let record = loop {
        let r = p.operator_accesses(&Caller::Embedder, 10).await.unwrap();
        if r.len() >= 2 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let actions: Vec<&str> = record.iter().map(|a| a.action.as_str()).collect();
    assert!(
        actions.contains(&"audit.search") && actions.contains(&"execution.get"),
        "{actions:?}"
    );
    assert!(record.iter().all(|a| a.operator == "ops"));
    assert_eq!(
        p.operator_accesses(&bob, 10).await.unwrap_err().code,
        ErrorCode::NotFound
    );
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sandboxes_and_old_ones_are_destroyed() {
    let mut config = quiet_config();
    config.pool.sandbox_idle_timeout_ms = 600;
    config.pool.sandbox_max_lifetime_ms = 0;
    config.limiter.max_sandboxes_per_tenant = Some(2);
    let p = start(config);
    let idle = p.open_sandbox(spec_for("alice"), None).await.unwrap();
    let used = p.open_sandbox(spec_for("alice"), None).await.unwrap();
    // A long execution keeps `used` busy past the idle timeout; calls on it count as
    // use.
    let busy = {
        let used = used.clone();
        tokio::spawn(async move { used.exec(sh_as("alice", "sleep 2")).await })
    };
    // Watched through the statistics: a call on a sandbox counts as its use.
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.stats().await.unwrap().sandboxes != 1 {
        assert!(
            Instant::now() < deadline,
            "the idle sandbox was not destroyed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(idle.status().await.unwrap(), SandboxStatus::Destroyed);
    let r = busy.await.unwrap().unwrap();
    assert_eq!(r.outcome.name(), "completed", "{r:?}");
    assert_ne!(used.status().await.unwrap(), SandboxStatus::Destroyed);
    let e = idle.exec(sh_as("alice", "true")).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::EngineDisposed);
    // Left alone now, `used` goes too.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let s = p.stats().await.unwrap();
        if s.sandboxes == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the used sandbox never expired");
    }
    // Expiry gave alice's places back: her cap of two fits again. (A place is
    // held until its sandbox's destroy has finished, which may trail its leaving
    // the statistics on a loaded machine.)
    let open_when_free = || async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match p.open_sandbox(spec_for("alice"), None).await {
                Ok(s) => return s,
                Err(e) if e.code == ErrorCode::RateLimited && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("alice's places never came back: {e}"),
            }
        }
    };
    let a = open_when_free().await;
    let b = open_when_free().await;
    assert_eq!(
        p.open_sandbox(spec_for("alice"), None)
            .await
            .unwrap_err()
            .code,
        ErrorCode::RateLimited
    );
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
    p.shutdown(Duration::from_secs(5)).await.unwrap();

    // A lifetime ends a sandbox however busy it keeps.
    let mut config = quiet_config();
    config.pool.sandbox_idle_timeout_ms = 0;
    config.pool.sandbox_max_lifetime_ms = 800;
    let p = start(config);
    let sb = p.open_sandbox(spec_for("alice"), None).await.unwrap();
    let started = Instant::now();
    let r = sb.exec(sh_as("alice", "sleep 5")).await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the lifetime did not end the running execution"
    );
    match r {
        Ok(r) => assert_ne!(r.outcome.name(), "completed", "{r:?}"),
        Err(e) => assert_eq!(e.code, ErrorCode::EngineDisposed, "{e}"),
    }
    assert_eq!(sb.status().await.unwrap(), SandboxStatus::Destroyed);
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_ceilings_and_allowances_hold_through_the_facade() {
    let mut config = quiet_config();
    config.limiter = LimiterConfig {
        max_sandboxes_per_tenant: Some(3),
        max_slots_per_tenant: Some(2),
        ..LimiterConfig::default()
    };
    config.limits.max = Limits {
        timeout_ms: Some(5_000),
        ..Limits::default()
    };
    let p = paddock::builder()
        .config(config)
        .without_container()
        .access(AccessRules {
            default: Allowed::multi_tenant_default(),
            tenants: [(
                "trusted".to_string(),
                Allowed {
                    levels: Some(vec![IsolationLevel::None]),
                    networks: None,
                    private: None,
                },
            )]
            .into(),
        })
        .start()
        .unwrap();
    // Allowances: the subprocess engine (level none) only for `trusted`.
    let e = p
        .execute_with(Execute::new(sh_as("bob", "true")).on(EngineName::SUBPROCESS))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions);
    assert!(e.message.contains("level `none`"), "{}", e.message);
    let mut js = ExecRequest::new(Program::code(paddock_core::Language::Javascript, "6*7"));
    js.tenant = Some("bob".into());
    let r = p.execute(js).await.unwrap();
    assert_eq!(r.engine, EngineName::ISOLATE, "{r:?}");
    let mut unrestricted = Execute::new(sh_as("trusted", "true"));
    unrestricted.order.network = NetworkPolicy::Unrestricted;
    let e = p.execute_with(unrestricted).await.unwrap_err();
    assert!(
        e.message.contains("network `unrestricted`"),
        "{}",
        e.message
    );
    // Ceilings.
    let mut long = sh_as("trusted", "true");
    long.limits.timeout_ms = Some(5_001);
    let e = p.execute(long).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions);
    assert!(e.message.contains("limits.timeout_ms") && e.message.contains("5000"));
    // Shares: two sandboxes take both of trusted's slots.
    let a = p
        .open_sandbox(spec_for("trusted"), Some(EngineName::SUBPROCESS))
        .await
        .unwrap();
    let b = p
        .open_sandbox(spec_for("trusted"), Some(EngineName::SUBPROCESS))
        .await
        .unwrap();
    // A third would be within the sandbox cap (3) but not the slot cap (2).
    let e = p
        .open_sandbox(spec_for("trusted"), Some(EngineName::SUBPROCESS))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::PoolExhausted, "{e}");
    assert!(
        e.message.contains("max_slots_per_tenant = 2"),
        "{}",
        e.message
    );
    assert!(e.retry_after_ms.is_some());
    let e = p.execute(sh_as("trusted", "true")).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::PoolExhausted, "{e}");
    assert!(e.message.contains("max_slots_per_tenant"), "{}", e.message);
    // A refused execution is not accepted, so not audited.
    let audited = p
        .audit(&Caller::tenant("trusted"), AuditQuery::default())
        .await
        .unwrap();
    assert!(audited.is_empty(), "{audited:?}");
    // Giving one back lets the next in.
    a.destroy().await.unwrap();
    let r = p.execute(sh_as("trusted", "echo in")).await.unwrap();
    assert_eq!(r.stdout, "in\n");
    b.destroy().await.unwrap();
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A configuration with two API keys (tenants `a` and `b`) and nothing else changed.
fn two_keys() -> PaddockConfig {
    let mut c = PaddockConfig::default();
    c.server.api_keys = vec![
        paddock_pool::http::ApiKey::new("key-a-0123456789abcdef", "a"),
        paddock_pool::http::ApiKey::new("key-b-0123456789abcdef", "b"),
    ];
    c
}

fn code_as(tenant: &str, language: paddock_core::Language, code: &str) -> ExecRequest {
    let mut r = ExecRequest::new(Program::code(language, code));
    r.tenant = Some(tenant.into());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_keys_a_request_without_an_engine_gets_one_that_runs_its_program() {
    use paddock_core::Language;
    let p = paddock::builder().config(two_keys()).start().unwrap();
    if !p.engines().contains(&EngineName::CONTAINER) {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "the container engine must start here"
        );
        eprintln!("skipped: no OCI runtime on this host");
        return;
    }
    // Level `none` is not the tenants': a command goes to the container engine,
    // the strongest level they may use that runs it.
    let r = p.execute(sh_as("a", "echo hi")).await.unwrap();
    assert_eq!(r.engine, EngineName::CONTAINER, "{r:?}");
    assert_eq!(r.stdout, "hi\n", "{r:?}");
    let r = p
        .execute(code_as("a", Language::Python, "print(6*7)"))
        .await
        .unwrap();
    assert_eq!(r.engine, EngineName::CONTAINER, "{r:?}");
    assert_eq!(r.stdout, "42\n", "{r:?}");
    // JavaScript code: the isolate runs it, at the weakest level they may use.
    let r = p
        .execute(code_as("a", Language::Javascript, "6*7"))
        .await
        .unwrap();
    assert_eq!(r.engine, EngineName::ISOLATE, "{r:?}");
    // A sandbox named no engine: one that runs commands.
    let s = p.open_sandbox(spec_for("b"), None).await.unwrap();
    assert_eq!(s.info().engine, EngineName::CONTAINER);
    s.destroy().await.unwrap();
    // Asked for `context-isolated`, a sandbox is the isolate's, as before.
    let mut js = spec_for("b");
    js.level = IsolationLevel::ContextIsolated;
    let s = p.open_sandbox(js, None).await.unwrap();
    assert_eq!(s.info().engine, EngineName::ISOLATE);
    s.destroy().await.unwrap();
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_no_allowed_engine_runs_is_refused_with_each_engines_reason() {
    // Without the container engine, under keys: the subprocess engine runs a
    // command but its level is not the tenant's; the isolate does not run it.
    let p = paddock::builder()
        .config(two_keys())
        .without_container()
        .start()
        .unwrap();
    let e = p.execute(sh_as("a", "echo hi")).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");
    for part in [
        "tenant `a`",
        "subprocess runs it, but its level `none` is not allowed",
        "isolate does not run command",
    ] {
        assert!(e.message.contains(part), "{part:?} in {}", e.message);
    }
    // A tenant allowed only `context-isolated`: Python code runs nowhere it may go.
    let p2 = paddock::builder()
        .config(quiet_config())
        .without_container()
        .access(AccessRules {
            default: Allowed {
                levels: Some(vec![IsolationLevel::ContextIsolated]),
                networks: None,
                private: None,
            },
            tenants: Default::default(),
        })
        .start()
        .unwrap();
    let e = p2
        .execute(code_as("a", paddock_core::Language::Python, "print(1)"))
        .await
        .unwrap_err();
    assert!(
        e.message.contains("isolate does not run python code"),
        "{}",
        e.message
    );
    p.shutdown(Duration::from_secs(5)).await.unwrap();
    p2.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_keys_one_tenant_cannot_take_the_whole_pool() {
    // The default configuration with two keys: each tenant's fair share is half of
    // `pool.max_size` (derived from the host).
    let config = two_keys();
    let (share, fair) = config.slots_per_tenant();
    assert!(fair, "two keys and no explicit cap: the fair share applies");
    let share = share.unwrap();
    assert_eq!(share as usize, (config.pool.max_size / 2).max(1));
    assert!(config.pool.max_size >= 16, "{}", config.pool.max_size);
    let p = paddock::builder().config(config).start().unwrap();
    let js = |tenant: &str| SandboxSpec {
        level: IsolationLevel::ContextIsolated,
        ..spec_for(tenant)
    };
    // B opens isolate sandboxes until refused.
    let mut held = Vec::new();
    let refusal = loop {
        match p.open_sandbox(js("b"), Some(EngineName::ISOLATE)).await {
            Ok(s) => held.push(s),
            Err(e) => break e,
        }
        assert!(
            held.len() <= share as usize,
            "past the share: {}",
            held.len()
        );
    };
    assert_eq!(held.len(), share as usize);
    assert_eq!(refusal.code, ErrorCode::PoolExhausted, "{refusal}");
    assert!(
        refusal.message.contains("fair share"),
        "{}",
        refusal.message
    );
    // A opens at once: no wait for a slot B holds.
    let t = Instant::now();
    let a = p
        .open_sandbox(js("a"), Some(EngineName::ISOLATE))
        .await
        .unwrap();
    let took = t.elapsed();
    eprintln!("tenant a's open while b holds its share ({share}): {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    a.destroy().await.unwrap();
    // An explicit cap wins over the fair share.
    let mut capped = two_keys();
    capped.limiter.max_slots_per_tenant = Some(3);
    assert_eq!(capped.slots_per_tenant(), (Some(3), false));
    for s in held {
        s.destroy().await.unwrap();
    }
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// Whether a process with `marker` among its arguments runs on this host.
fn runs_with(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| c.split(|b| *b == 0).any(|arg| arg == marker.as_bytes()))
            .unwrap_or(false)
    })
}

/// A destroyed sandbox's instance is recycled for the next sandbox, another
/// tenant's here, with nothing of it left: the next sandbox has an id of its own,
/// no files and no processes of the first; the first id stays destroyed for its
/// owner and unknown to everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroyed_sandboxs_instance_serves_the_next_tenant_with_nothing_of_it() {
    let mut config = quiet_config();
    config.pool.max_size = 1;
    config.pool.min_idle = 0;
    let p = start(config);
    let (alice, bob) = (Caller::tenant("alice"), Caller::tenant("bob"));
    let marker = "3000.4711";

    let a = p.open_sandbox(spec_for("alice"), None).await.unwrap();
    let first = a.exec(sh_as("alice", "echo hi")).await.unwrap();
    a.write_file("secret.txt", b"alice's").await.unwrap();
    a.start_process(paddock_core::ProcessSpec::new(["sleep", marker]))
        .await
        .unwrap();
    // Started: it shows under its own name once it has exec'd.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !runs_with(marker) {
        assert!(
            Instant::now() < deadline,
            "the background process never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.destroy().await.unwrap();
    assert!(
        !runs_with(marker),
        "destroy returned with its process alive"
    );

    let b = p.open_sandbox(spec_for("bob"), None).await.unwrap();
    let next = b.exec(sh_as("bob", "ls -A; echo end")).await.unwrap();
    assert_eq!(
        next.instance_id, first.instance_id,
        "one instance in the pool: the first sandbox's was recycled for this one"
    );
    assert_ne!(b.id(), a.id(), "a sandbox id is never handed out twice");
    assert_eq!(next.stdout, "end\n", "{next:?}");
    assert!(b.list_files("").await.unwrap().is_empty());
    assert!(b.read_file("secret.txt").await.is_err());

    let gone = p.sandbox(&alice, a.id()).await.unwrap_err();
    assert_eq!(gone.code, ErrorCode::EngineDisposed, "{gone}");
    let unknown = p.sandbox(&bob, a.id()).await.unwrap_err();
    assert_eq!(unknown.code, ErrorCode::NotFound, "{unknown}");
    let theirs = p.sandbox(&alice, b.id()).await.unwrap_err();
    assert_eq!(theirs.code, ErrorCode::NotFound, "{theirs}");
    b.destroy().await.unwrap();
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

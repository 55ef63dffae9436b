//! The limiter: sliding window, exact retry hints, concurrency caps released on drop,
//! tenant independence, bounded memory, the output cap, and the actor.

use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use paddock_core::{EngineName, Error, ErrorCode, ExecResult, ExecutionId, Outcome};
use paddock_pool::clock::{ManualClock, SharedClock};
use paddock_pool::limiter::{
    enforce_output_cap, truncate_output, truncation_marker, Admit, Limiter, LimiterConfig,
    LimiterCore, Permit, Stats, MAX_TENANT_LEN,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn limiter(config: LimiterConfig) -> (LimiterCore, Arc<ManualClock>) {
    let clock = ManualClock::shared();
    let shared: SharedClock = clock.clone();
    (LimiterCore::new(config, shared).unwrap(), clock)
}

fn rate(max: u32, window_ms: u64) -> LimiterConfig {
    LimiterConfig {
        max_executions_per_window: Some(max),
        window_ms,
        ..LimiterConfig::default()
    }
}

fn refused(r: Result<Permit, Error>) -> Error {
    let e = r.expect_err("expected a refusal");
    assert_eq!(e.code, ErrorCode::RateLimited, "{e}");
    e
}

#[test]
fn the_window_slides() {
    let (mut l, clock) = limiter(rate(3, 1_000));
    // Admissions at t = 0, 200, 400: the window is full.
    for _ in 0..3 {
        drop(l.try_admit(Some("a")).unwrap());
        clock.advance(ms(200));
    }
    // t = 600: full until the t = 0 admission leaves at t = 1000.
    assert_eq!(refused(l.try_admit(Some("a"))).retry_after_ms, Some(400));
    clock.advance(ms(399));
    assert_eq!(refused(l.try_admit(Some("a"))).retry_after_ms, Some(1));
    clock.advance(ms(1));
    // t = 1000: one slot freed, and only one.
    drop(l.try_admit(Some("a")).unwrap());
    assert_eq!(refused(l.try_admit(Some("a"))).retry_after_ms, Some(200));
    // After a whole quiet window, the full quota is back.
    clock.advance(ms(1_000));
    for _ in 0..3 {
        drop(l.try_admit(Some("a")).unwrap());
    }
    assert!(l.try_admit(Some("a")).is_err());
}

#[test]
fn retry_after_is_exact_and_rounds_up_to_whole_milliseconds() {
    let (mut l, clock) = limiter(rate(1, 60_000));
    drop(l.try_admit(None).unwrap());
    clock.advance(Duration::from_micros(12_345_600)); // 12 345.6 ms
    let e = refused(l.try_admit(None));
    assert_eq!(e.retry_after_ms, Some(47_655)); // 47 654.4 rounded up
    assert!(e.message.contains("the anonymous tenant"), "{e}");
    assert!(e.message.contains("retry in 47655 ms"), "{e}");
    clock.advance(Duration::from_micros(47_654_400));
    assert!(l.try_admit(None).is_ok());
}

#[test]
fn refusals_do_not_count_against_the_rate() {
    let (mut l, clock) = limiter(rate(2, 1_000));
    drop(l.try_admit(Some("a")).unwrap());
    drop(l.try_admit(Some("a")).unwrap());
    for _ in 0..50 {
        refused(l.try_admit(Some("a")));
    }
    clock.advance(ms(1_000));
    assert!(l.try_admit(Some("a")).is_ok());
    assert!(l.try_admit(Some("a")).is_ok());
    let stats = l.stats();
    assert_eq!(stats.admitted, 4);
    assert_eq!(stats.refused_rate, 50);
}

#[test]
fn tenants_are_independent() {
    let (mut l, _clock) = limiter(LimiterConfig {
        max_concurrent_per_tenant: Some(1),
        ..rate(2, 1_000)
    });
    let a = l.try_admit(Some("a")).unwrap();
    // `a` is at its concurrency cap; `b` and the anonymous tenant are not.
    let e = refused(l.try_admit(Some("a")));
    assert!(e.message.contains("tenant `a`"), "{e}");
    let b = l.try_admit(Some("b")).unwrap();
    let anon = l.try_admit(None).unwrap();
    drop((a, b, anon));
    // Rates are per tenant too: `a` uses its second slot, `b` still has one.
    drop(l.try_admit(Some("a")).unwrap());
    refused(l.try_admit(Some("a")));
    drop(l.try_admit(Some("b")).unwrap());
    refused(l.try_admit(Some("b")));
    drop(l.try_admit(Some("c")).unwrap());
}

#[test]
fn per_tenant_concurrency_holds_and_releases_on_drop() {
    let (mut l, _clock) = limiter(LimiterConfig {
        max_concurrent_per_tenant: Some(2),
        busy_retry_after_ms: 25,
        ..LimiterConfig::default()
    });
    let p1 = l.try_admit(Some("t")).unwrap();
    let p2 = l.try_admit(Some("t")).unwrap();
    let e = refused(l.try_admit(Some("t")));
    assert_eq!(e.retry_after_ms, Some(25));
    assert!(e.message.contains("limit is 2"), "{e}");
    assert_eq!(l.in_flight(), 2);
    drop(p1);
    assert_eq!(l.in_flight(), 1);
    let p3 = l.try_admit(Some("t")).unwrap();
    refused(l.try_admit(Some("t")));
    drop((p2, p3));
    assert_eq!(l.in_flight(), 0);
    let again: Vec<Permit> = (0..2).map(|_| l.try_admit(Some("t")).unwrap()).collect();
    assert_eq!(again.len(), 2);
    // Without a rate limit, no timestamps are kept.
    assert_eq!(l.stats().timestamps_held, 0);
}

#[test]
fn global_concurrency_holds_across_tenants_and_releases_on_drop() {
    let (mut l, _clock) = limiter(LimiterConfig {
        max_concurrent: Some(3),
        ..LimiterConfig::default()
    });
    let held: Vec<Permit> = ["a", "b", "c"]
        .iter()
        .map(|t| l.try_admit(Some(t)).unwrap())
        .collect();
    let e = refused(l.try_admit(Some("d")));
    assert!(e.message.contains("global limit is 3"), "{e}");
    assert_eq!(e.retry_after_ms, Some(100));
    refused(l.try_admit(None));
    // A permit released on another thread frees a slot with no message.
    let mut held = held;
    let one = held.pop().unwrap();
    std::thread::spawn(move || drop(one)).join().unwrap();
    let d = l.try_admit(Some("d")).unwrap();
    assert_eq!(l.in_flight(), 3);
    drop((held, d));
    assert_eq!(l.in_flight(), 0);
    // No per-tenant limit: no tenant is tracked.
    assert_eq!(l.stats().tenants_tracked, 0);
}

#[test]
fn memory_is_bounded_with_many_tenants() {
    let (mut l, clock) = limiter(LimiterConfig {
        max_tenants: 100,
        ..rate(5, 1_000)
    });
    for i in 0..100 {
        for _ in 0..5 {
            drop(l.try_admit(Some(&format!("t{i}"))).unwrap());
        }
        // A tenant's window never holds more than its quota.
        refused(l.try_admit(Some(&format!("t{i}"))));
    }
    let stats = l.stats();
    assert_eq!(stats.tenants_tracked, 100);
    assert_eq!(stats.timestamps_held, 500);
    // The table is full of live tenants: a new one is refused, not admitted by
    // evicting someone's quota.
    let e = refused(l.try_admit(Some("newcomer")));
    assert!(e.message.contains("100 tenants are active"), "{e}");
    assert_eq!(e.retry_after_ms, Some(1_000));
    assert_eq!(l.stats().refused_tenant_table, 1);
    assert_eq!(l.stats().tenants_tracked, 100);
    // Once their windows have passed, idle tenants go without loss.
    clock.advance(ms(1_000));
    for i in 0..1_000 {
        drop(l.try_admit(Some(&format!("n{i}"))).ok());
        assert!(l.stats().tenants_tracked <= 100);
    }
    let stats = l.stats();
    assert!(stats.timestamps_held <= 500, "{stats:?}");
    assert_eq!(stats.tenants_tracked, 100);
}

#[test]
fn a_tenant_with_a_live_permit_is_never_evicted() {
    let (mut l, clock) = limiter(LimiterConfig {
        max_tenants: 1,
        max_concurrent_per_tenant: Some(1),
        busy_retry_after_ms: 50,
        ..rate(10, 1_000)
    });
    let running = l.try_admit(Some("a")).unwrap();
    clock.advance(ms(5_000));
    // `a` is busy: evicting it would reset its concurrency count.
    let e = refused(l.try_admit(Some("b")));
    assert_eq!(e.retry_after_ms, Some(50));
    refused(l.try_admit(Some("a")));
    drop(running);
    clock.advance(ms(50));
    assert!(l.try_admit(Some("b")).is_ok());
}

#[test]
fn long_tenant_names_are_refused() {
    let (mut l, _clock) = limiter(rate(1, 1_000));
    let e = l
        .try_admit(Some(&"x".repeat(MAX_TENANT_LEN + 1)))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions);
    assert!(l.try_admit(Some(&"x".repeat(MAX_TENANT_LEN))).is_ok());
}

#[test]
fn configs_are_validated_and_default_to_unlimited() {
    let c: LimiterConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(c, LimiterConfig::default());
    assert_eq!(c.window_ms, 60_000);
    assert_eq!(c.max_tenants, 100_000);
    let (mut l, _clock) = limiter(c);
    let many: Vec<Permit> = (0..1_000)
        .map(|_| l.try_admit(Some("t")).unwrap())
        .collect();
    assert_eq!(l.in_flight(), many.len());

    assert!(serde_json::from_str::<LimiterConfig>(r#"{"window": 5}"#).is_err());
    for (json, field) in [
        (r#"{"window_ms": 0}"#, "limiter.window_ms"),
        (
            r#"{"max_executions_per_window": 0}"#,
            "limiter.max_executions_per_window",
        ),
        (
            r#"{"max_concurrent_per_tenant": 0}"#,
            "limiter.max_concurrent_per_tenant",
        ),
        (r#"{"max_concurrent": 0}"#, "limiter.max_concurrent"),
        (r#"{"max_tenants": 0}"#, "limiter.max_tenants"),
        (
            r#"{"busy_retry_after_ms": 0}"#,
            "limiter.busy_retry_after_ms",
        ),
    ] {
        let config: LimiterConfig = serde_json::from_str(json).unwrap();
        let e = LimiterCore::new(config, ManualClock::shared()).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert!(e.message.contains(field), "{json}: {e}");
    }
}

#[test]
fn output_cap_cuts_at_a_char_boundary_with_the_sentinel() {
    assert_eq!(truncate_output("short", 10), ("short".into(), false));
    let (cut, truncated) = truncate_output("aé", 2);
    assert!(truncated);
    assert_eq!(cut, "a\n[output truncated at 2 bytes]\n");
    assert_eq!(truncation_marker(7), "\n[output truncated at 7 bytes]\n");

    let mut r = ExecResult::failed(
        ExecutionId::new(),
        EngineName::NOOP,
        Error::new(ErrorCode::Cancelled, "x"),
    );
    r.outcome = Outcome::Completed {
        exit_code: 0,
        signal: None,
    };
    r.stdout = "ü".repeat(10); // 20 bytes
    r.stderr = "ok".into();
    enforce_output_cap(&mut r, 5);
    assert_eq!(r.stdout, format!("üü{}", truncation_marker(5)));
    assert!(r.stdout_truncated);
    assert_eq!(r.stderr, "ok");
    assert!(!r.stderr_truncated);
    // Already capped by the engine: left alone, never marked twice.
    let before = r.stdout.clone();
    enforce_output_cap(&mut r, 5);
    assert_eq!(r.stdout, before);
}

#[test]
fn the_actor_admits_refuses_and_reports() {
    actix::System::new().block_on(async {
        let clock = ManualClock::shared();
        let core = LimiterCore::new(
            LimiterConfig {
                max_concurrent_per_tenant: Some(1),
                ..rate(2, 1_000)
            },
            clock.clone(),
        )
        .unwrap();
        let addr = Limiter::new(core).start();
        let p = addr.send(Admit::tenant("a")).await.unwrap().unwrap();
        let e = addr.send(Admit::tenant("a")).await.unwrap().unwrap_err();
        assert_eq!(e.code, ErrorCode::RateLimited);
        // Released without a message: the next admission sees the slot free.
        drop(p);
        let p = addr.send(Admit::tenant("a")).await.unwrap().unwrap();
        drop(p);
        let e = addr.send(Admit::tenant("a")).await.unwrap().unwrap_err();
        assert_eq!(e.retry_after_ms, Some(1_000));
        clock.advance(ms(1_000));
        let _p = addr.send(Admit { tenant: None }).await.unwrap().unwrap();
        let stats = addr.send(Stats).await.unwrap();
        assert_eq!(stats.admitted, 3);
        assert_eq!(stats.in_flight, 1);
        assert_eq!(stats.refused_rate, 1);
        assert_eq!(stats.refused_concurrency, 1);
        assert_eq!(stats.tenants_tracked, 2);
    });
}

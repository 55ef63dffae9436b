//! The audit log: entries, ring, search, statistics, the NDJSON file and its
//! rotation, write errors, the callback, and the actor.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use paddock_core::{
    code_hash, EngineName, Error, ErrorCode, ExecRequest, ExecResult, ExecutionId, Language,
    LimitKind, Outcome, Program, Timings, Usage,
};
use paddock_pool::audit::{
    Audit, AuditConfig, AuditEntry, AuditLog, AuditOutcome, AuditQuery, Flush, Health, KillReason,
    Record, Search, Statistics, Timestamp,
};

const T0: u64 = 1_800_000_000_000;

fn entry(n: u64, tenant: &str, engine: EngineName, success: bool, duration_ms: u64) -> AuditEntry {
    AuditEntry {
        id: ExecutionId::new(),
        timestamp: Timestamp::from_unix_ms(T0 + n * 1_000),
        tenant: Some(tenant.to_owned()),
        engine,
        code_hash: code_hash(&n.to_string()),
        duration_ms,
        outcome: AuditOutcome::Completed,
        exit_code: Some(if success { 0 } else { 1 }),
        memory_bytes: 1_000 * n,
        kill_reason: None,
        error_code: None,
        egress: None,
    }
}

fn simple(n: u64) -> AuditEntry {
    entry(n, "t", EngineName::SUBPROCESS, true, n)
}

fn memory_log(ring_capacity: usize) -> AuditLog {
    AuditLog::new(AuditConfig {
        ring_capacity,
        ..AuditConfig::default()
    })
    .unwrap()
}

fn file_log(path: &Path, max_file_bytes: u64, max_files: u32) -> AuditLog {
    AuditLog::new(AuditConfig {
        file: Some(path.to_owned()),
        max_file_bytes,
        max_files,
        ..AuditConfig::default()
    })
    .unwrap()
}

fn rotated(path: &Path, n: u32) -> PathBuf {
    PathBuf::from(format!("{}.{n}", path.display()))
}

/// Every line of `path`, parsed; panics on a line that is not an entry.
fn read_entries(path: &Path) -> Vec<AuditEntry> {
    let text = fs::read_to_string(path).unwrap();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "{path:?} ends mid-line"
    );
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{path:?}: `{l}`: {e}")))
        .collect()
}

fn result_with(outcome: Outcome) -> ExecResult {
    let mut r = ExecResult::failed(
        ExecutionId::new(),
        EngineName::SUBPROCESS,
        Error::new(ErrorCode::SpawnFailed, "x"),
    );
    r.outcome = outcome;
    r
}

#[test]
fn an_entry_is_built_from_a_result_and_holds_no_code_or_env() {
    let mut req = ExecRequest::new(Program::code(
        Language::Python,
        "print(open('/etc/secret-file').read())",
    ));
    req.env.insert("API_TOKEN".into(), "hunter2-value".into());
    let mut r = result_with(Outcome::Completed {
        exit_code: 0,
        signal: None,
    });
    r.id = req.id.clone();
    r.stdout = "stdout-content".into();
    r.usage = Usage {
        cpu_ms: 5,
        wall_ms: 42,
        peak_memory_bytes: 7 << 20,
    };
    r.timings = Timings {
        queued_at_ms: T0,
        started_at_ms: T0 + 1,
        finished_at_ms: T0 + 43,
    };
    let hash = code_hash(&req.program.audit_text());
    let e = AuditEntry::from_result(&r, Some("acme"), hash.clone());
    assert_eq!(e.id, req.id);
    assert_eq!(e.timestamp, Timestamp::from_unix_ms(T0 + 43));
    assert_eq!(e.tenant.as_deref(), Some("acme"));
    assert_eq!(e.engine, EngineName::SUBPROCESS);
    assert_eq!(e.code_hash, hash);
    assert_eq!(e.duration_ms, 42);
    assert_eq!(e.outcome, AuditOutcome::Completed);
    assert_eq!(e.exit_code, Some(0));
    assert_eq!(e.memory_bytes, 7 << 20);
    assert_eq!(e.kill_reason, None);
    assert_eq!(e.error_code, None);
    assert!(e.is_success());

    let json = serde_json::to_value(&e).unwrap();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = vec![
        "id",
        "timestamp",
        "tenant",
        "engine",
        "code_hash",
        "duration_ms",
        "outcome",
        "exit_code",
        "memory_bytes",
        "kill_reason",
        "error_code",
    ];
    let mut keys_sorted = keys.clone();
    keys_sorted.sort_unstable();
    expected.sort_unstable();
    assert_eq!(keys_sorted, expected);
    let text = json.to_string();
    for secret in [
        "secret-file",
        "print(",
        "hunter2",
        "API_TOKEN",
        "stdout-content",
    ] {
        assert!(!text.contains(secret), "{secret} leaked into {text}");
    }
    assert_eq!(
        json["timestamp"],
        Timestamp::from_unix_ms(T0 + 43).to_string()
    );
    assert_eq!(json["outcome"], "completed");
    assert_eq!(serde_json::from_value::<AuditEntry>(json).unwrap(), e);
}

#[test]
fn kill_reason_and_error_code_follow_the_outcome() {
    let cases = [
        (
            Outcome::TimedOut,
            Some(KillReason::Timeout),
            Some(ErrorCode::Timeout),
        ),
        (
            Outcome::Cancelled,
            Some(KillReason::Cancel),
            Some(ErrorCode::Cancelled),
        ),
        (
            Outcome::LimitExceeded {
                limit: LimitKind::Memory,
            },
            Some(KillReason::Memory),
            Some(ErrorCode::MemoryExceeded),
        ),
        (
            Outcome::LimitExceeded {
                limit: LimitKind::Cpu,
            },
            Some(KillReason::Cpu),
            Some(ErrorCode::LimitsExceeded),
        ),
        (
            Outcome::Failed {
                error: Error::new(ErrorCode::SpawnFailed, "no such program"),
            },
            None,
            Some(ErrorCode::SpawnFailed),
        ),
        (
            Outcome::Completed {
                exit_code: 137,
                signal: Some(9),
            },
            None,
            None,
        ),
    ];
    for (outcome, kill, code) in cases {
        let mut r = result_with(outcome.clone());
        r.usage.wall_ms = 0;
        r.timings = Timings {
            queued_at_ms: T0,
            started_at_ms: T0 + 10,
            finished_at_ms: T0 + 35,
        };
        let e = AuditEntry::from_result(&r, None, code_hash("x"));
        assert_eq!(e.kill_reason, kill, "{outcome:?}");
        assert_eq!(e.error_code, code, "{outcome:?}");
        assert_eq!(
            e.duration_ms, 25,
            "unmeasured wall time falls back to the timings"
        );
        assert!(!e.is_success());
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["outcome"], outcome.name());
    }
    let e = AuditEntry::from_result(&result_with(Outcome::TimedOut), None, code_hash("x"));
    assert_eq!(serde_json::to_value(&e).unwrap()["kill_reason"], "timeout");
}

#[test]
fn timestamps_are_rfc3339_utc_with_millis() {
    let t = Timestamp::from_unix_ms(0);
    assert_eq!(t.to_string(), "1970-01-01T00:00:00.000Z");
    let t = Timestamp::from_unix_ms(T0 + 7);
    let s = t.to_string();
    assert_eq!(s, "2027-01-15T08:00:00.007Z");
    assert_eq!(Timestamp::parse_rfc3339(&s).unwrap(), t);
    assert_eq!(
        Timestamp::parse_rfc3339("2027-01-15T09:30:00.007123+01:30").unwrap(),
        t
    );
    assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{s}\""));
    assert_eq!(
        serde_json::from_str::<Timestamp>(&(T0 + 7).to_string()).unwrap(),
        t
    );
    let e = Timestamp::parse_rfc3339("yesterday").unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidOptions);
    assert!(Timestamp::parse_rfc3339("1969-12-31T23:59:59Z").is_err());
    assert_eq!(
        Timestamp::from_unix_ms(u64::MAX).to_string(),
        "9999-12-31T23:59:59.999Z"
    );
}

#[test]
fn the_ring_is_bounded_and_search_is_newest_first() {
    let mut log = memory_log(3);
    let entries: Vec<AuditEntry> = (1..=5).map(simple).collect();
    for e in &entries {
        assert!(log.record(e.clone()));
    }
    assert_eq!(log.len(), 3);
    let found = log.search(&AuditQuery::default());
    let ids: Vec<_> = found.iter().map(|e| e.id.clone()).collect();
    assert_eq!(
        ids,
        [&entries[4], &entries[3], &entries[2]].map(|e| e.id.clone())
    );
    // Counters cover every entry; percentiles only the ring.
    let stats = log.statistics();
    assert_eq!(stats.total, 5);
    assert_eq!(stats.sample, 3);
    assert_eq!(stats.avg_duration_ms, 3.0);
    assert_eq!(stats.p50_ms, 4);
    // An id that left the ring may be recorded again; one still in it may not.
    assert!(!log.record(entries[4].clone()));
    assert!(log.record(entries[0].clone()));
    assert_eq!(log.health().duplicates_ignored, 1);
    assert_eq!(log.statistics().total, 6);
}

#[test]
fn search_filters_each_field() {
    let mut log = memory_log(100);
    let all = [
        entry(1, "a", EngineName::SUBPROCESS, true, 10),
        entry(2, "a", EngineName::ISOLATE, false, 10),
        entry(3, "b", EngineName::SUBPROCESS, false, 10),
        entry(4, "b", EngineName::CONTAINER, true, 10),
        entry(5, "a", EngineName::SUBPROCESS, true, 10),
    ];
    for e in &all {
        log.record(e.clone());
    }
    let mut anonymous = entry(6, "x", EngineName::NOOP, true, 10);
    anonymous.tenant = None;
    log.record(anonymous);
    let ns = |q: AuditQuery| -> Vec<u64> {
        log.search(&q)
            .iter()
            .map(|e| (e.timestamp.unix_ms() - T0) / 1_000)
            .collect()
    };
    let at = |n: u64| Some(Timestamp::from_unix_ms(T0 + n * 1_000));

    assert_eq!(ns(AuditQuery::default()), [6, 5, 4, 3, 2, 1]);
    assert_eq!(
        ns(AuditQuery {
            success: Some(true),
            ..Default::default()
        }),
        [6, 5, 4, 1]
    );
    assert_eq!(
        ns(AuditQuery {
            success: Some(false),
            ..Default::default()
        }),
        [3, 2]
    );
    assert_eq!(
        ns(AuditQuery {
            tenant: Some("a".into()),
            ..Default::default()
        }),
        [5, 2, 1]
    );
    assert_eq!(
        ns(AuditQuery {
            engine: Some(EngineName::SUBPROCESS),
            ..Default::default()
        }),
        [5, 3, 1]
    );
    assert_eq!(
        ns(AuditQuery {
            after: at(4),
            ..Default::default()
        }),
        [6, 5, 4],
        "after is inclusive"
    );
    assert_eq!(
        ns(AuditQuery {
            before: at(3),
            ..Default::default()
        }),
        [2, 1],
        "before is exclusive"
    );
    assert_eq!(
        ns(AuditQuery {
            limit: Some(2),
            ..Default::default()
        }),
        [6, 5]
    );
    assert_eq!(
        ns(AuditQuery {
            success: Some(true),
            tenant: Some("a".into()),
            engine: Some(EngineName::SUBPROCESS),
            after: at(1),
            before: at(6),
            limit: Some(10),
        }),
        [5, 1]
    );
    let q: AuditQuery = serde_json::from_str(&format!(
        r#"{{"tenant": "b", "after": "{}", "engine": "container"}}"#,
        Timestamp::from_unix_ms(T0 + 2_000)
    ))
    .unwrap();
    assert_eq!(ns(q), [4]);
    assert!(serde_json::from_str::<AuditQuery>(r#"{"tennant": "a"}"#).is_err());
}

#[test]
fn statistics_are_exact_on_known_values() {
    let mut log = memory_log(100);
    let empty = log.statistics();
    assert_eq!((empty.total, empty.success_rate, empty.p99_ms), (0, 0.0, 0));
    log.record(entry(1, "a", EngineName::SUBPROCESS, true, 10));
    log.record(entry(2, "a", EngineName::SUBPROCESS, false, 20));
    log.record(entry(3, "a", EngineName::SUBPROCESS, true, 30));
    let s = log.statistics();
    assert_eq!(s.total, 3);
    assert_eq!(s.success, 2);
    assert_eq!(s.failure, 1);
    assert_eq!(s.success_rate, 2.0 / 3.0);
    assert_eq!(s.avg_duration_ms, 20.0);
    assert_eq!(s.p50_ms, 20);
    assert_eq!(s.p99_ms, 30);
    assert_eq!(s.total_memory_bytes, 6_000);
    let mut log = memory_log(1_000);
    for d in 1..=100 {
        log.record(simple(d));
    }
    let s = log.statistics();
    assert_eq!((s.p50_ms, s.p99_ms, s.avg_duration_ms), (50, 99, 50.5));
}

#[test]
fn on_log_is_called_once_per_entry() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let mut log = memory_log(10).with_on_log(Arc::new(move |e: &AuditEntry| {
        assert_eq!(e.tenant.as_deref(), Some("t"));
        seen.fetch_add(1, Ordering::SeqCst);
    }));
    let entries: Vec<_> = (1..=25).map(simple).collect();
    for e in &entries {
        log.record(e.clone());
    }
    log.record(entries[24].clone()); // a duplicate: not recorded, not reported
    assert_eq!(calls.load(Ordering::SeqCst), 25);

    let mut panicky =
        memory_log(10).with_on_log(Arc::new(|_: &AuditEntry| panic!("callback failure")));
    assert!(panicky.record(simple(1)));
    assert_eq!(panicky.len(), 1);
    assert_eq!(panicky.health().callback_panics, 1);
}

#[test]
fn the_file_gets_one_valid_line_per_entry_and_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.ndjson");
    let first: Vec<_> = (1..=3).map(simple).collect();
    {
        let mut log = file_log(&path, 1 << 20, 3);
        for e in &first {
            log.record(e.clone());
        }
        log.flush().unwrap();
        assert_eq!(read_entries(&path), first);
        log.record(simple(4));
        // Dropped without an explicit flush: the buffer is written on drop.
    }
    let mut log = file_log(&path, 1 << 20, 3);
    log.record(simple(5));
    log.flush().unwrap();
    let lines = read_entries(&path);
    assert_eq!(lines.len(), 5);
    assert_eq!(&lines[..3], &first[..]);
    assert_eq!(log.health().file_bytes, fs::metadata(&path).unwrap().len());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn a_torn_last_line_does_not_corrupt_the_next_entry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.ndjson");
    let whole = format!("{}\n", serde_json::to_string(&simple(1)).unwrap());
    fs::write(&path, format!("{whole}{{\"id\":\"torn")).unwrap();
    let mut log = file_log(&path, 1 << 20, 3);
    let e = simple(2);
    log.record(e.clone());
    log.flush().unwrap();
    let text = fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1], "{\"id\":\"torn");
    assert_eq!(serde_json::from_str::<AuditEntry>(lines[2]).unwrap(), e);
}

#[test]
fn rotation_by_size_keeps_every_entry_in_valid_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.ndjson");
    let max = 1_024;
    let mut log = file_log(&path, max, 50);
    let entries: Vec<_> = (1..=60).map(simple).collect();
    for (i, e) in entries.iter().enumerate() {
        log.record(e.clone());
        if i % 7 == 0 {
            log.flush().unwrap(); // rotations both with and without a buffered tail
        }
    }
    log.flush().unwrap();
    assert_eq!(log.health().write_errors, 0);

    let mut files = vec![path.clone()];
    let mut n = 1;
    while rotated(&path, n).exists() {
        files.push(rotated(&path, n));
        n += 1;
    }
    assert!(files.len() > 5, "expected several rotations, got {files:?}");
    // Oldest first: the highest suffix down to the active file.
    let mut in_order = Vec::new();
    for f in files.iter().rev() {
        let size = fs::metadata(f).unwrap().len();
        assert!(size <= max, "{f:?} is {size} bytes");
        let lines = read_entries(f);
        assert!(!lines.is_empty(), "{f:?} is empty");
        in_order.extend(lines);
    }
    assert_eq!(in_order, entries, "every entry once, in order");
}

#[test]
fn rotation_deletes_the_oldest_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.ndjson");
    let mut log = file_log(&path, 1_024, 2);
    let entries: Vec<_> = (1..=40).map(simple).collect();
    for e in &entries {
        log.record(e.clone());
    }
    log.flush().unwrap();
    assert!(rotated(&path, 1).exists());
    assert!(rotated(&path, 2).exists());
    assert!(!rotated(&path, 3).exists());
    let names: HashSet<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names,
        HashSet::from(["audit.ndjson", "audit.ndjson.1", "audit.ndjson.2"].map(String::from))
    );
    let mut kept = read_entries(&rotated(&path, 2));
    kept.extend(read_entries(&rotated(&path, 1)));
    kept.extend(read_entries(&path));
    // The newest entries, contiguous, ending with the last one.
    assert!(kept.len() < entries.len());
    assert_eq!(kept[..], entries[entries.len() - kept.len()..]);
}

#[test]
fn a_file_error_is_reported_and_keeps_the_entry_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("logs");
    fs::create_dir(&sub).unwrap();
    let path = sub.join("audit.ndjson");
    let mut log = file_log(&path, 1_024, 3);
    log.record(simple(1));
    log.flush().unwrap();
    fs::remove_dir_all(&sub).unwrap();

    // Enough entries to need a rotation, which cannot rename inside a missing
    // directory; later writes cannot reopen the file.
    for n in 2..=12 {
        assert!(log.record(simple(n)));
    }
    let _ = log.flush();
    assert_eq!(log.len(), 12, "every entry stays in the ring");
    assert_eq!(log.statistics().total, 12);
    let health = log.health();
    assert!(health.write_errors > 0, "{health:?}");
    assert!(health.entries_not_written > 0, "{health:?}");
    assert!(
        health
            .last_error
            .as_deref()
            .unwrap()
            .contains("audit.ndjson"),
        "{health:?}"
    );

    // The directory comes back: the next write reopens the file.
    fs::create_dir(&sub).unwrap();
    let e = simple(13);
    log.record(e.clone());
    log.flush().unwrap();
    assert_eq!(read_entries(&path), vec![e]);
    assert_eq!(log.len(), 13);
}

#[test]
fn configs_are_validated() {
    let c: AuditConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(c, AuditConfig::default());
    assert_eq!(
        (c.ring_capacity, c.max_file_bytes, c.max_files, c.file),
        (10_000, 64 << 20, 5, None)
    );
    assert!(serde_json::from_str::<AuditConfig>(r#"{"ring_size": 5}"#).is_err());
    for (json, field) in [
        (r#"{"ring_capacity": 0}"#, "audit.ring_capacity"),
        (r#"{"max_file_bytes": 10}"#, "audit.max_file_bytes"),
        (r#"{"max_files": 0}"#, "audit.max_files"),
        (r#"{"flush_interval_ms": 0}"#, "audit.flush_interval_ms"),
        (r#"{"file": ""}"#, "audit.file"),
    ] {
        let config: AuditConfig = serde_json::from_str(json).unwrap();
        let e = AuditLog::new(config).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert!(e.message.contains(field), "{json}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let e = AuditLog::new(AuditConfig {
        file: Some(dir.path().join("missing").join("audit.ndjson")),
        ..AuditConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(e.message.contains("audit.file"), "{e}");
}

/// Polls `check` for up to two seconds.
async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    check()
}

#[test]
fn the_actor_records_searches_and_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.ndjson");
    let config = AuditConfig {
        file: Some(path.clone()),
        flush_interval_ms: 60_000,
        ..AuditConfig::default()
    };
    let path_for_actor = path.clone();
    actix::System::new().block_on(async move {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let log = AuditLog::new(config)
            .unwrap()
            .with_on_log(Arc::new(move |_| {
                seen.fetch_add(1, Ordering::SeqCst);
            }));
        let audit = Audit::new(log).start();
        let a = entry(1, "a", EngineName::SUBPROCESS, true, 10);
        let b = entry(2, "b", EngineName::ISOLATE, false, 30);
        assert!(audit.send(Record(a.clone())).await.unwrap());
        assert!(audit.send(Record(b.clone())).await.unwrap());
        assert!(!audit.send(Record(b.clone())).await.unwrap());
        let found = audit
            .send(Search(AuditQuery {
                success: Some(false),
                ..Default::default()
            }))
            .await
            .unwrap();
        assert_eq!(found, vec![b.clone()]);
        let stats = audit.send(Statistics).await.unwrap();
        assert_eq!((stats.total, stats.avg_duration_ms), (2, 20.0));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Buffered until a flush (the interval is a minute away).
        assert!(read_entries(&path_for_actor).is_empty());
        audit.send(Flush).await.unwrap().unwrap();
        assert_eq!(read_entries(&path_for_actor), vec![a, b]);
        let health = audit.send(Health).await.unwrap();
        assert_eq!(health.duplicates_ignored, 1);
        assert_eq!(health.write_errors, 0);

        // Stopping with the system flushes what is buffered.
        let c = entry(3, "c", EngineName::SUBPROCESS, true, 5);
        assert!(audit.send(Record(c.clone())).await.unwrap());
        assert_eq!(read_entries(&path_for_actor).len(), 2);
        actix::System::current().stop();
    });
    assert_eq!(
        read_entries(&path).last().map(|e| e.tenant.as_deref()),
        Some(Some("c"))
    );
}

#[test]
fn the_actor_flushes_on_its_interval() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.ndjson");
    let config = AuditConfig {
        file: Some(path.clone()),
        flush_interval_ms: 10,
        ..AuditConfig::default()
    };
    actix::System::new().block_on(async move {
        let audit = Audit::new(AuditLog::new(config).unwrap()).start();
        let e = simple(1);
        assert!(audit.send(Record(e.clone())).await.unwrap());
        assert!(
            eventually(|| read_entries(&path) == vec![e.clone()]).await,
            "the interval flush did not happen"
        );
        // Still running: the flush did not come from stopping.
        assert_eq!(audit.send(Statistics).await.unwrap().total, 1);
        // With its last address gone, it stops at the next interval, flushing.
        let c = simple(2);
        assert!(audit.send(Record(c.clone())).await.unwrap());
        let weak = audit.downgrade();
        drop(audit);
        assert!(
            eventually(|| weak.upgrade().is_none()).await,
            "the actor outlived its addresses"
        );
        assert_eq!(read_entries(&path), vec![e, c]);
    });
}

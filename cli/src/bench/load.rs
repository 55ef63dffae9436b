//! The `load` scenario: many short subprocess executions from many concurrent callers
//! against a small pool. Callers whose request is refused with `POOL_EXHAUSTED` (the
//! wait queue is full) wait the advised `retry_after_ms` and try again; refusals are
//! counted. Every call must get exactly one answer, every accepted call exactly one
//! audit entry, and the host's memory must stay flat.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{ErrorCode, ExecRequest, ExecutionId, Program};
use paddock_pool::audit::{AuditConfig, AuditQuery};
use serde_json::json;

use super::{report, round, rss_bytes, summarize};

#[derive(Debug)]
enum Answer {
    Ok(ExecutionId, Duration),
    Rejected,
    Failed(String),
}

pub(super) async fn load(
    total: usize,
    callers: usize,
    max_size: usize,
    max_waiting: usize,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    let mut config = PaddockConfig::default();
    config.pool.max_size = max_size;
    config.pool.min_idle = max_size;
    config.pool.max_waiting = max_waiting;
    config.pool.acquire_timeout_ms = 10_000;
    let paddock = match paddock::builder()
        .config(config)
        .audit(AuditConfig {
            ring_capacity: total * 4,
            ..AuditConfig::default()
        })
        .start()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    // Warm up, then take the memory baseline.
    for _ in 0..50 {
        let _ = paddock
            .execute(ExecRequest::new(Program::command(["/bin/true"])))
            .await;
    }
    let rss_before = rss_bytes();
    let accepted_before = paddock
        .stats()
        .await
        .map(|s| s.accepted_total.unwrap_or_default())
        .unwrap_or(0);

    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let paddock = paddock.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                // One execution: retried after `retry_after_ms` while the pool's
                // queue is full, as a well-behaved client would.
                let t = Instant::now();
                loop {
                    let request = ExecRequest::new(Program::command(["/bin/true"]));
                    let id = request.id.clone();
                    match paddock.execute(request).await {
                        Ok(r) if r.id == id && r.is_success() => {
                            answers.push(Answer::Ok(id, t.elapsed()));
                            break;
                        }
                        Ok(r) => {
                            answers.push(Answer::Failed(format!("{:?}", r.outcome)));
                            break;
                        }
                        Err(e) if e.code == ErrorCode::PoolExhausted => {
                            answers.push(Answer::Rejected);
                            let wait = e.retry_after_ms.unwrap_or(50);
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                        }
                        Err(e) => {
                            answers.push(Answer::Failed(e.to_string()));
                            break;
                        }
                    }
                }
            }
            answers
        }));
    }
    let mut answers = Vec::with_capacity(total);
    for t in tasks {
        answers.extend(t.await.unwrap_or_default());
    }
    let elapsed = start.elapsed();
    let rss_after = rss_bytes();

    let mut ids = HashSet::new();
    let mut latencies = Vec::new();
    let (mut rejected, mut failed, mut duplicated) = (0, 0, 0);
    let mut first_failure = None;
    for a in &answers {
        match a {
            Answer::Ok(id, d) => {
                if !ids.insert(id.clone()) {
                    duplicated += 1;
                }
                latencies.push(*d);
            }
            Answer::Rejected => rejected += 1,
            Answer::Failed(why) => {
                failed += 1;
                first_failure.get_or_insert_with(|| why.clone());
            }
        }
    }
    // Every execution ends in exactly one completion or failure.
    let lost = total.saturating_sub(ids.len() + failed);
    let stats = paddock
        .stats()
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let accepted = stats.accepted_total.unwrap_or_default() - accepted_before;
    let audit = paddock
        .audit(
            &paddock_pool::Caller::Embedder,
            AuditQuery {
                limit: Some(total * 4),
                ..AuditQuery::default()
            },
        )
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let audited_ids: HashSet<&ExecutionId> = audit.iter().map(|e| &e.id).collect();
    let audited_ok = ids.iter().filter(|id| audited_ids.contains(id)).count();
    // Entries of this run: the audit holds the warm-up too.
    let audit_entries = audit.len() as u64 - 50.min(audit.len() as u64);
    let calls = answers.len() as u64;
    let _ = paddock.shutdown(Duration::from_secs(10)).await;
    let lat = summarize(if latencies.is_empty() {
        vec![Duration::ZERO]
    } else {
        latencies
    });
    report(
        &json!({
            "scenario": "load",
            "executions": total,
            "callers": callers,
            "max_size": max_size,
            "max_waiting": max_waiting,
            "elapsed_ms": elapsed.as_millis() as u64,
            "throughput_per_s": (ids.len() as f64 / elapsed.as_secs_f64()).round(),
            "p50_us": round(lat.p50),
            "p99_us": round(lat.p99),
            "completed": ids.len(),
            "rejected": rejected,
            "failed": failed,
            "first_failure": first_failure,
            "lost": lost,
            "duplicated": duplicated,
            "calls": calls,
            "accepted": accepted,
            "audit_entries": audit_entries,
            "completed_with_audit_entry": audited_ok,
            "rss_growth_bytes": rss_after as i64 - rss_before as i64,
        }),
        as_json,
    );
    let exact = accepted == calls && audit_entries == accepted && audited_ok == ids.len();
    Ok(if lost == 0 && duplicated == 0 && failed == 0 && exact {
        0
    } else {
        1
    })
}

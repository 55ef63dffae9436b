//! The `soak` scenario: a mixed load on every engine the host can run, through one
//! `Paddock`, for minutes; then the checks that nothing leaked.
//!
//! Several concurrent callers cycle through a fixed, shuffled mix of work: cold
//! subprocess commands, Python `Code` on warm workers, JavaScript in QuickJS isolates
//! (routed by isolation level `context-isolated`), commands in containers (level
//! `strict`) when the host has an OCI runtime, programs that fail (exit code 1, an
//! uncaught JavaScript error, a Python exception), programs killed at a small
//! `timeout_ms`, programs cancelled mid-run (by id, and from a stream once their first
//! output arrives), programs whose output passes the cap, and short sandbox sessions
//! (open, write a file, exec, read and list files, a failing exec, destroy). Every
//! answer is checked against what that piece of work must give; anything else counts
//! as unexpected. A caller refused with `POOL_EXHAUSTED` or `RATE_LIMITED` waits the
//! advised `retry_after_ms` and tries again with a fresh request.
//!
//! Phases: a warm-up (every kind of work runs at least once), a pause until the pools
//! are back at `min_idle`, the baseline (RSS, the allocator's live heap, open
//! descriptors, descendant processes, entries in the engines' directories), the
//! measured load for `--duration`, the same pause, the end figures, shutdown, and
//! what is left after it (processes, engine directories, descriptors).
//!
//! Settings that make the two pauses comparable: pools reap instances idle for 1 s,
//! so both pauses end with the same pool sizes; bounded stores are sized to fill
//! during the warm-up, so that growth after it is growth beyond their bounds. The
//! audit ring keeps 1,000 entries (entries are counted by the `on_audit` callback
//! instead) and the streamer's `max_streams`, which also bounds how many ended
//! executions it remembers, is 1,000 by default (the scheduler's own default,
//! 100,000, takes 100,000 executions to fill; `--max-streams` sets it). The streamer
//! keeps finished output 1 s instead of 10 s, and the pauses wait for it to go.
//!
//! Exactly once: every request id issued is tracked until it has its one answer and
//! its one audit entry (the tracking map holds only ids in flight, so the benchmark's
//! own bookkeeping does not grow with the run). Ids refused before acceptance get an
//! answer and no audit entry; their number must equal the scheduler's
//! `refused_total`, and the audit entries the scheduler's `accepted_total`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{
    EngineName, Error, ErrorCode, ExecRequest, ExecResult, ExecutionId, IsolationLevel, Language,
    Limits, Outcome, Program, SandboxSpec, SandboxStatus,
};
use paddock_engines::container::ContainerEngine;
use paddock_engines::subprocess::SubprocessEngine;
use paddock_pool::audit::AuditConfig;
use paddock_pool::streamer::StreamerConfig;
use paddock_pool::{Execute, Paddock, PoolStats, SandboxHandle, Stats, StreamEvent};
use serde_json::json;

use super::{report, round, rss_bytes, status_field};

mod callers;
mod mix;
mod probe;

use callers::*;
use mix::*;
use probe::*;

/// The output cap of the flooding programs, which write about 2 MB each.
const CAP: u64 = 64 << 10;
/// Longest wait for one answer before it counts as lost.
const ANSWER_LIMIT: Duration = Duration::from_secs(60);
/// Pools reap instances idle this long, so that they are back at `min_idle` soon
/// after the load stops.
const IDLE_TIMEOUT_MS: u64 = 1_000;
/// How long the streamer keeps a finished execution's output for late subscribers
/// (the scheduler's default is 10 s). The pauses wait for it to pass, so that no
/// lingering output is counted in the live heap at the baseline or the end.
const STREAM_LINGER: Duration = Duration::from_secs(1);
/// Open descriptors allowed beyond the baseline at the end. Both are counted with the
/// pools at the same size and every execution finished, when the count is exact.
const FD_ALLOWANCE: usize = 0;

/// The settings of one soak, from the command line.
#[derive(Debug, Clone)]
pub(super) struct SoakArgs {
    /// The measured load's length.
    pub(super) duration: Duration,
    /// The warm-up's length (at least; it goes on until every kind of work ran).
    pub(super) warmup: Duration,
    /// Concurrent callers.
    pub(super) callers: usize,
    /// Every pool's `min_idle`.
    pub(super) min_idle: usize,
    /// Every pool's `max_size`.
    pub(super) max_size: usize,
    /// Every pool's `max_waiting`.
    pub(super) max_waiting: usize,
    /// How often a sample line is printed (with `--json`).
    pub(super) sample_every: Duration,
    /// Only the tasks of the mix with these names (all when empty).
    pub(super) only: Vec<String>,
    /// The streamer's `max_streams`.
    pub(super) max_streams: usize,
    /// RSS growth allowed after the warm-up, in percent.
    pub(super) max_rss_growth_pct: f64,
}

/// Runs the callers for `length` (and, with `until_all_ran`, until every task ran
/// once, up to three times `length`), sampling RSS once a second. Returns how long
/// it ran and the RSS samples.
async fn phase(
    ctx: &Arc<Ctx>,
    name: &str,
    length: Duration,
    until_all_ran: bool,
    callers: usize,
    sample_every: Duration,
    as_json: bool,
) -> (Duration, Vec<u64>) {
    ctx.stop.store(false, Ordering::Relaxed);
    let started = Instant::now();
    let workers: Vec<_> = (0..callers)
        .map(|_| {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                while !ctx.stop.load(Ordering::Relaxed) {
                    let n = ctx.next.fetch_add(1, Ordering::Relaxed);
                    let task = ctx.schedule[n % ctx.schedule.len()];
                    ctx.run(task).await;
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    let mut next_print = sample_every;
    loop {
        tokio::time::sleep(Duration::from_secs(1).min(length)).await;
        let elapsed = started.elapsed();
        let rss = rss_bytes();
        samples.push(rss);
        if as_json && elapsed >= next_print {
            next_print += sample_every;
            let stats = ctx.paddock.stats().await.ok();
            let mut sizes = serde_json::Map::new();
            for p in stats.iter().flat_map(|s| &s.pools) {
                sizes.insert(p.engine.as_str().into(), p.size.into());
            }
            report(
                &json!({
                    "scenario": "soak",
                    "kind": "sample",
                    "phase": name,
                    "t_s": round(elapsed.as_secs_f64()),
                    "executions": ctx.ledger.issued.load(Ordering::Relaxed),
                    "unexpected": ctx.counts.unexpected.load(Ordering::Relaxed),
                    "rss_bytes": rss,
                    "heap_in_use_bytes": heap().map(|h| h.0),
                    "fds": open_fds(),
                    "threads": status_field("Threads:"),
                    "in_flight": stats.as_ref().map(|s| s.in_flight),
                    "pool_sizes": sizes,
                }),
                true,
            );
        }
        let all_ran = ctx
            .counts
            .by_task
            .iter()
            .all(|c| c.load(Ordering::Relaxed) > 0);
        if elapsed >= length && (!until_all_ran || all_ran || elapsed >= length * 3) {
            break;
        }
    }
    ctx.stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    (started.elapsed(), samples)
}

/// Runs the soak; exit code 0 only when every pass condition holds.
pub(super) async fn soak(args: SoakArgs, as_json: bool) -> Result<i32, crate::run::UsageError> {
    let run_started = Instant::now();
    let fds_before_start = open_fds();
    let fd_targets_before = probe::fd_targets();
    let mut config = PaddockConfig::default();
    config.pool.min_idle = args.min_idle;
    config.pool.max_size = args.max_size;
    config.pool.max_waiting = args.max_waiting;
    config.pool.idle_timeout_ms = IDLE_TIMEOUT_MS;
    config
        .validate()
        .map_err(|e| crate::run::UsageError(e.to_string()))?;

    // The engines are started here, so that what is missing can be reported.
    let subprocess = match SubprocessEngine::with_defaults(
        &config.subprocess,
        config.limits.effective_defaults(),
    ) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("paddock bench: the subprocess engine cannot start: {e}");
            return Ok(1);
        }
    };
    let python = match subprocess
        .host_support()
        .interpreters
        .get(&Language::Python)
    {
        Some(Ok(_)) => Ok(()),
        Some(Err(why)) => Err(why.clone()),
        None => Err("no python runner is configured".to_string()),
    };
    let container =
        ContainerEngine::with_defaults(&config.container, config.limits.effective_defaults())
            .map_err(|e| e.message);
    let container_report = match &container {
        Ok(e) => json!({
            "runtime": e.runtime_info().kind.as_str(),
            "version": e.runtime_info().version,
            "warm": match e.agent() {
                Ok(_) => "yes".to_string(),
                Err(why) => format!("no: {why}"),
            },
        }),
        Err(why) => json!(format!("skipped: {why}")),
    };
    let mut engines = vec![EngineName::SUBPROCESS, EngineName::ISOLATE];
    let ledger = Arc::new(Ledger::default());
    let on_audit = ledger.clone();
    let mut builder = paddock::builder()
        .config(config)
        .without_subprocess()
        .engine(Arc::new(subprocess))
        .without_container()
        .default_engine(EngineName::SUBPROCESS)
        .audit(AuditConfig {
            ring_capacity: 1_000,
            ..AuditConfig::default()
        })
        .on_audit(move |entry| on_audit.audit(&entry.id))
        .streamer(StreamerConfig {
            max_streams: args.max_streams,
            linger: STREAM_LINGER,
            ..StreamerConfig::default()
        });
    if let Ok(engine) = container {
        builder = builder.engine(Arc::new(engine));
        engines.push(EngineName::CONTAINER);
    }
    let paddock = match builder.start() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    let mut tasks = mix(python.is_ok(), engines.contains(&EngineName::CONTAINER));
    if !args.only.is_empty() {
        if let Some(unknown) = args
            .only
            .iter()
            .find(|n| !tasks.iter().any(|t| t.name == n.as_str()))
        {
            let _ = paddock.shutdown(Duration::from_secs(10)).await;
            let names: Vec<&str> = tasks.iter().map(|t| t.name).collect();
            return Err(crate::run::UsageError(format!(
                "--tasks: `{unknown}` is not a task this host runs; the tasks are {}",
                names.join(", ")
            )));
        }
        tasks.retain(|t| args.only.iter().any(|n| n == t.name));
    }
    let ctx = Arc::new(Ctx {
        paddock: paddock.clone(),
        schedule: schedule(&tasks),
        counts: Counts::new(tasks.len()),
        tasks,
        next: AtomicUsize::new(0),
        session_engines: engines.clone(),
        next_session: AtomicUsize::new(0),
        ledger: ledger.clone(),
        stop: AtomicBool::new(false),
    });
    let settle_limit = Duration::from_millis(IDLE_TIMEOUT_MS) + Duration::from_secs(15);
    // Prewarmed pools first, so the warm-up starts from the configured sizes.
    let _ = settle(&paddock, args.min_idle, settle_limit).await;

    let (warmup, warmup_samples) = phase(
        &ctx,
        "warmup",
        args.warmup,
        true,
        args.callers,
        args.sample_every,
        as_json,
    )
    .await;
    let warmup_executions = ledger.issued.load(Ordering::Relaxed);
    let base = Snapshot::at_rest(&paddock, args.min_idle, settle_limit)
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;

    let (measured, samples) = phase(
        &ctx,
        "measure",
        args.duration,
        false,
        args.callers,
        args.sample_every,
        as_json,
    )
    .await;
    let measured_executions = ledger.issued.load(Ordering::Relaxed) - warmup_executions;

    let end = Snapshot::at_rest(&paddock, args.min_idle, settle_limit)
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    // Every audit entry of an answered execution is queued before its answer; a
    // query after the last answer is handled after all of them.
    let audit_stats = paddock
        .audit_statistics(&paddock_pool::Caller::Embedder)
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let unaudited = ledger.answered_without_audit();
    let _ = paddock.shutdown(Duration::from_secs(10)).await;
    // The handles go too, as an embedder's would; the callers have all returned.
    let Ok(Ctx { tasks, counts, .. }) = Arc::try_unwrap(ctx) else {
        return Err(crate::run::UsageError(
            "a caller still held the scheduler after the load stopped".into(),
        ));
    };
    drop(paddock);
    // Destroyed instances' processes are reaped in the background: wait for them.
    let mut procs_after = descendants();
    for _ in 0..50 {
        if procs_after.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        procs_after = descendants();
    }
    let fds_after_shutdown = steady_fds().await;
    // What is open now that was not before the start: named in the summary.
    let fds_left: Vec<String> = probe::fd_targets()
        .into_iter()
        .filter(|(fd, target)| fd_targets_before.get(fd) != Some(target))
        .map(|(fd, target)| format!("{fd} -> {target}"))
        .collect();
    // An engine's own directory goes when the last of its instances has (their
    // actors stop in the background, after the pools report them gone): wait too,
    // up to 15 s (a loaded machine took more than 5 s once in a while).
    let (mut dirs_after_shutdown, _) = engine_dirs();
    for _ in 0..150 {
        if dirs_after_shutdown == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        dirs_after_shutdown = engine_dirs().0;
    }
    // What stayed, by name, so that a failure says which engine left it.
    let dirs_left: serde_json::Map<String, serde_json::Value> = probe::engine_dir_listing()
        .into_iter()
        .map(|(name, inside)| (name, serde_json::json!(inside)))
        .collect();

    let issued = ledger.issued.load(Ordering::Relaxed);
    let answered = ledger.answered.load(Ordering::Relaxed);
    let audited = ledger.audited.load(Ordering::Relaxed);
    // An id is lost when it never got an answer (`answered` counts first answers).
    let lost = issued - answered;
    let duplicated = ledger.duplicate_answers.load(Ordering::Relaxed)
        + ledger.duplicate_audits.load(Ordering::Relaxed)
        + ledger.unmatched_audits.load(Ordering::Relaxed);
    let accepted = end.stats.accepted_total.unwrap_or_default();
    let refused = end.stats.refused_total.unwrap_or_default();

    let rss_max = samples.iter().copied().max().unwrap_or(end.rss);
    // The kernel updates the high-water mark lazily, so the samples can pass it.
    let rss_peak = (status_field("VmHWM:") * 1024)
        .max(rss_max)
        .max(end.rss)
        .max(warmup_samples.iter().copied().max().unwrap_or(0));
    let quarter = (samples.len() / 4).max(1);
    let rss_trend_pct = pct(
        median(samples.iter().take(quarter).copied().collect()),
        median(samples.iter().rev().take(quarter).copied().collect()),
    );
    let rss_growth_pct = pct(base.rss, end.rss);
    let counts = &counts;
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let unexpected = load(&counts.unexpected);
    let first_unexpected = counts
        .first_unexpected
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut by_task = serde_json::Map::new();
    let mut unexpected_by_task = serde_json::Map::new();
    for (i, t) in tasks.iter().enumerate() {
        by_task.insert(t.name.into(), load(&counts.by_task[i]).into());
        let u = load(&counts.unexpected_by_task[i]);
        if u > 0 {
            unexpected_by_task.insert(t.name.into(), u.into());
        }
    }

    let rss_ok = rss_growth_pct <= args.max_rss_growth_pct;
    let fds_ok = end.fds <= base.fds + FD_ALLOWANCE;
    let exactly_once_ok = lost == 0
        && duplicated == 0
        && audited == accepted
        && audit_stats.total == accepted
        && unaudited == refused;
    let pools_ok = end.stats.pools.len() == engines.len()
        && end.stats.pools.iter().all(|p| {
            (args.min_idle.min(p.max_size)..=p.max_size).contains(&p.size)
                && p.busy == 0
                && p.waiting == 0
                && !p.degraded
        });
    let unexpected_ok = unexpected == 0;
    // The same processes and engine directory entries as at the baseline (the pools
    // are at the same size), no zombie among them.
    let nothing_piled_up = end.procs.len() <= base.procs.len()
        && end.procs.iter().all(|(_, state)| *state != 'Z')
        && end.dir_entries <= base.dir_entries;
    let clean_shutdown = procs_after.is_empty()
        && dirs_after_shutdown == 0
        && fds_after_shutdown <= fds_before_start;
    let pass = rss_ok
        && fds_ok
        && exactly_once_ok
        && pools_ok
        && unexpected_ok
        && nothing_piled_up
        && clean_shutdown;

    let summary = merge([
        json!({
            "scenario": "soak",
            "kind": "summary",
            "duration_s": round(measured.as_secs_f64()),
            "warmup_s": round(warmup.as_secs_f64()),
            "elapsed_s": round(run_started.elapsed().as_secs_f64()),
            "callers": args.callers,
            "engines": engines.iter().map(|e| e.as_str()).collect::<Vec<_>>(),
            "container": container_report,
            "python": match &python {
                Ok(()) => "ran".to_string(),
                Err(why) => format!("skipped: {why}"),
            },
            "executions": issued,
            "executions_measured": measured_executions,
            "executions_per_s": round(measured_executions as f64 / measured.as_secs_f64()),
        }),
        json!({
            "ok": load(&counts.ok),
            "failed_as_expected": load(&counts.failed_as_expected),
            "timed_out": load(&counts.timed_out),
            "cancelled": load(&counts.cancelled),
            "truncated": load(&counts.truncated),
            "rejected": load(&counts.rejected),
            "sessions": load(&counts.sessions),
            "by_task": by_task,
            "unexpected": {
                "count": unexpected,
                "by_task": unexpected_by_task,
                "first": first_unexpected,
            },
        }),
        json!({
            "lost": lost,
            "duplicated": duplicated,
            "accepted": accepted,
            "refused": refused,
            "answered_without_audit_entry": unaudited,
            "audit_entries": audited,
            "audit_log_total": audit_stats.total,
        }),
        json!({
            "rss_baseline_bytes": base.rss,
            "rss_end_bytes": end.rss,
            "rss_max_after_warmup_bytes": rss_max,
            "rss_peak_bytes": rss_peak,
            "rss_growth_pct": round(rss_growth_pct),
            "rss_max_growth_pct": round(pct(base.rss, rss_max)),
            "rss_trend_pct": round(rss_trend_pct),
            "heap_in_use_baseline_bytes": base.heap.map(|h| h.0),
            "heap_in_use_end_bytes": end.heap.map(|h| h.0),
            "heap_in_use_growth_pct": base.heap.zip(end.heap).map(|(b, e)| round(pct(b.0, e.0))),
            "heap_free_baseline_bytes": base.heap.map(|h| h.1),
            "heap_free_end_bytes": end.heap.map(|h| h.1),
            "fds_before_start": fds_before_start,
            "fds_baseline": base.fds,
            "fds_end": end.fds,
            "fds_after_shutdown": fds_after_shutdown,
            "fds_left_after_shutdown": fds_left,
            "threads_baseline": base.threads,
            "threads_end": end.threads,
            "engine_dir_entries_baseline": base.dir_entries,
            "engine_dir_entries_end": end.dir_entries,
            "engine_dirs_after_shutdown": dirs_after_shutdown,
            "engine_dirs_left_after_shutdown": dirs_left,
        }),
        json!({
            "descendants_baseline": describe(&base.procs),
            "descendants_end": describe(&end.procs),
            "descendants_after_shutdown": describe(&procs_after),
            "pools_baseline": pools_json(&base.stats, args.min_idle),
            "pools": pools_json(&end.stats, args.min_idle),
        }),
        json!({
            "pass": {
                "rss_growth": rss_ok,
                "rss_growth_max_pct": args.max_rss_growth_pct,
                "fds_stable": fds_ok,
                "fd_allowance": FD_ALLOWANCE,
                "exactly_once": exactly_once_ok,
                "pools_at_configured_size": pools_ok,
                "no_unexpected_outcome": unexpected_ok,
                "no_processes_or_workdirs_piled_up": nothing_piled_up,
                "nothing_left_after_shutdown": clean_shutdown,
                "overall": pass,
            },
        }),
    ]);
    report(&summary, as_json);
    Ok(if pass { 0 } else { 1 })
}

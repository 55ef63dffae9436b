//! The `warm` scenario: Python `Code` on a warm worker against a cold interpreter
//! start in the same run, and the throughput of a warm pool of two.
//!
//! The cold baseline is `<python> -c 'print(1)'` spawned with `std::process::Command`,
//! where `<python>` is the very binary the engine runs: the engine resolves a launcher
//! script on `PATH` (pyenv's shim) to the interpreter behind it, and the benchmark
//! prints that path. Node has no warm runner yet; its line says so.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, DiscardSink, Engine, ExecRequest, Language, PaddockConfig, Program, Sandbox,
    SandboxSpec, SubprocessConfig,
};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_pool::Paddock;
use serde_json::json;

use super::{report, round, round3, summarize};

const SNIPPET: &str = "print(1)";

fn cold(python: &std::path::Path) -> Duration {
    let start = Instant::now();
    let out = std::process::Command::new(python)
        .args(["-c", SNIPPET])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("spawning python");
    let took = start.elapsed();
    assert!(out.status.success() && out.stdout == b"1\n", "{out:?}");
    took
}

async fn warm_once(sandbox: &dyn Sandbox) -> Duration {
    let start = Instant::now();
    let r = sandbox
        .exec(
            ExecRequest::new(Program::code(Language::Python, SNIPPET)),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .expect("warm exec");
    let took = start.elapsed();
    assert!(r.is_success() && r.stdout == "1\n", "{r:?}");
    took
}

pub(super) async fn warm(
    iterations: usize,
    executions: usize,
    callers: usize,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    let mut config = SubprocessConfig::default();
    config.warm.enabled = true;
    let engine = match SubprocessEngine::new(&config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    let python = match engine.host_support().interpreters.get(&Language::Python) {
        Some(Ok(p)) => p.clone(),
        _ => {
            eprintln!("paddock bench: no python interpreter on this host");
            return Ok(1);
        }
    };
    let sandbox: Arc<dyn Sandbox> = match engine.create(&SandboxSpec::default()).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    // Interleaved, so that drift on a shared machine hits both series alike.
    for _ in 0..(iterations / 10).max(3) {
        cold(&python);
        warm_once(&*sandbox).await;
    }
    let (mut c, mut w) = (
        Vec::with_capacity(iterations),
        Vec::with_capacity(iterations),
    );
    for _ in 0..iterations {
        c.push(cold(&python));
        w.push(warm_once(&*sandbox).await);
    }
    let (c, w) = (summarize(c), summarize(w));
    let _ = sandbox.destroy().await;
    report(
        &json!({
            "scenario": "warm",
            "language": "python",
            "interpreter": python.display().to_string(),
            "snippet": SNIPPET,
            "iterations": iterations,
            "warm_p50_us": round(w.p50),
            "warm_p99_us": round(w.p99),
            "cold_p50_us": round(c.p50),
            "cold_p99_us": round(c.p99),
            "ratio_p50": round3(w.p50 / c.p50.max(0.001)),
            "speedup_p50": round(c.p50 / w.p50.max(0.001)),
        }),
        as_json,
    );
    report(
        &json!({
            "scenario": "warm",
            "language": "javascript",
            "skipped": "there is no warm node runner yet; `subprocess.warm.languages` accepts python only",
        }),
        as_json,
    );

    // Throughput of a warm pool of two through the scheduler.
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = true;
    config.pool.max_size = 2;
    config.pool.min_idle = 2;
    config.pool.max_waiting = callers.max(1) * 2;
    let paddock = match Paddock::builder().config(config).without_isolate().start() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    // Let the pool start both workers' interpreters.
    for _ in 0..20 {
        let _ = paddock
            .execute(ExecRequest::new(Program::code(Language::Python, SNIPPET)))
            .await;
    }
    let left = Arc::new(AtomicUsize::new(executions));
    let failures = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers.max(1) {
        let (paddock, left, failures) = (paddock.clone(), left.clone(), failures.clone());
        tasks.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                let r = paddock
                    .execute(ExecRequest::new(Program::code(Language::Python, SNIPPET)))
                    .await;
                if !matches!(&r, Ok(r) if r.is_success() && r.stdout == "1\n") {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed();
    let stats = paddock.stats().await.ok();
    let _ = paddock.shutdown(Duration::from_secs(10)).await;
    report(
        &json!({
            "scenario": "warm_throughput",
            "language": "python",
            "pool_size": 2,
            "callers": callers,
            "executions": executions,
            "failures": failures.load(Ordering::Relaxed),
            "seconds": round3(elapsed.as_secs_f64()),
            "executions_per_s": round(executions as f64 / elapsed.as_secs_f64()),
            "accepted_total": stats.map(|s| s.accepted_total),
        }),
        as_json,
    );
    Ok(0)
}

//! The `warm` scenario: `Code` on a warm worker against a cold interpreter start in
//! the same run, for Python and Node, and the throughput of a warm Python pool of two.
//!
//! The cold baseline is `<python> -c 'print(1)'` (`<node> -e 'console.log(1)'`)
//! spawned with `std::process::Command`, where the interpreter is the very binary the
//! engine runs: the engine resolves a launcher script on `PATH` (pyenv's shim) to the
//! interpreter behind it, and the benchmark prints that path.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{
    CancelToken, DiscardSink, Engine, ExecRequest, Language, Program, Sandbox, SandboxSpec,
};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::SubprocessConfig;
use serde_json::json;

use super::{report, round, round3, summarize};

const SNIPPET: &str = "print(1)";

/// The snippet and the interpreter's flag for running source, per language.
fn snippet(language: Language) -> (&'static str, &'static str) {
    match language {
        Language::Javascript => ("console.log(1)", "-e"),
        _ => (SNIPPET, "-c"),
    }
}

fn cold(interpreter: &std::path::Path, language: Language) -> Duration {
    let (source, flag) = snippet(language);
    let start = Instant::now();
    let out = std::process::Command::new(interpreter)
        .args([flag, source])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("spawning the interpreter");
    let took = start.elapsed();
    assert!(out.status.success() && out.stdout == b"1\n", "{out:?}");
    took
}

async fn warm_once(sandbox: &dyn Sandbox, language: Language) -> Duration {
    let start = Instant::now();
    let r = sandbox
        .exec(
            ExecRequest::new(Program::code(language, snippet(language).0)),
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
    let sandbox: Arc<dyn Sandbox> = match engine.create(&SandboxSpec::default()).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    for language in [Language::Python, Language::Javascript] {
        let interpreter = match engine.host_support().interpreters.get(&language) {
            Some(Ok(p)) => p.path().to_path_buf(),
            _ => {
                report(
                    &json!({"scenario": "warm", "language": language.as_str(), "skipped": "no interpreter on this host"}),
                    as_json,
                );
                continue;
            }
        };
        // Interleaved, so that drift on a shared machine hits both series alike.
        for _ in 0..(iterations / 10).max(3) {
            cold(&interpreter, language);
            warm_once(&*sandbox, language).await;
        }
        let (mut c, mut w) = (
            Vec::with_capacity(iterations),
            Vec::with_capacity(iterations),
        );
        for _ in 0..iterations {
            c.push(cold(&interpreter, language));
            w.push(warm_once(&*sandbox, language).await);
        }
        let (c, w) = (summarize(c), summarize(w));
        report(
            &json!({
                "scenario": "warm",
                "language": language.as_str(),
                "interpreter": interpreter.display().to_string(),
                "snippet": snippet(language).0,
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
    }
    let _ = sandbox.destroy().await;

    // Throughput of a warm pool of two through the scheduler.
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = true;
    config.pool.max_size = 2;
    config.pool.min_idle = 2;
    config.pool.max_waiting = callers.max(1) * 2;
    let paddock = match paddock::builder().config(config).without_isolate().start() {
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
            "accepted_total": stats.map(|s| s.accepted_total.unwrap_or_default()),
        }),
        as_json,
    );
    Ok(0)
}

//! The `isolate` scenario: JavaScript in the QuickJS isolate engine against node's
//! `vm.runInNewContext` in a warm node process and a fresh `isolated-vm` isolate per
//! operation, run side by side.
//!
//! Three series, each with p50 and p99:
//! - **pooled** `1+1` through a pooled isolate sandbox. The engine builds each
//!   execution's fresh context after answering the previous one, while the isolate is
//!   idle, so the series paces requests `gap_us` apart (an agent's calls arrive with
//!   gaps). `back_to_back` reports the same without gaps, where every request also
//!   waits for the context that the previous one made necessary.
//! - **fresh** `1+1` in a brand-new runtime and context each time, on the calling
//!   thread (`IsolateEngine::run_blocking`), and `fresh_sandbox`: create a sandbox
//!   (thread, runtime, context), run, destroy.
//! - **loop**: a 10,000-iteration loop in a pooled isolate, paced like `pooled`; and
//!   the interrupt handler's cost: the same loop in a bare QuickJS runtime without a
//!   handler and with one that does what the engine's does (an atomic load and a clock
//!   read), interleaved.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, DiscardSink, Engine, ExecRequest, Language, Program, Sandbox, SandboxSpec,
};
use paddock_engines::isolate::IsolateEngine;
use paddock_engines::IsolateConfig;
use serde_json::{json, Value};

use super::peers::{self, PeerStats};
use super::{report, round, round3, summarize, Summary};

const ONE_PLUS_ONE: &str = "1+1";
const LOOP: &str = "let s = 0; for (let i = 0; i < 10000; i++) s += i; s";

fn request(source: &str) -> ExecRequest {
    ExecRequest::new(Program::code(Language::Javascript, source))
}

async fn pooled_once(sandbox: &dyn Sandbox, source: &str, want: &Value) -> Duration {
    let start = Instant::now();
    let r = sandbox
        .exec(request(source), &DiscardSink, CancelToken::new())
        .await
        .expect("isolate exec");
    let took = start.elapsed();
    assert!(r.is_success() && r.value.as_ref() == Some(want), "{r:?}");
    took
}

/// `n` executions of `source`, each started `gap` after the previous answer.
async fn pooled(
    sandbox: &dyn Sandbox,
    source: &str,
    want: &Value,
    n: usize,
    gap: Duration,
) -> Summary {
    for _ in 0..n / 10 {
        pooled_once(sandbox, source, want).await;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
        samples.push(pooled_once(sandbox, source, want).await);
    }
    summarize(samples)
}

fn fresh(engine: &IsolateEngine, n: usize) -> Summary {
    let once = || {
        let start = Instant::now();
        let r = engine
            .run_blocking(request(ONE_PLUS_ONE))
            .expect("run_blocking");
        let took = start.elapsed();
        assert_eq!(r.value, Some(json!(2)), "{r:?}");
        took
    };
    for _ in 0..n / 10 {
        once();
    }
    summarize((0..n).map(|_| once()).collect())
}

async fn fresh_sandbox(engine: &IsolateEngine, n: usize) -> Summary {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let start = Instant::now();
        let sandbox = engine
            .create(&SandboxSpec::default())
            .await
            .expect("isolate sandbox");
        let r = sandbox
            .exec(request(ONE_PLUS_ONE), &DiscardSink, CancelToken::new())
            .await
            .expect("isolate exec");
        sandbox.destroy().await.expect("destroy");
        let took = start.elapsed();
        assert_eq!(r.value, Some(json!(2)), "{r:?}");
        if i >= n / 10 {
            samples.push(took);
        }
    }
    summarize(samples)
}

/// The loop in a bare runtime without an interrupt handler, and with one doing what
/// the engine's does, interleaved: (without, with).
fn interrupt_overhead(n: usize) -> Result<(Summary, Summary), String> {
    use std::sync::atomic::{AtomicU8, Ordering};

    use rquickjs::{Context, Runtime};
    let setup = |handler: bool| -> Result<Context, String> {
        let rt = Runtime::new().map_err(|e| e.to_string())?;
        if handler {
            let stop = Arc::new(AtomicU8::new(0));
            let deadline = Instant::now() + Duration::from_secs(3600);
            rt.set_interrupt_handler(Some(Box::new(move || {
                stop.load(Ordering::Relaxed) != 0 || Instant::now() >= deadline
            })));
        }
        Context::full(&rt).map_err(|e| e.to_string())
    };
    let (plain, watched) = (setup(false)?, setup(true)?);
    // A block, so that `let s` can be declared again in the same live context.
    let source = format!("{{ {LOOP} }}");
    let once = |ctx: &Context| -> Result<Duration, String> {
        let start = Instant::now();
        let v: f64 = ctx
            .with(|c| c.eval::<f64, _>(source.as_str()))
            .map_err(|e| e.to_string())?;
        let took = start.elapsed();
        if v != 49_995_000.0 {
            return Err(format!("the loop gave {v}"));
        }
        Ok(took)
    };
    for _ in 0..n / 10 {
        once(&plain)?;
        once(&watched)?;
    }
    let (mut without, mut with) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        without.push(once(&plain)?);
        with.push(once(&watched)?);
    }
    Ok((summarize(without), summarize(with)))
}

/// A peer's figures, or the reason it could not run.
async fn peer(
    f: fn(&str, usize) -> Result<PeerStats, String>,
    scenario: &'static str,
    n: Option<usize>,
) -> Result<PeerStats, String> {
    let Some(n) = n else {
        return Err("skipped (--no-peers)".into());
    };
    tokio::task::spawn_blocking(move || f(scenario, n))
        .await
        .unwrap_or_else(|e| Err(format!("the peer task failed: {e}")))
}

/// Adds `{prefix}_p50_us`, `{prefix}_p99_us`, the speed-up of `ours_p50` over the peer,
/// and the peer's report, or `{prefix}_error`.
fn add_peer(
    out: &mut serde_json::Map<String, Value>,
    prefix: &str,
    ours_p50: f64,
    peer: &Result<PeerStats, String>,
) {
    match peer {
        Ok(p) => {
            out.insert(format!("{prefix}_p50_us"), round(p.p50_us).into());
            out.insert(format!("{prefix}_p99_us"), round(p.p99_us).into());
            out.insert(
                format!("speedup_vs_{prefix}"),
                round(p.p50_us / ours_p50.max(0.001)).into(),
            );
            out.insert(format!("{prefix}_detail"), p.detail.clone());
        }
        Err(e) => {
            out.insert(format!("{prefix}_error"), e.clone().into());
        }
    }
}

pub(super) async fn isolate(
    config: IsolateConfig,
    iterations: usize,
    peer_iterations: Option<usize>,
    gap: Duration,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    if let Err(e) = config.validate() {
        return Err(crate::run::UsageError(e.to_string()));
    }
    let engine = match IsolateEngine::new(&config) {
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
    let two = json!(2);
    let sum = json!(49_995_000);

    // Pooled 1+1.
    let paced = pooled(&*sandbox, ONE_PLUS_ONE, &two, iterations, gap).await;
    let back_to_back = pooled(&*sandbox, ONE_PLUS_ONE, &two, iterations, Duration::ZERO).await;
    let vm = peer(peers::node_vm, "one_plus_one", peer_iterations).await;
    let ivm = peer(peers::isolated_vm, "one_plus_one", peer_iterations).await;
    let mut out = serde_json::Map::new();
    out.insert("scenario".into(), "isolate_pooled".into());
    out.insert("source".into(), ONE_PLUS_ONE.into());
    out.insert("iterations".into(), iterations.into());
    out.insert("gap_us".into(), (gap.as_micros() as u64).into());
    out.insert("idle_spin_us".into(), config.idle_spin_us.into());
    out.insert("reply_spin_us".into(), config.reply_spin_us.into());
    out.insert("p50_us".into(), round(paced.p50).into());
    out.insert("p99_us".into(), round(paced.p99).into());
    out.insert("back_to_back_p50_us".into(), round(back_to_back.p50).into());
    out.insert("back_to_back_p99_us".into(), round(back_to_back.p99).into());
    add_peer(&mut out, "node_vm", paced.p50, &vm);
    add_peer(&mut out, "isolated_vm", paced.p50, &ivm);
    report(&Value::Object(out), as_json);

    // Fresh runtime per operation.
    let fresh_engine = engine.clone();
    let n = iterations;
    let fresh_runtime = tokio::task::spawn_blocking(move || fresh(&fresh_engine, n))
        .await
        .map_err(|e| crate::run::UsageError(format!("the fresh-runtime series failed: {e}")))?;
    let fresh_box = fresh_sandbox(&engine, (iterations / 4).max(50)).await;
    let mut out = serde_json::Map::new();
    out.insert("scenario".into(), "isolate_fresh".into());
    out.insert("source".into(), ONE_PLUS_ONE.into());
    out.insert("iterations".into(), iterations.into());
    out.insert("p50_us".into(), round(fresh_runtime.p50).into());
    out.insert("p99_us".into(), round(fresh_runtime.p99).into());
    out.insert("fresh_sandbox_p50_us".into(), round(fresh_box.p50).into());
    out.insert("fresh_sandbox_p99_us".into(), round(fresh_box.p99).into());
    add_peer(&mut out, "node_vm", fresh_runtime.p50, &vm);
    add_peer(&mut out, "isolated_vm", fresh_runtime.p50, &ivm);
    report(&Value::Object(out), as_json);

    // A 10,000-iteration loop.
    let looped = pooled(&*sandbox, LOOP, &sum, iterations, gap).await;
    let vm_loop = peer(peers::node_vm, "loop", peer_iterations).await;
    let ivm_loop = peer(peers::isolated_vm, "loop", peer_iterations).await;
    let mut out = serde_json::Map::new();
    out.insert("scenario".into(), "isolate_loop".into());
    out.insert("source".into(), LOOP.into());
    out.insert("iterations".into(), iterations.into());
    out.insert("gap_us".into(), (gap.as_micros() as u64).into());
    out.insert("p50_us".into(), round(looped.p50).into());
    out.insert("p99_us".into(), round(looped.p99).into());
    match tokio::task::spawn_blocking(move || interrupt_overhead(n))
        .await
        .unwrap_or_else(|e| Err(format!("the task failed: {e}")))
    {
        Ok((without, with)) => {
            out.insert("bare_loop_p50_us".into(), round(without.p50).into());
            out.insert(
                "bare_loop_with_handler_p50_us".into(),
                round(with.p50).into(),
            );
            out.insert(
                "interrupt_handler_overhead".into(),
                round3(with.p50 / without.p50.max(0.001) - 1.0).into(),
            );
        }
        Err(e) => {
            out.insert("bare_loop_error".into(), e.into());
        }
    }
    add_peer(&mut out, "node_vm", looped.p50, &vm_loop);
    add_peer(&mut out, "isolated_vm", looped.p50, &ivm_loop);
    report(&Value::Object(out), as_json);

    let _ = sandbox.destroy().await;
    Ok(0)
}

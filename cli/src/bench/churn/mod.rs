//! `paddock bench churn`: sandboxes opened, given one command and destroyed, over
//! and over, per engine.
//!
//! - `run: "concurrent"`: `--clients` clients (20 by default), each in a loop of
//!   open → first command (`true`; on the isolate engine the JavaScript snippet `0`)
//!   → destroy, for `--duration` (`--first python`: the first command is the
//!   Python snippet `print(1)` instead of `true`). The first fifth of it (at most
//!   2 s) is warm-up: the rate counts the cycles that end after it, the latencies
//!   those that start after it. Reported: sandboxes per second, p50/p99/max of each step and of
//!   open and first command together, the pool's counts sampled every 100 ms, and
//!   the CPU used (see `cpu.rs`) as cores and per sandbox.
//! - `run: "serial"`: one client, the same loop, for `--serial-duration`, once the
//!   pool holds its `min_idle` ready again: what a lone client meets, while the pool
//!   replaces the instance each cycle used.
//! - `run: "serial_quiet"`: the same, but each cycle starts only once the pool is
//!   settled (its `min_idle` ready, nothing being created or destroyed): a ready
//!   instance's open, with nothing else running (no rate: the waits are not timed).
//! - `run: "serial_unpooled"`: the same on a scheduler whose pool keeps nothing
//!   ready (`pool.min_idle = 0`), so that every open creates its instance: the
//!   engine's serial create, through the scheduler.
//!
//! The clients drive the `Paddock` facade in this process (`--via facade`, the
//! default: the scheduler's own cost, without a wire), or its HTTP API served from
//! this process on a loopback port (`--via http`: what `paddock serve` answers, as
//! an HTTP client sees it). Each engine runs on a scheduler of its own, with only
//! that engine, whose pools grow to `--max-size` (64 by default), with the
//! defaults or the configuration file `--config` names.
//!
//! `--breakdown N` adds the container engine's own create and destroy, timed
//! without the scheduler (see `breakdown.rs`).

mod breakdown;
mod client;
mod cpu;

use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::EngineName;
use paddock_pool::Paddock;
use serde_json::json;

use crate::run::UsageError;
use client::Client;
pub(crate) use client::{First, Via};
use cpu::Cpu;

/// The settings of `paddock bench churn`.
#[derive(Debug, Clone)]
pub(crate) struct ChurnArgs {
    /// The scheduler's configuration, before the settings below.
    pub(crate) config: PaddockConfig,
    pub(crate) duration: Duration,
    pub(crate) clients: usize,
    /// `None`: no serial runs.
    pub(crate) serial_duration: Option<Duration>,
    pub(crate) engines: Vec<EngineName>,
    pub(crate) via: Via,
    /// Each cycle's first command.
    pub(crate) first: First,
    pub(crate) max_size: usize,
    pub(crate) min_idle: Option<usize>,
    pub(crate) breakdown: usize,
}

/// One open → first command → destroy that went through.
#[derive(Debug, Clone, Copy)]
struct Cycle {
    started: Instant,
    ended: Instant,
    open: Duration,
    first: Duration,
    destroy: Duration,
}

/// What one client saw.
#[derive(Debug, Default)]
struct Seen {
    cycles: Vec<Cycle>,
    /// Failures of open, first command and destroy.
    failures: [u64; 3],
    first_failure: Option<String>,
    opened: u64,
    destroyed: u64,
}

/// Before each cycle, wait for this pool to settle (see `pool_ready`).
type Settle = Option<(Paddock, EngineName, usize)>;

/// One client's loop until `until`.
async fn client_loop(mut client: Client, until: Instant, settle: Settle) -> Seen {
    let mut seen = Seen::default();
    while Instant::now() < until {
        if let Some((paddock, engine, target)) = &settle {
            pool_ready(paddock, engine, *target).await;
            if Instant::now() >= until {
                break;
            }
        }
        let started = Instant::now();
        let sandbox = match client.open().await {
            Ok(s) => s,
            Err(f) => {
                seen.failures[0] += 1;
                seen.first_failure
                    .get_or_insert(format!("open: {}", f.message));
                let wait = f.retry_after_ms.unwrap_or(10).min(1000);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                continue;
            }
        };
        seen.opened += 1;
        let open = started.elapsed();
        let t = Instant::now();
        let first = client.first(&sandbox).await;
        let first_took = t.elapsed();
        let t = Instant::now();
        let destroyed = client.destroy(sandbox).await;
        let destroy = t.elapsed();
        match &destroyed {
            Ok(()) => seen.destroyed += 1,
            Err(f) => {
                seen.failures[2] += 1;
                seen.first_failure
                    .get_or_insert(format!("destroy: {}", f.message));
            }
        }
        match first {
            Ok(()) if destroyed.is_ok() => seen.cycles.push(Cycle {
                started,
                ended: Instant::now(),
                open,
                first: first_took,
                destroy,
            }),
            Ok(()) => {}
            Err(f) => {
                seen.failures[1] += 1;
                seen.first_failure
                    .get_or_insert(format!("first: {}", f.message));
            }
        }
    }
    seen
}

/// The engine's default pool (network `none`, the default disk) in `stats`.
fn pool_of<'a>(
    stats: &'a paddock_pool::Stats,
    engine: &EngineName,
) -> Option<&'a paddock_pool::PoolStats> {
    stats
        .pools
        .iter()
        .find(|p| &p.engine == engine && p.network == "none" && p.disk_bytes.is_none())
}

/// Waits (at most 30 s) until the engine's pool holds `target` ready instances and
/// creates and destroys none; whether it got there.
async fn pool_ready(paddock: &Paddock, engine: &EngineName, target: usize) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if let Ok(stats) = paddock.stats().await {
            match pool_of(&stats, engine) {
                Some(p)
                    if p.idle >= target.min(p.max_size) && p.creating == 0 && p.destroying == 0 =>
                {
                    return true
                }
                None if target == 0 => return true,
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The pool's counts, sampled every 100 ms while a run is measured.
#[derive(Debug, Default)]
struct PoolSamples {
    n: u64,
    idle: u64,
    idle_zero: u64,
    waiting: u64,
    creating: u64,
    busy: u64,
}

async fn sample_pool(paddock: Paddock, engine: EngineName, until: Instant) -> PoolSamples {
    let mut s = PoolSamples::default();
    while Instant::now() < until {
        if let Ok(stats) = paddock.stats().await {
            if let Some(p) = pool_of(&stats, &engine) {
                s.n += 1;
                s.idle += p.idle as u64;
                s.idle_zero += u64::from(p.idle == 0);
                s.waiting += p.waiting as u64;
                s.creating += p.creating as u64;
                s.busy += p.busy as u64;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s
}

/// p50, p99 and max of `v` in ms, rounded, and how many.
fn spread(mut v: Vec<Duration>) -> serde_json::Value {
    if v.is_empty() {
        return serde_json::Value::Null;
    }
    v.sort();
    let ms = |d: Duration| super::round3(d.as_secs_f64() * 1e3);
    let at = |q: f64| ms(v[((v.len() as f64 - 1.0) * q).round() as usize]);
    json!({
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": ms(*v.last().unwrap()),
        "n": v.len(),
    })
}

/// A scheduler with `engine` only, its pools up to `max_size`, keeping `min_idle`
/// ready (default: the configuration's), and its HTTP API when `via` asks for it.
async fn start(
    engine: &EngineName,
    args: &ChurnArgs,
    min_idle: Option<usize>,
) -> Result<(Paddock, Option<paddock_pool::http::HttpServerHandle>), UsageError> {
    let mut config = args.config.clone();
    config.pool.max_size = args.max_size;
    if let Some(n) = min_idle {
        config.pool.min_idle = n.min(args.max_size);
    }
    config.server.listen = "127.0.0.1:0".into();
    // The clients do not authenticate.
    config.server.api_keys.clear();
    let server_config = config.server.clone();
    let mut builder = paddock::builder().config(config);
    for other in [
        EngineName::SUBPROCESS,
        EngineName::ISOLATE,
        EngineName::CONTAINER,
    ] {
        if other != *engine {
            builder = builder.without(other);
        }
    }
    let paddock = builder
        .start()
        .map_err(|e| UsageError(format!("paddock did not start: {e}")))?;
    let server = match args.via {
        Via::Http => Some(
            paddock_pool::http::start(paddock.clone(), server_config)
                .map_err(|e| UsageError(format!("the HTTP API did not start: {e}")))?,
        ),
        Via::Facade => None,
    };
    Ok((paddock, server))
}

/// One measured run of `clients` clients for `duration`: its report line, and
/// whether every sandbox opened was destroyed without a failure.
async fn run(
    paddock: &Paddock,
    server: Option<std::net::SocketAddr>,
    engine: &EngineName,
    kind: &str,
    clients: usize,
    duration: Duration,
    args: &ChurnArgs,
) -> Result<(serde_json::Value, bool), UsageError> {
    let min_idle = paddock.max_pool_size().min(if kind == "serial_unpooled" {
        0
    } else {
        args.min_idle.unwrap_or(args.config.pool.min_idle)
    });
    let ready = pool_ready(paddock, engine, min_idle).await;
    let mut connected = Vec::with_capacity(clients);
    for _ in 0..clients {
        connected.push(
            Client::connect(args.via, paddock, server, engine, args.first)
                .await
                .map_err(UsageError)?,
        );
    }
    let before_stats = paddock.stats().await.ok();
    let t0 = Instant::now();
    let warm = (duration / 5).min(Duration::from_secs(2));
    let until = t0 + duration;
    let settle = (kind == "serial_quiet").then(|| (paddock.clone(), engine.clone(), min_idle));
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|c| tokio::spawn(client_loop(c, until, settle.clone())))
        .collect();
    tokio::time::sleep_until((t0 + warm).into()).await;
    let warm_end = Instant::now();
    let cpu_before = Cpu::now();
    let pool_before = paddock.stats().await.ok();
    let sampler = tokio::spawn(sample_pool(paddock.clone(), engine.clone(), until));
    tokio::time::sleep_until(until.into()).await;
    let window = warm_end.elapsed();
    let cpu_after = Cpu::now();
    let pool_after = paddock.stats().await.ok();
    let mut seen = Seen::default();
    for t in tasks {
        let s = t
            .await
            .map_err(|e| UsageError(format!("a client failed: {e}")))?;
        seen.cycles.extend(s.cycles);
        for (a, b) in seen.failures.iter_mut().zip(s.failures) {
            *a += b;
        }
        if seen.first_failure.is_none() {
            seen.first_failure = s.first_failure;
        }
        seen.opened += s.opened;
        seen.destroyed += s.destroyed;
    }
    let samples = sampler.await.unwrap_or_default();
    // Every session is gone once the clients are: none may be left open.
    let left_open = paddock
        .stats()
        .await
        .map(|s| s.sandboxes)
        .unwrap_or(usize::MAX);
    let in_window = seen
        .cycles
        .iter()
        .filter(|c| c.ended >= warm_end && c.ended <= until)
        .count();
    let measured: Vec<&Cycle> = seen
        .cycles
        .iter()
        .filter(|c| c.started >= warm_end)
        .collect();
    let step = |f: fn(&Cycle) -> Duration| spread(measured.iter().map(|c| f(c)).collect());
    let pool_delta = |f: fn(&paddock_pool::PoolStats) -> u64| {
        let of = |s: &Option<paddock_pool::Stats>| {
            s.as_ref().and_then(|s| pool_of(s, engine)).map_or(0, f)
        };
        of(&pool_after).saturating_sub(of(&pool_before))
    };
    let n = samples.n.max(1) as f64;
    let avg = |v: u64| super::round(v as f64 / n);
    let rate = in_window as f64 / window.as_secs_f64();
    let pool = before_stats.as_ref().and_then(|s| pool_of(s, engine));
    let line = json!({
        "scenario": "churn",
        "engine": engine.as_str(),
        "run": kind,
        "via": args.via.as_str(),
        "first": args.first.name(),
        "clients": clients,
        "duration_s": super::round3(duration.as_secs_f64()),
        "warmup_s": super::round3(warm.as_secs_f64()),
        "rate_per_s": (kind != "serial_quiet").then(|| super::round(rate)),
        "cycles": in_window,
        "open": step(|c| c.open),
        "first_command": step(|c| c.first),
        "destroy": step(|c| c.destroy),
        "open_and_first": step(|c| c.open + c.first),
        "cycle": step(|c| c.open + c.first + c.destroy),
        "opened": seen.opened,
        "destroyed": seen.destroyed,
        "left_open": left_open,
        "failures": {
            "open": seen.failures[0],
            "first_command": seen.failures[1],
            "destroy": seen.failures[2],
        },
        "first_failure": seen.first_failure,
        "pool": {
            "max_size": pool.map(|p| p.max_size),
            "min_idle": min_idle,
            "ready_at_start": ready,
            "created": pool_delta(|p| p.created_total),
            "retired": pool_delta(|p| p.retired_total),
            "idle_mean": avg(samples.idle),
            "idle_zero_share": super::round3(samples.idle_zero as f64 / n),
            "creating_mean": avg(samples.creating),
            "waiting_mean": avg(samples.waiting),
            "busy_mean": avg(samples.busy),
        },
        "cpu": cpu_after.since(&cpu_before, window, in_window),
    });
    let ok = seen.failures == [0, 0, 0]
        && seen.opened == seen.destroyed
        && left_open == 0
        && !measured.is_empty();
    Ok((line, ok))
}

/// The concurrent and serial runs of one engine; whether they all went through.
async fn engine_runs(
    engine: &EngineName,
    args: &ChurnArgs,
    as_json: bool,
) -> Result<bool, UsageError> {
    let (paddock, server) = start(engine, args, args.min_idle).await?;
    if !paddock.engines().contains(engine) {
        let why = paddock
            .unavailable_engines()
            .iter()
            .find(|(n, _)| n == engine)
            .map_or_else(
                || "the engine does not run here".to_string(),
                |(_, w)| w.clone(),
            );
        super::report(
            &json!({"scenario": "churn", "engine": engine.as_str(), "skipped": why}),
            as_json,
        );
        if let Some(s) = server {
            s.stop().await;
        }
        let _ = paddock.shutdown(Duration::from_secs(10)).await;
        return Ok(true);
    }
    let addr = server.as_ref().map(|s| s.local_addr());
    let mut ok = true;
    let mut runs = vec![("concurrent", args.clients, args.duration)];
    if let Some(d) = args.serial_duration {
        runs.push(("serial", 1, d));
        runs.push(("serial_quiet", 1, d));
    }
    for (kind, clients, duration) in runs {
        let (line, fine) = run(&paddock, addr, engine, kind, clients, duration, args).await?;
        super::report(&line, as_json);
        ok &= fine;
    }
    if let Some(s) = server {
        s.stop().await;
    }
    let _ = paddock.shutdown(Duration::from_secs(30)).await;
    if let Some(d) = args.serial_duration {
        let (paddock, server) = start(engine, args, Some(0)).await?;
        let addr = server.as_ref().map(|s| s.local_addr());
        let (line, fine) = run(&paddock, addr, engine, "serial_unpooled", 1, d, args).await?;
        super::report(&line, as_json);
        ok &= fine;
        if let Some(s) = server {
            s.stop().await;
        }
        let _ = paddock.shutdown(Duration::from_secs(30)).await;
    }
    Ok(ok)
}

/// Runs the scenario: each engine's runs, then the breakdown when asked for.
pub(crate) async fn churn(args: ChurnArgs, as_json: bool) -> Result<i32, UsageError> {
    let mut ok = true;
    for engine in &args.engines {
        ok &= engine_runs(engine, &args, as_json).await?;
    }
    if args.breakdown > 0 {
        ok &= breakdown::breakdown(&args.config.container, args.breakdown, as_json).await?;
    }
    Ok(if ok { 0 } else { 1 })
}

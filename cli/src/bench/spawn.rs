//! The `spawn` scenario: cold `/bin/true` through the subprocess engine against a raw
//! `std::process::Command` spawn, without and with ballast in the host.

use std::time::{Duration, Instant};

use paddock_core::{CancelToken, DiscardSink, ExecRequest, Program, Sandbox, SandboxSpec};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::SubprocessConfig;
use serde_json::json;

use super::{report, round, round3, summarize, Summary};

fn raw_spawn() -> Duration {
    let start = Instant::now();
    let out = std::process::Command::new("/bin/true")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("spawning /bin/true");
    assert!(out.status.success());
    start.elapsed()
}

fn raw_fork_spawn() -> Duration {
    use std::os::unix::process::CommandExt;
    let start = Instant::now();
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.stdin(std::process::Stdio::null());
    // Setting the group (to this process's own, so the child can) makes std fall back
    // from posix_spawn to fork+exec, which is what a naive sandbox launcher does.
    cmd.gid(rustix::process::getgid().as_raw());
    let out = cmd.output().expect("spawning /bin/true");
    assert!(out.status.success());
    start.elapsed()
}

pub(super) async fn engine_exec(sandbox: &dyn Sandbox) -> Duration {
    let start = Instant::now();
    let r = sandbox
        .exec(
            ExecRequest::new(Program::command(["/bin/true"])),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .expect("engine exec");
    assert!(r.is_success(), "{r:?}");
    start.elapsed()
}

/// Interleaves the two series so drift on a shared machine hits both alike.
async fn measure(sandbox: &dyn Sandbox, n: usize) -> (Summary, Summary) {
    for _ in 0..n / 10 {
        raw_spawn();
        engine_exec(sandbox).await;
    }
    let (mut raw, mut eng) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        raw.push(raw_spawn());
        eng.push(engine_exec(sandbox).await);
    }
    (summarize(eng), summarize(raw))
}

pub(super) async fn spawn(
    config: SubprocessConfig,
    spec: SandboxSpec,
    n: usize,
    ballast_mib: usize,
    as_json: bool,
) -> Result<i32, crate::run::UsageError> {
    let engine = match SubprocessEngine::new(&config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    let sandbox = match engine.open(&spec).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("paddock bench: {e}");
            return Ok(1);
        }
    };
    let features: Vec<&str> = paddock_core::Engine::capabilities(&engine)
        .features
        .iter()
        .map(String::as_str)
        .collect();

    let (eng, raw) = measure(&sandbox, n).await;
    let first = json!({
        "scenario": "spawn",
        "iterations": n,
        "p50_us": round(eng.p50),
        "p99_us": round(eng.p99),
        "baseline_p50_us": round(raw.p50),
        "baseline_p99_us": round(raw.p99),
        "ratio_p50": round3(eng.p50 / raw.p50),
        "engine_features": features,
        "network": spec.network.name(),
    });
    report(&first, as_json);

    // Ballast: allocated and touched so it is resident, as in a large embedding host.
    let mut ballast = vec![0u8; ballast_mib << 20];
    for page in ballast.chunks_mut(4096) {
        page[0] = 1;
    }
    let (eng_b, raw_b) = measure(&sandbox, n).await;
    // What a fork-based launcher pays in the same process, for contrast (fewer
    // iterations: each copies the page tables of the ballast).
    let fork_b = summarize((0..(n / 10).max(10)).map(|_| raw_fork_spawn()).collect());
    let second = json!({
        "scenario": "spawn_ballast",
        "ballast_mib": ballast_mib,
        "iterations": n,
        "p50_us": round(eng_b.p50),
        "p99_us": round(eng_b.p99),
        "baseline_p50_us": round(raw_b.p50),
        "baseline_p99_us": round(raw_b.p99),
        "ratio_p50": round3(eng_b.p50 / raw_b.p50),
        "ratio_to_no_ballast_p50": round3(eng_b.p50 / eng.p50),
        // The same, corrected for machine drift between the two phases with each
        // phase's own raw-spawn baseline: (engine/raw with ballast) / (engine/raw without).
        "ratio_to_no_ballast_normalized_p50": round3((eng_b.p50 / raw_b.p50) / (eng.p50 / raw.p50)),
        "baseline_ratio_to_no_ballast_p50": round3(raw_b.p50 / raw.p50),
        "fork_exec_p50_us": round(fork_b.p50),
    });
    std::hint::black_box(&ballast);
    drop(ballast);
    report(&second, as_json);
    let _ = sandbox.destroy().await;
    Ok(0)
}

//! `paddock bench`: Paddock measured against raw baselines in the same run.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use paddock_core::{
    CancelToken, DiscardSink, ExecRequest, Program, Sandbox, SandboxSpec, SubprocessConfig,
};
use paddock_engines::subprocess::SubprocessEngine;
use serde_json::json;

/// Arguments of `paddock bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    scenario: Scenario,
    /// Print one JSON object per scenario and line.
    #[arg(long, global = true)]
    json: bool,
}

/// Cgroup use in benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum CgroupArg {
    /// Use cgroups when the host allows it.
    Auto,
    /// No cgroups.
    Off,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Cold `/bin/true` through the subprocess engine vs. `std::process::Command`,
    /// without and with 1 GiB of touched ballast in this process.
    Spawn {
        /// Measured executions per variant.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(10..=100_000))]
        iterations: u32,
        /// Ballast size in MiB for the second scenario.
        #[arg(long, default_value_t = 1024)]
        ballast_mib: usize,
        /// Give the sandbox a cgroup (the default when the host allows it).
        #[arg(long, value_enum, default_value_t = CgroupArg::Auto)]
        cgroup: CgroupArg,
        /// The sandbox's network: `none` (an empty namespace) or `host`.
        #[arg(long, value_enum, default_value_t = crate::run::NetworkArg::None)]
        network: crate::run::NetworkArg,
    },
}

/// Runs `paddock bench`.
pub(crate) async fn bench(args: BenchArgs) -> Result<i32, crate::run::UsageError> {
    match args.scenario {
        Scenario::Spawn {
            iterations,
            ballast_mib,
            cgroup,
            network,
        } => {
            let mut config = SubprocessConfig::default();
            if cgroup == CgroupArg::Off {
                config.cgroup = paddock_core::CgroupMode::Off;
            }
            let spec = SandboxSpec {
                network: match network {
                    crate::run::NetworkArg::None => paddock_core::NetworkPolicy::None,
                    crate::run::NetworkArg::Host => paddock_core::NetworkPolicy::Unrestricted,
                },
                ..SandboxSpec::default()
            };
            // Measured on a runtime worker, where the I/O driver runs, as a server's
            // request handlers are; `block_on`'s thread would add a thread hand-off.
            let task = tokio::spawn(spawn(
                config,
                spec,
                iterations as usize,
                ballast_mib,
                args.json,
            ));
            task.await
                .map_err(|e| crate::run::UsageError(format!("the benchmark task failed: {e}")))?
        }
    }
}

/// Latency summary of one measured series, in microseconds.
#[derive(Debug, Clone, Copy)]
struct Summary {
    p50: f64,
    p99: f64,
}

fn summarize(mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e6
    };
    Summary {
        p50: at(0.50),
        p99: at(0.99),
    }
}

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
    // SAFETY: the closure does nothing; it only makes std fall back to fork+exec,
    // which is what a naive sandbox launcher does.
    unsafe {
        cmd.pre_exec(|| Ok(()));
    }
    let out = cmd.output().expect("spawning /bin/true");
    assert!(out.status.success());
    start.elapsed()
}

async fn engine_exec(sandbox: &dyn Sandbox) -> Duration {
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

async fn spawn(
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
        "fork_exec_p50_us": round(fork_b.p50),
    });
    std::hint::black_box(&ballast);
    drop(ballast);
    report(&second, as_json);
    let _ = sandbox.destroy().await;
    Ok(0)
}

fn round(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn report(v: &serde_json::Value, as_json: bool) {
    use std::io::Write;
    let text = if as_json {
        v.to_string()
    } else {
        serde_json::to_string_pretty(v).unwrap_or_default()
    };
    // A closed stdout (`| head -1`) ends the report quietly, not with a panic.
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

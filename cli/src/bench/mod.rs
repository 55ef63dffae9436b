//! `paddock bench`: Paddock measured against raw baselines in the same run.
//!
//! Every scenario prints one JSON object per line with `--json`, and finishes within
//! a minute with its defaults.

mod churn;
mod container;
mod disk;
mod e2b;
mod egress;
mod first;
mod fleet;
mod http;
mod isolate;
mod load;
mod memory;
pub(crate) mod netns;
mod peers;
mod pipeline;
mod soak;
mod spawn;
mod warm;

use std::time::Duration;

use clap::{Args, Subcommand};
use paddock_core::SandboxSpec;
use paddock_engines::SubprocessConfig;

/// Arguments of `paddock bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    scenario: Scenario,
    /// Print one JSON object per scenario and line.
    #[arg(long, global = true)]
    json: bool,
}

/// The runtimes `paddock bench container` measures unless told otherwise.
const DEFAULT_RUNTIMES: &str = "auto,runsc";

/// On or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Switch {
    /// On.
    On,
    /// Off.
    Off,
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
    /// A sandbox's own filesystem (the disk quota) vs. a plain directory: making and
    /// removing a workdir, and writing 64 MiB into it.
    Disk {
        /// Workdirs made and removed per variant.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..=10_000))]
        iterations: u32,
    },
    /// A no-op engine through the whole scheduler vs. called directly: the added
    /// latency for an actor caller and for the `Paddock` handle, and throughput.
    Pipeline {
        /// Measured executions per caller kind.
        #[arg(long, default_value_t = 20_000)]
        iterations: usize,
        /// Concurrent callers for the throughput run.
        #[arg(long, default_value_t = 64)]
        callers: usize,
        /// Executions in the throughput run.
        #[arg(long, default_value_t = 200_000)]
        total: usize,
    },
    /// E2B's own Python SDK against the E2B-compatible API in this process, beside
    /// the native API in the same run: create + `commands.run("echo hi")` + kill, a
    /// command in an open sandbox, `run_code("1+1")` in a warm context, and
    /// `files.list` of a directory of 100 entries against the native listing.
    E2b {
        /// The engine of the templates (`subprocess` or `container`).
        #[arg(long, default_value = "subprocess")]
        engine: String,
        /// Samples per measure.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        samples: u64,
    },
    /// A sandbox's connections through its egress gateway (network `allowlist`,
    /// the proxy's CONNECT) vs. direct from one with network `unrestricted`:
    /// connection setup p50/p99, the throughput of one download, and how fast a
    /// connection the allowlist denies is refused at connect. The server listens
    /// in a network namespace the bench makes (root, `ip` and `nft`; a scenario the
    /// host cannot run is skipped, saying why).
    Egress {
        /// Connections measured per path.
        #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(10..=100_000))]
        samples: u64,
        /// The download's size in MiB.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=4096))]
        mib: u64,
    },
    /// Executions through a fleet of in-process nodes on a NATS cluster (three
    /// servers started on loopback ports unless `--urls` names one) vs. the local
    /// facade: added latency, throughput over 1, 2 and 3 nodes with the CPU per
    /// execution, cancel from another node, and the takeover of a lost node's work.
    Fleet {
        /// A NATS cluster to use instead of starting one (comma-separated URLs).
        #[arg(long, value_delimiter = ',')]
        urls: Vec<String>,
        /// Measured executions per facade for the overhead.
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(20..=100_000))]
        iterations: u32,
        /// Executions per throughput run.
        #[arg(long, default_value_t = 6000, value_parser = clap::value_parser!(u32).range(64..=1_000_000))]
        total: u32,
        /// Concurrent callers in the throughput runs.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
        callers: u32,
    },
    /// JavaScript in pooled and fresh QuickJS isolates vs. node's `vm` and
    /// `isolated-vm` (installed with npm into a temporary directory on first use).
    Isolate {
        /// Measured executions per series.
        #[arg(long, default_value_t = 2000)]
        iterations: usize,
        /// Measured operations per peer series.
        #[arg(long, default_value_t = 1000)]
        peer_iterations: usize,
        /// Pause between pooled requests, in microseconds.
        #[arg(long, default_value_t = 150)]
        gap_us: u64,
        /// The engine's `idle_spin_us` (default: the configuration default).
        #[arg(long)]
        idle_spin_us: Option<u64>,
        /// The engine's `reply_spin_us` (default: the configuration default).
        #[arg(long)]
        reply_spin_us: Option<u64>,
        /// Skip the node peers.
        #[arg(long)]
        no_peers: bool,
    },
    /// Python `Code` on a warm worker vs. a cold interpreter start, and the
    /// throughput of a warm pool of two.
    /// Time to a fresh sandbox's first result: open, first Python, first
    /// JavaScript, one at a time and in bursts, per engine; and a one-shot
    /// `paddock run` as a whole process vs. `/bin/true`, `python3 -c` and the
    /// container runtime's own `run`.
    First {
        /// Sandboxes opened at once, per series (comma-separated).
        #[arg(long, default_value = "1,8,64", value_delimiter = ',')]
        bursts: Vec<usize>,
        /// Samples per series (at least one round of each burst).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
        samples: u32,
        /// Also open this many sandboxes and keep them open, per engine: host
        /// memory per idle sandbox (0: skipped; 1000 takes minutes and gigabytes).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4096))]
        density: u32,
        /// The pools' `min_idle` for the bursts (default: the configuration's
        /// default), to compare what a first burst meets and what it costs.
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1024))]
        min_idle: Option<u32>,
    },
    Warm {
        /// Measured executions per series.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        /// Executions in the throughput run.
        #[arg(long, default_value_t = 5_000)]
        executions: usize,
        /// Concurrent callers in the throughput run.
        #[arg(long, default_value_t = 16)]
        callers: usize,
    },
    /// `/bin/true` in a container through the engine vs. the runtime's own `run` of
    /// an equivalent bundle, and the cost of the seccomp profile; then on gVisor's
    /// runsc (cold run, warm exec and a system call), one line per runtime.
    Container {
        /// Measured executions per series (runsc's series are a tenth as long).
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        /// The runtimes, comma-separated: auto (crun, else runc), crun, runc, runsc.
        /// By default `auto,runsc`, where runsc is left out (with a line that says
        /// why) when it cannot start here.
        #[arg(long, default_value = DEFAULT_RUNTIMES)]
        runtime: String,
        /// runsc's platform: ptrace, kvm or systrap (newer runsc releases).
        #[arg(long, default_value = "ptrace")]
        runsc_platform: String,
        /// Containers of crun and runc get a user namespace (`on`, the default) or
        /// not (`off`), to price it.
        #[arg(long, value_enum, default_value_t = Switch::On)]
        user_namespace: Switch,
    },
    /// Executions per second over HTTP vs. the in-process handle (no-op engine).
    Http {
        /// Concurrent clients.
        #[arg(long, default_value_t = 64)]
        callers: usize,
        /// Executions per measured run.
        #[arg(long, default_value_t = 50_000)]
        executions: usize,
    },
    /// What the server holds under one tenant's worst case — concurrent large E2B
    /// `SendInput` calls to a process that never reads, concurrent executions at the
    /// output ceiling, slow readers of a large file — against its RSS at rest,
    /// through the HTTP APIs in this process.
    Memory {
        /// Concurrent `SendInput` calls of `--input-kib` each.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=256))]
        inputs: u64,
        /// KiB of each `SendInput` call's message (1024: the largest the agent takes;
        /// larger ones are refused for their size, after they are read).
        #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=8192))]
        input_kib: u64,
        /// Concurrent executions that each print `--output-mib`.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=32))]
        outputs: u64,
        /// MiB each execution prints (1 to 64, the default output ceiling).
        #[arg(long, default_value_t = 64)]
        output_mib: u64,
        /// Runs of the stdin and outputs phases (medians are reported).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
        runs: u64,
        /// Raise the per-process and per-tenant memory budgets (`limiter.max_input_*`,
        /// `max_output_bytes_per_tenant`, `input_wait_ms`) to their maxima: the same
        /// load without the bounds, for comparison.
        #[arg(long)]
        unbounded: bool,
        /// Concurrent slow readers of one file.
        #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=256))]
        readers: u64,
        /// The file's size in MiB (sparse).
        #[arg(long, default_value_t = 250)]
        file_mib: u64,
        /// How long each slow reader reads before it is cut off, in seconds.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=60))]
        read_secs: u64,
    },
    /// Sandboxes opened, given a first command (`true`; JavaScript `0` on the
    /// isolate engine) and destroyed, over and over, by concurrent clients, per
    /// engine; then by one client, with the pool and without one (every open
    /// creates): sandboxes per second and p50/p99 of each step, the pool's counts and
    /// the CPU used.
    Churn {
        /// How long the concurrent clients run, per engine (the first fifth, at most
        /// 2 s, is warm-up).
        #[arg(long, default_value = "8s", value_parser = crate::units::parse_duration)]
        duration: Duration,
        /// Concurrent clients.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1024))]
        clients: u32,
        /// How long each of the two serial runs lasts, per engine.
        #[arg(long, default_value = "2s", value_parser = crate::units::parse_duration)]
        serial_duration: Duration,
        /// Skip the serial runs.
        #[arg(long)]
        no_serial: bool,
        /// The engines, comma-separated (one that does not run here is skipped; an
        /// empty list runs only `--breakdown`).
        #[arg(
            long,
            default_value = "subprocess,container,isolate",
            value_delimiter = ','
        )]
        engines: Vec<String>,
        /// The clients call the `Paddock` facade in this process (`facade`), or its
        /// HTTP API served by this process on a loopback port (`http`).
        #[arg(long, value_enum, default_value_t = churn::Via::Facade)]
        via: churn::Via,
        /// Each cycle's first command: `true` (`command`), or the Python snippet
        /// `print(1)` (`python`; the isolate engine runs JavaScript `0` either way).
        #[arg(long, value_enum, default_value_t = churn::First::Command)]
        first: churn::First,
        /// A configuration file for the scheduler (default: the defaults); the flags
        /// below override its pool sizes, and its API keys are left out.
        #[arg(long)]
        config: Option<std::path::PathBuf>,
        /// The pools' max_size.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
        max_size: u32,
        /// The pools' min_idle (default: the configuration's).
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=4096))]
        min_idle: Option<u32>,
        /// Also time the container engine's own create, first command and destroy,
        /// this many rounds per variant (each leaves out one part: runners, user
        /// namespace, warm container), with the disk quota's part (0: skipped).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10_000))]
        breakdown: u32,
    },
    /// Many short subprocess executions from many callers against a small pool.
    Load {
        /// Executions in all.
        #[arg(long, default_value_t = 10_000)]
        executions: usize,
        /// Concurrent callers.
        #[arg(long, default_value_t = 256)]
        callers: usize,
        /// The pool's max_size.
        #[arg(long, default_value_t = 8)]
        max_size: usize,
        /// The pool's max_waiting (callers beyond it are rejected with POOL_EXHAUSTED).
        #[arg(long, default_value_t = 128)]
        max_waiting: usize,
    },
    /// A mixed load on every engine the host can run — successes, failures,
    /// timeouts, cancellations, output past the cap, sandbox sessions — through one
    /// `Paddock` for `--duration`; then checks memory growth, open descriptors,
    /// leftover processes, pool sizes and that every execution got exactly one answer
    /// and one audit entry.
    Soak {
        /// How long the measured load runs, after the warm-up (`300s`, `5m`).
        #[arg(long, default_value = "25s", value_parser = crate::units::parse_duration)]
        duration: Duration,
        /// The warm-up before the baseline (default: a tenth of `--duration`, at
        /// least 15 s); it goes on until every kind of work has run once.
        #[arg(long, value_parser = crate::units::parse_duration)]
        warmup: Option<Duration>,
        /// Concurrent callers.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
        callers: u32,
        /// Every pool's min_idle.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=64))]
        min_idle: u32,
        /// Every pool's max_size.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
        max_size: u32,
        /// Every pool's max_waiting (callers beyond it are refused with
        /// POOL_EXHAUSTED, then retry).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=100_000))]
        max_waiting: u32,
        /// How often a sample line is printed with `--json`.
        #[arg(long, default_value = "10s", value_parser = crate::units::parse_duration)]
        sample_every: Duration,
        /// Run only these tasks of the mix (comma-separated names, as in `by_task`),
        /// to find which kind of work a growth comes from.
        #[arg(long, value_delimiter = ',')]
        tasks: Vec<String>,
        /// The streamer's max_streams: open output buffers, and ended executions it
        /// remembers (the scheduler's default is 100,000).
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(16..=1_000_000))]
        max_streams: u32,
        /// The RSS growth after the warm-up that still passes, in percent.
        #[arg(long, default_value_t = 10.0)]
        max_rss_growth_pct: f64,
    },
}

/// Runs `paddock bench`.
pub(crate) async fn bench(args: BenchArgs) -> Result<i32, crate::run::UsageError> {
    match args.scenario {
        Scenario::Disk { iterations } => disk::disk(iterations as usize, args.json),
        Scenario::Pipeline {
            iterations,
            callers,
            total,
        } => {
            pipeline::pipeline(
                iterations.max(100),
                callers.max(1),
                total.max(callers),
                args.json,
            )
            .await
        }
        Scenario::Egress { samples, mib } => egress::egress(samples as usize, mib, args.json).await,
        Scenario::E2b { engine, samples } => {
            let engine = paddock_core::EngineName::new(&engine)
                .map_err(|e| crate::run::UsageError(format!("--engine: {}", e.message)))?;
            e2b::e2b(engine, samples as usize, args.json).await
        }
        Scenario::Fleet {
            urls,
            iterations,
            total,
            callers,
        } => {
            let task = tokio::spawn(fleet::fleet(
                (!urls.is_empty()).then_some(urls),
                iterations as usize,
                total as usize,
                callers as usize,
                args.json,
            ));
            task.await
                .map_err(|e| crate::run::UsageError(format!("the benchmark task failed: {e}")))?
        }
        Scenario::Isolate {
            iterations,
            peer_iterations,
            gap_us,
            idle_spin_us,
            reply_spin_us,
            no_peers,
        } => {
            let mut config = paddock_engines::IsolateConfig::default();
            config.idle_spin_us = idle_spin_us.unwrap_or(config.idle_spin_us);
            config.reply_spin_us = reply_spin_us.unwrap_or(config.reply_spin_us);
            let task = tokio::spawn(isolate::isolate(
                config,
                iterations.max(20),
                (!no_peers).then_some(peer_iterations.max(20)),
                Duration::from_micros(gap_us),
                args.json,
            ));
            task.await
                .map_err(|e| crate::run::UsageError(format!("the benchmark task failed: {e}")))?
        }
        Scenario::First {
            bursts,
            samples,
            density,
            min_idle,
        } => {
            if bursts.iter().any(|b| *b == 0 || *b > 1024) {
                return Err(crate::run::UsageError(
                    "--bursts: each burst is 1 to 1024 sandboxes".into(),
                ));
            }
            first::first(
                bursts,
                samples as usize,
                density as usize,
                min_idle.map(|n| n as usize),
                args.json,
            )
            .await
        }
        Scenario::Warm {
            iterations,
            executions,
            callers,
        } => {
            let task = tokio::spawn(warm::warm(
                iterations.max(10),
                executions.max(1),
                callers.max(1),
                args.json,
            ));
            task.await
                .map_err(|e| crate::run::UsageError(format!("the benchmark task failed: {e}")))?
        }
        Scenario::Container {
            iterations,
            runtime,
            runsc_platform,
            user_namespace,
        } => {
            use paddock_engines::{OciRuntime, RunscPlatform};
            let platform = match runsc_platform.as_str() {
                "ptrace" => RunscPlatform::Ptrace,
                "kvm" => RunscPlatform::Kvm,
                "systrap" => RunscPlatform::Systrap,
                other => {
                    return Err(crate::run::UsageError(format!(
                        "--runsc-platform must be ptrace, kvm or systrap, not `{other}`"
                    )))
                }
            };
            let mut runtimes = Vec::new();
            for name in runtime.split(',').map(str::trim) {
                runtimes.push(match name {
                    "auto" => OciRuntime::Auto,
                    "crun" => OciRuntime::Crun,
                    "runc" => OciRuntime::Runc,
                    "runsc" => OciRuntime::Runsc,
                    other => {
                        return Err(crate::run::UsageError(format!(
                            "--runtime takes auto, crun, runc and runsc, comma-separated, not `{other}`"
                        )))
                    }
                });
            }
            // By default runsc is measured only where it can run.
            let optional_runsc = runtime == DEFAULT_RUNTIMES;
            let mut status = 0;
            for rt in runtimes {
                let code = if rt == OciRuntime::Runsc {
                    if optional_runsc {
                        let probe = paddock_engines::ContainerConfig {
                            runtime: OciRuntime::Runsc,
                            runsc_platform: platform,
                            warm: false,
                            ..paddock_engines::ContainerConfig::default()
                        };
                        if let Err(e) = paddock_engines::container::ContainerEngine::new(&probe) {
                            report(
                                &serde_json::json!({"scenario": "container", "runtime": "runsc",
                                    "skipped": e.message}),
                                args.json,
                            );
                            continue;
                        }
                    }
                    container::gvisor(platform, iterations.max(10), args.json).await?
                } else {
                    container::container(
                        rt,
                        user_namespace == Switch::On,
                        iterations.max(10),
                        args.json,
                    )
                    .await?
                };
                status = status.max(code);
            }
            Ok(status)
        }
        Scenario::Http {
            callers,
            executions,
        } => http::http(callers.max(1), executions.max(callers), args.json).await,
        Scenario::Memory {
            inputs,
            input_kib,
            outputs,
            output_mib,
            runs,
            unbounded,
            readers,
            file_mib,
            read_secs,
        } => {
            let settings = memory::MemoryArgs {
                inputs: inputs as usize,
                input_kib,
                outputs: outputs as usize,
                output_mib,
                readers: readers as usize,
                file_mib,
                read_secs,
                runs: runs as usize,
                unbounded,
            };
            memory::memory(settings, args.json).await
        }
        Scenario::Churn {
            duration,
            clients,
            serial_duration,
            no_serial,
            engines,
            via,
            first,
            config,
            max_size,
            min_idle,
            breakdown,
        } => {
            let config = match config {
                Some(path) => {
                    let text = std::fs::read_to_string(&path).map_err(|e| {
                        crate::run::UsageError(format!("reading `{}`: {e}", path.display()))
                    })?;
                    paddock::PaddockConfig::from_toml_str(&text)
                        .map_err(|e| crate::run::UsageError(format!("{}: {e}", path.display())))?
                }
                None => paddock::PaddockConfig::default(),
            };
            let mut names = Vec::new();
            for e in engines.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
                match e {
                    "subprocess" | "container" | "isolate" => {
                        names.push(paddock_core::EngineName::new(e).map_err(|e| {
                            crate::run::UsageError(format!("--engines: {}", e.message))
                        })?)
                    }
                    other => {
                        return Err(crate::run::UsageError(format!(
                            "--engines takes subprocess, container and isolate, comma-separated (or nothing, with --breakdown), not `{other}`"
                        )))
                    }
                }
            }
            let settings = churn::ChurnArgs {
                config,
                duration,
                clients: clients as usize,
                serial_duration: (!no_serial).then_some(serial_duration),
                engines: names,
                via,
                first,
                max_size: max_size as usize,
                min_idle: min_idle.map(|n| n as usize),
                breakdown: breakdown as usize,
            };
            let task = tokio::spawn(churn::churn(settings, args.json));
            task.await
                .map_err(|e| crate::run::UsageError(format!("the benchmark task failed: {e}")))?
        }
        Scenario::Load {
            executions,
            callers,
            max_size,
            max_waiting,
        } => {
            load::load(
                executions,
                callers.max(1),
                max_size.max(1),
                max_waiting,
                args.json,
            )
            .await
        }
        Scenario::Soak {
            duration,
            warmup,
            callers,
            min_idle,
            max_size,
            max_waiting,
            sample_every,
            tasks,
            max_streams,
            max_rss_growth_pct,
        } => {
            if !(max_rss_growth_pct.is_finite() && max_rss_growth_pct >= 0.0) {
                return Err(crate::run::UsageError(format!(
                    "--max-rss-growth-pct must be a percentage of 0 or more, not {max_rss_growth_pct}"
                )));
            }
            if min_idle > max_size {
                return Err(crate::run::UsageError(format!(
                    "--min-idle ({min_idle}) must not exceed --max-size ({max_size})"
                )));
            }
            let settings = soak::SoakArgs {
                duration,
                warmup: warmup.unwrap_or_else(|| (duration / 10).max(Duration::from_secs(15))),
                callers: callers as usize,
                min_idle: min_idle as usize,
                max_size: max_size as usize,
                max_waiting: max_waiting as usize,
                sample_every,
                only: tasks.into_iter().filter(|t| !t.trim().is_empty()).collect(),
                max_streams: max_streams as usize,
                max_rss_growth_pct,
            };
            let task = tokio::spawn(soak::soak(settings, args.json));
            task.await
                .map_err(|e| crate::run::UsageError(format!("the benchmark task failed: {e}")))?
        }
        Scenario::Spawn {
            iterations,
            ballast_mib,
            cgroup,
            network,
        } => {
            let mut config = SubprocessConfig::default();
            if cgroup == CgroupArg::Off {
                config.cgroup = paddock_engines::CgroupMode::Off;
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
            let task = tokio::spawn(spawn::spawn(
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
    pub(super) p50: f64,
    pub(super) p99: f64,
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

/// A field of `/proc/self/status`, in its unit (kB for memory).
fn status_field(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// This process's resident memory, in bytes.
fn rss_bytes() -> u64 {
    status_field("VmRSS:") * 1024
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

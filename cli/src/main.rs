//! The `paddock` binary: a thin command-line layer over the Paddock crates.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod bench;
mod client;
mod doctor;
mod run;
mod serve;
mod shell;
mod units;

/// Paddock runs untrusted code in pooled sandboxes: subprocesses with cgroup limits,
/// QuickJS isolates and OCI containers.
#[derive(Debug, Parser)]
#[command(name = "paddock", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one program in a fresh sandbox and stream its output.
    Run(run::RunArgs),
    /// Serve the HTTP API (127.0.0.1:7878 by default).
    Serve(serve::ServeArgs),
    /// Check a configuration file, or print the defaults.
    Config(serve::ConfigArgs),
    /// Measure Paddock against raw baselines on this machine.
    Bench(bench::BenchArgs),
    /// Check what this host supports (cgroups, namespaces, interpreters).
    Doctor(doctor::DoctorArgs),
    /// Open an interactive terminal in a fresh sandbox.
    Shell(shell::ShellArgs),
}

/// Raises this process's soft limit on open descriptors to its hard limit.
///
/// Every sandbox holds descriptors of its own (its workers' pipes and pidfds, its
/// network namespace, cgroup files), so the common soft limit of 1024 would cap a
/// server at a few dozen open sandboxes (seen: `Too many open files` at 68). The
/// programs Paddock runs do not inherit the raised limit: each gets its
/// `open_files` limit (1024 by default).
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    // The soft limit is never above the hard one (`None`: no limit): below it unless
    // equal.
    if lim.current != lim.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            },
        );
    }
}

fn main() {
    let cli = Cli::parse();
    raise_open_files_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("paddock: cannot start the async runtime: {e}");
            std::process::exit(run::EXIT_INTERNAL);
        }
    };
    let status = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Serve(args) => serve::serve(args).await,
            Command::Config(args) => serve::config(args).await,
            Command::Bench(args) => bench::bench(args).await,
            Command::Doctor(args) => doctor::doctor(args).await,
            Command::Shell(args) => shell::shell(args).await,
        }
    });
    let code = match status {
        Ok(code) => code,
        Err(run::UsageError(msg)) => {
            eprintln!("error: {msg}\n\nFor more information, try '--help'.");
            2
        }
    };
    // Leave without waiting for stdin readers or other blocked runtime threads.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    std::process::exit(code);
}

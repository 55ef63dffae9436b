//! `paddock shell`: an interactive terminal in a fresh sandbox.
//!
//! The local terminal goes into raw mode (restored on every way out), keystrokes go to
//! the sandbox's terminal as they are typed, its output comes back as it is written,
//! and a resize of the local window resizes the remote one. When the remote command
//! exits, the sandbox is destroyed and `paddock shell` exits with its status.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use paddock::PaddockConfig;
use paddock_core::{EngineName, Limits, NetworkPolicy, SandboxSpec, TerminalSize, TerminalSpec};
use paddock_pool::Attachable;
use rustix::termios::{self, OptionalActions, Termios};
use tokio::io::AsyncReadExt;

use crate::run::{EngineArg, NetworkArg, UsageError, EXIT_INTERNAL};
use crate::units::parse_size;

/// Arguments of `paddock shell`.
#[derive(Debug, Args)]
#[command(after_help = "\
Exit status: the remote command's own exit code (128+N when signal N ended it);
125 when Paddock itself failed; 2 for a bad command line or an engine without terminals.")]
pub(crate) struct ShellArgs {
    /// Engine to open the terminal in (subprocess or container).
    #[arg(long, value_enum, default_value_t = EngineArg::Subprocess)]
    engine: EngineArg,
    /// Network: `none` (an empty namespace) or `host`.
    #[arg(long, value_enum, default_value_t = NetworkArg::None)]
    network: NetworkArg,
    /// Memory limit of the sandbox (e.g. 256M, 1G).
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Maximum number of processes and threads in the sandbox.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pids: Option<u64>,
    /// A configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The command to run on the terminal and its arguments (default: /bin/sh).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// The local terminal's settings, restored when dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Puts stdin's terminal into raw mode; `None` when stdin is no terminal.
    fn enter() -> Option<RawMode> {
        let stdin = std::io::stdin();
        if !termios::isatty(&stdin) {
            return None;
        }
        let saved = termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw).ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Restores the settings read in `enter`.
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.saved);
    }
}

/// The local window's size, when stdin (or stdout) is a terminal.
fn local_size() -> Option<TerminalSize> {
    let sizes = [
        termios::tcgetwinsize(std::io::stdin()),
        termios::tcgetwinsize(std::io::stdout()),
    ];
    sizes
        .into_iter()
        .flatten()
        .find(|ws| ws.ws_row > 0)
        .map(|ws| TerminalSize {
            rows: ws.ws_row.min(1000),
            cols: ws.ws_col.clamp(1, 1000),
        })
}

/// Runs `paddock shell`; returns the process exit status.
pub(crate) async fn shell(args: ShellArgs) -> Result<i32, UsageError> {
    let engine = match args.engine {
        EngineArg::Subprocess => EngineName::SUBPROCESS,
        EngineArg::Container => EngineName::CONTAINER,
        EngineArg::Isolate => {
            return Err(UsageError(
                "the isolate engine runs JavaScript, not terminals: use --engine subprocess or container".into(),
            ))
        }
    };
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| UsageError(format!("reading `{}`: {e}", path.display())))?;
            PaddockConfig::from_toml_str(&text)
                .map_err(|e| UsageError(format!("{}: {e}", path.display())))?
        }
        None => PaddockConfig::default(),
    };
    config.pool.min_idle = 0;
    let mut builder = paddock::builder().config(config);
    if engine != EngineName::CONTAINER {
        builder = builder.without_container();
    }
    let paddock = match builder.start() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("paddock: {e}");
            return Ok(EXIT_INTERNAL);
        }
    };
    let spec = SandboxSpec {
        network: match args.network {
            NetworkArg::None => NetworkPolicy::None,
            NetworkArg::Host => NetworkPolicy::Unrestricted,
        },
        limits: Limits {
            memory_bytes: args.memory,
            pids: args.pids,
            ..Limits::default()
        },
        ..SandboxSpec::default()
    };
    let status = match paddock.open_sandbox(spec, Some(engine)).await {
        Ok(sandbox) => {
            let status = session(&sandbox, &args.command).await;
            let _ = sandbox.destroy().await;
            status
        }
        Err(e) => Err(e),
    };
    let code = match status {
        Ok(code) => code,
        Err(e) => {
            eprintln!("paddock: {e}");
            match e.code {
                paddock_core::ErrorCode::CapabilityNotSupported
                | paddock_core::ErrorCode::InvalidOptions => 2,
                _ => EXIT_INTERNAL,
            }
        }
    };
    let _ = paddock.shutdown(Duration::from_secs(5)).await;
    Ok(code)
}

async fn session(
    sandbox: &paddock_pool::SandboxHandle,
    command: &[String],
) -> Result<i32, paddock_core::Error> {
    let mut spec = match command.split_first() {
        Some((cmd, rest)) => TerminalSpec::new(cmd.clone(), rest.iter().cloned()),
        None => TerminalSpec::default(),
    };
    if let Some(size) = local_size() {
        spec.size = size;
    }
    if let Ok(term) = std::env::var("TERM") {
        spec.env.insert("TERM".into(), term);
    }
    let started = sandbox.open_terminal(spec).await?;
    let Attachable::Terminal(terminal) = started.handle else {
        unreachable!("open_terminal answers with a terminal");
    };
    // From here on every way out restores the local terminal.
    let raw = RawMode::enter();
    let output = {
        let mut reader = terminal.output();
        tokio::spawn(async move {
            while let Some(chunk) = reader.next().await {
                let mut out = std::io::stdout().lock();
                if out
                    .write_all(&chunk.data)
                    .and_then(|_| out.flush())
                    .is_err()
                {
                    break;
                }
            }
        })
    };
    let input = {
        let terminal = terminal.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 4096];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        // Input ended (not a terminal): the remote side reads end of
                        // file too.
                        let _ = terminal.write(b"\x04").await;
                        return;
                    }
                    Ok(n) => {
                        if terminal.write(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        })
    };
    let resize = {
        let terminal = terminal.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut winch) = signal(SignalKind::window_change()) else {
                return;
            };
            while winch.recv().await.is_some() {
                if let Some(size) = local_size() {
                    let _ = terminal.resize(size);
                }
            }
        })
    };
    let exit = terminal.exited().await;
    // The exit is known once its output has ended: print the rest, then leave.
    let _ = tokio::time::timeout(Duration::from_secs(2), output).await;
    input.abort();
    resize.abort();
    drop(raw);
    Ok(exit.exit_code)
}

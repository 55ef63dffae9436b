//! `paddock run`: one execution, output streamed to the terminal.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use paddock::PaddockConfig;
use paddock_core::{
    EngineName, ErrorCode, ExecRequest, ExecResult, Language, LimitKind, Limits, NetworkPolicy,
    Outcome, Program, StreamKind,
};
use paddock_pool::{Execute, Paddock, StreamEvent};
use tokio::io::AsyncWriteExt;

use crate::units::{parse_duration, parse_size};

/// Exit status when Paddock itself failed (not the program).
pub(crate) const EXIT_INTERNAL: i32 = 125;
/// Exit status when the program could not be started.
pub(crate) const EXIT_SPAWN: i32 = 127;
/// Exit status on timeout, as coreutils `timeout` uses.
pub(crate) const EXIT_TIMEOUT: i32 = 124;

/// Engines `paddock run` can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum EngineArg {
    /// Host processes with cgroup limits.
    Subprocess,
    /// JavaScript in a QuickJS isolate (`--lang javascript` only).
    Isolate,
    /// An OCI container (crun or runc): `strict` isolation, no network.
    Container,
}

/// Network choices on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum NetworkArg {
    /// An empty network namespace.
    None,
    /// The host's network.
    Host,
}

/// Languages on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LangArg {
    /// Python 3.
    Python,
    /// JavaScript (node).
    Javascript,
    /// POSIX shell.
    Shell,
}

impl EngineArg {
    fn name(self) -> EngineName {
        match self {
            EngineArg::Subprocess => EngineName::SUBPROCESS,
            EngineArg::Isolate => EngineName::ISOLATE,
            EngineArg::Container => EngineName::CONTAINER,
        }
    }
}

impl From<LangArg> for Language {
    fn from(l: LangArg) -> Language {
        match l {
            LangArg::Python => Language::Python,
            LangArg::Javascript => Language::Javascript,
            LangArg::Shell => Language::Shell,
        }
    }
}

/// Arguments of `paddock run`.
#[derive(Debug, Args)]
#[command(after_help = "\
Exit status: the program's own exit code; 128+N when it was killed by signal N;
124 on timeout; 130 when interrupted; 42 when a handler suspended; 137 when the memory or pids limit ended it;
152 for the CPU-time limit; 153 for the file size limit; 1 when it used up its disk quota
or file-count cap (its writes failed with ENOSPC); 127 when the program
could not be started; 125 when Paddock itself failed; 2 for a bad command line.")]
pub(crate) struct RunArgs {
    /// Engine to run in.
    #[arg(long, value_enum, default_value_t = EngineArg::Subprocess)]
    engine: EngineArg,
    /// Wall-clock timeout (e.g. 500ms, 5s, 2m).
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// CPU-time limit (e.g. 2s).
    #[arg(long, value_parser = parse_duration)]
    cpu: Option<Duration>,
    /// Memory limit (e.g. 256M, 1G).
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Maximum number of processes and threads.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pids: Option<u64>,
    /// Bytes of stdout and of stderr kept, each (e.g. 64k).
    #[arg(long, value_parser = parse_size)]
    max_output: Option<u64>,
    /// Network: `none` (an empty namespace) or `host`.
    #[arg(long, value_enum, default_value_t = NetworkArg::None)]
    network: NetworkArg,
    /// Extra environment variable for the program (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Pass Paddock's own stdin to the program.
    #[arg(long)]
    stdin: bool,
    /// Print one JSON line on stdout instead of streaming output: the result, or
    /// `{"error":{…}}` for a refusal.
    #[arg(long)]
    json: bool,
    /// A configuration file (TOML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Run source code in this language instead of a command.
    #[arg(long, value_enum, requires = "source")]
    lang: Option<LangArg>,
    /// The source code (`-` reads it from stdin).
    #[arg(long, group = "source", conflicts_with = "file")]
    code: Option<String>,
    /// A file holding the source code.
    #[arg(long, group = "source")]
    file: Option<PathBuf>,
    /// Start the program as a background process in a running `paddock serve`
    /// (`--server`) and print its execution id; it runs until it exits or its sandbox
    /// is destroyed.
    #[arg(long, requires = "server")]
    detach: bool,
    /// The server for `--detach`, as http://HOST:PORT.
    #[arg(long, env = "PADDOCK_SERVER", value_name = "URL")]
    server: Option<String>,
    /// With `--detach`: start it in this open sandbox instead of a new one.
    #[arg(long, requires = "detach", value_name = "ID")]
    sandbox: Option<String>,
    /// With `--detach`: the server's API key.
    #[arg(
        long,
        env = "PADDOCK_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not K=V")),
    }
}

/// A usage error: exit 2 with a message, like clap's own.
pub(crate) struct UsageError(pub(crate) String);

impl RunArgs {
    fn program(&self) -> Result<Program, UsageError> {
        match (&self.lang, &self.command.is_empty()) {
            (Some(lang), true) => {
                let source = match (&self.code, &self.file) {
                    (Some(c), None) if c == "-" => {
                        let mut s = String::new();
                        std::io::stdin()
                            .read_to_string(&mut s)
                            .map_err(|e| UsageError(format!("reading code from stdin: {e}")))?;
                        s
                    }
                    (Some(c), None) => c.clone(),
                    (None, Some(f)) => std::fs::read_to_string(f)
                        .map_err(|e| UsageError(format!("reading `{}`: {e}", f.display())))?,
                    _ => {
                        return Err(UsageError(
                            "--lang needs exactly one of --code or --file".into(),
                        ))
                    }
                };
                Ok(Program::code((*lang).into(), source))
            }
            (Some(_), false) => Err(UsageError(
                "give either --lang with --code/--file, or a command after `--`, not both".into(),
            )),
            (None, false) => Ok(Program::Command {
                argv: self.command.clone(),
            }),
            (None, true) => Err(UsageError(
                "nothing to run: give a command after `--` or --lang with --code/--file".into(),
            )),
        }
    }
}

/// Runs `paddock run`; returns the process exit status.
pub(crate) async fn run(args: RunArgs) -> Result<i32, UsageError> {
    let program = args.program()?;
    if args.code.is_some() && args.lang.is_none() || args.file.is_some() && args.lang.is_none() {
        return Err(UsageError("--code and --file need --lang".into()));
    }
    if args.detach {
        return detach(&args, program);
    }
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| UsageError(format!("reading `{}`: {e}", path.display())))?;
            PaddockConfig::from_toml_str(&text)
                .map_err(|e| UsageError(format!("{}: {e}", path.display())))?
        }
        None => PaddockConfig::default(),
    };
    let stdin = if args.stdin {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| UsageError(format!("reading stdin: {e}")))?;
        Some(s)
    } else {
        None
    };

    let mut config = config;
    // A one-shot run needs no instance kept warm ahead of it, and only its own
    // engine, probed for what this one execution can use: no allowlists or disk
    // quotas (unless the configuration sets one for every execution), no homes,
    // and an interpreter found only when the program is code in its language. A
    // warm worker would start an interpreter and then send it the code: slower than
    // running it cold.
    config.pool.min_idle = 0;
    let mut startup = paddock_engines::Startup::minimal();
    // A configuration that gives every execution a disk quota needs the backend.
    let d = &config.limits.defaults;
    startup.disks = d.disk_bytes.is_some() || d.disk_files.is_some();
    config.subprocess.startup = startup;
    config.subprocess.warm.enabled = false;
    let chosen = args.engine.name();
    let mut builder = paddock::builder().config(config);
    for other in [
        EngineName::SUBPROCESS,
        EngineName::ISOLATE,
        EngineName::CONTAINER,
    ] {
        if other != chosen {
            builder = builder.without(other);
        }
    }
    let paddock = match builder.start() {
        Ok(p) => p,
        Err(e) => {
            refused(args.json, &e);
            return Ok(exit_for_error(e.code));
        }
    };
    let mut request = ExecRequest::new(program);
    request.stdin = stdin;
    request.env = args.env.iter().cloned().collect::<BTreeMap<_, _>>();
    request.limits = Limits {
        timeout_ms: args.timeout.map(|d| d.as_millis().max(1) as u64),
        cpu_ms: args.cpu.map(|d| d.as_millis().max(1) as u64),
        memory_bytes: args.memory,
        pids: args.pids,
        max_output_bytes: args.max_output,
        ..Limits::default()
    };
    // The scheduler validates the request (once); a request wrong in itself is
    // refused with INVALID_OPTIONS, which exits 2 like a usage error.
    let id = request.id.clone();
    let mut msg = Execute::new(request).on(chosen);
    msg.order.network = match args.network {
        NetworkArg::None => NetworkPolicy::None,
        NetworkArg::Host => NetworkPolicy::Unrestricted,
    };
    let interrupted = {
        let paddock = paddock.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                paddock.cancel(&paddock_pool::Caller::Embedder, &id);
            }
        })
    };
    let result = if args.json {
        paddock.execute_with(msg).await
    } else {
        stream_to_terminal(&paddock, msg).await
    };
    interrupted.abort();
    let status = match result {
        Ok(r) => {
            if args.json {
                println!("{}", json_line(&r));
            } else {
                // An isolate's result value (`6*7` → 42), after the output.
                if let Some(value) = &r.value {
                    println!("{value}");
                }
                if let Some(note) = note(&r) {
                    eprintln!("paddock: {note}");
                }
            }
            exit_status(&r)
        }
        Err(e) => {
            refused(args.json, &e);
            exit_for_error(e.code)
        }
    };
    if let Err(e) = paddock.shutdown(Duration::from_secs(5)).await {
        eprintln!("paddock: shutting down failed: {e}");
    }
    Ok(status)
}

/// Runs the execution and copies its output to the terminal as it comes.
async fn stream_to_terminal(
    paddock: &Paddock,
    msg: Execute,
) -> Result<ExecResult, paddock_core::Error> {
    let mut stream = paddock.execute_stream(msg).await?;
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    let mut terminal_open = true;
    while let Some(event) = stream.next().await {
        match event {
            StreamEvent::Output(chunk) if terminal_open => {
                let written = match chunk.stream {
                    StreamKind::Stdout => match out.write_all(&chunk.data).await {
                        Ok(()) => out.flush().await,
                        Err(e) => Err(e),
                    },
                    StreamKind::Stderr => match err.write_all(&chunk.data).await {
                        Ok(()) => err.flush().await,
                        Err(e) => Err(e),
                    },
                };
                // A closed terminal (`| head`) stops the copying, not the program.
                terminal_open = written.is_ok();
            }
            StreamEvent::Output(_) => {}
            StreamEvent::Finished(result) => return *result,
        }
    }
    Err(paddock_core::Error::new(
        ErrorCode::EngineFailed,
        "the execution stream ended without a result",
    ))
}

/// A refusal: its message on stderr, and with `--json` its [`error_line`] on stdout,
/// so that a script reading stdout gets one JSON object whatever happened.
fn refused(json: bool, e: &paddock_core::Error) {
    eprintln!("paddock: {e}");
    if json {
        println!("{}", error_line(e));
    }
}

/// A refusal as one JSON line, in the HTTP API's error shape:
/// `{"error":{"code":…,"message":…}}` (with `retry_after_ms` when there is one).
pub(crate) fn error_line(e: &paddock_core::Error) -> String {
    serde_json::json!({ "error": e }).to_string()
}

/// The one-line JSON result: the result's wire form plus `timed_out`, with
/// `exit_code` and `signal` always present.
pub(crate) fn json_line(r: &ExecResult) -> String {
    r.to_wire_json().to_string()
}

fn note(r: &ExecResult) -> Option<String> {
    match &r.outcome {
        Outcome::Completed { .. } => None,
        Outcome::TimedOut => Some("timed out; the program was killed".into()),
        Outcome::Cancelled => Some("interrupted; the program was killed".into()),
        Outcome::LimitExceeded { limit } => Some(format!(
            "the {} limit was exceeded; the program was killed",
            limit.as_str()
        )),
        Outcome::Failed { error } => Some(error.to_string()),
        Outcome::Suspended { token_id } => {
            Some(format!("suspended, waiting for token `{token_id}`"))
        }
    }
}

/// The exit status for a result.
pub(crate) fn exit_status(r: &ExecResult) -> i32 {
    match &r.outcome {
        Outcome::Completed { exit_code, .. } => *exit_code,
        Outcome::TimedOut => EXIT_TIMEOUT,
        Outcome::Cancelled => 130,
        Outcome::LimitExceeded { limit } => match limit {
            LimitKind::Memory | LimitKind::Pids | LimitKind::Output => 137,
            LimitKind::Cpu => 128 + libc_sigxcpu(),
            LimitKind::FileSize => 128 + libc_sigxfsz(),
            // The program was not killed: its writes failed, and it exited (its own
            // status is in the result's warning).
            LimitKind::Disk | LimitKind::DiskFiles => 1,
        },
        Outcome::Failed { error } => exit_for_error(error.code),
        // The protocol's "waiting, not failing" status.
        Outcome::Suspended { .. } => paddock_core::protocol::SUSPEND_EXIT_CODE,
    }
}

const fn libc_sigxcpu() -> i32 {
    24
}

const fn libc_sigxfsz() -> i32 {
    25
}

fn exit_for_error(code: ErrorCode) -> i32 {
    match code {
        ErrorCode::SpawnFailed => EXIT_SPAWN,
        ErrorCode::InvalidOptions
        | ErrorCode::CapabilityNotSupported
        | ErrorCode::LevelNotSupported => 2,
        _ => EXIT_INTERNAL,
    }
}

/// `paddock run --detach`: starts the program as a background process on the server
/// and prints its execution id (the whole record with `--json`).
fn detach(args: &RunArgs, program: Program) -> Result<i32, UsageError> {
    let url = args
        .server
        .as_deref()
        .ok_or_else(|| UsageError("--detach needs --server http://HOST:PORT".into()))?;
    if args.stdin || args.engine == EngineArg::Isolate {
        return Err(UsageError(
            "--detach starts a background process: no --stdin, and not on the isolate engine"
                .into(),
        ));
    }
    let server = crate::client::Server::parse(url, args.api_key.clone()).map_err(UsageError)?;
    let argv = match program {
        Program::Command { argv } => argv,
        Program::Code { language, source } => {
            let (interp, flag) = match language {
                Language::Python => ("python3", "-c"),
                Language::Javascript => ("node", "-e"),
                Language::Shell => ("sh", "-c"),
            };
            vec![interp.to_string(), flag.to_string(), source]
        }
        other => {
            return Err(UsageError(format!(
                "--detach runs commands and code, not {:?}",
                other.kind()
            )))
        }
    };
    let fail = |e: String| {
        refused(
            args.json,
            &paddock_core::Error::new(ErrorCode::EngineFailed, e),
        );
        Ok(EXIT_INTERNAL)
    };
    let created = args.sandbox.is_none();
    let sandbox = match &args.sandbox {
        Some(id) => id.clone(),
        None => {
            let engine = match args.engine {
                EngineArg::Container => "container",
                _ => "subprocess",
            };
            let network = match args.network {
                NetworkArg::None => "none",
                NetworkArg::Host => "unrestricted",
            };
            let mut limits = serde_json::Map::new();
            if let Some(m) = args.memory {
                limits.insert("memory_bytes".into(), m.into());
            }
            if let Some(p) = args.pids {
                limits.insert("pids".into(), p.into());
            }
            let body = serde_json::json!({"engine": engine, "network": network, "limits": limits});
            match server.json("POST", "/v1/sandboxes", Some(&body)) {
                Ok((201, v)) => match v["id"].as_str() {
                    Some(id) => id.to_string(),
                    None => return fail(format!("the server opened a sandbox without an id: {v}")),
                },
                Ok((status, v)) if args.json && v.get("error").is_some() => {
                    // The server's own error body, as it gave it.
                    eprintln!("paddock: {}", crate::client::error_text(status, &v));
                    println!("{v}");
                    return Ok(EXIT_INTERNAL);
                }
                Ok((status, v)) => return fail(crate::client::error_text(status, &v)),
                Err(e) => return fail(e),
            }
        }
    };
    let env: BTreeMap<String, String> = args.env.iter().cloned().collect();
    let body = serde_json::json!({"argv": argv, "env": env});
    let info = match server.json(
        "POST",
        &format!("/v1/sandboxes/{sandbox}/processes"),
        Some(&body),
    ) {
        Ok((201, v)) => v,
        Ok((status, v)) => {
            eprintln!("paddock: {}", crate::client::error_text(status, &v));
            if args.json && v.get("error").is_some() {
                // The server's own error body.
                println!("{v}");
            }
            if created {
                // Nothing runs in it: it would only take a pool slot.
                let _ = server.json("DELETE", &format!("/v1/sandboxes/{sandbox}"), None);
            }
            let code = v["error"]["code"]
                .as_str()
                .and_then(|c| serde_json::from_value::<ErrorCode>(c.into()).ok())
                .map_or(EXIT_INTERNAL, exit_for_error);
            return Ok(code);
        }
        Err(e) => {
            if created {
                let _ = server.json("DELETE", &format!("/v1/sandboxes/{sandbox}"), None);
            }
            return fail(e);
        }
    };
    let process = info["id"].as_str().unwrap_or_default();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "execution_id": info["execution_id"],
                "sandbox": sandbox,
                "process": process,
                "pid": info["pid"],
            })
        );
    } else {
        println!("{}", info["execution_id"].as_str().unwrap_or_default());
        eprintln!(
            "paddock: process {process} runs in sandbox {sandbox}; attach at ws://{}/v1/sandboxes/{sandbox}/processes/{process}/attach; it ends with the sandbox (DELETE /v1/sandboxes/{sandbox})",
            server.authority()
        );
    }
    Ok(0)
}

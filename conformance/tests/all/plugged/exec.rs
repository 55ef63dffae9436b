//! One execution of the `ns-shell` engine.
//!
//! ```text
//! unshare --pid --fork --kill-child --mount-proc --net --ipc --uts -- sh -c 'echo ready; read _'
//!   └─ pid 1 of the new pid namespace: waits on a pipe only the engine holds
//! nsenter --mount=/proc/U/ns/mnt --pid=/proc/U/ns/pid_for_children … --wd=CWD -- ARGV
//!   └─ the program: pid 2, a child of `nsenter`, which stays in the host's namespace
//! ```
//!
//! The program is not pid 1 on purpose: the kernel drops every signal a namespace's
//! init sends itself (or gets from inside) without a handler, so `kill -KILL $$` would
//! do nothing. `nsenter` waits for the program and ends the same way it did (the same
//! exit code, or the same signal, which it sends itself in the host's namespace).
//!
//! When the program ends, or the deadline, a cancel or destroy ends it, the engine
//! closes the init's pipe: the init exits, and the kernel kills every process left in
//! the namespace before `unshare` sees it exit. That is how the whole tree dies, and
//! how background processes are reaped.

use std::ffi::OsString;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use paddock_core::{
    unix_ms, CancelToken, Error, ErrorCode, ExecRequest, ExecResult, Outcome, OutputSink, Program,
    Result, StreamKind, Timings, Usage,
};
use paddock_engines::capture::{pump, Captured};
use paddock_engines::env::resolve_program;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;
use tokio::time::Instant;

use super::engine::{NsSandbox, Shared, NAME};

/// The namespaces every execution gets, as `unshare` options.
pub(super) const NS_FLAGS: &[&str] = &[
    "--pid",
    "--fork",
    "--kill-child",
    "--mount-proc",
    "--net",
    "--ipc",
    "--uts",
];
/// What the namespace's init runs: it says it is up, then waits for end-of-file.
const INIT_SCRIPT: &str = "echo ready; read _";
/// The namespace files `nsenter` joins, by option, under `/proc/<unshare>/ns/`.
/// `unshare` made them for itself, except the pid namespace, which is its children's.
const JOIN: &[(&str, &str)] = &[
    ("--mount", "mnt"),
    ("--pid", "pid_for_children"),
    ("--net", "net"),
    ("--ipc", "ipc"),
    ("--uts", "uts"),
];
/// How long the namespace's init may take to come up.
const INIT_WITHIN: Duration = Duration::from_secs(10);
/// How long ending the namespace may take before `unshare` is killed instead.
const END_WITHIN: Duration = Duration::from_secs(2);
/// How long output pipes may stay open once everything in the namespace is gone.
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// The namespaces of one execution, held open by their init.
struct Namespaces {
    /// `unshare`, the init's parent, in the host's namespaces.
    unshare: Child,
    /// The init's stdin: closing it ends the namespace.
    hold: Option<ChildStdin>,
    /// `unshare`'s pid, whose `/proc/<pid>/ns/` files name the namespaces.
    pid: u32,
}

impl Namespaces {
    /// Makes the namespaces and waits until their init is up (and `/proc` mounted).
    async fn open(shared: &Shared) -> Result<Namespaces> {
        let mut unshare = Command::new(&shared.tools.unshare)
            .args(NS_FLAGS)
            .arg("--")
            .arg(&shared.tools.sh)
            .args(["-c", INIT_SCRIPT])
            .env_clear()
            .envs(shared.base_env.get_key_value("PATH"))
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::engine_io("starting `unshare`", e))?;
        let pid = unshare.id().unwrap_or_default();
        let hold = unshare.stdin.take();
        let stdout = unshare.stdout.take();
        let ready = async {
            let mut line = String::new();
            if let Some(out) = stdout {
                BufReader::new(out).read_line(&mut line).await.ok()?;
            }
            (line == "ready\n").then_some(())
        };
        if tokio::time::timeout(INIT_WITHIN, ready).await == Ok(Some(())) && pid != 0 {
            return Ok(Namespaces { unshare, hold, pid });
        }
        let _ = unshare.start_kill();
        let status = unshare.wait().await;
        let mut why = String::new();
        if let Some(mut err) = unshare.stderr.take() {
            let _ = err.read_to_string(&mut why).await;
        }
        Err(Error::new(
            ErrorCode::EngineFailed,
            format!(
                "the execution's namespaces did not come up within {INIT_WITHIN:?} (unshare: {status:?}): {}",
                why.trim()
            ),
        ))
    }

    /// `nsenter`'s options that join these namespaces.
    fn join_args(&self) -> impl Iterator<Item = String> + '_ {
        JOIN.iter()
            .map(|(option, file)| format!("{option}=/proc/{}/ns/{file}", self.pid))
    }

    /// Ends the namespaces: once this returns, nothing started in them runs.
    async fn end(mut self) {
        drop(self.hold.take());
        if tokio::time::timeout(END_WITHIN, self.unshare.wait())
            .await
            .is_err()
        {
            // SIGKILL to `unshare`; `--kill-child` passes it on to the init.
            let _ = self.unshare.kill().await;
        }
    }
}

/// Why the wait for the program ended.
#[derive(Debug)]
enum Ending {
    Exited(ExitStatus),
    Deadline,
    Cancelled,
    Destroyed,
    /// The wait itself failed; the program was killed.
    Lost(std::io::Error),
}

/// Counts a running execution for [`NsSandbox::status`].
struct Active<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Active<'a> {
    fn enter(count: &'a std::sync::atomic::AtomicUsize) -> Active<'a> {
        count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Active(count)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl NsSandbox {
    pub(super) async fn run(
        &self,
        request: ExecRequest,
        sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        let queued_at_ms = unix_ms();
        let _op = self.enter()?;
        request.validate()?;
        self.shared
            .caps
            .check_program(&NAME, request.program.kind())?;
        let Program::Command { argv } = &request.program else {
            unreachable!("check_program admits commands only");
        };
        let limits = request.limits.or(&self.limits);
        let root = self.workdir.root();
        let cwd = match &request.cwd {
            Some(dir) => self.workdir.resolve_dir(dir)?,
            None => root.to_path_buf(),
        };
        let mut env = self.shared.base_env.clone();
        for (name, dir) in [("HOME", root), ("TMPDIR", root), ("PWD", &cwd)] {
            env.insert(name.into(), dir.to_string_lossy().into_owned());
        }
        env.extend(request.env.clone());
        let path = env.get("PATH").cloned().unwrap_or_default();
        if resolve_program(&argv[0], &path, &cwd).is_none() {
            return Err(Error::new(
                ErrorCode::SpawnFailed,
                format!(
                    "`{}` was not found or is not executable (PATH={path})",
                    argv[0]
                ),
            ));
        }

        let _active = Active::enter(&self.active);
        if cancel.is_cancelled() || self.kill_switch.is_cancelled() {
            return Ok(self.result(&request, Outcome::Cancelled, queued_at_ms));
        }
        let ns = Namespaces::open(&self.shared).await?;
        let mut wd = OsString::from("--wd=");
        wd.push(&cwd);
        let spawned = Command::new(&self.shared.tools.nsenter)
            .args(ns.join_args())
            .arg(wd)
            .arg("--")
            .args(argv)
            .env_clear()
            .envs(&env)
            .current_dir(&cwd)
            .stdin(match request.stdin {
                Some(_) => Stdio::piped(),
                None => Stdio::null(),
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut program = match spawned {
            Ok(child) => child,
            Err(e) => {
                ns.end().await;
                return Err(Error::new(
                    ErrorCode::SpawnFailed,
                    format!("starting `nsenter` failed: {e}"),
                ));
            }
        };
        let started = Instant::now();
        let started_at_ms = unix_ms();
        let pipes = (
            program.stdout.take().map(|p| p.into_owned_fd()),
            program.stderr.take().map(|p| p.into_owned_fd()),
        );
        let (Some(Ok(out)), Some(Ok(err))) = pipes else {
            let _ = program.kill().await;
            ns.end().await;
            return Err(Error::new(
                ErrorCode::EngineFailed,
                "the program's output pipes could not be taken",
            ));
        };
        let stdin = program.stdin.take();

        let cap = limits.max_output_bytes.unwrap_or(u64::MAX);
        let (stop_tx, stop_rx) = watch::channel(None::<Instant>);
        let stdout = pump(out, StreamKind::Stdout, cap, sink, stop_rx.clone());
        let stderr = pump(err, StreamKind::Stderr, cap, sink, stop_rx.clone());
        let feed = feed(stdin, request.stdin.as_deref(), stop_rx);
        let deadline = limits.timeout().map(|t| started + t);

        let waiter = async {
            let ending = tokio::select! {
                biased;
                _ = cancel.cancelled() => Ending::Cancelled,
                _ = self.kill_switch.cancelled() => Ending::Destroyed,
                _ = sleep_until(deadline) => Ending::Deadline,
                waited = program.wait() => match waited {
                    Ok(status) => Ending::Exited(status),
                    Err(e) => Ending::Lost(e),
                },
            };
            // Whatever the program left behind dies with the namespace.
            ns.end().await;
            if !matches!(ending, Ending::Exited(_)) {
                // The program died with the namespace; `nsenter` follows at once.
                if tokio::time::timeout(END_WITHIN, program.wait())
                    .await
                    .is_err()
                {
                    let _ = program.kill().await;
                }
            }
            let _ = stop_tx.send(Some(Instant::now() + DRAIN_GRACE));
            ending
        };
        let (ending, out, err, ()) = tokio::join!(waiter, stdout, stderr, feed);
        let wall_ms = started.elapsed().as_millis() as u64;

        let mut outcome = match ending {
            Ending::Cancelled | Ending::Destroyed => Outcome::Cancelled,
            Ending::Deadline => Outcome::TimedOut,
            Ending::Exited(status) => completed(status),
            Ending::Lost(e) => Outcome::Failed {
                error: Error::engine_io("waiting for the program", e),
            },
        };
        // Exactly one terminal state: a cancel that won the race is what happened.
        if outcome != Outcome::Cancelled && !cancel.finish() {
            outcome = Outcome::Cancelled;
        }
        let (out, err) = (out.unwrap_or_default(), err.unwrap_or_default());
        let mut result = self.result(&request, outcome, queued_at_ms);
        result.stdout_truncated = out.truncated;
        result.stderr_truncated = err.truncated;
        result.stdout = Captured::into_string(out);
        result.stderr = Captured::into_string(err);
        result.usage.wall_ms = wall_ms;
        result.timings.started_at_ms = started_at_ms;
        Ok(result)
    }

    /// A result of this sandbox with `outcome`, no output, finished now.
    fn result(&self, request: &ExecRequest, outcome: Outcome, queued_at_ms: u64) -> ExecResult {
        let now = unix_ms();
        ExecResult {
            timings: Timings {
                queued_at_ms,
                started_at_ms: now,
                finished_at_ms: now,
            },
            usage: Usage::default(),
            ..ExecResult::empty(request.id.clone(), outcome, NAME, self.id.clone())
        }
    }
}

/// The program's exit as an outcome: its code, or 128+N and the signal N.
fn completed(status: ExitStatus) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(signal), _) => Outcome::Completed {
            exit_code: 128 + signal,
            signal: Some(signal),
        },
        (None, code) => Outcome::Completed {
            exit_code: code.unwrap_or(-1),
            signal: None,
        },
    }
}

/// Writes the request's stdin and closes it. A program that exits without reading
/// closes the pipe, which is not an error; a reader that never reads stops mattering
/// when the namespace is gone (`stop` is set).
async fn feed(
    pipe: Option<ChildStdin>,
    data: Option<&str>,
    mut stop: watch::Receiver<Option<Instant>>,
) {
    let (Some(mut pipe), Some(data)) = (pipe, data) else {
        return;
    };
    tokio::select! {
        _ = pipe.write_all(data.as_bytes()) => {}
        _ = stop.wait_for(Option::is_some) => {}
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

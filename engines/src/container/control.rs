//! The host's end of a warm container agent's control channel: background processes
//! and terminals inside the container (see the `paddock_agent` crate for the agent's
//! end and `docs/protocol.md` for the messages).
//!
//! The channel is a `SOCK_SEQPACKET` pair; the agent gets its end as fd 3 through the
//! runtime's `--preserve-fds`. One reader task per channel routes the agent's answers:
//! `started`/`failed` to the caller waiting on a spawn, `exited` to the process's
//! watcher. When the channel ends (the container is gone), every process still
//! running is reported killed.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use paddock_agent::control::{ControlFrame, ControlMessage, CONTROL_MESSAGE_MAX};
use paddock_agent::files::{FileAnswer, FileOp};
use paddock_core::interactive::ProcessExit;
use paddock_core::{Error, ErrorCode, Result};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, Interest};
use tokio::sync::oneshot;

use crate::host::sys;
use crate::interactive::Signaller;

/// How long a spawn waits for the agent's answer.
const SPAWN_PATIENCE: Duration = Duration::from_secs(10);
/// How long a file operation waits for the agent's whole answer.
const FILES_PATIENCE: Duration = Duration::from_secs(30);

/// The agent's answer to a file operation: its one JSON line.
pub(crate) fn parse_answer(bytes: &[u8]) -> Result<FileAnswer> {
    let line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    if line.is_empty() {
        return Err(Error::new(
            ErrorCode::EngineFailed,
            "the container's agent closed a file operation without an answer",
        ));
    }
    let answer: FileAnswer = serde_json::from_slice(line).map_err(|e| {
        Error::new(
            ErrorCode::EngineFailed,
            format!("the container's agent answered a file operation with something else ({e})"),
        )
    })?;
    match answer.error {
        Some(e) => Err(e),
        None => Ok(answer),
    }
}

/// What a started process gets back: its pid in the container, a terminal's master,
/// and where its exit will arrive.
pub(crate) struct Started {
    pub(crate) master: Option<OwnedFd>,
    pub(crate) exit: oneshot::Receiver<ProcessExit>,
}

type StartReply = std::result::Result<(libc::pid_t, Option<OwnedFd>), String>;

#[derive(Debug, Default)]
struct Routes {
    starting: HashMap<String, oneshot::Sender<StartReply>>,
    running: HashMap<String, oneshot::Sender<ProcessExit>>,
    /// Sweeps and resets under way, by id: their answer (`swept`, `reset_done`).
    asked: HashMap<String, oneshot::Sender<ControlMessage>>,
    closed: bool,
}

/// The host's end of one agent's control channel.
#[derive(Debug)]
pub(crate) struct AgentControl {
    /// Until first use (which happens inside the runtime): the plain descriptor.
    fd: parking_lot::Mutex<Option<OwnedFd>>,
    live: OnceLock<Arc<AsyncFd<OwnedFd>>>,
    routes: Arc<parking_lot::Mutex<Routes>>,
    /// The runtime its socket is watched on, from first use.
    runtime: OnceLock<Arc<ControlRuntime>>,
}

impl AgentControl {
    /// The host's end of a channel whose other end the agent has as fd 3.
    pub(crate) fn new(fd: OwnedFd) -> Arc<AgentControl> {
        Arc::new(AgentControl {
            fd: parking_lot::Mutex::new(Some(fd)),
            live: OnceLock::new(),
            routes: Default::default(),
            runtime: OnceLock::new(),
        })
    }

    /// The registered socket, with its reader task started on first use.
    fn socket(&self) -> Result<Arc<AsyncFd<OwnedFd>>> {
        if let Some(s) = self.live.get() {
            return Ok(s.clone());
        }
        let mut fd = self.fd.lock();
        if let Some(s) = self.live.get() {
            return Ok(s.clone());
        }
        let raw = fd.take().ok_or_else(gone)?;
        sys::set_nonblocking(raw.as_raw_fd());
        // The socket is watched, and its answers routed, on the channels' own
        // runtime: a caller's runtime may be an HTTP worker's or an actor's, busy or
        // gone when the agent answers.
        let rt = self.runtime.get_or_init(control_runtime).clone();
        let handle = rt.handle();
        let _in = handle.enter();
        let sock = Arc::new(
            sys::async_fd(raw, Interest::READABLE | Interest::WRITABLE)
                .map_err(|e| Error::engine_io("watching the agent's control channel", e))?,
        );
        handle.spawn(read_answers(sock.clone(), self.routes.clone()));
        let _ = self.live.set(sock.clone());
        Ok(sock)
    }

    /// Starts a process in the container. Without `tty`, `fds` are its stdin, stdout
    /// and stderr (the host's ends stay with the caller).
    pub(crate) async fn spawn(
        &self,
        id: &str,
        argv: Vec<String>,
        env: std::collections::BTreeMap<String, String>,
        cwd: String,
        tty: Option<(u16, u16)>,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Started> {
        let message = ControlMessage::Spawn {
            id: id.to_string(),
            argv,
            env,
            cwd,
            tty,
            runner: fds.len() == 4,
        };
        let bytes = ControlFrame::encode(&message);
        if bytes.len() > CONTROL_MESSAGE_MAX {
            return Err(Error::invalid_options(
                "argv",
                format!(
                    "the command and its environment take {} bytes; a container process takes at most {CONTROL_MESSAGE_MAX}",
                    bytes.len()
                ),
            ));
        }
        let sock = self.socket()?;
        let (started_tx, started_rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        {
            let mut routes = self.routes.lock();
            if routes.closed {
                return Err(gone());
            }
            routes.starting.insert(id.to_string(), started_tx);
            routes.running.insert(id.to_string(), exit_tx);
        }
        let forget = || {
            let mut routes = self.routes.lock();
            routes.starting.remove(id);
            routes.running.remove(id);
        };
        match tokio::time::timeout(SPAWN_PATIENCE, send(&sock, &bytes, fds)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                forget();
                return Err(e);
            }
            Err(_) => {
                forget();
                return Err(unresponsive());
            }
        }
        match tokio::time::timeout(SPAWN_PATIENCE, started_rx).await {
            Ok(Ok(Ok((_pid, master)))) => Ok(Started {
                master,
                exit: exit_rx,
            }),
            Ok(Ok(Err(message))) => {
                forget();
                Err(Error::new(ErrorCode::SpawnFailed, message))
            }
            Ok(Err(_)) => Err(gone()),
            Err(_) => {
                forget();
                // The agent may still get to the spawn: the kill follows it in order,
                // so nothing starts that no handle tracks.
                self.signal(id, libc::SIGKILL);
                Err(unresponsive())
            }
        }
    }

    /// Starts a warm runner in the container: `fds` are its stdin, stdout, stderr
    /// and fd 3. Its pidfd comes back (as `master`), for the host to watch and
    /// signal it; the agent reaps it.
    pub(crate) async fn spawn_runner(
        &self,
        id: &str,
        argv: Vec<String>,
        env: std::collections::BTreeMap<String, String>,
        cwd: String,
        fds: &[BorrowedFd<'_>; 4],
    ) -> Result<OwnedFd> {
        let started = self.spawn(id, argv, env, cwd, None, fds).await?;
        match started.master {
            Some(pidfd) => Ok(pidfd),
            None => {
                self.signal(id, libc::SIGKILL);
                Err(Error::new(
                    ErrorCode::SpawnFailed,
                    "the container's agent started the runner but sent no pidfd for it",
                ))
            }
        }
    }

    /// Asks the agent to kill what a runner's turn left behind (see
    /// `ControlMessage::Sweep`) and waits until it has; how many processes it
    /// killed.
    pub(crate) async fn sweep(&self, id: &str) -> Result<u32> {
        let message = ControlMessage::Sweep { id: id.to_string() };
        match self.ask(id, &message, "a sweep").await? {
            ControlMessage::Swept { killed, .. } => Ok(killed),
            other => Err(unexpected(&other)),
        }
    }

    /// Asks the agent to reset the container in place (see `ControlMessage::Reset`)
    /// and waits, up to [`SPAWN_PATIENCE`], for its answer: `Ok` only when the agent
    /// reports everything reset. An agent that answers `ok: false`, does not answer
    /// in time or is gone is an error: the container must then be replaced.
    pub(crate) async fn reset(&self, id: &str) -> Result<()> {
        let message = ControlMessage::Reset { id: id.to_string() };
        match self.ask(id, &message, "a reset").await? {
            ControlMessage::ResetDone { ok: true, .. } => Ok(()),
            ControlMessage::ResetDone { message, .. } => Err(Error::new(
                ErrorCode::EngineFailed,
                format!("the container's agent could not reset the container: {message}"),
            )),
            other => Err(unexpected(&other)),
        }
    }

    /// Sends `message` with the write end of a fresh pipe attached, and answers its
    /// read end (the agent writes its answer there: see `paddock_agent::files`).
    async fn ask_through_pipe(&self, message: &ControlMessage) -> Result<OwnedFd> {
        let sock = self.socket()?;
        let (read, write) = std::io::pipe()
            .map_err(|e| Error::engine_io("making a pipe for the agent's answer", e))?;
        let (read, write): (OwnedFd, OwnedFd) = (read.into(), write.into());
        let bytes = ControlFrame::encode(message);
        if bytes.len() > CONTROL_MESSAGE_MAX {
            return Err(Error::invalid_options(
                "path",
                format!(
                    "the request takes {} bytes; at most {CONTROL_MESSAGE_MAX}",
                    bytes.len()
                ),
            ));
        }
        tokio::time::timeout(SPAWN_PATIENCE, send(&sock, &bytes, &[write.as_fd()]))
            .await
            .map_err(|_| {
                Error::new(
                    ErrorCode::EngineFailed,
                    "the container's agent did not take a file operation in time",
                )
            })??;
        // The agent has its copy: ours goes, so the pipe ends when the agent's does.
        drop(write);
        Ok(read)
    }

    /// Has the agent do a file operation in the container (see
    /// `paddock_agent::files`), and answers what it found.
    pub(crate) async fn files(&self, op: FileOp) -> Result<FileAnswer> {
        let message = ControlMessage::Files {
            id: uuid::Uuid::new_v4().to_string(),
            op,
        };
        let read = self.ask_through_pipe(&message).await?;
        let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(read)
            .map_err(|e| Error::engine_io("reading the agent's answer", e))?;
        let mut bytes = Vec::new();
        tokio::time::timeout(FILES_PATIENCE, rx.read_to_end(&mut bytes))
            .await
            .map_err(|_| {
                Error::new(
                    ErrorCode::EngineFailed,
                    format!("the container's agent did not answer a file operation within {FILES_PATIENCE:?}"),
                )
            })?
            .map_err(|e| Error::engine_io("reading the agent's answer", e))?;
        parse_answer(&bytes)
    }

    /// Has the agent watch directory `path` in the container; its events come, one
    /// JSON line each, from the pipe answered (after the answer's own line).
    pub(crate) async fn watch(
        &self,
        path: &str,
        recursive: bool,
    ) -> Result<(tokio::runtime::Handle, OwnedFd)> {
        let message = ControlMessage::Watch {
            id: uuid::Uuid::new_v4().to_string(),
            path: path.to_string(),
            recursive,
        };
        let read = self.ask_through_pipe(&message).await?;
        let handle = self.runtime.get().ok_or_else(gone)?.handle().clone();
        Ok((handle, read))
    }

    /// Sends `message` (a request named `id`) and waits, up to [`SPAWN_PATIENCE`],
    /// for the agent's answer to it.
    async fn ask(&self, id: &str, message: &ControlMessage, what: &str) -> Result<ControlMessage> {
        let sock = self.socket()?;
        let (tx, rx) = oneshot::channel();
        {
            let mut routes = self.routes.lock();
            if routes.closed {
                return Err(gone());
            }
            routes.asked.insert(id.to_string(), tx);
        }
        let bytes = ControlFrame::encode(message);
        let asked = tokio::time::timeout(SPAWN_PATIENCE, async {
            send(&sock, &bytes, &[]).await?;
            rx.await.map_err(|_| gone())
        })
        .await;
        match asked {
            Ok(answer) => answer,
            Err(_) => {
                self.routes.lock().asked.remove(id);
                Err(Error::new(
                    ErrorCode::EngineFailed,
                    format!(
                        "the container's agent did not finish {what} within {SPAWN_PATIENCE:?}"
                    ),
                ))
            }
        }
    }

    /// Asks the agent to signal process `id`'s group. Sent at once when the socket
    /// has room; otherwise (the agent busy streaming a turn's output) by a task that
    /// waits for room, so that a kill is never dropped.
    fn signal(&self, id: &str, signal: i32) {
        let Some(sock) = self.live.get() else {
            return;
        };
        let bytes = ControlFrame::encode(&ControlMessage::Signal {
            id: id.to_string(),
            signal,
        });
        match sys::send_with_fds(sock.get_ref(), &bytes, &[]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let sock = sock.clone();
                let Some(rt) = self.runtime.get() else {
                    return;
                };
                rt.handle().spawn(async move {
                    let _ = tokio::time::timeout(SPAWN_PATIENCE, send(&sock, &bytes, &[])).await;
                });
            }
            // Sent, or the agent is gone and there is nothing left to signal.
            _ => {}
        }
    }
}

/// The runtime the agents' control channels are watched on: one thread of its own,
/// shared by every channel in use, and shut down when the last of them goes (so that
/// an embedder that stops Paddock keeps no thread or descriptor of it).
#[derive(Debug)]
struct ControlRuntime(Option<tokio::runtime::Runtime>);

impl ControlRuntime {
    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("held until dropped").handle()
    }
}

impl Drop for ControlRuntime {
    fn drop(&mut self) {
        // Its tasks (the channels' readers) are dropped with it; the last channel
        // may go inside an async context, where only this way of stopping is allowed.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The shared control runtime, started when no channel holds it.
fn control_runtime() -> Arc<ControlRuntime> {
    static RT: parking_lot::Mutex<std::sync::Weak<ControlRuntime>> =
        parking_lot::Mutex::new(std::sync::Weak::new());
    let mut shared = RT.lock();
    if let Some(rt) = shared.upgrade() {
        return rt;
    }
    let rt = Arc::new(ControlRuntime(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("paddock-agent-control")
            .enable_all()
            .build()
            .expect("the agent control runtime starts"),
    )));
    *shared = Arc::downgrade(&rt);
    rt
}

fn unresponsive() -> Error {
    Error::new(
        ErrorCode::EngineFailed,
        format!("the container's agent did not answer a spawn within {SPAWN_PATIENCE:?}; retry"),
    )
}

/// An answer of the wrong kind to a sweep or a reset.
fn unexpected(answer: &ControlMessage) -> Error {
    Error::new(
        ErrorCode::EngineFailed,
        format!("the container's agent answered with {answer:?}"),
    )
}

fn gone() -> Error {
    Error::new(
        ErrorCode::EngineFailed,
        "the sandbox's warm container is gone; retry, a fresh one is starting",
    )
}

async fn send(sock: &AsyncFd<OwnedFd>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    loop {
        let mut guard = sock
            .writable()
            .await
            .map_err(|e| Error::engine_io("writing to the agent's control channel", e))?;
        match guard.try_io(|s| sys::send_with_fds(s, bytes, fds)) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => {
                return Err(Error::engine_io(
                    "writing to the agent's control channel",
                    e,
                ))
            }
            Err(_would_block) => continue,
        }
    }
}

/// Routes the agent's answers until the channel ends.
async fn read_answers(sock: Arc<AsyncFd<OwnedFd>>, routes: Arc<parking_lot::Mutex<Routes>>) {
    let mut buf = vec![0u8; CONTROL_MESSAGE_MAX];
    loop {
        let Ok(mut guard) = sock.readable().await else {
            break;
        };
        let (n, mut fds) = match guard.try_io(|s| sys::recv_with_fds(s, &mut buf)) {
            Ok(Ok((0, _))) | Ok(Err(_)) => break,
            Ok(Ok(r)) => r,
            Err(_would_block) => continue,
        };
        let message = match ControlFrame::decode(&buf[..n]) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "a control message from a container agent does not parse");
                continue;
            }
        };
        let mut r = routes.lock();
        match message {
            ControlMessage::Started { id, pid } => {
                if let Some(tx) = r.starting.remove(&id) {
                    let _ = tx.send(Ok((pid, fds.pop())));
                }
            }
            ControlMessage::Failed { id, message } => {
                r.running.remove(&id);
                if let Some(tx) = r.starting.remove(&id) {
                    let _ = tx.send(Err(message));
                }
            }
            ControlMessage::Exited {
                id,
                exit_code,
                signal,
            } => {
                if let Some(tx) = r.running.remove(&id) {
                    let _ = tx.send(ProcessExit { exit_code, signal });
                }
            }
            ControlMessage::Swept { ref id, .. } | ControlMessage::ResetDone { ref id, .. } => {
                if let Some(tx) = r.asked.remove(id) {
                    let _ = tx.send(message);
                }
            }
            other => {
                tracing::warn!(message = ?other, "a container agent sent a host-side control message");
            }
        }
    }
    // The container is gone: processes still running died with it (their channels
    // drop, which their watchers read as a kill), and spawns in flight fail.
    let mut r = routes.lock();
    r.closed = true;
    r.starting.clear();
    r.running.clear();
    r.asked.clear();
}

/// Signals a process in a container through its agent.
#[derive(Debug)]
pub(crate) struct RemoteLeader {
    pub(crate) control: Arc<AgentControl>,
    pub(crate) id: String,
}

impl Signaller for RemoteLeader {
    fn signal(&self, signal: libc::c_int) {
        self.control.signal(&self.id, signal);
    }
}

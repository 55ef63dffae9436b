//! `paddock-agent`: pid 1 of a warm container.
//!
//! It speaks protocol v1 (`docs/protocol.md`) on stdin and stdout. Each `invoke` runs
//! one command: `input` is `{"argv": [...], "env": {"K": "V", …}, "cwd": "/…",
//! "stdin": "…" | null}`. The command runs in its own process group with exactly that
//! environment; its stdout and stderr stream back as `log` frames as they are
//! written, and the turn ends with an `output` frame
//! `{"exit_code": n, "signal": s | null}` (`exit_code` is `128 + s` when a signal
//! killed it). A command that cannot be started ends the turn with an `error` frame
//! of code `SPAWN_FAILED`. A `cancel` frame for the turn in progress kills the
//! command's group and ends the turn with an `error` frame of code `CANCELLED`.
//!
//! When the command has exited, whatever it left running (a background child, a
//! daemon that left its group) is killed: every process of the container except the
//! agent — only when the agent is pid 1 of its own pid namespace. As pid 1 the agent
//! also reaps the orphans the kernel hands it.
//!
//! **Background processes.** When the host passes a `SOCK_SEQPACKET` socket as fd 3,
//! the agent also serves the control channel (`docs/protocol.md`, "The container
//! agent's control channel"): `spawn` starts a process in a session of its own, with
//! the three pipe ends passed along or on a pseudo-terminal the agent opens inside
//! (its master goes back to the host with `started`); `signal` signals its process
//! group; `exited` reports its end, after everything left in its session was killed.
//! Such processes outlive turns: the cleanup after a turn spares the sessions of
//! background processes still running (a process that leaves its session is a
//! leftover like any other).
//!
//! One thread: a `poll` over the host's frames, the control channel, the command's
//! two output pipes, its pidfd and the pidfds of background processes.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};

use paddock_core::protocol::{encode, Frame, FrameDecoder};
use paddock_core::StreamKind;
use serde_json::{json, Value};

use crate::host::{spawn, sys};

/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

fn send(frame: &Frame) {
    let bytes = encode(frame);
    let mut out = std::io::stdout().lock();
    // A host that went away ends the agent through stdin's EOF.
    let _ = out.write_all(&bytes);
    let _ = out.flush();
}

/// The host's side of the conversation: frames read from stdin.
struct Host {
    decoder: FrameDecoder,
    queued: VecDeque<Frame>,
    closed: bool,
}

impl Host {
    /// Reads what stdin has (once) and queues the frames in it.
    fn read(&mut self) {
        let mut buf = [0u8; CHUNK];
        let n = match sys::read(std::io::stdin(), &mut buf) {
            Ok(0) => {
                self.closed = true;
                return;
            }
            Ok(n) => n,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    self.closed = true;
                }
                return;
            }
        };
        for item in self.decoder.decode(&buf[..n]) {
            match item {
                Ok(frame) => self.queued.push_back(frame),
                Err(e) => eprintln!("paddock-agent: ignoring a line that is not a frame: {e}"),
            }
        }
    }
}

/// Runs the agent until stdin closes; returns the process exit code.
pub fn main() -> i32 {
    let mut agent = Agent {
        host: Host {
            decoder: FrameDecoder::new(),
            queued: VecDeque::new(),
            closed: false,
        },
        control: control_channel(),
        background: Vec::new(),
        sigchld: child_signals(),
        in_turn: false,
    };
    loop {
        while let Some(frame) = agent.host.queued.pop_front() {
            if let Frame::Invoke { id, input, .. } = frame {
                agent.run_turn(&id, &input);
                agent.reap();
            }
            // Anything else with no turn running (a late cancel) has nothing to do.
        }
        if agent.host.closed {
            agent.kill_everything_else(true);
            return 0;
        }
        agent.idle();
    }
}

/// fd 3 when the host passed a `SOCK_SEQPACKET` socket there: the control channel
/// (close-on-exec, so no command inherits it).
fn control_channel() -> Option<OwnedFd> {
    sys::take_inherited_control_socket()
}

/// A descriptor that reads SIGCHLD (blocked, so it is delivered only there): between
/// turns the agent reaps orphans as they die, not only when the next turn ends.
/// Commands are started with it unblocked (see `spawn_unblocked`).
fn child_signals() -> Option<OwnedFd> {
    sys::signal_fd(libc::SIGCHLD).ok()
}

/// Starts `cmd` with SIGCHLD unblocked: a command inherits the agent's signal mask
/// (std does not reset it), and a shell whose SIGCHLD is blocked never sees its
/// children end (`wait` hangs). A SIGCHLD that lands in this window is lost to the
/// signalfd; what it announced is reaped at the next one or when the turn ends.
fn spawn_unblocked(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    sys::with_signal_unblocked(libc::SIGCHLD, || cmd.spawn())
}

/// A background process started through the control channel.
struct Background {
    id: String,
    /// Its pid, which is also its session and process group id.
    pid: libc::pid_t,
    pidfd: Option<OwnedFd>,
}

/// Everything the agent serves.
struct Agent {
    host: Host,
    control: Option<OwnedFd>,
    background: Vec<Background>,
    /// SIGCHLD, as a descriptor (see [`child_signals`]).
    sigchld: Option<OwnedFd>,
    /// Whether a turn runs (its command is reaped by the turn, not by [`Agent::reap`]).
    in_turn: bool,
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

impl Agent {
    /// The descriptors polled besides a turn's own: the control channel, SIGCHLD,
    /// then each background process's pidfd (-1 where there is none).
    fn extra_fds(&self) -> Vec<libc::pollfd> {
        let mut fds = vec![
            pollfd(self.control.as_ref().map_or(-1, |c| c.as_raw_fd())),
            pollfd(self.sigchld.as_ref().map_or(-1, |c| c.as_raw_fd())),
        ];
        for b in &self.background {
            fds.push(pollfd(b.pidfd.as_ref().map_or(-1, |p| p.as_raw_fd())));
        }
        fds
    }

    /// Handles what [`extra_fds`](Self::extra_fds) reported ready.
    fn service(&mut self, ready: &[libc::pollfd]) {
        if ready.get(1).is_some_and(|fd| fd.revents != 0) {
            if let Some(fd) = &self.sigchld {
                drain(fd);
            }
            // During a turn its command is the turn's to reap; everything else is
            // reaped when the turn ends.
            if !self.in_turn {
                self.reap();
            }
        }
        let exited: Vec<libc::pid_t> = ready
            .iter()
            .skip(2)
            .zip(&self.background)
            .filter(|(fd, _)| fd.revents != 0)
            .map(|(_, b)| b.pid)
            .collect();
        for pid in exited {
            self.finish_background(pid);
        }
        if ready.first().is_some_and(|fd| fd.revents != 0) {
            self.read_control();
        }
    }

    /// Waits between turns: for frames, control messages and background exits.
    fn idle(&mut self) {
        let mut fds = vec![pollfd(0)];
        fds.extend(self.extra_fds());
        if sys::poll(&mut fds, -1).is_err() {
            return;
        }
        if fds[0].revents != 0 {
            self.host.read();
        }
        self.service(&fds[1..]);
    }

    /// Reads and handles one control message.
    fn read_control(&mut self) {
        let Some(sock) = self.control.as_ref() else {
            return;
        };
        let mut buf = vec![0u8; CONTROL_MESSAGE_MAX];
        let (n, fds) = match sys::recv_with_fds(sock, &mut buf) {
            Ok((0, _)) | Err(_) => {
                // The host closed it: no more background processes.
                self.control = None;
                return;
            }
            Ok(r) => r,
        };
        match ControlFrame::decode(&buf[..n]) {
            Ok(ControlMessage::Spawn {
                id,
                argv,
                env,
                cwd,
                tty,
            }) => self.spawn_background(id, argv, env, cwd, tty, fds),
            Ok(ControlMessage::Signal { id, signal }) => {
                if let Some(b) = self.background.iter().find(|b| b.id == id) {
                    // The group of a process not yet reaped.
                    sys::kill_group(b.pid, signal);
                }
            }
            Ok(other) => {
                eprintln!("paddock-agent: ignoring a control message for the host: {other:?}")
            }
            Err(e) => {
                eprintln!("paddock-agent: ignoring a control message that does not parse: {e}")
            }
        }
    }

    fn answer(&self, message: &ControlMessage, fd: Option<BorrowedFd<'_>>) {
        if let Some(sock) = &self.control {
            let bytes = ControlFrame::encode(message);
            let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
            let _ = sys::send_with_fds(sock, &bytes, &fds);
        }
    }

    fn spawn_background(
        &mut self,
        id: String,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: String,
        tty: Option<(u16, u16)>,
        fds: Vec<OwnedFd>,
    ) {
        let failed = |agent: &Agent, message: String| {
            agent.answer(
                &ControlMessage::Failed {
                    id: id.clone(),
                    message,
                },
                None,
            );
        };
        if argv.is_empty() || self.background.iter().any(|b| b.id == id) {
            return failed(self, "spawn needs a fresh id and a non-empty argv".into());
        }
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(&env)
            .current_dir(&cwd);
        let master = match tty {
            None => {
                let [stdin, stdout, stderr]: [OwnedFd; 3] = match fds.try_into() {
                    Ok(f) => f,
                    Err(_) => {
                        return failed(self, "spawn without tty needs three descriptors".into())
                    }
                };
                cmd.stdin(stdin).stdout(stdout).stderr(stderr);
                None
            }
            Some((rows, cols)) => {
                match crate::host::pty::open(paddock_core::TerminalSize { rows, cols }) {
                    Ok((master, slave)) => {
                        let copies = (slave.try_clone(), slave.try_clone());
                        let (Ok(a), Ok(b)) = copies else {
                            return failed(self, "cannot copy the terminal's descriptor".into());
                        };
                        cmd.stdin(a).stdout(b).stderr(slave);
                        Some(master)
                    }
                    Err(e) => return failed(self, format!("opening a terminal failed: {e}")),
                }
            }
        };
        spawn::in_new_session(&mut cmd, master.is_some());
        let spawned = spawn_unblocked(&mut cmd);
        // The child's copies of the descriptors go with the command.
        drop(cmd);
        match spawned {
            Ok(child) => {
                let pid = child.id() as libc::pid_t;
                self.background.push(Background {
                    id: id.clone(),
                    pid,
                    pidfd: sys::pidfd_open(pid).ok(),
                });
                self.answer(
                    &ControlMessage::Started { id, pid },
                    master.as_ref().map(|m| m.as_fd()),
                );
            }
            Err(e) => failed(self, format!("starting `{}` failed: {e}", argv[0])),
        }
    }

    /// A background process's leader has exited (it is a zombie, or was just found
    /// as one): everything left in its session dies, it is reaped, the host is told.
    fn finish_background(&mut self, pid: libc::pid_t) {
        let Some(at) = self.background.iter().position(|b| b.pid == pid) else {
            return;
        };
        // The unreaped leader keeps its pid, so the session id names only its own.
        kill_session(pid);
        // Our own child, which has exited.
        let status = sys::reap(pid);
        let b = self.background.remove(at);
        let (exit_code, signal) = match status {
            Ok(sys::ExitStatus { code: Some(c), .. }) => (c, None),
            Ok(sys::ExitStatus {
                signal: Some(s), ..
            }) => (128 + s, Some(s)),
            _ => (-1, None),
        };
        self.answer(
            &ControlMessage::Exited {
                id: b.id,
                exit_code,
                signal,
            },
            None,
        );
    }

    /// Reaps every exited child without waiting (a background leader is finished
    /// properly); the error that ended it (`ECHILD`: no child at all), `None` when
    /// children are still running.
    fn reap(&mut self) -> Option<i32> {
        loop {
            let pid = match sys::exited_child() {
                Ok(Some(pid)) => pid,
                Ok(None) => return None,
                Err(e) => return e.raw_os_error(),
            };
            if self.background.iter().any(|b| b.pid == pid) {
                self.finish_background(pid);
            } else {
                sys::discard_exited(pid);
            }
        }
    }

    /// Kills every process of the container but the agent (and, unless `all`, the
    /// sessions of background processes) and reaps them, until none is left (at most
    /// a second: a process in uninterruptible sleep dies when it wakes). Only as pid
    /// 1 of its own pid namespace: anywhere else "every other process" would be the
    /// host's.
    fn kill_everything_else(&mut self, all: bool) {
        if std::process::id() != 1 {
            self.reap();
            return;
        }
        if all {
            for b in &self.background {
                // The group of a process not yet reaped.
                sys::kill_group(b.pid, libc::SIGKILL);
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            // Every process of the namespace descends from pid 1 (nothing enters the
            // container from outside), and orphans are handed to it: no child left
            // means no process left, and the usual turn ends with this one call.
            if matches!(self.reap(), Some(libc::ECHILD)) {
                return;
            }
            let spared: Vec<libc::pid_t> = if all {
                Vec::new()
            } else {
                self.background.iter().map(|b| b.pid).collect()
            };
            let Ok(entries) = std::fs::read_dir("/proc") else {
                return;
            };
            let mut others = 0;
            for e in entries.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<libc::pid_t>() else {
                    continue;
                };
                if pid == 1
                    || (!spared.is_empty() && session_of(pid).is_some_and(|s| spared.contains(&s)))
                {
                    continue;
                }
                // A pid read from this namespace's /proc (a zombie ignores it;
                // reaping removes it).
                sys::kill_pid(pid, libc::SIGKILL);
                others += 1;
            }
            self.reap();
            if others == 0 || std::time::Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}

/// Reads a non-blocking descriptor empty.
fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 1024];
    while matches!(sys::read(fd, &mut buf), Ok(n) if n > 0) {}
}

/// The session id of `pid`, from `/proc/<pid>/stat`.
fn session_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid pgrp session …; comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// SIGKILL to every process of session `sid` but its leader.
fn kill_session(sid: libc::pid_t) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        if pid != sid && pid > 1 && session_of(pid) == Some(sid) {
            // A process of the exited leader's session.
            sys::kill_pid(pid, libc::SIGKILL);
        }
    }
}

/// The largest control message (a spawn's argv and environment included).
pub(crate) const CONTROL_MESSAGE_MAX: usize = 128 * 1024;

/// One message on the control channel: a JSON object per `SOCK_SEQPACKET` message,
/// with `"v": 1` and the message's fields.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ControlFrame {
    /// The protocol version, 1.
    pub(crate) v: u32,
    /// The message.
    #[serde(flatten)]
    pub(crate) message: ControlMessage,
}

impl ControlFrame {
    /// `message` as bytes to send.
    pub(crate) fn encode(message: &ControlMessage) -> Vec<u8> {
        serde_json::to_vec(&ControlFrame {
            v: 1,
            message: message.clone(),
        })
        .expect("control messages serialize")
    }

    /// The message in `bytes`, if it is a version-1 control frame.
    pub(crate) fn decode(bytes: &[u8]) -> Result<ControlMessage, String> {
        let frame: ControlFrame = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if frame.v != 1 {
            return Err(format!("version {} is not 1", frame.v));
        }
        Ok(frame.message)
    }
}

/// A message on the control channel, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum ControlMessage {
    /// Host → agent: start a background process. Without `tty` three descriptors
    /// (stdin, stdout, stderr) come with the message.
    Spawn {
        id: String,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: String,
        /// (rows, cols) of a terminal the agent opens for it.
        tty: Option<(u16, u16)>,
    },
    /// Host → agent: signal the process group of a background process.
    Signal { id: String, signal: i32 },
    /// Agent → host: it runs as `pid` (in the container); a terminal's master comes
    /// with the message.
    Started { id: String, pid: libc::pid_t },
    /// Agent → host: it could not start.
    Failed { id: String, message: String },
    /// Agent → host: it ended (and what it left in its session was killed).
    Exited {
        id: String,
        exit_code: i32,
        signal: Option<i32>,
    },
}

/// The command of one `invoke`.
struct Job {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: String,
    stdin: Option<String>,
    /// Bytes of each stream worth sending: the host keeps `max_output_bytes` and
    /// needs one more to know the output was cut, so the rest is read and dropped
    /// here instead of being framed and decoded for nothing.
    forward: u64,
}

fn job(input: &Value) -> Result<Job, String> {
    let argv: Vec<String> = input
        .get("argv")
        .and_then(Value::as_array)
        .ok_or("input.argv must be an array of strings")?
        .iter()
        .map(|a| a.as_str().map(String::from))
        .collect::<Option<_>>()
        .ok_or("input.argv must be an array of strings")?;
    if argv.is_empty() {
        return Err("input.argv must not be empty".into());
    }
    let env = match input.get("env") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|_| "input.env must map names to strings")?
        }
    };
    Ok(Job {
        argv,
        env,
        cwd: input
            .get("cwd")
            .and_then(Value::as_str)
            .unwrap_or("/")
            .to_string(),
        stdin: input.get("stdin").and_then(Value::as_str).map(String::from),
        forward: input
            .get("max_output_bytes")
            .and_then(Value::as_u64)
            .map_or(u64::MAX, |cap| cap.saturating_add(1)),
    })
}

/// One output pipe of the command, streamed as `log` frames; a UTF-8 sequence split
/// across reads waits for its rest.
struct Stream {
    fd: Option<OwnedFd>,
    kind: StreamKind,
    pending: Vec<u8>,
    /// Bytes still worth sending (see `Job::forward`).
    budget: u64,
}

impl Stream {
    fn new(fd: Option<OwnedFd>, kind: StreamKind, budget: u64) -> Stream {
        if let Some(fd) = &fd {
            sys::set_nonblocking(fd.as_raw_fd());
        }
        Stream {
            fd,
            kind,
            pending: Vec::new(),
            budget,
        }
    }

    /// Reads what is there and sends it; closes the stream at EOF.
    fn pump(&mut self, id: &str) {
        let mut buf = [0u8; CHUNK];
        loop {
            let Some(fd) = self.fd.as_ref() else {
                return;
            };
            match sys::read(fd, &mut buf) {
                Ok(n) if n > 0 => {
                    // Past the budget the pipe is only drained, so the command is
                    // never blocked on a full pipe.
                    let wanted = usize::try_from(self.budget).unwrap_or(usize::MAX).min(n);
                    if wanted > 0 {
                        self.budget -= wanted as u64;
                        self.pending.extend_from_slice(&buf[..wanted]);
                        self.flush(id, self.budget == 0);
                    }
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                _ => {}
            }
            // EOF (or an error): the stream is done.
            self.flush(id, true);
            self.fd = None;
            return;
        }
    }

    fn flush(&mut self, id: &str, all: bool) {
        let keep = match std::str::from_utf8(&self.pending) {
            Ok(_) => 0,
            Err(e) if e.error_len().is_none() && !all => self.pending.len() - e.valid_up_to(),
            Err(_) => 0,
        };
        let tail = self.pending.split_off(self.pending.len() - keep);
        if !self.pending.is_empty() {
            let text = String::from_utf8_lossy(&self.pending).into_owned();
            send(&Frame::log(id, self.kind, text));
        }
        self.pending = tail;
    }
}

impl Agent {
    /// Runs one `invoke` to its end.
    fn run_turn(&mut self, id: &str, input: &Value) {
        self.in_turn = true;
        self.run_turn_inner(id, input);
        self.in_turn = false;
    }

    fn run_turn_inner(&mut self, id: &str, input: &Value) {
        let job = match job(input) {
            Ok(j) => j,
            Err(why) => {
                send(&Frame::error(id, "BAD_INPUT", why));
                return;
            }
        };
        let mut cmd = Command::new(&job.argv[0]);
        cmd.args(&job.argv[1..])
            .env_clear()
            .envs(&job.env)
            .current_dir(&job.cwd)
            .process_group(0)
            .stdin(if job.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match spawn_unblocked(&mut cmd) {
            Ok(c) => c,
            Err(e) => {
                send(&Frame::error(
                    id,
                    "SPAWN_FAILED",
                    format!("starting `{}` failed: {e}", job.argv[0]),
                ));
                return;
            }
        };
        let pid = child.id() as libc::pid_t;
        if let (Some(data), Some(mut pipe)) = (job.stdin, child.stdin.take()) {
            // Rare, and may block on a full pipe: off the poll loop.
            let writer = std::thread::Builder::new().spawn(move || {
                let _ = pipe.write_all(data.as_bytes());
            });
            if let Err(e) = writer {
                // No thread to be had (a pids limit, say): the command does not run
                // without its input. Its own process group dies.
                sys::kill_group(pid, libc::SIGKILL);
                let _ = child.wait();
                send(&Frame::error(
                    id,
                    "SPAWN_FAILED",
                    format!("cannot feed the command's stdin: {e}"),
                ));
                return;
            }
        }
        let mut streams = [
            Stream::new(
                child.stdout.take().map(OwnedFd::from),
                StreamKind::Stdout,
                job.forward,
            ),
            Stream::new(
                child.stderr.take().map(OwnedFd::from),
                StreamKind::Stderr,
                job.forward,
            ),
        ];
        let pidfd = sys::pidfd_open(pid).ok();
        let mut cancelled = false;
        let mut exited = false;
        let mut status = None;
        // After the exit, output still open (a writer that escaped the kill, outside a
        // pid namespace) is waited for this long at most.
        let mut drain_until: Option<std::time::Instant> = None;
        loop {
            if exited && streams.iter().all(|s| s.fd.is_none()) {
                break;
            }
            if drain_until.is_some_and(|t| std::time::Instant::now() >= t) {
                for s in &mut streams {
                    s.flush(id, true);
                    s.fd = None;
                }
                break;
            }
            let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
            let poll = |fd: RawFd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            fds.push(poll(if self.host.closed { -1 } else { 0 }));
            for s in &streams {
                fds.push(poll(s.fd.as_ref().map_or(-1, |f| f.as_raw_fd())));
            }
            let watch_exit = !exited && pidfd.is_some();
            fds.push(poll(match (&pidfd, watch_exit) {
                (Some(p), true) => p.as_raw_fd(),
                _ => -1,
            }));
            fds.extend(self.extra_fds());
            // Without a pidfd, check for the exit every 10 ms.
            let timeout = match drain_until {
                Some(t) => {
                    t.saturating_duration_since(std::time::Instant::now())
                        .as_millis() as libc::c_int
                        + 1
                }
                None if pidfd.is_none() => 10,
                None => -1,
            };
            if sys::poll(&mut fds, timeout).is_err() {
                continue;
            }
            if fds[0].revents != 0 {
                self.host.read();
                let mut rest = VecDeque::new();
                while let Some(frame) = self.host.queued.pop_front() {
                    match frame {
                        Frame::Cancel { id: c } if c == id => {
                            cancelled = true;
                            // The command's own process group.
                            sys::kill_group(pid, libc::SIGKILL);
                        }
                        other => rest.push_back(other),
                    }
                }
                self.host.queued = rest;
                if self.host.closed && !exited {
                    // The host is gone: stop the command; the main loop then ends.
                    sys::kill_group(pid, libc::SIGKILL);
                }
            }
            for (i, s) in streams.iter_mut().enumerate() {
                if fds[1 + i].revents != 0 {
                    s.pump(id);
                }
            }
            self.service(&fds[4..]);
            if !exited && (fds[3].revents != 0 || pidfd.is_none()) {
                if let Ok(Some(st)) = child.try_wait() {
                    exited = true;
                    status = Some(st);
                    drain_until =
                        Some(std::time::Instant::now() + std::time::Duration::from_secs(2));
                    // Whatever the command left running dies with its turn; then its
                    // pipes reach EOF and every byte written is delivered before the
                    // terminal frame.
                    self.kill_everything_else(false);
                }
            }
        }
        if cancelled {
            send(&Frame::error(id, "CANCELLED", "cancelled"));
            return;
        }
        let status = status.expect("the loop ends after the exit");
        let (code, signal) = match (status.code(), status.signal()) {
            (Some(c), _) => (c, None),
            (None, Some(s)) => (128 + s, Some(s)),
            (None, None) => (-1, None),
        };
        send(&Frame::output(
            id,
            json!({"exit_code": code, "signal": signal}),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames_round_trip_and_carry_the_version() {
        let spawn = ControlMessage::Spawn {
            id: "p1".into(),
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: BTreeMap::from([("A".into(), "1".into())]),
            cwd: "/workspace".into(),
            tty: Some((24, 80)),
        };
        let bytes = ControlFrame::encode(&spawn);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.contains(r#""v":1"#) && text.contains(r#""kind":"spawn""#),
            "{text}"
        );
        assert_eq!(ControlFrame::decode(&bytes).unwrap(), spawn);
        let exited = br#"{"v":1,"kind":"exited","id":"p1","exit_code":137,"signal":9}"#;
        assert_eq!(
            ControlFrame::decode(exited).unwrap(),
            ControlMessage::Exited {
                id: "p1".into(),
                exit_code: 137,
                signal: Some(9)
            }
        );
        assert!(ControlFrame::decode(br#"{"v":2,"kind":"signal","id":"p1","signal":9}"#).is_err());
        assert!(ControlFrame::decode(br#"{"v":1,"kind":"bogus"}"#).is_err());
        assert!(ControlFrame::decode(b"not json").is_err());
    }

    #[test]
    fn session_of_reads_the_session_field() {
        let own = std::process::id() as libc::pid_t;
        let sid = rustix::process::getsid(None).unwrap().as_raw_pid();
        assert_eq!(session_of(own), Some(sid));
        assert_eq!(session_of(-5), None);
    }
}

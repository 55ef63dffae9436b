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
//! One thread: a `poll` over the host's frames, the command's two output pipes and
//! its pidfd.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};

use paddock_core::protocol::{encode, Frame, FrameDecoder};
use paddock_core::StreamKind;
use serde_json::{json, Value};

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
        // SAFETY: read(2) into a local buffer.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                self.closed = true;
            }
            return;
        }
        for item in self.decoder.decode(&buf[..n as usize]) {
            match item {
                Ok(frame) => self.queued.push_back(frame),
                Err(e) => eprintln!("paddock-agent: ignoring a line that is not a frame: {e}"),
            }
        }
    }
}

/// Runs the agent until stdin closes; returns the process exit code.
pub fn main() -> i32 {
    let mut host = Host {
        decoder: FrameDecoder::new(),
        queued: VecDeque::new(),
        closed: false,
    };
    loop {
        while let Some(frame) = host.queued.pop_front() {
            if let Frame::Invoke { id, input, .. } = frame {
                run_turn(&id, &input, &mut host);
                reap_orphans();
            }
            // Anything else with no turn running (a late cancel) has nothing to do.
        }
        if host.closed {
            kill_everything_else();
            return 0;
        }
        host.read();
    }
}

/// The command of one `invoke`.
struct Job {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: String,
    stdin: Option<String>,
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
    })
}

/// One output pipe of the command, streamed as `log` frames; a UTF-8 sequence split
/// across reads waits for its rest.
struct Stream {
    fd: Option<OwnedFd>,
    kind: StreamKind,
    pending: Vec<u8>,
}

impl Stream {
    fn new(fd: Option<OwnedFd>, kind: StreamKind) -> Stream {
        if let Some(fd) = &fd {
            set_nonblocking(fd.as_raw_fd());
        }
        Stream {
            fd,
            kind,
            pending: Vec::new(),
        }
    }

    /// Reads what is there and sends it; closes the stream at EOF.
    fn pump(&mut self, id: &str) {
        let Some(fd) = self.fd.as_ref().map(|f| f.as_raw_fd()) else {
            return;
        };
        let mut buf = [0u8; CHUNK];
        loop {
            // SAFETY: read(2) into a local buffer.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                self.pending.extend_from_slice(&buf[..n as usize]);
                self.flush(id, false);
                continue;
            }
            let err = std::io::Error::last_os_error().kind();
            if n < 0 && err == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n < 0 && err == std::io::ErrorKind::WouldBlock {
                return;
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

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: the pidfd_open system call; a new fd on success.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a fresh descriptor nobody else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn run_turn(id: &str, input: &Value, host: &mut Host) {
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
    let mut child = match cmd.spawn() {
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
            // without its input.
            // SAFETY: kill(2) on the command's own process group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
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
        Stream::new(child.stdout.take().map(OwnedFd::from), StreamKind::Stdout),
        Stream::new(child.stderr.take().map(OwnedFd::from), StreamKind::Stderr),
    ];
    let pidfd = pidfd_open(pid);
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
        fds.push(poll(if host.closed { -1 } else { 0 }));
        for s in &streams {
            fds.push(poll(s.fd.as_ref().map_or(-1, |f| f.as_raw_fd())));
        }
        let watch_exit = !exited && pidfd.is_some();
        fds.push(poll(match (&pidfd, watch_exit) {
            (Some(p), true) => p.as_raw_fd(),
            _ => -1,
        }));
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
        // SAFETY: poll(2) over a local array.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            continue;
        }
        if fds[0].revents != 0 {
            host.read();
            let mut rest = VecDeque::new();
            while let Some(frame) = host.queued.pop_front() {
                match frame {
                    Frame::Cancel { id: c } if c == id => {
                        cancelled = true;
                        // SAFETY: kill(2) on the command's own process group.
                        unsafe { libc::kill(-pid, libc::SIGKILL) };
                    }
                    other => rest.push_back(other),
                }
            }
            host.queued = rest;
            if host.closed && !exited {
                // The host is gone: stop the command; the main loop then ends.
                // SAFETY: as above.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
        }
        for (i, s) in streams.iter_mut().enumerate() {
            if fds[1 + i].revents != 0 {
                s.pump(id);
            }
        }
        if !exited && (fds[3].revents != 0 || pidfd.is_none()) {
            if let Ok(Some(st)) = child.try_wait() {
                exited = true;
                status = Some(st);
                drain_until = Some(std::time::Instant::now() + std::time::Duration::from_secs(2));
                // Whatever the command left running dies with its turn; then its
                // pipes reach EOF and every byte written is delivered before the
                // terminal frame.
                kill_everything_else();
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

/// Kills every process of the container but the agent and reaps them, until none is
/// left (at most a second: a process in uninterruptible sleep dies when it wakes).
/// Only as pid 1 of its own pid namespace: anywhere else "every other process" would
/// be the host's.
fn kill_everything_else() {
    if std::process::id() != 1 {
        reap_orphans();
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        // Every process of the namespace descends from pid 1 (nothing enters the
        // container from outside), and orphans are handed to it: no child left means
        // no process left, and the usual turn ends with this one system call.
        if !has_children() {
            return;
        }
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut others = 0;
        for e in entries.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<libc::pid_t>() else {
                continue;
            };
            if pid != 1 {
                // SAFETY: kill(2) with a pid read from this namespace's /proc (a
                // zombie ignores it; reaping removes it).
                unsafe { libc::kill(pid, libc::SIGKILL) };
                others += 1;
            }
        }
        reap_orphans();
        if others == 0 || std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// Reaps every exited child; whether any child (still running) remains.
fn has_children() -> bool {
    !matches!(reap_orphans(), Some(libc::ECHILD))
}

/// Reaps every exited child without waiting; the error that ended it (`ECHILD`: no
/// child at all), `None` when children are still running.
fn reap_orphans() -> Option<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid == 0 {
            return None;
        }
        if pid < 0 {
            return std::io::Error::last_os_error().raw_os_error();
        }
    }
}

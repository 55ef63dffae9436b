//! One turn: the command of an `invoke`, run in its own process group with its
//! output streamed back as `log` frames, until its exit (or a cancel) ends the turn.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};

use paddock_core::protocol::Frame;
use paddock_core::StreamKind;
use serde_json::{json, Value};

use crate::reaper::spawn_unblocked;
use crate::stdio::send;
use crate::sys;
use crate::{Agent, CHUNK};

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
    pub(crate) fn run_turn(&mut self, id: &str, input: &Value) {
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
                    crate::spawn_failure(&job.argv[0], &job.cwd, &e),
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

//! `paddock-agent`: pid 1 of a warm container of Paddock's container engine.
//!
//! This crate is both the agent's program (the `paddock-agent` binary, whose `main`
//! is [`main`]) and the control channel's messages ([`control`]), which the
//! container engine (`paddock-engines`) speaks from the host's end. The engine
//! carries the program inside itself, built as a static executable, so that it runs
//! in any root filesystem, one without a C library included (see
//! `docs/container.md`).
//!
//! ```
//! use paddock_agent::control::{ControlFrame, ControlMessage};
//!
//! // What the host sends to have the agent kill what a runner's turn left behind.
//! let sweep = ControlMessage::Sweep { id: "s1".into() };
//! let bytes = ControlFrame::encode(&sweep);
//! assert_eq!(bytes, br#"{"v":1,"kind":"sweep","id":"s1"}"#);
//! assert_eq!(ControlFrame::decode(&bytes), Ok(sweep));
//! ```
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
//! **Reset.** Between two leases the host may ask, on the control channel, for the
//! container to be returned to the state it started in (`reset`), so that it can
//! serve another tenant instead of being replaced: every other process dies, System
//! V IPC objects and POSIX message queues are removed, `/tmp`, `/dev/shm` and `/dev`
//! go back to the snapshot taken at start, and the agent's own inheritable
//! attributes (limits, priorities) are put back. The agent answers `reset_done` with
//! `ok: false` and what could not be reset when it cannot prove the container clean;
//! the host then replaces it. The list of what a reset covers, and what it does not,
//! is in `reset.rs`. Since the agent outlives tenants, it makes itself non-dumpable
//! at start: code of the same user cannot open its memory or descriptors.
//!
//! One thread: a `poll` over the host's frames, the control channel, the command's
//! two output pipes, its pidfd and the pidfds of background processes.
//!
//! The parts: the frames on stdin and stdout (`stdio.rs`), one turn's command
//! (`turn.rs`), the control channel's messages (`control.rs`), background processes
//! (`background.rs`), reaping children and killing leftovers (`reaper.rs`),
//! resetting the container for another lease (`reset.rs`), terminals (`pty.rs`) and
//! the system calls (`sys.rs`).
//!
//! The agent uses no name service: no user or host name lookups, nothing that a
//! statically linked C library would have to load at run time.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unused_must_use, unsafe_op_in_unsafe_fn)]
// System calls are made in `sys.rs`, each behind a safe function; everything else is
// safe code.
#![deny(unsafe_code)]

mod background;
pub mod control;
pub mod files;
mod pty;
mod reaper;
mod reset;
mod stdio;
mod sys;
mod turn;

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use paddock_core::protocol::{Frame, FrameDecoder};

use background::Background;
use stdio::Host;

/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

/// Runs the agent until stdin closes; returns the process exit code.
pub fn main() -> i32 {
    // First, before any other program runs beside it: the agent outlives tenants
    // (see `reset.rs`), and code of the same user must not reach into it.
    if let Err(e) = sys::set_not_dumpable() {
        eprintln!("paddock-agent: cannot make itself non-dumpable: {e}");
    }
    // What the container looks like before any tenant's code ran, for `reset`.
    let baseline = (std::process::id() == 1).then(reset::Baseline::take);
    let mut agent = Agent {
        host: Host {
            decoder: FrameDecoder::new(),
            queued: VecDeque::new(),
            closed: false,
        },
        control: control::channel(),
        background: Vec::new(),
        sigchld: reaper::child_signals(),
        in_turn: false,
        baseline,
        watches: Vec::new(),
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

/// Everything the agent serves.
struct Agent {
    host: Host,
    control: Option<OwnedFd>,
    background: Vec<Background>,
    /// SIGCHLD, as a descriptor (see [`reaper::child_signals`]).
    sigchld: Option<OwnedFd>,
    /// Whether a turn runs (its command is reaped by the turn, not by [`Agent::reap`]).
    in_turn: bool,
    /// The container as it was at start, which a reset returns it to (as pid 1
    /// only).
    baseline: Option<reset::Baseline>,
    /// Directories watched for the host (see `files.rs`).
    watches: Vec<files::Watch>,
}

/// Why starting `program` in `cwd` failed, as the host is told: a working
/// directory that is not there is named as such, not as a missing program.
fn spawn_failure(program: &str, cwd: &str, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound && !std::path::Path::new(cwd).is_dir() {
        return format!("the working directory `{cwd}` does not exist in the container");
    }
    format!("starting `{program}` failed: {e}")
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
    /// each background process's pidfd (-1 where there is none), then each watch's
    /// inotify descriptor and its pipe to the host (which reports the host's end
    /// closing).
    fn extra_fds(&self) -> Vec<libc::pollfd> {
        let mut fds = vec![
            pollfd(self.control.as_ref().map_or(-1, |c| c.as_raw_fd())),
            pollfd(self.sigchld.as_ref().map_or(-1, |c| c.as_raw_fd())),
        ];
        for b in &self.background {
            fds.push(pollfd(b.pidfd.as_ref().map_or(-1, |p| p.as_raw_fd())));
        }
        for w in &self.watches {
            fds.push(pollfd(w.inotify.as_raw_fd()));
            fds.push(libc::pollfd {
                fd: w.out.as_raw_fd(),
                events: 0,
                revents: 0,
            });
        }
        fds
    }

    /// Serves the watches `ready` (the part of [`extra_fds`](Self::extra_fds)
    /// after the background processes' pidfds) reports: events read and sent, and
    /// a watch whose host end closed, or whose directory went, ended.
    fn service_watches(&mut self, ready: &[libc::pollfd]) {
        for i in (0..self.watches.len()).rev() {
            let (Some(events), Some(out)) = (ready.get(2 * i), ready.get(2 * i + 1)) else {
                continue;
            };
            let over = out.revents != 0 || (events.revents != 0 && !self.watches[i].read());
            if over {
                self.watches.remove(i);
            }
        }
    }

    /// Handles what [`extra_fds`](Self::extra_fds) reported ready.
    fn service(&mut self, ready: &[libc::pollfd]) {
        // The watches first: their descriptors follow the background processes', and
        // finishing one of those below shifts nothing of theirs.
        self.service_watches(ready.get(2 + self.background.len()..).unwrap_or_default());
        // Which background processes' pidfds fired, read before anything below can
        // finish one and shift the list the descriptors were polled in.
        let exited: Vec<libc::pid_t> = ready
            .iter()
            .skip(2)
            .zip(&self.background)
            .filter(|(fd, _)| fd.revents != 0)
            .map(|(_, b)| b.pid)
            .collect();
        if ready.get(1).is_some_and(|fd| fd.revents != 0) {
            if let Some(fd) = &self.sigchld {
                reaper::drain(fd);
            }
            // During a turn its command is the turn's to reap; everything else is
            // reaped when the turn ends.
            if !self.in_turn {
                self.reap();
            }
        }
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
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_working_directory_is_named() {
        let gone = std::io::Error::from(std::io::ErrorKind::NotFound);
        let m = super::spawn_failure("sh", "/no/such/dir", &gone);
        assert!(m.contains("`/no/such/dir` does not exist"), "{m}");
        let m = super::spawn_failure("nosuchprogram", "/", &gone);
        assert!(m.contains("starting `nosuchprogram` failed"), "{m}");
    }
}

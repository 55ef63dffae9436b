//! Children: SIGCHLD as a descriptor, reaping them as they die, and killing
//! whatever a command left behind when its turn ends.

use std::os::fd::OwnedFd;
use std::process::Command;

use crate::sys;
use crate::Agent;

/// A descriptor that reads SIGCHLD (blocked, so it is delivered only there): between
/// turns the agent reaps orphans as they die, not only when the next turn ends.
/// Commands are started with it unblocked (see `spawn_unblocked`).
pub(crate) fn child_signals() -> Option<OwnedFd> {
    sys::signal_fd(libc::SIGCHLD).ok()
}

/// Starts `cmd` with SIGCHLD unblocked: a command inherits the agent's signal mask
/// (std does not reset it), and a shell whose SIGCHLD is blocked never sees its
/// children end (`wait` hangs). A SIGCHLD that lands in this window is lost to the
/// signalfd; what it announced is reaped at the next one or when the turn ends.
pub(crate) fn spawn_unblocked(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    sys::with_signal_unblocked(libc::SIGCHLD, || cmd.spawn())
}

impl Agent {
    /// Reaps every exited child without waiting (a background leader is finished
    /// properly); the error that ended it (`ECHILD`: no child at all), `None` when
    /// children are still running.
    pub(crate) fn reap(&mut self) -> Option<i32> {
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
    pub(crate) fn kill_everything_else(&mut self, all: bool) {
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
        // The sessions of background processes are spared; of a runner only the
        // runner itself (a turn may have planted a process in its session).
        let (sessions, runners): (Vec<libc::pid_t>, Vec<libc::pid_t>) = if all {
            (Vec::new(), Vec::new())
        } else {
            (
                self.background
                    .iter()
                    .filter(|b| !b.runner)
                    .map(|b| b.pid)
                    .collect(),
                self.background
                    .iter()
                    .filter(|b| b.runner)
                    .map(|b| b.pid)
                    .collect(),
            )
        };
        self.kill_others(&sessions, &runners, deadline_from_now());
    }

    /// What a runner's turn left behind dies: every process but the agent, the
    /// runners themselves (the rest of their sessions is not spared) and the
    /// sessions of the other background processes. How many were killed.
    pub(crate) fn sweep(&mut self) -> u32 {
        let sessions: Vec<libc::pid_t> = self
            .background
            .iter()
            .filter(|b| !b.runner)
            .map(|b| b.pid)
            .collect();
        let runners: Vec<libc::pid_t> = self
            .background
            .iter()
            .filter(|b| b.runner)
            .map(|b| b.pid)
            .collect();
        self.kill_others(&sessions, &runners, deadline_from_now())
    }

    /// Kills every process but pid 1, those of `sessions` and the `pids`, reaping
    /// as it goes, until none is left or `deadline` has passed; how many it found.
    /// Zombies are left to their parents (a spared runner reaps its own).
    pub(crate) fn kill_others(
        &mut self,
        sessions: &[libc::pid_t],
        pids: &[libc::pid_t],
        deadline: std::time::Instant,
    ) -> u32 {
        if std::process::id() != 1 {
            self.reap();
            return 0;
        }
        let mut killed = 0;
        loop {
            // Every process of the namespace descends from pid 1 (nothing enters the
            // container from outside), and orphans are handed to it: no child left
            // means no process left, and the usual turn ends with this one call.
            if matches!(self.reap(), Some(libc::ECHILD)) {
                return killed;
            }
            let Ok(entries) = std::fs::read_dir("/proc") else {
                return killed;
            };
            let mut others = 0;
            for e in entries.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<libc::pid_t>() else {
                    continue;
                };
                if pid == 1 || pids.contains(&pid) {
                    continue;
                }
                let Some((state, session)) = state_and_session(pid) else {
                    continue;
                };
                if state == 'Z' || sessions.contains(&session) {
                    continue;
                }
                // A pid read from this namespace's /proc (reaping removes it).
                sys::kill_pid(pid, libc::SIGKILL);
                others += 1;
            }
            killed += others;
            self.reap();
            if others == 0 || std::time::Instant::now() >= deadline {
                return killed;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}

/// How long the cleanup after a turn, or a sweep, kills and reaps at most (a
/// process in uninterruptible sleep dies when it wakes).
const KILL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

fn deadline_from_now() -> std::time::Instant {
    std::time::Instant::now() + KILL_PATIENCE
}

/// Reads a non-blocking descriptor empty.
pub(crate) fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 1024];
    while matches!(sys::read(fd, &mut buf), Ok(n) if n > 0) {}
}

/// The session id of `pid`, from `/proc/<pid>/stat`.
pub(crate) fn session_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    state_and_session(pid).map(|(_, s)| s)
}

/// The state (`R`, `S`, `Z`, …) and session id of `pid`, from `/proc/<pid>/stat`.
fn state_and_session(pid: libc::pid_t) -> Option<(char, libc::pid_t)> {
    stat_fields(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The state and session fields of a `/proc/<pid>/stat` line: `pid (comm) state ppid
/// pgrp session …`, where comm may hold spaces and parentheses. A process outside
/// any session (started by a kernel thread or some container inits) reads 0.
fn stat_fields(stat: &str) -> Option<(char, libc::pid_t)> {
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.nth(2)?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_skip_a_command_name_with_parentheses_and_spaces() {
        assert_eq!(stat_fields("42 (a) b (c) S 1 40 41 0 -1"), Some(('S', 41)));
        assert_eq!(stat_fields("7 (init) Z 0 0 0 0 -1"), Some(('Z', 0)));
        assert_eq!(stat_fields("7 (init) S 0"), None);
        assert_eq!(stat_fields("no parenthesis"), None);
    }

    #[test]
    fn session_of_reads_a_new_sessions_leader() {
        // `setsid` run by a process that is not a group leader calls setsid(2) and
        // execs in place, so the child leads a session whose id is its own pid.
        let mut child = std::process::Command::new("setsid")
            .args(["sleep", "30"])
            .spawn()
            .expect("setsid is part of util-linux");
        let pid = child.id() as libc::pid_t;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut seen = None;
        while std::time::Instant::now() < deadline {
            seen = session_of(pid);
            if seen == Some(pid) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(seen, Some(pid));
        assert_eq!(session_of(-5), None);
    }
}

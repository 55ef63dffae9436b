//! Background processes: started through the control channel in sessions of their
//! own, watched through their pidfds, and finished (what they left in their session
//! killed, reaped, the host told) when they exit.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::Command;

use crate::control::ControlMessage;
use crate::reaper::{session_of, spawn_unblocked};
use crate::Agent;
use crate::{pty, sys};

/// A background process started through the control channel.
pub(crate) struct Background {
    pub(crate) id: String,
    /// Its pid, which is also its session and process group id.
    pub(crate) pid: libc::pid_t,
    pub(crate) pidfd: Option<OwnedFd>,
    /// A warm runner: a sweep spares it, but not the rest of its session.
    pub(crate) runner: bool,
}

impl Agent {
    /// Starts background process `id` for a `spawn` message, on the three descriptors
    /// that came with it (four for a runner: the last is its fd 3) or on a terminal
    /// opened here, and answers `started` (with the terminal's master, or the
    /// runner's pidfd) or `failed`.
    pub(crate) fn spawn_background(
        &mut self,
        id: String,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: String,
        (tty, runner): (Option<(u16, u16)>, bool),
        mut fds: Vec<OwnedFd>,
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
        if runner && (tty.is_some() || fds.len() != 4) {
            return failed(self, "a runner needs four descriptors and no tty".into());
        }
        // A runner's frames: its fd 3, kept open here until the spawn is done.
        let frames = if runner { fds.pop() } else { None };
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
            Some((rows, cols)) => match pty::open(paddock_core::TerminalSize { rows, cols }) {
                Ok((master, slave)) => {
                    let copies = (slave.try_clone(), slave.try_clone());
                    let (Ok(a), Ok(b)) = copies else {
                        return failed(self, "cannot copy the terminal's descriptor".into());
                    };
                    cmd.stdin(a).stdout(b).stderr(slave);
                    Some(master)
                }
                Err(e) => return failed(self, format!("opening a terminal failed: {e}")),
            },
        };
        sys::in_new_session(&mut cmd, master.is_some());
        if let Some(fd) = &frames {
            sys::onto_fd3(&mut cmd, fd.as_raw_fd());
        }
        let spawned = spawn_unblocked(&mut cmd);
        // The child's copies of the descriptors go with the command.
        drop(cmd);
        drop(frames);
        match spawned {
            Ok(child) => {
                let pid = child.id() as libc::pid_t;
                let pidfd = sys::pidfd_open(pid).ok();
                let attached = if runner {
                    pidfd.as_ref().map(|p| p.as_fd())
                } else {
                    master.as_ref().map(|m| m.as_fd())
                };
                self.answer(
                    &ControlMessage::Started {
                        id: id.clone(),
                        pid,
                    },
                    attached,
                );
                self.background.push(Background {
                    id,
                    pid,
                    pidfd,
                    runner,
                });
            }
            Err(e) => failed(self, crate::spawn_failure(&argv[0], &cwd, &e)),
        }
    }

    /// A background process's leader has exited (it is a zombie, or was just found
    /// as one): everything left in its session dies, it is reaped, the host is told.
    pub(crate) fn finish_background(&mut self, pid: libc::pid_t) {
        let Some(at) = self.background.iter().position(|b| b.pid == pid) else {
            return;
        };
        if !sys::has_exited(pid) {
            // Never wait on a leader that still runs: the agent would stop serving
            // until it ends.
            return;
        }
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

//! Resetting the container in place: the host's `reset` returns a used warm
//! container to the state it started in, so that the next lease (maybe another
//! tenant's) gets it instead of a new container. The agent outlives tenants then,
//! so it is made non-dumpable when it starts (see [`crate::sys::set_not_dumpable`]):
//! code beside it cannot open its memory or descriptors through `/proc`.
//!
//! What a reset covers, in order:
//! 1. **Processes.** Every process but the agent dies and is reaped, background
//!    processes and runners included (each background process is reported
//!    `exited`, as when it dies on its own), within [`KILL_PATIENCE`]; one left
//!    after that fails the reset. Their locks, sockets (abstract ones included),
//!    pipes, timers, memory and open descriptions go with them.
//! 2. **System V IPC** of the container's IPC namespace: every shared memory
//!    segment, message queue and semaphore set listed in `/proc/sysvipc/` is
//!    removed (`IPC_RMID`), and the three lists must be empty afterwards.
//! 3. **Files.** `/tmp`, `/dev/shm` and `/dev/mqueue` (the IPC namespace's POSIX
//!    message queues, which can be listed only there: without an mqueue filesystem
//!    at `/dev/mqueue` the reset fails) go back to what they held when the agent
//!    started: whatever was added is removed (recursively, never following a
//!    symlink, mount points left alone), what was there is checked unchanged.
//!    `/dev`, a small tmpfs of the container's root, is compared with the snapshot
//!    taken at start: extra entries are removed, missing or replaced directories
//!    and symlinks are made again; a device node that is gone or replaced cannot be
//!    (the agent cannot `mknod`), and fails the reset. `/dev/pts` must hold no
//!    terminal any more (one whose master is still open outside the container fails
//!    the reset). For every entry kept: its mode is restored, its owner checked, and
//!    extended attributes added since the start (POSIX ACLs included) removed.
//! 4. **The agent's own process attributes**, which every program it starts
//!    inherits and which code of the same user can change from outside: resource
//!    limits (`prlimit`), nice value, scheduling policy, CPU affinity, I/O priority,
//!    `oom_score_adj` and its session's autogroup nice value go back to what they
//!    were at start; a change the agent cannot undo without privileges (a lowered
//!    hard limit, a raised nice value, `SCHED_IDLE`) fails the reset.
//!
//! Not covered here, because the host does it or nothing can change it: the
//! workdir (the host empties it after a reset), the root filesystem and the other
//! bound files (read-only), the host name (`CAP_SYS_ADMIN`), mounts (refused by
//! seccomp), network interfaces, routes and filters (`CAP_NET_ADMIN`), `/proc/sys`
//! (read-only), the kernel keyring (refused by seccomp), cgroup limits (the host's).
//! Not reset, as nothing in the container can: the pid and IPC id counters (the next
//! tenant's first pid tells roughly how many processes ran before), the network
//! namespace's counters and caches (`/proc/net/dev`, TCP metrics of loopback), the
//! timestamps of the kept directories.
//!
//! Any failure answers `ok: false` with a message naming what could not be reset;
//! the host then replaces the container, as it did before resets existed.

mod process;
mod tree;

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::control::ControlMessage;
use crate::sys;
use crate::Agent;
use process::ProcessState;
use tree::{Extra, Tree};

/// How long the container's processes have to die and be reaped.
const KILL_PATIENCE: Duration = Duration::from_secs(2);

/// Where the IPC namespace's POSIX message queues are mounted.
const MQUEUE: &str = "/dev/mqueue";

/// Most problems named in one answer.
const MAX_NAMED: usize = 8;

/// The trees a reset returns to their first state, in the order it does so, and
/// what an entry added to each is.
const TREES: &[(&str, Extra)] = &[
    ("/tmp", Extra::Removed),
    ("/dev/shm", Extra::Removed),
    (MQUEUE, Extra::Removed),
    ("/dev/pts", Extra::OpenTerminal),
    ("/dev", Extra::Removed),
];

/// What the container looked like when the agent started, before any tenant's
/// code ran.
#[derive(Debug)]
pub(crate) struct Baseline {
    trees: Vec<Tree>,
    process: Result<ProcessState, String>,
    /// Whether `/dev/mqueue` is an mqueue filesystem (else queues cannot be listed).
    mqueue: bool,
}

impl Baseline {
    /// Takes the snapshot (at start, as pid 1).
    pub(crate) fn take() -> Baseline {
        let trees = TREES
            .iter()
            .map(|(root, extra)| Tree::take(Path::new(root), *extra))
            .collect();
        Baseline {
            trees,
            process: ProcessState::capture().map_err(|e| e.to_string()),
            mqueue: sys::fs_type(Path::new(MQUEUE)).is_ok_and(|t| t == sys::MQUEUE_MAGIC),
        }
    }
}

/// The System V IPC ids listed in a `/proc/sysvipc/{shm,msg,sem}` text: the second
/// column of every line after the header.
fn ipc_ids(text: &str) -> Vec<libc::c_int> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

/// Removes every System V IPC object of the container's IPC namespace; problems
/// are pushed to `problems`.
fn clear_sysv_ipc(problems: &mut Vec<String>) {
    for (kind, file) in [
        (sys::Ipc::Shm, "/proc/sysvipc/shm"),
        (sys::Ipc::Msg, "/proc/sysvipc/msg"),
        (sys::Ipc::Sem, "/proc/sysvipc/sem"),
    ] {
        match std::fs::read_to_string(file) {
            Ok(text) => {
                for id in ipc_ids(&text) {
                    if let Err(e) = sys::ipc_remove(kind, id) {
                        problems.push(format!("{file}: id {id} cannot be removed: {e}"));
                    }
                }
            }
            Err(e) => problems.push(format!("{file} cannot be read: {e}")),
        }
        match std::fs::read_to_string(file).map(|t| ipc_ids(&t)) {
            Ok(left) if left.is_empty() => {}
            Ok(left) => problems.push(format!("{file} still lists {left:?}")),
            Err(e) => problems.push(format!("{file} cannot be read: {e}")),
        }
    }
}

/// The pids of this pid namespace other than 1, zombies included.
fn other_processes() -> io::Result<Vec<libc::pid_t>> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc")? {
        if let Ok(pid) = e?.file_name().to_string_lossy().parse::<libc::pid_t>() {
            if pid != 1 {
                pids.push(pid);
            }
        }
    }
    Ok(pids)
}

/// `problems` as the answer's message: at most [`MAX_NAMED`] of them.
fn summary(problems: &[String]) -> String {
    let mut text = problems
        .iter()
        .take(MAX_NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > MAX_NAMED {
        text.push_str(&format!("; and {} more", problems.len() - MAX_NAMED));
    }
    text
}

impl Agent {
    /// Returns the container to the state it started in (see the module's docs);
    /// why not, when something could not be.
    pub(crate) fn reset(&mut self) -> Result<(), String> {
        if std::process::id() != 1 {
            return Err("the agent is not pid 1 of the container's pid namespace".into());
        }
        if self.in_turn {
            return Err("a turn is running".into());
        }
        let Some(baseline) = self.baseline.take() else {
            return Err("the agent took no snapshot at start".into());
        };
        // The lease's watches end with it.
        self.watches.clear();
        let mut problems = Vec::new();
        self.kill_all_for_reset(&mut problems);
        clear_sysv_ipc(&mut problems);
        if !baseline.mqueue {
            problems.push(format!(
                "{MQUEUE} is no mqueue filesystem, so POSIX message queues cannot be listed"
            ));
        }
        let mut by_path = BTreeMap::new();
        for tree in &baseline.trees {
            if tree.root == Path::new(MQUEUE) && !baseline.mqueue {
                continue;
            }
            tree.restore(&mut by_path);
        }
        problems.extend(
            by_path
                .into_iter()
                .map(|(path, what)| format!("{}: {what}", path.display())),
        );
        match &baseline.process {
            Ok(state) => state.restore(&mut problems),
            Err(e) => problems.push(format!("no snapshot of the agent's attributes: {e}")),
        }
        if sys::is_dumpable() {
            problems.push("the agent is dumpable (code beside it could reach into it)".into());
        }
        self.baseline = Some(baseline);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(summary(&problems))
        }
    }

    /// Kills every process but the agent and reaps them all (background processes
    /// are reported `exited`), within [`KILL_PATIENCE`].
    fn kill_all_for_reset(&mut self, problems: &mut Vec<String>) {
        let deadline = Instant::now() + KILL_PATIENCE;
        for b in &self.background {
            // The group of a process not yet reaped.
            sys::kill_group(b.pid, libc::SIGKILL);
        }
        loop {
            self.kill_others(&[], &[], deadline);
            self.reap();
            match other_processes() {
                Ok(left) if left.is_empty() => break,
                Ok(left) if Instant::now() >= deadline => {
                    problems.push(format!(
                        "{} processes outlived the kill (pids {left:?})",
                        left.len()
                    ));
                    break;
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => {
                    problems.push(format!("/proc cannot be read: {e}"));
                    break;
                }
            }
        }
        // Every background process was reaped (and reported) above; a record left
        // names one that is gone all the same.
        for b in std::mem::take(&mut self.background) {
            self.answer(
                &ControlMessage::Exited {
                    id: b.id,
                    exit_code: 128 + libc::SIGKILL,
                    signal: Some(libc::SIGKILL),
                },
                None,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysv_ipc_ids_are_the_second_column() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                            0          3  1600                  4096    25     0      0     0     0     0     0          0          0 1733400000                     0                     0\n\
                   1234567890     327681   644                  8192    30    30      1     0     0     0     0 1733400000          0 1733400000                  4096                     0\n";
        assert_eq!(ipc_ids(shm), vec![3, 327681]);
        let msg = "       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime\n         0          0   644           0          0     0     0     0     0     0     0          0          0 1733400000\n";
        assert_eq!(ipc_ids(msg), vec![0]);
        let sem = "       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime\n";
        assert_eq!(ipc_ids(sem), Vec::<i32>::new());
        assert_eq!(ipc_ids(""), Vec::<i32>::new());
    }
}

//! The agent's own process attributes that every program it starts inherits and
//! that code of the same user can change from outside it (`prlimit`, `renice`,
//! `taskset`, `ionice`, `/proc/1/oom_score_adj`, `/proc/1/autogroup`): captured at
//! start, put back by a reset.

use std::io;
use std::time::Duration;

use crate::sys;

/// The agent's own attributes that the programs it starts inherit and that code of
/// the same user can change from outside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProcessState {
    /// Soft and hard limit of every resource, by number.
    rlimits: Vec<(libc::rlim_t, libc::rlim_t)>,
    nice: i32,
    scheduler: (i32, i32),
    affinity: Vec<u64>,
    io_priority: i64,
    oom_score_adj: Option<String>,
    /// The nice value of the session's autogroup (`/proc/self/autogroup`).
    autogroup_nice: Option<i32>,
}

impl ProcessState {
    /// This process's attributes now.
    pub(super) fn capture() -> io::Result<ProcessState> {
        Ok(ProcessState {
            rlimits: (0..sys::RLIMITS)
                .map(sys::get_rlimit)
                .collect::<io::Result<_>>()?,
            nice: sys::nice()?,
            scheduler: sys::scheduler()?,
            affinity: sys::affinity()?,
            io_priority: sys::io_priority()?,
            oom_score_adj: std::fs::read_to_string("/proc/self/oom_score_adj")
                .ok()
                .map(|s| s.trim().to_string()),
            autogroup_nice: std::fs::read_to_string("/proc/self/autogroup")
                .ok()
                .and_then(|s| autogroup_nice(&s)),
        })
    }

    /// Puts back what differs from `self`; what could not be is pushed to
    /// `problems`.
    pub(super) fn restore(&self, problems: &mut Vec<String>) {
        let now = match ProcessState::capture() {
            Ok(s) => s,
            Err(e) => {
                problems.push(format!("the agent's attributes cannot be read: {e}"));
                return;
            }
        };
        if now == *self {
            return;
        }
        let mut failed = |what: &str, e: io::Error| {
            problems.push(format!(
                "the agent's {what} was changed and cannot be put back: {e}"
            ))
        };
        for (resource, (was, is)) in self.rlimits.iter().zip(&now.rlimits).enumerate() {
            if was != is {
                if let Err(e) = sys::set_rlimit(resource as libc::c_int, *was) {
                    failed(&format!("resource limit {resource}"), e);
                }
            }
        }
        if now.nice != self.nice {
            if let Err(e) = sys::set_nice(self.nice) {
                failed("nice value", e);
            }
        }
        if now.scheduler != self.scheduler {
            if let Err(e) = sys::set_scheduler(self.scheduler) {
                failed("scheduling policy", e);
            }
        }
        if now.affinity != self.affinity {
            if let Err(e) = sys::set_affinity(&self.affinity) {
                failed("CPU affinity", e);
            }
        }
        if now.io_priority != self.io_priority {
            if let Err(e) = sys::set_io_priority(self.io_priority) {
                failed("I/O priority", e);
            }
        }
        if now.oom_score_adj != self.oom_score_adj {
            if let Some(was) = &self.oom_score_adj {
                if let Err(e) = std::fs::write("/proc/self/oom_score_adj", was) {
                    failed("oom_score_adj", e);
                }
            }
        }
        if now.autogroup_nice != self.autogroup_nice {
            if let Some(was) = self.autogroup_nice {
                if let Err(e) = set_autogroup_nice(was) {
                    failed("autogroup nice value", e);
                }
            }
        }
        match ProcessState::capture() {
            Ok(after) if after == *self => {}
            Ok(_) => {
                problems.push("the agent's process attributes differ from those at start".into())
            }
            Err(e) => problems.push(format!("the agent's attributes cannot be read: {e}")),
        }
    }
}

/// Sets the nice value of the agent's autogroup. The kernel lets a process without
/// `CAP_SYS_ADMIN` change an autogroup's nice value once per 100 ms, host-wide
/// (`EAGAIN` otherwise): a few tries.
fn set_autogroup_nice(value: i32) -> io::Result<()> {
    let mut tries = 0;
    loop {
        match std::fs::write("/proc/self/autogroup", value.to_string()) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < 4 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(110));
            }
            done => return done,
        }
    }
}

/// The nice value in a `/proc/<pid>/autogroup` line (`/autogroup-7 nice 0`).
fn autogroup_nice(text: &str) -> Option<i32> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == "nice")?;
    words.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_autogroup_nice_value_is_read() {
        assert_eq!(autogroup_nice("/autogroup-42 nice 0\n"), Some(0));
        assert_eq!(autogroup_nice("/autogroup-7 nice 19\n"), Some(19));
        assert_eq!(autogroup_nice("garbage"), None);
    }
}

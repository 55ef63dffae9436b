//! One sandbox's groups ([`Cgroup`]): joining them, setting the limits, reading
//! the OOM and pids counters, and killing and removing what is in them, in v1, v2
//! or both.

use std::ffi::CString;
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::accounting::{oom_kill_count, pids_max_count};
use super::fs;
use super::v1::{
    freeze, kill_procs, signal_procs, signal_procs_except, write, write_memory_limit, write_v1_cpu,
    KILL_FREEZE_WAIT,
};
use super::v2::{self, GroupLimits};
use super::Cgroup;

impl Cgroup {
    /// The `cgroup.procs` files a child writes "0" to, to join every hierarchy.
    pub(crate) fn procs_files(&self) -> &[CString] {
        &self.procs_files
    }

    /// Moves process `pid` into the group, in every hierarchy it has.
    pub fn add_process(&self, pid: libc::pid_t) -> io::Result<()> {
        for file in &self.procs_files {
            use std::os::unix::ffi::OsStrExt;
            let path = Path::new(std::ffi::OsStr::from_bytes(file.as_bytes()));
            self.fs.write(path, &pid.to_string())?;
        }
        Ok(())
    }

    /// The group's directory in the v2 hierarchy, when it has one (v2, or the kill
    /// group of a hybrid host).
    pub fn v2_dir(&self) -> Option<&Path> {
        self.v2.as_ref().map(|v| v.dir.as_path())
    }

    /// The group's v1 freezer directory, when the host mounts that hierarchy.
    pub fn v1_freezer_dir(&self) -> Option<&Path> {
        self.v1.as_ref().and_then(|v| v.freezer.as_deref())
    }

    /// The directory whose `cgroup.procs` lists the group's own processes.
    fn members_dir(&self) -> Option<&Path> {
        match (&self.v1, &self.v2) {
            (Some(v1), _) => Some(&v1.pids),
            (None, Some(v2)) => Some(&v2.leaf),
            (None, None) => None,
        }
    }

    /// The group's own processes (not those of groups below it).
    fn members(&self) -> io::Result<Vec<libc::pid_t>> {
        let dir = self.members_dir().ok_or(io::ErrorKind::NotFound)?;
        Ok(fs::parse_pids(&self.fs.read(&dir.join("cgroup.procs"))?))
    }

    /// Sets the memory limit (with no swap beyond it), the pids limit and the CPU
    /// bandwidth (`cpu_millicores`, where a CPU controller is in use) from
    /// `limits`; a no-op when they are what was last written.
    pub fn set_limits(&self, limits: &paddock_core::Limits) -> io::Result<()> {
        let wanted = GroupLimits {
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
            cpu_millicores: limits.cpu_millicores,
        };
        let mut applied = self.applied.lock();
        if *applied == Some(wanted) {
            return Ok(());
        }
        *applied = None;
        if let Some(v1) = &self.v1 {
            write_memory_limit(&v1.memory, wanted.memory_bytes)?;
            let pids_value = wanted
                .pids
                .map_or_else(|| "max".to_string(), |p| p.to_string());
            write(&v1.pids.join("pids.max"), &pids_value)?;
            if let Some(cpu) = &v1.cpu {
                write_v1_cpu(cpu, wanted.cpu_millicores)?;
            }
        } else if let Some(v2) = self.v2.as_ref().filter(|v| v.limits) {
            v2::set_limits(self.fs.as_ref(), &v2.dir, wanted, v2.cpu)?;
        }
        *applied = Some(wanted);
        Ok(())
    }

    /// Sets the limits unless some were set already (by an execution).
    pub fn set_limits_if_unset(&self, limits: &paddock_core::Limits) -> io::Result<()> {
        if self.applied.lock().is_some() {
            return Ok(());
        }
        self.set_limits(limits)
    }

    /// How many processes the kernel OOM-killed in the group since the last call.
    pub fn new_oom_kills(&self) -> u64 {
        let now = match (&self.v1, &self.v2) {
            (Some(v1), _) => crate::host::sys::read_small(v1.memory.join("memory.oom_control"))
                .map_or(0, |s| oom_kill_count(&s)),
            (None, Some(v2)) => v2::oom_kills(self.fs.as_ref(), &v2.dir),
            (None, None) => 0,
        };
        now.saturating_sub(self.seen_oom.swap(now, Ordering::AcqRel))
    }

    /// How many forks the pids limit refused since the last call.
    pub fn new_pids_max_hits(&self) -> u64 {
        let now = match (&self.v1, &self.v2) {
            (Some(v1), _) => crate::host::sys::read_small(v1.pids.join("pids.events"))
                .map_or(0, |s| pids_max_count(&s)),
            (None, Some(v2)) => v2::pids_max_hits(self.fs.as_ref(), &v2.dir),
            (None, None) => 0,
        };
        now.saturating_sub(self.seen_pids_max.swap(now, Ordering::AcqRel))
    }

    /// Whether any process is still in the group (its own, not those of groups
    /// below it).
    pub fn is_populated(&self) -> bool {
        self.members().map(|m| !m.is_empty()).unwrap_or(false)
    }

    /// Whether the group holds a process that is not in `keep`.
    pub fn has_other_than(&self, keep: &[libc::pid_t]) -> bool {
        self.members()
            .map(|m| m.iter().any(|pid| !keep.contains(pid)))
            .unwrap_or(true)
    }

    /// Kills every process in the group (its own: groups below it are spared) and
    /// waits (up to 5 s) until it is empty: through `cgroup.kill` of its v2 leaf
    /// where it has one, else frozen (v1 freezer), SIGKILLed and thawed.
    pub fn kill_all(&self) -> io::Result<()> {
        if !self.has_other_than(&[]) {
            // Empty: nothing to freeze or kill.
            return Ok(());
        }
        if let Some(v2) = self.v2.as_ref().filter(|v| v.kill) {
            v2::kill(self.fs.as_ref(), &v2.leaf, v2::KILL_WAIT)?;
            // Hybrid: the same processes, gone from v1 too (one read when empty).
            return match &self.v1 {
                Some(v1) => kill_procs(&v1.pids),
                None => Ok(()),
            };
        }
        let Some(v1) = &self.v1 else {
            return Ok(());
        };
        if let Some(f) = &v1.freezer {
            // Frozen tasks cannot fork, so one pass catches every one of them; they
            // die once thawed.
            if freeze(f, KILL_FREEZE_WAIT) {
                let _ = signal_procs(&v1.pids);
            }
            let _ = write(&f.join("freezer.state"), "THAWED");
        }
        kill_procs(&v1.pids)
    }

    /// Kills every process in the group except those in `keep` (warm workers between
    /// turns) and waits (up to 5 s) until only they are left. Returns how many were
    /// killed.
    pub fn kill_all_except(&self, keep: &[libc::pid_t]) -> io::Result<usize> {
        if !self.has_other_than(keep) {
            // The common case after a turn: nothing but the worker, no freeze needed.
            return Ok(0);
        }
        let Some(v1) = &self.v1 else {
            return match &self.v2 {
                Some(v2) => v2::kill_except(self.fs.as_ref(), &v2.leaf, keep),
                None => Ok(0),
            };
        };
        let mut killed = 0;
        if let Some(f) = &v1.freezer {
            if freeze(f, KILL_FREEZE_WAIT) {
                killed += signal_procs_except(&v1.pids, keep).unwrap_or(0);
            }
            let _ = write(&f.join("freezer.state"), "THAWED");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n = signal_procs_except(&v1.pids, keep)?;
            if n == 0 {
                return Ok(killed);
            }
            killed += n;
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "processes in `{}` survived SIGKILL for 5 s",
                        v1.pids.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Kills everything and removes the group's directories (in v2, with every
    /// group below it).
    pub fn remove(&self) -> io::Result<()> {
        self.kill_all()?;
        if let Some(v1) = &self.v1 {
            for dir in [
                Some(&v1.pids),
                Some(&v1.memory),
                v1.cpu.as_ref(),
                v1.freezer.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                // The kernel may take a moment to drop exited tasks from the group.
                let mut tries = 0;
                loop {
                    match std::fs::remove_dir(dir) {
                        Ok(()) => break,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 500 => {
                            tries += 1;
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        if let Some(v2) = &self.v2 {
            v2::remove_tree(self.fs.as_ref(), &v2.dir)?;
        }
        Ok(())
    }
}

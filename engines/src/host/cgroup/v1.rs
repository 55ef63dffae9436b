//! The cgroup v1 backend, by directory: sweeping stale groups, the limit files
//! (`memory.limit_in_bytes`, `cpu.cfs_quota_us`), the freezer, the kill by signal
//! to every member, and removal.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::host::sys;

use super::CPU_PERIOD_US;

/// Removes groups left behind by Paddock processes that no longer exist (of this pid
/// namespace: see `owner`).
pub(super) fn remove_stale(pids: &Path, memory: &Path, cpu: Option<&Path>, freezer: Option<&Path>) {
    for base in [Some(pids), Some(memory), cpu, freezer]
        .into_iter()
        .flatten()
    {
        let Ok(entries) = std::fs::read_dir(base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("paddock-") else {
                continue;
            };
            if !crate::host::owner::owner_is_gone(rest) {
                continue;
            }
            // Sandboxes, and the groups of their background processes below them.
            let _ = remove_tree(&entry.path());
        }
    }
}

pub(super) fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
}

/// Sets a v1 memory group's limit, for memory and swap together where swap is
/// accounted (`None`: no limit). `memory.memsw.limit_in_bytes` must never be below
/// the memory limit, so it is lifted first and set last.
pub(crate) fn write_memory_limit(dir: &Path, bytes: Option<u64>) -> io::Result<()> {
    let value = bytes.map_or_else(|| "-1".to_string(), |b| b.to_string());
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let has_memsw = memsw.exists();
    if has_memsw {
        let _ = write(&memsw, "-1");
    }
    write(&dir.join("memory.limit_in_bytes"), &value)?;
    if has_memsw {
        let _ = write(&memsw, &value);
    }
    Ok(())
}

/// Writes a v1 cpu group's bandwidth: `cpu.cfs_period_us`, then
/// `cpu.cfs_quota_us` (-1: unlimited).
pub(super) fn write_v1_cpu(dir: &Path, millicores: Option<u64>) -> io::Result<()> {
    write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
    let quota = millicores.map_or_else(
        || "-1".to_string(),
        |m| {
            (m.saturating_mul(CPU_PERIOD_US) / 1000)
                .max(1000)
                .to_string()
        },
    );
    write(&dir.join("cpu.cfs_quota_us"), &quota)
}

/// Freezes the group and waits until the kernel reports it frozen (up to 1 s).
pub(super) fn freeze(dir: &Path, wait: Duration) -> bool {
    let state = dir.join("freezer.state");
    if write(&state, "FROZEN").is_err() {
        return false;
    }
    let deadline = Instant::now() + wait;
    let mut polls: u32 = 0;
    while Instant::now() < deadline {
        match crate::host::sys::read_small(&state) {
            Ok(s) if s.trim() == "FROZEN" => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
        polls += 1;
        // The v1 freezer walks the group's tasks once per write. A task forked while
        // that walk runs can escape it and keep the group in `FREEZING` for good (a
        // shell loop that forks every few ms hits this about one pause in fifteen; each of those froze on the second write).
        // Writing `FROZEN` again walks the tasks again; a short thaw now and then
        // also frees a task caught halfway through its fork.
        if polls.is_multiple_of(250) {
            let _ = write(&state, "THAWED");
            std::thread::sleep(Duration::from_micros(100));
            if write(&state, "FROZEN").is_err() {
                return false;
            }
        } else if polls.is_multiple_of(25) && write(&state, "FROZEN").is_err() {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

/// Kills what is listed in `dir/cgroup.procs` until it stays empty (up to 5 s).
pub(super) fn kill_procs(dir: &Path) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if signal_procs(dir)? == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("processes in `{}` survived SIGKILL for 5 s", dir.display()),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends SIGKILL to every process listed in `dir/cgroup.procs`; returns how many.
pub(super) fn signal_procs(dir: &Path) -> io::Result<usize> {
    signal_procs_except(dir, &[])
}

/// [`signal_procs`], sparing the processes in `keep`.
pub(super) fn signal_procs_except(dir: &Path, keep: &[libc::pid_t]) -> io::Result<usize> {
    let procs = crate::host::sys::read_small(dir.join("cgroup.procs"))?;
    let mut n = 0;
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        if keep.contains(&pid) {
            continue;
        }
        sys::kill_pid(pid, libc::SIGKILL);
        n += 1;
    }
    Ok(n)
}
/// How long a pause waits for the kernel to freeze every task. A task in an
/// uninterruptible sleep (disk I/O on a loaded host) holds the group in `FREEZING`
/// until it wakes, which can take well over a second.
pub(super) const PAUSE_FREEZE_WAIT: Duration = Duration::from_secs(5);

/// How long a kill waits for the group to freeze before it signals anyway.
pub(super) const KILL_FREEZE_WAIT: Duration = Duration::from_secs(1);

/// Freezes (or thaws) the v1 freezer group at `dir` and, when freezing, waits (up
/// to 5 s) until the kernel reports every task frozen. A group that does not freeze
/// in time is thawed again, so that a failed pause leaves it running, not half
/// frozen.
pub fn set_frozen(dir: &Path, frozen: bool) -> io::Result<()> {
    if frozen {
        if freeze(dir, PAUSE_FREEZE_WAIT) {
            Ok(())
        } else {
            let _ = write(&dir.join("freezer.state"), "THAWED");
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "`{}` did not freeze within {} s (a task stuck in the kernel); it was thawed again",
                    dir.display(),
                    PAUSE_FREEZE_WAIT.as_secs()
                ),
            ))
        }
    } else {
        write(&dir.join("freezer.state"), "THAWED")
    }
}

/// Kills everything in the v1 group whose `pids` (and optionally `freezer`)
/// directory is given: frozen first when it can be, so nothing forks past the kill.
pub fn kill_dirs(pids: &Path, freezer: Option<&Path>) -> io::Result<()> {
    if !pids.exists() {
        return Ok(());
    }
    if let Some(f) = freezer.filter(|f| f.exists()) {
        if freeze(f, KILL_FREEZE_WAIT) {
            let _ = signal_procs(pids);
        }
        let _ = write(&f.join("freezer.state"), "THAWED");
    }
    kill_procs(pids)
}

/// Removes `dir` and every group below it, deepest first, killing what still runs in
/// one that will not go. A missing `dir` is not an error.
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    // A frozen task does not die until thawed (a paused sandbox's, say); in the
    // freezer hierarchy the thaw reaches every group below.
    let _ = write(&dir.join("freezer.state"), "THAWED");
    for entry in entries.flatten() {
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_tree(&entry.path())?;
        }
    }
    let mut tries = 0;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 500 => {
                if tries % 50 == 0 {
                    let _ = signal_procs(dir);
                }
                tries += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_cpu_quota_is_the_millicores_share_of_the_period() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["cpu.cfs_period_us", "cpu.cfs_quota_us"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        write_v1_cpu(dir.path(), Some(200)).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert_eq!(read("cpu.cfs_period_us"), "100000");
        assert_eq!(read("cpu.cfs_quota_us"), "20000");
        write_v1_cpu(dir.path(), None).unwrap();
        assert_eq!(read("cpu.cfs_quota_us"), "-1");
    }
}

//! What a group uses now ([`GroupUsage`]): the memory its processes hold (the page
//! cache they caused included), its memory limit, and CPU time, from the group's
//! own files; CPU time from `/proc` where the group keeps none (the subprocess
//! engine's groups on a host with only cgroup v1, which has no `cpuacct` group for
//! them).

use std::io;
use std::path::Path;

use super::fs::{keyed, parse_pids};
use super::Cgroup;

/// A v1 memory limit at or above this is no limit (the kernel writes
/// `PAGE_COUNTER_MAX` pages there).
const V1_UNLIMITED: u64 = 1 << 60;

/// Directories walked below a group for [`cpu_of_members`] (its executions'
/// groups), at most.
const MAX_GROUPS_WALKED: usize = 256;

/// What a group uses now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupUsage {
    /// CPU time, in nanoseconds, since the group was made.
    pub cpu_ns: u64,
    /// Memory charged to the group, in bytes.
    pub memory_bytes: u64,
    /// Of it, the page cache.
    pub cache_bytes: u64,
    /// Its memory limit, when it has one.
    pub memory_limit: Option<u64>,
}

fn number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// A v2 group's use, from its directory.
pub(crate) fn read_v2(
    read: &dyn Fn(&Path) -> io::Result<String>,
    dir: &Path,
) -> io::Result<GroupUsage> {
    let memory_bytes = number(&read(&dir.join("memory.current"))?).unwrap_or(0);
    let stat = read(&dir.join("memory.stat")).unwrap_or_default();
    Ok(GroupUsage {
        cpu_ns: v2_cpu_ns(read, dir).unwrap_or(0),
        memory_bytes,
        cache_bytes: keyed(&stat, "file").unwrap_or(0),
        // `max` (no limit) does not parse.
        memory_limit: read(&dir.join("memory.max")).ok().and_then(|s| number(&s)),
    })
}

/// A v2 group's CPU time in nanoseconds: its `cpu.stat`, which every v2 group
/// has, with the CPU controller or without.
fn v2_cpu_ns(read: &dyn Fn(&Path) -> io::Result<String>, dir: &Path) -> Option<u64> {
    read(&dir.join("cpu.stat"))
        .ok()
        .and_then(|s| keyed(&s, "usage_usec"))
        .map(|us| us.saturating_mul(1000))
}

/// A v1 group's use, from its `memory` directory and, when it has one, its
/// `cpuacct` directory (else CPU time is left at 0).
pub(crate) fn read_v1(memory: &Path, cpuacct: Option<&Path>) -> io::Result<GroupUsage> {
    let read = crate::host::sys::read_small;
    let memory_bytes = number(&read(memory.join("memory.usage_in_bytes"))?).unwrap_or(0);
    let stat = read(memory.join("memory.stat")).unwrap_or_default();
    Ok(GroupUsage {
        cpu_ns: cpuacct
            .and_then(|d| read(d.join("cpuacct.usage")).ok())
            .and_then(|s| number(&s))
            .unwrap_or(0),
        memory_bytes,
        // Hierarchical (`total_cache`), so that groups below are counted too.
        cache_bytes: keyed(&stat, "total_cache")
            .or_else(|| keyed(&stat, "cache"))
            .unwrap_or(0),
        memory_limit: read(memory.join("memory.limit_in_bytes"))
            .ok()
            .and_then(|s| number(&s))
            .filter(|l| *l < V1_UNLIMITED),
    })
}

/// The CPU time, in nanoseconds, of the processes of the group at `dir` and of
/// groups below it (their `cgroup.procs`), with that of their children they have
/// waited for, from `/proc/<pid>/stat`. Processes that ended are no longer
/// counted: a reading may be lower than the one before.
pub(crate) fn cpu_of_members(dir: &Path) -> u64 {
    let hz = crate::host::sys::clock_ticks_per_second();
    let mut ticks = 0u64;
    let mut dirs = vec![dir.to_path_buf()];
    let mut walked = 0usize;
    while let Some(d) = dirs.pop() {
        walked += 1;
        if walked > MAX_GROUPS_WALKED {
            break;
        }
        if let Ok(procs) = crate::host::sys::read_small(d.join("cgroup.procs")) {
            for pid in parse_pids(&procs) {
                ticks += crate::host::sys::read_small(format!("/proc/{pid}/stat"))
                    .map_or(0, |s| stat_ticks(&s));
            }
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    ticks.saturating_mul(1_000_000_000) / hz
}

/// `utime + stime + cutime + cstime` of a `/proc/<pid>/stat` line (fields 14 to
/// 17, counted after the command's closing parenthesis, which may hold spaces).
fn stat_ticks(stat: &str) -> u64 {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    // `rest` starts with field 3 (the state).
    rest.split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<i64>().ok())
        .map(|t| t.max(0) as u64)
        .sum()
}

impl Cgroup {
    /// What the group uses now (see [`GroupUsage`]). On a hybrid host the memory
    /// comes from the v1 group and CPU time from the v2 group; with v1 alone, CPU
    /// time is that of the processes in the group (and below) now.
    pub fn usage(&self) -> io::Result<GroupUsage> {
        let fs = self.fs.clone();
        let read = move |p: &Path| fs.read(p);
        match (&self.v1, &self.v2) {
            (Some(v1), v2) => {
                let mut u = read_v1(&v1.memory, None)?;
                // The v2 group of a hybrid host has no memory controller, but its
                // `cpu.stat` counts.
                u.cpu_ns = match v2.as_ref().and_then(|v2| v2_cpu_ns(&read, &v2.dir)) {
                    Some(ns) => ns,
                    None => cpu_of_members(&v1.pids),
                };
                Ok(u)
            }
            (None, Some(v2)) => read_v2(&read, &v2.dir),
            (None, None) => Err(io::ErrorKind::NotFound.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_cpu_fields_are_summed_after_the_command() {
        // pid (comm with ") " inside) state ppid … utime stime cutime cstime …
        let line = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 2 1 20 0 1 0";
        assert_eq!(stat_ticks(line), 13);
        assert_eq!(stat_ticks("garbage"), 0);
    }

    #[test]
    fn v2_and_v1_files_give_memory_cache_limit_and_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let put = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        put("memory.current", "1048576\n");
        put("memory.stat", "anon 524288\nfile 262144\n");
        put("memory.max", "max\n");
        put("cpu.stat", "usage_usec 1500\nuser_usec 1000\n");
        let read = |p: &Path| std::fs::read_to_string(p);
        let u = read_v2(&read, dir.path()).unwrap();
        assert_eq!(
            u,
            GroupUsage {
                cpu_ns: 1_500_000,
                memory_bytes: 1_048_576,
                cache_bytes: 262_144,
                memory_limit: None
            }
        );
        // The v2 group of a hybrid host: `cpu.stat` alone.
        let cpu_only = tempfile::tempdir().unwrap();
        std::fs::write(cpu_only.path().join("cpu.stat"), "usage_usec 7\n").unwrap();
        assert!(read_v2(&read, cpu_only.path()).is_err());
        assert_eq!(v2_cpu_ns(&read, cpu_only.path()), Some(7_000));
        put("memory.max", "536870912\n");
        assert_eq!(
            read_v2(&read, dir.path()).unwrap().memory_limit,
            Some(536_870_912)
        );

        put("memory.usage_in_bytes", "2097152\n");
        put("memory.stat", "cache 4096\nrss 8192\ntotal_cache 65536\n");
        put("memory.limit_in_bytes", "9223372036854771712\n");
        put("cpuacct.usage", "123456789\n");
        let u = read_v1(dir.path(), Some(dir.path())).unwrap();
        assert_eq!(
            u,
            GroupUsage {
                cpu_ns: 123_456_789,
                memory_bytes: 2_097_152,
                cache_bytes: 65_536,
                memory_limit: None
            }
        );
        assert_eq!(read_v1(dir.path(), None).unwrap().cpu_ns, 0);
        assert!(read_v1(&dir.path().join("missing"), None).is_err());
    }

    #[test]
    fn members_cpu_counts_this_process() {
        // A stand-in group whose `cgroup.procs` lists this process: its CPU time
        // is what `/proc` says of it, and grows as it works.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        let before = cpu_of_members(dir.path());
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(200) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(cpu_of_members(dir.path()) > before);
    }
}

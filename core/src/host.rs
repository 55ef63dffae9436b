//! What this host offers, read once: the sizes the built-in ceilings of
//! `[limits.max]` derive from (see [`crate::tenancy::LimitsConfig::ceilings`]).
//!
//! Read from `/proc` (memory, the kernel's task limits) and from the filesystem of
//! the system temp dir, where sandboxes' disks are made by default. A fact that
//! cannot be read is `None`, and its ceiling falls back to a fixed one.

use std::path::Path;
use std::sync::OnceLock;

/// The host's sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Physical memory (`MemTotal`), in bytes.
    pub memory_bytes: Option<u64>,
    /// The most tasks the kernel allows: the lower of `kernel.pid_max` and
    /// `kernel.threads-max`.
    pub tasks: Option<u64>,
    /// The size of the filesystem sandboxes' disks are made on, in bytes.
    pub disk_bytes: Option<u64>,
    /// The CPUs this process may run on.
    pub cores: Option<u64>,
}

/// What one pool instance is reckoned to need of the host's memory when
/// [`HostFacts::pool_max_size`] sizes pools: about five times what a ready instance
/// costs (11-12 MiB of PSS with its warm interpreters), leaving room for what its
/// programs run.
pub const POOL_MEMORY_PER_INSTANCE: u64 = 64 << 20;
/// Instances per core [`HostFacts::pool_max_size`] allows: most sandboxes are idle
/// most of the time (an idle one costs no CPU).
pub const POOL_INSTANCES_PER_CORE: u64 = 128;
/// The bounds of [`HostFacts::pool_max_size`].
pub const POOL_MAX_SIZE_BOUNDS: (usize, usize) = (16, 4096);

impl HostFacts {
    /// This host's facts, read on first use.
    pub fn this_host() -> HostFacts {
        static FACTS: OnceLock<HostFacts> = OnceLock::new();
        *FACTS.get_or_init(|| HostFacts::read(&std::env::temp_dir()))
    }

    /// Reads the facts, with disks made under `disk_at`.
    pub fn read(disk_at: &Path) -> HostFacts {
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map(|kib| kib.saturating_mul(1024));
        let number = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        let tasks = match (
            number("/proc/sys/kernel/pid_max"),
            number("/proc/sys/kernel/threads-max"),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let disk_bytes = rustix::fs::statvfs(disk_at)
            .ok()
            .map(|s| s.f_blocks.saturating_mul(s.f_frsize));
        let cores = std::thread::available_parallelism()
            .ok()
            .map(|n| n.get() as u64);
        HostFacts {
            memory_bytes,
            tasks,
            disk_bytes,
            cores,
        }
    }

    /// The default `pool.max_size` on this host: the lower of memory /
    /// [`POOL_MEMORY_PER_INSTANCE`] and cores × [`POOL_INSTANCES_PER_CORE`], within
    /// [`POOL_MAX_SIZE_BOUNDS`] (a fact that cannot be read does not bound it; with
    /// neither, the lower bound). 256 on a host of 2 cores and 24 GiB.
    pub fn pool_max_size(&self) -> usize {
        let by_memory = self.memory_bytes.map(|m| m / POOL_MEMORY_PER_INSTANCE);
        let by_cores = self
            .cores
            .map(|c| c.saturating_mul(POOL_INSTANCES_PER_CORE));
        let (lo, hi) = POOL_MAX_SIZE_BOUNDS;
        match (by_memory, by_cores) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(lo as u64),
        }
        .clamp(lo as u64, hi as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_is_read() {
        let h = HostFacts::this_host();
        assert!(h.memory_bytes.is_some_and(|m| m >= 64 << 20), "{h:?}");
        assert!(h.tasks.is_some_and(|t| t >= 64), "{h:?}");
        assert!(h.disk_bytes.is_some_and(|d| d > 0), "{h:?}");
        assert!(h.cores.is_some_and(|c| c >= 1), "{h:?}");
    }

    #[test]
    fn pools_are_sized_by_the_lower_of_memory_and_cores() {
        let host = |gib: u64, cores: u64| HostFacts {
            memory_bytes: Some(gib << 30),
            cores: Some(cores),
            ..HostFacts::default()
        };
        // 24 GiB / 64 MiB = 384; 2 cores × 128 = 256.
        assert_eq!(host(24, 2).pool_max_size(), 256);
        // 4 GiB / 64 MiB = 64, below 16 cores × 128.
        assert_eq!(host(4, 16).pool_max_size(), 64);
        // Tiny and huge hosts stay within the bounds.
        assert_eq!(host(0, 1).pool_max_size(), POOL_MAX_SIZE_BOUNDS.0);
        assert_eq!(host(4096, 256).pool_max_size(), POOL_MAX_SIZE_BOUNDS.1);
        assert_eq!(HostFacts::default().pool_max_size(), POOL_MAX_SIZE_BOUNDS.0);
    }
}

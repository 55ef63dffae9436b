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
}

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
        HostFacts {
            memory_bytes,
            tasks,
            disk_bytes,
        }
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
    }
}

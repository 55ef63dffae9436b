//! What a sandbox uses at one moment ([`SandboxUsage`]), as
//! [`Sandbox::usage`](crate::Sandbox::usage) reads it from the sandbox's cgroup and
//! its disk. Surfaces sample it over time (E2B's `getMetrics`).

/// A sandbox's use of CPU, memory and disk when it was read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SandboxUsage {
    /// CPU time its processes used, in nanoseconds, counted from when its group
    /// was made (a counter: compare two readings for a rate; it may start over
    /// when the engine replaces the group, and a smaller reading says so).
    pub cpu_ns: u64,
    /// The CPUs it may use: its `cpu_millicores` limit in cores, else the host's.
    pub cpus: f64,
    /// The memory its processes hold, in bytes, the page cache they caused
    /// included (as the cgroup counts it).
    pub memory_bytes: u64,
    /// Of `memory_bytes`, the page cache.
    pub memory_cache_bytes: u64,
    /// The memory it may hold: its limit, else the host's memory.
    pub memory_limit_bytes: u64,
    /// The bytes its files take on disk.
    pub disk_used_bytes: u64,
    /// The disk it may fill: its quota, else the size of the file system its
    /// workdir is on.
    pub disk_total_bytes: u64,
}

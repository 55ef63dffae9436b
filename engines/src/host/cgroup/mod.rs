//! Per-sandbox cgroups: memory, pids and CPU-bandwidth limits, peak and OOM
//! accounting, and a kill that no process escapes (`setsid` included).
//!
//! The backend is chosen at start from what the host mounts ([`Layout`], see
//! `docs/cgroups.md`):
//! - **v1**: the `pids`, `memory` and (when mounted) `cpu` and `freezer`
//!   hierarchies; the kill freezes the group, sends SIGKILL to every member and
//!   thaws it.
//! - **hybrid** (v1 controllers and a v2 mount beside them): the limits and the
//!   accounting in v1, where the controllers are; the kill through `cgroup.kill` of
//!   a group in the v2 mount, which every process also joins (atomic: a fork in
//!   flight dies too), falling back to the v1 kill where v2 cannot be used.
//! - **v2**: everything in the one hierarchy: `memory.max` (with `memory.swap.max`
//!   0), `pids.max`, `cpu.max`, `memory.events`, `pids.events`, `cgroup.kill`,
//!   `cgroup.freeze`. Groups go under the process's own group, which must be given
//!   the `memory` and `pids` controllers (a delegated subtree; the rules below).
//!
//! Paddock places its groups under the cgroup the host process already lives in,
//! one parent per engine (`paddock-<pid>-<n>-ns<inode>`) and one child per sandbox.
//! In v2 no group that has children holds a process itself: a group's processes
//! live in its `leaf` child, and where the process's own group must hand controllers
//! to Paddock's groups while holding processes, Paddock moves itself into a leaf of
//! its own first, but only when it is the only process there.

mod accounting;
mod discovery;
mod fs;
mod group;
mod layout;
mod root;
mod usage;
mod v1;
mod v2;
mod v2_host;

pub use discovery::{hierarchies, own_path, Hierarchy};
pub use fs::{CgroupFs, RealFs};
pub use layout::Layout;
pub use usage::GroupUsage;
pub use v1::{kill_dirs, remove_tree, set_frozen};
pub use v2_host::{kill_v2, set_frozen_v2, v2_mount};

pub(crate) use accounting::{limits_error, oom_kill_count, pids_max_count, pids_warning};
pub(crate) use discovery::{return_to_own_groups, v1_controllers};
pub(crate) use usage::{read_v1 as read_v1_usage, read_v2 as read_v2_usage};
pub(crate) use v1::write_memory_limit;
pub(crate) use v2::CPU_PERIOD_US;
pub(crate) use v2_host::{
    ensure_v2_parent, remove_stale_v2, remove_tree_v2, v2_container_base, v2_cpu_usage_ns,
    write_v2_limits,
};

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use v2::{GroupLimits, Placement};

/// What a [`CgroupRoot`] uses on this host, for `paddock doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupReport {
    /// The layout the host mounts.
    pub layout: Layout,
    /// The engine's parent groups (one per hierarchy used).
    pub groups: Vec<PathBuf>,
    /// What enforces the memory and pids limits (`v1 memory, pids` or
    /// `v2 memory.max, pids.max`).
    pub limits: String,
    /// How a sandbox's processes are killed.
    pub kill: String,
    /// How a group is frozen, or why it cannot be.
    pub freeze: Result<String, String>,
    /// What enforces `cpu_millicores`, or why nothing does.
    pub cpu: Result<String, String>,
    /// The leaf this process moved itself into (v2, see the module's doc).
    pub moved_into: Option<PathBuf>,
}

#[derive(Debug)]
struct V1Root {
    pids: PathBuf,
    memory: PathBuf,
    cpu: Option<PathBuf>,
    freezer: Option<PathBuf>,
}

#[derive(Debug)]
struct V2Root {
    dir: PathBuf,
    /// Whether the limits and the accounting are here (no v1 backend).
    limits: bool,
    cpu: bool,
    /// Whether `cgroup.kill` is offered (kernel 5.14 and later).
    kill: bool,
    placement: Placement,
}

/// The engine-level parent groups.
#[derive(Debug)]
pub struct CgroupRoot {
    fs: Arc<dyn CgroupFs>,
    layout: Layout,
    v1: Option<V1Root>,
    v2: Option<V2Root>,
    /// Why the v2 hierarchy of a hybrid host is not used for the kill, if it is not.
    v2_unused: Option<String>,
}

#[derive(Debug)]
struct V1Group {
    pids: PathBuf,
    memory: PathBuf,
    cpu: Option<PathBuf>,
    freezer: Option<PathBuf>,
}

#[derive(Debug)]
struct V2Group {
    /// The group: limits and accounting (v2 backend).
    dir: PathBuf,
    /// `dir/leaf`: its own processes.
    leaf: PathBuf,
    limits: bool,
    cpu: bool,
    kill: bool,
}

/// One sandbox's groups (or a background process's, inside its sandbox's).
#[derive(Debug)]
pub struct Cgroup {
    fs: Arc<dyn CgroupFs>,
    v1: Option<V1Group>,
    v2: Option<V2Group>,
    procs_files: Vec<CString>,
    /// The limits last written, to skip rewriting them.
    applied: parking_lot::Mutex<Option<GroupLimits>>,
    /// Event counters as last seen, so each check reports only new events.
    seen_oom: AtomicU64,
    seen_pids_max: AtomicU64,
}

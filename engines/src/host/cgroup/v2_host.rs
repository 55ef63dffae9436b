//! The v2 backend on the host's own cgroupfs ([`RealFs`]), by group directory: for
//! the groups the container engine's OCI runtime makes (their placement, parents,
//! limits and removal), and the kill and freeze of any v2 group.

use std::io;
use std::path::{Path, PathBuf};

use super::layout::HostLayout;
use super::v1::PAUSE_FREEZE_WAIT;
use super::v2::{self, GroupLimits};
use super::RealFs;

/// Where the container engine's groups go on a pure v2 host: the v2 placement
/// (see the `cgroup` module's doc) as a cgroup path, its directory, and the controllers
/// enabled there.
pub(crate) fn v2_container_base() -> Result<(String, PathBuf, Vec<String>), String> {
    let host = HostLayout::detect();
    let (Some(mount), Some(own)) = (host.v2.as_ref(), host.v2_dir()) else {
        return Err("no cgroup2 hierarchy is mounted".into());
    };
    let placed = v2::place(&RealFs, &own, std::process::id(), true)?;
    let rel = placed
        .base
        .strip_prefix(&mount.mount_point)
        .map_err(|_| "the v2 placement lies outside the cgroup2 mount".to_string())?;
    let root = mount.mount_root.trim_end_matches('/');
    let path = format!("{root}/{}", rel.display());
    Ok((path, placed.base, placed.controllers))
}

/// Creates the v2 group `dir` unless it exists, and hands `controllers` to its
/// children (a sandbox's containers) unless it does already; its parent must exist.
pub(crate) fn ensure_v2_parent(dir: &Path, controllers: &[String]) -> io::Result<()> {
    v2::ensure_parent(&RealFs, dir, controllers)
}

/// Writes a v2 group's memory (no swap beyond it) and pids limits.
pub(crate) fn write_v2_limits(
    dir: &Path,
    memory_bytes: Option<u64>,
    pids: Option<u64>,
) -> io::Result<()> {
    let limits = GroupLimits {
        memory_bytes,
        pids,
        cpu_millicores: None,
    };
    v2::set_limits(&RealFs, dir, limits, false)
}

/// Removes the v2 group `dir` and every group below it, killing what runs there
/// first (`cgroup.kill`). A missing `dir` is not an error.
pub(crate) fn remove_tree_v2(dir: &Path) -> io::Result<()> {
    v2::remove_tree(&RealFs, dir)
}

/// Removes what dead Paddock processes left below the v2 group `base`: groups
/// named `<prefix><pid>…` whose owner is gone.
pub(crate) fn remove_stale_v2(base: &Path, prefix: &str) {
    v2::remove_stale(&RealFs, base, prefix)
}

/// CPU time in a v2 `cpu.stat` text (`usage_usec`), in nanoseconds.
pub(crate) fn v2_cpu_usage_ns(text: &str) -> u64 {
    v2::cpu_usage_ns(text)
}

/// The cgroup2 mount point of this mount namespace, if one is mounted.
pub fn v2_mount() -> Option<PathBuf> {
    HostLayout::detect().v2.map(|m| m.mount_point)
}

/// Kills every process in the v2 group `dir` and in every group below it through
/// `cgroup.kill` (atomic: a fork in flight dies too, and so do frozen tasks), and
/// waits, up to 5 s, until the kernel reports it empty (`populated 0` in
/// `cgroup.events`). An empty group is left alone.
pub fn kill_v2(dir: &Path) -> io::Result<()> {
    v2::kill(&RealFs, dir, v2::KILL_WAIT)
}

/// Freezes (`cgroup.freeze`) or thaws the v2 group `dir` and every group below it;
/// a freeze waits, up to 5 s, until the kernel reports it `frozen 1` in
/// `cgroup.events`, and a group that does not freeze in time is thawed again.
pub fn set_frozen_v2(dir: &Path, frozen: bool) -> io::Result<()> {
    v2::set_frozen(&RealFs, dir, frozen, PAUSE_FREEZE_WAIT)
}

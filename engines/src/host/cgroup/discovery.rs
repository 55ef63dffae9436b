//! The cgroup hierarchies this mount namespace mounts ([`Hierarchy`]), this
//! process's own place in them, and moving a process back there.

use std::path::PathBuf;

/// One mounted cgroup hierarchy (v1 or v2), for groups an OCI runtime creates in
/// every hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The hierarchy path the mount exposes (`/` unless a subtree is mounted).
    pub mount_root: String,
    /// Its controllers (`["memory"]`, or `[]` for v2 and named hierarchies).
    pub controllers: Vec<String>,
}

impl Hierarchy {
    /// The directory of the absolute cgroup path `path` in this hierarchy.
    pub fn dir(&self, path: &str) -> PathBuf {
        let rel = path.strip_prefix(self.mount_root.as_str()).unwrap_or(path);
        self.mount_point.join(rel.trim_start_matches('/'))
    }
}

/// Every cgroup hierarchy mounted in this mount namespace.
pub fn hierarchies() -> Vec<Hierarchy> {
    let Ok(mountinfo) = crate::host::sys::read_small("/proc/self/mountinfo") else {
        return Vec::new();
    };
    crate::host::sys::mount_lines(&mountinfo)
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .map(|m| Hierarchy {
            mount_point: PathBuf::from(m.point),
            mount_root: m.root.to_string(),
            controllers: if m.fstype == "cgroup" {
                v1_controllers(m.super_opts)
            } else {
                Vec::new()
            },
        })
        .collect()
}

/// The controllers among a v1 cgroup mount's superblock options (`[]` for a named
/// hierarchy such as `name=systemd`).
pub(crate) fn v1_controllers(super_opts: &str) -> Vec<String> {
    super_opts
        .split(',')
        .filter(|o| {
            !o.contains('=')
                && !matches!(*o, "rw" | "ro" | "relatime" | "noexec" | "nosuid" | "nodev")
        })
        .map(String::from)
        .collect()
}

/// This process's own path in the hierarchy holding `controller` (v1).
pub fn own_path(controller: &str) -> Option<String> {
    let cgroups = crate::host::sys::read_small("/proc/self/cgroup").ok()?;
    cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

/// Moves `pid` into this process's own groups, in every hierarchy with
/// controllers (and the v2 one): out of a sandbox's CPU and memory limits.
///
/// For a child that was killed before it could exec (see `spawn::START_LIMIT`): a
/// task dies only once it is scheduled, and in a sandbox whose CPU quota its other
/// processes use up, or whose memory they keep at the limit, it may not run for
/// minutes. It runs no code of its own after the kill, so it may run where Paddock
/// does. Returns how many hierarchies it was moved in.
pub(crate) fn return_to_own_groups(pid: libc::pid_t) -> usize {
    let Ok(own) = crate::host::sys::read_small("/proc/self/cgroup") else {
        return 0;
    };
    let mounted = hierarchies();
    let mut moved = 0;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let wanted: Vec<&str> = controllers.split(',').filter(|c| !c.is_empty()).collect();
        // Named v1 hierarchies (`name=systemd`) limit nothing.
        if wanted.iter().any(|c| c.contains('=')) {
            continue;
        }
        // Every mount of the hierarchy, whole ones first: the first that takes it.
        let mut candidates: Vec<&Hierarchy> = mounted
            .iter()
            .filter(|h| {
                if wanted.is_empty() {
                    h.controllers.is_empty() && h.mount_point.join("cgroup.controllers").exists()
                } else {
                    wanted
                        .iter()
                        .all(|c| h.controllers.iter().any(|have| have == c))
                }
            })
            .collect();
        candidates.sort_by_key(|h| h.mount_root != "/");
        if candidates
            .iter()
            .any(|h| std::fs::write(h.dir(path).join("cgroup.procs"), pid.to_string()).is_ok())
        {
            moved += 1;
        }
    }
    if moved == 0 {
        tracing::warn!(
            pid,
            "a killed child could not be moved out of its sandbox's cgroups"
        );
    }
    moved
}

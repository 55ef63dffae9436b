//! Which cgroup layout the host mounts, read once at start from
//! `/proc/self/mountinfo` and `/proc/self/cgroup`.

use std::path::{Path, PathBuf};

/// The cgroup layouts a host can mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Only cgroup v1 hierarchies (one per controller, or a few combined).
    V1,
    /// v1 controller hierarchies and a cgroup2 mount beside them (usually at
    /// `/sys/fs/cgroup/unified`) that holds few or no controllers.
    Hybrid,
    /// One cgroup2 hierarchy and no v1 controller hierarchy ("unified").
    V2,
    /// No cgroup hierarchy is mounted.
    None,
}

impl Layout {
    /// `v1`, `hybrid`, `v2` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::V1 => "v1",
            Layout::Hybrid => "hybrid",
            Layout::V2 => "v2",
            Layout::None => "none",
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A v1 hierarchy holding one or more controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct V1Mount {
    pub(crate) mount_point: PathBuf,
    pub(crate) mount_root: String,
    pub(crate) controllers: Vec<String>,
}

/// The cgroup2 mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct V2Mount {
    pub(crate) mount_point: PathBuf,
    pub(crate) mount_root: String,
}

/// What the host mounts, and where this process lives in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostLayout {
    pub(crate) v1: Vec<V1Mount>,
    pub(crate) v2: Option<V2Mount>,
    /// This process's path per v1 controller (`memory` → `/a/b`).
    pub(crate) own_v1: Vec<(String, String)>,
    /// This process's path in the v2 hierarchy (the `0::` line).
    pub(crate) own_v2: Option<String>,
}

/// The directory of absolute cgroup path `path` in a hierarchy mounted at
/// `mount_point` that exposes `mount_root`.
pub(crate) fn dir_in(mount_point: &Path, mount_root: &str, path: &str) -> PathBuf {
    let rel = if mount_root == "/" {
        path
    } else {
        path.strip_prefix(mount_root).unwrap_or(path)
    };
    mount_point.join(rel.trim_start_matches('/'))
}

impl HostLayout {
    /// Reads this process's mounts and cgroups.
    pub(crate) fn detect() -> HostLayout {
        let read = |p: &str| crate::host::sys::read_small(p).unwrap_or_default();
        HostLayout::parse(&read("/proc/self/mountinfo"), &read("/proc/self/cgroup"))
    }

    /// Parses the texts of `/proc/self/mountinfo` and `/proc/self/cgroup`.
    pub(crate) fn parse(mountinfo: &str, proc_cgroup: &str) -> HostLayout {
        let mut v1 = Vec::new();
        let mut v2 = None;
        for m in crate::host::sys::mount_lines(mountinfo) {
            let (root, point) = (m.root, m.point);
            match m.fstype {
                "cgroup" => {
                    let controllers = super::v1_controllers(m.super_opts);
                    if !controllers.is_empty() {
                        v1.push(V1Mount {
                            mount_point: PathBuf::from(point),
                            mount_root: root.to_string(),
                            controllers,
                        });
                    }
                }
                "cgroup2" if v2.is_none() => {
                    v2 = Some(V2Mount {
                        mount_point: PathBuf::from(point),
                        mount_root: root.to_string(),
                    })
                }
                _ => {}
            }
        }
        let mut own_v1 = Vec::new();
        let mut own_v2 = None;
        for line in proc_cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if id == "0" && controllers.is_empty() {
                own_v2 = Some(path.to_string());
            } else {
                for c in controllers.split(',').filter(|c| !c.is_empty()) {
                    own_v1.push((c.to_string(), path.to_string()));
                }
            }
        }
        HostLayout {
            v1,
            v2,
            own_v1,
            own_v2,
        }
    }

    /// The layout: v2 with no v1 controller mounted, hybrid with both, v1, or none.
    pub(crate) fn layout(&self) -> Layout {
        match (self.v1.is_empty(), self.v2.is_some()) {
            (true, true) => Layout::V2,
            (false, true) => Layout::Hybrid,
            (false, false) => Layout::V1,
            (true, false) => Layout::None,
        }
    }

    /// This process's group directory for v1 `controller`, when mounted.
    pub(crate) fn v1_dir(&self, controller: &str) -> Option<PathBuf> {
        let mount = self
            .v1
            .iter()
            .find(|m| m.controllers.iter().any(|c| c == controller))?;
        let own = self
            .own_v1
            .iter()
            .find(|(c, _)| c == controller)
            .map(|(_, p)| p.as_str())?;
        Some(dir_in(&mount.mount_point, &mount.mount_root, own))
    }

    /// This process's group directory in the v2 hierarchy, when mounted.
    pub(crate) fn v2_dir(&self) -> Option<PathBuf> {
        let mount = self.v2.as_ref()?;
        let own = self.own_v2.as_deref()?;
        Some(dir_in(&mount.mount_point, &mount.mount_root, own))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
    const HYBRID_CG: &str =
        "9:name=systemd:/\n8:pids:/\n6:freezer:/\n4:memory:/svc/x\n1:cpu:/\n0::/\n";

    #[test]
    fn a_hybrid_host_has_v1_controllers_and_the_unified_mount() {
        let h = HostLayout::parse(HYBRID, HYBRID_CG);
        assert_eq!(h.layout(), Layout::Hybrid);
        // The named systemd hierarchy holds no controller.
        assert_eq!(h.v1.len(), 4);
        assert_eq!(
            h.v1_dir("memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/svc/x"))
        );
        assert_eq!(h.v1_dir("pids"), Some(PathBuf::from("/sys/fs/cgroup/pids")));
        assert_eq!(h.v1_dir("blkio"), None);
        assert_eq!(h.v2_dir(), Some(PathBuf::from("/sys/fs/cgroup/unified")));
    }

    #[test]
    fn a_pure_v2_host_and_a_container_with_a_cgroup_namespace() {
        let mi = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate";
        let h = HostLayout::parse(mi, "0::/system.slice/paddock.service\n");
        assert_eq!(h.layout(), Layout::V2);
        assert_eq!(
            h.v2_dir(),
            Some(PathBuf::from("/sys/fs/cgroup/system.slice/paddock.service"))
        );
        assert_eq!(h.v1_dir("memory"), None);
        // Inside a cgroup namespace the process sees itself at `/`.
        let h = HostLayout::parse(mi, "0::/\n");
        assert_eq!(h.v2_dir(), Some(PathBuf::from("/sys/fs/cgroup")));
        // A bind mount of a subtree: paths are relative to what it exposes.
        let mi = "30 23 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
        let h = HostLayout::parse(mi, "0::/kubepods/pod1/c\n");
        assert_eq!(h.v2_dir(), Some(PathBuf::from("/sys/fs/cgroup/c")));
    }

    #[test]
    fn v1_only_and_nothing_at_all() {
        let mi = "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids";
        let h = HostLayout::parse(mi, "8:pids:/a\n");
        assert_eq!(h.layout(), Layout::V1);
        assert_eq!(h.v2_dir(), None);
        let h = HostLayout::parse("22 1 0:21 / /proc rw - proc proc rw", "");
        assert_eq!(h.layout(), Layout::None);
        assert_eq!(Layout::None.to_string(), "none");
    }
}

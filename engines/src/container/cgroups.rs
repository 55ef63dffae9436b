//! The engine's cgroups: where a container's group lies in each hierarchy, making
//! a sandbox's v2 groups, and killing and removing a container's group.

use std::path::PathBuf;

use super::EngineInner;

impl EngineInner {
    /// The host directory of cgroup `path` in the hierarchy with `controller`: its
    /// v1 hierarchy, or on a pure v2 host the one hierarchy (see `v2` for which
    /// files to use).
    pub(crate) fn cgroup_dir(&self, controller: &str, path: &str) -> Option<PathBuf> {
        if self.v2 {
            return self.v2_dir(path);
        }
        self.hierarchies
            .iter()
            .find(|h| h.controllers.iter().any(|c| c == controller))
            .map(|h| h.dir(path))
    }

    /// The host directory of cgroup `path` in the v2 hierarchy.
    pub(crate) fn v2_dir(&self, path: &str) -> Option<PathBuf> {
        let mount = self.v2_mount.as_ref()?;
        self.hierarchies
            .iter()
            .find(|h| &h.mount_point == mount)
            .map(|h| h.dir(path))
    }

    /// Creates the v2 groups from the engine's down to `path` (a sandbox's),
    /// handing the controllers down, so that the sandbox's group has its accounting
    /// files and can be frozen before any container runs. A no-op unless pure v2.
    pub(crate) fn ensure_v2_group(&self, path: &str) -> std::io::Result<()> {
        if !self.v2 {
            return Ok(());
        }
        for d in group_chain(&self.cgroup_base, path) {
            if let Some(dir) = self.v2_dir(&d) {
                crate::host::cgroup::ensure_v2_parent(&dir, &self.v2_controllers)?;
            }
        }
        Ok(())
    }

    /// Kills every process of the container whose cgroup is `path`: in v1 frozen
    /// first, so that nothing forks past the kill (a paused sandbox's group, the
    /// parent, is thawed first: frozen tasks do not die); in v2 through
    /// `cgroup.kill`, which a fork cannot race and frozen tasks do not survive.
    pub(crate) fn kill_container(&self, path: &str) -> std::io::Result<()> {
        if self.v2 {
            return match self.v2_dir(path) {
                Some(dir) if dir.exists() => crate::host::cgroup::kill_v2(&dir),
                _ => Ok(()),
            };
        }
        let Some(pids) = self.cgroup_dir("pids", path) else {
            return Ok(());
        };
        let freezer = self.cgroup_dir("freezer", path);
        if let Some(parent) = path.rsplit_once('/').map(|(p, _)| p) {
            if let Some(dir) = self.cgroup_dir("freezer", parent) {
                if dir.exists() {
                    let _ = crate::host::cgroup::set_frozen(&dir, false);
                }
            }
        }
        crate::host::cgroup::kill_dirs(&pids, freezer.as_deref())
    }

    /// Removes cgroup `path` and everything below it from every hierarchy.
    pub(crate) fn remove_cgroup(&self, path: &str) {
        for h in &self.hierarchies {
            let removed = if self.v2_mount.as_ref() == Some(&h.mount_point) {
                crate::host::cgroup::remove_tree_v2(&h.dir(path))
            } else {
                crate::host::cgroup::remove_tree(&h.dir(path))
            };
            if let Err(e) = removed {
                tracing::warn!(path, error = %e, "a container cgroup could not be removed");
            }
        }
    }
}

/// The cgroup paths from `base` down to `path` (below it), outermost first.
fn group_chain(base: &str, path: &str) -> Vec<String> {
    let rel = path
        .strip_prefix(base)
        .filter(|r| r.is_empty() || r.starts_with('/'))
        .unwrap_or("");
    let mut at = base.to_string();
    let mut chain = vec![at.clone()];
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        at = format!("{at}/{part}");
        chain.push(at.clone());
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::group_chain;

    #[test]
    fn the_v2_groups_of_a_sandbox_are_made_from_the_engines_down() {
        assert_eq!(
            group_chain("/svc/paddock-ct-1", "/svc/paddock-ct-1/ct-a/w0"),
            [
                "/svc/paddock-ct-1",
                "/svc/paddock-ct-1/ct-a",
                "/svc/paddock-ct-1/ct-a/w0"
            ]
        );
        assert_eq!(group_chain("/e", "/e"), ["/e"]);
        // A path outside the engine's group is never walked.
        assert_eq!(group_chain("/e", "/elsewhere/x"), ["/e"]);
    }
}

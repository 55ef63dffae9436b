//! What a container's programs see of where they run: the working directory an
//! execution, a process or a terminal starts in, and the environment they get.

use std::collections::BTreeMap;
use std::path::Path;

use paddock_core::Result;

use super::bundle::CONTAINER_PATH;
use super::sandbox::ContainerSandbox;

impl ContainerSandbox {
    /// The working directory inside the container for `cwd`, and the environment.
    ///
    /// The environment is an allow-list, never the host's: the host variables
    /// `container.env_passthrough` names, then the container's own `PATH`, `HOME`,
    /// `PWD` and `TMPDIR`, then `extra` (the request's `env`).
    pub(super) fn guest_env(
        &self,
        cwd: Option<&str>,
        extra: &BTreeMap<String, String>,
    ) -> Result<(String, BTreeMap<String, String>)> {
        let cwd = match cwd {
            Some(c) => self.guest_cwd(c)?,
            None => self.home().to_string(),
        };
        let mut vars = guest_vars(&self.engine.passthrough_env, self.home(), &cwd, extra);
        if matches!(
            self.spec.network,
            paddock_core::NetworkPolicy::Allowlist { .. }
        ) {
            // Pointed at the gateway's proxy unless the request says otherwise (the
            // namespace holds either way).
            for (k, v) in paddock_egress::Gateway::proxy_env() {
                vars.entry(k).or_insert(v);
            }
        }
        Ok((cwd, vars))
    }

    /// The container path of the working directory `cwd`.
    ///
    /// An absolute path outside the home is a directory of the container's own
    /// root (`/tmp`, `/etc`): the container's processes see the container, not the
    /// host, so any directory there is theirs to work in, and it is passed as is
    /// (one that does not exist fails the program's start). The home (`/workspace/…`
    /// as the program sees it), a path relative to it, or a host path inside the
    /// workdir are resolved on the host beneath the workdir (see
    /// [`Workdir::resolve_dir`](crate::host::workdir::Workdir::resolve_dir)): they must exist, and a symlink out of the workdir
    /// is refused with `PATH_ESCAPE`, as the files API refuses it.
    pub(super) fn guest_cwd(&self, cwd: &str) -> Result<String> {
        let home = self.home();
        let under_home = cwd
            .strip_prefix(home)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'));
        if cwd.starts_with('/')
            && under_home.is_none()
            && !Path::new(cwd).starts_with(self.workdir.root())
        {
            return guest_dir(cwd);
        }
        let inside = match under_home {
            Some(rest) => rest.trim_start_matches('/'),
            None => cwd,
        };
        let dir = self.workdir.resolve_dir_as(inside, cwd)?;
        let rel = dir
            .strip_prefix(self.workdir.root())
            .unwrap_or(Path::new(""));
        Ok(if rel.as_os_str().is_empty() {
            home.to_string()
        } else {
            format!("{home}/{}", rel.to_string_lossy())
        })
    }
}

/// The most bytes of a working directory given as a container path.
const MAX_GUEST_DIR: usize = 4096;

/// `path`, an absolute directory of the container's root, as the container's
/// processes will `chdir` to it: `INVALID_OPTIONS` for a NUL byte, a path longer
/// than `PATH_MAX`, a `..` component (what it names depends on the root's
/// symlinks, which the runtime would follow before the container's own view is
/// set up), or a path under `/proc`, `/sys` or `/dev` (kernel views, never a
/// program's working directory; `/proc/self/fd/N` is how a leaked descriptor of the
/// runtime would be reached).
fn guest_dir(path: &str) -> Result<String> {
    let bad = |why: &str| {
        Err(paddock_core::Error::invalid_options(
            "cwd",
            format!(
                "`{}` is not a working directory here: {why}",
                path.escape_debug()
            ),
        ))
    };
    if path.contains('\0') || path.len() >= MAX_GUEST_DIR {
        return bad(&format!("no NUL bytes, under {MAX_GUEST_DIR} bytes"));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return bad("give it without `..`");
    }
    if matches!(parts.first(), Some(&("proc" | "sys" | "dev"))) {
        return bad("/proc, /sys and /dev are the kernel's views, not directories to work in");
    }
    Ok(format!("/{}", parts.join("/")))
}

/// A container process's environment: `passthrough` (host variables the
/// configuration lists), then the variables the engine owns (`PATH`, `HOME`, `PWD`,
/// `TMPDIR`, see `crate::CONTAINER_OWN_ENV`), then `extra`.
fn guest_vars(
    passthrough: &BTreeMap<String, String>,
    home: &str,
    cwd: &str,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut vars = passthrough.clone();
    vars.insert("PATH".into(), CONTAINER_PATH.into());
    vars.insert("HOME".into(), home.into());
    vars.insert("PWD".into(), cwd.into());
    vars.insert("TMPDIR".into(), "/tmp".into());
    for (k, v) in extra {
        vars.insert(k.clone(), v.clone());
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::super::bundle::WORKSPACE;
    use super::*;

    #[test]
    fn a_directory_of_the_container_root_is_passed_as_is() {
        assert_eq!(guest_dir("/tmp").unwrap(), "/tmp");
        assert_eq!(guest_dir("//tmp/./x/").unwrap(), "/tmp/x");
        assert_eq!(guest_dir("/").unwrap(), "/");
        for bad in [
            "/var/../tmp",
            "/tmp/..",
            "/proc/self/fd/7",
            "/proc",
            "/sys/fs",
            "/dev/shm",
            "/tmp/\0x",
        ] {
            assert!(guest_dir(bad).is_err(), "{bad}");
        }
        assert!(guest_dir(&format!("/{}", "a".repeat(5000))).is_err());
    }

    #[test]
    fn guest_vars_are_the_listed_the_own_and_the_requested() {
        use std::collections::BTreeMap;
        let host = [
            ("DATABASE_URL", "postgres://u:pass@h/db"),
            ("PADDOCK_LEAK_PROBE", "x"),
            ("PATH", "/host/only/bin"),
            ("HOME", "/root"),
            ("LISTED", "yes"),
        ];
        let passthrough = crate::env::listed_env(host, &["LISTED".to_string()]);
        let extra = BTreeMap::from([("FROM_REQUEST".to_string(), "r".to_string())]);
        let vars = guest_vars(&passthrough, WORKSPACE, "/workspace/sub", &extra);
        let own: Vec<&str> = crate::CONTAINER_OWN_ENV.to_vec();
        let mut names: Vec<&str> = vars.keys().map(String::as_str).collect();
        names.retain(|n| !own.contains(n));
        assert_eq!(names, ["FROM_REQUEST", "LISTED"], "{vars:?}");
        for name in own {
            assert!(vars.contains_key(name), "{name} is missing: {vars:?}");
        }
        assert_eq!(vars["PATH"], CONTAINER_PATH);
        assert_eq!(vars["HOME"], WORKSPACE);
        assert_eq!(vars["PWD"], "/workspace/sub");
        assert_eq!(vars["LISTED"], "yes");
        // A request may still set what the engine owns.
        let extra = BTreeMap::from([("PATH".to_string(), "/opt/bin".to_string())]);
        assert_eq!(
            guest_vars(&passthrough, WORKSPACE, WORKSPACE, &extra)["PATH"],
            "/opt/bin"
        );
    }
}

//! Finding and driving the OCI runtime (crun or runc).

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::OciRuntime;

use crate::host::spawn::{spawn, SpawnSpec, SpawnedChild};
use crate::host::sys::{self, cstring};

/// Which runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    /// crun.
    Crun,
    /// runc.
    Runc,
    /// gVisor's runsc: a user-space kernel.
    Runsc,
}

impl RuntimeKind {
    /// `crun`, `runc` or `runsc`.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Crun => "crun",
            RuntimeKind::Runc => "runc",
            RuntimeKind::Runsc => "runsc",
        }
    }

    /// Whether a container's processes run on a kernel of the runtime's own
    /// (gVisor), so that host-side views of them (their namespaces, descriptors
    /// passed in or out) do not reach them.
    pub fn user_space_kernel(self) -> bool {
        self == RuntimeKind::Runsc
    }
}

/// A runtime binary and how to start it.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) kind: RuntimeKind,
    pub(crate) path: PathBuf,
    /// The mount namespace crun runs in on a hybrid cgroup host (see
    /// [`crate::host::netns::private_mounts_without_unified_cgroup`]).
    pub(crate) mntns: Option<OwnedFd>,
    /// `--root`: where the runtime keeps its container state.
    pub(crate) state: PathBuf,
    /// Global flags after `--root` (runsc's platform, network and seccomp).
    pub(crate) flags: Vec<String>,
}

/// Whether cgroup v1 controllers and a v2 hierarchy are both mounted (crun 1.8
/// refuses that layout).
pub(crate) fn hybrid_cgroups() -> bool {
    let hs = crate::host::cgroup::hierarchies();
    hs.iter().any(|h| !h.controllers.is_empty())
        && hs
            .iter()
            .any(|h| h.controllers.is_empty() && h.mount_point.ends_with("unified"))
}

/// The candidate runtimes for `choice`, in the order to try: (kind, binary) or why
/// the binary is missing.
pub(crate) fn candidates(
    choice: OciRuntime,
    path_override: Option<&Path>,
) -> Vec<(RuntimeKind, Result<PathBuf, String>)> {
    let kinds: &[RuntimeKind] = match choice {
        OciRuntime::Auto => &[RuntimeKind::Crun, RuntimeKind::Runc],
        OciRuntime::Crun => &[RuntimeKind::Crun],
        OciRuntime::Runc => &[RuntimeKind::Runc],
        OciRuntime::Runsc => &[RuntimeKind::Runsc],
    };
    let path_var = std::env::var("PATH")
        .unwrap_or_else(|_| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    // Debian puts runc in /usr/sbin, which a non-login PATH may lack.
    let search = format!("{path_var}:/usr/local/sbin:/usr/sbin:/sbin");
    kinds
        .iter()
        .map(|&kind| {
            let found = match path_override {
                Some(p) if p.is_file() => Ok(p.to_path_buf()),
                Some(p) => Err(format!(
                    "container.runtime_path `{}` is not a file",
                    p.display()
                )),
                None => crate::env::resolve_program(kind.as_str(), &search, Path::new("/"))
                    .ok_or_else(|| {
                        format!(
                            "`{}` is not installed (install it, for example `apt-get install {}`)",
                            kind.as_str(),
                            kind.as_str()
                        )
                    }),
            };
            (kind, found)
        })
        .collect()
}

/// The global flags of runtime `kind`: for runsc, the platform, no network device
/// but loopback (the only policy the engine offers), and the OCI seccomp profile
/// applied by gVisor's kernel (runsc ignores it otherwise).
pub(crate) fn global_flags(
    kind: RuntimeKind,
    platform: crate::RunscPlatform,
    seccomp: bool,
) -> Vec<String> {
    match kind {
        RuntimeKind::Runsc => {
            let mut flags = vec![
                format!("--platform={}", platform.as_str()),
                "--network=none".to_string(),
            ];
            if seccomp {
                flags.push("--oci-seccomp".to_string());
            }
            flags
        }
        RuntimeKind::Crun | RuntimeKind::Runc => Vec::new(),
    }
}

/// What a finished runtime command printed and how it ended.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) code: Option<i32>,
    pub(crate) output: String,
}

impl Runtime {
    /// The spawn spec for `runtime --root <state> <args…>`, with the given stdio, in
    /// `cwd`.
    pub(crate) fn spec(
        &self,
        args: &[&str],
        stdio: [OwnedFd; 3],
        cwd: &Path,
    ) -> std::io::Result<SpawnSpec> {
        let mut argv = vec![
            cstring(self.kind.as_str())?,
            cstring("--root")?,
            cstring(self.state.as_os_str().as_encoded_bytes())?,
        ];
        for f in &self.flags {
            argv.push(cstring(f.as_str())?);
        }
        for a in args {
            argv.push(cstring(*a)?);
        }
        Ok(SpawnSpec {
            path: cstring(self.path.as_os_str().as_encoded_bytes())?,
            argv,
            env: vec![cstring(
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )?],
            cwd: cstring(cwd.as_os_str().as_encoded_bytes())?,
            stdio,
            fd3: None,
            rlimits: Vec::new(),
            cgroup_procs: Vec::new(),
            netns: None,
            mntns: self.mntns.as_ref().map(|f| f.as_raw_fd()),
            controlling_tty: false,
        })
    }

    /// Starts the runtime with `args`.
    pub(crate) fn start(
        &self,
        args: &[&str],
        stdio: [OwnedFd; 3],
        cwd: &Path,
    ) -> std::io::Result<SpawnedChild> {
        let spec = self.spec(args, stdio, cwd)?;
        spawn(&spec).map_err(|e| {
            let stage = e.stage.map_or("starting the runtime", |s| s.describe());
            std::io::Error::new(e.error.kind(), format!("{stage}: {}", e.error))
        })
    }

    /// Runs `runtime <args…>` to its end (blocking) and returns its exit code and its
    /// stdout and stderr together (at most 64 KiB).
    pub(crate) fn run_blocking(&self, args: &[&str], cwd: &Path) -> std::io::Result<Finished> {
        let (r, w) = sys::pipe()?;
        let w2 = w.try_clone()?;
        let null: OwnedFd = std::fs::File::open("/dev/null")?.into();
        let child = self.start(args, [null, w, w2], cwd)?;
        let mut output = Vec::new();
        let _ = std::fs::File::from(r)
            .take(64 << 10)
            .read_to_end(&mut output);
        let status = sys::reap(child.pid)?;
        drop(child);
        Ok(Finished {
            code: status.code,
            output: String::from_utf8_lossy(&output).trim().to_string(),
        })
    }
}

//! The container engine: `strict` isolation on a real OCI runtime (crun, or runc).
//!
//! Each execution runs in a container created from a generated bundle: a read-only
//! root (by default the host's `/usr` and `/etc` bound read-only, with `bin`, `lib`,
//! `lib64` and `sbin` links, a tmpfs `/tmp` and the sandbox workdir at
//! `/workspace`), new pid, mount, ipc, uts, cgroup and network namespaces (the
//! network one holds only `lo`; under network `allowlist` or `unrestricted` it is
//! the sandbox's egress gateway's, which reaches out only through Paddock's proxy:
//! see `paddock-egress`), cgroup memory (swap equal to memory), pids and CPU
//! quota limits, a seccomp profile, `no_new_privs`, three capabilities and masked
//! `/proc` paths. The runtime is started without forking the host; a deadline,
//! cancel or destroy kills every process of the container through its cgroup (the
//! v1 freezer first, or v2's `cgroup.kill`), which ends the container.
//!
//! Environment: a container never gets the host's environment. Its processes see
//! the variables the engine sets (`PATH` for the container's root, `HOME` and `PWD`
//! in `/workspace`, `TMPDIR=/tmp`), the host variables `container.env_passthrough`
//! names (read once, when the engine starts) and the request's `env`; nothing else.
//!
//! Cgroups: every container's `cgroupsPath` lies under the cgroup this process lives
//! in (its memory hierarchy's path, or on a pure v2 host the v2 placement of
//! `host::cgroup`), below one group per engine and one per sandbox.
//! The sandbox group carries the same memory limit, so that a kill by the OOM killer
//! can be told apart after the runtime has removed the container's own group. The
//! engine removes the groups, bundles and runtime state it made when a sandbox is
//! destroyed, and sweeps those of a Paddock process that died when it starts.
//!
//! On a host with the hybrid cgroup layout (v1 controllers plus a v2 mount at
//! `/sys/fs/cgroup/unified`), crun 1.8 refuses to run; the engine runs it in a private
//! mount namespace without that mount, leaving the host untouched. When crun still
//! cannot run a container, `auto` falls back to runc and says why.

mod agent;
mod bundle;
mod control;
mod exec;
mod interactive;
mod runner;
mod runtime;
mod sandbox;
mod userns;
mod warm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use paddock_core::{
    Capabilities, ContainerConfig, Engine, EngineName, Error, ErrorCode, IsolationLevel, Language,
    Limits, OciRuntime, ProgramKind, Result, Sandbox, SandboxSpec,
};

pub use agent::{embedded_agent_size, AgentSource};
pub use runtime::RuntimeKind;
pub use sandbox::ContainerSandbox;

use crate::host::cgroup::Hierarchy;
use runtime::Runtime;

static NEXT_ENGINE: AtomicU64 = AtomicU64::new(0);

/// The prefix of everything the engine names on the host: directories, cgroups.
const PREFIX: &str = "paddock-ct-";

/// The runtime the engine drives, as found at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// crun or runc.
    pub kind: RuntimeKind,
    /// The binary.
    pub path: PathBuf,
    /// Its `--version` first line.
    pub version: String,
    /// Whether crun runs in a private mount namespace (hybrid cgroup host).
    pub private_mount_namespace: bool,
    /// Why a preferred runtime was passed over, when one was.
    pub fallback_reason: Option<String>,
    /// Whether containers get a user namespace (their root is an unprivileged host
    /// id of their sandbox's range).
    pub user_namespace: bool,
    /// runsc's platform (`ptrace`, `kvm`, `systrap`); `None` for crun and runc.
    pub platform: Option<String>,
}

/// The container engine. Cheap to clone; clones share one host setup.
#[derive(Debug, Clone)]
pub struct ContainerEngine {
    inner: Arc<EngineInner>,
}

#[derive(Debug)]
pub(crate) struct EngineInner {
    /// The name the engine is registered under: `container`, or an
    /// `[engines.NAME]` section's.
    pub(crate) name: EngineName,
    pub(crate) caps: Capabilities,
    pub(crate) defaults: Limits,
    /// The host variables `container.env_passthrough` names, read when the engine
    /// started (see [`crate::env::listed_env`]); nothing else of the host's
    /// environment reaches a container.
    pub(crate) passthrough_env: BTreeMap<String, String>,
    pub(crate) runtime: Runtime,
    /// How sandboxes' egress gateways are made, or why allowlists are not enforced.
    pub(crate) egress: std::result::Result<paddock_egress::GatewayConfig, String>,
    pub(crate) info: RuntimeInfo,
    /// The engine's directory: `rootfs/`, `state/`, `bundles/`, `sandboxes/`.
    pub(crate) root: PathBuf,
    pub(crate) rootfs: PathBuf,
    /// Whether `rootfs` is the generated one (host `/usr` and `/etc` bound in).
    pub(crate) host_usr: bool,
    /// The engine's cgroup path (absolute, in cgroup terms).
    pub(crate) cgroup_base: String,
    pub(crate) hierarchies: Vec<Hierarchy>,
    /// The cgroup2 mount, when the host has one.
    pub(crate) v2_mount: Option<PathBuf>,
    /// Pure v2: no v1 `memory` hierarchy, every group file is in the v2 mount (the
    /// controllers handed to the engine's groups are in `v2_controllers`).
    pub(crate) v2: bool,
    pub(crate) v2_controllers: Vec<String>,
    pub(crate) cpu_quota_us: u64,
    pub(crate) seccomp: bool,
    /// Interpreter paths inside the container, by language.
    pub(crate) interpreters: BTreeMap<Language, String>,
    /// The `paddock-agent` binary for warm containers, or why there are none.
    pub(crate) agent: std::result::Result<PathBuf, String>,
    /// Where `agent` came from, when there is one.
    pub(crate) agent_source: Option<AgentSource>,
    /// Warm interpreters inside warm containers (`container.runners`), when on.
    pub(crate) runners: Option<runner::RunnerSetup>,
    /// The sandboxes' own filesystems (the disk quota), mounted below
    /// `sandboxes/`, or why there are none.
    pub(crate) disks: std::result::Result<crate::host::volume::Disks, String>,
    /// The host id ranges of the sandboxes' user namespaces, when containers get one.
    pub(crate) userns: Option<Arc<userns::IdRanges>>,
    /// How recently leases used each language's warm runner (see
    /// [`runner::RunnerDemand`]).
    pub(crate) runner_demand: runner::RunnerDemand,
    /// Used warm containers reset in place at a recycle, and replaced instead.
    pub(crate) warm_resets: (AtomicU64, AtomicU64),
}

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

impl Drop for EngineInner {
    fn drop(&mut self) {
        self.remove_cgroup(&self.cgroup_base.clone());
        if let Ok(disks) = &self.disks {
            disks.unshare_parent(&self.root.join("sandboxes"));
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl ContainerEngine {
    /// Starts the engine with [`Limits::defaults`] as the default limits.
    pub fn new(config: &ContainerConfig) -> Result<ContainerEngine> {
        ContainerEngine::with_defaults(config, Limits::defaults())
    }

    /// Starts the engine: finds a runtime that can run a container here (a probe
    /// container runs `/bin/true`), sweeps what dead Paddock processes left behind,
    /// and prepares the root filesystem.
    pub fn with_defaults(config: &ContainerConfig, defaults: Limits) -> Result<ContainerEngine> {
        ContainerEngine::named(EngineName::CONTAINER, config, defaults)
    }

    /// Starts the engine under another name than `container` (an `[engines.NAME]`
    /// section's), with its own settings: see [`ContainerEngine::with_defaults`].
    /// Engines of one process share nothing but the host's user-namespace slots,
    /// which they take in turn.
    pub fn named(
        name: EngineName,
        config: &ContainerConfig,
        defaults: Limits,
    ) -> Result<ContainerEngine> {
        config.validate()?;
        if !config.enabled {
            return Err(Error::invalid_config(
                "container.enabled",
                "the container engine is disabled in the configuration",
            ));
        }
        let defaults = defaults.or(&Limits::defaults());
        defaults.validate("limits", true)?;
        let unavailable = |why: String| Error::new(ErrorCode::EngineFailed, why);
        // The section its settings come from, for messages.
        let section = if name == EngineName::CONTAINER {
            "container".to_string()
        } else {
            format!("engines.{name}")
        };

        // gVisor's kernel stands between the program and the host instead.
        let user_namespace = config.user_namespace && config.runtime != OciRuntime::Runsc;
        let parent = match &config.workdir_root {
            Some(p) => p.clone(),
            None if user_namespace => {
                userns::engine_parent(&std::env::temp_dir()).map_err(unavailable)?
            }
            None => std::env::temp_dir(),
        };
        std::fs::create_dir_all(&parent).map_err(|e| {
            Error::invalid_config(
                "container.workdir_root",
                format!("cannot create `{}`: {e}", parent.display()),
            )
        })?;
        let hierarchies = crate::host::cgroup::hierarchies();
        let v2_mount = crate::host::cgroup::v2_mount();
        // v1 where the memory hierarchy is mounted (hybrid hosts included: the
        // runtimes put their limits there); else the v2 hierarchy, under a placement
        // that may hand controllers down (see `host::cgroup`).
        let (own, v2, v2_controllers) = match crate::host::cgroup::own_path("memory") {
            Some(own) if hierarchies.iter().any(|h| h.controllers.iter().any(|c| c == "memory")) => {
                (own, false, Vec::new())
            }
            _ => match crate::host::cgroup::v2_container_base() {
                Ok((path, _, controllers)) => (path, true, controllers),
                Err(why) => {
                    return Err(unavailable(format!(
                        "the container engine needs the cgroup v1 `memory` hierarchy or cgroup v2 with the memory and pids controllers: {why}"
                    )))
                }
            },
        };
        let own = own.trim_end_matches('/').to_string();
        // Dead owners' filesystems first: their directories can go only once nothing
        // is mounted in them.
        crate::host::volume::sweep_stale_mounts();
        sweep_stale(&parent, &own, &hierarchies, v2_mount.as_deref(), config);

        // A random part (the tail of a UUIDv7 is random), so that nobody can take
        // the name first in a shared temp dir.
        let random = uuid::Uuid::now_v7().simple().to_string();
        let dir_name = format!(
            "{PREFIX}{}-{}-{}{}",
            std::process::id(),
            NEXT_ENGINE.fetch_add(1, Ordering::Relaxed),
            &random[random.len() - 8..],
            crate::host::owner::namespace_suffix()
        );
        let root = parent.join(&dir_name);
        if user_namespace {
            if let Some(closed) = userns::closed_ancestor(&parent) {
                return Err(unavailable(format!(
                    "`{}` is closed to other users (mode without o+x), and the containers' mapped root must pass through it to `{}`; give it o+x, or set {section}.workdir_root to a directory whose every ancestor has it",
                    closed.display(),
                    parent.display()
                )));
            }
        }
        let setup = || -> std::io::Result<()> {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            // Private: workdirs hold what containers wrote, set-uid files included,
            // and nobody else on the host may reach them. With user namespaces the
            // containers' root is another host user, which must pass through to its
            // workdir, root and bundle (mode 0711: no listing); the workdirs
            // themselves are 0700 and its own, and what the engine writes for the
            // runtime alone (config.json, the runtime's state) is 0600/0700.
            let mut dir = std::fs::DirBuilder::new();
            dir.mode(0o700);
            dir.create(&root)?;
            for d in ["state", "bundles", "sandboxes"] {
                dir.create(root.join(d))?;
            }
            if user_namespace {
                for d in [&root, &root.join("bundles"), &root.join("sandboxes")] {
                    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))?;
                }
            }
            Ok(())
        };
        setup().map_err(|e| Error::engine_io("creating the container engine's directory", e))?;
        // The sandboxes' filesystems are mounted below `sandboxes/`, which is made a
        // shared mount first: the runtime's own mount namespace (on a hybrid cgroup
        // host) is made after, as a slave, and so sees every one of them.
        let disks = {
            let disks = crate::host::volume::Disks::new(&root);
            match disks.backend() {
                None => Err(disks.notes().join("; ")),
                Some(_) => match disks.share_parent(&root.join("sandboxes")) {
                    Ok(()) => Ok(disks),
                    Err(e) => Err(format!(
                        "cannot make the sandboxes' directory a shared mount: {e}"
                    )),
                },
            }
        };
        let cleanup = |root: &Path| {
            if let Ok(d) = &disks {
                d.unshare_parent(&root.join("sandboxes"));
            }
            let _ = std::fs::remove_dir_all(root);
        };
        let (rootfs, host_usr) = match &config.rootfs {
            Some(r) => {
                if !r.is_dir() {
                    cleanup(&root);
                    return Err(Error::invalid_config(
                        &format!("{section}.rootfs"),
                        format!("`{}` is not a directory", r.display()),
                    ));
                }
                if user_namespace {
                    bundle::prepare_mount_points(r);
                }
                (r.clone(), false)
            }
            None => {
                let r = root.join("rootfs");
                if let Err(e) = bundle::generate_rootfs(&r) {
                    cleanup(&root);
                    return Err(Error::engine_io("generating the root filesystem", e));
                }
                (r, true)
            }
        };
        let cgroup_base = format!("{own}/{dir_name}");

        let mut inner = EngineInner {
            name,
            caps: Capabilities::new(IsolationLevel::Strict, &[], &[], &[]),
            defaults,
            passthrough_env: crate::env::listed_env(std::env::vars_os(), &config.env_passthrough),
            runtime: Runtime {
                kind: RuntimeKind::Crun,
                path: PathBuf::new(),
                mntns: None,
                state: root.join("state"),
                flags: Vec::new(),
            },
            info: RuntimeInfo {
                kind: RuntimeKind::Crun,
                path: PathBuf::new(),
                version: String::new(),
                private_mount_namespace: false,
                fallback_reason: None,
                user_namespace,
                platform: None,
            },
            root: root.clone(),
            rootfs,
            host_usr,
            cgroup_base,
            hierarchies,
            v2_mount,
            v2,
            v2_controllers,
            cpu_quota_us: (config.cpus * 100_000.0).round() as u64,
            seccomp: config.seccomp,
            interpreters: BTreeMap::new(),
            agent: Err("disabled by configuration (`container.warm = false`)".into()),
            agent_source: None,
            runners: None,
            disks,
            userns: None,
            egress: Err("not checked yet".into()),
            runner_demand: Default::default(),
            warm_resets: Default::default(),
        };
        if config.warm {
            match agent::find(config.agent_path.as_deref(), &root) {
                Ok((path, source)) => {
                    inner.agent = Ok(path);
                    inner.agent_source = Some(source);
                }
                Err(why) => inner.agent = Err(why),
            }
        }
        if user_namespace {
            match userns::IdRanges::new(
                &userns::lock_parent(),
                config.userns_first_id,
                config.userns_slots,
            ) {
                Ok(r) => inner.userns = Some(r),
                Err(e) => {
                    drop(inner);
                    return Err(Error::engine_io(
                        "preparing the user-namespace id ranges (container.user_namespace)",
                        e,
                    ));
                }
            }
        }

        // Try the runtimes in order; the first that runs a probe container wins.
        let mut passed_over: Vec<String> = Vec::new();
        let mut chosen = None;
        for (kind, found) in runtime::candidates(config.runtime, config.runtime_path.as_deref()) {
            let path = match found {
                Ok(p) => p,
                Err(why) => {
                    passed_over.push(why);
                    continue;
                }
            };
            let mntns = if kind == RuntimeKind::Crun && runtime::hybrid_cgroups() {
                match crate::host::netns::private_mounts_without_unified_cgroup() {
                    Ok(fd) => Some(fd),
                    Err(e) => {
                        passed_over.push(format!(
                            "crun needs a private mount namespace on this hybrid cgroup host, which could not be made: {e}"
                        ));
                        continue;
                    }
                }
            } else {
                None
            };
            inner.runtime = Runtime {
                kind,
                path: path.clone(),
                mntns,
                state: root.join("state"),
                flags: runtime::global_flags(kind, config.runsc_platform, config.seccomp),
            };
            match exec::probe(&inner) {
                Ok(()) => {
                    let version = inner
                        .runtime
                        .run_blocking(&["--version"], &root)
                        .map(|f| f.output.lines().next().unwrap_or("").to_string())
                        .unwrap_or_default();
                    chosen = Some(RuntimeInfo {
                        kind,
                        path,
                        version,
                        private_mount_namespace: inner.runtime.mntns.is_some(),
                        fallback_reason: (!passed_over.is_empty()).then(|| passed_over.join("; ")),
                        user_namespace,
                        platform: (kind == RuntimeKind::Runsc)
                            .then(|| config.runsc_platform.as_str().to_string()),
                    });
                    break;
                }
                Err(why) => passed_over.push(format!(
                    "{} could not run a container here: {why}",
                    kind.as_str()
                )),
            }
        }
        let Some(info) = chosen else {
            drop(inner);
            // One configured path is passed over once per runtime kind.
            passed_over.dedup();
            let hint = if user_namespace {
                " (containers get a user namespace: if the kernel or runtime cannot give one, set container.user_namespace = false)"
            } else {
                ""
            };
            return Err(unavailable(format!(
                "no OCI runtime can run containers on this host: {}{hint}",
                passed_over.join("; ")
            )));
        };
        if let Some(why) = &info.fallback_reason {
            tracing::warn!(runtime = info.kind.as_str(), reason = %why, "container engine fell back");
        }
        inner.info = info;

        // Interpreters as the container sees them.
        for (lang, names) in [
            (Language::Python, &["python3"][..]),
            (Language::Javascript, &["node", "nodejs"][..]),
            (Language::Shell, &["sh"][..]),
        ] {
            // The generated root binds the host's /usr, and its /bin is a link there.
            let dirs: &[&str] = if inner.host_usr {
                &["/usr/local/bin", "/usr/bin"]
            } else {
                &["/usr/local/bin", "/usr/bin", "/bin"]
            };
            'found: for dir in dirs {
                for name in names {
                    let inside = format!("{dir}/{name}");
                    let on_host = if inner.host_usr {
                        PathBuf::from(&inside)
                    } else {
                        inner.rootfs.join(inside.trim_start_matches('/'))
                    };
                    if on_host.exists() {
                        inner.interpreters.insert(lang, inside);
                        break 'found;
                    }
                }
            }
        }
        let mut programs = vec![ProgramKind::Command];
        programs.extend(inner.interpreters.keys().map(|l| ProgramKind::Code(*l)));
        let mut features = vec![
            "streaming",
            "files",
            "output_cap",
            "cgroup",
            "seccomp",
            paddock_core::engine::FEATURE_HOME,
        ];
        let v1_has = |controller: &str| {
            inner
                .hierarchies
                .iter()
                .any(|h| h.controllers.iter().any(|c| c == controller))
        };
        // Pausing: the v1 freezer, or `cgroup.freeze` on a pure v2 host.
        if inner.v2 || v1_has("freezer") {
            features.push("pause");
        }
        // The bundle's CPU quota binds where the runtime has a CPU controller.
        let cpu = if inner.v2 {
            inner.v2_controllers.iter().any(|c| c == "cpu")
        } else {
            v1_has("cpu")
        };
        if inner.agent.is_ok() && !inner.runtime.kind.user_space_kernel() {
            // Warm interpreters in the warm container, started by its agent.
            inner.runners = runner::RunnerSetup::prepare(&config.runners, &root.join("runners"))?;
            // In the warm container, through its agent.
            features.extend([
                paddock_core::interactive::FEATURE_PROCESS,
                paddock_core::interactive::FEATURE_TERMINAL,
                paddock_core::interactive::FEATURE_TCP,
            ]);
        }
        // Allowlists and `unrestricted`: a gateway's namespace joined by path. Not on
        // gVisor, whose own network stack would not reach the gateway's listeners.
        inner.egress = if inner.runtime.kind.user_space_kernel() {
            Err("gVisor (runsc) runs its own network stack, which does not reach the egress gateway".into())
        } else {
            crate::host::egress::gateway_config(&config.egress)?
        };
        let mut network = vec!["none"];
        if inner.egress.is_ok() {
            network.extend(["allowlist", "unrestricted"]);
        }
        inner.caps = Capabilities::new(IsolationLevel::Strict, &programs, &network, &features)
            .with_limits(&[
                "memory_bytes",
                "cpu_ms",
                "pids",
                "max_output_bytes",
                "file_size_bytes",
                "open_files",
            ])
            .with_limits(if cpu { &["cpu_millicores"] } else { &[] });
        if inner.disks.is_ok() {
            let caps = std::mem::replace(
                &mut inner.caps,
                Capabilities::new(IsolationLevel::Strict, &[], &[], &[]),
            );
            inner.caps = caps.with_limits(&["disk_bytes", "disk_files"]);
        }
        Ok(ContainerEngine {
            inner: Arc::new(inner),
        })
    }

    /// The runtime in use and how it was chosen.
    pub fn runtime_info(&self) -> &RuntimeInfo {
        &self.inner.info
    }

    /// Which cgroup version the containers' groups are managed in: `v1` (hybrid
    /// hosts included) or `v2` (a pure v2 host).
    pub fn cgroup_version(&self) -> &'static str {
        if self.inner.v2 {
            "v2"
        } else {
            "v1"
        }
    }

    /// The agent binary warm containers run, or why sandboxes get no warm container.
    pub fn agent(&self) -> std::result::Result<&Path, &str> {
        self.inner.agent.as_deref().map_err(String::as_str)
    }

    /// Where [`agent`](Self::agent) came from, when there is one: the configured
    /// path, the static agent this build carries, or a file found on disk.
    pub fn agent_source(&self) -> Option<AgentSource> {
        self.inner.agent_source
    }

    /// The baseline for benchmarks: writes a bundle equivalent to the one an
    /// execution of `argv` gets (same root, mounts, namespaces, limits, seccomp and
    /// cgroup placement), then runs `<runtime> run` on it once and returns the
    /// runtime's exit code and how long that command took. Blocking; no capture, no
    /// init shell, no accounting.
    pub fn run_raw(&self, argv: &[String]) -> std::io::Result<(Option<i32>, std::time::Duration)> {
        exec::run_raw(&self.inner, argv)
    }

    /// The baseline for benchmarks: `<runtime> exec <container> <argv…>` into a
    /// running container, once, with how long that command took. Blocking.
    pub fn exec_raw(
        &self,
        container_id: &str,
        argv: &[&str],
    ) -> std::io::Result<(Option<i32>, std::time::Duration)> {
        let mut args = vec!["exec", container_id];
        args.extend_from_slice(argv);
        let started = std::time::Instant::now();
        let finished = self.inner.runtime.run_blocking(&args, &self.inner.root)?;
        Ok((finished.code, started.elapsed()))
    }

    /// `argv` as a cold execution runs it: under the root's shell as the container's
    /// init (so that the program is not pid 1, which ignores the signals it has no
    /// handler for), when the root has a shell.
    pub fn init_wrapped(&self, argv: Vec<String>) -> Vec<String> {
        with_init(&self.inner, argv)
    }

    /// How the recycles of this engine's sandboxes renewed a warm container that
    /// had run something: (reset in place by its agent, replaced by a new
    /// container). A reset in place keeps the container, and its id; the
    /// replacement is taken when the agent cannot prove the container clean, when
    /// the runtime is gVisor's (whose agent has no control channel), and when the
    /// container has ended or is frozen. Counts since the engine started.
    pub fn warm_resets(&self) -> (u64, u64) {
        (
            self.inner.warm_resets.0.load(Ordering::Relaxed),
            self.inner.warm_resets.1.load(Ordering::Relaxed),
        )
    }

    /// How much recent leases used the warm runner of `language`, between 0 and 1:
    /// an exponential moving average over the recycles of this engine's sandboxes
    /// (1 for a lease that ran a snippet of the language in its warm container, 0
    /// for one that did not; the latest weighs 5%), starting at 1 on a fresh
    /// engine. Below 0.05 (some sixty leases in a row without such a snippet) the
    /// runner is no longer started ahead of need; it starts on first use instead.
    pub fn runner_demand(&self, language: Language) -> f64 {
        self.inner.runner_demand.of(language)
    }

    /// Opens a sandbox with its concrete type (the trait's `create` boxes it).
    pub async fn open(&self, spec: &SandboxSpec) -> Result<ContainerSandbox> {
        ContainerSandbox::create(self.inner.clone(), spec).await
    }
}

#[async_trait]
impl Engine for ContainerEngine {
    fn name(&self) -> EngineName {
        self.inner.name.clone()
    }

    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        Ok(Arc::new(self.open(spec).await?))
    }
}

/// The root's shell stands in as the container's init, so that the program is not
/// pid 1 (which ignores every signal it has no handler for, even a SIGKILL it sends
/// itself): it runs the program as its child and exits with its status, 128 + the
/// signal when one killed it. Without a shell in the root, `argv` runs as pid 1.
pub(crate) fn with_init(engine: &EngineInner, argv: Vec<String>) -> Vec<String> {
    match engine.interpreters.get(&Language::Shell) {
        Some(sh) => {
            let mut wrapped = vec![
                sh.clone(),
                "-c".to_string(),
                "\"$@\"\nexit $?".to_string(),
                "paddock-init".to_string(),
            ];
            wrapped.extend(argv);
            wrapped
        }
        None => argv,
    }
}

/// Removes what container engines of Paddock processes that no longer run left
/// behind: their containers (killed through their cgroups), cgroups, and
/// directories (bundles, runtime state, workdirs).
fn sweep_stale(
    parent: &Path,
    own: &str,
    hierarchies: &[Hierarchy],
    v2_mount: Option<&Path>,
    config: &ContainerConfig,
) {
    let dead = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            return false;
        };
        // Dead: of this pid namespace, and no such pid. The resources of Paddock
        // processes in other pid namespaces that share this temp dir and these
        // cgroups are left alone.
        crate::host::owner::owner_is_gone(rest)
    };
    // Cgroups first: killing a container's processes ends it.
    for h in hierarchies {
        let base = h.dir(own);
        if Some(h.mount_point.as_path()) == v2_mount {
            crate::host::cgroup::remove_stale_v2(&base, PREFIX);
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dead(&name) {
                let _ = crate::host::cgroup::remove_tree(&entry.path());
            }
        }
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let me = crate::host::sys::effective_uid();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !dead(&name) {
            continue;
        }
        // Only a real directory of ours: in a shared temp dir anyone can make a
        // symlink or a directory with a name like this.
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(entry.path()) {
            Ok(m) if m.file_type().is_dir() && m.uid() == me => {}
            _ => continue,
        }
        // Whatever state the runtime still holds for containers of the dead engine.
        let state = entry.path().join("state");
        if let Ok(ids) = std::fs::read_dir(&state) {
            for (kind, found) in runtime::candidates(config.runtime, config.runtime_path.as_deref())
            {
                let Ok(path) = found else { continue };
                let rt = Runtime {
                    kind,
                    path,
                    mntns: None,
                    state: state.clone(),
                    flags: Vec::new(),
                };
                for id in ids.flatten() {
                    let id = id.file_name().to_string_lossy().into_owned();
                    let _ = rt.run_blocking(&["delete", "--force", &id], parent);
                }
                break;
            }
        }
        let _ = std::fs::remove_dir_all(entry.path());
    }
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

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
mod cgroups;
mod config;
mod control;
mod exec;
mod files;
mod guest;
mod interactive;
mod probe;
mod runner;
mod runtime;
mod sandbox;
mod startup;
mod usage;
mod userns;
mod warm;
mod warm_reset;
mod warm_turn;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use paddock_core::{
    Capabilities, Engine, EngineName, Language, Limits, Result, Sandbox, SandboxSpec,
};

pub use agent::{embedded_agent_size, AgentSource};
pub use config::{
    ContainerConfig, OciRuntime, RunscPlatform, CONTAINER_OWN_ENV, USERNS_IDS_PER_SANDBOX,
};
pub use runtime::RuntimeKind;
pub use sandbox::ContainerSandbox;

use crate::host::cgroup::Hierarchy;
use runtime::Runtime;

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
        probe::run_raw(&self.inner, argv)
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

//! The subprocess engine: each execution is a fresh host process.
//!
//! Cold mode starts a new process per execution in the sandbox's workdir. The process
//! leads its own session and process group, runs with a sanitized environment and
//! rlimits, joins the sandbox's cgroup (memory, pids, CPU bandwidth, and the kill:
//! v1, v2 or hybrid, see `host::cgroup`) where the host allows it, and enters an empty network namespace under network policy `none`. Deadline,
//! cancel and destroy kill the whole group and everything left in the cgroup.
//!
//! Spawning never forks the host (`clone(CLONE_VM | CLONE_VFORK)`), so its cost does not grow
//! with the embedding process's memory.

mod config;
mod exec;
mod interactive;
mod runner;
mod sandbox;
mod workers;
mod zygote;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use paddock_core::{
    Capabilities, Engine, EngineName, Error, ErrorCode, IsolationLevel, Language, Limits,
    ProgramKind, Result, Sandbox, SandboxSpec,
};

pub use config::{CgroupMode, HandlerConfig, Startup, SubprocessConfig, WarmConfig};
pub use sandbox::SubprocessSandbox;

use crate::env;
use crate::host::cgroup::CgroupRoot;

static NEXT_ENGINE: AtomicU64 = AtomicU64::new(0);

/// What the engine found out about the host when it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSupport {
    /// Whether sandboxes get cgroups; otherwise why not.
    pub cgroup: std::result::Result<(), String>,
    /// Whether the freezer is available for kills.
    pub freezer: bool,
    /// The cgroup layout the host mounts.
    pub cgroup_layout: crate::host::cgroup::Layout,
    /// What the sandboxes' cgroups use (limits, kill, freeze, CPU), when they have
    /// cgroups.
    pub cgroups: Option<crate::host::cgroup::CgroupReport>,
    /// Whether empty network namespaces can be created; otherwise why not.
    pub netns: std::result::Result<(), String>,
    /// Whether allowlists are enforced (a namespace behind an egress gateway per
    /// sandbox); otherwise why not.
    pub egress: std::result::Result<(), String>,
    /// Interpreters found, by language; the error says which binary is missing.
    pub interpreters: BTreeMap<Language, std::result::Result<env::Interpreter, String>>,
    /// The disk-quota backend (`loop` or `tmpfs`), or why none works.
    pub disk: std::result::Result<&'static str, String>,
    /// Whether sandboxes can see their workdir at a home of their own (a mount
    /// namespace each); otherwise why not.
    pub home: std::result::Result<(), String>,
}

/// The subprocess engine. Cheap to clone; clones share one host setup.
#[derive(Debug, Clone)]
pub struct SubprocessEngine {
    inner: Arc<EngineInner>,
}

#[derive(Debug)]
pub(crate) struct EngineInner {
    pub(crate) caps: Capabilities,
    pub(crate) defaults: Limits,
    pub(crate) base_env: BTreeMap<String, String>,
    pub(crate) workdir_root: PathBuf,
    pub(crate) cgroups: Option<CgroupRoot>,
    /// The sandboxes' own filesystems (the disk quota).
    pub(crate) disks: crate::host::volume::Disks,
    pub(crate) support: HostSupport,
    /// How sandboxes' egress gateways are made, or why allowlists are not enforced.
    pub(crate) egress: std::result::Result<paddock_egress::GatewayConfig, String>,
    /// Warm mode's runners, when `[subprocess.warm]` is enabled.
    pub(crate) warm: Option<workers::WarmSetup>,
    /// The Python fork server (`warm.fork_server`), started on first use.
    pub(crate) zygote: zygote::Zygote,
    /// Sandboxes being opened right now (see `SubprocessSandbox::create`).
    pub(crate) opening: sandbox::Openings,
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.workdir_root.join("runners"));
        let _ = std::fs::remove_dir(&self.workdir_root);
    }
}

impl SubprocessEngine {
    /// Starts the engine with [`Limits::defaults`] as the default limits.
    pub fn new(config: &SubprocessConfig) -> Result<SubprocessEngine> {
        SubprocessEngine::with_defaults(config, Limits::defaults())
    }

    /// Starts the engine with the given default limits (unset fields fall back to
    /// [`Limits::defaults`]).
    pub fn with_defaults(config: &SubprocessConfig, defaults: Limits) -> Result<SubprocessEngine> {
        if !config.enabled {
            return Err(Error::invalid_config(
                "subprocess.enabled",
                "the subprocess engine is disabled in the configuration",
            ));
        }
        let defaults = defaults.or(&Limits::defaults());
        defaults.validate("limits", true)?;
        let base_env = env::sanitized_host_env(&config.env_passthrough);
        let path = base_env.get("PATH").cloned().unwrap_or_default();

        let (cgroups, cgroup) = match config.cgroup {
            CgroupMode::Off => (
                None,
                Err("disabled by configuration (`subprocess.cgroup = \"off\"`)".to_string()),
            ),
            CgroupMode::Auto | CgroupMode::Required => match CgroupRoot::create() {
                Ok(root) => (Some(root), Ok(())),
                Err(reason) => {
                    if config.cgroup == CgroupMode::Required {
                        return Err(Error::invalid_config(
                            "subprocess.cgroup",
                            format!("`required`, but cgroups are unavailable: {reason}"),
                        ));
                    }
                    (None, Err(reason))
                }
            },
        };
        let freezer = cgroups.as_ref().is_some_and(CgroupRoot::has_freezer);
        let cgroup_report = cgroups.as_ref().map(CgroupRoot::report);
        let cgroup_layout = cgroups
            .as_ref()
            .map_or_else(CgroupRoot::host_layout, CgroupRoot::layout);
        let netns = crate::host::netns::create_empty()
            .map(drop)
            .map_err(|e| format!("cannot create a network namespace: {e}"));

        let root_dir = std::path::Path::new("/");
        let mut interpreters = BTreeMap::new();
        let launcher_env = Arc::new(base_env.clone());
        for (lang, program) in [
            (Language::Python, &config.python),
            (Language::Javascript, &config.node),
            (Language::Shell, &config.shell),
        ] {
            let found = env::resolve_program(program, &path, root_dir)
                .map(|p| env::Interpreter::new(p, lang, launcher_env.clone()))
                .ok_or_else(|| format!("`{program}` was not found on PATH ({path})"));
            if let (Ok(interp), true) = (&found, config.startup.interpreters) {
                interp.resolve_in_background();
            }
            interpreters.insert(lang, found);
        }

        let mut programs = vec![ProgramKind::Command];
        for (lang, found) in &interpreters {
            if found.is_ok() {
                programs.push(ProgramKind::Code(*lang));
            }
        }
        // Handlers run on warm workers: configured ones, and `module:function` on the
        // warm Python runner.
        let python_runner =
            config.warm.enabled && config.warm.languages.contains(&Language::Python);
        if !config.handlers.is_empty() || python_runner {
            programs.push(ProgramKind::Invoke);
        }
        if !config.handlers.is_empty() {
            programs.push(ProgramKind::Resume);
        }
        let mut network = vec!["unrestricted"];
        if netns.is_ok() {
            network.push("none");
        }
        let egress = match &netns {
            Ok(()) if config.startup.egress => crate::host::egress::gateway_config(&config.egress)?,
            Ok(()) => Err("not probed: this engine was started without allowlists".to_string()),
            Err(why) => Err(why.clone()),
        };
        if egress.is_ok() {
            network.push("allowlist");
        }
        let mut features = vec![
            "streaming",
            "files",
            paddock_core::engine::FEATURE_FILEOPS,
            "output_cap",
            paddock_core::interactive::FEATURE_PROCESS,
            paddock_core::interactive::FEATURE_TERMINAL,
            paddock_core::interactive::FEATURE_TCP,
        ];
        if !config.handlers.is_empty() {
            // Configured handlers may suspend; `Sandbox::resume` continues them.
            features.push("suspend");
        }
        if cgroups.is_some() {
            features.extend(["cgroup", paddock_core::engine::FEATURE_USAGE]);
        }
        // What binds: rlimits always; memory and pids through the cgroup, or without
        // one through RLIMIT_AS (coarse, but it binds) and RLIMIT_NPROC, which binds
        // nothing for root.
        let mut limits = vec![
            "memory_bytes",
            "cpu_ms",
            "max_output_bytes",
            "file_size_bytes",
            "open_files",
        ];
        if cgroups.is_some() || crate::host::sys::effective_uid() != 0 {
            limits.push("pids");
        }
        // CPU bandwidth: the cgroup's CPU controller (v1 cfs quota, v2 cpu.max).
        if cgroups.as_ref().is_some_and(CgroupRoot::has_cpu) {
            limits.push("cpu_millicores");
        }
        let parent = config
            .workdir_root
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let disks = if config.startup.disks {
            crate::host::volume::Disks::new(&parent)
        } else {
            crate::host::volume::Disks::unprobed(
                &parent,
                "not probed: this engine was started without disk quotas",
            )
        };
        if disks.backend().is_some() {
            limits.extend(["disk_bytes", "disk_files"]);
        }
        let caps = Capabilities::new(IsolationLevel::None, &programs, &network, &features)
            .with_limits(&limits);

        let workdir_root = parent.join(format!(
            "paddock-{}-{}",
            std::process::id(),
            NEXT_ENGINE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&workdir_root).map_err(|e| {
            Error::invalid_config(
                "subprocess.workdir_root",
                format!("cannot create `{}`: {e}", workdir_root.display()),
            )
        })?;

        let warm = workers::WarmSetup::prepare(&config.warm, &config.handlers, &workdir_root)?;
        // A home needs a mount namespace per sandbox: tried once here, so that the
        // feature is offered only where it works.
        let home = if config.startup.home {
            probe_home(&workdir_root)
        } else {
            Err("not probed: this engine was started without homes".to_string())
        };
        let caps = if home.is_ok() {
            features.push(paddock_core::engine::FEATURE_HOME);
            Capabilities::new(IsolationLevel::None, &programs, &network, &features)
                .with_limits(&limits)
        } else {
            caps
        };

        Ok(SubprocessEngine {
            inner: Arc::new(EngineInner {
                warm,
                zygote: Default::default(),
                opening: Default::default(),
                caps,
                defaults,
                base_env,
                workdir_root,
                cgroups,
                support: HostSupport {
                    cgroup,
                    freezer,
                    cgroup_layout,
                    cgroups: cgroup_report,
                    netns,
                    egress: egress.as_ref().map(drop).map_err(Clone::clone),
                    interpreters,
                    disk: disks.backend().ok_or_else(|| disks.notes().join("; ")),
                    home,
                },
                disks,
                egress,
            }),
        })
    }

    /// What the engine found out about the host.
    pub fn host_support(&self) -> &HostSupport {
        &self.inner.support
    }

    /// Opens a sandbox with its concrete type (the trait's `create` boxes it). A
    /// sandbox opened here in a burst of opens starts the runners the burst left
    /// out on first use; through `create`, also once the burst is over.
    pub async fn open(&self, spec: &SandboxSpec) -> Result<SubprocessSandbox> {
        SubprocessSandbox::create(self.inner.clone(), spec).await
    }
}

#[async_trait]
impl Engine for SubprocessEngine {
    fn name(&self) -> EngineName {
        EngineName::SUBPROCESS
    }

    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let sandbox = Arc::new(self.open(spec).await?);
        sandbox.warm_after_burst();
        Ok(sandbox)
    }
}

/// `CAPABILITY_NOT_SUPPORTED` naming the missing interpreter.
pub(crate) fn missing_interpreter(inner: &EngineInner, lang: Language) -> Error {
    let why = match inner.support.interpreters.get(&lang) {
        Some(Err(why)) => why.clone(),
        _ => "no interpreter is configured".into(),
    };
    Error::new(
        ErrorCode::CapabilityNotSupported,
        format!(
            "{lang} code cannot run on this host: {why}; install it or set its path in the config"
        ),
    )
}

/// Whether a sandbox's workdir can be shown at a home of its own here: makes one
/// such mount namespace (over `/tmp`, in that namespace only) for a scratch
/// directory, and drops it.
fn probe_home(workdir_root: &std::path::Path) -> std::result::Result<(), String> {
    let scratch = workdir_root.join("home-probe");
    std::fs::create_dir_all(&scratch)
        .map_err(|e| format!("cannot create a scratch directory: {e}"))?;
    let made = crate::host::netns::private_home(&scratch, "/tmp/paddock-home-probe")
        .map(drop)
        .map_err(|e| format!("cannot make a mount namespace with a home: {e}"));
    let _ = std::fs::remove_dir(&scratch);
    made
}

//! The OCI container engine's settings (`[container]`): runtime, root filesystem,
//! environment and user namespaces.

use std::path::PathBuf;

use paddock_core::config::check_env_names;
use paddock_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::{EgressConfig, WarmConfig};

/// Which OCI runtime the container engine drives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OciRuntime {
    /// crun when it can run a container here, runc otherwise.
    #[default]
    Auto,
    /// crun only.
    Crun,
    /// runc only.
    Runc,
    /// gVisor's `runsc` only: a user-space kernel between the program and the host's
    /// (never chosen by `auto`; see `container.runsc_platform`).
    Runsc,
}

/// The platform gVisor's `runsc` intercepts system calls with
/// (`container.runsc_platform`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunscPlatform {
    /// `ptrace`: works everywhere, about 20–30 µs a system call.
    #[default]
    Ptrace,
    /// `kvm`: needs a usable `/dev/kvm` (hardware virtualisation, not a nested
    /// software hypervisor).
    Kvm,
    /// `systrap`: newer runsc releases only.
    Systrap,
}

impl RunscPlatform {
    /// The value of runsc's `--platform` flag.
    pub fn as_str(self) -> &'static str {
        match self {
            RunscPlatform::Ptrace => "ptrace",
            RunscPlatform::Kvm => "kvm",
            RunscPlatform::Systrap => "systrap",
        }
    }
}

/// How many user and group ids each sandbox's user namespace maps
/// (`container.user_namespace`): ids 0 to 65535 inside.
pub const USERNS_IDS_PER_SANDBOX: u32 = 65536;

/// The variables the container engine sets in every container itself (`PATH` for the
/// container's root, `HOME` and `PWD` in the workdir, `TMPDIR`); they are never taken
/// from the host, so `container.env_passthrough` may not name them. A request's `env`
/// may still set them.
pub const CONTAINER_OWN_ENV: &[&str] = &["PATH", "HOME", "PWD", "TMPDIR"];

/// Settings of the OCI container engine (`strict` isolation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContainerConfig {
    /// Whether the engine is started when an OCI runtime is found. Default `true`;
    /// a host without a usable runtime leaves the engine out (`paddock doctor` says
    /// why).
    pub enabled: bool,
    /// The runtime. Default `auto`.
    pub runtime: OciRuntime,
    /// The runtime binary, overriding the search on `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_path: Option<PathBuf>,
    /// The containers' root filesystem, used read-only. Default: a generated root
    /// with the host's `/usr` and `/etc` bound read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,
    /// Where workdirs, bundles and the runtime's state live. Default: the system
    /// temp dir.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workdir_root: Option<PathBuf>,
    /// CPU quota per container, in CPUs (`1.5` = one and a half). Default 1.
    pub cpus: f64,
    /// Whether the seccomp profile is applied. Default `true`.
    pub seccomp: bool,
    /// Host variables a container receives, by exact name. Default: none.
    ///
    /// A container sees only these host variables (those the host has set when the
    /// engine starts), the variables the engine sets itself ([`CONTAINER_OWN_ENV`])
    /// and the request's `env`; the rest of the host's environment never reaches
    /// it, whatever the names. Names must not contain `=` or NUL, and may not be one
    /// of [`CONTAINER_OWN_ENV`].
    pub env_passthrough: Vec<String>,
    /// Keep a warm container per sandbox, with `paddock-agent` as its pid 1, and run
    /// executions in it as a frame round trip. Default `true` (when the agent binary
    /// is found).
    pub warm: bool,
    /// Warm Python and JavaScript interpreters inside each warm container, started
    /// by its agent on a sandbox's first snippet of the language and kept for the
    /// snippets that follow (the subprocess engine's runners and rules: one tenant
    /// per runner, `max_turns`, `max_age_ms`, `max_rss_bytes`). Default: on, for
    /// `["python", "javascript"]`. Not with `runtime = "runsc"`.
    pub runners: WarmConfig,
    /// The `paddock-agent` binary. Default: beside the running executable (or one
    /// directory up), else on `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_path: Option<PathBuf>,
    /// Give every container a user namespace: uid and gid 0 inside are an
    /// unprivileged id of the host, of a range of [`USERNS_IDS_PER_SANDBOX`] ids the
    /// engine allocates to the sandbox, and the sandbox's workdir is owned by it.
    /// Default `true`. Not applied with `runtime = "runsc"` (gVisor's kernel stands
    /// between the program and the host instead).
    pub user_namespace: bool,
    /// The first host id of the user-namespace ranges: sandbox slot `k` maps ids 0 to
    /// 65535 inside to `userns_first_id + k * 65536` and up. Default 2000000000 (above
    /// the ranges `/etc/subuid` hands out to users, below 2^31). Paddock processes
    /// sharing a host share the slots (a slot is locked while a sandbox holds it).
    pub userns_first_id: u32,
    /// How many ranges (sandboxes with a user namespace at once, across the Paddock
    /// processes of the host) there are. Default 1024.
    pub userns_slots: u32,
    /// The platform of `runtime = "runsc"`: `ptrace` (default), `kvm` or `systrap`
    /// (newer runsc releases).
    pub runsc_platform: RunscPlatform,
    /// The egress gateway's settings: the top-level `[egress]`, handed to the engine
    /// when Paddock makes it (not a setting of `[container]`).
    #[serde(skip)]
    pub egress: EgressConfig,
}

impl Default for ContainerConfig {
    fn default() -> Self {
        ContainerConfig {
            enabled: true,
            runtime: OciRuntime::Auto,
            runtime_path: None,
            rootfs: None,
            workdir_root: None,
            cpus: 1.0,
            seccomp: true,
            env_passthrough: Vec::new(),
            warm: true,
            runners: WarmConfig::default(),
            agent_path: None,
            user_namespace: true,
            userns_first_id: 2_000_000_000,
            userns_slots: 1024,
            runsc_platform: RunscPlatform::Ptrace,
            egress: EgressConfig::default(),
        }
    }
}

impl ContainerConfig {
    /// Checks paths, ranges and variable names.
    pub fn validate(&self) -> Result<()> {
        check_env_names("container.env_passthrough", &self.env_passthrough)?;
        self.runners.validate("container.runners")?;
        if let Some(own) = self
            .env_passthrough
            .iter()
            .find(|n| CONTAINER_OWN_ENV.contains(&n.as_str()))
        {
            return Err(Error::invalid_config(
                "container.env_passthrough",
                format!(
                    "`{own}` is set by the container engine for the container itself and is never taken from the host; remove it, or set it in a request's env"
                ),
            ));
        }
        if self.userns_first_id == 0 {
            return Err(Error::invalid_config(
                "container.userns_first_id",
                "0 would map the containers' root to the host's root; use an unused range such as 2000000000",
            ));
        }
        if self.userns_slots == 0 {
            return Err(Error::invalid_config(
                "container.userns_slots",
                "must be at least 1",
            ));
        }
        // The last id of the last range must stay below 2^32 - 1 (`(uid_t) -1`).
        let last = u64::from(self.userns_first_id)
            + u64::from(self.userns_slots) * u64::from(USERNS_IDS_PER_SANDBOX);
        if last > u64::from(u32::MAX) {
            return Err(Error::invalid_config(
                "container.userns_slots",
                format!(
                    "{} ranges of {USERNS_IDS_PER_SANDBOX} ids from {} end past the largest id, {}; lower container.userns_first_id or container.userns_slots",
                    self.userns_slots,
                    self.userns_first_id,
                    u32::MAX - 1
                ),
            ));
        }
        if !(self.cpus.is_finite() && (0.01..=1024.0).contains(&self.cpus)) {
            return Err(Error::invalid_config(
                "container.cpus",
                format!("{} is out of range 0.01..=1024", self.cpus),
            ));
        }
        for (field, path) in [
            ("container.runtime_path", &self.runtime_path),
            ("container.rootfs", &self.rootfs),
            ("container.workdir_root", &self.workdir_root),
            ("container.agent_path", &self.agent_path),
        ] {
            if let Some(p) = path {
                if !p.is_absolute() {
                    return Err(Error::invalid_config(
                        field,
                        format!("`{}` must be an absolute path", p.display()),
                    ));
                }
            }
        }
        Ok(())
    }
}

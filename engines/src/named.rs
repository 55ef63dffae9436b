//! Engines of names of their own (`[engines.NAME]`): built-in kinds with settings of
//! their own.

use std::path::PathBuf;

use paddock_core::{EngineName, Error, Result};
use serde::{Deserialize, Serialize};

use crate::{ContainerConfig, OciRuntime, RunscPlatform};

/// The most engines `[engines]` may define.
pub const MAX_ENGINE_DEFS: usize = 16;

/// The kinds of built-in engine an `[engines.NAME]` section can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// An OCI container engine: `[container]`'s settings, with the section's own in
    /// their place.
    Container,
}

/// An engine of a name of its own (`[engines.NAME]`).
///
/// It has every setting of its kind's section (`[container]`) except those it sets
/// itself, and it runs whether or not that section's own engine is enabled. Its
/// executions and sandboxes are its own: pools, workdirs, cgroups and the audit's
/// `engine` field carry its name. An execution or sandbox gets it only by naming it
/// (a request's `engine`, a template's `engine`); a request that names none is never
/// routed to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineDef {
    /// The kind of engine: `container`.
    pub kind: EngineKind,
    /// The containers' root filesystem, used read-only: an unpacked image (a
    /// directory with `bin/sh`, say, from `docker export` or `umoci unpack`). Unset:
    /// `container.rootfs`, else the generated root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,
    /// The OCI runtime. Unset: `container.runtime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<OciRuntime>,
    /// The runtime binary. Unset: `container.runtime_path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_path: Option<PathBuf>,
    /// runsc's platform. Unset: `container.runsc_platform`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runsc_platform: Option<RunscPlatform>,
    /// The CPU quota per container. Unset: `container.cpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Host variables the containers receive. Unset: `container.env_passthrough`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_passthrough: Option<Vec<String>>,
}

impl EngineDef {
    /// The container settings of this engine: `base` with the section's own in
    /// their place, enabled.
    pub fn container_config(&self, base: &ContainerConfig) -> ContainerConfig {
        let mut c = base.clone();
        c.enabled = true;
        if let Some(r) = &self.rootfs {
            c.rootfs = Some(r.clone());
        }
        if let Some(r) = self.runtime {
            c.runtime = r;
        }
        if let Some(p) = &self.runtime_path {
            c.runtime_path = Some(p.clone());
        }
        if let Some(p) = self.runsc_platform {
            c.runsc_platform = p;
        }
        if let Some(n) = self.cpus {
            c.cpus = n;
        }
        if let Some(e) = &self.env_passthrough {
            c.env_passthrough = e.clone();
        }
        c
    }

    /// `INVALID_CONFIG`, naming `engines.NAME.FIELD`, for a setting its kind would
    /// refuse (the same checks as `[container]`'s).
    pub fn validate(&self, name: &EngineName, base: &ContainerConfig) -> Result<()> {
        let field = format!("engines.{name}");
        if EngineName::BUILT_IN.contains(name) {
            return Err(Error::invalid_config(
                &field,
                format!(
                    "`{name}` is a built-in engine's name; give this engine another (the built-in ones are configured in their own sections, such as [container])"
                ),
            ));
        }
        match self.kind {
            EngineKind::Container => self.container_config(base).validate().map_err(|e| {
                // "`container.rootfs`: ..." reads "`engines.NAME.rootfs`: ...".
                let message = e.message.replacen("`container.", &format!("`{field}."), 1);
                Error::new(e.code, message)
            }),
        }
    }
}

//! [`SchedulerConfig`]: what the scheduler reads of the configuration, and the
//! `[pool]` section ([`PoolConfig`]). The other sections the scheduler reads live
//! with what they configure: [`ServerConfig`] in [`crate::http`], [`AuditConfig`] in
//! [`crate::audit`], [`LimiterConfig`] in [`crate::limiter`], [`PolicyConfig`] in
//! [`crate::policy`].
//!
//! The whole document (`paddock::PaddockConfig`, in the `paddock` crate) names every
//! section; the scheduler needs only its own, gathered here, and the engines'
//! sections reach the engines through the builder's
//! [`EngineRegistry`](crate::EngineRegistry).

use std::collections::BTreeSet;

use paddock_core::config::LimitsConfig;
use paddock_core::{AccessRules, EngineName, Result};

use crate::audit::AuditConfig;
use crate::http::ServerConfig;
use crate::limiter::LimiterConfig;
use crate::policy::PolicyConfig;

mod pool;

pub use pool::PoolConfig;

/// The scheduler's part of the configuration: the sections it reads, by the names
/// they have in the file, and the names of the `[engines.NAME]` engines.
///
/// `paddock::PaddockConfig::scheduler` makes one from the whole document; the default
/// is the embedded defaults with no engine of a name of its own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerConfig {
    /// Default limits for every execution (`[limits]`), and the operator's ceilings on
    /// what a request may ask for (`[limits.max]`).
    pub limits: LimitsConfig,
    /// Engine pools (`[pool]`, the same settings for every engine).
    pub pool: PoolConfig,
    /// The HTTP server (`[server]`): its API keys also decide tenants' access and
    /// fair shares.
    pub server: ServerConfig,
    /// The audit log (`[audit]`).
    pub audit: AuditConfig,
    /// Per-tenant rate and concurrency limits (`[limiter]`).
    pub limiter: LimiterConfig,
    /// The policy stage (`[policy]`).
    pub policy: PolicyConfig,
    /// The engines of `[engines.NAME]` sections: made by the builder's registry, and
    /// had by a request only by naming them.
    pub named_engines: BTreeSet<EngineName>,
}

impl SchedulerConfig {
    /// Checks every value of the scheduler's sections is usable; the error names the
    /// first bad field.
    pub fn validate(&self) -> Result<()> {
        self.limits.validate()?;
        self.pool.validate("pool")?;
        self.server.validate()?;
        self.audit.validate()?;
        self.limiter.validate()
    }

    /// The pool slots a tenant may hold at once on this node, and whether the
    /// number is the fair share rather than set: `limiter.max_slots_per_tenant` when
    /// set; else, under API keys, an equal split of `pool.max_size` among the keys'
    /// tenants (at least 1 each), so that while one tenant holds all it may, every
    /// other still finds room in each pool; else unlimited.
    pub fn slots_per_tenant(&self) -> (Option<u32>, bool) {
        if let Some(max) = self.limiter.max_slots_per_tenant {
            return (Some(max), false);
        }
        let tenants: BTreeSet<&str> = self
            .server
            .api_keys
            .iter()
            .map(|k| k.tenant.as_str())
            .collect();
        if tenants.is_empty() {
            return (None, false);
        }
        let share = (self.pool.max_size / tenants.len()).max(1);
        (Some(u32::try_from(share).unwrap_or(u32::MAX)), true)
    }

    /// What each tenant may use: [`ServerConfig::access_rules`].
    pub fn access_rules(&self) -> AccessRules {
        self.server.access_rules()
    }
}

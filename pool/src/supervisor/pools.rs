//! Which pool serves a request: one per engine, network policy, disk quota and home,
//! made (and prewarmed) on first use, with the pools of one kind of request bounded
//! per tenant and in all.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use paddock_core::{EngineName, Error, ErrorCode, IsolationLevel, NetworkPolicy};

use super::choice::Runs;
use super::Supervisor;
use crate::engine_pool::{DiskKey, EnginePool};

/// Most pools of executions' own disk quotas or allowlists one tenant keeps at once
/// (each of their instances holds a filesystem of that size, or an egress gateway;
/// they are made on demand and not prewarmed). Each tenant has its own: one
/// tenant's pools never take another's place.
const MAX_DISK_POOLS: usize = 16;

/// Most pools of executions' own disk quotas or allowlists kept at once, all tenants
/// together.
const MAX_OWN_POOLS_TOTAL: usize = 256;

/// How long a pool of an execution's own disk quota is kept after work was last
/// routed to it, even with no instance, before another quota may replace it.
const DISK_POOL_GRACE: Duration = Duration::from_secs(60);

/// What a pool's instances are made with: engine, network policy, disk quota and
/// home ([`SandboxSpec::home`](paddock_core::SandboxSpec::home)), and for a pool of
/// a tenant's own disk quota or allowlist, the tenant (`None` for the pools every
/// tenant shares, and for those the operator keeps warm).
pub(super) type PoolKey = (
    EngineName,
    NetworkPolicy,
    DiskKey,
    Option<Arc<str>>,
    Option<Arc<str>>,
);

/// Whether a pool of this network and disk is one made for one kind of request
/// (its own disk quota, its own allowlist): bounded in number per tenant.
fn own_kind(network: &NetworkPolicy, disk: &DiskKey) -> bool {
    !disk.is_default() || matches!(network, NetworkPolicy::Allowlist { .. })
}

impl Supervisor {
    /// The pool for an engine, network policy and disk quota, created (and
    /// prewarmed) on first use. Pools of executions' own disk quotas or allowlists are at most
    /// [`MAX_DISK_POOLS`]: a new one replaces one that holds no instance, or is
    /// refused with `POOL_EXHAUSTED` while all are in use.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pool(
        &mut self,
        engine: Option<EngineName>,
        level: IsolationLevel,
        runs: Runs,
        network: &NetworkPolicy,
        disk: DiskKey,
        home: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Arc<EnginePool>, Error> {
        let kind = self.choose(engine, level, runs, tenant)?;
        let home: Option<Arc<str>> = home.map(Arc::from);
        let shared = (kind.clone(), network.clone(), disk, home.clone(), None);
        if let Some(p) = self.pools.get(&shared) {
            p.touch();
            return Ok(p.clone());
        }
        // Pools made for one kind of request (its own disk quota, its own
        // allowlist) are the tenant's own, and bounded in number per tenant: the
        // least recently used unused one of the tenant's makes room.
        let owner: Option<Arc<str>> = if own_kind(network, &disk) {
            tenant.map(Arc::from)
        } else {
            None
        };
        let key = (
            kind.clone(),
            network.clone(),
            disk,
            home.clone(),
            owner.clone(),
        );
        if let Some(p) = self.pools.get(&key) {
            p.touch();
            return Ok(p.clone());
        }
        if own_kind(network, &disk) {
            let mine = |(_, n, d, _, o): &PoolKey| own_kind(n, d) && *o == owner;
            let own = self.pools.keys().filter(|k| mine(k)).count();
            if own >= MAX_DISK_POOLS {
                // The one routed to longest ago among those with no instance and no
                // waiter, and not routed to within DISK_POOL_GRACE (an execution
                // routed there may still be waiting for its permit).
                let unused = self
                    .pools
                    .iter()
                    .filter(|(k, p)| mine(k) && p.is_unused() && p.idle_for() >= DISK_POOL_GRACE)
                    .max_by_key(|(_, p)| p.idle_for())
                    .map(|(k, _)| k.clone());
                let Some(unused) = unused else {
                    let who = match tenant {
                        Some(t) => format!("tenant `{t}` has"),
                        None => "callers without a tenant have".to_string(),
                    };
                    return Err(Error::new(
                        ErrorCode::PoolExhausted,
                        format!(
                            "{who} {MAX_DISK_POOLS} pools of executions' own disk quotas or allowlists in use, the most one tenant keeps; retry later, leave limits.disk_bytes and limits.disk_files unset, or reuse an allowlist already in use"
                        ),
                    ));
                };
                if let Some(p) = self.pools.remove(&unused) {
                    p.close();
                }
            }
            // All tenants' together are bounded too (tenants without API keys are
            // callers' own claims): at the bound, an unused pool of the tenant that
            // holds the most gives way, as results do in the server's store.
            let all: Vec<&PoolKey> = self
                .pools
                .keys()
                .filter(|(_, n, d, _, _)| own_kind(n, d))
                .collect();
            if all.len() >= MAX_OWN_POOLS_TOTAL {
                let mut held: HashMap<Option<Arc<str>>, usize> = HashMap::new();
                for (_, _, _, _, o) in &all {
                    *held.entry(o.clone()).or_default() += 1;
                }
                let unused = self
                    .pools
                    .iter()
                    .filter(|((_, n, d, _, _), p)| {
                        own_kind(n, d) && p.is_unused() && p.idle_for() >= DISK_POOL_GRACE
                    })
                    .max_by_key(|((_, _, _, _, o), p)| {
                        (held.get(o).copied().unwrap_or(0), p.idle_for())
                    })
                    .map(|(k, _)| k.clone());
                let Some(unused) = unused else {
                    return Err(Error::new(
                        ErrorCode::PoolExhausted,
                        format!(
                            "{MAX_OWN_POOLS_TOTAL} pools of executions' own disk quotas or allowlists are in use, the most the server keeps; retry later"
                        ),
                    ));
                };
                if let Some(p) = self.pools.remove(&unused) {
                    p.close();
                }
            }
        }
        let engine = self.configured(&kind)?;
        engine.capabilities().check_network(&kind, network)?;
        if home.is_some() {
            engine
                .capabilities()
                .check_feature(&kind, paddock_core::engine::FEATURE_HOME)?;
        }
        let mut config = self.pool_config.clone();
        if *network != NetworkPolicy::None {
            // Only the default policy is kept warm; others grow on demand.
            config.min_idle = 0;
        }
        if !disk.is_default() {
            config.min_idle = 0;
        }
        if let Some(n) = self.warm_sizes.get(&key) {
            config.min_idle = (*n).min(config.max_size);
        }
        let pool = EnginePool::new(
            engine,
            network.clone(),
            disk,
            home.as_deref(),
            config,
            self.pipeline.telemetry.clone(),
        );
        if *network == NetworkPolicy::None && disk.is_default() && home.is_none() {
            self.pipeline.telemetry.register_pool(
                kind.as_str(),
                Arc::new(crate::engine_pool::Gauges(Arc::downgrade(&pool))),
            );
        }
        pool.prewarm();
        self.pools.insert(key, pool.clone());
        Ok(pool)
    }

    pub(super) fn prewarm_all(&mut self) {
        let kinds: Vec<EngineName> = self.engines.keys().cloned().collect();
        for kind in kinds {
            if let Err(e) = self.pool(
                Some(kind.clone()),
                IsolationLevel::None,
                Runs::Sandbox,
                &NetworkPolicy::None,
                DiskKey::default(),
                None,
                None,
            ) {
                tracing::info!(engine = %kind, error = %e, "no default pool");
            }
        }
    }

    /// The engine named `kind`, or `CAPABILITY_NOT_SUPPORTED` naming the configured
    /// ones.
    pub(super) fn configured(
        &self,
        kind: &EngineName,
    ) -> Result<Arc<dyn paddock_core::Engine>, Error> {
        self.engines.get(kind).cloned().ok_or_else(|| {
            let mut configured: Vec<&str> = self.engines.keys().map(|k| k.as_str()).collect();
            configured.sort_unstable();
            Error::new(
                ErrorCode::CapabilityNotSupported,
                format!(
                    "the {kind} engine is not configured; configured engines: {}",
                    configured.join(", ")
                ),
            )
        })
    }

    /// Checks that `tenant` may ask for `network`, then finds the pool and checks
    /// that its engine gives a level `tenant` may use.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn allowed_pool(
        &mut self,
        engine: Option<EngineName>,
        level: IsolationLevel,
        runs: Runs,
        network: &NetworkPolicy,
        disk: DiskKey,
        home: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Arc<EnginePool>, Error> {
        let allowed = self.pipeline.access.for_tenant(tenant);
        allowed.check_network(network, tenant)?;
        // An allowlist that does not parse is refused before any pool is made for it.
        network.rules("network")?;
        let pool = self.pool(engine, level, runs, network, disk, home, tenant)?;
        let given = pool.engine().capabilities().max_level;
        allowed.check_level(given, pool.kind.as_str(), tenant)?;
        Ok(pool)
    }
}

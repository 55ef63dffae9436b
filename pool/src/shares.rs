//! Per-tenant fair shares: how many sandboxes a tenant has open and how many pool
//! slots it holds, against `limiter.max_sandboxes_per_tenant` and
//! `limiter.max_slots_per_tenant`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use paddock_core::{Error, ErrorCode};

use crate::limiter::LimiterConfig;

/// Per-tenant fair shares: open sandboxes and pool slots held.
#[derive(Debug, Default)]
pub(crate) struct Shares {
    pub(crate) max_sandboxes: Option<u32>,
    pub(crate) max_slots: Option<u32>,
    /// `max_slots` is the fair share under API keys, not a configured cap.
    pub(crate) fair_slots: bool,
    pub(crate) sandboxes: HashMap<Option<String>, u32>,
    pub(crate) slots: HashMap<Option<String>, u32>,
    /// Per-tenant memory budgets (output kept, input waiting).
    pub(crate) memory: std::sync::Arc<crate::memory::Memory>,
}

/// How long a tenant at its sandbox cap is told to wait before trying again.
pub(crate) const SANDBOX_CAP_RETRY_MS: u64 = 1_000;
/// How long a tenant at its slot cap is told to wait before trying again.
pub(crate) const SLOT_CAP_RETRY_MS: u64 = 250;

impl Shares {
    /// The shares of `config`, with `fair_slots` as the slot cap when `config` sets
    /// none: the fair share under API keys.
    pub(crate) fn new(config: &LimiterConfig, fair_slots: Option<u32>) -> Shares {
        let fair = config.max_slots_per_tenant.is_none() && fair_slots.is_some();
        Shares {
            max_sandboxes: config.max_sandboxes_per_tenant,
            max_slots: config.max_slots_per_tenant.or(fair_slots),
            fair_slots: fair,
            memory: std::sync::Arc::new(crate::memory::Memory::new(config)),
            ..Shares::default()
        }
    }
}

/// What a tenant holds of its shares; given back when dropped. Only what a cap
/// applies to is counted: without caps, taking a share costs nothing.
#[derive(Debug)]
pub(crate) struct Share {
    pub(crate) shares: Rc<RefCell<Shares>>,
    pub(crate) tenant: Option<String>,
    /// Counted against `max_slots`.
    pub(crate) slot: bool,
    /// Counted against `max_sandboxes`.
    pub(crate) sandbox: bool,
}

impl Share {
    /// Takes a pool slot (and, for a sandbox, a sandbox place) for `tenant`, or
    /// refuses: `RATE_LIMITED` at the sandbox cap, `POOL_EXHAUSTED` at the slot cap.
    pub(crate) fn take(
        shares: &Rc<RefCell<Shares>>,
        tenant: &Option<String>,
        sandbox: bool,
    ) -> Result<Share, Error> {
        let mut s = shares.borrow_mut();
        let slot = s.max_slots.is_some();
        let sandbox = sandbox && s.max_sandboxes.is_some();
        if !(slot || sandbox) {
            drop(s);
            return Ok(Share {
                shares: shares.clone(),
                tenant: None,
                slot,
                sandbox,
            });
        }
        let who = tenant.as_deref().unwrap_or("(none)");
        if sandbox {
            let open = s.sandboxes.get(tenant).copied().unwrap_or(0);
            if let Some(max) = s.max_sandboxes.filter(|m| open >= *m) {
                return Err(Error::new(
                    ErrorCode::RateLimited,
                    format!(
                        "tenant `{who}` has {open} sandboxes open, its cap (limiter.max_sandboxes_per_tenant = {max}); destroy one first"
                    ),
                )
                .with_retry_after_ms(SANDBOX_CAP_RETRY_MS));
            }
        }
        if slot {
            let held = s.slots.get(tenant).copied().unwrap_or(0);
            if let Some(max) = s.max_slots.filter(|m| held >= *m) {
                let cap = if s.fair_slots {
                    format!("its fair share ({max}: pool.max_size split equally among the API keys' tenants; set limiter.max_slots_per_tenant to choose another)")
                } else {
                    format!("its cap (limiter.max_slots_per_tenant = {max})")
                };
                return Err(Error::new(
                    ErrorCode::PoolExhausted,
                    format!(
                        "tenant `{who}` holds {held} pool slots (open sandboxes and pooled executions), {cap}; retry when one ends"
                    ),
                )
                .with_retry_after_ms(SLOT_CAP_RETRY_MS));
            }
            *s.slots.entry(tenant.clone()).or_default() += 1;
        }
        if sandbox {
            *s.sandboxes.entry(tenant.clone()).or_default() += 1;
        }
        drop(s);
        Ok(Share {
            shares: shares.clone(),
            tenant: tenant.clone(),
            slot,
            sandbox,
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if !(self.slot || self.sandbox) {
            return;
        }
        let mut s = self.shares.borrow_mut();
        let give_back = |map: &mut HashMap<Option<String>, u32>, tenant: &Option<String>| {
            if let Some(n) = map.get_mut(tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(tenant);
                }
            }
        };
        if self.slot {
            give_back(&mut s.slots, &self.tenant);
        }
        if self.sandbox {
            give_back(&mut s.sandboxes, &self.tenant);
        }
    }
}

//! Parked instances: a pooled execution that ends `suspended` keeps its instance (the
//! handler process waiting for its token lives there) until the token is resumed.
//!
//! A parked instance stays leased, so it holds one of its pool's `max_size` slots and
//! nothing else runs on it. Each pool parks at most `max_suspended` instances: parking
//! one more retires the longest-parked one. An instance parked longer than
//! `suspend_ttl_ms` is retired by the supervisor's maintenance tick. A token whose
//! instance was retired that way answers `NOT_FOUND` saying it expired, for as long
//! as the bounded memory of expired tokens holds it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{Error, ErrorCode};

use crate::engine_pool::{EnginePool, Lease, Release};

/// How many expired tokens are remembered for a clearer `NOT_FOUND`.
const REMEMBERED_EXPIRED: usize = 1024;

/// Who may resume a token: tokens are chosen by handlers, so they are scoped to the
/// tenant that suspended.
type Key = (Option<String>, String);

/// An instance waiting for the resume of the execution that suspended on it.
#[derive(Debug)]
pub(crate) struct Parked {
    /// The pool the instance belongs to.
    pub(crate) pool: Arc<EnginePool>,
    pub(crate) lease: Lease,
    since: Instant,
}

impl Parked {
    /// Gives the instance back to its pool for good.
    pub(crate) fn retire(self) {
        self.pool.release(self.lease, Release::Retire);
    }
}

/// Why an instance could not be parked. The instance comes back to be retired.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The pool keeps no suspended executions (`max_suspended = 0`).
    Disabled(Lease),
    /// The tenant already has an execution suspended on this token.
    Duplicate(Lease),
}

/// The parked instances of every pool, by tenant and token.
#[derive(Debug, Default)]
pub(crate) struct Parking {
    parked: HashMap<Key, Parked>,
    expired: VecDeque<Key>,
}

impl Parking {
    /// How many instances are parked.
    pub(crate) fn len(&self) -> usize {
        self.parked.len()
    }

    /// How many instances are parked for `tenant`.
    pub(crate) fn count_for(&self, tenant: Option<&str>) -> usize {
        self.parked
            .keys()
            .filter(|(t, _)| t.as_deref() == tenant)
            .count()
    }

    /// The pool of the instance holding `token` for `tenant`.
    pub(crate) fn pool_of(&self, tenant: &Option<String>, token: &str) -> Option<Arc<EnginePool>> {
        self.parked
            .get(&(tenant.clone(), token.to_string()))
            .map(|p| p.pool.clone())
    }

    /// Takes the instance holding `token` for `tenant`, to run its resume on.
    pub(crate) fn take(&mut self, tenant: &Option<String>, token: &str) -> Result<Parked, Error> {
        let key = (tenant.clone(), token.to_string());
        if let Some(p) = self.parked.remove(&key) {
            return Ok(p);
        }
        Err(self.not_found(&key))
    }

    /// The answer for a token nothing holds.
    pub(crate) fn not_found_error(&self, tenant: &Option<String>, token: &str) -> Error {
        self.not_found(&(tenant.clone(), token.to_string()))
    }

    fn not_found(&self, key: &Key) -> Error {
        let token = &key.1;
        if self.expired.contains(key) {
            return Error::new(
                ErrorCode::NotFound,
                format!(
                    "the execution suspended on token `{token}` expired: its instance was retired \
                     (pool.suspend_ttl_ms passed, or pool.max_suspended newer suspensions came after it)"
                ),
            );
        }
        Error::new(
            ErrorCode::NotFound,
            format!(
                "no execution of this tenant is suspended on token `{token}`: it was resumed \
                 already, or it suspended inside a sandbox session (resume it in that sandbox)"
            ),
        )
    }

    /// Parks `lease` for `token`. Returns the instances it pushed out (to retire), or
    /// the lease back when it cannot be parked.
    pub(crate) fn park(
        &mut self,
        tenant: Option<String>,
        token: String,
        pool: Arc<EnginePool>,
        lease: Lease,
    ) -> Result<Vec<Parked>, Refused> {
        let cap = pool.config.max_suspended.min(pool.config.max_size);
        if cap == 0 {
            return Err(Refused::Disabled(lease));
        }
        let key = (tenant, token);
        if self.parked.contains_key(&key) {
            return Err(Refused::Duplicate(lease));
        }
        let mut evicted = Vec::new();
        loop {
            let mine = self
                .parked
                .iter()
                .filter(|(_, p)| Arc::ptr_eq(&p.pool, &pool))
                .min_by_key(|(_, p)| p.since);
            let count = self
                .parked
                .values()
                .filter(|p| Arc::ptr_eq(&p.pool, &pool))
                .count();
            match mine {
                Some((oldest, _)) if count >= cap => {
                    let oldest = oldest.clone();
                    if let Some(p) = self.parked.remove(&oldest) {
                        tracing::info!(token = %oldest.1, "pool.max_suspended reached; retiring the longest-parked instance");
                        self.remember(oldest);
                        evicted.push(p);
                    }
                }
                _ => break,
            }
        }
        self.parked.insert(
            key,
            Parked {
                pool,
                lease,
                since: Instant::now(),
            },
        );
        Ok(evicted)
    }

    /// Removes the instances parked longer than their pool's `suspend_ttl_ms`.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Parked> {
        let old: Vec<Key> = self
            .parked
            .iter()
            .filter(|(_, p)| {
                now.saturating_duration_since(p.since)
                    >= Duration::from_millis(p.pool.config.suspend_ttl_ms)
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::with_capacity(old.len());
        for key in old {
            if let Some(p) = self.parked.remove(&key) {
                tracing::info!(token = %key.1, "a suspended execution expired; retiring its instance");
                self.remember(key);
                out.push(p);
            }
        }
        out
    }

    /// Removes every parked instance (shutdown).
    pub(crate) fn drain(&mut self) -> Vec<Parked> {
        self.parked.drain().map(|(_, p)| p).collect()
    }

    fn remember(&mut self, key: Key) {
        if self.expired.len() >= REMEMBERED_EXPIRED {
            self.expired.pop_front();
        }
        self.expired.push_back(key);
    }
}

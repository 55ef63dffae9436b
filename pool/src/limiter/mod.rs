//! The limiter: per-tenant sliding-window rate, per-tenant and global concurrency caps,
//! and an output-cap helper for engines that keep output as text (the scheduler
//! itself leaves the cap to the engine, which applies it while capturing).
//!
//! [`LimiterCore`] is the pure logic, driven by an injectable [`Clock`](crate::clock::Clock); the
//! [`Limiter`] actor owns one and answers [`Admit`] and [`Stats`].
//!
//! # Admission
//!
//! [`LimiterCore::try_admit`] checks, in order:
//! 1. the global concurrency: at most `max_concurrent` permits alive;
//! 2. the tenant's rate: at most `max_executions_per_window` admissions in any
//!    `window_ms` (a sliding log of admission times, not fixed buckets);
//! 3. the tenant's concurrency: at most `max_concurrent_per_tenant` permits alive.
//!
//! The first limit hit refuses with `RATE_LIMITED` and a `retry_after_ms`: exact for
//! the rate (when the oldest admission in the window leaves it), a hint
//! (`busy_retry_after_ms`) for concurrency. Refused attempts are not counted against
//! the rate. Executions without a tenant share one anonymous tenant.
//!
//! An admission returns a [`Permit`]. Dropping it releases its concurrency slots
//! through shared atomics: no message, so a release cannot be lost, whether the
//! execution finishes, fails, panics or its caller goes away.
//!
//! # Memory
//!
//! A tenant's window holds at most `max_executions_per_window` timestamps (8 bytes
//! each). At most `max_tenants` tenants are tracked. A tenant with no permit alive
//! and no admission inside the window holds nothing a fresh entry would not, so it is
//! dropped without loss when room is needed; a *new* tenant arriving while all
//! tracked tenants are still live is refused with `RATE_LIMITED` (live tenants are
//! never evicted: that would reset their quotas). Tenant names longer than
//! [`MAX_TENANT_LEN`] bytes are refused with `INVALID_OPTIONS`. When no per-tenant
//! limit is configured, no tenant is tracked at all.

mod actor;
mod config;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use paddock_core::{Error, ErrorCode, ExecResult};
use serde::{Deserialize, Serialize};

use crate::clock::SharedClock;

pub use actor::{Admit, Limiter, Stats};
pub use paddock_core::output::{truncate_output, truncation_marker};

/// Longest accepted tenant name, in bytes.
pub const MAX_TENANT_LEN: usize = 256;

pub use config::{LimiterConfig, DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT, MAX_EXECUTIONS_PER_WINDOW};

/// Whether per-tenant state must be kept.
fn tracks_tenants(config: &LimiterConfig) -> bool {
    config.max_executions_per_window.is_some() || config.max_concurrent_per_tenant.is_some()
}

/// A held admission. Dropping it releases its concurrency slots.
#[must_use = "dropping a permit releases its slot at once"]
pub struct Permit {
    global: Arc<AtomicUsize>,
    tenant: Option<Arc<AtomicUsize>>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("global_in_flight", &self.global.load(Ordering::Relaxed))
            .field(
                "tenant_in_flight",
                &self.tenant.as_ref().map(|t| t.load(Ordering::Relaxed)),
            )
            .finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(tenant) = &self.tenant {
            tenant.fetch_sub(1, Ordering::AcqRel);
        }
        self.global.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counters and sizes, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimiterStats {
    /// Permits alive now.
    pub in_flight: usize,
    /// Tenants tracked now (the anonymous tenant included once used).
    pub tenants_tracked: usize,
    /// Admission timestamps held across all tracked tenants.
    pub timestamps_held: usize,
    /// Admissions granted since start.
    pub admitted: u64,
    /// Refusals by a tenant's rate.
    pub refused_rate: u64,
    /// Refusals by a concurrency cap (tenant or global).
    pub refused_concurrency: u64,
    /// Refusals of a new tenant because the tenant table was full of live tenants.
    pub refused_tenant_table: u64,
}

#[derive(Debug, Default)]
struct TenantState {
    /// Admission times (nanoseconds since the core's epoch) inside the window, oldest
    /// first; never more than `max_executions_per_window`.
    admitted: VecDeque<u64>,
    in_flight: Arc<AtomicUsize>,
}

impl TenantState {
    fn prune(&mut self, now: u64, window: u64) {
        while self.admitted.front().is_some_and(|&t| t + window <= now) {
            self.admitted.pop_front();
        }
    }

    /// When this tenant holds nothing a fresh entry would not: `Some(at)` with the
    /// time (possibly past) its last admission leaves the window, `None` while a permit
    /// is alive.
    fn idle_from(&self, window: u64) -> Option<u64> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.admitted.back().map_or(0, |&t| t + window))
    }
}

/// The limiter's logic, without an actor. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use paddock_core::ErrorCode;
/// use paddock_pool::clock::ManualClock;
/// use paddock_pool::limiter::{LimiterConfig, LimiterCore};
///
/// let clock = ManualClock::shared();
/// let config = LimiterConfig {
///     max_executions_per_window: Some(1),
///     window_ms: 1_000,
///     ..LimiterConfig::default()
/// };
/// let mut limiter = LimiterCore::new(config, clock.clone()).unwrap();
/// let _permit = limiter.try_admit(Some("acme")).unwrap();
/// clock.advance(Duration::from_millis(400));
/// let refused = limiter.try_admit(Some("acme")).unwrap_err();
/// assert_eq!(refused.code, ErrorCode::RateLimited);
/// assert_eq!(refused.retry_after_ms, Some(600));
/// clock.advance(Duration::from_millis(600));
/// assert!(limiter.try_admit(Some("acme")).is_ok());
/// ```
#[derive(Debug)]
pub struct LimiterCore {
    config: LimiterConfig,
    clock: SharedClock,
    epoch: Instant,
    window: u64,
    global: Arc<AtomicUsize>,
    tenants: HashMap<String, TenantState>,
    anonymous: Option<TenantState>,
    /// No sweep of the tenant table before this time (nanoseconds since the epoch).
    next_sweep_at: u64,
    stats: LimiterStats,
}

impl LimiterCore {
    /// A limiter reading time from `clock`. Fails with `INVALID_CONFIG` on a bad config.
    pub fn new(config: LimiterConfig, clock: SharedClock) -> Result<LimiterCore, Error> {
        config.validate()?;
        let epoch = clock.now();
        Ok(LimiterCore {
            window: config.window_ms * 1_000_000,
            config,
            clock,
            epoch,
            global: Arc::new(AtomicUsize::new(0)),
            tenants: HashMap::new(),
            anonymous: None,
            next_sweep_at: 0,
            stats: LimiterStats::default(),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &LimiterConfig {
        &self.config
    }

    /// Permits alive now.
    pub fn in_flight(&self) -> usize {
        self.global.load(Ordering::Acquire)
    }

    /// Counters and sizes. Walks the tenant table (O(tenants)).
    pub fn stats(&self) -> LimiterStats {
        let states = self.tenants.values().chain(self.anonymous.as_ref());
        let (mut tracked, mut held) = (0, 0);
        for s in states {
            tracked += 1;
            held += s.admitted.len();
        }
        LimiterStats {
            in_flight: self.in_flight(),
            tenants_tracked: tracked,
            timestamps_held: held,
            ..self.stats
        }
    }

    /// Admits one execution for `tenant` (`None`: the anonymous tenant), or refuses
    /// it with `RATE_LIMITED` and a `retry_after_ms`. See the [module docs](self).
    pub fn try_admit(&mut self, tenant: Option<&str>) -> Result<Permit, Error> {
        if let Some(name) = tenant {
            if name.len() > MAX_TENANT_LEN {
                return Err(Error::invalid_options(
                    "tenant",
                    format!(
                        "is {} bytes long; at most {MAX_TENANT_LEN} are accepted",
                        name.len()
                    ),
                ));
            }
        }
        if let Some(cap) = self.config.max_concurrent {
            let running = self.global.load(Ordering::Acquire);
            if running >= cap as usize {
                self.stats.refused_concurrency += 1;
                return Err(Error::new(
                    ErrorCode::RateLimited,
                    format!(
                        "{running} executions are running, the global limit is {cap}; retry when one finishes"
                    ),
                )
                .with_retry_after_ms(self.config.busy_retry_after_ms));
            }
        }
        let tenant = if tracks_tenants(&self.config) {
            let now = self.now();
            Some(self.admit_tenant(tenant, now)?)
        } else {
            None
        };
        self.global.fetch_add(1, Ordering::AcqRel);
        self.stats.admitted += 1;
        Ok(Permit {
            global: self.global.clone(),
            tenant,
        })
    }

    /// Nanoseconds since the epoch, on the injected clock.
    fn now(&self) -> u64 {
        let since = self.clock.now().saturating_duration_since(self.epoch);
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    }

    /// The tenant checks (rate, then concurrency), creating the tenant's entry when
    /// needed. On success, records the admission and returns the tenant's in-flight
    /// counter, already incremented.
    fn admit_tenant(&mut self, tenant: Option<&str>, now: u64) -> Result<Arc<AtomicUsize>, Error> {
        match tenant {
            None => {
                self.anonymous.get_or_insert_with(TenantState::default);
            }
            Some(name) => {
                if !self.tenants.contains_key(name) {
                    if self.tenants.len() >= self.config.max_tenants {
                        self.make_room(now)?;
                    }
                    self.tenants.insert(name.to_owned(), TenantState::default());
                }
            }
        }
        let window = self.window;
        let config = &self.config;
        let label = || {
            tenant.map_or_else(
                || "the anonymous tenant".to_owned(),
                |n| format!("tenant `{n}`"),
            )
        };
        let state = match tenant {
            None => self.anonymous.as_mut(),
            Some(name) => self.tenants.get_mut(name),
        }
        .expect("inserted above");
        state.prune(now, window);
        if let Some(max) = config.max_executions_per_window {
            if state.admitted.len() >= max as usize {
                let oldest = *state.admitted.front().expect("max is at least 1");
                let wait = ceil_ms(oldest + window - now);
                self.stats.refused_rate += 1;
                return Err(Error::new(
                    ErrorCode::RateLimited,
                    format!(
                        "{} ran {max} executions in the last {} ms, its limit per window; retry in {wait} ms",
                        label(),
                        config.window_ms
                    ),
                )
                .with_retry_after_ms(wait));
            }
        }
        if let Some(cap) = config.max_concurrent_per_tenant {
            let running = state.in_flight.load(Ordering::Acquire);
            if running >= cap as usize {
                self.stats.refused_concurrency += 1;
                return Err(Error::new(
                    ErrorCode::RateLimited,
                    format!(
                        "{} has {running} executions running, its limit is {cap}; retry when one finishes",
                        label()
                    ),
                )
                .with_retry_after_ms(config.busy_retry_after_ms));
            }
        }
        if config.max_executions_per_window.is_some() {
            state.admitted.push_back(now);
        }
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(state.in_flight.clone())
    }

    /// Drops every tenant that holds nothing; refuses when none can go.
    fn make_room(&mut self, now: u64) -> Result<(), Error> {
        let busy_hint = self.config.busy_retry_after_ms * 1_000_000;
        if now >= self.next_sweep_at {
            let window = self.window;
            let mut earliest: Option<u64> = None;
            let mut any_busy = false;
            self.tenants
                .retain(|_, state| match state.idle_from(window) {
                    Some(at) if at <= now => false,
                    Some(at) => {
                        earliest = Some(earliest.map_or(at, |e| e.min(at)));
                        true
                    }
                    None => {
                        any_busy = true;
                        true
                    }
                });
            if self.tenants.len() < self.config.max_tenants {
                return Ok(());
            }
            // Nothing can go before `wait`: a window to end, or (a hint) a permit to drop.
            let mut wait = earliest.map_or(u64::MAX, |at| at - now);
            if any_busy {
                wait = wait.min(busy_hint);
            }
            self.next_sweep_at = now.saturating_add(wait);
        }
        let wait = ceil_ms(self.next_sweep_at.saturating_sub(now)).max(1);
        self.stats.refused_tenant_table += 1;
        Err(Error::new(
            ErrorCode::RateLimited,
            format!(
                "{} tenants are active, the most the limiter tracks; retry in {wait} ms",
                self.config.max_tenants
            ),
        )
        .with_retry_after_ms(wait))
    }
}

/// Nanoseconds rounded up to whole milliseconds.
fn ceil_ms(nanos: u64) -> u64 {
    nanos.div_ceil(1_000_000)
}

/// Applies the output cap to a result: each stream longer than `max_bytes` is cut at a
/// UTF-8 boundary with the [`truncation_marker`] and flagged. A stream already flagged
/// (the engine applied the cap while capturing) is left alone.
pub fn enforce_output_cap(result: &mut ExecResult, max_bytes: u64) {
    let streams = [
        (&mut result.stdout, &mut result.stdout_truncated),
        (&mut result.stderr, &mut result.stderr_truncated),
    ];
    for (text, truncated) in streams {
        if *truncated {
            continue;
        }
        if text.len() as u64 > max_bytes {
            let (cut, _) = truncate_output(text, max_bytes);
            *text = cut;
            *truncated = true;
        }
    }
}

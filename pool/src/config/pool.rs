//! Sizing, waiting and recycling of engine pools (`[pool]`).

use serde::{Deserialize, Serialize};

use paddock_core::error::{Error, Result};

/// Sizing, waiting and recycling of an engine pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Instances kept ready ahead of need, at most `max_size`. Default 8: a burst of
    /// eight opens that comes after a quiet time finds them ready (each holds its
    /// warm interpreters, about 11–12 MiB of PSS on the subprocess and container
    /// engines; see `docs/configuration.md`). With 0 the pool keeps none, whatever
    /// `burst_idle_max` says.
    pub min_idle: usize,
    /// Most instances kept ready for the next burst: after `k` instances were in use
    /// at once (a burst of `k` opens, say; callers one after another need one or
    /// two), the pool keeps up to `k` idle (created in the background, in parallel)
    /// until `idle_timeout_ms` passes without as many in use; `min_idle` is the
    /// floor. Default 8; 0 keeps only `min_idle`.
    pub burst_idle_max: usize,
    /// Most instances of one pool at once (open sandboxes and running executions
    /// each hold one). Default: from the host, the lower of its memory / 64 MiB and
    /// its cores × 128, within 16..=4096 (256 on 2 cores and 24 GiB; see
    /// [`paddock_core::host::HostFacts::pool_max_size`]).
    pub max_size: usize,
    /// Most callers queued for an instance; beyond it `POOL_EXHAUSTED` at once.
    /// Default 1024.
    pub max_waiting: usize,
    /// How long a queued caller waits before `POOL_EXHAUSTED`. Default 5000 ms.
    pub acquire_timeout_ms: u64,
    /// An instance is retired after this many executions. Default 1000.
    pub max_executions_per_engine: u64,
    /// An instance is retired this long after creation. Default 600000 ms.
    pub max_age_ms: u64,
    /// Idle instances above `min_idle` are reaped after this long. Default 60000 ms.
    pub idle_timeout_ms: u64,
    /// Consecutive creation failures that open the circuit breaker. Default 5.
    pub failure_threshold: u32,
    /// First backoff after the breaker opens; doubles up to `backoff_max_ms`.
    /// Default 200 ms.
    pub backoff_initial_ms: u64,
    /// Longest backoff. Default 30000 ms.
    pub backoff_max_ms: u64,
    /// Creating an instance that takes longer fails (and counts for the breaker).
    /// Default 30000 ms.
    pub create_timeout_ms: u64,
    /// Recycling (the health check) that takes longer retires the instance.
    /// Default 10000 ms.
    pub recycle_timeout_ms: u64,
    /// How long past an execution's deadline the engine may take to return before
    /// the supervisor reports `timed_out` and retires the instance. Default 10000 ms
    /// (longer than an engine's own output grace after a kill, so a slow subscriber
    /// is not mistaken for a stuck engine).
    pub watchdog_grace_ms: u64,
    /// Instances a pool keeps parked for executions that ended `suspended`, waiting
    /// for their resume; each holds one of the pool's `max_size` slots (so at most
    /// `max_size` are parked, whatever this says). Parking one
    /// more retires the longest-parked instance (its token then answers
    /// `NOT_FOUND`, saying it expired). 0 retires a suspended execution's instance at
    /// once, so pooled executions cannot be resumed. Default 4.
    pub max_suspended: usize,
    /// A parked instance is retired this long after its execution suspended.
    /// Default 600000 ms.
    pub suspend_ttl_ms: u64,
    /// An open sandbox nobody used for this long (no call on it, no execution in
    /// it) is destroyed. Default 1800000 ms (30 min); 0 never.
    pub sandbox_idle_timeout_ms: u64,
    /// An open sandbox is destroyed this long after it was opened, used or not.
    /// Default 86400000 ms (24 h); 0 never.
    pub sandbox_max_lifetime_ms: u64,
    /// Most background processes and terminals running at once in one sandbox, on
    /// every API (the native one and E2B's); one more is refused `RATE_LIMITED`
    /// until one ends. Default 256, at most 65536.
    pub max_processes_per_sandbox: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            min_idle: 8,
            burst_idle_max: 8,
            max_size: paddock_core::host::HostFacts::this_host().pool_max_size(),
            max_waiting: 1024,
            acquire_timeout_ms: 5_000,
            max_executions_per_engine: 1_000,
            max_age_ms: 600_000,
            idle_timeout_ms: 60_000,
            failure_threshold: 5,
            backoff_initial_ms: 200,
            backoff_max_ms: 30_000,
            create_timeout_ms: 30_000,
            recycle_timeout_ms: 10_000,
            watchdog_grace_ms: 10_000,
            max_suspended: 4,
            suspend_ttl_ms: 600_000,
            sandbox_idle_timeout_ms: 1_800_000,
            sandbox_max_lifetime_ms: 86_400_000,
            max_processes_per_sandbox: 256,
        }
    }
}

impl PoolConfig {
    /// Checks the values; the error names the first bad field.
    pub fn validate(&self, prefix: &str) -> Result<()> {
        let field = |name: &str| format!("{prefix}.{name}");
        if self.max_size == 0 || self.max_size > 100_000 {
            return Err(Error::invalid_config(
                &field("max_size"),
                "must be in 1..=100000",
            ));
        }
        if self.min_idle > 100_000 {
            return Err(Error::invalid_config(
                &field("min_idle"),
                "must be at most 100000 (the pool keeps at most max_size ready)",
            ));
        }
        if self.max_waiting > 1_000_000 {
            return Err(Error::invalid_config(
                &field("max_waiting"),
                "must be at most 1000000",
            ));
        }
        for (name, v) in [
            ("acquire_timeout_ms", self.acquire_timeout_ms),
            ("max_executions_per_engine", self.max_executions_per_engine),
            ("max_age_ms", self.max_age_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("backoff_initial_ms", self.backoff_initial_ms),
            ("backoff_max_ms", self.backoff_max_ms),
            ("create_timeout_ms", self.create_timeout_ms),
            ("recycle_timeout_ms", self.recycle_timeout_ms),
            ("watchdog_grace_ms", self.watchdog_grace_ms),
            ("suspend_ttl_ms", self.suspend_ttl_ms),
        ] {
            if v == 0 {
                return Err(Error::invalid_config(
                    &field(name),
                    "must be greater than 0",
                ));
            }
        }
        if !(1..=65_536).contains(&self.max_processes_per_sandbox) {
            return Err(Error::invalid_config(
                &field("max_processes_per_sandbox"),
                "must be in 1..=65536",
            ));
        }
        if self.failure_threshold == 0 {
            return Err(Error::invalid_config(
                &field("failure_threshold"),
                "must be greater than 0",
            ));
        }
        if self.backoff_initial_ms > self.backoff_max_ms {
            return Err(Error::invalid_config(
                &field("backoff_initial_ms"),
                "must not exceed backoff_max_ms",
            ));
        }
        Ok(())
    }
}

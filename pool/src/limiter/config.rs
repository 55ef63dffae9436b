//! Per-tenant rate and concurrency limits (`[limiter]`).

use serde::{Deserialize, Serialize};

use paddock_core::error::{Error, Result};

/// Most admissions `max_executions_per_window` may allow.
pub const MAX_EXECUTIONS_PER_WINDOW: u32 = 1_000_000;

/// Limiter settings. Every field has a default, so `{}` limits nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimiterConfig {
    /// Admissions a tenant may have in any window. Default `None`: unlimited.
    pub max_executions_per_window: Option<u32>,
    /// The window's length in milliseconds. Default 60 000.
    pub window_ms: u64,
    /// Permits a tenant may hold at once. Default `None`: unlimited.
    pub max_concurrent_per_tenant: Option<u32>,
    /// Permits all tenants together may hold at once. Default `None`: unlimited.
    pub max_concurrent: Option<u32>,
    /// Sandboxes a tenant may have open at once (counting ones being opened); more
    /// are refused with `RATE_LIMITED`. Default `None`: unlimited.
    pub max_sandboxes_per_tenant: Option<u32>,
    /// Pool slots a tenant may hold at once: each open sandbox holds one for its
    /// life, each pooled execution one while it waits or runs (executions inside a
    /// sandbox use the sandbox's). More are refused with `POOL_EXHAUSTED`. Counted
    /// across every engine's pool. Default `None`: unlimited.
    pub max_slots_per_tenant: Option<u32>,
    /// Tenants tracked at most. Default 100 000.
    pub max_tenants: usize,
    /// The `retry_after_ms` hint given for a concurrency refusal. Default 100.
    pub busy_retry_after_ms: u64,
    /// Bytes of output a tenant's running executions keep at once, across all of
    /// them (their stdout and stderr, held for their results). Past it, further
    /// output of that tenant's executions is cut as at the output cap (truncation
    /// marker, `stdout_truncated`/`stderr_truncated`, a warning); other tenants are
    /// not affected. Default 134217728 (128 MiB: one execution at the default
    /// 64 MiB ceiling on both streams); at most 2^50.
    pub max_output_bytes_per_tenant: u64,
    /// Bytes of input that may wait for one background process or terminal: written
    /// by callers (E2B `SendInput`, `write_stdin`, an attach socket), not yet read by
    /// it. A write that finds no room waits up to `input_wait_ms`, then is refused
    /// with `RATE_LIMITED`. Default 1048576 (1 MiB); 1 to 1073741824.
    pub max_input_bytes_per_process: u64,
    /// Bytes of input that may wait for all of a tenant's processes together,
    /// counting writes still waiting for room; a write past it is refused at once
    /// with `RATE_LIMITED`. Default 16777216 (16 MiB); at least
    /// `max_input_bytes_per_process`, at most 2^50.
    pub max_input_bytes_per_tenant: u64,
    /// How long a write waits for room in a process's input buffer, in milliseconds.
    /// Default 5000; 0 (refused at once) to 600000.
    pub input_wait_ms: u64,
}

/// Default `limiter.max_output_bytes_per_tenant`.
pub const DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT: u64 = 128 << 20;

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            max_executions_per_window: None,
            window_ms: 60_000,
            max_concurrent_per_tenant: None,
            max_concurrent: None,
            max_sandboxes_per_tenant: None,
            max_slots_per_tenant: None,
            max_tenants: 100_000,
            busy_retry_after_ms: 100,
            max_output_bytes_per_tenant: DEFAULT_MAX_OUTPUT_BYTES_PER_TENANT,
            max_input_bytes_per_process: paddock_core::input::DEFAULT_INPUT_BUFFER as u64,
            max_input_bytes_per_tenant: 16 << 20,
            input_wait_ms: paddock_core::input::DEFAULT_INPUT_WAIT.as_millis() as u64,
        }
    }
}

impl LimiterConfig {
    /// Checks every value; the error names the first bad field.
    pub fn validate(&self) -> Result<()> {
        if self.window_ms == 0 || self.window_ms > 7 * 24 * 3600 * 1000 {
            return Err(Error::invalid_config(
                "limiter.window_ms",
                format!("{} is out of range 1..=604800000", self.window_ms),
            ));
        }
        if let Some(n) = self.max_executions_per_window {
            if n == 0 || n > MAX_EXECUTIONS_PER_WINDOW {
                return Err(Error::invalid_config(
                    "limiter.max_executions_per_window",
                    format!(
                        "{n} is out of range 1..={MAX_EXECUTIONS_PER_WINDOW}; leave it unset for no rate limit"
                    ),
                ));
            }
        }
        for (field, value) in [
            (
                "limiter.max_concurrent_per_tenant",
                self.max_concurrent_per_tenant,
            ),
            ("limiter.max_concurrent", self.max_concurrent),
            (
                "limiter.max_sandboxes_per_tenant",
                self.max_sandboxes_per_tenant,
            ),
            ("limiter.max_slots_per_tenant", self.max_slots_per_tenant),
        ] {
            if value == Some(0) {
                return Err(Error::invalid_config(
                    field,
                    "must be at least 1; leave it unset for no cap",
                ));
            }
        }
        if self.max_tenants == 0 {
            return Err(Error::invalid_config(
                "limiter.max_tenants",
                "must be at least 1",
            ));
        }
        if self.busy_retry_after_ms == 0 {
            return Err(Error::invalid_config(
                "limiter.busy_retry_after_ms",
                "must be at least 1",
            ));
        }
        self.validate_memory()
    }

    /// The memory budgets: output and input per tenant, input per process.
    fn validate_memory(&self) -> Result<()> {
        use paddock_core::budget::MAX_BUDGET_BYTES;
        let per_process = self.max_input_bytes_per_process;
        for (field, v, min, max) in [
            (
                "limiter.max_output_bytes_per_tenant",
                self.max_output_bytes_per_tenant,
                1,
                MAX_BUDGET_BYTES,
            ),
            (
                "limiter.max_input_bytes_per_process",
                per_process,
                1,
                1 << 30,
            ),
            (
                "limiter.max_input_bytes_per_tenant",
                self.max_input_bytes_per_tenant,
                per_process,
                MAX_BUDGET_BYTES,
            ),
            ("limiter.input_wait_ms", self.input_wait_ms, 0, 600_000),
        ] {
            if !(min..=max).contains(&v) {
                return Err(Error::invalid_config(
                    field,
                    format!("{v} is out of range {min}..={max}"),
                ));
            }
        }
        Ok(())
    }

    /// The input limits of a process of `tenant`, whose budget is drawn from
    /// `budgets` (made with [`max_input_bytes_per_tenant`](Self::max_input_bytes_per_tenant)).
    pub fn input_limits(
        &self,
        budgets: &paddock_core::budget::TenantBudgets,
        tenant: Option<&str>,
    ) -> paddock_core::input::InputLimits {
        paddock_core::input::InputLimits {
            buffer_bytes: usize::try_from(self.max_input_bytes_per_process).unwrap_or(usize::MAX),
            wait: std::time::Duration::from_millis(self.input_wait_ms),
            tenant: Some(budgets.for_tenant(tenant)),
        }
    }
}

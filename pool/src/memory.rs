//! Per-tenant memory budgets: the output a tenant's running executions keep for their
//! results (`limiter.max_output_bytes_per_tenant`) and the input waiting for its
//! processes (`limiter.max_input_bytes_per_process`, `max_input_bytes_per_tenant`,
//! `input_wait_ms`). One tenant's work cannot make the server hold more than these,
//! however many executions or writers it has, and never takes another tenant's room.

use std::sync::Arc;

use async_trait::async_trait;
use paddock_core::budget::{OutputAllowance, TenantBudgets};
use paddock_core::interactive::ProcessShared;
use paddock_core::{Error, ExecResult, OutputChunk, OutputSink};

use crate::limiter::LimiterConfig;

/// The budgets of every tenant.
#[derive(Debug)]
pub(crate) struct Memory {
    output: TenantBudgets,
    input: TenantBudgets,
    config: LimiterConfig,
}

impl Default for Memory {
    fn default() -> Self {
        Memory::new(&LimiterConfig::default())
    }
}

impl Memory {
    pub(crate) fn new(config: &LimiterConfig) -> Memory {
        Memory {
            output: TenantBudgets::new(config.max_output_bytes_per_tenant),
            input: TenantBudgets::new(config.max_input_bytes_per_tenant),
            config: config.clone(),
        }
    }

    /// A new execution's share of `tenant`'s output budget.
    pub(crate) fn output_allowance(&self, tenant: Option<&str>) -> Arc<OutputAllowance> {
        Arc::new(OutputAllowance::new(self.output.for_tenant(tenant)))
    }

    /// Bounds a new process's input by `tenant`'s budgets.
    pub(crate) fn limit_input(&self, shared: &ProcessShared, tenant: Option<&str>) {
        shared.limit_input(self.config.input_limits(&self.input, tenant));
    }
}

/// A sink that hands the engine an execution's output allowance and passes every
/// chunk on.
pub(crate) struct Budgeted {
    pub(crate) inner: Arc<dyn OutputSink>,
    pub(crate) allowance: Arc<OutputAllowance>,
}

#[async_trait]
impl OutputSink for Budgeted {
    async fn chunk(&self, chunk: OutputChunk) -> Result<(), Error> {
        self.inner.chunk(chunk).await
    }

    fn allowance(&self) -> Option<Arc<OutputAllowance>> {
        Some(self.allowance.clone())
    }
}

/// Says in a result's warnings when its tenant's budget cut its output (the engine
/// has flagged the stream and added the truncation marker where it was cut).
pub(crate) fn note_cut(result: &mut ExecResult, allowance: &OutputAllowance) {
    if !allowance.cut() {
        return;
    }
    result.warnings.push(format!(
        "output was cut: this tenant's running executions held {} bytes of output, its budget (limiter.max_output_bytes_per_tenant); run fewer executions with large output at once, or write large output to a file",
        allowance.limit()
    ));
}

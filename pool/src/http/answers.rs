//! The JSON answers of the HTTP API that have no type elsewhere. Each handler
//! serializes one of these (or a type of `paddock-core` or of this crate), and
//! `/v1/openapi.json` states the schema of the same type, so the two cannot part.

use paddock_core::{Error, ExecutionId, SandboxStatus, WireResult};
use schemars::JsonSchema;
use serde::Serialize;

use crate::audit::AuditStats;
use crate::messages::{ProcessInfo, Stats};

/// Every error answer: `{"error": {"code": …, "message": …, "retry_after_ms": …}}`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "Error")]
pub(super) struct ErrorBody<'a> {
    /// What went wrong, with a stable code.
    pub(super) error: &'a Error,
}

/// `GET /healthz`: the process answers.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Health {
    /// Always `ok`.
    pub(super) status: Liveness,
}

/// The one state of [`Health`].
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum Liveness {
    /// Alive.
    Ok,
}

/// `GET /readyz`: `ready` (200), or why not (503).
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Readiness {
    /// Whether new work is admitted.
    pub(super) status: ReadyState,
}

/// The states of [`Readiness`].
#[derive(Debug, Serialize, JsonSchema)]
pub(super) enum ReadyState {
    /// New work is admitted.
    #[serde(rename = "ready")]
    Ready,
    /// The server is shutting down.
    #[serde(rename = "draining")]
    Draining,
    /// The scheduler does not admit work.
    #[serde(rename = "not ready")]
    NotReady,
}

/// A sandbox's state: `GET /v1/sandboxes/{id}`, and the answer of pause and unpause.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct SandboxState {
    /// The sandbox's status.
    pub(super) status: SandboxStatus,
}

/// `GET /v1/engines`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct EnginesAnswer {
    /// Every engine this server runs, by name.
    pub(super) engines: Vec<EngineEntry>,
}

/// One engine and what it can do on this host.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct EngineEntry {
    /// The name requests choose it by (`"engine": …`).
    pub(super) name: paddock_core::EngineName,
    /// The strongest isolation level it gives; weaker requests are met.
    pub(super) max_level: paddock_core::IsolationLevel,
    /// The program kinds it runs: `command`, `code:python`, `invoke`, ….
    pub(super) programs: std::collections::BTreeSet<String>,
    /// The network policies it enforces: `none`, `allowlist`, `unrestricted`.
    pub(super) network: std::collections::BTreeSet<String>,
    /// What else it offers: `streaming`, `files`, `process`, `terminal`, `tcp`,
    /// `pause`, `cgroup`, ….
    pub(super) features: std::collections::BTreeSet<String>,
    /// The same in the shared sandbox vocabulary of agent frameworks: `streaming`,
    /// `warm-pool` (the pool keeps instances ready), `strict`, `context-isolated`,
    /// `network-allowlist`, `network-unrestricted`.
    pub(super) capabilities: std::collections::BTreeSet<String>,
    /// The limits it enforces on this host, by request field (`timeout_ms`,
    /// `memory_bytes`, `disk_bytes`, …). A request that sets another is refused
    /// with `CAPABILITY_NOT_SUPPORTED`; a default it cannot enforce does not apply.
    pub(super) limits: std::collections::BTreeSet<String>,
    /// Whether the caller may use it: its level is among those the caller's tenant
    /// is allowed.
    pub(super) usable: bool,
}

/// `GET /v1/stats`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct StatsAnswer {
    /// The scheduler's figures, as the caller may see them.
    pub(super) scheduler: Stats,
    /// The audit log's figures, as the caller may see them.
    pub(super) audit: AuditStats,
    /// The bytes of kept results (the caller's own, for a tenant).
    pub(super) results: ResultBytes,
}

/// Bytes of kept results against their bound.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ResultBytes {
    /// Bytes kept now.
    pub(super) bytes: u64,
    /// The bound (`server.max_result_bytes`, or `max_result_bytes_per_tenant` for a
    /// tenant).
    pub(super) max_bytes: u64,
}

/// `GET /v1/executions/{id}`: the kept result, or that it still runs.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum ExecutionAnswer<'a> {
    /// The execution finished: its result.
    Finished(WireResult<'a>),
    /// It is queued or running.
    Running(Running),
}

/// An execution not finished yet.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Running {
    /// The execution.
    pub(super) id: ExecutionId,
    /// Always `running`.
    pub(super) status: RunningState,
}

/// The one state of [`Running`].
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum RunningState {
    /// Queued or running.
    Running,
}

/// `DELETE /v1/executions/{id}`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Cancelled {
    /// The execution.
    pub(super) id: ExecutionId,
    /// Whether this request cancelled it (`false`: it had already finished).
    pub(super) cancelled: bool,
}

/// `GET /v1/sandboxes/{id}/processes`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ProcessList {
    /// The sandbox's processes and terminals.
    pub(super) processes: Vec<ProcessInfo>,
}

/// `POST /v1/sandboxes/{id}/processes/{process}/signal`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Signalled {
    /// The signal sent, by number.
    pub(super) signal: i32,
}

/// `GET /v1/fleet`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct FleetAnswer {
    /// The id of the node that answered.
    pub(super) node: String,
    /// Every node the fleet knows, by id.
    pub(super) nodes: Vec<crate::federation::NodeView>,
}

//! The hook through which a fleet (many nodes acting as one) plugs into the facade.
//!
//! A [`Paddock`](crate::Paddock) on its own runs everything it is given. One made
//! with [`Paddock::federated`](crate::Paddock::federated) hands its one-shot
//! executions, their lookups by id, their cancellation and the audit search to a
//! [`Federation`], which may run them on any node; the surfaces on top (the HTTP
//! API, the CLI) need not know. The `paddock-fleet` crate implements it over NATS
//! JetStream.

use std::sync::Arc;

use async_trait::async_trait;
use paddock_core::{EngineName, Error, ExecResult, ExecutionId, IsolationLevel, SandboxSpec};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::audit::{AuditEntry, AuditQuery};
use crate::{Caller, Execute, ExecutionStream};

/// What a lookup by id found.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// Accepted and not finished: queued or running somewhere.
    Running,
    /// Finished, with its answer.
    Finished(Arc<Result<ExecResult, Error>>),
}

/// What a cancellation by id did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelOutcome {
    /// Whether the caller may see an execution of that id (running or kept).
    pub known: bool,
    /// Whether this call stopped it.
    pub cancelled: bool,
}

/// Where a sandbox lives, seen from the node asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionPlace {
    /// On this node, or not known to the fleet: this node answers for it.
    Here,
    /// On another node: every call on it goes to that node's HTTP API.
    Node {
        /// The owner's id.
        id: String,
        /// The base URL of the owner's HTTP API (`http://HOST:PORT`).
        address: String,
    },
}

/// The free room of one engine on one node, as the node last published it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EngineRoom {
    /// The engine.
    pub engine: EngineName,
    /// The strongest isolation level it gives.
    pub level: IsolationLevel,
    /// Slots the node has for the engine's work in all.
    pub slots: usize,
    /// Slots free now.
    pub free: usize,
}

/// How a node looks to the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeHealth {
    /// Its heartbeat is fresh.
    Up,
    /// Its heartbeat is late (more than two intervals): it may be lost.
    Late,
    /// Its heartbeat stopped (past the work's ack wait): its work is taken over and
    /// its sessions answer `NODE_LOST`.
    Down,
}

/// One node of a fleet: `GET /v1/fleet`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeView {
    /// The node's id.
    pub id: String,
    /// Whether the node answering is this one.
    pub this_node: bool,
    /// Its health, from the age of its last heartbeat.
    pub health: NodeHealth,
    /// Milliseconds since its last heartbeat, as the answering node saw it.
    pub heartbeat_age_ms: u64,
    /// When it joined (Unix ms).
    pub started_at_ms: u64,
    /// Its free room per engine.
    pub engines: Vec<EngineRoom>,
    /// Executions it runs now for the fleet.
    pub running: usize,
    /// Sandboxes open on it.
    pub sandboxes: usize,
    /// The base URL of its HTTP API; only operators (and the embedder) see it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// A fleet seen from one of its nodes. Every method works on behalf of the tenant it
/// is given (a request's `tenant`, or `caller`), with the walls of the node itself:
/// another tenant's execution is answered as if it did not exist.
#[async_trait]
pub trait Federation: Send + Sync + std::fmt::Debug + 'static {
    /// This node's id in the fleet.
    fn node_id(&self) -> String;

    /// Runs `msg` on a node with room and answers its result. With `key`, runs it
    /// once per `(tenant, key)` in the whole fleet: a later call with the same key
    /// answers the first execution's result.
    async fn execute(&self, msg: Execute, key: Option<String>) -> Result<ExecResult, Error>;

    /// [`execute`](Self::execute), streaming the output as the running node
    /// produces it.
    async fn execute_stream(
        &self,
        msg: Execute,
        key: Option<String>,
    ) -> Result<ExecutionStream, Error>;

    /// Looks an execution up by id, wherever it was accepted or ran.
    async fn lookup(&self, caller: &Caller, id: &ExecutionId) -> Result<Option<Lookup>, Error>;

    /// Cancels an execution by id wherever it runs, and forgets its result (a later
    /// lookup answers `None`), as `DELETE /v1/executions/{id}` does.
    async fn cancel(&self, caller: &Caller, id: &ExecutionId) -> Result<CancelOutcome, Error>;

    /// Searches the fleet's audit log, newest first; a tenant gets its own entries.
    async fn audit(&self, caller: &Caller, query: AuditQuery) -> Result<Vec<AuditEntry>, Error>;

    /// The fleet's nodes, this one included, by id.
    async fn nodes(&self, caller: &Caller) -> Result<Vec<NodeView>, Error>;

    /// Where a sandbox for `spec` (on `engine`, or the engine this node would
    /// choose) should open: the node with the most free room for it. `Here` unless
    /// the federation places sessions.
    async fn place_session(
        &self,
        _spec: &SandboxSpec,
        _engine: Option<&EngineName>,
    ) -> Result<SessionPlace, Error> {
        Ok(SessionPlace::Here)
    }

    /// Takes a place, named `ticket` (unique, chosen by the caller), for one more
    /// sandbox of `tenant` in the fleet's per-tenant shares
    /// (`limiter.max_sandboxes_per_tenant`, `max_slots_per_tenant`), before this
    /// node opens it: `RATE_LIMITED` or `POOL_EXHAUSTED` at a cap. An error leaves
    /// no place taken. The ticket goes to
    /// [`session_opened`](Self::session_opened) once the sandbox is open, or to
    /// [`release_admission`](Self::release_admission) when it does not open (or
    /// when the caller cannot tell whether this call took the place: it was
    /// dropped midway). Whether a place was taken: a fleet that counts no shares
    /// takes none.
    async fn admit_session(&self, _tenant: Option<&str>, _ticket: &str) -> Result<bool, Error> {
        Ok(false)
    }

    /// Gives back the place named `ticket`, if [`admit_session`](Self::admit_session)
    /// took it. Returns at once (the fleet gives it back in the background), so
    /// that it may be called from `Drop`.
    fn release_admission(&self, _tenant: Option<&str>, _ticket: &str) {}

    /// Records that sandbox `id` of `tenant` opened on this node (its owner), with
    /// the place `ticket` the fleet admitted it with (given back when it closes).
    /// An error means the fleet could not record it (the ticket is given back
    /// then), and the sandbox must not be used.
    async fn session_opened(
        &self,
        _tenant: Option<&str>,
        _id: &str,
        _engine: &EngineName,
        _ticket: Option<String>,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// Resolves once the fleet counts node `node` lost (its heartbeat stopped past
    /// the ack wait, or it left), with why: a call forwarded to a node that stops
    /// answering without closing its connections (a frozen host, a cut network)
    /// ends then, instead of waiting on TCP. Never resolves by default.
    async fn node_lost(&self, _node: &str) -> String {
        std::future::pending().await
    }

    /// Records that sandbox `id`, open on this node, was destroyed.
    async fn session_closed(&self, _id: &str) {}

    /// How the HTTP surface reaches another node's sandbox: `None` (the default)
    /// when this fleet forwards no calls, and a call on another node's sandbox is
    /// answered `FLEET_UNAVAILABLE`.
    fn http_forwarder(&self) -> Option<std::sync::Arc<dyn crate::http::HttpForwarder>> {
        None
    }

    /// Where sandbox `id` lives, for `caller`. `Here` when it is on this node or
    /// the caller may not see it (this node then answers, as for an id that never
    /// existed); an error when its owner is lost (`NODE_LOST`) or cannot be asked.
    /// For a call another node `forwarded` here, only this node's own knowledge
    /// counts (it is never sent on again).
    async fn session_owner(
        &self,
        _caller: &Caller,
        _id: &str,
        _forwarded: bool,
    ) -> Result<SessionPlace, Error> {
        Ok(SessionPlace::Here)
    }
}

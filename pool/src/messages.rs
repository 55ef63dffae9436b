//! The public message API of the [`Supervisor`](crate::Supervisor).
//!
//! Any actix actor holding an `Addr<Supervisor>` drives Paddock with these messages;
//! the [`Paddock`](crate::Paddock) handle is a thin layer over the same messages.
//! Send them with `send` (or `try_send`), never `do_send`: a full mailbox is then an
//! answer instead of an unbounded queue.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use paddock_core::{
    EngineName, Error, ExecOrder, ExecRequest, ExecResult, ExecutionId, FileEntry,
    IsolationLevel, OutputSink, SandboxSpec, SandboxStatus,
};
use serde::Serialize;

use crate::audit::{AuditEntry, AuditQuery, AuditStats, OperatorAccess};
use crate::caller::Caller;
use crate::engine_pool::PoolStats;

/// Runs one execution in a pooled engine instance: its order (what to run and how),
/// and where its output goes besides the streamer.
#[derive(Message, Clone)]
#[rtype(result = "Result<ExecResult, Error>")]
pub struct Execute {
    /// What to run and how: the request (its `id` names the execution for cancel
    /// and streaming), the engine, level, network, trace and `on_node_loss`.
    pub order: ExecOrder,
    /// An extra sink that receives output as it is produced (besides the streamer).
    pub sink: Option<Arc<dyn OutputSink>>,
}

impl Execute {
    /// An execution of `request` on the default engine with default policy.
    pub fn new(request: ExecRequest) -> Execute {
        Execute::from(ExecOrder::new(request))
    }

    /// Chooses the engine.
    pub fn on(mut self, engine: EngineName) -> Execute {
        self.order.engine = Some(engine);
        self
    }
}

impl From<ExecOrder> for Execute {
    /// The execution of `order`, with no sink of its own.
    fn from(order: ExecOrder) -> Execute {
        Execute { order, sink: None }
    }
}

impl std::fmt::Debug for Execute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execute")
            .field("id", &self.order.request.id)
            .field("engine", &self.order.engine)
            .field("level", &self.order.level)
            .finish_non_exhaustive()
    }
}

/// An execution ([`Execute`] or [`SandboxExec`]) whose sender waits to learn that
/// its request passed validation: `proven` is sent to once it did, before anything
/// else may refuse it, and dropped unsent when the request was refused before that
/// (then the answer is that refusal). The streaming calls use it to answer a request
/// wrong in itself before its stream begins.
pub(crate) struct Proven<M> {
    /// The execution.
    pub(crate) msg: M,
    /// Told once the request is validated.
    pub(crate) proven: tokio::sync::oneshot::Sender<()>,
}

impl<M: Message> Message for Proven<M> {
    type Result = M::Result;
}

/// Cancels a queued or running execution by id, on behalf of `caller`. Answers
/// whether this call cancelled it (`false` when it is unknown, already finished, or
/// another tenant's).
#[derive(Debug, Message, Clone)]
#[rtype(result = "bool")]
pub struct Cancel {
    /// On whose behalf.
    pub caller: Caller,
    /// The execution.
    pub id: ExecutionId,
}

/// Looks up an open sandbox by id, on behalf of `caller`: another tenant's sandbox
/// is `NOT_FOUND`, like one that never existed; a destroyed one of the caller's is
/// `ENGINE_DISPOSED`.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<SandboxInfo, Error>")]
pub struct GetSandbox {
    /// On whose behalf.
    pub caller: Caller,
    /// The sandbox id.
    pub id: String,
    /// What the caller is about to do with it (`sandbox.exec`, …), recorded when the
    /// caller is an operator.
    pub action: &'static str,
}

/// Opens a sandbox session: a lease of one engine instance with a persistent workdir.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<SandboxInfo, Error>")]
pub struct OpenSandbox {
    /// The engine; the configured default when `None`.
    pub engine: Option<EngineName>,
    /// Level, network, default limits and tenant.
    pub spec: SandboxSpec,
}

/// A session's description.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct SandboxInfo {
    /// The session id.
    pub id: String,
    /// The engine.
    pub engine: EngineName,
    /// Its status.
    pub status: SandboxStatus,
    /// The sandbox's root as its programs see it (`/workspace` in a container):
    /// the files API takes paths under it and lists paths under it.
    pub root_dir: String,
    /// Where its files are on the host, for the embedder (not sent to API clients).
    #[serde(skip)]
    #[schemars(skip)]
    pub host_dir: String,
}

/// Runs an execution in a session.
#[derive(Message, Clone)]
#[rtype(result = "Result<ExecResult, Error>")]
pub struct SandboxExec {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The request.
    pub request: ExecRequest,
    /// An extra sink for live output.
    pub sink: Option<Arc<dyn OutputSink>>,
}

impl std::fmt::Debug for SandboxExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxExec")
            .field("sandbox", &self.sandbox)
            .field("id", &self.request.id)
            .finish_non_exhaustive()
    }
}

/// Opens a file of a session for a streaming read: its size and its bytes, through
/// one bounded buffer whatever the size.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<paddock_core::FileReader, Error>")]
pub struct OpenRead {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The file, as for [`ReadFile`].
    pub path: String,
}

/// Writes a file of a session from a byte stream, taking at most `max_bytes`
/// (`LIMITS_EXCEEDED` beyond, and no file is left); answers the bytes written.
#[derive(Message)]
#[rtype(result = "Result<u64, Error>")]
pub struct WriteFrom {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The file, as for [`WriteFile`].
    pub path: String,
    /// Its bytes.
    pub source: paddock_core::ByteSource,
    /// The most bytes taken.
    pub max_bytes: u64,
}

impl std::fmt::Debug for WriteFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteFrom")
            .field("sandbox", &self.sandbox)
            .field("path", &self.path)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// Writes a file in a session.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<(), Error>")]
pub struct WriteFile {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// Path inside the workdir.
    pub path: String,
    /// The bytes.
    pub data: Vec<u8>,
}

/// Reads a file in a session.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<Vec<u8>, Error>")]
pub struct ReadFile {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// Path inside the workdir.
    pub path: String,
}

/// Lists files in a session.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<Vec<FileEntry>, Error>")]
pub struct ListFiles {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// Directory inside the workdir.
    pub path: String,
}

/// Stats a path of a session (`lstat`: a symlink is itself).
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<paddock_core::FileInfo, Error>")]
pub struct StatPath {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The path, as for [`ReadFile`].
    pub path: String,
}

/// Lists a directory of a session, `depth` levels down.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<Vec<paddock_core::FileInfo>, Error>")]
pub struct ListDir {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The directory.
    pub path: String,
    /// How many levels down (1: its own entries).
    pub depth: u32,
}

/// Makes a directory of a session, with its parents; answers whether it was made
/// (`false`: a directory was already there).
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<bool, Error>")]
pub struct MakeDir {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The directory.
    pub path: String,
}

/// Moves (renames) a path of a session.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<(), Error>")]
pub struct MovePath {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// What to move.
    pub from: String,
    /// Where to.
    pub to: String,
}

/// What a session uses now: CPU time, memory and disk.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<paddock_core::SandboxUsage, Error>")]
pub struct GetUsage {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
}

/// Replaces the user metadata of a path of a session.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<(), Error>")]
pub struct SetMetadata {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The file or directory.
    pub path: String,
    /// Its metadata from now on.
    pub metadata: paddock_core::FileMetadata,
}

/// Removes a path of a session, a directory with everything in it.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<(), Error>")]
pub struct RemovePath {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The path.
    pub path: String,
}

/// Watches a directory of a session: its changes as they happen, until the watch is
/// dropped or the session ends.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<paddock_core::FileWatch, Error>")]
pub struct WatchDir {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The directory.
    pub path: String,
    /// Whether everything below it is watched too.
    pub recursive: bool,
}

/// Pauses a session: its processes freeze until [`UnpauseSandbox`] (engines with the
/// `pause` feature; others answer `CAPABILITY_NOT_SUPPORTED`).
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<(), Error>")]
pub struct PauseSandbox {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
}

/// Thaws a session [`PauseSandbox`] froze.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<(), Error>")]
pub struct UnpauseSandbox {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
}

/// A session's status: `destroyed` for one of the caller's that was destroyed (and
/// is still remembered); `NOT_FOUND` for unknown ids and other tenants' sessions.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<SandboxStatus, Error>")]
pub struct GetSandboxStatus {
    /// On whose behalf.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
}

/// Destroys a session. Idempotent for a session of the caller's that this
/// supervisor destroyed; `NOT_FOUND` for unknown ids and other tenants' sessions.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<(), Error>")]
pub struct DestroySandbox {
    /// On whose behalf.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
}

/// The engine an execution would run on: the named one, else the one the supervisor
/// chooses for the level, program and tenant (what a fleet uses to pick the work
/// queue); or why none can take it.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<EngineName, Error>")]
pub struct ChooseEngine {
    /// The engine the request names, if any.
    pub engine: Option<EngineName>,
    /// The isolation level it requires.
    pub level: IsolationLevel,
    /// The kind of program it runs; `None` for a sandbox.
    pub program: Option<paddock_core::ProgramKind>,
    /// Its tenant (only engines whose level the tenant may use are chosen).
    pub tenant: Option<String>,
}

/// Checks an execution as the scheduler would before running it (its shape, the
/// operator's ceilings, the network, level and limits its tenant may ask for, the
/// engine's choice and capabilities), without running it: the engine it would run
/// on, or the refusal it would get. A fleet's accepting node asks this before it
/// queues work.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<EngineName, Error>")]
pub struct CheckAdmission(pub Execute);

/// Keeps `min_idle` instances ready in the pool sandboxes of `spec` on `engine` are
/// taken from (its engine, network policy, disk quota and home), instead of
/// `pool.min_idle`: what an embedder asks for sandboxes it will open often, such as
/// an E2B template's. The larger of two asks for one pool holds. Effective for a pool
/// made after the ask (the first one of that kind).
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<(), Error>")]
pub struct WarmPool {
    /// The engine.
    pub engine: EngineName,
    /// The sandboxes' spec (level, network, disk limits and home count).
    pub spec: SandboxSpec,
    /// Instances kept ready (at most the pool's `max_size`).
    pub min_idle: usize,
}

/// The ids of the sandboxes open now, every tenant's, without touching them (their
/// idle clocks run on): what a fleet node checks its recorded sessions against.
#[derive(Debug, Message, Clone, Copy)]
#[rtype(result = "Vec<String>")]
pub struct OpenSandboxIds;

/// The limiter's counters (operators and the embedder only; a tenant is refused
/// with `NOT_FOUND`, as for another tenant's objects).
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<crate::limiter::LimiterStats, Error>")]
pub struct GetLimiterStats {
    /// On whose behalf.
    pub caller: Caller,
}

/// A snapshot of the scheduler, as `caller` may see it: a tenant gets the pools'
/// sizes and its own figures; an operator or the embedder every tenant's.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Stats")]
pub struct GetStats {
    /// On whose behalf.
    pub caller: Caller,
}

/// A snapshot of the scheduler (eventually consistent).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Stats {
    /// One entry per pool (shared by every tenant).
    pub pools: Vec<PoolStats>,
    /// Executions accepted so far, every tenant's; absent in a tenant's view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_total: Option<u64>,
    /// Executions refused before acceptance (validation, policy, limiter), every
    /// tenant's; absent in a tenant's view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_total: Option<u64>,
    /// Executions queued or running now (the tenant's, in a tenant's view).
    pub in_flight: usize,
    /// Open sandbox sessions (the tenant's, in a tenant's view).
    pub sandboxes: usize,
    /// Pooled executions suspended and waiting for their resume (each holds an
    /// instance; see `pool.max_suspended`); the tenant's, in a tenant's view.
    pub suspended: usize,
    /// Whether the supervisor still admits work.
    pub admitting: bool,
    /// The tenant the figures are confined to (`""`: callers without a tenant);
    /// absent when they cover every tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// Searches the audit log on behalf of `caller`: a tenant gets only its own entries,
/// whatever `query.tenant` says.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Vec<AuditEntry>")]
pub struct SearchAudit {
    /// On whose behalf.
    pub caller: Caller,
    /// The filters.
    pub query: AuditQuery,
}

/// Audit statistics as `caller` may see them (a tenant's cover its entries still in
/// the ring).
#[derive(Debug, Message, Clone)]
#[rtype(result = "AuditStats")]
pub struct AuditStatistics {
    /// On whose behalf.
    pub caller: Caller,
}

/// The most recent uses of operator keys, newest first; operators and the embedder
/// only (a tenant gets `NOT_FOUND`).
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<Vec<OperatorAccess>, Error>")]
pub struct OperatorAccesses {
    /// On whose behalf.
    pub caller: Caller,
    /// At most this many.
    pub limit: usize,
}

/// Graceful shutdown: stop admitting, let in-flight work finish up to `drain`, cancel
/// what remains, destroy every instance and session, flush the audit log.
#[derive(Debug, Message, Clone)]
#[rtype(result = "ShutdownReport")]
pub struct Shutdown {
    /// How long in-flight executions may take to finish.
    pub drain: Duration,
}

/// What shutdown did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ShutdownReport {
    /// Executions that finished during the drain.
    pub drained: usize,
    /// Executions cancelled when the drain deadline passed.
    pub cancelled: usize,
    /// Sessions destroyed.
    pub sandboxes_destroyed: usize,
}

/// A background process or terminal of a session, as the supervisor keeps it.
#[derive(Debug, Clone)]
pub enum Attachable {
    /// A background process.
    Process(paddock_core::ProcessHandle),
    /// A terminal.
    Terminal(paddock_core::TerminalHandle),
}

impl Attachable {
    /// The shared state both kinds wrap.
    pub fn shared(&self) -> &Arc<paddock_core::interactive::ProcessShared> {
        match self {
            Attachable::Process(p) => p.shared(),
            Attachable::Terminal(t) => t.shared(),
        }
    }
}

/// What the supervisor reports about a session's process or terminal.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ProcessInfo {
    /// Its id in the sandbox: `p-` (a process) or `t-` (a terminal) and 32 random
    /// hex digits.
    pub id: String,
    /// `process` or `terminal`.
    #[schemars(extend("enum" = ["process", "terminal"]))]
    pub kind: &'static str,
    /// The execution id its audit entry is recorded under.
    pub execution_id: ExecutionId,
    /// The command.
    pub argv: Vec<String>,
    /// Its pid where the host sees it (`null` inside a container).
    pub pid: Option<u32>,
    /// When it started (Unix ms).
    pub started_at_ms: u64,
    /// How it ended, once it has.
    pub exit: Option<paddock_core::ProcessExit>,
    /// Its number in the sandbox: counted from 1 in the order processes and terminals
    /// started, never given twice in one sandbox.
    pub number: u32,
    /// The tag it was started with.
    pub tag: Option<String>,
    /// The working directory it was started in, as asked (`null`: the workdir).
    pub cwd: Option<String>,
    /// The environment variables it was started with, beyond the sandbox's own.
    pub env: std::collections::BTreeMap<String, String>,
}

/// Which of a session's processes or terminals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessSelector {
    /// By its id (`p-…` or `t-…`).
    Id(String),
    /// By its [`ProcessInfo::number`].
    Number(u32),
    /// The latest one started with this tag.
    Tag(String),
}

impl std::fmt::Display for ProcessSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProcessSelector::Id(id) => write!(f, "`{id}`"),
            ProcessSelector::Number(n) => write!(f, "number {n}"),
            ProcessSelector::Tag(t) => write!(f, "with tag `{t}`"),
        }
    }
}

/// A started background process or terminal: its handle and its record.
#[derive(Debug, Clone)]
pub struct Started {
    /// The handle.
    pub handle: Attachable,
    /// What the supervisor reports about it.
    pub info: ProcessInfo,
}

/// Starts a background process in a session. The policy checks its command like an
/// execution's; it is audited (one entry, under `info.execution_id`) when it ends.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<Started, Error>")]
pub struct StartProcess {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// What to run.
    pub spec: paddock_core::ProcessSpec,
}

/// Asks the policy about a program that will run in a session by other means than an
/// execution (code a long-lived interpreter of the session is given, say): refused
/// like an execution with the same program (`CODE_BLOCKED`, counted and measured
/// the same), or admitted with the policy's warnings.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<Vec<String>, Error>")]
pub struct CheckProgram {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// What will run.
    pub program: paddock_core::Program,
}

/// Opens a terminal in a session (checked and audited like [`StartProcess`]).
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<Started, Error>")]
pub struct OpenTerminal {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// What to run on it.
    pub spec: paddock_core::TerminalSpec,
}

/// Opens a TCP stream to a service on a session's guest loopback.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<paddock_core::TcpConnection, Error>")]
pub struct OpenTcpConnection {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// The guest port (and loopback host).
    pub target: paddock_core::TcpTarget,
}

/// A session's process or terminal by id.
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<Started, Error>")]
pub struct GetProcess {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
    /// Which process.
    pub process: ProcessSelector,
}

/// A session's processes and terminals (running ones, and the most recent that ended).
#[derive(Debug, Message, Clone)]
#[rtype(result = "Result<Vec<ProcessInfo>, Error>")]
pub struct ListProcesses {
    /// On whose behalf: another tenant's session is `NOT_FOUND`, like one that never
    /// existed.
    pub caller: Caller,
    /// The session id.
    pub sandbox: String,
}

//! Label keys and the label values Paddock records.
//!
//! The `record_*` methods take label values as `&'static str`, so a call site can
//! pass these constants (or any other static string, such as an engine kind's
//! name) without allocating. Keeping the known values here gives the scheduler and
//! dashboards one spelling.

/// Label key naming the engine kind (`subprocess`, `isolate`, `container`).
pub const ENGINE: &str = "engine";
/// Label key naming how an execution ended.
pub const OUTCOME: &str = "outcome";
/// Label key naming the policy rule that blocked a request.
pub const RULE: &str = "rule";
/// Label key naming the result of a pool acquisition.
pub const RESULT: &str = "result";
/// Label key naming why an execution or engine was killed.
pub const REASON: &str = "reason";

/// Values of the `outcome` label, one per result outcome.
pub mod outcome {
    /// The program ran to its end (any exit code or signal).
    pub const COMPLETED: &str = "completed";
    /// The hard deadline passed.
    pub const TIMED_OUT: &str = "timed_out";
    /// The caller cancelled the execution.
    pub const CANCELLED: &str = "cancelled";
    /// A memory, pids, output or CPU limit was exceeded.
    pub const LIMIT_EXCEEDED: &str = "limit_exceeded";
    /// The execution failed before or while running (spawn, engine or protocol error).
    pub const FAILED: &str = "failed";
}

/// Values of the `result` label of `paddock_pool_acquisitions_total`.
pub mod acquire {
    /// A warm or freshly created engine was handed out.
    pub const OK: &str = "ok";
    /// The wait queue was full; the request was refused at once (`POOL_EXHAUSTED`).
    pub const EXHAUSTED: &str = "exhausted";
    /// The request waited in the queue until the acquire timeout passed.
    pub const TIMEOUT: &str = "timeout";
    /// Creating or recycling an engine for the request failed.
    pub const FAILED: &str = "failed";
}

/// Values of the `reason` label of `paddock_kills_total`.
pub mod kill {
    /// The execution's hard deadline passed.
    pub const TIMEOUT: &str = "timeout";
    /// The caller cancelled the execution.
    pub const CANCEL: &str = "cancel";
    /// A sandbox or engine was destroyed while work was running in it.
    pub const DESTROY: &str = "destroy";
    /// The memory limit was exceeded.
    pub const MEMORY: &str = "memory";
    /// The pids limit was exceeded.
    pub const PIDS: &str = "pids";
    /// The output cap was exceeded.
    pub const OUTPUT: &str = "output";
    /// The CPU time limit was exceeded.
    pub const CPU: &str = "cpu";
    /// The scheduler is shutting down.
    pub const SHUTDOWN: &str = "shutdown";
}

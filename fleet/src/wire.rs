//! What nodes send each other: work orders, execution records, node cards and
//! control requests. JSON, so that an operator can read them with the `nats` CLI.

use paddock_core::{EngineName, Error, ExecOrder, ExecResult, ExecutionId};
use paddock_pool::federation::EngineRoom;
use serde::{Deserialize, Serialize};

/// One accepted execution, as published on its engine's work queue (the message id
/// is the execution id): the caller's order as it is, its fields inline, and the
/// routing beside it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Order {
    /// What to run and how; its request's `tenant` is the caller's. The accepting
    /// node names the engine it chose and the `on_node_loss` that holds: an order
    /// without them is not one it sent, and is dropped like one that does not parse.
    #[serde(flatten)]
    pub(crate) exec: ExecOrder,
    /// Whether the accepting node streams the output to its caller.
    pub(crate) stream: bool,
    /// The accepting node, and where it waits for output and the result.
    pub(crate) accepted_by: String,
    pub(crate) reply: String,
    pub(crate) accepted_at_ms: u64,
    /// Not started by then: answered `timed_out` without running.
    pub(crate) start_by_ms: u64,
}

/// Where an execution stands, in its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    /// A node holds the lease and runs it.
    Running,
    /// The node that held it gave it back before running it (its pool was full, or
    /// it was shutting down); the next node to take the message runs it.
    Released,
    /// Finished: `answer` is its one result.
    Done,
}

/// The record of one execution (key: its id): the lease that fences redelivery, and
/// at the end its one result. Every change is a compare-and-set on the record's
/// revision, so of two nodes that both believe they hold the lease, only one
/// writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) id: ExecutionId,
    #[serde(default)]
    pub(crate) tenant: Option<String>,
    pub(crate) engine: EngineName,
    pub(crate) phase: Phase,
    /// The node holding the lease (or that held it last).
    pub(crate) node: String,
    /// That node's incarnation (a restarted node is a new one).
    pub(crate) incarnation: String,
    /// Runs started so far.
    pub(crate) attempts: u32,
    /// Which of its writer's takes (or fences) of the work wrote it: a number drawn
    /// once per take from the node's incarnation (`Context::next_write`, in the
    /// `context` module, which uses this one). Two deliveries of one order taken
    /// by the same node are told apart by it: a create that finds a record must
    /// not read the other delivery's as its own.
    #[serde(default)]
    pub(crate) write: u64,
    /// The lease holds until then (Unix ms), unless renewed.
    pub(crate) lease_until_ms: u64,
    pub(crate) accepted_by: String,
    pub(crate) accepted_at_ms: u64,
    /// A `DELETE` asked to forget it: lookups answer as if it never existed, but the
    /// record stays (and fences) until it expires.
    #[serde(default)]
    pub(crate) forgotten: bool,
    /// The audit hash of its program (for the entry of a node that fences it off).
    #[serde(default)]
    pub(crate) code_hash: String,
    /// When it became `Done` (Unix ms; 0 before).
    #[serde(default)]
    pub(crate) done_at_ms: u64,
    /// The one result, once `Done`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) answer: Option<Result<ExecResult, Error>>,
}

/// What a node publishes about itself each heartbeat (key: its id).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NodeCard {
    pub(crate) id: String,
    pub(crate) incarnation: String,
    pub(crate) address: Option<String>,
    pub(crate) started_at_ms: u64,
    pub(crate) at_ms: u64,
    pub(crate) engines: Vec<EngineRoom>,
    pub(crate) running: usize,
    pub(crate) sandboxes: usize,
    /// Set in the last card of a node that leaves on purpose.
    #[serde(default)]
    pub(crate) leaving: bool,
}

/// A request to a node (on its control subject) or to all nodes (broadcast).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Control {
    /// Cancel the execution if this node runs it (or accepted it and it waits in
    /// the queue); with `forget`, its result is recorded as forgotten.
    Cancel {
        id: ExecutionId,
        /// `None`: on behalf of an operator (any tenant's).
        tenant: Option<Option<String>>,
        forget: bool,
    },
    /// Whether this node accepted the execution and it still waits to start.
    Lookup {
        id: ExecutionId,
        tenant: Option<Option<String>>,
    },
}

/// A node's answer to a [`Control`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ControlReply {
    /// The node knows the execution (and the caller may see it).
    pub(crate) known: bool,
    /// This request stopped it.
    #[serde(default)]
    pub(crate) cancelled: bool,
}

/// What an accepting node receives on its inbox, in the `Paddock-Kind` header:
/// output (`stdout` / `stderr`, the raw bytes) or the `result` (the answer as JSON).
pub(crate) const KIND_HEADER: &str = "Paddock-Kind";
/// The execution an inbox message belongs to.
pub(crate) const ID_HEADER: &str = "Paddock-Id";

/// The answer of an execution, as recorded and sent.
pub(crate) type Answer = Result<ExecResult, Error>;

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::{ExecRequest, IsolationLevel, NetworkPolicy, OnNodeLoss, Program};

    fn order() -> Order {
        let mut request = ExecRequest::new(Program::command(["sh", "-c", "cat"]));
        request.stdin = Some("in".into());
        request.env.insert("A".into(), "1".into());
        request.limits.timeout_ms = Some(5_000);
        request.tenant = Some("t".into());
        let mut exec = ExecOrder::new(request);
        exec.engine = Some(EngineName::SUBPROCESS);
        exec.level = IsolationLevel::Strict;
        exec.network = NetworkPolicy::Unrestricted;
        exec.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        exec.on_node_loss = Some(OnNodeLoss::Retry);
        Order {
            exec,
            stream: true,
            accepted_by: "a".into(),
            reply: "inbox.a".into(),
            accepted_at_ms: 1,
            start_by_ms: 2,
        }
    }

    #[test]
    fn an_order_is_one_flat_object_and_reads_back_as_it_was() {
        let order = order();
        let json = serde_json::to_value(&order).unwrap();
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort_unstable();
        // The same fields, under the same names, as when the order had its own
        // copy of each.
        assert_eq!(
            keys,
            [
                "accepted_at_ms",
                "accepted_by",
                "engine",
                "level",
                "network",
                "on_node_loss",
                "reply",
                "request",
                "start_by_ms",
                "stream",
                "traceparent",
            ]
        );
        assert_eq!(json["engine"], "subprocess");
        assert_eq!(json["on_node_loss"], "retry");
        assert_eq!(json["request"]["tenant"], "t");
        let back: Order = serde_json::from_value(json).unwrap();
        assert_eq!(back.exec, order.exec);
        assert_eq!(
            (back.stream, back.accepted_by.as_str(), back.reply.as_str()),
            (true, "a", "inbox.a")
        );
        assert_eq!((back.accepted_at_ms, back.start_by_ms), (1, 2));
    }

    #[test]
    fn an_order_without_its_engine_says_so() {
        let mut json = serde_json::to_value(order()).unwrap();
        json.as_object_mut().unwrap().remove("engine");
        json.as_object_mut().unwrap().remove("on_node_loss");
        // Read, but with nothing resolved: the worker drops it (`take`).
        let back: Order = serde_json::from_value(json).unwrap();
        assert!(back.exec.engine.is_none() && back.exec.on_node_loss.is_none());
        let mut json = serde_json::to_value(order()).unwrap();
        json.as_object_mut().unwrap().remove("request");
        assert!(serde_json::from_value::<Order>(json).is_err());
    }
}

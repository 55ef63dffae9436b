//! Many Paddock nodes acting as one, over NATS JetStream.
//!
//! A node joins with [`Fleet::join`], handing over its
//! [`Paddock`](paddock_pool::Paddock); the handle [`Fleet::paddock`] returns is the
//! same facade, federated: its one-shot
//! executions go to a work queue per engine and run on whichever node has room,
//! their results and idempotency keys are kept fleet-wide, cancel by id reaches the
//! node that runs the work, and the audit search covers the fleet. A sandbox stays on
//! the node that opened it, and the fleet records its owner so that every node's
//! HTTP API routes the calls on it there. `docs/fleet.md` describes the design, its guarantees and its limits.
//!
//! What lives where on NATS (every name under `fleet.prefix`):
//!
//! | what | kind | name |
//! |---|---|---|
//! | work of engine E | work-queue stream, pulled by durable consumer `workers` | `P_WORK_E`, subject `P.work.E` |
//! | execution records (lease, then the one result) | KV bucket | `P_exec` |
//! | idempotency keys | KV bucket | `P_idem` |
//! | per-tenant rate counters | KV bucket | `P_rate` |
//! | per-tenant holds (concurrency, slots, sandboxes) | KV bucket | `P_shares` |
//! | node cards (capacity, heartbeat) | KV bucket | `P_nodes` |
//! | sandbox owners | KV bucket | `P_sessions` |
//! | the audit log | stream, deduplicated by execution id | `P_AUDIT`, subjects `P.audit.<tenant>` |
//! | output and results for an accepting node | core subject | `P.node.N.inbox` |
//! | cancel and lookup | core request-reply | `P.node.N.ctl`, `P.all.ctl` |

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

mod accept;
mod audit;
mod config;
mod context;
mod control;
mod forward;
pub mod local;
#[cfg(test)]
mod module_graph;
mod names;
mod node;
mod orders;
mod rate;
mod registry;
mod sessions;
mod shares;
mod store;
mod version;
mod wire;
mod worker;

pub use config::FleetConfig;
pub use node::{Fleet, JoinError, Located};
pub use shares::ShareCaps;

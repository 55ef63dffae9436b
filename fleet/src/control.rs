//! Requests between nodes: cancel and lookup, on a node's own control subject (for
//! the node that runs the work) and on the broadcast subject (for the node that
//! accepted work still waiting in the queue, which only it knows of). On the
//! broadcast subject a node that does not know the execution stays silent, so the
//! first answer is the one that knows.
//!
//! It works on the [`Orders`] book, and uses the audit and the worker's reply;
//! `accept` uses it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use paddock_core::{ExecResult, ExecutionId, Outcome};

use crate::context::Context;
use crate::orders::{Inbound, Orders};
use crate::store::Cas;
use crate::wire::{Control, ControlReply, Phase, Record};

/// Whether a request on behalf of `tenant` (`None`: an operator) may touch work of
/// `owner`.
pub(crate) fn visible(tenant: &Option<Option<String>>, owner: Option<&str>) -> bool {
    match tenant {
        None => true,
        Some(t) => t.as_deref() == owner,
    }
}

pub(crate) async fn serve(orders: Arc<Orders>, mut sub: async_nats::Subscriber) {
    let broadcast = orders.cx.names.broadcast();
    while let Some(msg) = sub.next().await {
        let Some(reply) = msg.reply.clone() else {
            continue;
        };
        let on_broadcast = msg.subject.as_str() == broadcast;
        let orders = orders.clone();
        tokio::spawn(async move {
            let request: Control = match serde_json::from_slice(&msg.payload) {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "a control request does not parse");
                    return;
                }
            };
            let answer = answer(&orders, request).await;
            if on_broadcast && !answer.known {
                return;
            }
            let body = bytes::Bytes::from(serde_json::to_vec(&answer).unwrap_or_default());
            let _ = orders.cx.client.publish(reply, body).await;
        });
    }
}

async fn answer(orders: &Arc<Orders>, request: Control) -> ControlReply {
    match request {
        Control::Cancel { id, tenant, forget } => cancel_here(orders, &id, &tenant, forget).await,
        Control::Lookup { id, tenant } => ControlReply {
            known: orders
                .waiters
                .get(&id)
                .is_some_and(|w| visible(&tenant, w.tenant.as_deref())),
            cancelled: false,
        },
    }
}

/// Cancels work this node runs, or work it accepted that no node has started.
pub(crate) async fn cancel_here(
    orders: &Arc<Orders>,
    id: &ExecutionId,
    tenant: &Option<Option<String>>,
    forget: bool,
) -> ControlReply {
    if let Some(r) = orders.running.get(id).map(|r| r.clone()) {
        if !visible(tenant, r.tenant.as_deref()) {
            return ControlReply::default();
        }
        if forget {
            r.forget.store(true, Ordering::Release);
        }
        let first = !r.cancel.swap(true, Ordering::AcqRel);
        r.notify.notify_one();
        return ControlReply {
            known: true,
            cancelled: first,
        };
    }
    let Some(waiter) = orders.waiters.get(id).map(|w| w.clone()) else {
        return ControlReply::default();
    };
    if !visible(tenant, waiter.tenant.as_deref()) {
        return ControlReply::default();
    }
    // Accepted here, and no node runs it here: queued (no record), given back
    // (`released`), or running on another node.
    let template = Record {
        id: id.clone(),
        tenant: waiter.tenant.clone(),
        engine: waiter.engine.clone(),
        phase: Phase::Done,
        node: orders.cx.node.clone(),
        incarnation: orders.cx.incarnation.clone(),
        attempts: 0,
        write: 0, // drawn when it is written
        lease_until_ms: 0,
        accepted_by: orders.cx.node.clone(),
        accepted_at_ms: 0,
        forgotten: forget,
        code_hash: waiter.code_hash.clone(),
        done_at_ms: 0,
        answer: None,
    };
    cancel_recorded(orders, template, None, tenant, forget).await
}

/// Cancels work by its record: work that waits (no record yet, or `released`) is
/// fenced off with a `cancelled` result (a compare-and-set on the record as read:
/// `current`), so that the node that takes it later finds it done and only acks it;
/// work running on a node is cancelled there. `template` carries the tenant, engine,
/// program and accepting node of the work.
pub(crate) async fn cancel_recorded(
    orders: &Arc<Orders>,
    template: Record,
    mut current: Option<(Record, u64)>,
    tenant: &Option<Option<String>>,
    forget: bool,
) -> ControlReply {
    let id = template.id.clone();
    let known = ControlReply {
        known: true,
        cancelled: false,
    };
    for _ in 0..4 {
        match &current {
            Some((rec, _)) if rec.phase == Phase::Done => return known,
            Some((rec, _)) if rec.phase == Phase::Running => {
                return forward(&orders.cx, &rec.node, &id, tenant, forget).await;
            }
            _ => {}
        }
        let mut result = ExecResult::empty(
            id.clone(),
            Outcome::Cancelled,
            template.engine.clone(),
            format!("fleet:{}", orders.cx.node),
        );
        result
            .warnings
            .push("cancelled while it waited in the fleet's queue; it did not run".into());
        let mut record = template.clone();
        record.phase = Phase::Done;
        record.node = orders.cx.node.clone();
        record.incarnation = orders.cx.incarnation.clone();
        record.write = orders.cx.next_write();
        record.lease_until_ms = 0;
        record.forgotten = forget;
        record.attempts = current.as_ref().map_or(0, |(r, _)| r.attempts);
        record.done_at_ms = paddock_core::unix_ms();
        record.answer = Some(Ok(result.clone()));
        let written = match &current {
            None => orders.cx.records.create(&record).await,
            Some((_, rev)) => orders.cx.records.update(&record, *rev).await,
        };
        match written {
            Ok(Cas::Written(_)) => {
                // The audit entry first, then the accepting node's caller (it may be
                // this node), without holding up the cancel's answer. An entry the
                // stream does not take leaves the caller to the record, which its
                // node reads and audits itself before it answers.
                let answer: crate::wire::Answer = Ok(result);
                let entry = crate::audit::of_record(&record, &answer);
                let orders = orders.clone();
                tokio::spawn(async move {
                    let published =
                        crate::audit::publish(&orders.cx, &entry, crate::audit::RECORDING_PATIENCE)
                            .await;
                    if published.is_err() {
                        return;
                    }
                    if let Some(w) = orders.waiters.get(&id).map(|w| w.clone()) {
                        let _ = w.tx.try_send(Inbound::Done(Box::new(answer)));
                    } else {
                        let to = orders.cx.names.inbox(&record.accepted_by);
                        crate::worker::reply(&orders.cx, &to, &id, &answer).await;
                    }
                });
                return ControlReply {
                    known: true,
                    cancelled: true,
                };
            }
            Ok(Cas::Lost(now)) => current = now.map(|b| *b),
            Err(e) => {
                tracing::warn!(%id, error = %e, "cancelling queued work failed");
                return known;
            }
        }
    }
    known
}

/// Asks node `node` to cancel.
pub(crate) async fn forward(
    cx: &Context,
    node: &str,
    id: &ExecutionId,
    tenant: &Option<Option<String>>,
    forget: bool,
) -> ControlReply {
    let request = Control::Cancel {
        id: id.clone(),
        tenant: tenant.clone(),
        forget,
    };
    // The holder may have created the record a moment before it registers the run:
    // asked again for a short while.
    for _ in 0..10 {
        match ask(cx, cx.names.control(node), &request, Duration::from_secs(2)).await {
            Some(r) if r.known => return r,
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            None => break,
        }
    }
    ControlReply {
        known: true,
        cancelled: false,
    }
}

/// One request, its first answer (`None`: nobody answered in time).
pub(crate) async fn ask(
    cx: &Context,
    subject: String,
    request: &Control,
    wait: Duration,
) -> Option<ControlReply> {
    let body = bytes::Bytes::from(serde_json::to_vec(request).ok()?);
    let sent = tokio::time::timeout(wait, cx.client.request(subject, body)).await;
    match sent {
        Ok(Ok(msg)) => serde_json::from_slice(&msg.payload).ok(),
        _ => None,
    }
}

//! Requests between nodes: cancel and lookup, on a node's own control subject (for
//! the node that runs the work) and on the broadcast subject (for the node that
//! accepted work still waiting in the queue, which only it knows of). On the
//! broadcast subject a node that does not know the execution stays silent, so the
//! first answer is the one that knows.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use paddock_core::{ExecResult, ExecutionId, Outcome};

use crate::node::{Inbound, Inner};
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

pub(crate) async fn serve(inner: Arc<Inner>, mut sub: async_nats::Subscriber) {
    let broadcast = inner.names.broadcast();
    while let Some(msg) = sub.next().await {
        let Some(reply) = msg.reply.clone() else {
            continue;
        };
        let on_broadcast = msg.subject.as_str() == broadcast;
        let inner = inner.clone();
        tokio::spawn(async move {
            let request: Control = match serde_json::from_slice(&msg.payload) {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "a control request does not parse");
                    return;
                }
            };
            let answer = answer(&inner, request).await;
            if on_broadcast && !answer.known {
                return;
            }
            let body = bytes::Bytes::from(serde_json::to_vec(&answer).unwrap_or_default());
            let _ = inner.client.publish(reply, body).await;
        });
    }
}

async fn answer(inner: &Arc<Inner>, request: Control) -> ControlReply {
    match request {
        Control::Cancel { id, tenant, forget } => cancel_here(inner, &id, &tenant, forget).await,
        Control::Lookup { id, tenant } => ControlReply {
            known: inner
                .waiters
                .get(&id)
                .is_some_and(|w| visible(&tenant, w.tenant.as_deref())),
            cancelled: false,
        },
    }
}

/// Cancels work this node runs, or work it accepted that no node has started.
pub(crate) async fn cancel_here(
    inner: &Arc<Inner>,
    id: &ExecutionId,
    tenant: &Option<Option<String>>,
    forget: bool,
) -> ControlReply {
    if let Some(r) = inner.running.get(id).map(|r| r.clone()) {
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
    let Some(waiter) = inner.waiters.get(id).map(|w| w.clone()) else {
        return ControlReply::default();
    };
    if !visible(tenant, waiter.tenant.as_deref()) {
        return ControlReply::default();
    }
    // Queued: a `done` record (cancelled) fences the order off; the node that takes
    // it finds the record and only acks it.
    let mut result = ExecResult::empty(
        id.clone(),
        Outcome::Cancelled,
        waiter.engine.clone(),
        format!("fleet:{}", inner.node),
    );
    result
        .warnings
        .push("cancelled while it waited in the fleet's queue; it did not run".into());
    let record = Record {
        id: id.clone(),
        tenant: waiter.tenant.clone(),
        engine: result.engine.clone(),
        phase: Phase::Done,
        node: inner.node.clone(),
        incarnation: inner.incarnation.clone(),
        attempts: 0,
        lease_until_ms: 0,
        accepted_by: inner.node.clone(),
        accepted_at_ms: result.timings.queued_at_ms,
        forgotten: forget,
        answer: Some(Ok(result.clone())),
    };
    match inner.records.create(&record).await {
        Ok(Cas::Written(_)) => {
            let entry = paddock_pool::audit::AuditEntry::from_result(
                &result,
                waiter.tenant.as_deref(),
                waiter.code_hash.clone(),
            );
            crate::audit::publish(inner, &entry).await;
            let _ = waiter.tx.try_send(Inbound::Done(Box::new(Ok(result))));
            ControlReply {
                known: true,
                cancelled: true,
            }
        }
        Ok(Cas::Lost(Some(now))) if now.0.phase == Phase::Running => {
            // A node started it meanwhile: ask that one.
            forward(inner, &now.0.node, id, tenant, forget).await
        }
        Ok(Cas::Lost(_)) => ControlReply {
            known: true,
            cancelled: false,
        },
        Err(e) => {
            tracing::warn!(%id, error = %e, "cancelling queued work failed");
            ControlReply {
                known: true,
                cancelled: false,
            }
        }
    }
}

/// Asks node `node` to cancel.
pub(crate) async fn forward(
    inner: &Inner,
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
    ask(
        inner,
        inner.names.control(node),
        &request,
        Duration::from_secs(2),
    )
    .await
    .unwrap_or(ControlReply {
        known: true,
        cancelled: false,
    })
}

/// One request, its first answer (`None`: nobody answered in time).
pub(crate) async fn ask(
    inner: &Inner,
    subject: String,
    request: &Control,
    wait: Duration,
) -> Option<ControlReply> {
    let body = bytes::Bytes::from(serde_json::to_vec(request).ok()?);
    let sent = tokio::time::timeout(wait, inner.client.request(subject, body)).await;
    match sent {
        Ok(Ok(msg)) => serde_json::from_slice(&msg.payload).ok(),
        _ => None,
    }
}

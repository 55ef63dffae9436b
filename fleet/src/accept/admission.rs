//! Admission of one-shot work on the accepting node: validation, the refusals it
//! can make itself, the tenant's fleet-wide shares and rate, the waiter, and the
//! order published on its engine's work queue.

use std::sync::Arc;

use paddock_core::{unix_ms, Error, ErrorCode, ExecutionId};
use paddock_pool::Execute;
use tokio::sync::mpsc;

use super::{Federated, Fence, Parts, Pending, WaiterGuard};
use crate::names::Names;
use crate::orders::Waiter;
use crate::shares::RunHold;
use crate::wire::Order;

/// Most executions one node waits for at once; more are `POOL_EXHAUSTED`.
const MAX_WAITERS: usize = 100_000;

impl Federated {
    pub(super) async fn submit(
        &self,
        mut msg: Execute,
        key: Option<String>,
        stream: bool,
    ) -> Result<Pending, Error> {
        let inner = &self.inner;
        // What this node's scheduler would refuse the work for, with the same checks
        // its pipeline makes (the shape, the ceilings, what the tenant may ask for,
        // the engine's choice and capabilities), before anything is held or queued:
        // a stream is refused, not begun.
        let engine = inner.cx.paddock.check_admission(&msg).await?;
        if inner.orders.waiters.len() >= MAX_WAITERS {
            return Err(Error::new(
                ErrorCode::PoolExhausted,
                format!("this node waits for {MAX_WAITERS} executions already; retry on another node or later"),
            )
            .with_retry_after_ms(1_000));
        }
        let tenant = msg.order.request.tenant.clone();
        let accepted_at_ms = unix_ms();
        let start_by_ms = accepted_at_ms + inner.cx.config.queue_timeout_ms;
        let fence = Fence {
            tenant: tenant.clone(),
            engine: engine.clone(),
            code_hash: paddock_core::code_hash(&msg.order.request.program.audit_text()),
        };
        let mut held_key = None;
        if let Some(key) = key {
            match self
                .hold_key(&key, &mut msg, start_by_ms, tenant.as_deref())
                .await?
            {
                Some((first, first_start_by)) => {
                    return Ok(Pending::Attached {
                        id: first,
                        start_by_ms: first_start_by,
                        fence,
                    })
                }
                None => held_key = Some(Names::idem_key(tenant.as_deref(), &key)),
            }
        }
        let id = msg.order.request.id.clone();
        let refuse = |e: Error| refuse(inner, &id, held_key.as_deref(), e);
        // The tenant's fleet-wide shares, then its rate, counted once per
        // execution: after the refusals above (a request refused for what it asks
        // costs no admission, as on a single node), and not for a replay of an
        // idempotency key. A refusal after the hold gives it back.
        let caps = *inner.shares.caps.lock();
        let hold = if caps.counts_runs() {
            let taken = RunHold::take(
                &inner.shares,
                &caps,
                tenant.as_deref(),
                &id,
                start_by_ms,
                msg.order.request.limits.timeout_ms,
            )
            .await;
            match taken {
                Ok(h) => Some(h),
                Err(e) => return Err(refuse(e).await),
            }
        } else {
            None
        };
        let give_back = |hold: Option<RunHold>| async move {
            if let Some(h) = hold {
                h.finish().await;
            }
        };
        let rate = *inner.shares.rate_limit.lock();
        if let Some(rate) = rate {
            if let Err(e) = crate::rate::admit(&inner.shares.rate, rate, tenant.as_deref()).await {
                give_back(hold).await;
                return Err(refuse(e).await);
            }
        }
        // The caller's order goes on as it came, with the engine chosen here and the
        // `on_node_loss` that holds named in it.
        let mut exec = msg.order;
        exec.engine = Some(engine.clone());
        exec.on_node_loss = Some(exec.on_node_loss.unwrap_or(inner.cx.config.on_node_loss));
        let order = Order {
            exec,
            stream,
            accepted_by: inner.cx.node.clone(),
            reply: inner.cx.names.inbox(&inner.cx.node),
            accepted_at_ms,
            start_by_ms,
        };
        let payload = bytes::Bytes::from(serde_json::to_vec(&order).unwrap_or_default());
        if payload.len() + 1024 > inner.cx.max_payload {
            give_back(hold).await;
            return Err(refuse(Error::invalid_options(
                "request",
                format!(
                    "the request is {} bytes, more than the fleet's NATS servers take in one message ({} bytes, their max_payload); send a smaller stdin or program",
                    payload.len(),
                    inner.cx.max_payload
                ),
            ))
            .await);
        }
        let (tx, rx) = mpsc::channel(256);
        match inner.orders.waiters.entry(id.clone()) {
            dashmap::Entry::Occupied(_) => {
                // Another request with the same key queues it here right now
                // (and holds its place).
                give_back(hold).await;
                return Ok(Pending::Attached {
                    id,
                    start_by_ms,
                    fence,
                });
            }
            dashmap::Entry::Vacant(v) => {
                v.insert(Arc::new(Waiter {
                    tenant,
                    engine: engine.clone(),
                    code_hash: fence.code_hash.clone(),
                    tx,
                }));
            }
        }
        let guard = WaiterGuard {
            inner: inner.clone(),
            id: id.clone(),
        };
        if let Err(e) = self.publish(&id, &engine, payload).await {
            if e.code == ErrorCode::FleetUnavailable {
                // It may be queued all the same (the acknowledgement is what was
                // lost): the key stays, so a retry with it attaches to this one,
                // and the hold (dropped here) is given back once its record says
                // it is done, or it can no longer start.
                inner.orders.waiters.remove(&id);
                drop(hold);
                return Err(Error::new(
                    e.code,
                    format!(
                        "{}; execution {id} may still run: look it up by id, or retry with the same idempotency key",
                        e.message
                    ),
                )
                .with_retry_after_ms(e.retry_after_ms.unwrap_or(1_000)));
            }
            give_back(hold).await;
            return Err(refuse(e).await);
        }
        Ok(Pending::Own {
            _guard: guard,
            id,
            rx,
            start_by_ms,
            key: held_key,
            fence,
            hold,
        })
    }
}

/// Undoes the acceptance of work refused before it was queued: a retry with its
/// idempotency key runs it.
async fn refuse(inner: &Parts, id: &ExecutionId, held_key: Option<&str>, e: Error) -> Error {
    inner.orders.waiters.remove(id);
    if let Some(k) = held_key {
        let _ = inner.orders.idem.delete(k).await;
    }
    e
}

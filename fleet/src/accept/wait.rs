//! Waiting for the answer of accepted work: output and the result from this node's
//! inbox, the execution's record as the truth to fall back on, and the inbox's
//! delivery to the waiters.

use std::sync::Arc;

use futures_util::StreamExt;
use paddock_core::{unix_ms, Error, ErrorCode, ExecResult, ExecutionId, OutputChunk, StreamKind};

use super::fencing::{fence_off, not_started, served};
use super::idempotency::retryable;
use super::{Federated, Parts, Pending};
use crate::orders::Inbound;
use crate::wire::{Answer, Phase, ID_HEADER, KIND_HEADER};

impl Federated {
    /// Waits for the answer of pending work; output goes to `chunks`.
    pub(super) async fn wait(
        &self,
        pending: Pending,
        chunks: Option<&paddock_pool::OutputRelay>,
    ) -> Result<ExecResult, Error> {
        let inner = &self.inner;
        let (guard, id, mut rx, start_by_ms, key, fence, mut hold) = match pending {
            Pending::Own {
                _guard,
                id,
                rx,
                start_by_ms,
                key,
                fence,
                hold,
            } => (Some(_guard), id, Some(rx), start_by_ms, key, fence, hold),
            Pending::Attached {
                id,
                start_by_ms,
                fence,
            } => (None, id, None, start_by_ms, None, fence, None),
        };
        let poll = inner.cx.heartbeat() * 2;
        let mut next_poll = tokio::time::Instant::now() + poll;
        // The answer, with the audit entry to make sure of first when it was read
        // from a record (and when that record was done). An answer on the inbox
        // has its entry in the stream already: its sender published it first.
        let (answer, recorded) = loop {
            // `Some(None)`: the channel closed (only the record is left to read).
            let got = match rx.as_mut() {
                Some(rx) => {
                    tokio::select! {
                        m = rx.recv() => Some(m),
                        _ = tokio::time::sleep_until(next_poll) => None,
                    }
                }
                None => {
                    tokio::time::sleep_until(next_poll).await;
                    None
                }
            };
            match got {
                Some(Some(Inbound::Chunk(c))) => {
                    if let Some(relay) = chunks {
                        let _ = relay.push(c).await;
                    }
                    continue;
                }
                Some(Some(Inbound::Done(a))) => break (*a, None),
                Some(None) => {
                    rx = None;
                    continue;
                }
                None => {}
            }
            next_poll = tokio::time::Instant::now() + poll;
            if inner.cx.stopping() {
                if let Some(h) = hold.take() {
                    h.keep();
                }
                break (
                    Err(Error::new(
                        ErrorCode::EngineDisposed,
                        format!("this node left the fleet while it waited for execution {id}; look it up by id on another node"),
                    )),
                    None,
                );
            }
            // The inbox may have missed it: the record is the truth. Work that no
            // node will answer for any more is fenced off here, so that no wait
            // lasts for ever: never started two ack waits after its start-by
            // (`timed_out`), or held by a node whose lease ended two ack waits ago
            // with no node taking it over (`NODE_LOST`).
            let now = unix_ms();
            let grace = 2 * inner.cx.config.ack_wait_ms;
            // While a live node runs the engine, it will take the work (redelivery
            // never gives up) and answer for it itself.
            let orphan = !served(inner, &fence.engine);
            let fenced = match inner.cx.records.get(&id).await {
                Ok(Some((rec, _))) if rec.phase == Phase::Done => match &rec.answer {
                    Some(a) => {
                        let entry = crate::audit::of_record(&rec, a);
                        break (a.clone(), Some((entry, rec.done_at_ms)));
                    }
                    None => None,
                },
                Ok(Some((rec, rev)))
                    if orphan && rec.phase == Phase::Released && now > start_by_ms + grace =>
                {
                    fence_off(
                        inner,
                        &id,
                        &fence,
                        Some(rev),
                        not_started(inner, &id, &fence),
                    )
                    .await
                }
                Ok(Some((rec, rev)))
                    if orphan
                        && rec.phase == Phase::Running
                        && rec.lease_until_ms + grace < now =>
                {
                    let lost = Error::new(
                        ErrorCode::NodeLost,
                        format!(
                            "node {} was lost while it ran this execution (run {}), and no node took it over; what the program did there is unknown",
                            rec.node, rec.attempts
                        ),
                    );
                    fence_off(inner, &id, &fence, Some(rev), Err(lost)).await
                }
                Ok(Some(_)) => None,
                Ok(None) if orphan && now > start_by_ms + grace => {
                    fence_off(inner, &id, &fence, None, not_started(inner, &id, &fence)).await
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!(%id, error = %e, "reading the record while waiting");
                    None
                }
            };
            if let Some((a, entry)) = fenced {
                break (a, Some(entry));
            }
        };
        drop(guard);
        if let Some(h) = hold {
            h.finish().await;
        }
        if let (Some(k), Err(e)) = (&key, &answer) {
            if retryable(e) {
                // A refusal worth retrying is not replayed for the key.
                let _ = inner.orders.idem.delete(k).await;
            }
        }
        // No answer without its audit entry in the stream. (Should the entry not
        // get in, the key stays: the execution ran, and a retry with it answers
        // its result once the entry is in.)
        if let Some((entry, done_at_ms)) = recorded {
            crate::audit::make_durable(&inner.cx, entry, done_at_ms).await?;
        }
        answer
    }
}

/// Delivers what arrives on this node's inbox to the executions waiting for it.
pub(crate) async fn inbox(inner: Arc<Parts>, mut sub: async_nats::Subscriber) {
    while let Some(msg) = sub.next().await {
        let Some(headers) = msg.headers.as_ref() else {
            continue;
        };
        let Some(id) = headers
            .get(ID_HEADER)
            .and_then(|v| ExecutionId::parse(v.as_str()).ok())
        else {
            continue;
        };
        let Some(waiter) = inner.orders.waiters.get(&id).map(|w| w.clone()) else {
            continue;
        };
        let kind = headers.get(KIND_HEADER).map(|v| v.as_str().to_string());
        let item = match kind.as_deref() {
            Some("result") => match serde_json::from_slice::<Answer>(&msg.payload) {
                Ok(a) => Inbound::Done(Box::new(a)),
                Err(e) => {
                    tracing::warn!(%id, error = %e, "a result does not parse; the record is read instead");
                    continue;
                }
            },
            Some("stdout") => Inbound::Chunk(OutputChunk {
                stream: StreamKind::Stdout,
                data: msg.payload.to_vec(),
            }),
            Some("stderr") => Inbound::Chunk(OutputChunk {
                stream: StreamKind::Stderr,
                data: msg.payload.to_vec(),
            }),
            _ => continue,
        };
        // A waiter that reads slowly loses live chunks (the result has them all);
        // a lost result is read from the record.
        let _ = waiter.tx.try_send(item);
    }
}

//! Taking work: one puller per engine asks its work queue for as many orders as
//! the node has free slots, and runs each under a lease on the execution's record.
//!
//! What a delivery does is decided by the record, never by the delivery count or
//! an ack (a late ack from an earlier delivery acks the current one):
//!
//! | record | the delivery |
//! |---|---|
//! | none, start-by passed | records `timed_out` without running it |
//! | none | creates it (lease: this node, attempt 1) and runs it |
//! | `done` | acks (the result is recorded; audit and reply are sent again, deduplicated) |
//! | `released` | takes the lease and runs it |
//! | `running`, lease valid | is put back until the lease expires |
//! | `running`, lease expired | the holder is lost: runs it again (`retry`, attempts left) or records `NODE_LOST` |
//!
//! A worker uses the [`Orders`] book (the work running here), the sessions (their
//! instances take slots too) and the audit; `control` uses it to send a result on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, AckKind};
use async_trait::async_trait;
use futures_util::StreamExt;
use paddock_core::{
    unix_ms, EngineName, Error, ErrorCode, ExecResult, ExecutionId, OnNodeLoss, Outcome,
    OutputChunk, OutputSink, StreamKind,
};
use paddock_pool::{Caller, Execute};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::context::Context;
use crate::orders::{Orders, Running};
use crate::sessions::SessionBook;
use crate::store::Cas;
use crate::wire::{Answer, Order, Phase, Record, ID_HEADER, KIND_HEADER};

/// Most orders asked for in one pull.
const MAX_BATCH: usize = 64;

pub(crate) struct Worker {
    pub(crate) orders: Arc<Orders>,
    /// The sandboxes open here, which hold slots too.
    pub(crate) sessions: Arc<SessionBook>,
    pub(crate) engine: EngineName,
    pub(crate) free: Arc<Semaphore>,
    pub(crate) busy: Arc<AtomicUsize>,
    pub(crate) slots: usize,
}

impl Worker {
    pub(crate) async fn run(self, consumer: PullConsumer) {
        let mut stop = self.orders.cx.stop.subscribe();
        tracing::debug!(engine = %self.engine, slots = self.slots, "taking work");
        loop {
            if self.orders.cx.stopping() {
                return;
            }
            let first = tokio::select! {
                p = self.free.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = stop.changed() => return,
            };
            // The fleet's sandboxes open here hold instances of the engine too.
            // (Counted from the permits, which a finished run gives back before it
            // is counted out of `busy`: counting `busy` made a saturated node
            // find no room in that moment and wait 100 ms.)
            let room = (self.free.available_permits() + 1)
                .saturating_sub(crate::sessions::count(&self.sessions, &self.engine));
            if room == 0 {
                drop(first);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stop.changed() => return,
                }
                continue;
            }
            let mut permits = vec![first];
            while permits.len() < MAX_BATCH.min(room) {
                match self.free.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let batch = consumer
                .batch()
                .max_messages(permits.len())
                .expires(Duration::from_secs(1))
                .messages()
                .await;
            let mut batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!(engine = %self.engine, error = %e, "pulling work failed; retrying");
                    drop(permits);
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                        _ = stop.changed() => return,
                    }
                    continue;
                }
            };
            loop {
                let next = tokio::select! {
                    m = batch.next() => m,
                    _ = stop.changed() => None,
                };
                let Some(next) = next else { break };
                match next {
                    Ok(msg) => {
                        let Some(permit) = permits.pop() else {
                            // More than asked for: cannot happen; put it back.
                            let _ = msg.ack_with(AckKind::Nak(None)).await;
                            continue;
                        };
                        let orders = self.orders.clone();
                        let busy = self.busy.clone();
                        orders.taken.fetch_add(1, Ordering::AcqRel);
                        busy.fetch_add(1, Ordering::AcqRel);
                        tokio::spawn(async move {
                            take(&orders, msg, permit).await;
                            busy.fetch_sub(1, Ordering::AcqRel);
                            orders.taken.fetch_sub(1, Ordering::AcqRel);
                        });
                    }
                    Err(e) => {
                        // A leader election, say: not pulled again at once.
                        tracing::debug!(engine = %self.engine, error = %e, "a pull ended early");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                            _ = stop.changed() => {}
                        }
                        break;
                    }
                }
            }
        }
    }
}

/// The record of `order` running here, on `engine` (the one its accepting node
/// chose).
fn running_record(
    orders: &Orders,
    order: &Order,
    engine: &EngineName,
    attempts: u32,
    write: u64,
) -> Record {
    let request = &order.exec.request;
    Record {
        id: request.id.clone(),
        tenant: request.tenant.clone(),
        engine: engine.clone(),
        phase: Phase::Running,
        node: orders.cx.node.clone(),
        incarnation: orders.cx.incarnation.clone(),
        attempts,
        write,
        lease_until_ms: unix_ms() + orders.cx.config.ack_wait_ms,
        accepted_by: order.accepted_by.clone(),
        accepted_at_ms: order.accepted_at_ms,
        forgotten: false,
        code_hash: paddock_core::code_hash(&request.program.audit_text()),
        done_at_ms: 0,
        answer: None,
    }
}

/// One delivery of one order.
async fn take(orders: &Arc<Orders>, msg: jetstream::Message, permit: OwnedSemaphorePermit) {
    let order: Order = match serde_json::from_slice(&msg.payload) {
        Ok(o) => o,
        Err(e) => {
            // Nobody can be answered: the order names no reply. Dropped for good.
            tracing::error!(error = %e, "a work order does not parse; dropped");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    // The accepting node names the engine it chose and the `on_node_loss` that
    // holds: an order without them is not one it sent.
    let (Some(engine), Some(on_node_loss)) = (order.exec.engine.clone(), order.exec.on_node_loss)
    else {
        tracing::error!(id = %order.exec.request.id, "a work order names no engine or no on_node_loss; dropped");
        let _ = msg.ack_with(AckKind::Term).await;
        return;
    };
    let id = order.exec.request.id.clone();
    // This delivery's own mark on what it writes: another delivery of the same
    // order on this node writes a record that is not this one's.
    let write = orders.cx.next_write();
    // Most deliveries are the first: the record is created straight away (a create
    // that finds one reads it, and the loop goes on from there).
    let mut current: Option<(Record, u64)> = None;
    // At most a few turns: each lost compare-and-set reads what won.
    for _ in 0..8 {
        let now = unix_ms();
        let step = match &current {
            None if now > order.start_by_ms => {
                let r = done_record(
                    orders,
                    &order,
                    &engine,
                    0,
                    write,
                    not_started(orders, &order, &engine),
                );
                orders.cx.records.create(&r).await.map(|c| (c, r))
            }
            None => {
                let r = running_record(orders, &order, &engine, 1, write);
                orders.cx.records.create(&r).await.map(|c| (c, r))
            }
            Some((rec, rev)) => match rec.phase {
                Phase::Done => {
                    // Recorded by another delivery (or fenced off by the accepting
                    // node): its reply and audit entry may have been lost with the
                    // node that recorded it, so they are sent again — the entry
                    // only while the stream's duplicate window still covers the
                    // first one, since after it a second would be kept.
                    let recent = crate::audit::recent(&orders.cx, rec.done_at_ms);
                    if finish_done(orders, &order.reply, rec, recent).await {
                        let _ = msg.ack().await;
                    } else {
                        let _ = msg
                            .ack_with(AckKind::Nak(Some(orders.cx.heartbeat())))
                            .await;
                    }
                    return;
                }
                Phase::Released if now > order.start_by_ms => {
                    let r = done_record(
                        orders,
                        &order,
                        &engine,
                        rec.attempts,
                        write,
                        not_started(orders, &order, &engine),
                    );
                    orders.cx.records.update(&r, *rev).await.map(|c| (c, r))
                }
                Phase::Released => {
                    let r = running_record(orders, &order, &engine, rec.attempts.max(1), write);
                    orders.cx.records.update(&r, *rev).await.map(|c| (c, r))
                }
                Phase::Running => {
                    if rec.node == orders.cx.node
                        && rec.incarnation == orders.cx.incarnation
                        && orders.running.contains_key(&id)
                    {
                        // Ours, still running here: this delivery is a duplicate.
                        return;
                    }
                    if rec.lease_until_ms > now {
                        let wait = rec.lease_until_ms - now + 50;
                        let _ = msg
                            .ack_with(AckKind::Nak(Some(Duration::from_millis(wait))))
                            .await;
                        return;
                    }
                    // The holder is lost.
                    let retry = on_node_loss == OnNodeLoss::Retry
                        && rec.attempts < orders.cx.config.max_attempts;
                    tracing::info!(%id, holder = %rec.node, attempts = rec.attempts, retry, "work of a lost node");
                    let r = if retry {
                        running_record(orders, &order, &engine, rec.attempts + 1, write)
                    } else {
                        done_record(
                            orders,
                            &order,
                            &engine,
                            rec.attempts,
                            write,
                            Err(node_lost(&rec.node, rec.attempts)),
                        )
                    };
                    orders.cx.records.update(&r, *rev).await.map(|c| (c, r))
                }
            },
        };
        match step {
            Ok((Cas::Written(rev), r)) => {
                if r.phase == Phase::Done {
                    if finish_done(orders, &order.reply, &r, true).await {
                        let _ = msg.ack().await;
                    } else {
                        let _ = msg
                            .ack_with(AckKind::Nak(Some(orders.cx.heartbeat())))
                            .await;
                    }
                } else {
                    run(orders, msg, order, r, rev, permit).await;
                }
                return;
            }
            Ok((Cas::Lost(now), _)) => current = now.map(|b| *b),
            Err(e) => {
                tracing::warn!(%id, error = %e, "the record could not be written; the order goes back");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(orders.cx.heartbeat())))
                    .await;
                return;
            }
        }
    }
    let _ = msg
        .ack_with(AckKind::Nak(Some(orders.cx.heartbeat())))
        .await;
}

fn node_lost(node: &str, attempts: u32) -> Error {
    Error::new(
        ErrorCode::NodeLost,
        format!(
            "node {node} was lost while it ran this execution (run {attempts}); what the program did there is unknown"
        ),
    )
}

fn not_started(orders: &Orders, order: &Order, engine: &EngineName) -> Answer {
    let mut r = ExecResult::empty(
        order.exec.request.id.clone(),
        Outcome::TimedOut,
        engine.clone(),
        format!("fleet:{}", orders.cx.node),
    );
    r.timings.queued_at_ms = order.accepted_at_ms;
    r.warnings.push(format!(
        "no node started it within {} ms of its acceptance (fleet.queue_timeout_ms); it did not run",
        order.start_by_ms.saturating_sub(order.accepted_at_ms)
    ));
    Ok(r)
}

fn done_record(
    orders: &Orders,
    order: &Order,
    engine: &EngineName,
    attempts: u32,
    write: u64,
    answer: Answer,
) -> Record {
    let mut r = running_record(orders, order, engine, attempts, write);
    r.phase = Phase::Done;
    r.lease_until_ms = 0;
    r.done_at_ms = unix_ms();
    r.answer = Some(fit(answer, orders.cx.max_payload));
    r
}

/// The answer, cut to fit in one message of the servers' `max_payload`.
fn fit(answer: Answer, max_payload: usize) -> Answer {
    let Ok(mut r) = answer else { return answer };
    let budget = max_payload.saturating_sub(16 << 10);
    let size = r.stdout.len() + r.stderr.len();
    if size <= budget {
        return Ok(r);
    }
    let cut = |s: &mut String, keep: usize| {
        if s.len() > keep {
            let mut at = keep;
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            s.truncate(at);
            true
        } else {
            false
        }
    };
    let half = budget / 2;
    let keep_out = half.max(budget.saturating_sub(r.stderr.len()));
    if cut(&mut r.stdout, keep_out) {
        r.stdout_truncated = true;
    }
    let keep_err = budget.saturating_sub(r.stdout.len());
    if cut(&mut r.stderr, keep_err) {
        r.stderr_truncated = true;
    }
    r.warnings.push(format!(
        "the output was cut to {budget} bytes to fit the fleet's result store (the servers' max_payload)"
    ));
    Ok(r)
}

/// A recorded result: (with `audit`) its audit entry, deduplicated by id, then its
/// answer to the accepting node (at `reply_to`). Whether the entry is in the stream
/// (or was not to be sent): the order is acked only then, so that a loss in between
/// sends both again.
///
/// The entry goes first, and the answer only once the stream has acknowledged it:
/// an answer that reaches a caller has its entry in the stream, even when this node
/// dies right after sending it. An entry the stream does not take leaves the answer
/// unsent: the accepting node reads the record and publishes the entry itself
/// before it answers (or answers `FLEET_UNAVAILABLE`), and the order's next
/// delivery tries again. Both make the entry from the record, so it is the same
/// entry whichever node publishes it.
async fn finish_done(orders: &Arc<Orders>, reply_to: &str, rec: &Record, audit: bool) -> bool {
    let Some(answer) = &rec.answer else {
        return true;
    };
    if audit {
        let entry = crate::audit::of_record(rec, answer);
        let published =
            crate::audit::publish(&orders.cx, &entry, crate::audit::RECORDING_PATIENCE).await;
        if published.is_err() {
            return false;
        }
    }
    reply(&orders.cx, reply_to, &rec.id, answer).await;
    true
}

pub(crate) async fn reply(cx: &Context, to: &str, id: &ExecutionId, answer: &Answer) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(KIND_HEADER, "result");
    headers.insert(ID_HEADER, id.to_string().as_str());
    let body = bytes::Bytes::from(serde_json::to_vec(answer).unwrap_or_default());
    if let Err(e) = cx
        .client
        .publish_with_headers(to.to_string(), headers, body)
        .await
    {
        tracing::debug!(%id, error = %e, "sending a result failed; it is in the record");
    }
}

/// Output to the accepting node, as it is produced.
#[derive(Debug)]
struct Relay {
    client: async_nats::Client,
    to: String,
    id: String,
    max: usize,
}

#[async_trait]
impl OutputSink for Relay {
    async fn chunk(&self, chunk: OutputChunk) -> Result<(), Error> {
        let kind = match chunk.stream {
            StreamKind::Stdout => "stdout",
            StreamKind::Stderr => "stderr",
        };
        for piece in chunk.data.chunks(self.max.max(1024)) {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(KIND_HEADER, kind);
            headers.insert(ID_HEADER, self.id.as_str());
            // Live output is best effort; the result carries all of it (up to the cap).
            let _ = self
                .client
                .publish_with_headers(
                    self.to.clone(),
                    headers,
                    bytes::Bytes::copy_from_slice(piece),
                )
                .await;
        }
        Ok(())
    }
}

/// Runs an order under its lease, renewing it each heartbeat; records the one
/// result unless the lease was lost meanwhile.
async fn run(
    orders: &Arc<Orders>,
    msg: jetstream::Message,
    order: Order,
    mut rec: Record,
    mut rev: u64,
    permit: OwnedSemaphorePermit,
) {
    let Order {
        exec,
        stream,
        accepted_by,
        reply: reply_to,
        accepted_at_ms,
        ..
    } = order;
    let id = exec.request.id.clone();
    let running = Arc::new(Running {
        tenant: exec.request.tenant.clone(),
        cancel: Default::default(),
        forget: Default::default(),
        notify: tokio::sync::Notify::new(),
    });
    orders.running.insert(id.clone(), running.clone());
    // The caller's order runs as it came: the engine the accepting node chose is in it.
    let mut execute = Execute::from(exec);
    // Work accepted on this node streams through its streamer as it is: only other
    // nodes need the output relayed.
    if stream && accepted_by != orders.cx.node {
        execute.sink = Some(Arc::new(Relay {
            client: orders.cx.client.clone(),
            to: reply_to.clone(),
            id: id.to_string(),
            max: orders.cx.max_payload.saturating_sub(4096),
        }));
    }
    let paddock = orders.cx.paddock.clone();
    let work = paddock.execute_with(execute);
    tokio::pin!(work);
    let mut tick = tokio::time::interval(orders.cx.heartbeat());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    // The lease ends `ack_wait` after the last renewal that was written; the run
    // stops one heartbeat before that unless a renewal got through, so that it is
    // over by the time another node may take the work.
    let heartbeat = orders.cx.config.heartbeat_ms;
    let lease_ms = orders.cx.config.ack_wait_ms;
    let mut renewed_at = unix_ms();
    let mut lost = false;
    let mut cancelled = false;
    let mut retry_cancel = tokio::time::interval(Duration::from_millis(10));
    let answer = loop {
        let want_cancel = running.cancel.load(Ordering::Acquire) && !cancelled;
        let stop_at = renewed_at + lease_ms - heartbeat;
        let until_stop = Duration::from_millis(stop_at.saturating_sub(unix_ms()));
        tokio::select! {
            a = &mut work => break a,
            _ = running.notify.notified() => {}
            _ = retry_cancel.tick(), if want_cancel => {}
            _ = tokio::time::sleep(until_stop), if !lost => {
                tracing::warn!(%id, "the lease could not be renewed in time; stopping the execution here");
                lost = true;
                running.cancel.store(true, Ordering::Release);
            }
            _ = tick.tick(), if !lost => {
                let _ = msg.ack_with(AckKind::Progress).await;
                let mut next = rec.clone();
                next.lease_until_ms = unix_ms() + lease_ms;
                // At most half a heartbeat: the loop must come back to its stop
                // time. A renewal whose answer is cut off may have been written;
                // the next one finds that out (the record is still ours).
                let limit = Duration::from_millis((heartbeat / 2).max(10));
                let renewed = match tokio::time::timeout(limit, orders.cx.records.update(&next, rev)).await {
                    Ok(r) => r,
                    Err(_) => Err(crate::store::unavailable("renewing the lease", "timed out")),
                };
                match renewed {
                    Ok(Cas::Written(r)) => {
                        rec = next;
                        rev = r;
                        renewed_at = unix_ms();
                    }
                    Ok(Cas::Lost(_)) => {
                        tracing::warn!(%id, "the lease was taken over; stopping the execution here");
                        lost = true;
                        running.cancel.store(true, Ordering::Release);
                    }
                    Err(e) => tracing::debug!(%id, error = %e, "renewing the lease failed"),
                }
            }
        }
        if running.cancel.load(Ordering::Acquire) && !cancelled {
            cancelled = paddock.cancel(&Caller::Embedder, &id);
        }
    };
    orders.running.remove(&id);
    drop(permit);
    if lost {
        // Another node holds it now (or will): its answer is the one.
        return;
    }
    let mut answer = answer;
    if let Ok(r) = &mut answer {
        r.timings.queued_at_ms = accepted_at_ms;
    }
    let given_back = matches!(&answer, Err(e) if matches!(e.code, ErrorCode::PoolExhausted | ErrorCode::EngineDisposed))
        && !running.cancel.load(Ordering::Acquire);
    if given_back {
        // It did not run here: another node (or this one, later) takes it.
        let mut back = rec.clone();
        back.phase = Phase::Released;
        back.lease_until_ms = 0;
        if let Ok(Cas::Written(_)) = orders.cx.records.update(&back, rev).await {
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_millis(100))))
                .await;
        }
        return;
    }
    let mut done = rec.clone();
    done.phase = Phase::Done;
    done.lease_until_ms = 0;
    done.done_at_ms = unix_ms();
    done.forgotten = running.forget.load(Ordering::Acquire);
    done.answer = Some(fit(answer, orders.cx.max_payload));
    loop {
        match orders.cx.records.update(&done, rev).await {
            Ok(Cas::Written(_)) => {
                if finish_done(orders, &reply_to, &done, true).await {
                    let _ = msg.ack().await;
                } else {
                    let _ = msg
                        .ack_with(AckKind::Nak(Some(orders.cx.heartbeat())))
                        .await;
                }
                return;
            }
            Ok(Cas::Lost(_)) => {
                tracing::warn!(%id, "the lease was taken over before the result was recorded; this run's result is dropped");
                return;
            }
            Err(e) => {
                if orders.cx.stopping() {
                    return;
                }
                tracing::warn!(%id, error = %e, "recording the result failed; retrying");
                tokio::time::sleep(orders.cx.heartbeat()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitting_cuts_output_on_char_boundaries() {
        let mut r = ExecResult::empty(
            ExecutionId::new(),
            Outcome::Completed {
                exit_code: 0,
                signal: None,
            },
            EngineName::new("subprocess").unwrap(),
            "i",
        );
        r.stdout = "é".repeat(40_000);
        r.stderr = "x".repeat(10_000);
        let cut = fit(Ok(r.clone()), 64 << 10).unwrap();
        assert!(cut.stdout.len() + cut.stderr.len() <= 48 << 10);
        assert!(cut.stdout_truncated);
        assert!(cut.warnings.iter().any(|w| w.contains("cut")));
        // Small output is left alone.
        r.stdout = "ok".into();
        let same = fit(Ok(r.clone()), 64 << 10).unwrap();
        assert_eq!(same, r);
    }
}

//! Accepting work: the [`Federation`] a fleet node's facade hands its one-shot
//! executions to. The accepting node publishes the order on its engine's work
//! queue (message id: the execution id) and waits on its inbox for the output and
//! the result; the record in the `P_exec` bucket is the truth it falls back on.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::kv;
use async_nats::jetstream::message::PublishMessage;
use async_trait::async_trait;
use futures_util::StreamExt;
use paddock_core::{
    unix_ms, EngineName, Error, ErrorCode, ExecResult, ExecutionId, Outcome, OutputChunk,
    SandboxSpec, StreamKind,
};
use paddock_pool::audit::{AuditEntry, AuditQuery};
use paddock_pool::federation::{CancelOutcome, Federation, Lookup, NodeView, SessionPlace};
use paddock_pool::{Caller, Execute, ExecutionStream};
use tokio::sync::mpsc;

use crate::control::{ask, cancel_here};
use crate::names::Names;
use crate::node::{Inbound, Inner, Waiter};
use crate::shares::{Hold, Kind, RunHold};
use crate::store::{unavailable, Cas};
use crate::wire::{Answer, Control, Order, Phase, Record, ID_HEADER, KIND_HEADER};

/// The facade's federation: this node's view of the fleet.
#[derive(Debug)]
pub(crate) struct Federated {
    pub(crate) inner: Arc<Inner>,
}

/// Most executions one node waits for at once; more are `POOL_EXHAUSTED`.
const MAX_WAITERS: usize = 100_000;

/// What an idempotency key holds.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeyEntry {
    id: ExecutionId,
    start_by_ms: u64,
}

/// This node's waiter for an execution, removed when the wait ends however it ends
/// (a caller that drops its future included), so that the map cannot fill up with
/// waiters nobody reads.
struct WaiterGuard {
    inner: Arc<Inner>,
    id: ExecutionId,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        self.inner.waiters.remove(&self.id);
    }
}

/// What a waiting node needs to fence work off itself when no node will answer
/// for it: the tenant, engine and program of its audit entry.
#[derive(Debug, Clone)]
struct Fence {
    tenant: Option<String>,
    engine: paddock_core::EngineName,
    code_hash: String,
}

/// Work accepted here (or attached to by key), not yet answered.
enum Pending {
    /// Ours: waits on the inbox.
    Own {
        _guard: WaiterGuard,
        id: ExecutionId,
        rx: mpsc::Receiver<Inbound>,
        start_by_ms: u64,
        /// The idempotency key it holds, if any.
        key: Option<String>,
        fence: Fence,
        /// Its place in the tenant's fleet-wide shares, if they are counted.
        hold: Option<RunHold>,
    },
    /// The first execution of an idempotency key.
    Attached {
        id: ExecutionId,
        start_by_ms: u64,
        fence: Fence,
    },
}

fn tenant_of(caller: &Caller) -> Option<Option<String>> {
    caller.confined_to().map(|t| t.map(str::to_owned))
}

impl Federated {
    async fn submit(
        &self,
        mut msg: Execute,
        key: Option<String>,
        stream: bool,
    ) -> Result<Pending, Error> {
        let inner = &self.inner;
        msg.request.validate()?;
        if inner.waiters.len() >= MAX_WAITERS {
            return Err(Error::new(
                ErrorCode::PoolExhausted,
                format!("this node waits for {MAX_WAITERS} executions already; retry on another node or later"),
            )
            .with_retry_after_ms(1_000));
        }
        let tenant = msg.request.tenant.clone();
        let accepted_at_ms = unix_ms();
        let start_by_ms = accepted_at_ms + inner.config.queue_timeout_ms;
        let engine = inner
            .paddock
            .choose_engine(
                msg.engine.clone(),
                msg.level,
                Some(msg.request.program.kind()),
                tenant.clone(),
            )
            .await?;
        let fence = Fence {
            tenant: tenant.clone(),
            engine: engine.clone(),
            code_hash: paddock_core::code_hash(&msg.request.program.audit_text()),
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
        let id = msg.request.id.clone();
        let refuse = |e: Error| refuse(inner, &id, held_key.as_deref(), e);
        // Refusals the accepting node can make itself are made here, before the
        // work is queued (so that a stream is refused, not begun).
        let allowed = inner.paddock.access_rules().for_tenant(tenant.as_deref());
        if let Err(e) = allowed.check_network(&msg.network, tenant.as_deref()) {
            return Err(refuse(e).await);
        }
        if let Some((_, caps)) = inner
            .paddock
            .capabilities()
            .iter()
            .find(|(n, _)| *n == engine)
        {
            let checked = allowed
                .check_level(caps.max_level, engine.as_str(), tenant.as_deref())
                .and_then(|()| caps.check_limits(&engine, &msg.request.limits, "limits"));
            if let Err(e) = checked {
                return Err(refuse(e).await);
            }
        }
        // The tenant's fleet-wide shares, then its rate, counted once per
        // execution: after the refusals above (a request refused for what it asks
        // costs no admission, as on a single node), and not for a replay of an
        // idempotency key. A refusal after the hold gives it back.
        let caps = *inner.share_caps.lock();
        let hold = if caps.counts_runs() {
            let taken = RunHold::take(
                inner,
                &caps,
                tenant.as_deref(),
                &id,
                start_by_ms,
                msg.request.limits.timeout_ms,
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
        let rate = *inner.rate_limit.lock();
        if let Some(rate) = rate {
            if let Err(e) = crate::rate::admit(inner, rate, tenant.as_deref()).await {
                give_back(hold).await;
                return Err(refuse(e).await);
            }
        }
        let order = Order {
            request: msg.request,
            engine: engine.clone(),
            level: msg.level,
            network: msg.network,
            traceparent: msg.traceparent,
            stream,
            accepted_by: inner.node.clone(),
            reply: inner.names.inbox(&inner.node),
            accepted_at_ms,
            start_by_ms,
            on_node_loss: msg.on_node_loss.unwrap_or(inner.config.on_node_loss),
        };
        let payload = bytes::Bytes::from(serde_json::to_vec(&order).unwrap_or_default());
        if payload.len() + 1024 > inner.max_payload {
            give_back(hold).await;
            return Err(refuse(Error::invalid_options(
                "request",
                format!(
                    "the request is {} bytes, more than the fleet's NATS servers take in one message ({} bytes, their max_payload); send a smaller stdin or program",
                    payload.len(),
                    inner.max_payload
                ),
            ))
            .await);
        }
        let (tx, rx) = mpsc::channel(256);
        match inner.waiters.entry(id.clone()) {
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
        if let Err(e) = self.publish(&order, payload).await {
            if e.code == ErrorCode::FleetUnavailable {
                // It may be queued all the same (the acknowledgement is what was
                // lost): the key stays, so a retry with it attaches to this one,
                // and the hold (dropped here) is given back once its record says
                // it is done, or it can no longer start.
                inner.waiters.remove(&id);
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

    /// Holds idempotency key `key` for this request: `None` when it now holds it
    /// (new, or taken over for a first execution that was never queued: then
    /// `msg` takes the first id, and a fresh start-by), or the first execution to
    /// attach to.
    async fn hold_key(
        &self,
        key: &str,
        msg: &mut Execute,
        start_by_ms: u64,
        tenant: Option<&str>,
    ) -> Result<Option<(ExecutionId, u64)>, Error> {
        let inner = &self.inner;
        let k = Names::idem_key(tenant, key);
        for _ in 0..4 {
            let entry = KeyEntry {
                id: msg.request.id.clone(),
                start_by_ms,
            };
            let value = bytes::Bytes::from(serde_json::to_vec(&entry).unwrap_or_default());
            match inner.idem.create(&k, value).await {
                Ok(_) => return Ok(None),
                Err(e) if crate::store::already_exists(&e) => {}
                Err(e) => return Err(unavailable("holding an idempotency key", e)),
            }
            let held = inner
                .idem
                .entry(k.clone())
                .await
                .map_err(|e| unavailable("reading an idempotency key", e))?;
            let Some(held) = held.filter(|e| matches!(e.operation, kv::Operation::Put)) else {
                // Released meanwhile: take it.
                continue;
            };
            let first: KeyEntry = serde_json::from_slice(&held.value).map_err(|_| {
                unavailable(
                    "reading an idempotency key",
                    "the key is held but unreadable",
                )
            })?;
            let waited_for = inner.waiters.contains_key(&first.id)
                || inner.records.get(&first.id).await?.is_some()
                || ask(
                    inner,
                    inner.names.broadcast(),
                    &Control::Lookup {
                        id: first.id.clone(),
                        tenant: None,
                    },
                    Duration::from_millis(250),
                )
                .await
                .is_some_and(|r| r.known);
            if waited_for {
                return Ok(Some((first.id, first.start_by_ms)));
            }
            // Not started, and no node waits for it: the node that took the key
            // died before it queued the work. Take the key over (a compare-and-set,
            // so that of two retries one does) and queue the work again under the
            // first id: the stream keeps one order per id, so if the first was
            // queued after all, this adds nothing.
            let taken = KeyEntry {
                id: first.id.clone(),
                start_by_ms,
            };
            let value = bytes::Bytes::from(serde_json::to_vec(&taken).unwrap_or_default());
            if inner.idem.update(&k, value, held.revision).await.is_ok() {
                msg.request.id = first.id;
                return Ok(None);
            }
        }
        Err(unavailable(
            "holding an idempotency key",
            "other requests with the same key keep changing it",
        ))
    }

    /// Publishes an order, again with the same message id while the cluster fails
    /// over (the stream keeps one).
    async fn publish(&self, order: &Order, payload: bytes::Bytes) -> Result<(), Error> {
        let inner = &self.inner;
        let subject = inner.names.work_subject(&order.engine);
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(inner.config.queue_timeout_ms.min(30_000));
        let mut pause = Duration::from_millis(50);
        loop {
            let sent = inner
                .js
                .send_publish(
                    subject.clone(),
                    PublishMessage::build()
                        .payload(payload.clone())
                        .message_id(order.request.id.to_string()),
                )
                .await;
            let result = match sent {
                Ok(ack) => ack.await.map(|_| ()),
                Err(e) => Err(e),
            };
            let e = match result {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let text = e.to_string();
            // "No stream" is also what a stream electing its leader answers: only a
            // stream that is not there at all means that no node runs the engine.
            if e.kind() == PublishErrorKind::StreamNotFound
                && !self.stream_exists(&order.engine).await
            {
                return Err(Error::new(
                    ErrorCode::CapabilityNotSupported,
                    format!(
                        "no node of the fleet runs engine `{}`; see GET /v1/fleet",
                        order.engine
                    ),
                ));
            }
            if text.contains("maximum messages") || text.contains("maximum bytes") {
                return Err(Error::new(
                    ErrorCode::PoolExhausted,
                    format!(
                        "engine `{}`'s work queue is full (fleet.max_queued); retry later",
                        order.engine
                    ),
                )
                .with_retry_after_ms(1_000));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(unavailable("queueing the execution", e));
            }
            tracing::debug!(id = %order.request.id, error = %e, "queueing; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Whether engine `engine`'s work stream exists (or may: a cluster that does
    /// not answer is given the benefit of the doubt, and retried).
    async fn stream_exists(&self, engine: &paddock_core::EngineName) -> bool {
        let inner = &self.inner;
        if served(inner, engine) {
            return true;
        }
        match inner.js.get_stream(inner.names.work_stream(engine)).await {
            Ok(_) => true,
            Err(e) => !e.to_string().contains("not found"),
        }
    }

    /// Waits for the answer of pending work; output goes to `chunks`.
    async fn wait(
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
        let poll = inner.heartbeat() * 2;
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
            if inner.stopping() {
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
            let grace = 2 * inner.config.ack_wait_ms;
            // While a live node runs the engine, it will take the work (redelivery
            // never gives up) and answer for it itself.
            let orphan = !served(inner, &fence.engine);
            let fenced = match inner.records.get(&id).await {
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
                let _ = inner.idem.delete(k).await;
            }
        }
        // No answer without its audit entry in the stream. (Should the entry not
        // get in, the key stays: the execution ran, and a retry with it answers
        // its result once the entry is in.)
        if let Some((entry, done_at_ms)) = recorded {
            crate::audit::make_durable(inner, entry, done_at_ms).await?;
        }
        answer
    }
}

/// A refusal a caller should retry: never replayed for an idempotency key.
fn retryable(e: &Error) -> bool {
    matches!(
        e.code,
        ErrorCode::RateLimited
            | ErrorCode::PoolExhausted
            | ErrorCode::EngineDisposed
            | ErrorCode::FleetUnavailable
    )
}

/// Undoes the acceptance of work refused before it was queued: a retry with its
/// idempotency key runs it.
async fn refuse(inner: &Inner, id: &ExecutionId, held_key: Option<&str>, e: Error) -> Error {
    inner.waiters.remove(id);
    if let Some(k) = held_key {
        let _ = inner.idem.delete(k).await;
    }
    e
}

/// Whether a node that is up (or late), or this one, has room for `engine`'s work at all.
fn served(inner: &Inner, engine: &paddock_core::EngineName) -> bool {
    let registry = inner.registry.read();
    registry.values().any(|s| {
        // This node is alive (it runs this), whatever its card's age says: while
        // the registry's stream has no leader its card cannot be published and
        // goes stale, and its work is not orphaned for that.
        let alive = if s.card.id == inner.node {
            !s.card.leaving
        } else {
            crate::registry::health(inner, &s.card).0 != paddock_pool::federation::NodeHealth::Down
        };
        alive
            && s.card
                .engines
                .iter()
                .any(|e| &e.engine == engine && e.slots > 0)
    })
}

/// The answer of work no node started in time.
fn not_started(inner: &Inner, id: &ExecutionId, fence: &Fence) -> Answer {
    let mut r = ExecResult::empty(
        id.clone(),
        Outcome::TimedOut,
        fence.engine.clone(),
        format!("fleet:{}", inner.node),
    );
    r.warnings.push(format!(
        "no node started it within {} ms of its acceptance (fleet.queue_timeout_ms); it did not run",
        inner.config.queue_timeout_ms
    ));
    Ok(r)
}

/// Records `answer` as the result of work no node will answer for: a compare-and-set
/// on the record as it was read (`revision`; `None`: there was none), so that a node
/// that took the work meanwhile wins. Its answer, or the winner's once done, with
/// the audit entry to make sure of before it is handed out and when it was done.
async fn fence_off(
    inner: &Inner,
    id: &ExecutionId,
    fence: &Fence,
    revision: Option<u64>,
    answer: Answer,
) -> Option<(Answer, (AuditEntry, u64))> {
    let record = Record {
        id: id.clone(),
        tenant: fence.tenant.clone(),
        engine: fence.engine.clone(),
        phase: Phase::Done,
        node: inner.node.clone(),
        incarnation: inner.incarnation.clone(),
        attempts: 0,
        write: inner.next_write(),
        lease_until_ms: 0,
        accepted_by: inner.node.clone(),
        accepted_at_ms: 0,
        forgotten: false,
        code_hash: fence.code_hash.clone(),
        done_at_ms: unix_ms(),
        answer: Some(answer.clone()),
    };
    let written = match revision {
        None => inner.records.create(&record).await,
        Some(rev) => inner.records.update(&record, rev).await,
    };
    match written {
        Ok(Cas::Written(_)) => {
            let entry = crate::audit::of_record(&record, &answer);
            Some((answer, (entry, record.done_at_ms)))
        }
        Ok(Cas::Lost(Some(rec))) if rec.0.phase == Phase::Done => {
            let answer = rec.0.answer.clone()?;
            let entry = crate::audit::of_record(&rec.0, &answer);
            Some((answer, (entry, rec.0.done_at_ms)))
        }
        _ => None,
    }
}

#[async_trait]
impl Federation for Federated {
    fn node_id(&self) -> String {
        self.inner.node.clone()
    }

    async fn place_session(
        &self,
        spec: &SandboxSpec,
        engine: Option<&EngineName>,
    ) -> Result<SessionPlace, Error> {
        crate::sessions::place(&self.inner, spec, engine).await
    }

    async fn admit_session(&self, tenant: Option<&str>, ticket: &str) -> Result<bool, Error> {
        let inner = &self.inner;
        let caps = *inner.share_caps.lock();
        if !caps.counts_sandboxes() {
            return Ok(false);
        }
        let hold = Hold::here(inner, ticket.to_string(), ticket.to_string(), 0, 0);
        crate::shares::take(inner, &caps, tenant, Kind::Sandbox, hold).await?;
        Ok(true)
    }

    fn release_admission(&self, tenant: Option<&str>, ticket: &str) {
        let caps = *self.inner.share_caps.lock();
        if !caps.counts_sandboxes() {
            return;
        }
        let inner = self.inner.clone();
        let tenant = tenant.map(str::to_owned);
        let ticket = ticket.to_string();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    crate::shares::give_back_or_later(
                        &inner,
                        tenant.as_deref(),
                        Kind::Sandbox,
                        &ticket,
                    )
                    .await;
                });
            }
            Err(_) => {
                crate::shares::give_back_later(&inner, tenant.as_deref(), Kind::Sandbox, &ticket)
            }
        }
    }

    async fn session_opened(
        &self,
        tenant: Option<&str>,
        id: &str,
        engine: &EngineName,
        ticket: Option<String>,
    ) -> Result<(), Error> {
        crate::sessions::opened(&self.inner, tenant, id, engine, ticket).await
    }

    async fn node_lost(&self, node: &str) -> String {
        let inner = &self.inner;
        loop {
            tokio::time::sleep(inner.heartbeat()).await;
            // Declared only while this node is itself in touch with the fleet (a
            // node cut off from NATS sees every card age).
            if inner.card_silent_ms() > inner.config.ack_wait_ms {
                continue;
            }
            let card = inner.registry.read().get(node).map(|s| s.card.clone());
            if crate::registry::judge_card(inner, card.as_ref()).is_none() {
                continue;
            }
            // Seen lost (or not seen at all) here: confirmed from the card as the
            // bucket has it, since this node's view may lag.
            if let Ok(card) = crate::registry::read_card(inner, node).await {
                if let Some(why) = crate::registry::judge_card(inner, card.as_ref()) {
                    return why.to_string();
                }
            }
        }
    }

    async fn session_closed(&self, id: &str) {
        crate::sessions::closed(&self.inner, id).await
    }

    async fn session_owner(
        &self,
        caller: &Caller,
        id: &str,
        forwarded: bool,
    ) -> Result<SessionPlace, Error> {
        crate::sessions::owner(&self.inner, caller, id, forwarded).await
    }

    async fn execute(&self, msg: Execute, key: Option<String>) -> Result<ExecResult, Error> {
        let pending = self.submit(msg, key, false).await?;
        self.wait(pending, None).await
    }

    async fn execute_stream(
        &self,
        msg: Execute,
        key: Option<String>,
    ) -> Result<ExecutionStream, Error> {
        let id = msg.request.id.clone();
        let paddock = &self.inner.paddock;
        let subscription = paddock.subscribe(id.clone()).await?;
        let relay = paddock.relay(id.clone()).await?;
        let pending = match self.submit(msg, key, true).await {
            Ok(p) => p,
            Err(e) => {
                relay.close().await;
                return Err(e);
            }
        };
        let (done, answered) = tokio::sync::oneshot::channel();
        let this = Federated {
            inner: self.inner.clone(),
        };
        tokio::spawn(async move {
            let answer = this.wait(pending, Some(&relay)).await;
            relay.close().await;
            let _ = done.send(answer);
        });
        Ok(ExecutionStream::new(subscription, async move {
            answered.await.unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorCode::EngineFailed,
                    "the fleet's wait for the result ended without one; look the execution up by id",
                ))
            })
        }))
    }

    async fn lookup(&self, caller: &Caller, id: &ExecutionId) -> Result<Option<Lookup>, Error> {
        let inner = &self.inner;
        if let Some(w) = inner.waiters.get(id).map(|w| w.clone()) {
            if caller.sees(w.tenant.as_deref()) {
                return Ok(Some(Lookup::Running));
            }
            return Ok(None);
        }
        match inner.records.get(id).await? {
            Some((rec, _)) => {
                if rec.forgotten || !caller.sees(rec.tenant.as_deref()) {
                    return Ok(None);
                }
                Ok(Some(match (rec.phase, &rec.answer) {
                    (Phase::Done, Some(a)) => {
                        // A result handed out has its audit entry in the stream.
                        let entry = crate::audit::of_record(&rec, a);
                        crate::audit::make_durable(inner, entry, rec.done_at_ms).await?;
                        Lookup::Finished(Arc::new(a.clone()))
                    }
                    _ => Lookup::Running,
                }))
            }
            None => {
                // Queued on another node's behalf: only that node knows it.
                let request = Control::Lookup {
                    id: id.clone(),
                    tenant: tenant_of(caller),
                };
                let known = ask(
                    inner,
                    inner.names.broadcast(),
                    &request,
                    Duration::from_millis(250),
                )
                .await
                .is_some_and(|r| r.known);
                Ok(known.then_some(Lookup::Running))
            }
        }
    }

    async fn cancel(&self, caller: &Caller, id: &ExecutionId) -> Result<CancelOutcome, Error> {
        let inner = &self.inner;
        let tenant = tenant_of(caller);
        let here = cancel_here(inner, id, &tenant, true).await;
        if here.known {
            return Ok(CancelOutcome {
                known: true,
                cancelled: here.cancelled,
            });
        }
        match inner.records.get(id).await? {
            Some((rec, rev)) => {
                if rec.forgotten || !caller.sees(rec.tenant.as_deref()) {
                    return Ok(CancelOutcome {
                        known: false,
                        cancelled: false,
                    });
                }
                match rec.phase {
                    Phase::Running | Phase::Released => {
                        let r = crate::control::cancel_recorded(
                            inner,
                            rec.clone(),
                            Some((rec, rev)),
                            &tenant,
                            true,
                        )
                        .await;
                        Ok(CancelOutcome {
                            known: true,
                            cancelled: r.cancelled,
                        })
                    }
                    Phase::Done => {
                        // Forget it: the record stays, and keeps fencing.
                        let mut forgotten = rec.clone();
                        forgotten.forgotten = true;
                        let _ = inner.records.update(&forgotten, rev).await?;
                        Ok(CancelOutcome {
                            known: true,
                            cancelled: false,
                        })
                    }
                }
            }
            None => {
                let request = Control::Cancel {
                    id: id.clone(),
                    tenant: tenant.clone(),
                    forget: true,
                };
                let r = ask(
                    inner,
                    inner.names.broadcast(),
                    &request,
                    Duration::from_millis(500),
                )
                .await
                .unwrap_or_default();
                Ok(CancelOutcome {
                    known: r.known,
                    cancelled: r.cancelled,
                })
            }
        }
    }

    async fn audit(&self, caller: &Caller, query: AuditQuery) -> Result<Vec<AuditEntry>, Error> {
        crate::audit::search(&self.inner, caller, query).await
    }

    async fn nodes(&self, caller: &Caller) -> Result<Vec<NodeView>, Error> {
        let operator = caller.confined_to().is_none();
        Ok(crate::registry::views(&self.inner, operator))
    }
}

/// Delivers what arrives on this node's inbox to the executions waiting for it.
pub(crate) async fn inbox(inner: Arc<Inner>, mut sub: async_nats::Subscriber) {
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
        let Some(waiter) = inner.waiters.get(&id).map(|w| w.clone()) else {
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

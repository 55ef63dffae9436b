//! The fleet's one audit stream: an entry per accepted execution, published with
//! the execution id as its message id, so that the stream keeps exactly one however
//! many deliveries of the work (on however many nodes) publish it.
//!
//! **Read your writes.** An answer reaches a caller only once its entry is in the
//! stream (published and acknowledged): the node that records a result publishes
//! the entry before it sends the result on, and a node that hands out a result it
//! read from a record publishes the entry first ([`make_durable`]). A search reads
//! up to the last entry the stream's leader holds when the search begins, so it
//! finds every entry acknowledged before it.

use std::time::Duration;

use async_nats::jetstream::consumer;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures_util::StreamExt;
use paddock_core::{unix_ms, Error, ErrorCode, ExecResult};
use paddock_pool::audit::{AuditEntry, AuditQuery, DEFAULT_SEARCH_LIMIT};
use paddock_pool::Caller;

use crate::context::Context;
use crate::store::unavailable;
use crate::wire::{Answer, Record};

/// How long the node that recorded a result keeps publishing its entry through a
/// failover before it gives up (and leaves it to the order's next delivery).
pub(crate) const RECORDING_PATIENCE: Duration = Duration::from_secs(30);

/// How long a node that is about to hand out a result keeps publishing its entry
/// before it answers `FLEET_UNAVAILABLE` instead (a leader election takes 4–6 s).
pub(crate) const ANSWER_PATIENCE: Duration = Duration::from_secs(15);

/// How long one search may wait for the entries it must read.
const READ_PATIENCE: Duration = Duration::from_secs(30);

/// The entry of an execution from what its record keeps (the id, tenant, engine and
/// program hash of the accepted execution, whoever wrote the record).
pub(crate) fn of_record(record: &Record, answer: &Answer) -> AuditEntry {
    let tenant = record.tenant.as_deref();
    let code_hash = record.code_hash.clone();
    match answer {
        Ok(r) => AuditEntry::from_result(r, tenant, code_hash),
        Err(e) => {
            let failed = ExecResult::failed(record.id.clone(), record.engine.clone(), e.clone());
            AuditEntry::from_result(&failed, tenant, code_hash)
        }
    }
}

/// Whether a result recorded at `done_at_ms` may still have its entry published:
/// within half the stream's duplicate window, a second publish is dropped as a
/// duplicate; after it, one would be kept (and the entry was published long since,
/// before the result was first handed out).
pub(crate) fn recent(cx: &Context, done_at_ms: u64) -> bool {
    unix_ms().saturating_sub(done_at_ms) < cx.dedupe_ms / 2
}

/// Publishes the entry of an execution and waits for the stream to acknowledge it,
/// retrying through a failover (with the same message id, so a retry of a publish
/// that went through adds nothing) for up to `patience`. The last error otherwise.
pub(crate) async fn publish(
    cx: &Context,
    entry: &AuditEntry,
    patience: Duration,
) -> Result<(), String> {
    let payload = bytes::Bytes::from(serde_json::to_vec(entry).unwrap_or_default());
    let subject = cx.names.audit_subject(entry.tenant.as_deref());
    let id = &entry.id;
    let deadline = tokio::time::Instant::now() + patience;
    let mut pause = Duration::from_millis(50);
    loop {
        let sent = cx
            .js
            .send_publish(
                subject.clone(),
                PublishMessage::build()
                    .payload(payload.clone())
                    .message_id(id.to_string()),
            )
            .await;
        let acked = match sent {
            // A duplicate names the sequence of the entry kept under its id; one
            // without (a 2.10 server answers so for a publish of the id still in
            // flight, or lost with a leader) does not say it is kept: again.
            Ok(ack) => match ack.await {
                Ok(a) if a.duplicate && a.sequence == 0 => {
                    Err("the stream holds the entry's id, but no entry under it yet".into())
                }
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        match acked {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() < deadline && !cx.stopping() => {
                tracing::debug!(%id, error = %e, "publishing an audit entry; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => {
                tracing::error!(%id, error = %e, "an audit entry could not be published");
                return Err(e);
            }
        }
    }
}

/// Makes sure the entry of a recorded result is in the stream before the result is
/// handed to a caller: publishes it (a duplicate of an entry already there is
/// dropped) while the result is [`recent`]. Done in a task of its own, so that a
/// caller that goes away midway does not cut the publish short.
///
/// When the stream does not acknowledge it in [`ANSWER_PATIENCE`], the result is
/// withheld: `FLEET_UNAVAILABLE`, naming the execution, which ran and whose result
/// is kept (a lookup by id, or a retry with the same idempotency key, answers it
/// once the entry is in).
pub(crate) async fn make_durable(
    cx: &std::sync::Arc<Context>,
    entry: AuditEntry,
    done_at_ms: u64,
) -> Result<(), Error> {
    if !recent(cx, done_at_ms) {
        return Ok(());
    }
    let id = entry.id.clone();
    let task = {
        let cx = cx.clone();
        tokio::spawn(async move { publish(&cx, &entry, ANSWER_PATIENCE).await })
    };
    let published = match task.await {
        Ok(p) => p,
        Err(e) => Err(e.to_string()),
    };
    published.map_err(|e| {
        Error::new(
            ErrorCode::FleetUnavailable,
            format!(
                "execution {id} finished, but the fleet's NATS cluster did not acknowledge its audit entry within {} s ({e}); its result is kept and withheld until the entry is in: look it up by id, or retry with the same idempotency key",
                ANSWER_PATIENCE.as_secs()
            ),
        )
        .with_retry_after_ms(1_000)
    })
}

/// Most entries one search reads from the stream.
const MAX_SCANNED: u64 = 200_000;

/// Most entries one search answers.
const MAX_LIMIT: usize = 10_000;

/// Searches the stream, newest first: the subjects of the caller's tenant only
/// (a tenant's key cannot widen it with `query.tenant`).
pub(crate) async fn search(
    cx: &Context,
    caller: &Caller,
    mut query: AuditQuery,
) -> Result<Vec<AuditEntry>, Error> {
    let subject = match caller.confined_to() {
        Some(tenant) => {
            query.tenant = tenant.map(str::to_owned);
            cx.names.audit_subject(tenant)
        }
        None => match &query.tenant {
            Some(t) => cx.names.audit_subject(Some(t)),
            None => cx.names.audit_all(),
        },
    };
    let limit = query.limit.unwrap_or(DEFAULT_SEARCH_LIMIT).min(MAX_LIMIT);
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut stream = cx
        .js
        .get_stream(cx.names.audit_stream())
        .await
        .map_err(|e| unavailable("opening the audit stream", e))?;
    // What the stream's leader holds now (both requests are answered by the
    // leader, which acknowledges a publish only once it holds it): the read goes
    // up to there, whatever replica serves it.
    let state = stream
        .info()
        .await
        .map_err(|e| unavailable("reading the audit stream", e))?
        .state
        .clone();
    if state.messages == 0 {
        return Ok(Vec::new());
    }
    let first = state.first_sequence;
    let last = if subject == cx.names.audit_all() {
        state.last_sequence
    } else {
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => m.sequence,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(Vec::new()),
            Err(e) => return Err(unavailable("reading the audit stream", e)),
        }
    };
    let deadline = tokio::time::Instant::now() + READ_PATIENCE;
    let mut window = (limit as u64).saturating_mul(4).clamp(256, MAX_SCANNED);
    loop {
        let start = last.saturating_add(1).saturating_sub(window).max(first);
        let mut found = read(&stream, &subject, start, last, deadline, &query).await?;
        if found.len() >= limit || start == first || window >= MAX_SCANNED {
            found.sort_by_key(|e| std::cmp::Reverse(e.0));
            found.truncate(limit);
            return Ok(found.into_iter().map(|(_, e)| e).collect());
        }
        window = window.saturating_mul(4).min(MAX_SCANNED);
    }
}

/// The entries of `subject` from sequence `start` up to `end` (an entry of
/// `subject`) that match `query`, with their sequences.
///
/// Read through an ordered consumer, which the servers place on any replica of the
/// stream: one a few writes behind the leader included, whose count of pending
/// entries ends before `end`. So the read goes on until it has seen `end`, and
/// fails rather than answer short.
async fn read(
    stream: &async_nats::jetstream::stream::Stream,
    subject: &str,
    start: u64,
    end: u64,
    deadline: tokio::time::Instant,
    query: &AuditQuery,
) -> Result<Vec<(u64, AuditEntry)>, Error> {
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subject.to_string(),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ..Default::default()
        })
        .await
        .map_err(|e| unavailable("reading the audit stream", e))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| unavailable("reading the audit stream", e))?;
    let mut found = Vec::new();
    let mut seen = start.saturating_sub(1);
    loop {
        let m = match tokio::time::timeout_at(deadline, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => {
                // The ordered consumer makes itself again after a gap; a pause, so
                // that errors that come at once (a connection down) do not spin
                // past the deadline, which is looked at only while waiting.
                tracing::debug!(error = %e, "reading the audit stream; going on");
                if tokio::time::Instant::now() >= deadline {
                    return Err(unavailable(
                        "reading the audit stream",
                        format!("the read stopped at entry {seen} of {end}: {e}"),
                    ));
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
            Ok(None) => {
                return Err(unavailable(
                    "reading the audit stream",
                    format!("the read ended at entry {seen} of {end}"),
                ))
            }
            Err(_) => {
                return Err(unavailable(
                    "reading the audit stream",
                    format!(
                        "entries up to {end} did not arrive in {} s (read up to {seen})",
                        READ_PATIENCE.as_secs()
                    ),
                ))
            }
        };
        let seq = m
            .info()
            .map_err(|e| unavailable("reading the audit stream", e))?
            .stream_sequence;
        if seq > end {
            return Ok(found);
        }
        seen = seq;
        if let Ok(e) = serde_json::from_slice::<AuditEntry>(&m.payload) {
            if query.matches(&e) {
                found.push((seq, e));
            }
        }
        if seq == end {
            return Ok(found);
        }
    }
}

//! The fleet's one audit stream: an entry per accepted execution, published with
//! the execution id as its message id, so that the stream keeps exactly one however
//! many deliveries of the work (on however many nodes) publish it.

use std::time::Duration;

use async_nats::jetstream::consumer;
use async_nats::jetstream::message::PublishMessage;
use futures_util::StreamExt;
use paddock_core::{EngineName, Error, ExecRequest, ExecResult};
use paddock_pool::audit::{AuditEntry, AuditQuery, DEFAULT_SEARCH_LIMIT};
use paddock_pool::Caller;

use crate::node::Inner;
use crate::store::unavailable;
use crate::wire::Answer;

/// The entry of one execution.
pub(crate) fn entry(request: &ExecRequest, engine: &EngineName, answer: &Answer) -> AuditEntry {
    let hash = paddock_core::code_hash(&request.program.audit_text());
    let tenant = request.tenant.as_deref();
    match answer {
        Ok(r) => AuditEntry::from_result(r, tenant, hash),
        Err(e) => {
            let failed = ExecResult::failed(request.id.clone(), engine.clone(), e.clone());
            AuditEntry::from_result(&failed, tenant, hash)
        }
    }
}

/// Publishes the entry of an execution, retrying through a failover (with the same
/// message id, so a retry of a publish that went through adds nothing). Whether the
/// stream has it.
pub(crate) async fn publish(inner: &Inner, entry: &AuditEntry) -> bool {
    let payload = bytes::Bytes::from(serde_json::to_vec(entry).unwrap_or_default());
    let subject = inner.names.audit_subject(entry.tenant.as_deref());
    let id = &entry.id;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut pause = Duration::from_millis(50);
    loop {
        let sent = inner
            .js
            .send_publish(
                subject.clone(),
                PublishMessage::build()
                    .payload(payload.clone())
                    .message_id(id.to_string()),
            )
            .await;
        let acked = match sent {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match acked {
            Ok(()) => return true,
            Err(e) if tokio::time::Instant::now() < deadline && !inner.stopping() => {
                tracing::debug!(%id, error = %e, "publishing an audit entry; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => {
                // The next delivery of the work (if any) publishes it again.
                tracing::error!(%id, error = %e, "an audit entry could not be published");
                return false;
            }
        }
    }
}

/// Most entries one search reads from the stream.
const MAX_SCANNED: u64 = 200_000;

/// Most entries one search answers.
const MAX_LIMIT: usize = 10_000;

/// Searches the stream, newest first: the subjects of the caller's tenant only
/// (a tenant's key cannot widen it with `query.tenant`).
pub(crate) async fn search(
    inner: &Inner,
    caller: &Caller,
    mut query: AuditQuery,
) -> Result<Vec<AuditEntry>, Error> {
    let subject = match caller.confined_to() {
        Some(tenant) => {
            query.tenant = tenant.map(str::to_owned);
            inner.names.audit_subject(tenant)
        }
        None => match &query.tenant {
            Some(t) => inner.names.audit_subject(Some(t)),
            None => inner.names.audit_all(),
        },
    };
    let limit = query.limit.unwrap_or(DEFAULT_SEARCH_LIMIT).min(MAX_LIMIT);
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut stream = inner
        .js
        .get_stream(inner.names.audit_stream())
        .await
        .map_err(|e| unavailable("opening the audit stream", e))?;
    let state = stream
        .info()
        .await
        .map_err(|e| unavailable("reading the audit stream", e))?
        .state
        .clone();
    if state.messages == 0 {
        return Ok(Vec::new());
    }
    let (first, last) = (state.first_sequence, state.last_sequence);
    let mut window = (limit as u64).saturating_mul(4).clamp(256, MAX_SCANNED);
    loop {
        let start = last.saturating_add(1).saturating_sub(window).max(first);
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: subject.clone(),
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
        let mut found: Vec<(u64, AuditEntry)> = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), messages.next()).await;
            let Ok(Some(Ok(m))) = next else { break };
            let (seq, pending) = match m.info() {
                Ok(i) => (i.stream_sequence, i.pending),
                Err(_) => break,
            };
            if seq > last {
                break;
            }
            if let Ok(e) = serde_json::from_slice::<AuditEntry>(&m.payload) {
                if query.matches(&e) {
                    found.push((seq, e));
                }
            }
            if pending == 0 || seq == last {
                break;
            }
        }
        if found.len() >= limit || start == first || window >= MAX_SCANNED {
            found.sort_by_key(|e| std::cmp::Reverse(e.0));
            found.truncate(limit);
            return Ok(found.into_iter().map(|(_, e)| e).collect());
        }
        window = window.saturating_mul(4).min(MAX_SCANNED);
    }
}

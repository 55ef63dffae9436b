//! Sessions in a fleet. A sandbox stays on the node that opened it, its owner; the
//! owner is recorded in the `P_sessions` bucket (key: the sandbox's id), and every
//! other node routes the calls on it there (the HTTP layer forwards them).
//!
//! - Opening is placed by capacity: the node with the most free room for the
//!   sandbox's engine opens it.
//! - A call whose owner is lost (its heartbeat stopped past the ack wait, or it
//!   came back as a new incarnation) is answered `NODE_LOST`, and the record is
//!   marked lost, so that every node answers the same from then on.
//! - An owner that could not publish its card for longer than that ends its
//!   sessions itself: the fleet counts them lost. Back on NATS, it ends every
//!   sandbox whose record is no longer an open one of its own.

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use paddock_core::{unix_ms, EngineName, Error, ErrorCode, SandboxSpec};
use paddock_pool::federation::{NodeHealth, SessionPlace};
use paddock_pool::Caller;
use serde::{Deserialize, Serialize};

use crate::node::Inner;
use crate::store::unavailable;

/// Where a session stands, in its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SessionState {
    /// Open on its owner.
    Open,
    /// Destroyed (by its caller, or idle past its limit).
    Closed,
    /// Its owner was lost: whatever it held is gone.
    Lost,
}

/// The record of one sandbox of the fleet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) tenant: Option<String>,
    pub(crate) engine: EngineName,
    /// The owner, and its incarnation (a restarted node is a new one, without the
    /// sandboxes of the old).
    pub(crate) node: String,
    pub(crate) incarnation: String,
    pub(crate) opened_at_ms: u64,
    pub(crate) state: SessionState,
    /// When the owner last wrote it (records of open sessions are written again
    /// well inside the bucket's age limit).
    pub(crate) at_ms: u64,
}

/// The fleet's sandboxes as this node keeps them.
#[derive(Debug)]
pub(crate) struct SessionBook {
    /// The owners of the fleet's sandboxes (`P_sessions`).
    pub(crate) store: kv::Store,
    /// The sandboxes this node owns.
    pub(crate) own: dashmap::DashMap<String, Own>,
    /// Sandboxes this node ended while cut off from NATS, until their records say
    /// they are lost.
    pub(crate) fenced: dashmap::DashMap<String, Option<String>>,
}

/// A session this node owns.
#[derive(Debug, Clone)]
pub(crate) struct Own {
    pub(crate) tenant: Option<String>,
    pub(crate) engine: EngineName,
    /// The record's revision as this node last wrote it.
    pub(crate) revision: u64,
    pub(crate) written_at_ms: u64,
    /// Its place in the tenant's fleet-wide shares, given back when it ends.
    pub(crate) ticket: Option<String>,
}

/// How long a session record lives without being written: an open one is written
/// again every [`REFRESH`], so only the records of ended sessions (and of lost
/// nodes) expire.
pub(crate) const RECORD_AGE: Duration = Duration::from_secs(3_600);
const REFRESH: Duration = Duration::from_secs(600);

/// How long a record operation retries a cluster that does not answer (a leader
/// election takes a few seconds).
const PATIENCE: Duration = Duration::from_secs(10);

fn key(id: &str) -> String {
    crate::names::token(id)
}

fn decode(entry: kv::Entry) -> Option<(SessionRecord, u64)> {
    if !matches!(entry.operation, kv::Operation::Put) {
        return None;
    }
    serde_json::from_slice::<SessionRecord>(&entry.value)
        .ok()
        .map(|r| (r, entry.revision))
}

fn encode(r: &SessionRecord) -> Bytes {
    Bytes::from(serde_json::to_vec(r).unwrap_or_default())
}

/// How long one record operation may take.
const STEP: Duration = Duration::from_secs(3);

/// Retries `step` through a failover, for up to [`PATIENCE`].
async fn patiently<T, E: std::fmt::Display, F>(
    what: &str,
    step: impl FnMut() -> F,
) -> Result<T, Error>
where
    F: std::future::Future<Output = Result<T, E>>,
{
    let patience = crate::store::Patience {
        total: PATIENCE,
        step: STEP,
        pause: Duration::from_millis(20),
        max_pause: Duration::from_millis(500),
    };
    crate::store::retry(what, patience, step)
        .await
        .map_err(|e| unavailable(what, e))
}

async fn get(inner: &Inner, id: &str) -> Result<Option<(SessionRecord, u64)>, Error> {
    let k = key(id);
    let entry = patiently("reading a session record", || {
        inner.sessions.store.entry(k.clone())
    })
    .await?;
    Ok(entry.and_then(decode))
}

/// Writes `record` over revision `revision`; `false` when someone else wrote first.
async fn update(
    inner: &Inner,
    record: &SessionRecord,
    revision: u64,
) -> Result<Option<u64>, Error> {
    let write = inner
        .sessions
        .store
        .update(key(&record.id), encode(record), revision);
    match tokio::time::timeout(STEP, write).await {
        Ok(Ok(rev)) => Ok(Some(rev)),
        Ok(Err(e)) if crate::store::wrong_revision(&e) => Ok(None),
        Ok(Err(e)) => Err(unavailable("writing a session record", e)),
        Err(_) => Err(unavailable("writing a session record", "no answer in time")),
    }
}

/// Where a sandbox for `spec` opens: the node (this one on a tie) with the most
/// free room for its engine; here when no node has more room than this one, or
/// when this node does not know the engine (it answers for it).
pub(crate) async fn place(
    inner: &Inner,
    spec: &SandboxSpec,
    engine: Option<&EngineName>,
) -> Result<SessionPlace, Error> {
    let engine = match engine {
        Some(e) => e.clone(),
        None => match inner
            .paddock
            .choose_engine(None, spec.level, None, spec.tenant.clone())
            .await
        {
            Ok(e) => e,
            // Refused here, with this node's answer.
            Err(_) => return Ok(SessionPlace::Here),
        },
    };
    let room_of = |rooms: &[paddock_pool::federation::EngineRoom]| {
        rooms
            .iter()
            .find(|r| r.engine == engine && r.slots > 0)
            .map(|r| r.free)
    };
    let here = room_of(&crate::node::rooms(inner));
    let mut best: Option<(usize, String, String)> = None;
    for seen in inner.members.seen.read().values() {
        let card = &seen.card;
        if card.id == inner.node {
            continue;
        }
        let (health, _) = crate::registry::health(inner, card);
        let (NodeHealth::Up, Some(address), Some(free)) =
            (health, card.address.as_ref(), room_of(&card.engines))
        else {
            continue;
        };
        if best
            .as_ref()
            .is_none_or(|(f, id, _)| free > *f || free == *f && card.id < *id)
        {
            best = Some((free, card.id.clone(), address.clone()));
        }
    }
    Ok(match best {
        Some((free, id, address)) if free > 0 && here.is_none_or(|h| free > h) => {
            SessionPlace::Node { id, address }
        }
        _ => SessionPlace::Here,
    })
}

/// Records that sandbox `id` opened on this node, admitted with `ticket` (kept
/// with it from then on, and given back when it ends).
pub(crate) async fn opened(
    inner: &Inner,
    tenant: Option<&str>,
    id: &str,
    engine: &EngineName,
    ticket: Option<String>,
) -> Result<(), Error> {
    // On an error the caller still holds the ticket, and gives it back.
    let (revision, written_at_ms) = record_opened(inner, tenant, id, engine).await?;
    inner.sessions.own.insert(
        id.to_string(),
        Own {
            tenant: tenant.map(str::to_owned),
            engine: engine.clone(),
            revision,
            written_at_ms,
            ticket,
        },
    );
    Ok(())
}

/// Creates the record of sandbox `id`, opened here: its revision and when it was
/// written.
async fn record_opened(
    inner: &Inner,
    tenant: Option<&str>,
    id: &str,
    engine: &EngineName,
) -> Result<(u64, u64), Error> {
    let now = unix_ms();
    let record = SessionRecord {
        id: id.to_string(),
        tenant: tenant.map(str::to_owned),
        engine: engine.clone(),
        node: inner.node.clone(),
        incarnation: inner.incarnation.clone(),
        opened_at_ms: now,
        state: SessionState::Open,
        at_ms: now,
    };
    let k = key(id);
    let bytes = encode(&record);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let made = match tokio::time::timeout(STEP, inner.sessions.store.create(&k, bytes.clone()))
            .await
        {
            Ok(r) => r.map_err(Some),
            Err(_) => Err(None),
        };
        match made {
            Ok(revision) => return Ok((revision, now)),
            Err(Some(e)) if crate::store::already_exists(&e) => {
                // Ours, from a create whose answer was lost; anything else is
                // another sandbox's id (ids are unique, so this does not happen).
                if let Some((r, revision)) = get(inner, id).await? {
                    if r.node == inner.node && r.incarnation == inner.incarnation {
                        return Ok((revision, r.at_ms));
                    }
                }
                return Err(Error::new(
                    ErrorCode::EngineFailed,
                    format!("the fleet already has a sandbox `{id}`; open another"),
                ));
            }
            Err(e) => {
                let e = e.map_or_else(|| "no answer in time".to_string(), |e| e.to_string());
                if tokio::time::Instant::now() >= deadline {
                    return Err(unavailable("recording a sandbox's owner", e));
                }
                tracing::debug!(error = %e, "recording a session; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Gives back the place in its tenant's shares of a sandbox that ended here (at
/// once, or later when NATS does not answer).
async fn give_back(inner: &Inner, own: &Own) {
    if let Some(t) = &own.ticket {
        crate::shares::give_back_or_later(
            inner,
            own.tenant.as_deref(),
            crate::shares::Kind::Sandbox,
            t,
        )
        .await;
    }
}

/// Records that sandbox `id`, owned here, ended.
pub(crate) async fn closed(inner: &Inner, id: &str) {
    let Some((_, own)) = inner.sessions.own.remove(id) else {
        return;
    };
    mark(inner, id, Some(own.revision), SessionState::Closed).await;
    give_back(inner, &own).await;
}

/// Marks the record of `id` (at `revision`, or whatever is there) as `state`, if it
/// still is an open one. Best effort: a record left open is found out by whoever
/// asks for it next.
async fn mark(inner: &Inner, id: &str, revision: Option<u64>, state: SessionState) {
    let current = match get(inner, id).await {
        Ok(Some(c)) => c,
        _ => return,
    };
    let (mut record, rev) = current;
    if record.state != SessionState::Open || revision.is_some_and(|r| r != rev) {
        return;
    }
    record.state = state;
    record.at_ms = unix_ms();
    if let Err(e) = update(inner, &record, rev).await {
        tracing::debug!(sandbox = id, error = %e.message, "marking a session record failed");
    }
}

fn lost(id: &str, node: &str, why: &str) -> Error {
    Error::new(
        ErrorCode::NodeLost,
        format!(
            "sandbox `{id}` was on node `{node}`, which the fleet lost ({why}); what it \
             held is gone: open a new sandbox"
        ),
    )
}

/// Where sandbox `id` lives, for `caller`.
pub(crate) async fn owner(
    inner: &Inner,
    caller: &Caller,
    id: &str,
    forwarded: bool,
) -> Result<SessionPlace, Error> {
    if inner.sessions.own.contains_key(id) {
        return Ok(SessionPlace::Here);
    }
    let fenced = inner.sessions.fenced.get(id).map(|t| t.value().clone());
    if let Some(tenant) = fenced {
        // Another tenant's: answered as for an id that never existed.
        if !caller.sees(tenant.as_deref()) {
            return Ok(SessionPlace::Here);
        }
        return Err(lost(id, &inner.node, "this node was cut off from it"));
    }
    if forwarded {
        return Ok(SessionPlace::Here);
    }
    let Some((record, revision)) = get(inner, id).await? else {
        return Ok(SessionPlace::Here);
    };
    // Another tenant's: this node answers, exactly as for an id that never existed.
    if !caller.sees(record.tenant.as_deref()) {
        return Ok(SessionPlace::Here);
    }
    let ours = record.node == inner.node;
    match record.state {
        SessionState::Lost => return Err(lost(id, &record.node, "its sandboxes ended with it")),
        SessionState::Closed if ours => return Ok(SessionPlace::Here),
        SessionState::Closed => {
            return Err(Error::disposed(&format!("sandbox {id}")));
        }
        SessionState::Open => {}
    }
    if ours {
        if record.incarnation == inner.incarnation {
            // Ended here a moment ago: this node answers.
            return Ok(SessionPlace::Here);
        }
        let _ = mark_lost(inner, &record, revision).await;
        return Err(lost(id, &record.node, "it restarted since"));
    }
    let (why, card) = crate::registry::loss(inner, &record.node, &record.incarnation).await?;
    if let Some(why) = why {
        let _ = mark_lost(inner, &record, revision).await;
        return Err(lost(id, &record.node, why));
    }
    match card.and_then(|c| c.address) {
        Some(address) => Ok(SessionPlace::Node {
            id: record.node,
            address,
        }),
        None => Err(Error::new(
            ErrorCode::FleetUnavailable,
            format!(
                "sandbox `{id}` is on node `{}`, which advertises no address to reach it at; \
                 set fleet.advertise on that node",
                record.node
            ),
        )),
    }
}

/// Marks the record lost; `false` when that could not be written (someone else
/// wrote first, or NATS did not answer).
async fn mark_lost(inner: &Inner, record: &SessionRecord, revision: u64) -> bool {
    let mut r = record.clone();
    r.state = SessionState::Lost;
    r.at_ms = unix_ms();
    match update(inner, &r, revision).await {
        Ok(written) => written.is_some(),
        Err(e) => {
            tracing::debug!(sandbox = %r.id, error = %e.message, "marking a session lost failed");
            false
        }
    }
}

/// Ends a sandbox of this node (the fleet no longer counts it as this node's).
async fn end_here(inner: &Inner, id: &str) {
    if let Ok(handle) = inner.paddock.sandbox(&Caller::Embedder, id).await {
        if let Err(e) = handle.destroy().await {
            tracing::warn!(sandbox = id, error = %e, "ending a sandbox the fleet lost failed");
        }
    }
}

/// Ends this node's sessions while its card has not been written for longer than
/// the ack wait: the fleet counts the node lost, and so its sandboxes. Checked
/// every heartbeat, apart from anything that waits on NATS.
pub(crate) async fn fence(inner: std::sync::Arc<Inner>) {
    let mut beats = inner.beats();
    while beats.next().await {
        let silent = inner.card_silent_ms();
        if silent <= inner.config.ack_wait_ms {
            continue;
        }
        let ids: Vec<String> = inner.sessions.own.iter().map(|e| e.key().clone()).collect();
        for id in ids {
            let Some((_, own)) = inner.sessions.own.remove(&id) else {
                continue;
            };
            // Given back once NATS answers again (the others may drop it
            // sooner, as a lost node's).
            if let Some(t) = &own.ticket {
                crate::shares::give_back_later(
                    &inner,
                    own.tenant.as_deref(),
                    crate::shares::Kind::Sandbox,
                    t,
                );
            }
            inner.sessions.fenced.insert(id.clone(), own.tenant);
            tracing::warn!(sandbox = %id, silent_ms = silent, "this node is cut off from the fleet; ending its sandbox");
            end_here(&inner, &id).await;
        }
    }
}

/// Keeps this node's sessions and their records in step: once NATS answers again,
/// the records of the sandboxes [`fence`] ended are marked lost; every few
/// heartbeats, a sandbox ended here (idle past its limit) gets its record closed,
/// one whose record is no longer an open one of this node's is ended, and the
/// records of the others are written again well inside their age limit.
pub(crate) async fn keep(inner: std::sync::Arc<Inner>) {
    let mut beats = inner.beats();
    let mut round = 0u64;
    while beats.next().await {
        round += 1;
        if inner.card_silent_ms() > inner.config.ack_wait_ms {
            continue;
        }
        let fenced: Vec<String> = inner
            .sessions
            .fenced
            .iter()
            .map(|e| e.key().clone())
            .collect();
        for id in fenced {
            match get(&inner, &id).await {
                Ok(Some((r, rev))) => {
                    // Kept until the record no longer says open (a failed write is
                    // tried again next beat).
                    if r.node != inner.node
                        || r.state != SessionState::Open
                        || mark_lost(&inner, &r, rev).await
                    {
                        inner.sessions.fenced.remove(&id);
                    }
                }
                Ok(None) => {
                    inner.sessions.fenced.remove(&id);
                }
                Err(_) => break,
            }
        }
        crate::shares::retry_unreturned(&inner).await;
        if round.is_multiple_of(5) {
            reconcile(&inner).await;
        }
    }
}

async fn reconcile(inner: &Inner) {
    // `own` first: a sandbox opened after it was read is left to the next round
    // (read the other way round, it would look ended).
    let ids: Vec<(String, Own)> = inner
        .sessions
        .own
        .iter()
        .map(|e| (e.key().clone(), e.value().clone()))
        .collect();
    let Ok(open) = inner.paddock.open_sandbox_ids().await else {
        return;
    };
    let open: HashSet<String> = open.into_iter().collect();
    let now = unix_ms();
    for (id, own) in ids {
        if !open.contains(&id) {
            // Ended here (idle past its limit, or at shutdown).
            closed(inner, &id).await;
            continue;
        }
        let Ok(found) = get(inner, &id).await else {
            continue;
        };
        match found {
            Some((r, rev))
                if r.state == SessionState::Open
                    && r.node == inner.node
                    && r.incarnation == inner.incarnation =>
            {
                if now.saturating_sub(own.written_at_ms) > REFRESH.as_millis() as u64 {
                    let mut again = r.clone();
                    again.at_ms = now;
                    if let Ok(Some(revision)) = update(inner, &again, rev).await {
                        if let Some(mut o) = inner.sessions.own.get_mut(&id) {
                            o.revision = revision;
                            o.written_at_ms = now;
                        }
                    }
                }
            }
            // Marked lost (this node was counted lost), or gone: no longer ours.
            _ => {
                if let Some((_, own)) = inner.sessions.own.remove(&id) {
                    give_back(inner, &own).await;
                }
                tracing::warn!(sandbox = %id, "the fleet no longer counts this sandbox as this node's; ending it");
                end_here(inner, &id).await;
            }
        }
    }
}

/// Open sessions of each engine on this node.
pub(crate) fn count(inner: &Inner, engine: &EngineName) -> usize {
    inner
        .sessions
        .own
        .iter()
        .filter(|e| &e.value().engine == engine)
        .count()
}

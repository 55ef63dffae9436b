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
//!
//! Its book, [`SessionBook`], holds the books it uses: the registry's (placing and
//! judging owners), the shares' (a sandbox's hold) and the orders' (the engines'
//! room, [`rooms`]). None of those uses this module.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use paddock_core::{unix_ms, EngineName, Error, ErrorCode, SandboxSpec};
use paddock_pool::federation::{EngineRoom, NodeHealth, SessionPlace};
use paddock_pool::Caller;
use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::orders::Orders;
use crate::registry::Membership;
use crate::shares::ShareBook;
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
    /// The node this book is of.
    pub(crate) cx: Arc<Context>,
    /// The fleet's nodes, to place a sandbox and to judge an owner.
    pub(crate) members: Arc<Membership>,
    /// The tenants' shares, which a sandbox holds one of while it is open.
    pub(crate) shares: Arc<ShareBook>,
    /// This node's engines and the work it runs, for its free room.
    pub(crate) orders: Arc<Orders>,
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

async fn get(book: &SessionBook, id: &str) -> Result<Option<(SessionRecord, u64)>, Error> {
    let k = key(id);
    let entry = patiently("reading a session record", || book.store.entry(k.clone())).await?;
    Ok(entry.and_then(decode))
}

/// Writes `record` over revision `revision`; `false` when someone else wrote first.
async fn update(
    book: &SessionBook,
    record: &SessionRecord,
    revision: u64,
) -> Result<Option<u64>, Error> {
    let write = book.store.update(key(&record.id), encode(record), revision);
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
    book: &SessionBook,
    spec: &SandboxSpec,
    engine: Option<&EngineName>,
) -> Result<SessionPlace, Error> {
    let engine = match engine {
        Some(e) => e.clone(),
        None => match book
            .cx
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
    let here = room_of(&rooms(book));
    let mut best: Option<(usize, String, String)> = None;
    for seen in book.members.seen.read().values() {
        let card = &seen.card;
        if card.id == book.cx.node {
            continue;
        }
        let (health, _) = crate::registry::health(&book.members, card);
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
    book: &SessionBook,
    tenant: Option<&str>,
    id: &str,
    engine: &EngineName,
    ticket: Option<String>,
) -> Result<(), Error> {
    // On an error the caller still holds the ticket, and gives it back.
    let (revision, written_at_ms) = record_opened(book, tenant, id, engine).await?;
    book.own.insert(
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
    book: &SessionBook,
    tenant: Option<&str>,
    id: &str,
    engine: &EngineName,
) -> Result<(u64, u64), Error> {
    let now = unix_ms();
    let record = SessionRecord {
        id: id.to_string(),
        tenant: tenant.map(str::to_owned),
        engine: engine.clone(),
        node: book.cx.node.clone(),
        incarnation: book.cx.incarnation.clone(),
        opened_at_ms: now,
        state: SessionState::Open,
        at_ms: now,
    };
    let k = key(id);
    let bytes = encode(&record);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let made = match tokio::time::timeout(STEP, book.store.create(&k, bytes.clone())).await {
            Ok(r) => r.map_err(Some),
            Err(_) => Err(None),
        };
        match made {
            Ok(revision) => return Ok((revision, now)),
            Err(Some(e)) if crate::store::already_exists(&e) => {
                // Ours, from a create whose answer was lost; anything else is
                // another sandbox's id (ids are unique, so this does not happen).
                if let Some((r, revision)) = get(book, id).await? {
                    if r.node == book.cx.node && r.incarnation == book.cx.incarnation {
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
async fn give_back(book: &SessionBook, own: &Own) {
    if let Some(t) = &own.ticket {
        crate::shares::give_back_or_later(
            &book.shares,
            own.tenant.as_deref(),
            crate::shares::Kind::Sandbox,
            t,
        )
        .await;
    }
}

/// Records that sandbox `id`, owned here, ended.
pub(crate) async fn closed(book: &SessionBook, id: &str) {
    let Some((_, own)) = book.own.remove(id) else {
        return;
    };
    mark(book, id, Some(own.revision), SessionState::Closed).await;
    give_back(book, &own).await;
}

/// Marks the record of `id` (at `revision`, or whatever is there) as `state`, if it
/// still is an open one. Best effort: a record left open is found out by whoever
/// asks for it next.
async fn mark(book: &SessionBook, id: &str, revision: Option<u64>, state: SessionState) {
    let current = match get(book, id).await {
        Ok(Some(c)) => c,
        _ => return,
    };
    let (mut record, rev) = current;
    if record.state != SessionState::Open || revision.is_some_and(|r| r != rev) {
        return;
    }
    record.state = state;
    record.at_ms = unix_ms();
    if let Err(e) = update(book, &record, rev).await {
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
    book: &SessionBook,
    caller: &Caller,
    id: &str,
    forwarded: bool,
) -> Result<SessionPlace, Error> {
    if book.own.contains_key(id) {
        return Ok(SessionPlace::Here);
    }
    let fenced = book.fenced.get(id).map(|t| t.value().clone());
    if let Some(tenant) = fenced {
        // Another tenant's: answered as for an id that never existed.
        if !caller.sees(tenant.as_deref()) {
            return Ok(SessionPlace::Here);
        }
        return Err(lost(id, &book.cx.node, "this node was cut off from it"));
    }
    if forwarded {
        return Ok(SessionPlace::Here);
    }
    let Some((record, revision)) = get(book, id).await? else {
        return Ok(SessionPlace::Here);
    };
    // Another tenant's: this node answers, exactly as for an id that never existed.
    if !caller.sees(record.tenant.as_deref()) {
        return Ok(SessionPlace::Here);
    }
    let ours = record.node == book.cx.node;
    match record.state {
        SessionState::Lost => return Err(lost(id, &record.node, "its sandboxes ended with it")),
        SessionState::Closed if ours => return Ok(SessionPlace::Here),
        SessionState::Closed => {
            return Err(Error::disposed(&format!("sandbox {id}")));
        }
        SessionState::Open => {}
    }
    if ours {
        if record.incarnation == book.cx.incarnation {
            // Ended here a moment ago: this node answers.
            return Ok(SessionPlace::Here);
        }
        let _ = mark_lost(book, &record, revision).await;
        return Err(lost(id, &record.node, "it restarted since"));
    }
    let (why, card) =
        crate::registry::loss(&book.members, &record.node, &record.incarnation).await?;
    if let Some(why) = why {
        let _ = mark_lost(book, &record, revision).await;
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
async fn mark_lost(book: &SessionBook, record: &SessionRecord, revision: u64) -> bool {
    let mut r = record.clone();
    r.state = SessionState::Lost;
    r.at_ms = unix_ms();
    match update(book, &r, revision).await {
        Ok(written) => written.is_some(),
        Err(e) => {
            tracing::debug!(sandbox = %r.id, error = %e.message, "marking a session lost failed");
            false
        }
    }
}

/// Ends a sandbox of this node (the fleet no longer counts it as this node's).
async fn end_here(book: &SessionBook, id: &str) {
    if let Ok(handle) = book.cx.paddock.sandbox(&Caller::Embedder, id).await {
        if let Err(e) = handle.destroy().await {
            tracing::warn!(sandbox = id, error = %e, "ending a sandbox the fleet lost failed");
        }
    }
}

/// Ends this node's sessions while its card has not been written for longer than
/// the ack wait: the fleet counts the node lost, and so its sandboxes. Checked
/// every heartbeat, apart from anything that waits on NATS.
pub(crate) async fn fence(book: Arc<SessionBook>) {
    let mut beats = book.cx.beats();
    while beats.next().await {
        let silent = book.members.card_silent_ms();
        if silent <= book.cx.config.ack_wait_ms {
            continue;
        }
        let ids: Vec<String> = book.own.iter().map(|e| e.key().clone()).collect();
        for id in ids {
            let Some((_, own)) = book.own.remove(&id) else {
                continue;
            };
            // Given back once NATS answers again (the others may drop it
            // sooner, as a lost node's).
            if let Some(t) = &own.ticket {
                crate::shares::give_back_later(
                    &book.shares,
                    own.tenant.as_deref(),
                    crate::shares::Kind::Sandbox,
                    t,
                );
            }
            book.fenced.insert(id.clone(), own.tenant);
            tracing::warn!(sandbox = %id, silent_ms = silent, "this node is cut off from the fleet; ending its sandbox");
            end_here(&book, &id).await;
        }
    }
}

/// Keeps this node's sessions and their records in step: once NATS answers again,
/// the records of the sandboxes [`fence`] ended are marked lost; every few
/// heartbeats, a sandbox ended here (idle past its limit) gets its record closed,
/// one whose record is no longer an open one of this node's is ended, and the
/// records of the others are written again well inside their age limit.
pub(crate) async fn keep(book: Arc<SessionBook>) {
    let mut beats = book.cx.beats();
    let mut round = 0u64;
    while beats.next().await {
        round += 1;
        if book.members.card_silent_ms() > book.cx.config.ack_wait_ms {
            continue;
        }
        let fenced: Vec<String> = book.fenced.iter().map(|e| e.key().clone()).collect();
        for id in fenced {
            match get(&book, &id).await {
                Ok(Some((r, rev))) => {
                    // Kept until the record no longer says open (a failed write is
                    // tried again next beat).
                    if r.node != book.cx.node
                        || r.state != SessionState::Open
                        || mark_lost(&book, &r, rev).await
                    {
                        book.fenced.remove(&id);
                    }
                }
                Ok(None) => {
                    book.fenced.remove(&id);
                }
                Err(_) => break,
            }
        }
        crate::shares::retry_unreturned(&book.shares).await;
        if round.is_multiple_of(5) {
            reconcile(&book).await;
        }
    }
}

async fn reconcile(book: &SessionBook) {
    // `own` first: a sandbox opened after it was read is left to the next round
    // (read the other way round, it would look ended).
    let ids: Vec<(String, Own)> = book
        .own
        .iter()
        .map(|e| (e.key().clone(), e.value().clone()))
        .collect();
    let Ok(open) = book.cx.paddock.open_sandbox_ids().await else {
        return;
    };
    let open: HashSet<String> = open.into_iter().collect();
    let now = unix_ms();
    for (id, own) in ids {
        if !open.contains(&id) {
            // Ended here (idle past its limit, or at shutdown).
            closed(book, &id).await;
            continue;
        }
        let Ok(found) = get(book, &id).await else {
            continue;
        };
        match found {
            Some((r, rev))
                if r.state == SessionState::Open
                    && r.node == book.cx.node
                    && r.incarnation == book.cx.incarnation =>
            {
                if now.saturating_sub(own.written_at_ms) > REFRESH.as_millis() as u64 {
                    let mut again = r.clone();
                    again.at_ms = now;
                    if let Ok(Some(revision)) = update(book, &again, rev).await {
                        if let Some(mut o) = book.own.get_mut(&id) {
                            o.revision = revision;
                            o.written_at_ms = now;
                        }
                    }
                }
            }
            // Marked lost (this node was counted lost), or gone: no longer ours.
            _ => {
                if let Some((_, own)) = book.own.remove(&id) {
                    give_back(book, &own).await;
                }
                tracing::warn!(sandbox = %id, "the fleet no longer counts this sandbox as this node's; ending it");
                end_here(book, &id).await;
            }
        }
    }
}

/// Open sessions of each engine on this node.
pub(crate) fn count(book: &SessionBook, engine: &EngineName) -> usize {
    book.own
        .iter()
        .filter(|e| &e.value().engine == engine)
        .count()
}

/// Every engine's free room now: its slots less the fleet's work it runs and the
/// sandboxes of the fleet open on it (each holds one of its instances).
pub(crate) fn rooms(book: &SessionBook) -> Vec<EngineRoom> {
    book.orders
        .engines
        .iter()
        .map(|e| EngineRoom {
            engine: e.engine.clone(),
            level: e.level,
            slots: e.slots,
            free: e
                .slots
                .saturating_sub(e.busy.load(Ordering::Acquire))
                .saturating_sub(count(book, &e.engine)),
        })
        .collect()
}

//! Per-tenant concurrency caps that hold fleet-wide: `limiter.max_concurrent_per_tenant`,
//! `max_slots_per_tenant` and `max_sandboxes_per_tenant`, counted over every node.
//!
//! Each tenant has one key in the `P_shares` bucket, holding what it holds now: a
//! **hold** per one-shot execution (from its acceptance until its result is in) and
//! per open sandbox (from before it opens until it is destroyed). A node takes a
//! hold by compare-and-set on that key, so that at most the cap of holds exist at
//! once, whichever nodes take them; the node that took a hold gives it back.
//!
//! A hold outlives its holder only while what it stands for may still be alive:
//! - a sandbox's hold ends with its node (a lost node's sandboxes are gone);
//! - an execution's hold outlives the node that accepted it while the execution
//!   may still run elsewhere: until its record says it is done, or it was never
//!   started by its start-by time.
//!
//! Holds of lost nodes are dropped by whichever node finds the tenant at a cap, so
//! that the common path costs one read and one write.
//!
//! Its book, [`ShareBook`], holds the node's context and its [`Membership`], which
//! judges a hold's holder: this module uses the registry (and `rate`'s type), and
//! neither uses it back.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use paddock_core::{unix_ms, Error, ErrorCode, ExecutionId};
use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::names::tenant_token;
use crate::registry::Membership;
use crate::store::unavailable;
use crate::wire::Phase;

/// The caps a fleet counts per tenant over all its nodes ([`Fleet::limit_shares`]).
/// Give every node the same.
///
/// [`Fleet::limit_shares`]: crate::Fleet::limit_shares
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareCaps {
    /// One-shot executions a tenant may have accepted and unfinished at once
    /// (`limiter.max_concurrent_per_tenant`).
    pub max_concurrent: Option<u32>,
    /// Pool slots a tenant may hold at once: its one-shot executions and its open
    /// sandboxes (`limiter.max_slots_per_tenant`).
    pub max_slots: Option<u32>,
    /// Sandboxes a tenant may have open at once (`limiter.max_sandboxes_per_tenant`).
    pub max_sandboxes: Option<u32>,
    /// The longest an execution may run when its request sets no timeout (the
    /// nodes' `limits.timeout_ms`; 0: unknown, counted as the longest allowed, 24
    /// h): bounds how long a hold can outlive a node that could not give it back.
    pub default_timeout_ms: u64,
}

impl ShareCaps {
    /// Whether one-shot executions take holds (a cap counts them).
    pub fn counts_runs(&self) -> bool {
        self.max_concurrent.is_some() || self.max_slots.is_some()
    }

    /// Whether sandboxes take holds (a cap counts them).
    pub fn counts_sandboxes(&self) -> bool {
        self.max_sandboxes.is_some() || self.max_slots.is_some()
    }
}

/// The tenants' fleet-wide shares and rates as this node keeps them.
#[derive(Debug)]
pub(crate) struct ShareBook {
    /// The node this book is of.
    pub(crate) cx: Arc<Context>,
    /// The fleet's nodes, to judge a hold's holder.
    pub(crate) members: Arc<Membership>,
    /// Per-tenant holds (`P_shares`).
    pub(crate) store: kv::Store,
    /// The fleet-wide concurrency caps per tenant ([`Fleet::limit_shares`](crate::Fleet::limit_shares)).
    pub(crate) caps: parking_lot::Mutex<ShareCaps>,
    /// Holds this node could not give back yet.
    pub(crate) unreturned: parking_lot::Mutex<std::collections::VecDeque<Unreturned>>,
    /// Per-tenant rate counters.
    pub(crate) rate: kv::Store,
    /// The fleet-wide rate limit per tenant, if any ([`Fleet::limit_rate`](crate::Fleet::limit_rate)).
    pub(crate) rate_limit: parking_lot::Mutex<Option<crate::rate::Rate>>,
}

/// What a hold stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A one-shot execution.
    Run,
    /// An open sandbox.
    Sandbox,
}

/// What one tenant holds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Holds {
    #[serde(default)]
    runs: Vec<Hold>,
    #[serde(default)]
    sandboxes: Vec<Hold>,
}

impl Holds {
    fn of(&mut self, kind: Kind) -> &mut Vec<Hold> {
        match kind {
            Kind::Run => &mut self.runs,
            Kind::Sandbox => &mut self.sandboxes,
        }
    }
}

/// One hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Hold {
    /// What it stands for: the execution's id, or the sandbox's ticket.
    pub(crate) id: String,
    /// This hold's own name, given back by it: two requests can stand for one
    /// execution (retries with one idempotency key), and each gives back only its
    /// own hold.
    #[serde(default)]
    pub(crate) nonce: String,
    /// The node that took it, and its incarnation.
    pub(crate) node: String,
    pub(crate) incarnation: String,
    /// An execution's start-by time (Unix ms; 0 for a sandbox).
    #[serde(default)]
    pub(crate) start_by_ms: u64,
    /// The latest an execution can still run (Unix ms; 0 for a sandbox): after
    /// it, the hold lapses whatever became of its node.
    #[serde(default)]
    pub(crate) until_ms: u64,
}

impl Hold {
    /// A hold of this node for `id`, named `nonce`.
    pub(crate) fn here(
        book: &ShareBook,
        id: String,
        nonce: String,
        start_by_ms: u64,
        until_ms: u64,
    ) -> Hold {
        Hold {
            id,
            nonce,
            node: book.cx.node.clone(),
            incarnation: book.cx.incarnation.clone(),
            start_by_ms,
            until_ms,
        }
    }
}

/// How long one bucket operation may take.
const STEP: Duration = Duration::from_secs(3);
/// Compare-and-set turns before a node gives way to the others.
const TURNS: usize = 32;
/// How long a tenant at its concurrency or slot cap is told to wait.
const BUSY_RETRY_MS: u64 = 250;
/// How long a tenant at its sandbox cap is told to wait.
const SANDBOX_RETRY_MS: u64 = 1_000;

fn key(tenant: Option<&str>) -> String {
    tenant_token(tenant)
}

async fn read(book: &ShareBook, k: &str) -> Result<(Holds, Option<u64>), Error> {
    let entry = match tokio::time::timeout(STEP, book.store.entry(k)).await {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => return Err(unavailable("reading a tenant's shares", e)),
        Err(_) => {
            return Err(unavailable(
                "reading a tenant's shares",
                "no answer in time",
            ))
        }
    };
    match entry {
        Some(e) if matches!(e.operation, kv::Operation::Put) => {
            let holds = serde_json::from_slice(&e.value).map_err(|e| {
                unavailable("reading a tenant's shares", format!("unreadable: {e}"))
            })?;
            Ok((holds, Some(e.revision)))
        }
        Some(e) => Ok((Holds::default(), Some(e.revision))),
        None => Ok((Holds::default(), None)),
    }
}

/// Writes `holds` over `revision` (`None`: there was no key); `false` when another
/// node wrote first.
async fn write(
    book: &ShareBook,
    k: &str,
    holds: &Holds,
    revision: Option<u64>,
) -> Result<bool, Error> {
    let value = Bytes::from(serde_json::to_vec(holds).unwrap_or_default());
    let done = match revision {
        None => match tokio::time::timeout(STEP, book.store.create(k, value)).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) if crate::store::already_exists(&e) => Ok(false),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer in time".to_string()),
        },
        Some(rev) => match tokio::time::timeout(STEP, book.store.update(k, value, rev)).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(e)) if crate::store::wrong_revision(&e) => Ok(false),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer in time".to_string()),
        },
    };
    done.map_err(|e| unavailable("writing a tenant's shares", e))
}

fn who(tenant: Option<&str>) -> String {
    tenant.map_or_else(
        || "callers without a tenant".to_string(),
        |t| format!("tenant `{t}`"),
    )
}

/// The refusal of one more hold of `kind` at a cap, if any.
fn refusal(caps: &ShareCaps, holds: &Holds, kind: Kind, tenant: Option<&str>) -> Option<Error> {
    let runs = holds.runs.len();
    let sandboxes = holds.sandboxes.len();
    match kind {
        Kind::Run => {
            if let Some(max) = caps.max_concurrent.filter(|m| runs >= *m as usize) {
                return Some(
                    Error::new(
                        ErrorCode::RateLimited,
                        format!(
                            "{} has {runs} executions unfinished in the fleet, its limit (limiter.max_concurrent_per_tenant = {max}); retry when one finishes",
                            who(tenant)
                        ),
                    )
                    .with_retry_after_ms(BUSY_RETRY_MS),
                );
            }
        }
        Kind::Sandbox => {
            if let Some(max) = caps.max_sandboxes.filter(|m| sandboxes >= *m as usize) {
                return Some(
                    Error::new(
                        ErrorCode::RateLimited,
                        format!(
                            "{} has {sandboxes} sandboxes open in the fleet, its cap (limiter.max_sandboxes_per_tenant = {max}); destroy one first",
                            who(tenant)
                        ),
                    )
                    .with_retry_after_ms(SANDBOX_RETRY_MS),
                );
            }
        }
    }
    let held = runs + sandboxes;
    caps.max_slots.filter(|m| held >= *m as usize).map(|max| {
        Error::new(
            ErrorCode::PoolExhausted,
            format!(
                "{} holds {held} pool slots in the fleet (open sandboxes and executions), its cap (limiter.max_slots_per_tenant = {max}); retry when one ends",
                who(tenant)
            ),
        )
        .with_retry_after_ms(BUSY_RETRY_MS)
    })
}

/// Takes `hold` of `kind` for `tenant`, or refuses at a cap: `RATE_LIMITED` at the
/// concurrency or sandbox cap, `POOL_EXHAUSTED` at the slot cap (the codes of a
/// single node). A hold whose write may have landed although it answered an error
/// is given back later, so that an error never leaves a hold behind.
pub(crate) async fn take(
    book: &ShareBook,
    caps: &ShareCaps,
    tenant: Option<&str>,
    kind: Kind,
    hold: Hold,
) -> Result<(), Error> {
    let k = key(tenant);
    for _ in 0..TURNS {
        let (mut holds, revision) = read(book, &k).await?;
        if holds.of(kind).iter().any(|h| h.nonce == hold.nonce) {
            // A write of ours whose answer was lost.
            return Ok(());
        }
        if refusal(caps, &holds, kind, tenant).is_some() {
            // Only at a cap are the holds of lost nodes looked for; what was
            // found is written even when the refusal stands, so that the next
            // request does not look again.
            let before = holds.runs.len() + holds.sandboxes.len();
            prune(book, &mut holds).await;
            if let Some(e) = refusal(caps, &holds, kind, tenant) {
                if holds.runs.len() + holds.sandboxes.len() < before {
                    let _ = write(book, &k, &holds, revision).await;
                }
                return Err(e);
            }
        }
        holds.of(kind).push(hold.clone());
        match write(book, &k, &holds, revision).await {
            Ok(true) => return Ok(()),
            Ok(false) => continue,
            Err(e) => {
                give_back_later(book, tenant, kind, &hold.nonce);
                return Err(e);
            }
        }
    }
    Err(Error::new(
        ErrorCode::RateLimited,
        format!(
            "{} is admitted by many nodes at once (its shares changed {TURNS} times while this node read them); retry",
            who(tenant)
        ),
    )
    .with_retry_after_ms(20))
}

/// Gives back the hold named `nonce` of `kind`; `false` when the bucket could not
/// be written (the hold stays until [`give_back_later`] succeeds).
pub(crate) async fn give_back(
    book: &ShareBook,
    tenant: Option<&str>,
    kind: Kind,
    nonce: &str,
) -> bool {
    let k = key(tenant);
    for _ in 0..TURNS {
        let Ok((mut holds, revision)) = read(book, &k).await else {
            return false;
        };
        // A hold that is not there is confirmed gone by writing what was read
        // over its revision (that lands only if nothing was written since), so
        // that a give-back racing its own take cannot miss it.
        holds.of(kind).retain(|h| h.nonce != nonce);
        match write(book, &k, &holds, revision).await {
            Ok(true) => return true,
            Ok(false) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// What this node could not give back yet: tried again every heartbeat.
#[derive(Debug, Clone)]
pub(crate) struct Unreturned {
    pub(crate) tenant: Option<String>,
    pub(crate) kind: Kind,
    pub(crate) nonce: String,
}

/// Most holds a node keeps to give back later; past it the oldest is left to lapse
/// (or to be dropped as a lost node's).
const MAX_UNRETURNED: usize = 65_536;

/// Gives back the hold named `nonce`, or keeps it to try again on the next
/// heartbeat.
pub(crate) async fn give_back_or_later(
    book: &ShareBook,
    tenant: Option<&str>,
    kind: Kind,
    nonce: &str,
) {
    if !give_back(book, tenant, kind, nonce).await {
        give_back_later(book, tenant, kind, nonce);
    }
}

/// Keeps the hold named `nonce` to give back on the next heartbeat.
pub(crate) fn give_back_later(book: &ShareBook, tenant: Option<&str>, kind: Kind, nonce: &str) {
    let mut later = book.unreturned.lock();
    if later.len() >= MAX_UNRETURNED {
        later.pop_front();
    }
    later.push_back(Unreturned {
        tenant: tenant.map(str::to_owned),
        kind,
        nonce: nonce.to_string(),
    });
}

/// Tries again what could not be given back (called every heartbeat while this
/// node is in touch with the fleet).
pub(crate) async fn retry_unreturned(book: &ShareBook) {
    let pending: Vec<Unreturned> = book.unreturned.lock().drain(..).collect();
    let mut failed = false;
    for u in pending {
        if failed || !give_back(book, u.tenant.as_deref(), u.kind, &u.nonce).await {
            // NATS does not answer: the rest waits for the next beat.
            failed = true;
            give_back_later(book, u.tenant.as_deref(), u.kind, &u.nonce);
        }
    }
}

/// Drops the holds nothing stands for any more: an execution's past the latest it
/// could run, or whose node was lost and whose record says done (or that was
/// never started by its start-by time); a sandbox's whose node was lost.
async fn prune(book: &ShareBook, holds: &mut Holds) {
    let now = unix_ms();
    let grace = 2 * book.cx.config.ack_wait_ms;
    let mut runs = Vec::with_capacity(holds.runs.len());
    for h in std::mem::take(&mut holds.runs) {
        if h.until_ms != 0 && h.until_ms < now {
            continue;
        }
        if mine(book, &h) || !lost(book, &h).await {
            runs.push(h);
            continue;
        }
        let ended = match ExecutionId::parse(&h.id) {
            Ok(id) => match book.cx.records.get(&id).await {
                Ok(Some((rec, _))) => rec.phase == Phase::Done,
                Ok(None) => now > h.start_by_ms + grace,
                Err(_) => false,
            },
            Err(_) => true,
        };
        if !ended {
            runs.push(h);
        }
    }
    holds.runs = runs;
    let mut sandboxes = Vec::with_capacity(holds.sandboxes.len());
    for h in std::mem::take(&mut holds.sandboxes) {
        if mine(book, &h) || !lost(book, &h).await {
            sandboxes.push(h);
        }
    }
    holds.sandboxes = sandboxes;
}

fn mine(book: &ShareBook, h: &Hold) -> bool {
    h.node == book.cx.node && h.incarnation == book.cx.incarnation
}

/// Whether the node of `h` is lost, as this node can tell (not when it cannot).
async fn lost(book: &ShareBook, h: &Hold) -> bool {
    matches!(
        crate::registry::loss(&book.members, &h.node, &h.incarnation).await,
        Ok((Some(_), _))
    )
}

/// The latest an execution whose start-by is `start_by_ms` can still run: each of
/// `fleet.max_attempts` runs takes at most its timeout (the request's, else the
/// nodes' default; an unknown default counts as the longest allowed), an ack wait
/// to be taken over, and a minute for starting, killing and recording.
fn until(book: &ShareBook, caps: &ShareCaps, start_by_ms: u64, timeout_ms: Option<u64>) -> u64 {
    const LONGEST_MS: u64 = 24 * 3_600_000;
    let attempts = u64::from(book.cx.config.max_attempts.max(1));
    let timeout = timeout_ms
        .or((caps.default_timeout_ms > 0).then_some(caps.default_timeout_ms))
        .unwrap_or(LONGEST_MS);
    let run = timeout + book.cx.config.ack_wait_ms + 60_000;
    start_by_ms.saturating_add(run.saturating_mul(attempts))
}

/// The hold of a one-shot execution accepted here, given back when its result is
/// in ([`RunHold::finish`]). Dropped before that (its caller went away, or it
/// could not be queued for sure), it watches the record in the background and
/// gives the hold back once the execution is done, or could no longer start.
#[derive(Debug)]
pub(crate) struct RunHold {
    book: Arc<ShareBook>,
    tenant: Option<String>,
    id: ExecutionId,
    nonce: String,
    start_by_ms: u64,
    until_ms: u64,
    /// Given back already (or nothing to give back).
    settled: bool,
}

impl RunHold {
    /// Takes the hold of execution `id` for `tenant`.
    pub(crate) async fn take(
        book: &Arc<ShareBook>,
        caps: &ShareCaps,
        tenant: Option<&str>,
        id: &ExecutionId,
        start_by_ms: u64,
        timeout_ms: Option<u64>,
    ) -> Result<RunHold, Error> {
        let hold = Hold::here(
            book,
            id.to_string(),
            ExecutionId::new().to_string(),
            start_by_ms,
            until(book, caps, start_by_ms, timeout_ms),
        );
        let nonce = hold.nonce.clone();
        let until_ms = hold.until_ms;
        take(book, caps, tenant, Kind::Run, hold).await?;
        Ok(RunHold {
            book: book.clone(),
            tenant: tenant.map(str::to_owned),
            id: id.clone(),
            nonce,
            start_by_ms,
            until_ms,
            settled: false,
        })
    }

    /// The execution is done (or was refused before it was queued): gives the
    /// hold back now.
    pub(crate) async fn finish(mut self) {
        self.settled = true;
        give_back_or_later(&self.book, self.tenant.as_deref(), Kind::Run, &self.nonce).await;
    }

    /// This node stops while the execution may still run elsewhere: the hold is
    /// left in place (dropped as a lost node's once the record says done).
    pub(crate) fn keep(mut self) {
        self.settled = true;
    }
}

impl Drop for RunHold {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let book = self.book.clone();
        let tenant = self.tenant.take();
        let id = self.id.clone();
        let nonce = std::mem::take(&mut self.nonce);
        let (start_by_ms, until_ms) = (self.start_by_ms, self.until_ms);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to watch on: the hold lapses at `until_ms`, or is
            // dropped as a lost node's.
            return;
        };
        runtime.spawn(async move {
            let grace = 2 * book.cx.config.ack_wait_ms;
            loop {
                let now = unix_ms();
                let ended = match book.cx.records.get(&id).await {
                    Ok(Some((rec, _))) => rec.phase == Phase::Done,
                    Ok(None) => now > start_by_ms + grace,
                    Err(_) => false,
                };
                if book.cx.stopping() {
                    // Left to lapse, or to be dropped as a lost node's.
                    return;
                }
                if ended || now > until_ms {
                    break;
                }
                tokio::time::sleep(book.cx.heartbeat() * 2).await;
            }
            give_back_or_later(&book, tenant.as_deref(), Kind::Run, &nonce).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(id: &str) -> Hold {
        Hold {
            id: id.into(),
            nonce: id.into(),
            node: "n".into(),
            incarnation: "i".into(),
            start_by_ms: 0,
            until_ms: 0,
        }
    }

    #[test]
    fn each_cap_refuses_with_the_code_of_a_single_node() {
        let caps = ShareCaps {
            max_concurrent: Some(2),
            max_slots: Some(3),
            max_sandboxes: Some(1),
            default_timeout_ms: 1_000,
        };
        let mut holds = Holds::default();
        assert!(refusal(&caps, &holds, Kind::Run, Some("a")).is_none());
        holds.runs.push(hold("r1"));
        holds.runs.push(hold("r2"));
        let e = refusal(&caps, &holds, Kind::Run, Some("a")).unwrap();
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert!(
            e.message.contains("max_concurrent_per_tenant = 2"),
            "{}",
            e.message
        );
        // Two runs leave one slot: a sandbox may open.
        assert!(refusal(&caps, &holds, Kind::Sandbox, Some("a")).is_none());
        holds.sandboxes.push(hold("s1"));
        let e = refusal(&caps, &holds, Kind::Sandbox, Some("a")).unwrap();
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert!(
            e.message.contains("max_sandboxes_per_tenant = 1"),
            "{}",
            e.message
        );
        holds.runs.pop();
        // One run and one sandbox: the concurrency cap has room, the slots do not.
        let caps = ShareCaps {
            max_slots: Some(2),
            ..caps
        };
        let e = refusal(&caps, &holds, Kind::Run, None).unwrap();
        assert_eq!(e.code, ErrorCode::PoolExhausted);
        assert!(
            e.message.contains("callers without a tenant"),
            "{}",
            e.message
        );
        assert!(e.retry_after_ms.is_some());
        assert!(!ShareCaps::default().counts_runs());
        assert!(!ShareCaps::default().counts_sandboxes());
        assert!(caps.counts_runs() && caps.counts_sandboxes());
    }

    #[test]
    fn holds_read_back_what_was_written_and_old_records_without_fields() {
        let mut holds = Holds::default();
        holds.runs.push(Hold {
            start_by_ms: 5,
            until_ms: 9,
            ..hold("r")
        });
        let text = serde_json::to_vec(&holds).unwrap();
        let back: Holds = serde_json::from_slice(&text).unwrap();
        assert_eq!(back.runs[0].until_ms, 9);
        let sparse: Holds =
            serde_json::from_str(r#"{"sandboxes":[{"id":"t","node":"n","incarnation":"i"}]}"#)
                .unwrap();
        assert!(sparse.runs.is_empty());
        assert_eq!(sparse.sandboxes[0].until_ms, 0);
    }
}

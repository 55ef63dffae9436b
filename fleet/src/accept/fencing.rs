//! Fencing off work no node will answer for any more: whether a live node serves
//! its engine, the answer of work never started, and recording an answer with a
//! compare-and-set so that a node that took the work meanwhile wins.

use paddock_core::{unix_ms, ExecResult, ExecutionId, Outcome};
use paddock_pool::audit::AuditEntry;

use super::{Fence, Parts};
use crate::store::Cas;
use crate::wire::{Answer, Phase, Record};

/// Whether a node that is up (or late), or this one, has room for `engine`'s work at all.
pub(super) fn served(inner: &Parts, engine: &paddock_core::EngineName) -> bool {
    let registry = inner.members.seen.read();
    registry.values().any(|s| {
        // This node is alive (it runs this), whatever its card's age says: while
        // the registry's stream has no leader its card cannot be published and
        // goes stale, and its work is not orphaned for that.
        let alive = if s.card.id == inner.cx.node {
            !s.card.leaving
        } else {
            crate::registry::health(&inner.members, &s.card).0
                != paddock_pool::federation::NodeHealth::Down
        };
        alive
            && s.card
                .engines
                .iter()
                .any(|e| &e.engine == engine && e.slots > 0)
    })
}

/// The answer of work no node started in time.
pub(super) fn not_started(inner: &Parts, id: &ExecutionId, fence: &Fence) -> Answer {
    let mut r = ExecResult::empty(
        id.clone(),
        Outcome::TimedOut,
        fence.engine.clone(),
        format!("fleet:{}", inner.cx.node),
    );
    r.warnings.push(format!(
        "no node started it within {} ms of its acceptance (fleet.queue_timeout_ms); it did not run",
        inner.cx.config.queue_timeout_ms
    ));
    Ok(r)
}

/// Records `answer` as the result of work no node will answer for: a compare-and-set
/// on the record as it was read (`revision`; `None`: there was none), so that a node
/// that took the work meanwhile wins. Its answer, or the winner's once done, with
/// the audit entry to make sure of before it is handed out and when it was done.
pub(super) async fn fence_off(
    inner: &Parts,
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
        node: inner.cx.node.clone(),
        incarnation: inner.cx.incarnation.clone(),
        attempts: 0,
        write: inner.cx.next_write(),
        lease_until_ms: 0,
        accepted_by: inner.cx.node.clone(),
        accepted_at_ms: 0,
        forgotten: false,
        code_hash: fence.code_hash.clone(),
        done_at_ms: unix_ms(),
        answer: Some(answer.clone()),
    };
    let written = match revision {
        None => inner.cx.records.create(&record).await,
        Some(rev) => inner.cx.records.update(&record, rev).await,
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

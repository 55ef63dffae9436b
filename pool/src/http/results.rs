//! Results kept for a retention window, by execution id and by idempotency key.
//!
//! A key seen again while its execution runs attaches to it; seen again after, it
//! returns the first result. The program never runs twice: a `DELETE` forgets a
//! finished result and its key (a retry then runs anew), but one still running keeps
//! its key until it has finished. Every result belongs to
//! the tenant that ran it: lookups answer only that tenant (and operators). Bounded
//! in count, in time, and in bytes, both in total and per tenant: a tenant over its
//! share loses its own oldest results, never another tenant's.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{Error, ExecResult, ExecutionId};
use tokio::sync::watch;

/// What a finished execution answered.
pub(crate) type Answer = Arc<Result<ExecResult, Error>>;

#[derive(Debug)]
struct Entry {
    done: watch::Receiver<Option<Answer>>,
    finished_at: Option<Instant>,
    tenant: Option<String>,
    bytes: u64,
    /// Deleted while it ran: unknown to lookups, but its idempotency key still
    /// attaches (to the `cancelled` answer) until it finishes, so a retry cannot run
    /// the program a second time while the first is being killed.
    deleted: bool,
}

/// What [`ResultStore::begin`] found for an idempotency key.
#[derive(Debug)]
pub(crate) enum Begin {
    /// New: run it, then [`ResultStore::finish`].
    Run(watch::Sender<Option<Answer>>),
    /// Known: wait on this for the first execution's answer.
    Attach(watch::Receiver<Option<Answer>>),
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<ExecutionId, Entry>,
    keys: HashMap<(String, String), ExecutionId>,
    order: VecDeque<(ExecutionId, Option<(String, String)>)>,
    total_bytes: u64,
    tenant_bytes: HashMap<Option<String>, u64>,
    /// Results kept per tenant (running ones included).
    tenant_counts: HashMap<Option<String>, usize>,
}

/// The bounds of a [`ResultStore`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// How long a finished result is kept.
    pub(crate) retention: Duration,
    /// Most results kept.
    pub(crate) max: usize,
    /// Most bytes kept, all tenants together.
    pub(crate) max_bytes: u64,
    /// Most bytes kept per tenant.
    pub(crate) max_bytes_per_tenant: u64,
}

/// The store.
#[derive(Debug)]
pub(crate) struct ResultStore {
    inner: parking_lot::Mutex<Inner>,
    bounds: Bounds,
}

/// The bytes a kept result holds, roughly: its output, value and messages, plus a
/// fixed overhead for the rest.
fn answer_bytes(answer: &Result<ExecResult, Error>) -> u64 {
    const OVERHEAD: u64 = 512;
    let size = match answer {
        Ok(r) => {
            r.stdout.len()
                + r.stderr.len()
                + r.instance_id.len()
                + r.value.as_ref().map_or(0, |v| v.to_string().len())
                + r.warnings.iter().map(String::len).sum::<usize>()
        }
        Err(e) => e.message.len(),
    };
    size as u64 + OVERHEAD
}

impl ResultStore {
    pub(crate) fn new(bounds: Bounds) -> ResultStore {
        ResultStore {
            inner: parking_lot::Mutex::new(Inner::default()),
            bounds,
        }
    }

    /// Registers an execution of `tenant` (under its idempotency `key`, if given).
    pub(crate) fn begin(&self, id: &ExecutionId, tenant: Option<&str>, key: Option<&str>) -> Begin {
        let mut inner = self.inner.lock();
        self.expire(&mut inner);
        let scoped = key.map(|k| (tenant.unwrap_or_default().to_string(), k.to_string()));
        if let Some(scoped) = &scoped {
            if let Some(existing) = inner.keys.get(scoped).cloned() {
                if let Some(e) = inner.by_id.get(&existing) {
                    return Begin::Attach(e.done.clone());
                }
            }
        }
        // At the count bound, the tenant holding the most results (the caller's own,
        // on a tie) loses its oldest finished one; an execution still running is
        // never dropped (those are bounded by the pools' sizes and queues).
        let own = tenant.map(str::to_owned);
        while inner.by_id.len() >= self.bounds.max {
            let most = inner.tenant_counts.values().copied().max().unwrap_or(0);
            let heaviest = if inner.tenant_counts.get(&own) == Some(&most) {
                Some(own.clone())
            } else {
                inner
                    .tenant_counts
                    .iter()
                    .find(|(_, n)| **n == most)
                    .map(|(t, _)| t.clone())
            };
            let evicted = match heaviest {
                Some(t) => Self::evict_first(&mut inner, |e| e.tenant == t, id),
                None => false,
            } || Self::evict_first(&mut inner, |_| true, id);
            if !evicted {
                break;
            }
        }
        // Ids forgotten out of order leave their places behind; sweep them now and
        // then so the queue stays within twice the bound.
        if inner.order.len() >= 2 * self.bounds.max {
            let Inner { order, by_id, .. } = &mut *inner;
            order.retain(|(id, _)| by_id.contains_key(id));
        }
        let (tx, rx) = watch::channel(None);
        inner.by_id.insert(
            id.clone(),
            Entry {
                done: rx,
                finished_at: None,
                tenant: tenant.map(str::to_owned),
                bytes: 0,
                deleted: false,
            },
        );
        *inner
            .tenant_counts
            .entry(tenant.map(str::to_owned))
            .or_default() += 1;
        if let Some(scoped) = &scoped {
            inner.keys.insert(scoped.clone(), id.clone());
        }
        inner.order.push_back((id.clone(), scoped));
        Begin::Run(tx)
    }

    /// Records the answer of an execution started with [`ResultStore::begin`]. An
    /// answer larger than a tenant's whole share is kept without its output (a
    /// warning says so); then the tenant's own oldest results, and then everyone's
    /// oldest, make room.
    pub(crate) fn finish(
        &self,
        id: &ExecutionId,
        tx: watch::Sender<Option<Answer>>,
        answer: Answer,
    ) {
        let mut bytes = answer_bytes(&answer);
        let kept = if bytes > self.bounds.max_bytes_per_tenant {
            // Made without copying the output it leaves out.
            let mut slim = match answer.as_ref() {
                Ok(r) => {
                    let mut r = r.without_output();
                    r.value = None;
                    Ok(r)
                }
                Err(e) => Err(e.clone()),
            };
            if let Ok(r) = &mut slim {
                r.warnings.push(format!(
                    "the output ({bytes} bytes with the rest) was not kept for later lookups: it exceeds server.max_result_bytes_per_tenant ({})",
                    self.bounds.max_bytes_per_tenant
                ));
            }
            bytes = answer_bytes(&slim);
            Arc::new(slim)
        } else {
            answer
        };
        let _ = tx.send(Some(kept));
        let mut inner = self.inner.lock();
        let Some(e) = inner.by_id.get_mut(id) else {
            return;
        };
        if e.deleted {
            // Deleted while it ran: gone now that it has finished.
            Self::forget_entry(&mut inner, id);
            inner.keys.retain(|_, v| v != id);
            return;
        }
        e.finished_at = Some(Instant::now());
        e.bytes = bytes;
        let tenant = e.tenant.clone();
        inner.total_bytes += bytes;
        *inner.tenant_bytes.entry(tenant.clone()).or_default() += bytes;
        while inner.tenant_bytes.get(&tenant).copied().unwrap_or(0)
            > self.bounds.max_bytes_per_tenant
        {
            if !Self::evict_first(&mut inner, |e| e.tenant == tenant, id) {
                break;
            }
        }
        while inner.total_bytes > self.bounds.max_bytes {
            if !Self::evict_first(&mut inner, |_| true, id) {
                break;
            }
        }
    }

    /// Records an answer that must not be replayed (a refusal worth retrying, such
    /// as `RATE_LIMITED` or `POOL_EXHAUSTED`): callers attached now get it, and the id
    /// and key are forgotten so that a retry with the same key runs.
    pub(crate) fn finish_and_forget(
        &self,
        id: &ExecutionId,
        tx: watch::Sender<Option<Answer>>,
        answer: Answer,
    ) {
        let _ = tx.send(Some(answer));
        let mut inner = self.inner.lock();
        Self::forget_entry(&mut inner, id);
        inner.keys.retain(|_, v| v != id);
    }

    /// Deletes an execution: its id is unknown from now on. A finished one is
    /// forgotten with its idempotency key at once (a retry with the key runs again).
    /// One still running keeps its key until it finishes, so that a retry attaches to
    /// it (and gets its `cancelled` answer) instead of running the program a second
    /// time; then it is forgotten too. Callers already attached get its answer.
    pub(crate) fn forget(&self, id: &ExecutionId) {
        let mut inner = self.inner.lock();
        match inner.by_id.get_mut(id) {
            Some(e) if e.finished_at.is_none() => e.deleted = true,
            _ => {
                Self::forget_entry(&mut inner, id);
                inner.keys.retain(|_, v| v != id);
            }
        }
    }

    /// The owner and answer of an execution: the answer `None` while it runs; `None`
    /// altogether if unknown.
    pub(crate) fn get(&self, id: &ExecutionId) -> Option<(Option<String>, Option<Answer>)> {
        let mut inner = self.inner.lock();
        self.expire(&mut inner);
        inner
            .by_id
            .get(id)
            .filter(|e| !e.deleted)
            .map(|e| (e.tenant.clone(), e.done.borrow().clone()))
    }

    /// Bytes kept: in total, and for `tenant`.
    pub(crate) fn bytes(&self, tenant: Option<&str>) -> (u64, u64) {
        let inner = self.inner.lock();
        let own = inner
            .tenant_bytes
            .get(&tenant.map(str::to_owned))
            .copied()
            .unwrap_or(0);
        (inner.total_bytes, own)
    }

    fn expire(&self, inner: &mut Inner) {
        while let Some((id, _)) = inner.order.front() {
            let expired = inner
                .by_id
                .get(id)
                .and_then(|e| e.finished_at)
                .is_some_and(|t| t.elapsed() >= self.bounds.retention);
            let gone = !inner.by_id.contains_key(id);
            if !(expired || gone) {
                break;
            }
            Self::evict_oldest(inner);
        }
    }

    fn evict_oldest(inner: &mut Inner) {
        if let Some(place) = inner.order.pop_front() {
            Self::drop_place(inner, place);
        }
    }

    /// Forgets the entry at a place of the queue, and its idempotency key if the key
    /// still names it.
    fn drop_place(inner: &mut Inner, (id, key): (ExecutionId, Option<(String, String)>)) {
        Self::forget_entry(inner, &id);
        if let Some(key) = key {
            if inner.keys.get(&key) == Some(&id) {
                inner.keys.remove(&key);
            }
        }
    }

    /// Evicts the oldest finished result that passes `which` (never `keep`); whether
    /// one was found.
    fn evict_first(inner: &mut Inner, which: impl Fn(&Entry) -> bool, keep: &ExecutionId) -> bool {
        let found = inner.order.iter().position(|(id, _)| {
            id != keep
                && inner
                    .by_id
                    .get(id)
                    .is_some_and(|e| e.finished_at.is_some() && which(e))
        });
        let Some(at) = found else {
            return false;
        };
        if let Some(place) = inner.order.remove(at) {
            Self::drop_place(inner, place);
        }
        true
    }

    /// Drops `id`'s entry and its bytes.
    fn forget_entry(inner: &mut Inner, id: &ExecutionId) {
        if let Some(e) = inner.by_id.remove(id) {
            if let Some(n) = inner.tenant_counts.get_mut(&e.tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    inner.tenant_counts.remove(&e.tenant);
                }
            }
            inner.total_bytes = inner.total_bytes.saturating_sub(e.bytes);
            if let Some(n) = inner.tenant_bytes.get_mut(&e.tenant) {
                *n = n.saturating_sub(e.bytes);
                if *n == 0 {
                    inner.tenant_bytes.remove(&e.tenant);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::{EngineName, ErrorCode, Outcome};

    fn bounds(max: usize) -> Bounds {
        Bounds {
            retention: Duration::from_secs(60),
            max,
            max_bytes: 1 << 30,
            max_bytes_per_tenant: 1 << 30,
        }
    }

    fn output(id: &ExecutionId, bytes: usize) -> Answer {
        let mut r = ExecResult::empty(
            id.clone(),
            Outcome::Completed {
                exit_code: 0,
                signal: None,
            },
            EngineName::NOOP,
            "",
        );
        r.stdout = "x".repeat(bytes);
        Arc::new(Ok(r))
    }

    #[test]
    fn a_forgotten_refusal_lets_the_same_key_run_again() {
        let store = ResultStore::new(bounds(10));
        let id = ExecutionId::new();
        let Begin::Run(tx) = store.begin(&id, Some("t"), Some("k")) else {
            panic!("a new key runs")
        };
        let Begin::Attach(rx) = store.begin(&ExecutionId::new(), Some("t"), Some("k")) else {
            panic!("a repeated key attaches")
        };
        let refusal: Answer = Arc::new(Err(Error::new(ErrorCode::RateLimited, "slow down")));
        store.finish_and_forget(&id, tx, refusal);
        assert!(
            rx.borrow().is_some(),
            "an attached caller still gets the answer"
        );
        assert!(store.get(&id).is_none());
        assert!(matches!(
            store.begin(&ExecutionId::new(), Some("t"), Some("k")),
            Begin::Run(_)
        ));
    }

    #[test]
    fn a_deleted_running_execution_keeps_its_key_until_it_finishes() {
        let store = ResultStore::new(bounds(10));
        let id = ExecutionId::new();
        let Begin::Run(tx) = store.begin(&id, Some("t"), Some("k")) else {
            panic!("a new key runs")
        };
        store.forget(&id);
        assert!(store.get(&id).is_none(), "deleted: unknown to lookups");
        // A retry while the first is still being killed attaches: never a second run.
        let Begin::Attach(rx) = store.begin(&ExecutionId::new(), Some("t"), Some("k")) else {
            panic!("a retry while it still runs attaches to it")
        };
        let cancelled: Answer = Arc::new(Err(Error::new(ErrorCode::Cancelled, "cancelled")));
        store.finish(&id, tx, cancelled);
        assert!(rx.borrow().is_some(), "the attached retry gets its answer");
        assert!(store.get(&id).is_none());
        // Finished and deleted: the key is free, a retry runs anew.
        assert!(matches!(
            store.begin(&ExecutionId::new(), Some("t"), Some("k")),
            Begin::Run(_)
        ));
        assert_eq!(store.bytes(Some("t")), (0, 0), "nothing kept for it");
    }

    #[test]
    fn results_are_bounded_and_keys_are_per_tenant() {
        let store = ResultStore::new(bounds(2));
        let ids: Vec<ExecutionId> = (0..3).map(|_| ExecutionId::new()).collect();
        for id in &ids {
            let Begin::Run(tx) = store.begin(id, Some("t"), None) else {
                panic!("runs")
            };
            store.finish(id, tx, output(id, 1));
        }
        assert!(
            store.get(&ids[0]).is_none(),
            "the oldest was evicted at the cap"
        );
        assert_eq!(store.get(&ids[2]).unwrap().0.as_deref(), Some("t"));
        let a = ExecutionId::new();
        assert!(matches!(
            store.begin(&a, Some("one"), Some("k")),
            Begin::Run(_)
        ));
        assert!(matches!(
            store.begin(&ExecutionId::new(), Some("two"), Some("k")),
            Begin::Run(_)
        ));
    }

    #[test]
    fn at_the_count_bound_the_heaviest_tenant_loses_its_own_and_nothing_running_goes() {
        let store = ResultStore::new(bounds(4));
        let begin = |tenant: &str| {
            let id = ExecutionId::new();
            let Begin::Run(tx) = store.begin(&id, Some(tenant), Some(&id.to_string())) else {
                panic!("a new key runs")
            };
            (id, tx)
        };
        // Alice has one running execution and one result; bob floods.
        let (alice_running, alice_tx) = begin("alice");
        let (alice_done, tx) = begin("alice");
        store.finish(&alice_done, tx, output(&alice_done, 10));
        for _ in 0..20 {
            let (id, tx) = begin("bob");
            store.finish(&id, tx, output(&id, 10));
        }
        assert!(
            store.get(&alice_running).is_some(),
            "a running execution was dropped"
        );
        assert!(
            store.get(&alice_done).is_some(),
            "alice lost a result to bob's flood"
        );
        // Her running one still records its answer, and its key still attaches.
        store.finish(&alice_running, alice_tx, output(&alice_running, 10));
        assert!(store.get(&alice_running).unwrap().1.is_some());
        assert!(matches!(
            store.begin(
                &ExecutionId::new(),
                Some("alice"),
                Some(&alice_running.to_string())
            ),
            Begin::Attach(_)
        ));
    }

    #[test]
    fn bytes_are_bounded_per_tenant_without_touching_the_others() {
        let store = ResultStore::new(Bounds {
            retention: Duration::from_secs(60),
            max: 1000,
            max_bytes: 100_000,
            max_bytes_per_tenant: 30_000,
        });
        let run = |tenant: &str, bytes: usize| {
            let id = ExecutionId::new();
            let Begin::Run(tx) = store.begin(&id, Some(tenant), None) else {
                panic!("runs")
            };
            store.finish(&id, tx, output(&id, bytes));
            id
        };
        let alice = run("alice", 10_000);
        let bobs: Vec<ExecutionId> = (0..10).map(|_| run("bob", 10_000)).collect();
        // Bob's share holds two of his results (30,000 with the overhead); his
        // oldest went, alice's stayed.
        assert!(
            store.get(&alice).is_some(),
            "another tenant's result was evicted"
        );
        assert!(store.get(&bobs[0]).is_none());
        assert!(store.get(&bobs[9]).is_some());
        let (total, bob_bytes) = store.bytes(Some("bob"));
        assert!(bob_bytes <= 30_000, "{bob_bytes}");
        assert!(total <= 100_000, "{total}");
        // One result larger than a share is kept without its output.
        let big = run("carol", 50_000);
        let (_, answer) = store.get(&big).unwrap();
        let answer = answer.unwrap();
        let r = answer.as_ref().as_ref().unwrap();
        assert!(r.stdout.is_empty());
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("max_result_bytes_per_tenant")),
            "{:?}",
            r.warnings
        );
        assert!(store.bytes(Some("carol")).1 < 30_000);
        // The total bound holds across tenants.
        for t in ["d", "e", "f", "g", "h"] {
            run(t, 25_000);
        }
        assert!(store.bytes(None).0 <= 100_000, "{}", store.bytes(None).0);
    }
}

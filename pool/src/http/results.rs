//! Results kept for a retention window, by execution id and by idempotency key.
//!
//! A key seen again while its execution runs attaches to it; seen again after, it
//! returns the first result. The program never runs twice. Bounded in count and time.

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
}

/// The store.
#[derive(Debug)]
pub(crate) struct ResultStore {
    inner: parking_lot::Mutex<Inner>,
    retention: Duration,
    max: usize,
}

impl ResultStore {
    pub(crate) fn new(retention: Duration, max: usize) -> ResultStore {
        ResultStore {
            inner: parking_lot::Mutex::new(Inner::default()),
            retention,
            max,
        }
    }

    /// Registers an execution (under `key` for `tenant`, if given).
    pub(crate) fn begin(&self, id: &ExecutionId, tenant: &str, key: Option<&str>) -> Begin {
        let mut inner = self.inner.lock();
        self.expire(&mut inner);
        let scoped = key.map(|k| (tenant.to_string(), k.to_string()));
        if let Some(scoped) = &scoped {
            if let Some(existing) = inner.keys.get(scoped).cloned() {
                if let Some(e) = inner.by_id.get(&existing) {
                    return Begin::Attach(e.done.clone());
                }
            }
        }
        while inner.order.len() >= self.max {
            Self::evict_oldest(&mut inner);
        }
        let (tx, rx) = watch::channel(None);
        inner.by_id.insert(
            id.clone(),
            Entry {
                done: rx,
                finished_at: None,
            },
        );
        if let Some(scoped) = &scoped {
            inner.keys.insert(scoped.clone(), id.clone());
        }
        inner.order.push_back((id.clone(), scoped));
        Begin::Run(tx)
    }

    /// Records the answer of an execution started with [`ResultStore::begin`].
    pub(crate) fn finish(
        &self,
        id: &ExecutionId,
        tx: watch::Sender<Option<Answer>>,
        answer: Answer,
    ) {
        let _ = tx.send(Some(answer));
        if let Some(e) = self.inner.lock().by_id.get_mut(id) {
            e.finished_at = Some(Instant::now());
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
        inner.by_id.remove(id);
        inner.keys.retain(|_, v| v != id);
    }

    /// The answer of a finished execution, `Some(None)` while it runs, `None` if unknown.
    pub(crate) fn get(&self, id: &ExecutionId) -> Option<Option<Answer>> {
        let mut inner = self.inner.lock();
        self.expire(&mut inner);
        inner.by_id.get(id).map(|e| e.done.borrow().clone())
    }

    fn expire(&self, inner: &mut Inner) {
        while let Some((id, _)) = inner.order.front() {
            let expired = inner
                .by_id
                .get(id)
                .and_then(|e| e.finished_at)
                .is_some_and(|t| t.elapsed() >= self.retention);
            let gone = !inner.by_id.contains_key(id);
            if !(expired || gone) {
                break;
            }
            Self::evict_oldest(inner);
        }
    }

    fn evict_oldest(inner: &mut Inner) {
        if let Some((id, key)) = inner.order.pop_front() {
            inner.by_id.remove(&id);
            if let Some(key) = key {
                if inner.keys.get(&key) == Some(&id) {
                    inner.keys.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::ErrorCode;

    #[test]
    fn a_forgotten_refusal_lets_the_same_key_run_again() {
        let store = ResultStore::new(Duration::from_secs(60), 10);
        let id = ExecutionId::new();
        let Begin::Run(tx) = store.begin(&id, "t", Some("k")) else {
            panic!("a new key runs")
        };
        let Begin::Attach(rx) = store.begin(&ExecutionId::new(), "t", Some("k")) else {
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
            store.begin(&ExecutionId::new(), "t", Some("k")),
            Begin::Run(_)
        ));
    }

    #[test]
    fn results_are_bounded_and_keys_are_per_tenant() {
        let store = ResultStore::new(Duration::from_secs(60), 2);
        let ids: Vec<ExecutionId> = (0..3).map(|_| ExecutionId::new()).collect();
        for id in &ids {
            assert!(matches!(store.begin(id, "t", None), Begin::Run(_)));
        }
        assert!(
            store.get(&ids[0]).is_none(),
            "the oldest was evicted at the cap"
        );
        assert!(store.get(&ids[2]).is_some());
        let a = ExecutionId::new();
        assert!(matches!(store.begin(&a, "one", Some("k")), Begin::Run(_)));
        assert!(matches!(
            store.begin(&ExecutionId::new(), "two", Some("k")),
            Begin::Run(_)
        ));
    }
}

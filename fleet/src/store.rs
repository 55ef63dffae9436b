//! Compare-and-set on execution records, with the answers a cluster in trouble can
//! give: a write that timed out may still have happened, so it is read back.

use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use paddock_core::{Error, ErrorCode, ExecutionId};

use crate::names::Names;
use crate::wire::{Phase, Record};

/// How a write to a record ended.
#[derive(Debug)]
pub(crate) enum Cas {
    /// Written: the record's new revision.
    Written(u64),
    /// Someone else wrote first: the record as it is now (`None`: deleted or
    /// expired), with its revision.
    Lost(Option<Box<(Record, u64)>>),
}

/// How long a record operation keeps retrying a cluster that does not answer (a
/// leader election takes a few seconds).
const PATIENCE: Duration = Duration::from_secs(15);

/// How a step is retried while the cluster does not answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    /// How long it is retried in all.
    pub(crate) total: Duration,
    /// How long one try may take (a client cut off from its servers may hold a
    /// request until it is back).
    pub(crate) step: Duration,
    /// The first pause between tries, doubled up to `max_pause`.
    pub(crate) pause: Duration,
    pub(crate) max_pause: Duration,
}

/// Runs `step` until it succeeds or `patience` runs out; the last error then.
pub(crate) async fn retry<T, E: std::fmt::Display, F>(
    what: &str,
    patience: Patience,
    mut step: impl FnMut() -> F,
) -> Result<T, String>
where
    F: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + patience.total;
    let mut pause = patience.pause;
    loop {
        let done = match tokio::time::timeout(patience.step, step()).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer in {:?}", patience.step)),
        };
        match done {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(what, error = %e, "a step on NATS failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(patience.max_pause);
            }
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn unavailable(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::FleetUnavailable,
        format!("the fleet's NATS cluster did not answer ({what}: {e}); retry"),
    )
    .with_retry_after_ms(1_000)
}

/// Whether a failed `create` found the key written already (the server's "wrong
/// last sequence" can reach the client as another kind of error; see
/// [`wrong_revision`]).
pub(crate) fn already_exists(e: &kv::CreateError) -> bool {
    e.kind() == kv::CreateErrorKind::AlreadyExists || e.to_string().contains("wrong last sequence")
}

/// Whether a failed `update` found another revision than the one it was given.
/// The server's "wrong last sequence" (error code 10164, a compare-and-set that
/// lost) reaches the client as `Other` as well as `WrongLastRevision`.
pub(crate) fn wrong_revision(e: &kv::UpdateError) -> bool {
    e.kind() == kv::UpdateErrorKind::WrongLastRevision
        || e.to_string().contains("wrong last sequence")
}

/// The record store: the `P_exec` bucket.
#[derive(Debug, Clone)]
pub(crate) struct Records {
    pub(crate) kv: kv::Store,
}

fn decode(entry: kv::Entry) -> Option<(Record, u64)> {
    if !matches!(entry.operation, kv::Operation::Put) {
        return None;
    }
    match serde_json::from_slice::<Record>(&entry.value) {
        Ok(r) => Some((r, entry.revision)),
        Err(e) => {
            tracing::warn!(key = %entry.key, error = %e, "an execution record does not parse; ignored");
            None
        }
    }
}

fn encode(record: &Record) -> Bytes {
    Bytes::from(serde_json::to_vec(record).unwrap_or_default())
}

impl Records {
    /// The record of `id` and its revision, retrying through a failover.
    pub(crate) async fn get(&self, id: &ExecutionId) -> Result<Option<(Record, u64)>, Error> {
        let key = Names::exec_key(id);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut pause = Duration::from_millis(20);
        loop {
            match self.kv.entry(key.clone()).await {
                Ok(e) => return Ok(e.and_then(decode)),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "reading a record; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(unavailable("reading an execution record", e)),
            }
        }
    }

    /// Creates the record of `record.id`; `Lost` with the existing one when there is
    /// one already.
    pub(crate) async fn create(&self, record: &Record) -> Result<Cas, Error> {
        let key = Names::exec_key(&record.id);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut pause = Duration::from_millis(20);
        loop {
            match self.kv.create(&key, encode(record)).await {
                Ok(rev) => return Ok(Cas::Written(rev)),
                Err(e) if already_exists(&e) => {
                    return self.settle(record).await;
                }
                Err(e) if tokio::time::Instant::now() < deadline => {
                    // It may have been written: what is there decides.
                    tracing::debug!(error = %e, "creating a record; checking");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                    if let Some((now, rev)) = self.get(&record.id).await? {
                        return Ok(if same_write(&now, record) {
                            Cas::Written(rev)
                        } else {
                            Cas::Lost(Some(Box::new((now, rev))))
                        });
                    }
                }
                Err(e) => return Err(unavailable("creating an execution record", e)),
            }
        }
    }

    /// Replaces the record at `revision` with `record`.
    ///
    /// A refused write reads what is there: the record as we meant it (a write of
    /// ours whose answer was lost) is `Written`; our own earlier write of the run
    /// (a renewal whose answer was lost) is written over at its revision; anything
    /// else is someone else's, and `Lost`.
    pub(crate) async fn update(&self, record: &Record, revision: u64) -> Result<Cas, Error> {
        let key = Names::exec_key(&record.id);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut pause = Duration::from_millis(20);
        let mut revision = revision;
        loop {
            let refused = match self.kv.update(&key, encode(record), revision).await {
                Ok(rev) => return Ok(Cas::Written(rev)),
                Err(e) if crate::store::wrong_revision(&e) => true,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "updating a record; checking");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                    false
                }
                Err(e) => return Err(unavailable("updating an execution record", e)),
            };
            match self.get(&record.id).await? {
                Some((_, rev)) if rev == revision && !refused => {} // not written: again
                Some((now, rev)) if same_write(&now, record) => return Ok(Cas::Written(rev)),
                Some((now, rev)) if ours_before(&now, record) => revision = rev,
                Some((now, rev)) => return Ok(Cas::Lost(Some(Box::new((now, rev))))),
                None => return Ok(Cas::Lost(None)),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(unavailable(
                    "updating an execution record",
                    "no answer in time",
                ));
            }
        }
    }

    /// After a refused write: whether the record already is what we wrote (a retry
    /// of a write that had gone through), or someone else's.
    async fn settle(&self, record: &Record) -> Result<Cas, Error> {
        Ok(match self.get(&record.id).await? {
            Some((now, rev)) if same_write(&now, record) => Cas::Written(rev),
            other => Cas::Lost(other.map(Box::new)),
        })
    }
}

/// Whether `now` is an earlier state of the run `ours` belongs to: the same holder,
/// incarnation, attempt and take, still running.
fn ours_before(now: &Record, ours: &Record) -> bool {
    now.node == ours.node
        && now.incarnation == ours.incarnation
        && now.attempts == ours.attempts
        && now.write == ours.write
        && now.phase == Phase::Running
}

/// Whether `now` is a record `ours` wrote: the same holder, incarnation, attempt,
/// take and phase. (Without the take, a second delivery of an order to the node
/// running it read the first's record as its own write, and ran it a second time.) The lease's end is left out: a renewal whose answer was lost (a timeout)
/// may have been written, and the next renewal, refused for its stale revision,
/// must find the record still ours rather than fence its own holder off.
fn same_write(now: &Record, ours: &Record) -> bool {
    now.node == ours.node
        && now.incarnation == ours.incarnation
        && now.attempts == ours.attempts
        && now.write == ours.write
        && now.phase == ours.phase
        && now.forgotten == ours.forgotten
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::EngineName;

    fn record(id: &ExecutionId, write: u64) -> Record {
        Record {
            id: id.clone(),
            tenant: None,
            engine: EngineName::new("subprocess").unwrap(),
            phase: Phase::Running,
            node: "n1".into(),
            incarnation: "i1".into(),
            attempts: 1,
            write,
            lease_until_ms: paddock_core::unix_ms() + 1_500,
            accepted_by: "n1".into(),
            accepted_at_ms: 0,
            forgotten: false,
            code_hash: String::new(),
            done_at_ms: 0,
            answer: None,
        }
    }

    /// Two deliveries of one order, taken by the same node: the second's create
    /// must find the first's record someone else's, not its own write (which made
    /// that node run the execution twice, the second run refused as "already
    /// running"); a retry of one's own write is still read as written.
    #[test]
    fn a_second_take_on_the_same_node_does_not_read_the_first_ones_record_as_its_own() {
        // `PADDOCK_NATS_SERVER`, else the pinned one, installed on first use.
        let Some(server) = paddock_testkit::nats_server() else {
            return;
        };
        let cluster = crate::local::LocalCluster::start(&server, 3).expect("three NATS servers");
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let client = async_nats::connect(cluster.urls()[0].as_str())
                .await
                .unwrap();
            let js = async_nats::jetstream::new(client);
            // The server's JetStream is up once it has elected itself its leader.
            let patience = Patience {
                total: Duration::from_secs(30),
                step: Duration::from_secs(5),
                pause: Duration::from_millis(100),
                max_pause: Duration::from_secs(1),
            };
            let kv = retry("creating the bucket", patience, || {
                js.create_key_value(kv::Config {
                    bucket: "records".into(),
                    history: 1,
                    ..Default::default()
                })
            })
            .await
            .expect("a bucket");
            let records = Records { kv };
            let id = ExecutionId::new();
            let first = record(&id, 1);
            let rev = match records.create(&first).await.unwrap() {
                Cas::Written(rev) => rev,
                other => panic!("the first create: {other:?}"),
            };
            // The second delivery's create.
            match records.create(&record(&id, 2)).await.unwrap() {
                Cas::Lost(Some(now)) => assert_eq!(now.0.write, 1),
                other => panic!("a second take's create must lose, not {other:?}"),
            }
            // The first delivery's own create, retried (its answer lost): written.
            match records.create(&first).await.unwrap() {
                Cas::Written(r) => assert_eq!(r, rev),
                other => panic!("a retried create of one's own record: {other:?}"),
            }
            // The first renews its lease; the second, writing at a stale revision,
            // must not take it for an earlier state of its own run.
            let mut renewed = first.clone();
            renewed.lease_until_ms += 200;
            let rev2 = match records.update(&renewed, rev).await.unwrap() {
                Cas::Written(r) => r,
                other => panic!("a renewal: {other:?}"),
            };
            let mut second = record(&id, 2);
            second.phase = Phase::Done;
            match records.update(&second, rev).await.unwrap() {
                Cas::Lost(Some(now)) => assert_eq!(now.1, rev2),
                other => panic!("a second take's update must lose, not {other:?}"),
            }
        });
    }
}

//! One node of a fleet: its connection, the streams and buckets it makes sure of,
//! and the tasks it runs (heartbeat, registry, inbox, control, one work puller per
//! engine).
//!
//! The top of the crate's modules: it makes the node's [`Context`] and each
//! concept's book (membership, orders, shares, sessions), wires them, and is the
//! only module that knows them all.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream};
use dashmap::DashMap;
use paddock_core::{unix_ms, Error, ExecutionId};
use paddock_pool::Paddock;
use tokio::sync::{watch, Semaphore};

use crate::accept::{Federated, Parts};
use crate::config::FleetConfig;
use crate::context::Context;
use crate::names::Names;
use crate::orders::{EngineSlots, Orders};
use crate::registry::{Load, Membership};
use crate::sessions::SessionBook;
use crate::shares::{ShareBook, ShareCaps};
use crate::store::Records;

/// Why a node could not join its fleet.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The configuration is not usable.
    #[error("{0}")]
    Config(Error),
    /// No NATS server of the list answered.
    #[error("connecting to the fleet's NATS servers ({urls}): {cause}")]
    Connect {
        /// The servers tried.
        urls: String,
        /// What the client said.
        cause: String,
    },
    /// The server connected to is older than the fleet supports (docs/fleet.md
    /// says what older ones lack). Nothing was set up on it.
    #[error("the fleet needs nats-server {needed} or newer, but server {server} ({urls}) runs nats-server {found}; upgrade the NATS servers (docs/fleet.md, \"Versions\")")]
    ServerTooOld {
        /// The oldest version the fleet supports.
        needed: String,
        /// The version the server gave.
        found: String,
        /// The name of the server connected to.
        server: String,
        /// The servers the node was given.
        urls: String,
    },
    /// The servers answered but JetStream refused a stream, bucket or consumer.
    #[error("setting up the fleet's {what} on NATS: {cause}")]
    Setup {
        /// What was being made.
        what: String,
        /// What the server said.
        cause: String,
    },
}

/// Where an execution stands in the fleet: [`Fleet::locate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The node holding its lease (or that held it last).
    pub node: String,
    /// Runs started so far.
    pub attempts: u32,
    /// Whether its one result is recorded.
    pub finished: bool,
}

/// A node's membership of a fleet. Dropping it does not leave: call
/// [`leave`](Self::leave).
#[derive(Debug, Clone)]
pub struct Fleet {
    pub(crate) inner: Arc<Parts>,
}

fn node_id_default() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let host = if host.is_empty() { "node".into() } else { host };
    format!("{host}-{}", std::process::id())
}

/// How long joining keeps retrying a cluster that does not answer yet (nodes that
/// start together make the same streams at once, and a cluster that just started
/// elects its leaders first).
const SETUP_PATIENCE: Duration = Duration::from_secs(60);

/// Runs a setup step until it succeeds or [`SETUP_PATIENCE`] has passed.
async fn patiently<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    step: impl FnMut() -> F,
) -> Result<T, JoinError> {
    let patience = crate::store::Patience {
        total: SETUP_PATIENCE,
        step: Duration::from_secs(10),
        pause: Duration::from_millis(100),
        max_pause: Duration::from_secs(2),
    };
    crate::store::retry(what, patience, step)
        .await
        .map_err(|e| setup(what, e))
}

/// Opens (or makes) a bucket whose reads go to its stream's leader.
///
/// The client makes every bucket with direct gets allowed, which any replica
/// answers, one that is a write behind included: a node could then miss what
/// another node wrote a moment before (a sandbox's owner, a hold given back). So
/// direct gets are turned off, and every read sees every acknowledged write.
async fn open_bucket(js: &jetstream::Context, config: kv::Config) -> Result<kv::Store, JoinError> {
    let name = config.bucket.clone();
    patiently(&name, || {
        let config = config.clone();
        let name = name.clone();
        async move {
            if let Err(first) = js.create_key_value(config).await {
                if js.get_key_value(&name).await.is_err() {
                    return Err(first.to_string());
                }
            }
            let stream = format!("KV_{name}");
            let mut info = js.get_stream(&stream).await.map_err(|e| e.to_string())?;
            let current = info.info().await.map_err(|e| e.to_string())?.config.clone();
            if current.allow_direct {
                let linear = stream::Config {
                    allow_direct: false,
                    ..current
                };
                js.update_stream(linear).await.map_err(|e| e.to_string())?;
            }
            js.get_key_value(name).await.map_err(|e| e.to_string())
        }
    })
    .await
}

fn setup(what: impl Into<String>, e: impl std::fmt::Display) -> JoinError {
    JoinError::Setup {
        what: what.into(),
        cause: e.to_string(),
    }
}

impl Fleet {
    /// Joins the fleet `config` names with `paddock` as this node's scheduler: makes
    /// sure of the fleet's streams and buckets, then starts taking work for every
    /// engine `paddock` runs, publishing this node's card, and answering the other
    /// nodes. Must be called inside a tokio runtime (its tasks run there).
    pub async fn join(paddock: Paddock, config: FleetConfig) -> Result<Fleet, JoinError> {
        config.validate().map_err(JoinError::Config)?;
        if !config.enabled() {
            return Err(JoinError::Config(Error::invalid_config(
                "fleet.urls",
                "name at least one NATS server to join a fleet",
            )));
        }
        let paddock = paddock.local();
        let node = config.node_id.clone().unwrap_or_else(node_id_default);
        let incarnation = format!("{:x}-{}", unix_ms(), std::process::id());
        let urls = config.urls.join(",");
        let mut options = async_nats::ConnectOptions::new();
        if !config.discover_servers {
            options = options.ignore_discovered_servers();
        }
        let client = options
            .name(format!("paddock {node}"))
            .connection_timeout(Duration::from_secs(5))
            .request_timeout(Some(Duration::from_secs(5)))
            .max_reconnects(None)
            .subscription_capacity(65_536)
            .connect(config.urls.as_slice())
            .await
            .map_err(|e| JoinError::Connect {
                urls: urls.clone(),
                cause: e.to_string(),
            })?;
        let info = client.server_info();
        if !crate::version::supported(&info.version) {
            return Err(JoinError::ServerTooOld {
                needed: crate::version::MINIMUM.to_string(),
                found: info.version.clone(),
                server: info.server_name.clone(),
                urls,
            });
        }
        let servers = info.connect_urls.len().max(config.urls.len()).max(1);
        let replicas = match config.replicas {
            0 => {
                if servers >= 3 {
                    3
                } else {
                    1
                }
            }
            n => n,
        };
        let js = jetstream::new(client.clone());
        let names = Names::new(&config.prefix);
        let retention = Duration::from_secs(config.retention_s);
        // Executions are renewed while they run, so a record outlives the retention
        // only while its execution does.
        let bucket = |name: String, max_age: Duration, history: i64| kv::Config {
            bucket: name,
            history,
            max_age,
            num_replicas: replicas,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        let exec = open_bucket(&js, bucket(names.exec_bucket(), retention, 1)).await?;
        let idem = open_bucket(&js, bucket(names.idem_bucket(), retention, 1)).await?;
        let node_age = Duration::from_millis((config.ack_wait_ms * 20).max(60_000));
        let nodes = open_bucket(&js, bucket(names.node_bucket(), node_age, 1)).await?;
        let sessions = open_bucket(
            &js,
            bucket(names.session_bucket(), crate::sessions::RECORD_AGE, 1),
        )
        .await?;
        // A tenant's holds live as long as what they stand for: no age limit (one
        // key per tenant, each as long as its caps allow).
        let shares = open_bucket(&js, bucket(names.shares_bucket(), Duration::ZERO, 1)).await?;
        // Counters outlive their window only by a little (a window is at most 7 days).
        let rate = open_bucket(
            &js,
            bucket(names.rate_bucket(), Duration::from_secs(15 * 86_400), 1),
        )
        .await?;
        // Longer than work may wait in a queue, so that an order queued again under
        // the same id (by a retry with its idempotency key) is always recognised.
        let dedupe = Duration::from_millis(
            (config.ack_wait_ms * 24)
                .max(120_000)
                .max(config.queue_timeout_ms + 60_000),
        );
        let audit = stream::Config {
            name: names.audit_stream(),
            subjects: vec![names.audit_all()],
            retention: stream::RetentionPolicy::Limits,
            max_age: retention,
            max_messages: 10_000_000,
            max_bytes: i64::try_from(config.max_stream_bytes).unwrap_or(i64::MAX),
            discard: stream::DiscardPolicy::Old,
            duplicate_window: dedupe.min(retention),
            num_replicas: replicas,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        patiently(&names.audit_stream(), || {
            js.get_or_create_stream(audit.clone())
        })
        .await?;

        let mut engines = Vec::new();
        for (engine, caps) in paddock.capabilities() {
            // A gateway (`take_work = false`) has no room of its own.
            let slots = if config.take_work {
                paddock.max_pool_size().max(1)
            } else {
                0
            };
            engines.push(EngineSlots {
                engine: engine.clone(),
                level: caps.max_level,
                slots,
                free: Arc::new(Semaphore::new(slots)),
                busy: Arc::new(AtomicUsize::new(0)),
            });
        }
        let (stop, _) = watch::channel(false);
        let cx = Arc::new(Context {
            max_payload: info.max_payload.max(64 << 10),
            config,
            node,
            incarnation,
            names,
            client,
            js,
            records: Records { kv: exec },
            paddock,
            stop,
            tasks: parking_lot::Mutex::new(Vec::new()),
            dedupe_ms: u64::try_from(dedupe.min(retention).as_millis()).unwrap_or(u64::MAX),
            writes: AtomicU64::new(0),
        });
        let members = Arc::new(Membership {
            cx: cx.clone(),
            cards: nodes,
            seen: parking_lot::RwLock::new(BTreeMap::new()),
            address: parking_lot::Mutex::new(None),
            started_at_ms: unix_ms(),
            card_written: AtomicU64::new(0),
            clock: std::time::Instant::now(),
        });
        let orders = Arc::new(Orders {
            cx: cx.clone(),
            idem,
            waiters: DashMap::new(),
            running: DashMap::new(),
            engines,
            taken: AtomicUsize::new(0),
        });
        let shares = Arc::new(ShareBook {
            cx: cx.clone(),
            members: members.clone(),
            store: shares,
            caps: parking_lot::Mutex::new(ShareCaps::default()),
            unreturned: parking_lot::Mutex::new(std::collections::VecDeque::new()),
            rate,
            rate_limit: parking_lot::Mutex::new(None),
        });
        let sessions = Arc::new(SessionBook {
            cx: cx.clone(),
            members: members.clone(),
            shares: shares.clone(),
            orders: orders.clone(),
            store: sessions,
            own: DashMap::new(),
            fenced: DashMap::new(),
        });
        let inner = Arc::new(Parts {
            cx,
            members,
            orders,
            sessions,
            shares,
        });
        for e in &inner.orders.engines {
            let stream_name = inner.cx.names.work_stream(&e.engine);
            let work = stream::Config {
                name: stream_name.clone(),
                subjects: vec![inner.cx.names.work_subject(&e.engine)],
                retention: stream::RetentionPolicy::WorkQueue,
                max_messages: i64::try_from(inner.cx.config.max_queued).unwrap_or(i64::MAX),
                max_bytes: i64::try_from(inner.cx.config.max_stream_bytes).unwrap_or(i64::MAX),
                discard: stream::DiscardPolicy::New,
                duplicate_window: dedupe,
                num_replicas: replicas,
                storage: stream::StorageType::File,
                ..Default::default()
            };
            let s = patiently(&stream_name, || {
                inner.cx.js.get_or_create_stream(work.clone())
            })
            .await?;
            let workers = consumer::pull::Config {
                durable_name: Some("workers".into()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: inner.cx.ack_wait(),
                // Redelivery is never given up: the record decides what a delivery
                // does, and `max_attempts` bounds the runs.
                max_deliver: -1,
                max_ack_pending: 100_000,
                max_waiting: 4_096,
                ..Default::default()
            };
            let consumer = patiently(&format!("{stream_name} consumer"), || {
                s.get_or_create_consumer::<consumer::pull::Config>("workers", workers.clone())
            })
            .await?;
            if !inner.cx.config.take_work {
                continue;
            }
            let worker = crate::worker::Worker {
                orders: inner.orders.clone(),
                sessions: inner.sessions.clone(),
                engine: e.engine.clone(),
                free: e.free.clone(),
                busy: e.busy.clone(),
                slots: e.slots,
            };
            inner.cx.spawn(worker.run(consumer));
        }
        let fleet = Fleet { inner };
        fleet.start_tasks().await?;
        Ok(fleet)
    }

    async fn start_tasks(&self) -> Result<(), JoinError> {
        let inner = &self.inner;
        let cx = &inner.cx;
        let inbox = cx
            .client
            .subscribe(cx.names.inbox(&cx.node))
            .await
            .map_err(|e| setup("the node's inbox", e))?;
        cx.spawn(crate::accept::inbox(inner.clone(), inbox));
        let own = inner
            .cx
            .client
            .subscribe(cx.names.control(&cx.node))
            .await
            .map_err(|e| setup("the node's control subject", e))?;
        cx.spawn(crate::control::serve(inner.orders.clone(), own));
        let all = inner
            .cx
            .client
            .subscribe(cx.names.broadcast())
            .await
            .map_err(|e| setup("the fleet's control subject", e))?;
        cx.spawn(crate::control::serve(inner.orders.clone(), all));
        crate::registry::publish_card(&inner.members, load(inner), false)
            .await
            .map_err(|e| setup("the node's card", e))?;
        let parts = inner.clone();
        cx.spawn(crate::registry::heartbeat(
            inner.members.clone(),
            move || load(&parts),
        ));
        cx.spawn(crate::sessions::keep(inner.sessions.clone()));
        cx.spawn(crate::sessions::fence(inner.sessions.clone()));
        let watch = inner
            .members
            .cards
            .watch_all()
            .await
            .map_err(|e| setup("the node registry", e))?;
        cx.spawn(crate::registry::follow(inner.members.clone(), watch));
        Ok(())
    }

    /// The federated facade: one-shot executions run anywhere in the fleet.
    /// Sessions opened through the facade stay on this node; the HTTP API on top
    /// of it places sandboxes by capacity and routes every call on one to its
    /// owner.
    pub fn paddock(&self) -> Paddock {
        self.inner.cx.paddock.federated(Arc::new(Federated {
            inner: self.inner.clone(),
        }))
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.inner.cx.node
    }

    /// Sets the base URL other nodes and clients reach this node's HTTP API at
    /// (`fleet.advertise` wins when set).
    pub fn advertise(&self, url: impl Into<String>) {
        let mut a = self.inner.members.address.lock();
        *a = Some(
            self.inner
                .cx
                .config
                .advertise
                .clone()
                .unwrap_or_else(|| url.into()),
        );
    }

    /// Where execution `id` stands, from its record: the node that holds (or held)
    /// it, its runs so far, and whether it is finished. `None` while it waits in a
    /// queue (or when it is unknown).
    pub async fn locate(&self, id: &ExecutionId) -> Result<Option<Located>, Error> {
        Ok(self.inner.cx.records.get(id).await?.map(|(r, _)| Located {
            node: r.node,
            attempts: r.attempts,
            finished: r.phase == crate::wire::Phase::Done,
        }))
    }

    /// Limits every tenant to `max` executions per `window_ms` across the fleet
    /// (counted when a node accepts them; exact per fixed window, see
    /// docs/fleet.md). Give every node the same limit, and leave the nodes' own
    /// `limiter.max_executions_per_window` unset: it would count again, per node and
    /// in a sliding window.
    pub fn limit_rate(&self, max: u32, window_ms: u64) {
        *self.inner.shares.rate_limit.lock() =
            (max > 0 && window_ms > 0).then_some(crate::rate::Rate { max, window_ms });
    }

    /// Counts every tenant's one-shot executions, pool slots and sandboxes over
    /// the whole fleet, against `caps` (exact; see docs/fleet.md). Give every node
    /// the same caps; the nodes' own limiters keep theirs too, which then only
    /// bite on what the fleet does not count (executions inside a sandbox).
    pub fn limit_shares(&self, caps: ShareCaps) {
        *self.inner.shares.caps.lock() = caps;
    }

    /// Executions this node runs for the fleet now.
    pub fn running(&self) -> usize {
        self.inner.orders.running.len()
    }

    /// Leaves the fleet: stops taking work, lets what runs here finish for up to
    /// `drain` (what is still running then is left to be taken over by another
    /// node once its lease runs out), publishes a last card saying so, and closes
    /// the connection.
    pub async fn leave(&self, drain: Duration) {
        let inner = &self.inner;
        let _ = inner.cx.stop.send(true);
        let deadline = tokio::time::Instant::now() + drain;
        while inner.orders.taken.load(Ordering::Acquire) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = crate::registry::publish_card(&inner.members, load(inner), true).await;
        let tasks: Vec<_> = inner.cx.tasks.lock().drain(..).collect();
        for t in tasks {
            t.abort();
        }
        let _ = inner.cx.client.flush().await;
        let _ = inner.cx.client.drain().await;
    }
}

/// What this node's card says of its load now.
fn load(inner: &Parts) -> Load {
    (
        crate::sessions::rooms(&inner.sessions),
        inner.orders.running.len(),
    )
}

//! The node registry: every node puts its card (capacity and a heartbeat) in the
//! `P_nodes` bucket each `fleet.heartbeat_ms`, and follows everyone's.
//!
//! Its book, [`Membership`], needs only the node's context; what the card says of
//! the node's load comes from the caller ([`Load`]), so that this module uses no
//! other concept (shares and sessions use it, to judge a node).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures_util::StreamExt;
use paddock_core::unix_ms;
use paddock_pool::federation::{EngineRoom, NodeHealth, NodeView};

use crate::context::Context;
use crate::store::unavailable;
use crate::wire::NodeCard;

/// A node's card as last seen.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) card: NodeCard,
}

/// The fleet's nodes as this one sees them (`P_nodes`), and this node's own card.
#[derive(Debug)]
pub(crate) struct Membership {
    /// The node this book is of.
    pub(crate) cx: Arc<Context>,
    /// The nodes' cards.
    pub(crate) cards: kv::Store,
    /// What this node last read of each node's card.
    pub(crate) seen: parking_lot::RwLock<BTreeMap<String, Seen>>,
    /// The address this node's HTTP API is reached at, once known.
    pub(crate) address: parking_lot::Mutex<Option<String>>,
    pub(crate) started_at_ms: u64,
    /// When this node's card was last written: ms since `clock` (a monotonic
    /// clock, so that a step of the wall clock neither fences nor unfences).
    pub(crate) card_written: AtomicU64,
    pub(crate) clock: std::time::Instant,
}

impl Membership {
    /// Milliseconds since this node's card was last written.
    pub(crate) fn card_silent_ms(&self) -> u64 {
        self.clock_ms()
            .saturating_sub(self.card_written.load(Ordering::Acquire))
    }

    /// Milliseconds on the monotonic clock of `card_written`.
    pub(crate) fn clock_ms(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// What this node's card says of its load: every engine's free room, and the
/// fleet's executions it runs.
pub(crate) type Load = (Vec<EngineRoom>, usize);

pub(crate) async fn publish_card(
    members: &Membership,
    (engines, running): Load,
    leaving: bool,
) -> Result<(), kv::PutError> {
    let sandboxes = match members.cx.paddock.stats().await {
        Ok(s) => s.sandboxes,
        Err(_) => 0,
    };
    let card = NodeCard {
        id: members.cx.node.clone(),
        incarnation: members.cx.incarnation.clone(),
        address: members.address.lock().clone(),
        started_at_ms: members.started_at_ms,
        at_ms: unix_ms(),
        engines,
        running,
        sandboxes,
        leaving,
    };
    let bytes = Bytes::from(serde_json::to_vec(&card).unwrap_or_default());
    members.cards.put(&members.cx.node, bytes).await?;
    members
        .card_written
        .store(members.clock_ms(), std::sync::atomic::Ordering::Release);
    // Our own card is known at once, without waiting for the watch.
    members
        .seen
        .write()
        .insert(members.cx.node.clone(), Seen { card });
    Ok(())
}

/// Puts this node's card every heartbeat until the node stops.
pub(crate) async fn heartbeat(members: Arc<Membership>, load: impl Fn() -> Load + Send) {
    let mut beats = members.cx.beats();
    while beats.next().await {
        // A client cut off from its servers may hold the write until it is back:
        // the card is written afresh at the next beat instead.
        match tokio::time::timeout(
            members.cx.heartbeat() * 5,
            publish_card(&members, load(), false),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "publishing this node's card failed"),
            Err(_) => tracing::warn!("publishing this node's card got no answer in time"),
        }
        // A card that expires from the bucket is not announced to watchers: cards
        // silent for ten ack waits (and a minute) are forgotten here.
        let forget_after = (members.cx.config.ack_wait_ms * 10).max(60_000);
        let now = unix_ms();
        members.seen.write().retain(|id, s| {
            *id == members.cx.node || now.saturating_sub(s.card.at_ms) < forget_after
        });
    }
}

/// Follows every node's card.
pub(crate) async fn follow(members: Arc<Membership>, mut watch: kv::Watch) {
    while let Some(entry) = watch.next().await {
        let Ok(entry) = entry else {
            tracing::warn!("the node registry's watch failed; following again");
            tokio::time::sleep(Duration::from_millis(500)).await;
            match members.cards.watch_all().await {
                Ok(w) => {
                    watch = w;
                    continue;
                }
                Err(_) => continue,
            }
        };
        match entry.operation {
            kv::Operation::Put => {
                if let Ok(card) = serde_json::from_slice::<NodeCard>(&entry.value) {
                    members
                        .seen
                        .write()
                        .insert(entry.key.clone(), Seen { card });
                }
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                members.seen.write().remove(&entry.key);
            }
        }
    }
}

/// A node's health from the age of its card.
pub(crate) fn health(members: &Membership, card: &NodeCard) -> (NodeHealth, u64) {
    let age = unix_ms().saturating_sub(card.at_ms);
    let h = if card.leaving || age > members.cx.config.ack_wait_ms {
        NodeHealth::Down
    } else if age > 2 * members.cx.config.heartbeat_ms {
        NodeHealth::Late
    } else {
        NodeHealth::Up
    };
    (h, age)
}

/// The nodes as `GET /v1/fleet` shows them.
pub(crate) fn views(members: &Membership, with_addresses: bool) -> Vec<NodeView> {
    let registry = members.seen.read();
    registry
        .values()
        .map(|s| {
            let (health, age) = health(members, &s.card);
            NodeView {
                id: s.card.id.clone(),
                this_node: s.card.id == members.cx.node,
                health,
                heartbeat_age_ms: age,
                started_at_ms: s.card.started_at_ms,
                engines: s.card.engines.clone(),
                running: s.card.running,
                sandboxes: s.card.sandboxes,
                address: if with_addresses {
                    s.card.address.clone()
                } else {
                    None
                },
            }
        })
        .collect()
}

/// Why node `node`, in `incarnation`, counts as lost by its `card`; `None` while it
/// is up (or late).
pub(crate) fn judge(
    members: &Membership,
    card: Option<&NodeCard>,
    incarnation: &str,
) -> Option<&'static str> {
    match card {
        None => Some("it is gone from the fleet"),
        Some(c) if c.incarnation != incarnation => Some("it restarted since"),
        Some(c) => match health(members, c).0 {
            NodeHealth::Down if c.leaving => Some("it left the fleet"),
            NodeHealth::Down => Some("its heartbeat stopped"),
            NodeHealth::Up | NodeHealth::Late => None,
        },
    }
}

/// Why node `node`, in `incarnation`, counts as lost (`None` while it is up), and
/// its card. This node's view may be stale (it just started, or is back from a
/// cut), so a loss is only declared from the card as the bucket has it, by a node
/// that is itself in touch with the fleet: `FLEET_UNAVAILABLE` otherwise.
pub(crate) async fn loss(
    members: &Membership,
    node: &str,
    incarnation: &str,
) -> Result<(Option<&'static str>, Option<NodeCard>), paddock_core::Error> {
    let card = members.seen.read().get(node).map(|s| s.card.clone());
    if judge(members, card.as_ref(), incarnation).is_none() {
        return Ok((None, card));
    }
    if members.card_silent_ms() > members.cx.config.ack_wait_ms {
        return Err(unavailable(
            "judging a node's health",
            "this node is cut off from the fleet itself",
        ));
    }
    let card = read_card(members, node).await?;
    Ok((judge(members, card.as_ref(), incarnation), card))
}

/// Node `node`'s card as the bucket has it now.
pub(crate) async fn read_card(
    members: &Membership,
    node: &str,
) -> Result<Option<NodeCard>, paddock_core::Error> {
    let read = tokio::time::timeout(Duration::from_secs(3), members.cards.entry(node)).await;
    match read {
        Ok(Ok(entry)) => Ok(entry
            .filter(|e| matches!(e.operation, kv::Operation::Put))
            .and_then(|e| serde_json::from_slice::<NodeCard>(&e.value).ok())),
        Ok(Err(e)) => Err(unavailable("reading a node's card", e)),
        Err(_) => Err(unavailable("reading a node's card", "no answer in time")),
    }
}

/// Why node `node` counts as lost by its own card (its health; whatever its
/// incarnation), or `None` while it is up.
pub(crate) fn judge_card(members: &Membership, card: Option<&NodeCard>) -> Option<&'static str> {
    let incarnation = card.map(|c| c.incarnation.as_str()).unwrap_or_default();
    judge(members, card, incarnation)
}

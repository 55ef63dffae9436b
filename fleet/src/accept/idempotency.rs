//! Idempotency keys: holding one for a request (or taking over one whose first
//! execution was never queued), or finding the first execution to attach to; and
//! which refusals are never replayed for a key.

use std::time::Duration;

use async_nats::jetstream::kv;
use paddock_core::{Error, ErrorCode, ExecutionId};
use paddock_pool::Execute;

use super::Federated;
use crate::control::ask;
use crate::names::Names;
use crate::store::unavailable;
use crate::wire::Control;

/// What an idempotency key holds.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeyEntry {
    id: ExecutionId,
    start_by_ms: u64,
}

impl Federated {
    /// Holds idempotency key `key` for this request: `None` when it now holds it
    /// (new, or taken over for a first execution that was never queued: then
    /// `msg` takes the first id, and a fresh start-by), or the first execution to
    /// attach to.
    pub(super) async fn hold_key(
        &self,
        key: &str,
        msg: &mut Execute,
        start_by_ms: u64,
        tenant: Option<&str>,
    ) -> Result<Option<(ExecutionId, u64)>, Error> {
        let inner = &self.inner;
        let k = Names::idem_key(tenant, key);
        for _ in 0..4 {
            let entry = KeyEntry {
                id: msg.order.request.id.clone(),
                start_by_ms,
            };
            let value = bytes::Bytes::from(serde_json::to_vec(&entry).unwrap_or_default());
            match inner.orders.idem.create(&k, value).await {
                Ok(_) => return Ok(None),
                Err(e) if crate::store::already_exists(&e) => {}
                Err(e) => return Err(unavailable("holding an idempotency key", e)),
            }
            let held = inner
                .orders
                .idem
                .entry(k.clone())
                .await
                .map_err(|e| unavailable("reading an idempotency key", e))?;
            let Some(held) = held.filter(|e| matches!(e.operation, kv::Operation::Put)) else {
                // Released meanwhile: take it.
                continue;
            };
            let first: KeyEntry = serde_json::from_slice(&held.value).map_err(|_| {
                unavailable(
                    "reading an idempotency key",
                    "the key is held but unreadable",
                )
            })?;
            let waited_for = inner.orders.waiters.contains_key(&first.id)
                || inner.cx.records.get(&first.id).await?.is_some()
                || ask(
                    &inner.cx,
                    inner.cx.names.broadcast(),
                    &Control::Lookup {
                        id: first.id.clone(),
                        tenant: None,
                    },
                    Duration::from_millis(250),
                )
                .await
                .is_some_and(|r| r.known);
            if waited_for {
                return Ok(Some((first.id, first.start_by_ms)));
            }
            // Not started, and no node waits for it: the node that took the key
            // died before it queued the work. Take the key over (a compare-and-set,
            // so that of two retries one does) and queue the work again under the
            // first id: the stream keeps one order per id, so if the first was
            // queued after all, this adds nothing.
            let taken = KeyEntry {
                id: first.id.clone(),
                start_by_ms,
            };
            let value = bytes::Bytes::from(serde_json::to_vec(&taken).unwrap_or_default());
            if inner
                .orders
                .idem
                .update(&k, value, held.revision)
                .await
                .is_ok()
            {
                msg.order.request.id = first.id;
                return Ok(None);
            }
        }
        Err(unavailable(
            "holding an idempotency key",
            "other requests with the same key keep changing it",
        ))
    }
}

/// A refusal a caller should retry: never replayed for an idempotency key.
pub(super) fn retryable(e: &Error) -> bool {
    matches!(
        e.code,
        ErrorCode::RateLimited
            | ErrorCode::PoolExhausted
            | ErrorCode::EngineDisposed
            | ErrorCode::FleetUnavailable
    )
}

//! Per-tenant rate limits that hold fleet-wide: a counter per tenant and fixed
//! window in the `P_rate` bucket, raised by compare-and-set when a node accepts an
//! execution. Exact: at most `max` admissions per tenant in each window of
//! `window_ms` (aligned to the Unix epoch), whichever nodes accept them. (A single
//! node's limiter counts a sliding window instead; across a window's edge the fleet
//! admits up to `2 × max` in `window_ms`.)

use async_nats::jetstream::kv;
use bytes::Bytes;
use paddock_core::{unix_ms, Error, ErrorCode};

use crate::names::tenant_token;
use crate::store::unavailable;

/// The fleet-wide rate of one tenant: `max` admissions per `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    pub(crate) max: u32,
    pub(crate) window_ms: u64,
}

/// Admits one execution of `tenant`, or answers `RATE_LIMITED` with the time to the
/// window's end. `counters` is the `P_rate` bucket.
pub(crate) async fn admit(
    counters: &kv::Store,
    rate: Rate,
    tenant: Option<&str>,
) -> Result<(), Error> {
    let now = unix_ms();
    let window = now / rate.window_ms;
    let key = format!("{}.{window}", tenant_token(tenant));
    let until_next = (window + 1) * rate.window_ms - now;
    let who = tenant.map_or_else(
        || "callers without a tenant".to_string(),
        |t| format!("tenant `{t}`"),
    );
    for _ in 0..32 {
        let entry = counters
            .entry(key.clone())
            .await
            .map_err(|e| unavailable("reading a rate counter", e))?;
        let written: Result<(), String> = match entry
            .filter(|e| matches!(e.operation, kv::Operation::Put))
        {
            None => match counters.create(&key, Bytes::from_static(b"1")).await {
                Ok(_) => return Ok(()),
                Err(e) if crate::store::already_exists(&e) => continue,
                Err(e) => Err(e.to_string()),
            },
            Some(e) => {
                let n: u32 = std::str::from_utf8(&e.value)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(u32::MAX);
                if n >= rate.max {
                    return Err(Error::new(
                        ErrorCode::RateLimited,
                        format!(
                            "{who} ran {} executions in this {} ms window of the fleet, its limit; retry in {until_next} ms",
                            rate.max, rate.window_ms
                        ),
                    )
                    .with_retry_after_ms(until_next.max(1)));
                }
                let next = Bytes::from((n + 1).to_string());
                match counters.update(&key, next, e.revision).await {
                    Ok(_) => return Ok(()),
                    Err(e) if crate::store::wrong_revision(&e) => continue,
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        if let Err(e) = written {
            return Err(unavailable("raising a rate counter", e));
        }
    }
    // Many nodes raising the same counter at once: this one gives way.
    Err(Error::new(
        ErrorCode::RateLimited,
        format!("{who} is admitted by many nodes at once; retry"),
    )
    .with_retry_after_ms(20))
}

//! Who is calling, and how much one holder may have of the listener at once: the one
//! admission gate of every surface served on it (the native API and the
//! E2B-compatible one).
//!
//! - [`caller_of`] reads a request's credential, whichever header carries it:
//!   `Authorization: Bearer <key>` or `X-API-Key: <key>`. Keys are compared in
//!   constant time. Without configured keys, the caller is the tenant the
//!   `X-Paddock-Tenant` header claims (or none).
//! - A [`RequestGate`] counts the requests in progress and the WebSockets open per
//!   [`Holder`]: a tenant, or one sandbox for those who reach its public ports
//!   without a credential. The server makes one per listener and gives it to every
//!   surface (`web::Data<RequestGate>`), so a tenant's cap is one cap whichever API
//!   its requests use. A holder at a cap is refused `RATE_LIMITED` (with a retry
//!   hint) while the others go on; each surface answers that in its own format.

use std::sync::Arc;

use actix_web::http::header::{self, HeaderMap};
use dashmap::DashMap;
use paddock_core::{Error, ErrorCode};
use subtle::ConstantTimeEq;

use super::{ApiKey, ServerConfig};
use crate::Caller;

/// How long a holder at a cap is told to wait.
const CAP_RETRY_MS: u64 = 100;

/// The caller a presented key stands for: its tenant, an operator for an `admin`
/// key, `None` for a key that is not configured. Every key is compared, in constant
/// time, with no early exit on a match.
pub fn key_caller(keys: &[ApiKey], presented: &str) -> Option<Caller> {
    let mut found = None;
    for k in keys {
        let eq: bool = k.key.as_bytes().ct_eq(presented.as_bytes()).into();
        if eq && found.is_none() {
            found = Some(k);
        }
    }
    found.map(|k| {
        if k.admin {
            Caller::Operator(k.tenant.clone())
        } else {
            Caller::tenant(k.tenant.clone())
        }
    })
}

/// The caller of a request with `headers`: with `keys` configured, the one its key
/// stands for (in `Authorization: Bearer` or `X-API-Key`), `UNAUTHORIZED` without a
/// valid one; without keys, the tenant `X-Paddock-Tenant` claims, or none.
pub fn caller_of(keys: &[ApiKey], headers: &HeaderMap) -> Result<Caller, Error> {
    if keys.is_empty() {
        return Ok(Caller::of(
            headers
                .get("x-paddock-tenant")
                .and_then(|v| v.to_str().ok())
                .filter(|t| !t.is_empty()),
        ));
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    // A request may carry both (an E2B client behind a proxy that adds a bearer, say):
    // either valid key is the caller, the bearer's first.
    [bearer, api_key]
        .into_iter()
        .flatten()
        .find_map(|presented| key_caller(keys, presented))
        .ok_or_else(|| {
            Error::new(
                ErrorCode::Unauthorized,
                "missing or wrong API key: send `Authorization: Bearer <key>` (or `X-API-Key: <key>`)",
            )
        })
}

/// Whom a place in the gate is counted for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Holder {
    /// A tenant (`None`: callers without one): its key's, or the owner of a sandbox
    /// whose token the request carried.
    Tenant(Option<String>),
    /// Anyone reaching a sandbox's public ports without a credential, counted per
    /// sandbox so that strangers cannot use up its owner's places.
    Sandbox(String),
}

impl Holder {
    /// The holder `caller`'s requests count for: its tenant (an operator's own).
    pub fn of(caller: &Caller) -> Holder {
        Holder::Tenant(match caller {
            Caller::Tenant(t) => t.clone(),
            Caller::Operator(name) => Some(name.clone()),
            Caller::Embedder => None,
        })
    }
}

/// A count per holder with a cap.
#[derive(Debug)]
struct Gauge {
    counts: DashMap<Holder, u32>,
    max: u32,
    what: &'static str,
    setting: &'static str,
}

impl Gauge {
    fn enter(self: &Arc<Self>, holder: &Holder) -> Result<Place, Error> {
        let mut n = self.counts.entry(holder.clone()).or_insert(0);
        if *n >= self.max {
            let held = *n;
            drop(n);
            let whose = match holder {
                Holder::Tenant(_) => "this tenant has",
                Holder::Sandbox(_) => "this sandbox's public ports have",
            };
            return Err(Error::new(
                ErrorCode::RateLimited,
                format!(
                    "{whose} {held} {} at once, its cap ({} = {}); wait for one to end",
                    self.what, self.setting, self.max
                ),
            )
            .with_retry_after_ms(CAP_RETRY_MS));
        }
        *n += 1;
        drop(n);
        Ok(Place {
            gauge: self.clone(),
            holder: holder.clone(),
        })
    }

    fn held(&self, holder: &Holder) -> u32 {
        self.counts.get(holder).map_or(0, |n| *n)
    }
}

/// One place in a [`RequestGate`], given back when dropped.
#[derive(Debug)]
pub struct Place {
    gauge: Arc<Gauge>,
    holder: Holder,
}

impl Drop for Place {
    fn drop(&mut self) {
        let remove = match self.gauge.counts.get_mut(&self.holder) {
            Some(mut n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => false,
        };
        if remove {
            self.gauge.counts.remove_if(&self.holder, |_, n| *n == 0);
        }
    }
}

/// Requests in progress and WebSockets open, per holder, for every surface of one
/// listener (`server.max_requests_per_tenant`, `server.max_websockets_per_tenant`).
#[derive(Debug)]
pub struct RequestGate {
    requests: Arc<Gauge>,
    websockets: Arc<Gauge>,
}

impl RequestGate {
    /// A gate with the caps of `config`.
    pub fn new(config: &ServerConfig) -> RequestGate {
        RequestGate {
            requests: Arc::new(Gauge {
                counts: DashMap::new(),
                max: config.max_requests_per_tenant,
                what: "requests in progress",
                setting: "server.max_requests_per_tenant",
            }),
            websockets: Arc::new(Gauge {
                counts: DashMap::new(),
                max: config.max_websockets_per_tenant,
                what: "WebSockets open",
                setting: "server.max_websockets_per_tenant",
            }),
        }
    }

    /// A place among `holder`'s requests in progress, or `RATE_LIMITED` at its cap.
    pub fn enter_request(&self, holder: &Holder) -> Result<Place, Error> {
        self.requests.enter(holder)
    }

    /// A place among `holder`'s open WebSockets, or `RATE_LIMITED` at its cap.
    pub fn enter_websocket(&self, holder: &Holder) -> Result<Place, Error> {
        self.websockets.enter(holder)
    }

    /// The requests `holder` has in progress now.
    pub fn requests_held(&self, holder: &Holder) -> u32 {
        self.requests.held(holder)
    }

    /// The WebSockets `holder` has open now.
    pub fn websockets_held(&self, holder: &Holder) -> u32 {
        self.websockets.held(holder)
    }

    /// The cap of requests in progress per holder.
    pub fn max_requests(&self) -> u32 {
        self.requests.max
    }

    /// The cap of open WebSockets per holder.
    pub fn max_websockets(&self) -> u32 {
        self.websockets.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn gate(max: u32) -> RequestGate {
        RequestGate::new(&ServerConfig {
            max_requests_per_tenant: max,
            max_websockets_per_tenant: max,
            ..ServerConfig::default()
        })
    }

    #[test]
    fn a_gate_caps_one_holder_and_not_the_others() {
        let g = gate(2);
        let bob = Holder::of(&Caller::tenant("bob"));
        let alice = Holder::of(&Caller::tenant("alice"));
        let a = g.enter_request(&bob).unwrap();
        let _b = g.enter_request(&bob).unwrap();
        let refused = g.enter_request(&bob).unwrap_err();
        assert_eq!(refused.code, ErrorCode::RateLimited);
        assert!(refused.retry_after_ms.is_some());
        assert!(
            refused
                .message
                .contains("server.max_requests_per_tenant = 2"),
            "{}",
            refused.message
        );
        let _c = g
            .enter_request(&alice)
            .expect("another tenant is unaffected");
        let _s = g
            .enter_request(&Holder::Sandbox("bob-s".into()))
            .expect("a sandbox's strangers are counted apart from its owner");
        let _w = g
            .enter_websocket(&bob)
            .expect("WebSockets have a count of their own");
        drop(a);
        assert_eq!(g.requests_held(&bob), 1);
        let _d = g.enter_request(&bob).expect("a place was given back");
    }

    #[test]
    fn an_operator_counts_as_its_own_tenant() {
        assert_eq!(
            Holder::of(&Caller::Operator("ops".into())),
            Holder::of(&Caller::tenant("ops"))
        );
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn either_header_carries_the_key() {
        let keys = vec![
            ApiKey::new("k-alice", "alice"),
            ApiKey {
                admin: true,
                ..ApiKey::new("k-ops", "ops")
            },
        ];
        let bearer = headers(&[("authorization", "Bearer k-alice")]);
        assert_eq!(caller_of(&keys, &bearer).unwrap(), Caller::tenant("alice"));
        let api_key = headers(&[("x-api-key", "k-ops")]);
        assert_eq!(
            caller_of(&keys, &api_key).unwrap(),
            Caller::Operator("ops".into())
        );
        let wrong_bearer = headers(&[("authorization", "Bearer nope"), ("x-api-key", "k-alice")]);
        assert_eq!(
            caller_of(&keys, &wrong_bearer).unwrap(),
            Caller::tenant("alice")
        );
        for refused in [
            headers(&[]),
            headers(&[("x-api-key", "k-alice ")]),
            headers(&[("authorization", "k-alice")]),
            headers(&[("x-paddock-tenant", "alice")]),
        ] {
            let e = caller_of(&keys, &refused).unwrap_err();
            assert_eq!(e.code, ErrorCode::Unauthorized);
        }
        // Without keys, the header's claim.
        assert_eq!(
            caller_of(&[], &headers(&[("x-paddock-tenant", "bob")])).unwrap(),
            Caller::tenant("bob")
        );
        assert_eq!(caller_of(&[], &headers(&[])).unwrap(), Caller::of(None));
    }
}

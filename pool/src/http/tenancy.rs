//! Who is calling, and how much one tenant may hold of the server at once.
//!
//! Every request is answered on behalf of a [`Caller`]: the tenant of its API key (an
//! operator for a key marked `admin`), or, without keys, the tenant its
//! `X-Paddock-Tenant` header claims. Requests in progress and open WebSockets are
//! counted per tenant; one tenant at its cap is answered 429 `RATE_LIMITED` while the
//! others go on.

use std::sync::Arc;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, ResponseError};
use dashmap::DashMap;
use paddock_core::{Error, ErrorCode, ServerConfig};
use subtle::ConstantTimeEq;

use super::{ApiError, State};
use crate::Caller;

/// How long a tenant at a cap is told to wait.
const CAP_RETRY_MS: u64 = 100;

/// The caller of a request: the API key's tenant when keys are configured (401
/// without a valid key; an operator for an `admin` key), else the tenant the
/// `X-Paddock-Tenant` header claims (or none).
pub(super) fn caller(config: &ServerConfig, req: &HttpRequest) -> Result<Caller, ApiError> {
    if config.api_keys.is_empty() {
        return Ok(Caller::of(
            req.headers()
                .get("x-paddock-tenant")
                .and_then(|v| v.to_str().ok())
                .filter(|t| !t.is_empty()),
        ));
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Compare against every key in constant time; no early exit on a match.
    let mut found = None;
    for k in &config.api_keys {
        let eq: bool = k.key.as_bytes().ct_eq(presented.as_bytes()).into();
        if eq && found.is_none() {
            found = Some(k);
        }
    }
    match found {
        Some(k) if k.admin => Ok(Caller::Operator(k.tenant.clone())),
        Some(k) => Ok(Caller::tenant(k.tenant.clone())),
        None => Err(ApiError::from(Error::new(
            ErrorCode::Unauthorized,
            "missing or wrong API key: send `Authorization: Bearer <key>`",
        ))),
    }
}

/// The tenant work created by `caller` is accounted to (an operator's own tenant).
pub(super) fn account(caller: &Caller) -> Option<String> {
    match caller {
        Caller::Tenant(t) => t.clone(),
        Caller::Operator(name) => Some(name.clone()),
        Caller::Embedder => None,
    }
}

/// The key a caller is counted under.
fn key(caller: &Caller) -> String {
    account(caller).unwrap_or_default()
}

/// A count per tenant with a cap.
#[derive(Debug)]
pub(super) struct Gauge {
    counts: DashMap<String, u32>,
    max: u32,
    what: &'static str,
    setting: &'static str,
}

/// One place in a [`Gauge`], given back when dropped.
#[derive(Debug)]
pub(super) struct Held {
    gauge: Arc<Gauge>,
    key: String,
}

impl Gauge {
    pub(super) fn new(max: u32, what: &'static str, setting: &'static str) -> Arc<Gauge> {
        Arc::new(Gauge {
            counts: DashMap::new(),
            max,
            what,
            setting,
        })
    }

    /// Takes a place for `caller`, or answers 429 `RATE_LIMITED` at its cap.
    pub(super) fn enter(self: &Arc<Self>, caller: &Caller) -> Result<Held, ApiError> {
        let key = key(caller);
        let mut n = self.counts.entry(key.clone()).or_insert(0);
        if *n >= self.max {
            let held = *n;
            drop(n);
            return Err(ApiError::from(
                Error::new(
                    ErrorCode::RateLimited,
                    format!(
                        "this tenant has {held} {} at once, its cap ({} = {}); wait for one to end",
                        self.what, self.setting, self.max
                    ),
                )
                .with_retry_after_ms(CAP_RETRY_MS),
            ));
        }
        *n += 1;
        drop(n);
        Ok(Held {
            gauge: self.clone(),
            key,
        })
    }

    /// Places held now by `caller`.
    #[cfg(test)]
    pub(super) fn held(&self, caller: &Caller) -> u32 {
        self.counts.get(&key(caller)).map_or(0, |n| *n)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let remove = match self.gauge.counts.get_mut(&self.key) {
            Some(mut n) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => false,
        };
        if remove {
            self.gauge.counts.remove_if(&self.key, |_, n| *n == 0);
        }
    }
}

/// A handler that takes a `Caller` gets the request's caller, as `caller` finds it:
/// 401 `UNAUTHORIZED` without a valid key when keys are configured.
impl actix_web::FromRequest for Caller {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Caller, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        std::future::ready(match req.app_data::<web::Data<State>>() {
            Some(state) => caller(&state.config, req),
            None => Err(ApiError::with_status(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::EngineFailed,
                "the server's state is missing from this route",
            )),
        })
    }
}

/// Middleware: counts a request against its tenant's `max_requests_per_tenant` from
/// its arrival until its response body has ended (a streamed answer or a download
/// holds its place while it streams). A request without a valid key passes through
/// to be answered 401 by its handler (before its body is read); one with a valid key
/// marks its connection as authenticated (see `connections`).
pub(super) async fn limit_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let held = match req.app_data::<web::Data<State>>() {
        Some(state) => match caller(&state.config, req.request()) {
            Ok(c) => {
                super::authenticated(req.request());
                match state.requests.enter(&c) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        let response = e.error_response();
                        return Ok(req.into_response(response));
                    }
                }
            }
            Err(_) => None,
        },
        None => None,
    };
    let response = next.call(req).await?;
    Ok(held_until_body_ends(response, held))
}

/// `response`, keeping `held` (a request's place, say) alive until its body has
/// ended or is dropped: a streamed answer holds it while it streams.
pub fn held_until_body_ends<B: MessageBody + 'static, G: Unpin + 'static>(
    response: ServiceResponse<B>,
    held: G,
) -> ServiceResponse<BoxBody> {
    response.map_body(|_, body| {
        BoxBody::new(HeldBody {
            body: BoxBody::new(body),
            _held: held,
        })
    })
}

/// A response body that keeps `G` until it ends (or is dropped).
struct HeldBody<G> {
    body: BoxBody,
    _held: G,
}

impl<G: Unpin> MessageBody for HeldBody<G> {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> actix_web::body::BodySize {
        self.body.size()
    }

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<bytes::Bytes, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_caps_one_tenant_and_not_the_others() {
        let g = Gauge::new(2, "requests in progress", "server.max_requests_per_tenant");
        let bob = Caller::tenant("bob");
        let alice = Caller::tenant("alice");
        let a = g.enter(&bob).unwrap();
        let _b = g.enter(&bob).unwrap();
        let refused = g.enter(&bob).unwrap_err();
        assert_eq!(refused.error.code, ErrorCode::RateLimited);
        assert!(refused.error.retry_after_ms.is_some());
        assert!(
            refused
                .error
                .message
                .contains("server.max_requests_per_tenant = 2"),
            "{}",
            refused.error.message
        );
        let _c = g.enter(&alice).expect("another tenant is unaffected");
        drop(a);
        assert_eq!(g.held(&bob), 1);
        let _d = g.enter(&bob).expect("a place was given back");
    }
}

//! Requests in progress per tenant (`server.max_requests_per_tenant`), counted for
//! E2B's requests as the native API counts its own: from a request's arrival until
//! its answer's body has ended (a stream holds its place while it streams). A tenant
//! at its cap is answered 429 while the others go on.
//!
//! The tenant of a control-plane request is its `X-API-Key`'s; that of a sandbox
//! agent's request with the sandbox's token, the sandbox's owner; requests to a
//! sandbox's own ports count per sandbox. Who may reach which port is
//! [`crate::access`]'s answer, on the port parsed once, as the routing sees it.
//! Requests naming no open sandbox or no port, without the credential their port
//! takes, or with no valid key, are not counted (they are answered at once, the
//! same whether the sandbox exists or not).

use std::sync::Arc;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::web;
use dashmap::DashMap;

use crate::access::Access;
use crate::registry::{tenant_of, Inner};

/// Whom a request is counted for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Who {
    /// A tenant (`None`: callers without one): its key's, or the owner of a sandbox
    /// whose token the request carried.
    Tenant(Option<String>),
    /// Anyone reaching a sandbox's public ports (or its routes without its token),
    /// counted per sandbox so that strangers cannot use up its owner's places.
    Public(String),
}

/// Requests in progress, by whom they are counted for.
#[derive(Default)]
pub(crate) struct InFlight {
    by_tenant: DashMap<Who, u32>,
}

/// A request's place among its tenant's; given back when dropped.
pub(crate) struct Held {
    flight: Arc<Inner>,
    tenant: Who,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut gone = false;
        if let Some(mut n) = self.flight.in_flight.by_tenant.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            gone = *n == 0;
        }
        if gone {
            self.flight
                .in_flight
                .by_tenant
                .remove_if(&self.tenant, |_, n| *n == 0);
        }
    }
}

/// Takes a place for `tenant`, or `None` at the cap.
fn enter(inner: &Arc<Inner>, tenant: Who) -> Option<Held> {
    let max = inner.max_requests_per_tenant;
    let mut n = inner.in_flight.by_tenant.entry(tenant.clone()).or_insert(0);
    if *n >= max {
        return None;
    }
    *n += 1;
    drop(n);
    Some(Held {
        flight: inner.clone(),
        tenant,
    })
}

/// Whom a request is counted for, when it is counted.
fn tenant(inner: &Inner, req: &ServiceRequest) -> Option<Who> {
    if let Some((id, port)) = crate::routing::target(req.head(), inner.config.domain.as_deref()) {
        let s = crate::access::live(inner, &id)?;
        return match crate::access::access(&s, port?, req.headers()) {
            Access::Agent => Some(Who::Tenant(tenant_of(&s.caller).map(String::from))),
            Access::Ports => {
                // The sandbox's traffic token is a credential: its connection leaves
                // the count of those without one, as a key's does.
                let traffic = req
                    .headers()
                    .get("e2b-traffic-access-token")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                if s.traffic_token_matches(traffic) {
                    paddock_pool::http::authenticated(req.request());
                }
                Some(Who::Public(id))
            }
            Access::Refused => None,
        };
    }
    let key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok());
    let caller = inner.caller_for_key(key)?;
    Some(Who::Tenant(tenant_of(&caller).map(String::from)))
}

/// Middleware of the E2B routes: counts each request against its tenant's cap.
pub(crate) async fn limit(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(inner) = req
        .app_data::<web::Data<Arc<Inner>>>()
        .map(|d| d.get_ref().clone())
    else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body);
    };
    let who = tenant(&inner, &req);
    if matches!(who, Some(Who::Tenant(_))) {
        // A valid key or sandbox token: the connection leaves the count of those
        // without a credential (`server.max_unauthenticated_connections`).
        paddock_pool::http::authenticated(req.request());
    }
    let held = match who {
        Some(t) => match enter(&inner, t) {
            Some(h) => Some(h),
            None => {
                let message = format!(
                    "this tenant has server.max_requests_per_tenant = {} requests in progress; retry when one has ended",
                    inner.max_requests_per_tenant
                );
                let path = req.path();
                let connect_rpc = path.starts_with("/process.Process/")
                    || path.starts_with("/filesystem.Filesystem/");
                let streamed = req
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|c| c.starts_with(crate::connect::STREAM_JSON));
                let mut answer = if connect_rpc && streamed {
                    actix_web::HttpResponse::Ok()
                        .content_type(crate::connect::STREAM_JSON)
                        .body(crate::connect::end_of_stream(Some(
                            &crate::connect::ConnectError::new(
                                crate::connect::Code::ResourceExhausted,
                                message,
                            ),
                        )))
                } else if connect_rpc {
                    crate::connect::ConnectError::new(
                        crate::connect::Code::ResourceExhausted,
                        message,
                    )
                    .unary()
                } else {
                    crate::files::http_error(StatusCode::TOO_MANY_REQUESTS, message)
                };
                answer.headers_mut().insert(
                    actix_web::http::header::RETRY_AFTER,
                    actix_web::http::header::HeaderValue::from_static("1"),
                );
                return Ok(req.into_response(answer));
            }
        },
        None => None,
    };
    let response = next.call(req).await?;
    Ok(paddock_pool::http::held_until_body_ends(response, held))
}

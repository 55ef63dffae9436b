//! Requests in progress per tenant (`server.max_requests_per_tenant`): E2B's
//! requests take their places in the listener's one
//! [`RequestGate`](paddock_pool::http::RequestGate), beside the native API's, from
//! a request's arrival until its answer's body has ended (a stream holds its place
//! while it streams). A tenant at its cap, on either API, is answered 429 (in E2B's
//! formats here) while the others go on.
//!
//! The tenant of a control-plane request is its key's (`X-API-Key`); that of a sandbox
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
use actix_web::{web, HttpMessage};
use paddock_pool::http::{Holder, RequestGate};

use crate::access::Access;
use crate::registry::{tenant_of, Inner};

/// Whom a request is counted for, when it is counted.
fn holder(inner: &Inner, req: &ServiceRequest) -> Option<Holder> {
    let addressed = crate::routing::target(req.head(), inner.config.domain.as_deref());
    if addressed.is_none() && crate::signed::is_signed(req.head()) {
        // A signed file URL that names no sandbox: the one whose token signed it.
        let (s, verdict) = crate::signed::find(inner, req.head())?;
        let access = match verdict {
            crate::signed::Verdict::Valid => Access::Agent,
            _ => Access::Expired,
        };
        req.extensions_mut().insert(crate::access::Reached {
            sbx: s.clone(),
            access,
        });
        return (access == Access::Agent)
            .then(|| Holder::Tenant(tenant_of(&s.caller).map(String::from)));
    }
    if let Some((id, port)) = addressed {
        let s = crate::access::live(inner, &id)?;
        let access = crate::access::access(&s, port?, req.head());
        req.extensions_mut().insert(crate::access::Reached {
            sbx: s.clone(),
            access,
        });
        return match access {
            Access::Agent => Some(Holder::Tenant(tenant_of(&s.caller).map(String::from))),
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
                Some(Holder::Sandbox(id))
            }
            Access::Refused | Access::Expired => None,
        };
    }
    // The control plane's key, as `admission::require_key` (outside this) found it.
    let caller = crate::admission::checked_caller(req.request())?;
    Some(Holder::of(&caller))
}

/// Middleware of the E2B routes: counts each request against its tenant's cap.
pub(crate) async fn limit(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let inner = req
        .app_data::<web::Data<Arc<Inner>>>()
        .map(|d| d.get_ref().clone());
    let gate = req
        .app_data::<web::Data<RequestGate>>()
        .map(|g| g.clone().into_inner());
    let (Some(inner), Some(gate)) = (inner, gate) else {
        // Fails closed: without the listener's gate no request could be counted.
        let answer = crate::files::http_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the E2B API is served outside Paddock's HTTP server (its request gate is missing); serve it with paddock_pool::http::start_with",
        );
        return Ok(req.into_response(answer));
    };
    let who = holder(&inner, &req);
    if matches!(who, Some(Holder::Tenant(_))) {
        // A valid key or sandbox token: the connection leaves the count of those
        // without a credential (`server.max_unauthenticated_connections`).
        paddock_pool::http::authenticated(req.request());
    }
    let held = match who {
        Some(t) => match gate.enter_request(&t) {
            Ok(h) => Some(h),
            Err(refused) => {
                let message = refused.message;
                let path = req.path();
                let connect_rpc = crate::table::is_rpc_path(path);
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

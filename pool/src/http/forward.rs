//! Calls on a sandbox that lives on another node of a fleet: the native routes ask
//! the fleet where the sandbox lives, and hand a call on another node's sandbox to
//! the fleet's [`HttpForwarder`], which sends it to the owner's HTTP API and streams
//! its answer back (and relays a WebSocket message by message), so a client may use
//! any node for any sandbox and never needs to reach the owner itself. How it is
//! sent is the fleet's (`paddock-fleet`); which calls go, and with what place in the
//! listener's gate, is this surface's.
//!
//! The forwarded request carries the caller's own credentials: the owner
//! authenticates it again and applies its own walls, and the accepting node has
//! already answered `NOT_FOUND` for a sandbox the caller may not see. It also
//! carries [`FORWARDED_HEADER`] (the forwarding node's id), and a request with that
//! header is answered by the node it reaches, without routing it again.

use std::time::Duration;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use paddock_core::{Error, ErrorCode};

use super::gate::Place;
use super::interactive::is_upgrade;
use super::tenancy::caller;
use super::{ApiError, State};
use crate::federation::SessionPlace;
use crate::Caller;

/// Set on a request one node forwards to another: the forwarding node's id. The
/// node it reaches answers it itself.
pub const FORWARDED_HEADER: &str = "x-paddock-forwarded";

/// Whether a request was forwarded here by another node.
pub(super) fn forwarded(req: &HttpRequest) -> bool {
    req.headers().contains_key(FORWARDED_HEADER)
}

/// The sandbox id of a path under `/v1/sandboxes/{id}`.
fn sandbox_in(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// Middleware: a call on a sandbox another node owns goes to that node; one whose
/// owner is lost is answered here. Everything else (no fleet, no sandbox in the
/// path, a caller the handlers will refuse) goes on to the handlers here, and so
/// does a forwarded call unless this node itself ended the sandbox it names.
pub(super) async fn route_sessions(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(state) = req.app_data::<web::Data<State>>().cloned() else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body);
    };
    let forwarded = forwarded(req.request());
    let routed = match (state.paddock.federation(), sandbox_in(req.path())) {
        (Some(f), Some(id)) => match caller(&state.config, req.request()) {
            Ok(c) => Some((f.clone(), c, id.to_string())),
            // Refused by the handler, with its own answer.
            Err(_) => None,
        },
        _ => None,
    };
    let Some((federation, caller, id)) = routed else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body);
    };
    match federation.session_owner(&caller, &id, forwarded).await {
        Ok(SessionPlace::Here) => next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body),
        // A forwarded call is never sent on again.
        Ok(SessionPlace::Node { .. }) if forwarded => next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body),
        Ok(SessionPlace::Node { id: node, address }) => {
            let payload = req.extract::<web::Payload>().await?;
            let (http, _) = req.into_parts();
            let response = forward_to(
                &state,
                &caller,
                &http,
                Body::Stream(payload),
                &node,
                &address,
            )
            .await
            .unwrap_or_else(|e| ApiError::from(e.error).error_response());
            Ok(ServiceResponse::new(http, response))
        }
        Err(e) => Ok(req.into_response(ApiError::from(e).error_response())),
    }
}

/// A request body to forward.
pub enum Body {
    /// Still to be read from the client.
    Stream(web::Payload),
    /// Read already (a handler that looked at it first).
    Read(Bytes),
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Body::Stream(_) => f.write_str("Body::Stream"),
            Body::Read(b) => write!(f, "Body::Read({} bytes)", b.len()),
        }
    }
}

/// A call to hand to the node that owns its sandbox.
pub struct Forward<'a> {
    /// The request, as the client sent it (its credentials go with it: the owner
    /// authenticates it again and applies its own walls).
    pub req: &'a HttpRequest,
    /// Its body.
    pub body: Body,
    /// The owner's node id.
    pub node: &'a str,
    /// The owner's HTTP address (`http://host:port`).
    pub address: &'a str,
    /// This node's id, for [`FORWARDED_HEADER`].
    pub from: String,
    /// Resolves once the fleet counts the owner lost, with why: a call on an owner
    /// that stops answering without closing its connections ends then.
    pub lost: BoxFuture<'static, String>,
    /// For a WebSocket, the caller's place among its open WebSockets in the
    /// listener's gate, held until the relayed socket closes.
    pub websocket: Option<Place>,
    /// How long a closing connection waits for its client (`server.close_linger_ms`).
    pub close_linger: Duration,
}

impl std::fmt::Debug for Forward<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forward")
            .field("path", &self.req.path())
            .field("body", &self.body)
            .field("node", &self.node)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// A forwarded call that got no answer.
#[derive(Debug)]
pub struct Unanswered {
    /// What the caller is answered.
    pub error: Error,
    /// Whether the request may have reached the owner (it was sent, or the
    /// connection broke after it connected); `false` only when no connection was
    /// made.
    pub sent: bool,
}

/// How the HTTP surface reaches the node that owns a sandbox: the fleet's, given by
/// [`Federation::http_forwarder`](crate::federation::Federation::http_forwarder).
#[async_trait::async_trait(?Send)]
pub trait HttpForwarder: Send + Sync + std::fmt::Debug {
    /// Sends `call` to its owner and streams the owner's answer back (or relays a
    /// WebSocket the owner took).
    async fn forward(&self, call: Forward<'_>) -> Result<HttpResponse, Unanswered>;
}

/// A call on a sandbox another node owns: handed to the fleet's forwarder, with the
/// caller's WebSocket place taken here first.
pub(super) async fn forward_to(
    state: &State,
    caller: &Caller,
    req: &HttpRequest,
    body: Body,
    node: &str,
    address: &str,
) -> Result<HttpResponse, Unanswered> {
    let not_sent = |error: Error| Unanswered { error, sent: false };
    let Some(federation) = state.paddock.federation().cloned() else {
        return Err(not_sent(Error::new(
            ErrorCode::FleetUnavailable,
            "this node is in no fleet: nothing can be forwarded",
        )));
    };
    let Some(forwarder) = federation.http_forwarder() else {
        return Err(not_sent(Error::new(
            ErrorCode::FleetUnavailable,
            format!("the sandbox is on node `{node}`, and this node's fleet forwards no calls"),
        )));
    };
    let websocket = if is_upgrade(req) {
        Some(
            state
                .gate
                .enter_websocket(&super::gate::Holder::of(caller))
                .map_err(not_sent)?,
        )
    } else {
        None
    };
    let lost: BoxFuture<'static, String> = {
        let node = node.to_string();
        let federation = federation.clone();
        Box::pin(async move { federation.node_lost(&node).await })
    };
    forwarder
        .forward(Forward {
            req,
            body,
            node,
            address,
            from: federation.node_id(),
            lost,
            websocket,
            close_linger: state.close_linger(),
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::sandbox_in;

    #[test]
    fn the_sandbox_of_a_path() {
        assert_eq!(sandbox_in("/v1/sandboxes/abc"), Some("abc"));
        assert_eq!(sandbox_in("/v1/sandboxes/abc/files/x/y"), Some("abc"));
        assert_eq!(sandbox_in("/v1/sandboxes/"), None);
        assert_eq!(sandbox_in("/v1/sandboxes"), None);
        assert_eq!(sandbox_in("/v1/executions/abc"), None);
    }
}

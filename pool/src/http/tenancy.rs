//! Who is calling, for the native routes, and their place in the listener's
//! [`RequestGate`](super::gate::RequestGate).
//!
//! Every request is answered on behalf of a [`Caller`], read by
//! [`caller_of`](super::gate::caller_of) from whichever header carries its key.
//! Requests in progress and open WebSockets are counted per tenant in the one gate
//! every surface of the listener shares; one tenant at its cap is answered 429
//! `RATE_LIMITED` while the others go on.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, ResponseError};
use paddock_core::ErrorCode;

use super::ServerConfig;
use super::gate::{caller_of, Holder};
use super::{ApiError, State};
use crate::Caller;

/// The caller of a native request (see [`caller_of`]).
pub(super) fn caller(config: &ServerConfig, req: &HttpRequest) -> Result<Caller, ApiError> {
    caller_of(&config.api_keys, req.headers()).map_err(ApiError::from)
}

/// The tenant work created by `caller` is accounted to (an operator's own tenant).
pub(super) fn account(caller: &Caller) -> Option<String> {
    match Holder::of(caller) {
        Holder::Tenant(t) => t,
        Holder::Sandbox(_) => None,
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
                match state.gate.enter_request(&Holder::of(&c)) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        let response = ApiError::from(e).error_response();
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

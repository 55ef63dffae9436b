//! What an E2B request must show before any byte of its body is read, and which
//! bodies may stay open.
//!
//! - The control plane's routes check `X-API-Key` in [`require_key`], ahead of every
//!   handler and extractor: a missing or wrong key is answered 401 at once, and the
//!   body of such a request is never read. A valid key marks the connection as
//!   authenticated (it leaves `server.max_unauthenticated_connections`), and the
//!   caller it stands for is kept in the request for the handlers.
//! - Every body is read within `server.body_read_timeout_ms` between two pieces
//!   (the native server's clock), except the agent's Connect client streams
//!   (`process.Process/StreamInput` in `application/connect+json`), whose client
//!   sends stdin whenever it has some: [`untime_client_streams`] lifts the clock for
//!   them. They are reached only with the sandbox's access token, and counted
//!   against the tenant's requests while they last.

use std::sync::Arc;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, HttpRequest};
use paddock_pool::Caller;

use crate::control::ApiError;
use crate::registry::Inner;

/// The caller whose `X-API-Key` [`require_key`] checked, kept in the request.
#[derive(Debug, Clone)]
struct CheckedKey(Caller);

/// The caller [`require_key`] found for `req`, if it ran.
pub(crate) fn checked_caller(req: &HttpRequest) -> Option<Caller> {
    req.extensions().get::<CheckedKey>().map(|c| c.0.clone())
}

/// The control plane's answer to a request without a valid key.
pub(crate) fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong API key: send one of the server's API keys in X-API-Key (E2B_API_KEY)",
    )
}

/// Middleware of the control plane: a request without a valid `X-API-Key` is
/// answered 401 before anything reads its body; one with a valid key goes on, its
/// caller kept for the handlers and its connection marked as authenticated.
pub(crate) async fn require_key(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(inner) = req
        .app_data::<web::Data<Arc<Inner>>>()
        .map(|d| d.get_ref().clone())
    else {
        // Fails closed: without its state the surface cannot check a key.
        let answer = ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the E2B API's state is missing from this route",
        );
        return Ok(req.into_response(answer.response()));
    };
    let Some(caller) = inner.caller(req.headers()) else {
        return Ok(req.into_response(unauthorized().response()));
    };
    paddock_pool::http::authenticated(req.request());
    req.extensions_mut().insert(CheckedKey(caller));
    next.call(req)
        .await
        .map(ServiceResponse::map_into_boxed_body)
}

/// Whether `req` is a Connect client stream of the sandbox agent: stdin sent to a
/// process for as long as the client likes.
fn is_client_stream(req: &ServiceRequest) -> bool {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    req.method() == Method::POST
        && req.path() == "/process.Process/StreamInput"
        && content_type.eq_ignore_ascii_case(crate::connect::STREAM_JSON)
}

/// Middleware of the sandbox routes: lifts the body read timeout of Connect client
/// streams, which are long-lived by design.
pub(crate) async fn untime_client_streams(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    if is_client_stream(&req) {
        paddock_pool::http::lift_body_timeout(req.request());
    }
    next.call(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn only_the_agents_client_streams_are_untimed() {
        let stream = |method: Method, path: &str, ctype: &str| {
            is_client_stream(
                &TestRequest::default()
                    .method(method)
                    .uri(path)
                    .insert_header((header::CONTENT_TYPE, ctype))
                    .to_srv_request(),
            )
        };
        let path = "/process.Process/StreamInput";
        assert!(stream(Method::POST, path, "application/connect+json"));
        assert!(stream(
            Method::POST,
            path,
            "Application/Connect+JSON; charset=utf-8"
        ));
        assert!(!stream(Method::POST, path, "application/json"));
        assert!(!stream(Method::GET, path, "application/connect+json"));
        assert!(!stream(
            Method::POST,
            "/process.Process/Start",
            "application/connect+json"
        ));
    }
}

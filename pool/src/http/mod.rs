//! The HTTP API (`paddock serve`): JSON over actix-web, on top of the [`Paddock`](crate::Paddock)
//! handle. See `docs/http-api.md` for every route.
//!
//! [`start`] runs the server on its own thread (its own actix system) and returns the
//! bound address; [`HttpServerHandle::stop`] stops it gracefully.

mod answers;
mod body;
mod chunks;
mod closing;
mod config;
mod connections;
mod deadline;
mod errors;
mod executions;
mod forward;
mod gate;
mod interactive;
mod openapi;
mod operations;
mod results;
mod routes;
mod sandboxes;
mod server;
mod tenancy;

use std::sync::atomic::Ordering;

use actix_web::http::StatusCode;
use actix_web::web;
use paddock_core::{Error, ErrorCode};

pub use body::{upload_source, UploadFeed};
pub use closing::{client_gone, wake_at_end};
pub use config::{ApiKey, MetricsAccess, ServerConfig, TlsConfig};
pub use connections::authenticated;
pub use deadline::{is_body_timeout, lift_body_timeout};
pub use errors::{status_for, ApiError};
pub use forward::{Body as ForwardBody, Forward, HttpForwarder, Unanswered, FORWARDED_HEADER};
pub use gate::{caller_of, key_caller, Holder, Place, RequestGate};
pub use interactive::{is_upgrade, MAX_WS_MESSAGE};
pub use tenancy::held_until_body_ends;

/// Every route the server answers, as `(method, path pattern)` (`{id}`, `{path}`,
/// `{process}` and `{port}` stand for path parameters): the table
/// `/v1/openapi.json` is made from, so tests can walk every route, including ones
/// added later.
pub fn route_table() -> impl Iterator<Item = (&'static str, &'static str)> {
    openapi::ROUTES.iter().map(|r| (r.method, r.path))
}

type Shared = web::Data<State>;

fn admitting(state: &State) -> Result<(), ApiError> {
    if state.draining.load(Ordering::Acquire) {
        return Err(ApiError::with_status(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::EngineDisposed,
            "the server is shutting down; retry on another instance",
        ));
    }
    Ok(())
}

/// An error from Paddock. While the server drains, Paddock refuses new work with
/// `ENGINE_DISPOSED` (it is shutting down): a request admitted just before the drain
/// began gets the same 503 as those after it, not the 409 of a destroyed sandbox.
fn refusal(state: &State, error: Error) -> ApiError {
    if error.code == ErrorCode::EngineDisposed && state.draining.load(Ordering::Acquire) {
        return ApiError {
            error,
            status: Some(StatusCode::SERVICE_UNAVAILABLE),
            allow: None,
        };
    }
    ApiError::from(error)
}

use body::parse_body;
use sandboxes::sandbox_access;
use server::State;
pub use server::{start, start_with, Extension, HttpServerHandle};

//! Reading request bodies, bounded.

use actix_web::http::StatusCode;
use actix_web::web;
use paddock_core::{Error, ErrorCode};
use serde::Deserialize;

use super::server::*;
use super::*;

/// The query of the routes that run a program.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(super) struct StreamQuery {
    /// Answer NDJSON lines as the program runs (`started`, `stdout`/`stderr`, then
    /// `result` or `error`) instead of one JSON result.
    #[serde(default)]
    pub(super) stream: bool,
}

/// Reads a body up to `limit` bytes (413 beyond it).
pub(super) async fn read_body(
    mut payload: web::Payload,
    limit: usize,
    what: &str,
) -> Result<Vec<u8>, ApiError> {
    use futures_util::StreamExt;
    let mut data = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| Error::invalid_options("body", e.to_string()))?;
        if data.len() + chunk.len() > limit {
            return Err(ApiError::with_status(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::InvalidOptions,
                format!("the {what} exceeds {limit} bytes"),
            ));
        }
        data.extend_from_slice(&chunk);
    }
    Ok(data)
}

pub(super) async fn parse_body<T: serde::de::DeserializeOwned>(
    state: &State,
    payload: web::Payload,
) -> Result<T, ApiError> {
    let body = read_body(
        payload,
        state.config.max_body_bytes,
        "request body (server.max_body_bytes)",
    )
    .await?;
    Ok(paddock_core::api::parse_body(&body)?)
}

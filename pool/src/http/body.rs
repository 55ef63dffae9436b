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

/// Reads a body up to `limit` bytes (413 beyond it; 408 `TIMEOUT` when it stalls past
/// `server.body_read_timeout_ms`).
pub(super) async fn read_body(
    mut payload: web::Payload,
    limit: usize,
    what: &str,
) -> Result<Vec<u8>, ApiError> {
    use futures_util::StreamExt;
    let mut data = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| payload_error(&e))?;
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

/// The answer to a body that could not be read: 408 `TIMEOUT` for one that stalled
/// past `server.body_read_timeout_ms`, 400 `INVALID_OPTIONS` otherwise.
pub(super) fn payload_error(e: &actix_web::error::PayloadError) -> ApiError {
    if super::is_body_timeout(e) {
        return ApiError::with_status(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::Timeout,
            e.to_string(),
        );
    }
    ApiError::from(Error::invalid_options("body", e.to_string()))
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

/// The feeding end of [`upload_source`].
#[derive(Debug)]
pub struct UploadFeed {
    tx: tokio::sync::mpsc::Sender<std::io::Result<Option<bytes::Bytes>>>,
}

impl UploadFeed {
    /// Passes on a chunk; `false` once the reader has stopped (done or refused).
    pub async fn send(&self, chunk: bytes::Bytes) -> bool {
        self.tx.send(Ok(Some(chunk))).await.is_ok()
    }

    /// Ends the upload with an error the reader sees.
    pub async fn fail(self, error: std::io::Error) {
        let _ = self.tx.send(Err(error)).await;
    }

    /// Ends the upload whole.
    pub async fn finish(self) {
        let _ = self.tx.send(Ok(None)).await;
    }
}

/// A [`ByteSource`](paddock_core::ByteSource) fed through a channel of `capacity`
/// chunks (an upload holds that much memory, whatever its size). Only
/// [`UploadFeed::finish`] ends it as whole: a feed dropped without it (the request
/// went away midway) ends it with an error, so that no truncated file is kept as if
/// it were the upload.
pub fn upload_source(capacity: usize) -> (UploadFeed, paddock_core::ByteSource) {
    let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
    let chunks = futures_util::stream::unfold((rx, false), |(mut rx, done)| async move {
        if done {
            return None;
        }
        match rx.recv().await {
            Some(Ok(Some(c))) => Some((Ok(c), (rx, false))),
            Some(Ok(None)) => None,
            Some(Err(e)) => Some((Err(e), (rx, true))),
            None => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the upload ended before its body did",
                )),
                (rx, true),
            )),
        }
    });
    (
        UploadFeed { tx },
        Box::pin(tokio_util::io::StreamReader::new(chunks)),
    )
}

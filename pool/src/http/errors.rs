//! Errors on the wire: `{"error":{"code":"…","message":"…"}}` with a status per code.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use paddock_core::{Error, ErrorCode};

/// An error answered over HTTP.
#[derive(Debug)]
pub struct ApiError {
    /// The error.
    pub error: Error,
    /// Overrides the status chosen from the code.
    pub status: Option<StatusCode>,
    /// The `Allow` header of a 405.
    pub allow: Option<String>,
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        ApiError {
            error,
            status: None,
            allow: None,
        }
    }
}

impl ApiError {
    /// An error with an explicit status.
    pub fn with_status(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            error: Error::new(code, message),
            status: Some(status),
            allow: None,
        }
    }

    /// With an `Allow` header (for 405).
    pub fn with_allow(mut self, methods: String) -> Self {
        self.allow = Some(methods);
        self
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// The status for an error code.
pub fn status_for(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorCode::EngineDisposed | ErrorCode::SandboxPaused => StatusCode::CONFLICT,
        ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::PoolExhausted | ErrorCode::FleetUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::EngineFailed | ErrorCode::WorkerFailed | ErrorCode::InvalidConfig => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        ErrorCode::Timeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorCode::NodeLost => StatusCode::BAD_GATEWAY,
        ErrorCode::StreamClosed => StatusCode::GONE,
        _ => StatusCode::BAD_REQUEST,
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status.unwrap_or_else(|| status_for(self.error.code))
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status_code());
        if let Some(allow) = &self.allow {
            res.insert_header((header::ALLOW, allow.clone()));
        }
        if let Some(ms) = self.error.retry_after_ms {
            res.insert_header((header::RETRY_AFTER, ms.div_ceil(1000).max(1).to_string()));
        }
        res.json(super::answers::ErrorBody { error: &self.error })
    }
}

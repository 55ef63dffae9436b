//! Every error the E2B-compatible surface answers, and how each of Paddock's error
//! codes maps to it, in one place: the control plane's `{"code": <status>,
//! "message"}` ([`ApiError`]), the agent's plain HTTP routes' (same shape,
//! [`http_error`]) and the Connect services' `{"code": "<snake_case>", "message"}`
//! ([`ConnectError`]).

use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use paddock_core::{Error, ErrorCode};
use serde_json::json;

/// An answer of the control plane that is not a success.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn not_found(id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
        )
    }

    pub(crate) fn response(&self) -> HttpResponse {
        HttpResponse::build(self.status).json(json!({
            "code": self.status.as_u16(),
            "message": self.message,
        }))
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let status = match e.code {
            ErrorCode::NotFound | ErrorCode::EngineDisposed => StatusCode::NOT_FOUND,
            ErrorCode::RateLimited | ErrorCode::PoolExhausted => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::InvalidOptions
            | ErrorCode::InvalidConfig
            | ErrorCode::LevelNotSupported
            | ErrorCode::CapabilityNotSupported
            | ErrorCode::PathEscape => StatusCode::BAD_REQUEST,
            ErrorCode::SandboxPaused => StatusCode::CONFLICT,
            ErrorCode::NodeLost | ErrorCode::FleetUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, format!("{}: {}", e.code.as_str(), e.message))
    }
}

/// An error of the agent's plain HTTP routes: a status and `{"code", "message"}`.
pub(crate) fn http_error(status: StatusCode, message: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(json!({ "code": status.as_u16(), "message": message.into() }))
}

/// What E2B's proxy answers for a sandbox it cannot reach (not found, paused, or a
/// port nothing listens on): 502 `{"code": 502, "message", "sandboxId"}`, the
/// message E2B's own, and Paddock's `hint` of what to do beside it.
pub(crate) fn proxy_error(id: &str, message: &str, hint: String) -> HttpResponse {
    HttpResponse::build(StatusCode::BAD_GATEWAY).json(json!({
        "code": 502,
        "message": message,
        "sandboxId": id,
        "hint": hint,
    }))
}

/// An error of Paddock as the agent's plain HTTP routes answer it.
pub(crate) fn http_from(e: paddock_core::Error) -> HttpResponse {
    use paddock_core::ErrorCode as C;
    let status = match e.code {
        C::NotFound => StatusCode::NOT_FOUND,
        C::InvalidOptions | C::PathEscape => StatusCode::BAD_REQUEST,
        C::LimitsExceeded => StatusCode::PAYLOAD_TOO_LARGE,
        C::RateLimited | C::PoolExhausted => StatusCode::TOO_MANY_REQUESTS,
        C::EngineDisposed => StatusCode::NOT_FOUND,
        C::SandboxPaused => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    http_error(status, format!("{}: {}", e.code.as_str(), e.message))
}

/// Connect's error codes (the ones Paddock answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    Canceled,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
}

impl Code {
    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
        }
    }

    /// The HTTP status of a unary answer with this code (Connect's table).
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// An error answered in Connect's form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectError {
    pub(crate) code: Code,
    pub(crate) message: String,
}

impl ConnectError {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::InvalidArgument, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::NotFound, message)
    }

    /// The JSON of the error: `{"code", "message"}`.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }

    /// A unary answer: the code's status and the error's JSON.
    pub(crate) fn unary(&self) -> HttpResponse {
        self.unary_with(self.code.status())
    }

    /// A unary answer with another status than the code's own (the 502 of a proxy
    /// that found no sandbox).
    pub(crate) fn unary_with(&self, status: StatusCode) -> HttpResponse {
        HttpResponse::build(status)
            .content_type("application/json")
            .body(self.json().to_string())
    }
}

impl From<Error> for ConnectError {
    fn from(e: Error) -> ConnectError {
        let code = match e.code {
            ErrorCode::NotFound => Code::NotFound,
            ErrorCode::InvalidOptions
            | ErrorCode::InvalidModule
            | ErrorCode::PathEscape
            | ErrorCode::CodeTooLong
            | ErrorCode::CodeBlocked
            | ErrorCode::BlockedModule => Code::InvalidArgument,
            ErrorCode::RateLimited | ErrorCode::PoolExhausted => Code::ResourceExhausted,
            ErrorCode::Timeout => Code::DeadlineExceeded,
            ErrorCode::Cancelled => Code::Canceled,
            ErrorCode::CapabilityNotSupported => Code::Unimplemented,
            ErrorCode::SandboxPaused => Code::Unavailable,
            ErrorCode::EngineDisposed => Code::NotFound,
            ErrorCode::LimitsExceeded | ErrorCode::MemoryExceeded => Code::ResourceExhausted,
            ErrorCode::LevelNotSupported => Code::FailedPrecondition,
            ErrorCode::NodeLost | ErrorCode::FleetUnavailable => Code::Unavailable,
            _ => Code::Internal,
        };
        ConnectError::new(code, format!("{}: {}", e.code.as_str(), e.message))
    }
}

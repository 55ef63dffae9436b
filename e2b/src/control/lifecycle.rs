//! What is done to one sandbox: finding it, killing it, extending its lifetime,
//! pausing it, and resuming or connecting to it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::{created, described, mine, parse, read_body, Answer, ApiError};
use crate::registry::Inner;

pub(crate) async fn get(
    inner: web::Data<Arc<Inner>>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let run = || -> Answer {
        let s = mine(&inner, &req, &id)?;
        Ok(HttpResponse::Ok().json(described(&inner, &s, Some(&req))))
    };
    run().unwrap_or_else(|e| e.response())
}

pub(crate) async fn kill(
    inner: web::Data<Arc<Inner>>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let run = async {
        mine(&inner, &req, &id)?;
        if inner.end(&id).await {
            Ok(HttpResponse::NoContent().finish())
        } else {
            Err(ApiError::not_found(&id))
        }
    };
    run.await.unwrap_or_else(|e: ApiError| e.response())
}

#[derive(Debug, Default, Deserialize)]
struct Timeout {
    timeout: Option<u64>,
}

pub(crate) async fn set_timeout(
    inner: web::Data<Arc<Inner>>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> HttpResponse {
    let run = async {
        let s = mine(&inner, &req, &id)?;
        let t: Timeout = parse(&read_body(payload).await?)?;
        let Some(secs) = t.timeout else {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "give `timeout`, the sandbox's remaining lifetime in seconds",
            ));
        };
        *s.end_at.lock() = inner.ends(Some(secs));
        Ok(HttpResponse::NoContent().finish())
    };
    run.await.unwrap_or_else(|e: ApiError| e.response())
}

pub(crate) async fn pause(
    inner: web::Data<Arc<Inner>>,
    req: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let run = async {
        let s = mine(&inner, &req, &id)?;
        if s.paused.load(Ordering::Acquire) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("sandbox \"{id}\" is already paused"),
            ));
        }
        s.handle.pause().await?;
        s.paused.store(true, Ordering::Release);
        // Kept paused for e2b.max_timeout_s at most, then ended.
        *s.end_at.lock() = inner.ends(Some(inner.config.max_timeout_s));
        Ok(HttpResponse::NoContent().finish())
    };
    run.await.unwrap_or_else(|e: ApiError| e.response())
}

/// `POST /sandboxes/{id}/connect` (and `/v2/…`, and the older `/resume`): resumes a
/// paused sandbox (201) or answers a running one (200), and extends its lifetime to
/// at least `timeout` from now.
pub(crate) async fn connect(
    inner: web::Data<Arc<Inner>>,
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
) -> HttpResponse {
    let run = async {
        let s = mine(&inner, &req, &id)?;
        let t: Timeout = parse(&read_body(payload).await?)?;
        let resumed = if s.paused.load(Ordering::Acquire) {
            s.handle.unpause().await?;
            s.paused.store(false, Ordering::Release);
            true
        } else {
            false
        };
        if resumed {
            *s.end_at.lock() = inner.ends(t.timeout);
        } else if let Some(secs) = t.timeout {
            let want = inner.ends(Some(secs));
            let mut end = s.end_at.lock();
            if *end < want {
                *end = want;
            }
        }
        let body = created(&inner, &s, &req);
        Ok(if resumed {
            HttpResponse::Created().json(body)
        } else {
            HttpResponse::Ok().json(body)
        })
    };
    run.await.unwrap_or_else(|e: ApiError| e.response())
}

//! The templates this server opens sandboxes from, as E2B's template API names
//! them. They are the server's configuration (`[templates.NAME]` and the built-in
//! ones), the same for every tenant: a key sees them all and owns none.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::{caller, ApiError};
use crate::registry::Inner;

/// `GET /templates/aliases/{alias}`: the template of that name (`Template.exists`),
/// or E2B's 404.
pub(crate) async fn alias(
    inner: web::Data<Arc<Inner>>,
    req: HttpRequest,
    alias: web::Path<String>,
) -> HttpResponse {
    let run = || -> Result<HttpResponse, ApiError> {
        caller(&inner, &req)?;
        if inner.templates.contains_key(alias.as_str()) {
            Ok(HttpResponse::Ok().json(json!({"templateID": alias.as_str(), "public": true})))
        } else {
            Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("template alias {:?} is not configured here", alias.as_str()),
            ))
        }
    };
    run().unwrap_or_else(|e| e.response())
}

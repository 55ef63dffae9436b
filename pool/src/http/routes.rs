//! The table of routes: every path and method, and what answers an unknown one.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use paddock_core::{Error, ErrorCode};

use super::*;

/// Registers every route of `openapi::ROUTES`, the one table of the native API
/// (the OpenAPI document and the two-tenant tests walk it too).
pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::QueryConfig::default().error_handler(|err, _req| {
        ApiError::from(Error::invalid_options("query", err.to_string())).into()
    }))
    .app_data(web::PathConfig::default().error_handler(|err, _req| {
        ApiError::from(Error::invalid_options("path", err.to_string())).into()
    }))
    .default_service(web::to(|req: HttpRequest| async move {
        // A known path asked with a method it does not take is 405, with the
        // methods it does take.
        let allowed = openapi::methods_for(req.path());
        if !allowed.is_empty() {
            let allow = allowed.join(", ");
            return Err::<HttpResponse, ApiError>(
                ApiError::with_status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    ErrorCode::InvalidOptions,
                    format!(
                        "{} {} is not served; this path takes {allow}",
                        req.method(),
                        req.path()
                    ),
                )
                .with_allow(allow),
            );
        }
        Err::<HttpResponse, ApiError>(ApiError::from(Error::new(
            ErrorCode::NotFound,
            "no such route; see docs/http-api.md",
        )))
    }));
    for route in openapi::ROUTES {
        let method = actix_web::http::Method::from_bytes(route.method.to_uppercase().as_bytes())
            .expect("the table's methods are valid");
        cfg.route(&route.mount_path(), (route.serve)().method(method));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::Paddock;
    use actix_web::test;
    use actix_web::App;

    use crate::http::ServerConfig;

    #[actix_web::test]
    async fn every_documented_route_is_served() {
        let paddock = Paddock::builder()
            .without_subprocess()
            .without_isolate()
            .engine(Arc::new(crate::noop::NoopEngine::new()))
            .start()
            .unwrap();
        let config = ServerConfig::default();
        let state = Arc::new(State::new(paddock.clone(), config).unwrap());
        let app = test::init_service(
            App::new()
                .app_data(web::Data::from(state))
                .configure(routes),
        )
        .await;
        for openapi::Route { method, path, .. } in openapi::ROUTES {
            let uri = path
                .replace("{id}", "01a2299e-3e83-714b-8bc9-412c5fb1452d")
                .replace("{path}", "f");
            let method =
                actix_web::http::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let req = test::TestRequest::default()
                .method(method.clone())
                .uri(&uri)
                .set_payload("{\"program\":{\"command\":[\"x\"]}}")
                .to_request();
            let resp = test::call_service(&app, req).await;
            let status = resp.status();
            let body = test::read_body(resp).await;
            assert!(
                !String::from_utf8_lossy(&body).contains("no such route"),
                "{method} {path} is documented but not served"
            );
            assert!(
                !(status == StatusCode::INTERNAL_SERVER_ERROR && body.is_empty()),
                "{method} {path} names no handler in the table"
            );
        }
        // A wrongly typed field is named in the 400.
        let req = test::TestRequest::post()
            .uri("/v1/executions")
            .set_payload(r#"{"program":{"command":["true"]},"stdin":5}"#)
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let body: serde_json::Value = test::read_body_json(resp).await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("`stdin`"), "{message}");
        // And an undocumented one is not.
        let req = test::TestRequest::get()
            .uri("/v1/nothing-here")
            .to_request();
        let resp = test::call_service(&app, req).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        paddock.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

//! `/v1/sandboxes`: open a sandbox, and everything on one: status, exec, files,
//! pause, destroy. (Processes, terminals and TCP are in `interactive`.)

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use paddock_core::api::{ExecBody, SandboxBody};
use paddock_core::{ErrorCode, SandboxSpec, SandboxStatus, WireResult};
use serde::Deserialize;

use super::answers::SandboxState;
use super::tenancy::account;
use super::*;
use super::{body::*, executions::*, forward, server::*};
use crate::federation::SessionPlace;
use crate::Caller;

/// The caller's handle on `sandbox`, through the facade: a sandbox opened for one
/// tenant is `NOT_FOUND` to every other, so ids of other tenants' sandboxes neither
/// work nor show that they exist; a destroyed one of the caller's is 409
/// `ENGINE_DISPOSED`. `action` names what the caller does, for the record of an
/// operator's uses.
pub(super) async fn sandbox_access(
    state: &State,
    caller: &Caller,
    sandbox: &str,
    action: &'static str,
) -> Result<crate::SandboxHandle, ApiError> {
    Ok(state.paddock.sandbox_for(caller, sandbox, action).await?)
}

pub(super) async fn create_sandbox(
    state: Shared,
    caller: Caller,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    admitting(&state)?;
    let tenant = account(&caller);
    let raw = read_body(
        payload,
        state.config.max_body_bytes,
        "request body (server.max_body_bytes)",
    )
    .await?;
    let body: SandboxBody = if raw.iter().all(u8::is_ascii_whitespace) {
        SandboxBody::default()
    } else {
        paddock_core::api::parse_body(&raw)?
    };
    let spec = SandboxSpec {
        level: body.level,
        network: body.network,
        limits: body.limits,
        tenant,
        home: None,
    };
    let federation = state.paddock.federation().cloned();
    if let Some(f) = &federation {
        // In a fleet, the sandbox opens on the node with the most room for it; a
        // request another node placed here opens here.
        if !forward::forwarded(&req) {
            if let SessionPlace::Node { id, address } =
                f.place_session(&spec, body.engine.as_ref()).await?
            {
                let raw = Bytes::copy_from_slice(&raw);
                match forward::forward_to(
                    &state,
                    &caller,
                    &req,
                    forward::Body::Read(raw),
                    &id,
                    &address,
                )
                .await
                {
                    Ok(r) => return Ok(r),
                    // Nothing reached the chosen node: this one opens it instead.
                    // (One that may have reached it is not opened twice.)
                    Err(e) if !e.sent => {
                        tracing::warn!(node = %id, error = %e.error.message, "placing a sandbox on another node failed; opening it here");
                    }
                    Err(e) => return Err(ApiError::from(e.error)),
                }
            }
        }
    }
    // Admitted in the fleet's shares, opened and recorded by the facade.
    let opened = state.paddock.open_sandbox(spec, body.engine).await;
    let handle = opened.map_err(|e| refusal(&state, e))?;
    Ok(HttpResponse::Created().json(handle.info()))
}

pub(super) async fn sandbox_status(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    // A destroyed sandbox is gone like any deleted resource: 409 `ENGINE_DISPOSED`,
    // as on every other route of it.
    let handle = sandbox_access(&state, &caller, &path, "sandbox.status").await?;
    let status = handle.status().await?;
    Ok(HttpResponse::Ok().json(SandboxState { status }))
}

pub(super) async fn destroy_sandbox(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    match sandbox_access(&state, &caller, &path, "sandbox.destroy").await {
        Ok(handle) => {
            handle.destroy().await?;
        }
        // Destroying a destroyed sandbox succeeds (idempotent).
        Err(e) if e.error.code == ErrorCode::EngineDisposed => {}
        Err(e) => return Err(e),
    }
    Ok(HttpResponse::NoContent().finish())
}

pub(super) async fn pause_sandbox(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let handle = sandbox_access(&state, &caller, &path, "sandbox.pause").await?;
    handle.pause().await?;
    Ok(HttpResponse::Ok().json(SandboxState {
        status: SandboxStatus::Paused,
    }))
}

pub(super) async fn unpause_sandbox(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let handle = sandbox_access(&state, &caller, &path, "sandbox.unpause").await?;
    handle.unpause().await?;
    Ok(HttpResponse::Ok().json(SandboxState {
        status: SandboxStatus::Ready,
    }))
}

pub(super) async fn sandbox_exec(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
    query: web::Query<StreamQuery>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    admitting(&state)?;
    let handle = sandbox_access(&state, &caller, &path, "sandbox.exec").await?;
    let body: ExecBody = parse_body(&state, payload).await?;
    // Accounted to the sandbox's tenant.
    let request = body.into_order(None).request;
    // Wrong in itself: 400 before anything starts, streamed or not (the scheduler
    // validates it, and `exec_stream` answers once it passed).
    if query.stream {
        let id = request.id.clone();
        let stream = handle.exec_stream(request).await?;
        return Ok(stream_response(state.into_inner(), stream, id, None));
    }
    let r = handle.exec(request).await.map_err(|e| refusal(&state, e))?;
    Ok(HttpResponse::Ok().json(WireResult(&r)))
}

/// The query of `GET /v1/sandboxes/{id}/files`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(super) struct DirQuery {
    /// The directory to list, inside the workdir (default: the workdir).
    #[serde(default)]
    pub(super) dir: String,
}

pub(super) async fn list_files(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
    q: web::Query<DirQuery>,
) -> Result<HttpResponse, ApiError> {
    let handle = sandbox_access(&state, &caller, &path, "sandbox.files.list").await?;
    let files = handle.list_files(&q.dir).await?;
    Ok(HttpResponse::Ok().json(files))
}

/// Streams a file out through one bounded buffer, with its size as Content-Length.
pub(super) async fn read_file(
    state: Shared,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (sandbox, file) = path.into_inner();
    let handle = sandbox_access(&state, &caller, &sandbox, "sandbox.files.read").await?;
    let reader = handle.open_read(&file).await?;
    let body = tokio_util::io::ReaderStream::with_capacity(reader.reader, FILE_CHUNK_BYTES);
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .no_chunking(reader.size)
        .streaming(body))
}

/// The buffer a file moves through over HTTP, in each direction.
pub(super) const FILE_CHUNK_BYTES: usize = 64 << 10;

/// Streams an upload into the file: the body goes through a bounded channel (a few
/// chunks) to the scheduler's thread, which writes it through one buffer; at most
/// `server.max_file_bytes` are taken (413 beyond, and no file is left).
pub(super) async fn write_file(
    state: Shared,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    use futures_util::StreamExt;
    admitting(&state)?;
    let (sandbox, file) = path.into_inner();
    let handle = sandbox_access(&state, &caller, &sandbox, "sandbox.files.write").await?;
    let max = state.config.max_file_bytes as u64;
    let too_large = || {
        ApiError::with_status(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::InvalidOptions,
            format!("the upload (server.max_file_bytes) exceeds {max} bytes"),
        )
    };
    let announced = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let (feed, source) = super::upload_source(4);
    let write = handle.write_from(&file, source, max);
    let pump = async move {
        let mut payload = payload;
        while let Some(chunk) = payload.next().await {
            match chunk {
                // The writer stopped reading (done or refused): stop feeding it.
                Ok(c) => {
                    if !feed.send(c).await {
                        return None;
                    }
                }
                Err(e) => {
                    // An upload that stalled is answered as such (408).
                    let stalled = super::is_body_timeout(&e).then(|| payload_error(&e));
                    feed.fail(std::io::Error::other(e.to_string())).await;
                    return stalled;
                }
            }
        }
        feed.finish().await;
        None
    };
    let (written, stalled) = futures_util::join!(write, pump);
    if let Some(stalled) = stalled {
        return Err(stalled);
    }
    match written {
        Ok(_) => Ok(HttpResponse::NoContent().finish()),
        // The upload's own bound (a file-size limit of the sandbox is its own answer).
        Err(e) if e.code == ErrorCode::LimitsExceeded && e.message.contains("(max_bytes)") => {
            Err(too_large())
        }
        Err(e) => Err(e.into()),
    }
}

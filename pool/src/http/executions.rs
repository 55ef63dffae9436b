//! `/v1/executions`: run one program (JSON or NDJSON), look up its result, cancel it.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use paddock_core::api::ExecBody;
use paddock_core::{Error, ErrorCode, ExecutionId, WireResult};

use super::answers::{Cancelled, ExecutionAnswer, Running, RunningState};
use super::results::{Answer, Begin};
use super::tenancy::account;
use super::*;
use super::{body::*, server::*};
use crate::Caller;
use crate::{Execute, StreamEvent};

pub(super) fn answer_json(state: &State, answer: &Answer) -> HttpResponse {
    match answer.as_ref() {
        Ok(r) => {
            // Sized for the output up front: a body grown by doubling would copy a
            // large output several times over on its way.
            let mut body = Vec::with_capacity(r.stdout.len() + r.stderr.len() + 4096);
            match serde_json::to_writer(&mut body, &WireResult(r)) {
                Ok(()) => HttpResponse::Ok()
                    .content_type("application/json")
                    .body(body),
                Err(e) => actix_web::ResponseError::error_response(&refusal(
                    state,
                    Error::new(
                        ErrorCode::EngineFailed,
                        format!("encoding the result failed: {e}"),
                    ),
                )),
            }
        }
        Err(e) => {
            let err = refusal(state, e.clone());
            actix_web::ResponseError::error_response(&err)
        }
    }
}

pub(super) async fn create_execution(
    state: Shared,
    caller: Caller,
    req: HttpRequest,
    query: web::Query<StreamQuery>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    admitting(&state)?;
    let tenant = account(&caller);
    let body: ExecBody = parse_body(&state, payload).await?;
    // Validated once, by the scheduler: a request wrong in itself is answered 400
    // before anything starts, with `?stream=true` too (`execute_stream` answers once
    // the request passed, and the fleet's admission checks it before any stream).
    let mut order = body.into_order(tenant.clone());
    order.traceparent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let id = order.request.id.clone();
    let msg = Execute::from(order);
    if let Some(fleet) = state.paddock.federation().cloned() {
        // In a fleet, results and idempotency keys are kept fleet-wide, by the fleet.
        return federated_execution(state, fleet, msg, key, query.stream).await;
    }
    match state.results.begin(&id, tenant.as_deref(), key.as_deref()) {
        Begin::Attach(mut rx) => {
            let answer = loop {
                if let Some(a) = rx.borrow().clone() {
                    break a;
                }
                if rx.changed().await.is_err() {
                    return Err(
                        Error::new(ErrorCode::NotFound, "the original execution is gone").into(),
                    );
                }
            };
            Ok(answer_json(&state, &answer))
        }
        Begin::Run(tx) => {
            if query.stream {
                match state.paddock.execute_stream(msg).await {
                    Ok(stream) => Ok(stream_response(state.into_inner(), stream, id, Some(tx))),
                    Err(e) => {
                        // Refused before it ran: nothing to replay for the key.
                        state
                            .results
                            .finish_and_forget(&id, tx, Arc::new(Err(e.clone())));
                        Err(refusal(&state, e))
                    }
                }
            } else {
                // Driven by a task of its own, so that its answer is recorded (for
                // lookups by id and the idempotency key) even when the caller hangs
                // up before it comes.
                let (done, answered) = tokio::sync::oneshot::channel();
                let shared = state.clone().into_inner();
                actix_rt::spawn(async move {
                    let answer = Arc::new(shared.paddock.execute_with(msg).await);
                    record(&shared, &id, tx, answer.clone());
                    let _ = done.send(answer);
                });
                let answer = answered.await.map_err(|_| {
                    Error::new(
                        ErrorCode::EngineFailed,
                        "the execution's task ended without an answer; look it up by id",
                    )
                })?;
                Ok(answer_json(&state, &answer))
            }
        }
    }
}

/// `POST /v1/executions` on a node of a fleet: the fleet runs it on a node with
/// room, keeps its result and holds its idempotency key fleet-wide.
async fn federated_execution(
    state: Shared,
    fleet: Arc<dyn crate::federation::Federation>,
    msg: Execute,
    key: Option<String>,
    stream: bool,
) -> Result<HttpResponse, ApiError> {
    let id = msg.order.request.id.clone();
    if stream {
        return match fleet.execute_stream(msg, key).await {
            Ok(stream) => Ok(stream_response(state.into_inner(), stream, id, None)),
            Err(e) => Err(refusal(&state, e)),
        };
    }
    // Driven by a task of its own, as on a single node: the fleet records the answer
    // even if the caller hangs up.
    let (done, answered) = tokio::sync::oneshot::channel();
    actix_rt::spawn(async move {
        let _ = done.send(Arc::new(fleet.execute(msg, key).await));
    });
    let answer: Answer = answered.await.map_err(|_| {
        Error::new(
            ErrorCode::EngineFailed,
            "the execution's task ended without an answer; look it up by id",
        )
    })?;
    Ok(answer_json(&state, &answer))
}

/// Records an execution's answer for lookups by id and its idempotency key; a
/// refusal to retry, or of a request wrong in itself (which the client fixes and
/// sends again), is answered but not kept.
pub(super) fn record(
    state: &State,
    id: &ExecutionId,
    tx: tokio::sync::watch::Sender<Option<Answer>>,
    answer: Answer,
) {
    let forgotten = |e: &Error| retryable(e) || e.code == ErrorCode::InvalidOptions;
    if answer.as_ref().as_ref().is_err_and(forgotten) {
        state.results.finish_and_forget(id, tx, answer);
    } else {
        state.results.finish(id, tx, answer);
    }
}

/// A refusal a client should retry (after `Retry-After`): never replayed for an
/// idempotency key.
pub(super) fn retryable(e: &Error) -> bool {
    matches!(
        e.code,
        ErrorCode::RateLimited
            | ErrorCode::PoolExhausted
            | ErrorCode::EngineDisposed
            | ErrorCode::FleetUnavailable
    )
}

/// NDJSON: `started`, then `stdout`/`stderr` chunks as produced (`data` where the
/// bytes are UTF-8, `data_base64` where they are not; see `chunks.rs`), then `result`
/// (or `error` when the execution was refused).
///
/// The execution is driven by a task of its own, not by the response body, so that
/// its answer is recorded (for `GET /v1/executions/{id}` and the idempotency key)
/// even when the caller hangs up mid-stream.
pub(super) fn stream_response(
    state: Arc<State>,
    mut stream: crate::ExecutionStream,
    id: ExecutionId,
    mut tx: Option<tokio::sync::watch::Sender<Option<Answer>>>,
) -> HttpResponse {
    use futures_util::StreamExt;
    let started = ndjson(&serde_json::json!({"type": "started", "id": id}));
    let (lines_tx, lines_rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    actix_rt::spawn(async move {
        let mut reader_gone = false;
        let mut chunks = super::chunks::ChunkLines::default();
        while let Some(event) = stream.next().await {
            let line = match event {
                StreamEvent::Output(chunk) => match chunks.line(chunk.stream, &chunk.data) {
                    Some(line) => ndjson(&line),
                    None => continue,
                },
                StreamEvent::Finished(result) => {
                    // Bytes held back for a character that never came, first.
                    for held in chunks.finish() {
                        if !reader_gone && lines_tx.send(ndjson(&held)).await.is_err() {
                            reader_gone = true;
                        }
                    }
                    let answer: Answer = Arc::new(*result);
                    let line = match answer.as_ref() {
                        Ok(r) => result_line(r),
                        Err(e) => ndjson(&serde_json::json!({"type": "error", "error": e})),
                    };
                    if let Some(tx) = tx.take() {
                        record(&state, &id, tx, answer);
                    }
                    line
                }
            };
            // A caller that went away stops reading; the output is still drained so
            // the result above is reached.
            if !reader_gone && lines_tx.send(line).await.is_err() {
                reader_gone = true;
            }
        }
    });
    let rest = futures_util::stream::unfold(lines_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|line| (Ok::<Bytes, actix_web::Error>(line), rx))
    });
    let body = futures_util::stream::once(async move { Ok::<Bytes, actix_web::Error>(started) })
        .chain(rest);
    HttpResponse::Ok()
        .content_type("application/x-ndjson")
        .streaming(body.boxed_local())
}

/// The `result` line of a stream: the wire result with `"type": "result"`, written
/// from the result without a copy of its output.
fn result_line(r: &paddock_core::ExecResult) -> Bytes {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        #[serde(flatten)]
        result: WireResult<'a>,
    }
    let mut line = Vec::with_capacity(r.stdout.len() + r.stderr.len() + 4096);
    let _ = serde_json::to_writer(
        &mut line,
        &Line {
            kind: "result",
            result: WireResult(r),
        },
    );
    line.push(b'\n');
    Bytes::from(line)
}

pub(super) fn ndjson(v: &serde_json::Value) -> Bytes {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

pub(super) fn parse_id(raw: &str) -> Result<ExecutionId, ApiError> {
    Ok(ExecutionId::parse(raw)?)
}

pub(super) async fn get_execution(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path)?;
    if let Some(fleet) = state.paddock.federation() {
        return match fleet.lookup(&caller, &id).await? {
            Some(crate::federation::Lookup::Finished(answer)) => match answer.as_ref() {
                Ok(r) => Ok(HttpResponse::Ok().json(ExecutionAnswer::Finished(WireResult(r)))),
                Err(_) => Ok(answer_json(&state, &answer)),
            },
            Some(crate::federation::Lookup::Running) => {
                Ok(HttpResponse::Ok().json(ExecutionAnswer::Running(Running {
                    id,
                    status: RunningState::Running,
                })))
            }
            None => Err(not_kept(&state, &id)),
        };
    }
    // Another tenant's execution is answered exactly like one that never existed.
    let found = state
        .results
        .get(&id)
        .filter(|(owner, _)| state.paddock.may_see(&caller, owner.as_deref(), &id));
    match found {
        Some((_, Some(answer))) => match answer.as_ref() {
            Ok(r) => Ok(HttpResponse::Ok().json(ExecutionAnswer::Finished(WireResult(r)))),
            Err(_) => Ok(answer_json(&state, &answer)),
        },
        Some((_, None)) => Ok(HttpResponse::Ok().json(ExecutionAnswer::Running(Running {
            id,
            status: RunningState::Running,
        }))),
        None => Err(not_kept(&state, &id)),
    }
}

fn not_kept(state: &State, id: &ExecutionId) -> ApiError {
    let retention = match state.paddock.federation() {
        Some(_) => "the fleet keeps results for its `fleet.retention_s`".to_string(),
        None => format!("results are kept for {} s", state.config.result_retention_s),
    };
    Error::new(
        ErrorCode::NotFound,
        format!("no execution {id} is running or kept ({retention})"),
    )
    .into()
}

pub(super) async fn cancel_execution(
    state: Shared,
    caller: Caller,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&path)?;
    if let Some(fleet) = state.paddock.federation() {
        let outcome = fleet.cancel(&caller, &id).await?;
        if !outcome.known {
            return Err(Error::new(
                ErrorCode::NotFound,
                format!("no execution {id} is running or kept"),
            )
            .into());
        }
        return Ok(HttpResponse::Ok().json(Cancelled {
            id,
            cancelled: outcome.cancelled,
        }));
    }
    let cancelled = state.paddock.cancel(&caller, &id);
    let kept = state
        .results
        .get(&id)
        .is_some_and(|(owner, _)| caller.sees(owner.as_deref()));
    if !(cancelled || kept) {
        return Err(Error::new(
            ErrorCode::NotFound,
            format!("no execution {id} is running or kept"),
        )
        .into());
    }
    // DELETE removes the execution: its id is unknown from now on (404), like any
    // deleted resource's. The request that runs it still answers (`cancelled`).
    if kept {
        state.results.forget(&id);
    }
    Ok(HttpResponse::Ok().json(Cancelled { id, cancelled }))
}

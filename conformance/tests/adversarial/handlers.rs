//! Broken handlers: malformed frames, a handler that never answers, one that crashes
//! mid-frame. After each, the next invocation must find a working handler.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{EngineName, ErrorCode, ExecRequest, Outcome, Program};
use serde_json::json;

use crate::harness::{Check, H, HANDLER_NAME};

fn invoke(op: &str, timeout_ms: u64) -> ExecRequest {
    ExecRequest::new(Program::Invoke {
        handler: HANDLER_NAME.into(),
        input: json!({ "op": op }),
    })
    .with_timeout_ms(timeout_ms)
}

/// The error code of an execution's answer: its failure, or its refusal.
async fn answer_code(h: &H, request: ExecRequest) -> Option<ErrorCode> {
    match h.answer(request).await {
        Ok(r) => r.outcome.error_code(),
        Err(e) => Some(e.code),
    }
}

/// Skips targets whose engine runs no json-stdio handlers, after checking that an
/// `Invoke` there is refused, not accepted and ignored.
async fn needs_frames(h: &H) -> Check {
    match h.target.engine().as_str() {
        "subprocess" => Ok(()),
        "container" => {
            let code = answer_code(h, invoke("echo", 5_000)).await;
            ensure!(
                code == Some(ErrorCode::CapabilityNotSupported),
                "an Invoke on the container engine must be refused CAPABILITY_NOT_SUPPORTED: {code:?}"
            );
            skip!("the container engine runs no json-stdio handlers (an Invoke is refused with CAPABILITY_NOT_SUPPORTED, checked)")
        }
        _ => skip!(
            "an isolate handler is a JavaScript function called in-process: there are no frames to break (a throwing handler is an ordinary script error)"
        ),
    }
}

/// The handler answers `echo` normally again.
async fn handler_recovered(h: &H) -> Check {
    let r = h.exec(invoke("echo", 20_000)).await?;
    ensure!(
        r.is_success() && r.value == Some(json!({"op": "echo"})),
        "the next invocation did not reach a working handler: {r:?}"
    );
    Ok(())
}

pub(crate) async fn malformed_frames(h: Arc<H>) -> Check {
    needs_frames(&h).await?;
    handler_recovered(&h).await?;
    for op in ["garbage", "version", "stranger", "huge"] {
        let started = Instant::now();
        let code = answer_code(&h, invoke(op, 20_000)).await;
        ensure!(
            matches!(code, Some(ErrorCode::ProtocolError | ErrorCode::WorkerFailed)),
            "a handler that sent `{op}` must fail the execution with PROTOCOL_ERROR or WORKER_FAILED, got {code:?}"
        );
        ensure!(
            started.elapsed() < Duration::from_secs(15),
            "`{op}` was answered only after {:?}: the fault was not noticed, the deadline was",
            started.elapsed()
        );
        handler_recovered(&h).await?;
    }
    Ok(())
}

pub(crate) async fn handler_never_answers(h: Arc<H>) -> Check {
    if h.target.engine() == EngineName::CONTAINER {
        needs_frames(&h).await?;
    }
    let started = Instant::now();
    let r = h.exec(invoke("hang", 1_500)).await?;
    let took = started.elapsed();
    ensure!(
        r.outcome == Outcome::TimedOut,
        "a handler that never answers ends timed_out: {r:?}"
    );
    ensure!(
        took < Duration::from_secs(8),
        "a 1.5 s deadline took {took:?} against a handler that never answers"
    );
    handler_recovered(&h).await
}

pub(crate) async fn handler_crashes_mid_frame(h: Arc<H>) -> Check {
    needs_frames(&h).await?;
    handler_recovered(&h).await?;
    let code = answer_code(&h, invoke("die-mid-frame", 20_000)).await;
    ensure!(
        matches!(code, Some(ErrorCode::WorkerFailed | ErrorCode::ProtocolError)),
        "a handler that dies mid-frame fails the execution with WORKER_FAILED or PROTOCOL_ERROR, got {code:?}"
    );
    handler_recovered(&h).await
}

//! json-stdio handlers: suspend and resume, and a handler that dies mid-frame.

use paddock_core::{CancelToken, DiscardSink, ErrorCode, ExecRequest, Outcome, Program};
use serde_json::json;

use crate::case::{Check, OrFail};
use crate::context::{brief, exec, Ctx};
use crate::handler::HANDLER_NAME;

fn invoke(input: serde_json::Value) -> ExecRequest {
    ExecRequest::new(Program::Invoke {
        handler: HANDLER_NAME.into(),
        input,
    })
    .with_timeout_ms(20_000)
}

pub(crate) async fn handler_suspend_and_resume(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let r = exec(&*sandbox, invoke(json!({"op": "suspend"}))).await?;
    let Outcome::Suspended { token_id } = &r.outcome else {
        fail!(
            "a handler that sends `suspend` must end the execution as suspended with its token; got {}",
            brief(&r)
        );
    };
    ensure!(
        token_id.starts_with("conformance-"),
        "the token must be the handler's own; got `{token_id}`"
    );
    let resume = |value: serde_json::Value| {
        ExecRequest::new(Program::Resume {
            token_id: token_id.clone(),
            value,
        })
    };
    let resumed = sandbox
        .exec(
            resume(json!({"approved": true})),
            &DiscardSink,
            CancelToken::new(),
        )
        .await
        .or_fail(format_args!("resume of token `{token_id}`"))?;
    ensure!(
        resumed.is_success() && resumed.value == Some(json!({"resumed": {"approved": true}})),
        "resume must continue the invocation with the value; got value {:?}, {}",
        resumed.value,
        brief(&resumed)
    );
    let again = sandbox
        .exec(resume(json!(null)), &DiscardSink, CancelToken::new())
        .await;
    ensure!(
        matches!(&again, Err(e) if e.code == ErrorCode::NotFound),
        "a token resumes once; a second resume must be NOT_FOUND, got {again:?}"
    );
    Ok(())
}

pub(crate) async fn handler_dies_mid_frame(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let r = exec(&*sandbox, invoke(json!({"op": "die-mid-frame"}))).await?;
    ensure!(
        matches!(
            r.outcome.error_code(),
            Some(ErrorCode::WorkerFailed) | Some(ErrorCode::ProtocolError)
        ),
        "a handler that dies in the middle of a frame must fail the execution with WORKER_FAILED or PROTOCOL_ERROR; got {}",
        brief(&r)
    );
    let r = exec(&*sandbox, invoke(json!({"op": "echo", "n": 7}))).await?;
    ensure!(
        r.is_success() && r.value == Some(json!({"op": "echo", "n": 7})),
        "the next invocation must get a working handler; got value {:?}, {}",
        r.value,
        brief(&r)
    );
    Ok(())
}

//! Exit codes, output capture, stdin and live streaming.

use std::time::{Duration, Instant};

use paddock_core::{CancelToken, Outcome, StreamKind};

use crate::case::{Check, OrFail};
use crate::context::{brief, exec, sh, Ctx, RecordingSink};

pub(crate) async fn exec_exit_code(ctx: Ctx) -> Check {
    let engine = ctx.engine();
    let sandbox = ctx.sandbox().await?;
    ensure!(
        sandbox.engine() == engine.name(),
        "sandbox.kind() is {} but the engine's kind is {}",
        sandbox.engine(),
        engine.name()
    );

    let request = sh("exit 7", &[]);
    let id = request.id.clone();
    let r = exec(&*sandbox, request).await?;
    ensure!(
        matches!(
            r.outcome,
            Outcome::Completed {
                exit_code: 7,
                signal: None
            }
        ),
        "`sh -c 'exit 7'` must end as Completed {{ exit_code: 7, signal: None }}; got {}",
        brief(&r)
    );
    ensure!(
        r.exit_code() == Some(7) && !r.is_success(),
        "exit_code() of {}",
        brief(&r)
    );
    ensure!(
        r.id == id,
        "the result's id {} is not the request's id {id}",
        r.id
    );
    ensure!(
        r.engine == engine.name(),
        "the result names engine {} but {} ran it",
        r.engine,
        engine.name()
    );
    ensure!(
        r.instance_id == sandbox.id(),
        "the result's instance_id {:?} is not the sandbox id {:?}",
        r.instance_id,
        sandbox.id()
    );

    let r = exec(&*sandbox, sh("exit 0", &[])).await?;
    ensure!(
        r.is_success(),
        "`sh -c 'exit 0'` must be a clean success; got {}",
        brief(&r)
    );
    let t = r.timings;
    ensure!(
        t.started_at_ms > 0 && t.started_at_ms <= t.finished_at_ms,
        "timings must be set and ordered: {t:?}"
    );
    Ok(())
}

pub(crate) async fn exec_reports_signal(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let r = exec(&*sandbox, sh("kill -KILL $$", &[])).await?;
    ensure!(
        matches!(
            r.outcome,
            Outcome::Completed {
                exit_code: 137,
                signal: Some(9)
            }
        ),
        "a shell that SIGKILLs itself must end as Completed {{ exit_code: 137, signal: Some(9) }}; got {}",
        brief(&r)
    );
    Ok(())
}

pub(crate) async fn exec_captures_output(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let mut request = sh("printf to-out; printf to-err >&2; cat", &[]);
    request.stdin = Some("from-stdin".into());
    let sink = RecordingSink::new();
    let r = sandbox
        .exec(request, &sink, CancelToken::new())
        .await
        .or_fail("exec")?;
    ensure!(
        r.is_success(),
        "expected a clean success; got {}",
        brief(&r)
    );
    ensure!(
        r.stdout == "to-outfrom-stdin",
        "stdout must be \"to-outfrom-stdin\" (printed, then stdin echoed by cat); got {}",
        brief(&r)
    );
    ensure!(
        r.stderr == "to-err",
        "stderr must be \"to-err\"; got {}",
        brief(&r)
    );
    ensure!(
        !r.stdout_truncated && !r.stderr_truncated,
        "nothing may be marked truncated for a few bytes; got {}",
        brief(&r)
    );
    let streamed_out = sink.bytes(StreamKind::Stdout);
    let streamed_err = sink.bytes(StreamKind::Stderr);
    ensure!(
        streamed_out == r.stdout.as_bytes() && streamed_err == r.stderr.as_bytes(),
        "the sink must see the captured bytes on the right streams; sink stdout {:?}, stderr {:?}",
        String::from_utf8_lossy(&streamed_out),
        String::from_utf8_lossy(&streamed_err)
    );
    Ok(())
}

pub(crate) async fn exec_stdin_is_closed(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let request = sh("cat; echo end", &[]).with_timeout_ms(5_000);
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), exec(&*sandbox, request))
        .await
        .map_err(|_| {
            crate::case::Stop::Fail(
                "`cat` without request stdin did not return within 10 s: stdin must be empty and closed"
                    .into(),
            )
        })??;
    ensure!(
        r.is_success() && r.stdout == "end\n",
        "`cat` must see end-of-file at once when the request has no stdin; after {:?} got {}",
        started.elapsed(),
        brief(&r)
    );
    Ok(())
}

pub(crate) async fn exec_streams_live(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let sink = RecordingSink::new();
    let started = Instant::now();
    let r = sandbox
        .exec(
            sh("printf first; sleep 1; printf second", &[]),
            &sink,
            CancelToken::new(),
        )
        .await
        .or_fail("exec")?;
    let returned = started.elapsed();
    ensure!(
        r.is_success(),
        "expected a clean success; got {}",
        brief(&r)
    );
    ensure!(
        returned >= Duration::from_millis(900),
        "the program sleeps 1 s but exec returned after {returned:?}"
    );
    let Some((first_at, first)) = sink.first() else {
        fail!(
            "no output chunk reached the sink; the result had {}",
            brief(&r)
        );
    };
    let first_after = first_at - started;
    ensure!(
        first.stream == StreamKind::Stdout
            && !first.data.is_empty()
            && (b"first".starts_with(&first.data) || first.data.starts_with(b"first")),
        "the first chunk must be (a prefix of) stdout \"first\"; got {:?} on {:?}",
        String::from_utf8_lossy(&first.data),
        first.stream
    );
    ensure!(
        returned.saturating_sub(first_after) >= Duration::from_millis(600),
        "output must stream while the program runs: the first chunk arrived after {first_after:?}, \
         exec returned after {returned:?}, and the program slept 1 s in between"
    );
    ensure!(
        sink.bytes(StreamKind::Stdout) == b"firstsecond",
        "the sink must see all of stdout; got {:?}",
        String::from_utf8_lossy(&sink.bytes(StreamKind::Stdout))
    );
    Ok(())
}

//! JavaScript cases: what every engine that runs `Code { language: javascript }`
//! must do (a node process and a QuickJS isolate alike), and the isolate features
//! (result values, function handlers, heap limit, module denylist, `sandbox:fs`) for
//! the engines that advertise them.

use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, ErrorCode, ExecRequest, Language, LimitKind, Outcome, Program, SandboxStatus,
    StreamKind,
};
use serde_json::json;

use crate::case::{clip, Check, OrFail, Stop};
use crate::context::{brief, exec, Ctx, RecordingSink};

fn js(source: &str) -> ExecRequest {
    ExecRequest::new(Program::code(Language::Javascript, source)).with_timeout_ms(20_000)
}

pub(crate) async fn js_exit_status(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let r = exec(&*sandbox, js("console.log('ok')")).await?;
    ensure!(
        r.is_success() && r.stdout == "ok\n",
        "`console.log('ok')` must complete with exit code 0 and print `ok`; got {}",
        brief(&r)
    );
    let r = exec(&*sandbox, js("throw new Error('conformance-boom')")).await?;
    ensure!(
        r.outcome
            == Outcome::Completed {
                exit_code: 1,
                signal: None
            },
        "an uncaught error must complete with exit code 1, as node exits; got {}",
        brief(&r)
    );
    ensure!(
        r.stderr.contains("conformance-boom"),
        "the uncaught error must be printed on stderr; got {}",
        brief(&r)
    );
    Ok(())
}

pub(crate) async fn js_console_streams_live(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let sink = RecordingSink::new();
    let started = Instant::now();
    let r = sandbox
        .exec(
            js("console.log('early'); const t = Date.now(); while (Date.now() - t < 600) {} console.error('late')"),
            &sink,
            CancelToken::new(),
        )
        .await
        .or_fail("exec of a script that prints, spins 600 ms, then prints again")?;
    let ended = Instant::now();
    ensure!(
        r.is_success() && r.stdout == "early\n" && r.stderr == "late\n",
        "expected stdout `early` and stderr `late`; got {}",
        brief(&r)
    );
    let Some(at) = sink.seen_at(StreamKind::Stdout, b"early\n") else {
        fail!("the sink never received `early`");
    };
    ensure!(
        at + Duration::from_millis(300) < ended,
        "`early` must reach the sink while the script still runs: it arrived {:?} after the start and the run ended {:?} after the start",
        at - started,
        ended - started
    );
    ensure!(
        sink.bytes(StreamKind::Stderr) == b"late\n",
        "the sink must see stderr as the result has it"
    );
    Ok(())
}

pub(crate) async fn js_timeout_stops_busy_loop(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let mut request = js("while (true) {}");
    request.limits.timeout_ms = Some(300);
    let started = Instant::now();
    let r = exec(&*sandbox, request).await?;
    let took = started.elapsed();
    ensure!(
        r.outcome == Outcome::TimedOut,
        "`while (true) {{}}` under a 300 ms deadline must end as timed_out; got {}",
        brief(&r)
    );
    ensure!(
        took < Duration::from_secs(3),
        "the deadline was 300 ms but the execution took {took:?}"
    );
    let r = exec(&*sandbox, js("console.log('again')")).await?;
    ensure!(
        r.is_success(),
        "the sandbox must run again after a timeout; got {}",
        brief(&r)
    );
    Ok(())
}

pub(crate) async fn js_cancel_stops_busy_loop(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let cancel = CancelToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let r = sandbox
        .exec(js("while (true) {}"), &paddock_core::DiscardSink, cancel)
        .await
        .or_fail("exec of `while (true) {}` cancelled after 200 ms")?;
    ensure!(
        r.outcome == Outcome::Cancelled,
        "a cancelled busy loop must end as cancelled; got {}",
        brief(&r)
    );
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "cancel took {:?} to stop the script",
        started.elapsed()
    );
    Ok(())
}

pub(crate) async fn js_output_is_capped(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let mut request = js("for (let i = 0; i < 100000; i++) console.log('a'); console.log('done')");
    request.limits.max_output_bytes = Some(1_000);
    let r = exec(&*sandbox, request).await?;
    ensure!(
        r.is_success()
            || r.outcome
                == (Outcome::LimitExceeded {
                    limit: LimitKind::Output
                }),
        "a script printing past the cap must complete (or end as LimitExceeded(output)); got {}",
        brief(&r)
    );
    ensure!(
        r.stdout_truncated && r.stdout.starts_with(&"a\n".repeat(400)) && r.stdout.len() <= 1_256,
        "stdout must keep the first 1000 bytes and be flagged truncated; got {} bytes, truncated {}: {:?}",
        r.stdout.len(),
        r.stdout_truncated,
        clip(&r.stdout, 80)
    );
    Ok(())
}

pub(crate) async fn js_no_state_between_executions(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let r = exec(
        &*sandbox,
        js("globalThis.conformanceLeak = 1; Array.prototype.conformanceEvil = 2; console.log('set')"),
    )
    .await?;
    ensure!(r.is_success(), "setting globals failed: {}", brief(&r));
    let r = exec(
        &*sandbox,
        js("console.log(typeof conformanceLeak, typeof [].conformanceEvil)"),
    )
    .await?;
    ensure!(
        r.stdout == "undefined undefined\n",
        "a global and a prototype change of one execution must be invisible to the next; got {}",
        brief(&r)
    );
    Ok(())
}

pub(crate) async fn js_values_round_trip(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let cases = [
        ("6 * 7", Some(json!(42))),
        (
            "({ text: 'héllo', list: [1, 2.5, null, true], nested: { ok: false } })",
            Some(json!({"text": "héllo", "list": [1, 2.5, null, true], "nested": {"ok": false}})),
        ),
        ("Promise.resolve('awaited')", Some(json!("awaited"))),
        ("undefined", None),
        ("12345678901234567890n", Some(json!("12345678901234567890"))),
    ];
    for (source, want) in cases {
        let r = exec(&*sandbox, js(source)).await?;
        ensure!(
            r.is_success() && r.value == want,
            "`{source}` must complete with value {want:?}; got value {:?}, {}",
            r.value,
            brief(&r)
        );
    }
    Ok(())
}

pub(crate) async fn js_invoke_calls_function(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let request = ExecRequest::new(Program::Invoke {
        handler: "(a, b) => a * b".into(),
        input: json!([6, 7]),
    });
    let r = exec(&*sandbox, request).await?;
    ensure!(
        r.is_success() && r.value == Some(json!(42)),
        "invoking `(a, b) => a * b` with [6, 7] must return 42; got value {:?}, {}",
        r.value,
        brief(&r)
    );
    Ok(())
}

pub(crate) async fn js_heap_limit(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let mut request = js("const keep = []; try { while (true) keep.push(new Array(1 << 16).fill(7)) } catch (e) {} 'survived'");
    request.limits.memory_bytes = Some(32 << 20);
    let r = exec(&*sandbox, request).await?;
    ensure!(
        r.outcome.error_code() == Some(ErrorCode::MemoryExceeded),
        "a memory bomb under a 32 MiB limit must end as MEMORY_EXCEEDED even when the script catches the failure; got {}",
        brief(&r)
    );
    let r = exec(&*sandbox, js("console.log('after')")).await?;
    ensure!(
        r.is_success() && r.stdout == "after\n",
        "the sandbox must run again after a memory limit hit; got {}",
        brief(&r)
    );
    Ok(())
}

pub(crate) async fn js_blocked_modules(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    for source in [
        "import { readFileSync } from 'fs'; readFileSync('/etc/passwd')",
        "import cp from 'node:child_process'",
        "try { await import('net') } catch (e) {} 'caught'",
    ] {
        let r = exec(&*sandbox, js(source)).await?;
        ensure!(
            r.outcome.error_code() == Some(ErrorCode::BlockedModule),
            "`{source}` must be refused with BLOCKED_MODULE; got {}",
            brief(&r)
        );
    }
    Ok(())
}

pub(crate) async fn js_sandbox_fs_shares_files(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    sandbox
        .write_file("conformance/in.txt", b"written by the caller")
        .await
        .or_fail("write_file(conformance/in.txt)")?;
    let r = exec(
        &*sandbox,
        js("import { readFile, writeFile } from 'sandbox:fs';\n\
            writeFile('conformance/out.txt', readFile('conformance/in.txt').toUpperCase());\n\
            let code = null; try { readFile('../outside') } catch (e) { code = e.code }\n\
            export default code;"),
    )
    .await?;
    ensure!(
        r.is_success() && r.value == Some(json!("PATH_ESCAPE")),
        "the script must read the caller's file, write its own, and get PATH_ESCAPE for `../outside`; got value {:?}, {}",
        r.value,
        brief(&r)
    );
    let back = sandbox
        .read_file("conformance/out.txt")
        .await
        .or_fail("read_file(conformance/out.txt)")?;
    ensure!(
        back == b"WRITTEN BY THE CALLER",
        "the caller must read what the script wrote; got {:?}",
        String::from_utf8_lossy(&back)
    );
    Ok(())
}

/// A script that keeps the CPU busy for `ms` milliseconds.
fn busy(ms: u64) -> ExecRequest {
    js(&format!(
        "const t = Date.now(); while (Date.now() - t < {ms}) {{}} console.log('done')"
    ))
}

pub(crate) async fn js_status_busy_while_running(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    ensure!(
        sandbox.status() == SandboxStatus::Ready,
        "a new sandbox must be Ready; it is {:?}",
        sandbox.status()
    );
    let task = {
        let sandbox = sandbox.clone();
        tokio::spawn(async move {
            sandbox
                .exec(busy(1_000), &paddock_core::DiscardSink, CancelToken::new())
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_millis(800);
    let mut last = sandbox.status();
    while last != SandboxStatus::Busy && Instant::now() < deadline && !task.is_finished() {
        tokio::time::sleep(Duration::from_millis(10)).await;
        last = sandbox.status();
    }
    let running = !task.is_finished();
    let r = task
        .await
        .map_err(|e| Stop::Fail(format!("the exec task failed: {e}")))?
        .or_fail("exec of a 1 s busy loop")?;
    ensure!(
        r.is_success(),
        "a 1 s busy loop must succeed; got {}",
        brief(&r)
    );
    ensure!(
        last == SandboxStatus::Busy && running,
        "status must be Busy while the script runs; it stayed {last:?} (exec still running: {running})"
    );
    ensure!(
        sandbox.status() == SandboxStatus::Ready,
        "status must be Ready after the execution ended; it is {:?}",
        sandbox.status()
    );
    Ok(())
}

pub(crate) async fn js_destroy_stops_running_script(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let task = {
        let sandbox = sandbox.clone();
        tokio::spawn(async move {
            let mut request = js("while (true) {}");
            request.limits.timeout_ms = Some(60_000);
            let r = sandbox
                .exec(request, &paddock_core::DiscardSink, CancelToken::new())
                .await;
            (r, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !task.is_finished(),
        "`while (true) {{}}` ended within 300 ms: {:?}",
        task.await.map(|(r, _)| r.map(|r| brief(&r)))
    );
    let destroyed_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), sandbox.destroy())
        .await
        .map_err(|_| Stop::Fail("destroy during a running script took more than 5 s".into()))?
        .or_fail("destroy during a running script")?;
    let (r, returned_at) = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .map_err(|_| {
            Stop::Fail("the busy script was still running 5 s after destroy returned".into())
        })?
        .map_err(|e| Stop::Fail(format!("the exec task failed: {e}")))?;
    let took = returned_at.saturating_duration_since(destroyed_at);
    let r = r.or_fail("exec ended by destroy")?;
    ensure!(
        !r.is_success(),
        "a script ended by destroy must not be a clean success; got {} after {took:?}",
        brief(&r)
    );
    ensure!(
        took <= Duration::from_secs(2),
        "exec returned {took:?} after destroy; destroy must stop what the sandbox runs"
    );
    ensure!(
        sandbox.status() == SandboxStatus::Destroyed,
        "status after destroy must be Destroyed; it is {:?}",
        sandbox.status()
    );
    Ok(())
}

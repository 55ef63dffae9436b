//! Callers and scheduling: a slow subscriber, cancel at every stage, destroy during an
//! execution, 10,000 requests against a pool of two, an engine whose instances cannot
//! be created.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{EngineName, Error, ErrorCode, ExecRequest, ExecResult, Outcome, StreamKind};
use paddock_pool::{Execute, StreamEvent};

use crate::exhaustion::still_works;
use crate::harness::{clip, Check, Stop, H};

/// A program that runs for up to 30 s unless stopped; a shell or Python one is a
/// `sleep <token>` (so a survivor is seen).
fn long_running(h: &H) -> ExecRequest {
    let t = &h.token;
    h.program(
        &format!("echo started; exec sleep {t}"),
        &format!("import os\nprint('started', flush=True)\nos.execvp('sleep', ['sleep', '{t}'])"),
        "console.log('started'); while (true) {}",
    )
}

fn is_cancelled(answer: &Result<ExecResult, Error>) -> bool {
    match answer {
        Ok(r) => r.outcome == Outcome::Cancelled,
        Err(e) => e.code == ErrorCode::Cancelled,
    }
}

fn show(answer: &Result<ExecResult, Error>) -> String {
    match answer {
        Ok(r) => format!("{:?} stdout {:?}", r.outcome, clip(&r.stdout, 100)),
        Err(e) => e.to_string(),
    }
}

async fn wait_for(what: &str, patience: Duration, mut done: impl FnMut() -> bool) -> Check {
    let deadline = Instant::now() + patience;
    while !done() {
        if Instant::now() > deadline {
            fail!("timed out waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn pool_state(h: &H) -> Result<(usize, usize), Stop> {
    let stats = h
        .paddock()
        .stats()
        .await
        .map_err(|e| Stop::Fail(format!("stats: {e}")))?;
    let engine = h.target.engine();
    Ok(stats
        .pools
        .iter()
        .filter(|p| p.engine == engine)
        .fold((0, 0), |(b, w), p| (b + p.busy, w + p.waiting)))
}

pub(crate) async fn slow_subscriber(h: Arc<H>) -> Check {
    const TOTAL: usize = 8 << 20;
    let mut request = h.program(
        "yes 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde | head -c 8388608",
        "import sys\nline = 'y' * 63 + '\\n'\nfor _ in range(131072):\n    sys.stdout.write(line)",
        "const line = 'y'.repeat(63); for (let i = 0; i < 131072; i++) console.log(line);",
    );
    request.limits.max_output_bytes = Some(16 << 20);
    request.limits.timeout_ms = Some(120_000);
    let mut stream = h
        .paddock()
        .execute_stream(Execute::new(request).on(h.target.engine()))
        .await
        .map_err(|e| Stop::Fail(format!("execute_stream: {e}")))?;
    let (mut received, mut chunks) = (0usize, 0usize);
    let result = loop {
        match stream.next().await {
            Some(StreamEvent::Output(chunk)) => {
                if chunk.stream == StreamKind::Stdout {
                    received += chunk.data.len();
                }
                chunks += 1;
                // A subscriber that takes 20 ms over each of its first 50 chunks.
                if chunks <= 50 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Some(StreamEvent::Finished(result)) => break *result,
            None => fail!("the stream ended without a result"),
        }
    };
    let r = result.map_err(|e| Stop::Fail(format!("the streamed execution failed: {e}")))?;
    ensure!(r.is_success(), "the streamed execution: {r:?}");
    ensure!(
        r.stdout.len() == TOTAL && !r.stdout_truncated,
        "the result holds {} bytes, expected {TOTAL}",
        r.stdout.len()
    );
    ensure!(
        received == TOTAL,
        "the slow subscriber received {received} of {TOTAL} bytes in {chunks} chunks"
    );
    // A subscriber that walks away: the execution still ends, once, in the audit.
    let request = h.program(
        "yes | head -c 4194304",
        "import sys\nsys.stdout.write('y\\n' * (2 << 20))",
        "const l = 'y'.repeat(1023); for (let i = 0; i < 4096; i++) console.log(l);",
    );
    let id = request.id.clone();
    let mut stream = h
        .paddock()
        .execute_stream(Execute::new(request).on(h.target.engine()))
        .await
        .map_err(|e| Stop::Fail(format!("execute_stream: {e}")))?;
    let _ = stream.next().await;
    drop(stream);
    wait_for(
        "the abandoned execution was audited",
        Duration::from_secs(30),
        || h.audit_count(&id) == 1,
    )
    .await?;
    still_works(&h).await
}

pub(crate) async fn cancel_at_every_stage(h: Arc<H>) -> Check {
    let mut config = h.config();
    config.pool.min_idle = 1;
    config.pool.max_size = 1;
    h.restart(config).await?;
    let paddock = h.paddock();
    let engine = h.target.engine();

    // Running: the only instance runs A.
    let a = long_running(&h);
    let a_id = a.id.clone();
    let a_task = tokio::spawn({
        let p = paddock.clone();
        let engine = engine.clone();
        async move { p.execute_with(Execute::new(a).on(engine)).await }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool_state(&h).await?.0 == 0 {
        ensure!(Instant::now() < deadline, "A never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Queued: B waits for the instance A holds.
    let b = h.program("echo B-ran", "print('B-ran')", "console.log('B-ran')");
    let b_id = b.id.clone();
    let b_task = tokio::spawn({
        let p = paddock.clone();
        let engine = engine.clone();
        async move { p.execute_with(Execute::new(b).on(engine)).await }
    });
    while pool_state(&h).await?.1 == 0 {
        ensure!(Instant::now() < deadline, "B never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ensure!(
        paddock.cancel(&paddock_pool::Caller::Embedder, &b_id),
        "cancelling queued B returned false"
    );
    let b_answer = b_task.await.map_err(|e| Stop::Fail(e.to_string()))?;
    ensure!(
        is_cancelled(&b_answer),
        "queued B must end cancelled: {}",
        show(&b_answer)
    );
    if let Ok(r) = &b_answer {
        ensure!(!r.stdout.contains("B-ran"), "queued B ran after its cancel");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        paddock.cancel(&paddock_pool::Caller::Embedder, &a_id),
        "cancelling running A returned false"
    );
    let a_answer = a_task.await.map_err(|e| Stop::Fail(e.to_string()))?;
    ensure!(
        is_cancelled(&a_answer),
        "running A must end cancelled: {}",
        show(&a_answer)
    );
    h.no_survivors("cancelling a running execution").await?;
    ensure!(
        !paddock.cancel(&paddock_pool::Caller::Embedder, &a_id),
        "a second cancel of A returned true"
    );

    // After finish: the cancel is refused and the result stands.
    let d = h.program("echo done", "print('done')", "console.log('done')");
    let d_id = d.id.clone();
    let r = h.exec(d).await?;
    ensure!(r.is_success(), "D: {r:?}");
    ensure!(
        !paddock.cancel(&paddock_pool::Caller::Embedder, &d_id),
        "cancelling finished D returned true"
    );

    // Starting: every execution needs a new instance; cancel while it is made, or
    // just after. Whatever the race, cancel's answer and the execution's agree.
    let mut config = h.config();
    config.pool.min_idle = 0;
    config.pool.max_executions_per_engine = 1;
    h.restart(config).await?;
    let paddock = h.paddock();
    let mut cancelled = 0;
    for delay_us in [0u64, 200, 1_000, 3_000, 10_000, 30_000, 100_000] {
        let c = h.program("echo C-ran", "print('C-ran')", "console.log('C-ran')");
        let c_id = c.id.clone();
        let task = tokio::spawn({
            let p = paddock.clone();
            let engine = engine.clone();
            async move { p.execute_with(Execute::new(c).on(engine)).await }
        });
        if delay_us == 0 {
            // At once once it is accepted: spin until the scheduler has registered it
            // (or it is already over), so that one cancel lands while the instance
            // is made even when the task is scheduled late on a loaded host.
            while paddock
                .running_tenant(&paddock_pool::Caller::Embedder, &c_id)
                .is_none()
                && !task.is_finished()
            {
                tokio::task::yield_now().await;
            }
        } else {
            tokio::time::sleep(Duration::from_micros(delay_us)).await;
        }
        let won = paddock.cancel(&paddock_pool::Caller::Embedder, &c_id);
        let answer = task.await.map_err(|e| Stop::Fail(e.to_string()))?;
        if won {
            cancelled += 1;
            ensure!(
                is_cancelled(&answer),
                "cancel returned true after {delay_us} µs but C ended {}",
                show(&answer)
            );
        } else {
            ensure!(
                matches!(&answer, Ok(r) if r.is_success()),
                "cancel returned false after {delay_us} µs but C ended {}",
                show(&answer)
            );
        }
    }
    ensure!(
        cancelled > 0,
        "no cancel landed before an execution finished"
    );
    h.restart(h.config()).await?;
    still_works(&h).await
}

pub(crate) async fn destroy_during_exec(h: Arc<H>) -> Check {
    let sandbox = h.sandbox().await?;
    let workdir = std::path::PathBuf::from(&sandbox.info().host_dir);
    let exec = tokio::spawn({
        let sandbox = sandbox.clone();
        let request = long_running(&h);
        async move { sandbox.exec(request).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    sandbox
        .destroy()
        .await
        .map_err(|e| Stop::Fail(format!("destroy: {e}")))?;
    let answer = tokio::time::timeout(Duration::from_secs(10), exec)
        .await
        .map_err(|_| Stop::Fail("the execution outlived destroy by 10 s".into()))?
        .map_err(|e| Stop::Fail(e.to_string()))?;
    let took = started.elapsed();
    let clean = matches!(&answer, Ok(r) if r.is_success());
    ensure!(!clean, "an execution ended by destroy reported success");
    ensure!(
        matches!(&answer, Ok(r) if matches!(r.outcome, Outcome::Cancelled | Outcome::Failed { .. }))
            || matches!(&answer, Err(e) if matches!(e.code, ErrorCode::EngineDisposed | ErrorCode::Cancelled)),
        "destroy must end the execution cancelled or failed: {}",
        show(&answer)
    );
    ensure!(took < Duration::from_secs(10), "destroy took {took:?}");
    h.no_survivors("destroy during an execution").await?;
    crate::harness::emptied(&workdir, "destroy")?;
    let later = sandbox.exec(h.program("true", "pass", "1")).await;
    ensure!(
        matches!(&later, Err(e) if matches!(e.code, ErrorCode::EngineDisposed | ErrorCode::NotFound)),
        "an exec after destroy must be refused: {}",
        show(&later)
    );
    still_works(&h).await
}

pub(crate) async fn ten_thousand_queued(h: Arc<H>) -> Check {
    const N: usize = 10_000;
    let paddock = h.paddock();
    let engine = h.target.engine();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(N);
    for _ in 0..N {
        let request = h.program(
            "sleep 0.05",
            "import time\ntime.sleep(0.05)",
            "const end = Date.now() + 50; while (Date.now() < end) {}",
        );
        let p = paddock.clone();
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let id = request.id.clone();
            (id, p.execute_with(Execute::new(request).on(engine)).await)
        }));
    }
    let (mut ok, mut exhausted, mut limited) = (0usize, 0usize, 0usize);
    let mut ids = HashSet::new();
    let mut odd = Vec::new();
    for t in tasks {
        let (id, answer) = t.await.map_err(|e| Stop::Fail(e.to_string()))?;
        match answer {
            Ok(r) if r.is_success() && r.id == id => {
                ok += 1;
                ensure!(ids.insert(id), "an execution was answered twice");
            }
            Err(e) if e.code == ErrorCode::PoolExhausted => {
                ensure!(
                    e.retry_after_ms.is_some(),
                    "POOL_EXHAUSTED without retry_after_ms"
                );
                exhausted += 1;
            }
            Err(e) if e.code == ErrorCode::RateLimited => limited += 1,
            other => odd.push(show(&other)),
        }
    }
    let took = started.elapsed();
    ensure!(
        odd.is_empty(),
        "{} unexpected answers, first {:?}",
        odd.len(),
        odd.first()
    );
    ensure!(
        ok + exhausted + limited == N,
        "answers: {ok} + {exhausted} + {limited} != {N}"
    );
    ensure!(ok >= 2, "only {ok} executions ran");
    ensure!(
        exhausted > 0,
        "a pool of 2 with 32 places never refused 10,000 callers"
    );
    for id in &ids {
        ensure!(h.audit_count(id) <= 1, "{id} audited twice");
    }
    println!(
        "ten_thousand_queued: {ok} ran, {exhausted} POOL_EXHAUSTED, {limited} RATE_LIMITED in {took:?}"
    );
    still_works(&h).await
}

pub(crate) async fn engine_creation_fails(h: Arc<H>) -> Check {
    if h.target.engine() == EngineName::CONTAINER {
        container_start_refusals(&h).await?;
    }
    // Every execution needs a new instance; then the engine's directory vanishes.
    let mut config = h.config();
    config.pool.min_idle = 0;
    config.pool.max_executions_per_engine = 1;
    config.pool.backoff_initial_ms = 50;
    config.pool.backoff_max_ms = 200;
    config.pool.failure_threshold = 2;
    h.restart(config).await?;
    still_works(&h).await?;
    // The used instance is retired after its answer; let its teardown finish first.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = h
            .paddock()
            .stats()
            .await
            .map_err(|e| Stop::Fail(e.to_string()))?;
        if stats.pools.iter().all(|p| p.size == 0 && p.destroying == 0) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the used instance was never torn down: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sub = match h.target.engine().as_str() {
        "isolate" => "isolate",
        "container" => "container",
        _ => "subprocess",
    };
    let dir = h.root.join(sub);
    let aside = h.root.join(format!("{sub}.aside"));
    std::fs::rename(&dir, &aside).map_err(|e| Stop::Fail(format!("moving the root: {e}")))?;
    std::fs::write(&dir, b"not a directory").map_err(|e| Stop::Fail(e.to_string()))?;
    h.allow_degraded();
    let mut codes = Vec::new();
    for _ in 0..4 {
        let started = Instant::now();
        let answer = h
            .answer(h.program("echo x", "print('x')", "console.log('x')"))
            .await;
        ensure!(
            started.elapsed() < Duration::from_secs(20),
            "a failing creation took {:?} to answer",
            started.elapsed()
        );
        match answer {
            Err(e) => codes.push(e.code),
            Ok(r) => match r.outcome.error_code() {
                Some(code) => codes.push(code),
                None => fail!("an execution ran without its engine's directory: {r:?}"),
            },
        }
    }
    let degraded = h
        .paddock()
        .stats()
        .await
        .map_err(|e| Stop::Fail(e.to_string()))?
        .pools
        .iter()
        .any(|p| p.degraded);
    // Repaired: the pool recovers by itself.
    std::fs::remove_file(&dir).map_err(|e| Stop::Fail(e.to_string()))?;
    std::fs::rename(&aside, &dir).map_err(|e| Stop::Fail(e.to_string()))?;
    ensure!(
        codes.iter().all(|c| matches!(
            c,
            ErrorCode::EngineFailed | ErrorCode::SpawnFailed | ErrorCode::WorkerFailed
        )),
        "creation failures must be answered with a typed engine error: {codes:?}"
    );
    ensure!(
        degraded,
        "failed creations in a row must open the breaker (answers {codes:?})"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = h
            .answer(h.program("echo ok", "print('ok')", "console.log('ok')"))
            .await;
        if matches!(&answer, Ok(r) if r.is_success()) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the pool did not recover within 20 s of the repair: {}",
            show(&answer)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("engine_creation_fails: answers {codes:?}, breaker opened: {degraded}");
    h.restart(h.config()).await?;
    still_works(&h).await
}

/// A container engine that cannot run is refused when Paddock starts, with the
/// cause: a runtime that is not there, a root file system without a shell.
async fn container_start_refusals(h: &H) -> Check {
    let mut missing_runtime = h.config();
    missing_runtime.container.runtime_path = Some("/nonexistent/paddock-test/crun".into());
    let empty = h.root.join("empty-rootfs");
    std::fs::create_dir_all(&empty).map_err(|e| Stop::Fail(e.to_string()))?;
    let mut shell_less = h.config();
    shell_less.container.rootfs = Some(empty);
    for (config, cause) in [
        (missing_runtime, "/nonexistent/paddock-test/crun"),
        (shell_less, "/bin/sh"),
    ] {
        match h.try_start(config) {
            Ok(p) => {
                h.retire(p).await;
                fail!("Paddock started with a container engine that cannot run ({cause})");
            }
            Err(e) => ensure!(
                e.code == ErrorCode::EngineFailed && e.message.contains(cause),
                "the refusal must be ENGINE_FAILED naming `{cause}`: {e}"
            ),
        }
    }
    Ok(())
}

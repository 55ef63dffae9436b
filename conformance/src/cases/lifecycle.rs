//! Sandbox status, separation and destroy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, DiscardSink, ErrorCode, Outcome, Sandbox, SandboxSpec, SandboxStatus,
};

use crate::case::{expect_code, Check, OrFail, Stop};
use crate::context::{brief, exec, sh, Ctx};

pub(crate) async fn status_busy_while_running(ctx: Ctx) -> Check {
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
                .exec(sh("sleep 1", &[]), &DiscardSink, CancelToken::new())
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
        .or_fail("exec of `sleep 1`")?;
    ensure!(r.is_success(), "`sleep 1` must succeed; got {}", brief(&r));
    ensure!(
        last == SandboxStatus::Busy && running,
        "status must be Busy while `sleep 1` runs; it stayed {last:?} (exec still running: {running})"
    );
    ensure!(
        sandbox.status() == SandboxStatus::Ready,
        "status must be Ready after the execution ended; it is {:?}",
        sandbox.status()
    );
    Ok(())
}

pub(crate) async fn sandboxes_are_separate(ctx: Ctx) -> Check {
    let a = ctx.sandbox().await?;
    let b = ctx.sandbox().await?;
    ensure!(a.id() != b.id(), "two sandboxes share the id {:?}", a.id());
    ensure!(
        a.host_dir() != b.host_dir(),
        "two sandboxes share the workdir {}",
        a.host_dir().display()
    );
    let other_engine = ctx.fresh_engine().await?;
    let c = other_engine
        .create(&SandboxSpec::default())
        .await
        .or_fail("create on a second engine from the factory")?;
    ctx.track(c.clone());
    ensure!(
        c.id() != a.id() && c.id() != b.id(),
        "sandbox ids must be unique across engine instances; a second engine reused {:?}",
        c.id()
    );
    ensure!(
        c.host_dir() != a.host_dir() && c.host_dir() != b.host_dir(),
        "a second engine's sandbox shares the workdir {}",
        c.host_dir().display()
    );
    a.write_file("only-in-a.txt", b"a")
        .await
        .or_fail("write_file in the first sandbox")?;
    expect_code(
        b.read_file("only-in-a.txt").await,
        ErrorCode::NotFound,
        "read_file in the second sandbox of a file written in the first",
    )?;
    let r = exec(&*b, sh("test -e only-in-a.txt", &[])).await?;
    ensure!(
        r.exit_code() == Some(1),
        "a program in the second sandbox must not see the first sandbox's file; `test -e` gave {}",
        brief(&r)
    );
    c.destroy().await.or_fail("destroy on the second engine")?;
    let r = exec(&*a, sh("cat only-in-a.txt", &[])).await?;
    ensure!(
        r.is_success() && r.stdout == "a",
        "destroying another engine's sandbox must not affect this one; got {}",
        brief(&r)
    );
    Ok(())
}

pub(crate) async fn destroy_is_idempotent(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    sandbox.destroy().await.or_fail("first destroy")?;
    sandbox.destroy().await.or_fail("second destroy")?;
    ensure!(
        sandbox.status() == SandboxStatus::Destroyed,
        "status after destroy must be Destroyed; it is {:?}",
        sandbox.status()
    );

    let sandbox = ctx.sandbox().await?;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let sandbox: Arc<dyn Sandbox> = sandbox.clone();
            tokio::spawn(async move { sandbox.destroy().await })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        task.await
            .map_err(|e| Stop::Fail(format!("concurrent destroy task {i} failed: {e}")))?
            .or_fail(format_args!("concurrent destroy {i} of 8"))?;
    }
    ensure!(
        sandbox.status() == SandboxStatus::Destroyed,
        "status after eight concurrent destroys must be Destroyed; it is {:?}",
        sandbox.status()
    );
    Ok(())
}

pub(crate) async fn destroy_refuses_later_calls(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    sandbox
        .write_file("before.txt", b"x")
        .await
        .or_fail("write_file before destroy")?;
    sandbox.destroy().await.or_fail("destroy")?;
    ensure!(
        sandbox.status() == SandboxStatus::Destroyed,
        "status after destroy must be Destroyed; it is {:?}",
        sandbox.status()
    );
    const CODE: ErrorCode = ErrorCode::EngineDisposed;
    expect_code(
        sandbox
            .exec(sh("exit 0", &[]), &DiscardSink, CancelToken::new())
            .await
            .map(|r| brief(&r)),
        CODE,
        "exec after destroy",
    )?;
    expect_code(
        sandbox.write_file("after.txt", b"x").await,
        CODE,
        "write_file after destroy",
    )?;
    expect_code(
        sandbox.read_file("before.txt").await,
        CODE,
        "read_file after destroy",
    )?;
    expect_code(
        sandbox.list_files("").await,
        CODE,
        "list_files after destroy",
    )?;
    expect_code(sandbox.recycle().await, CODE, "recycle after destroy")?;
    ensure!(
        !sandbox.host_dir().exists(),
        "destroy must free the sandbox's resources, but its workdir {} still exists",
        sandbox.host_dir().display()
    );
    Ok(())
}

pub(crate) async fn destroy_kills_running_exec(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let task = {
        let sandbox = sandbox.clone();
        tokio::spawn(async move {
            let r = sandbox
                .exec(
                    sh("trap '' TERM; sleep 30", &[]).with_timeout_ms(60_000),
                    &DiscardSink,
                    CancelToken::new(),
                )
                .await;
            (r, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !task.is_finished(),
        "`sleep 30` ended within 300 ms: {:?}",
        task.await.map(|(r, _)| r.map(|r| brief(&r)))
    );
    let destroyed_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), sandbox.destroy())
        .await
        .map_err(|_| Stop::Fail("destroy during a running execution took more than 5 s".into()))?
        .or_fail("destroy during a running execution")?;
    let (r, returned_at) = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .map_err(|_| {
            Stop::Fail(
                "exec of `sleep 30` (ignoring SIGTERM) was still running 5 s after destroy returned"
                    .into(),
            )
        })?
        .map_err(|e| Stop::Fail(format!("the exec task failed: {e}")))?;
    let took = returned_at.saturating_duration_since(destroyed_at);
    // The program had started, so the end is reported in the outcome, not as an error.
    let r = r.or_fail("exec ended by destroy")?;
    ensure!(
        !matches!(r.outcome, Outcome::Completed { exit_code: 0, .. }),
        "an execution ended by destroy must not be a clean success; got {} after {took:?}",
        brief(&r)
    );
    ensure!(
        took <= Duration::from_secs(2),
        "exec returned {took:?} after destroy; destroy must kill what the sandbox runs"
    );
    Ok(())
}

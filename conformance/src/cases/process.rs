//! Abort, deadline and background processes: nothing the program started survives.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{
    CancelToken, DiscardSink, ErrorCode, ExecResult, Outcome, Sandbox, StreamKind, TokenState,
};

use crate::case::{Check, OrFail, Stop};
use crate::context::{brief, exec, sh, Ctx, RecordingSink};

/// Starts a child that ignores SIGTERM and which itself starts a background
/// grandchild that ignores SIGTERM. The child writes `child.marker` after `$1`
/// seconds, the grandchild writes `grandchild.marker` after `$2` seconds; the child
/// waits for the grandchild. Ignored signals are inherited, so `sleep` ignores TERM
/// too: only SIGKILL (or a kill of the whole tree) stops them.
const TREE: &str = r#"
echo started
sh -c '
  trap "" TERM
  ( trap "" TERM; sleep "$2"; echo alive > grandchild.marker ) &
  sleep "$1"
  echo alive > child.marker
  wait
' child "$1" "$2"
echo done
"#;

const MARKERS: [&str; 2] = ["child.marker", "grandchild.marker"];

/// Child and grandchild delays for the runs that must be killed.
const CHILD_DELAY: &str = "1.2";
const GRANDCHILD_DELAY: &str = "1.8";
/// How long after the tree started the markers are checked: past both delays.
const MARKER_CHECK_AFTER: Duration = Duration::from_millis(2_500);

/// Proves the tree script writes both markers when nobody kills it, so that an absent
/// marker later means "killed", not "the script never worked".
async fn tree_control(ctx: &Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let r = exec(&*sandbox, sh(TREE, &["0", "0"])).await?;
    ensure!(
        r.is_success() && r.stdout == "started\ndone\n",
        "control run of the process-tree script (no delays) must succeed; got {}",
        brief(&r)
    );
    for marker in MARKERS {
        ensure!(
            sandbox.host_dir().join(marker).exists(),
            "control run: {marker} was not written in the workdir {}, so the tree script cannot prove anything",
            sandbox.host_dir().display()
        );
    }
    Ok(())
}

/// Fails if a marker exists in `root`.
fn no_markers(root: &Path, when: &str) -> Check {
    for marker in MARKERS {
        ensure!(
            !root.join(marker).exists(),
            "{marker} was written {when}: a process of the tree outlived the execution \
             (the TERM-trapping child or its background grandchild was not killed)"
        );
    }
    Ok(())
}

fn spawn_exec(
    sandbox: &Arc<dyn Sandbox>,
    request: paddock_core::ExecRequest,
    sink: Arc<RecordingSink>,
    cancel: CancelToken,
) -> tokio::task::JoinHandle<(paddock_core::Result<ExecResult>, Instant)> {
    let sandbox = sandbox.clone();
    tokio::spawn(async move {
        let r = sandbox.exec(request, &*sink, cancel).await;
        (r, Instant::now())
    })
}

pub(crate) async fn abort_kills_process_tree(ctx: Ctx) -> Check {
    tree_control(&ctx).await?;
    let sandbox = ctx.sandbox().await?;
    let sink = Arc::new(RecordingSink::new());
    let token = CancelToken::new();
    let started = Instant::now();
    let task = spawn_exec(
        &sandbox,
        sh(TREE, &[CHILD_DELAY, GRANDCHILD_DELAY]),
        sink.clone(),
        token.clone(),
    );

    // Cancel 300 ms after the script said it started, so the tree exists; if the
    // output does not stream (another case checks that), cancel 700 ms in.
    let deadline = started + Duration::from_millis(700);
    let tree_started = loop {
        if let Some(at) = sink.seen_at(StreamKind::Stdout, b"started") {
            break at;
        }
        if Instant::now() > deadline || task.is_finished() {
            break started;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep_until((tree_started + Duration::from_millis(300)).into()).await;
    let cancelled_at = Instant::now();
    let won = token.cancel();

    let (r, returned_at) = task
        .await
        .map_err(|e| Stop::Fail(format!("the exec task failed: {e}")))?;
    let r = r.or_fail("exec of the process-tree script")?;
    ensure!(
        won,
        "cancel() 300 ms into a program that runs 1.8 s returned false: the token was \
         already settled (state {:?}); got {}",
        token.state(),
        brief(&r)
    );
    ensure!(
        r.outcome == Outcome::Cancelled,
        "a cancelled execution must end as Cancelled; got {}",
        brief(&r)
    );
    let took = returned_at.saturating_duration_since(cancelled_at);
    ensure!(
        took <= Duration::from_millis(1_500),
        "exec returned {took:?} after cancel; cancel must kill the tree (SIGKILL, not only \
         SIGTERM, which the child ignores) and return promptly (within 1.5 s)"
    );
    no_markers(
        sandbox.host_dir(),
        "right after the cancelled exec returned",
    )?;
    tokio::time::sleep_until((tree_started + MARKER_CHECK_AFTER).into()).await;
    no_markers(sandbox.host_dir(), "after the execution was cancelled")
}

pub(crate) async fn timeout_kills_process_tree(ctx: Ctx) -> Check {
    tree_control(&ctx).await?;
    let sandbox = ctx.sandbox().await?;
    let started = Instant::now();
    let r = exec(
        &*sandbox,
        sh(TREE, &[CHILD_DELAY, GRANDCHILD_DELAY]).with_timeout_ms(500),
    )
    .await?;
    let took = started.elapsed();
    ensure!(
        r.outcome == Outcome::TimedOut,
        "a program running 1.8 s with timeout_ms = 500 must end as TimedOut; got {} after {took:?}",
        brief(&r)
    );
    ensure!(
        took >= Duration::from_millis(450),
        "TimedOut after only {took:?}; the deadline was 500 ms"
    );
    ensure!(
        took < Duration::from_millis(3_000),
        "TimedOut reported after {took:?}; a 500 ms deadline must kill the tree \
         (including a SIGTERM-ignoring child) promptly (within 3 s)"
    );
    tokio::time::sleep_until((started + MARKER_CHECK_AFTER).into()).await;
    no_markers(sandbox.host_dir(), "after the execution timed out")
}

pub(crate) async fn exec_reaps_background(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let control = exec(
        &*sandbox,
        sh(
            "( sleep 0; echo alive > control.marker ) >/dev/null 2>&1 & wait",
            &[],
        ),
    )
    .await?;
    ensure!(
        control.is_success() && sandbox.host_dir().join("control.marker").exists(),
        "control: a background job that is waited for must write its marker; got {}",
        brief(&control)
    );

    let started = Instant::now();
    let r = exec(
        &*sandbox,
        sh(
            "( trap '' TERM; sleep 1; echo alive > background.marker ) >/dev/null 2>&1 & echo started",
            &[],
        ),
    )
    .await?;
    ensure!(
        r.is_success() && r.stdout == "started\n",
        "expected a clean success printing \"started\"; got {}",
        brief(&r)
    );
    tokio::time::sleep_until((started + Duration::from_millis(1_700)).into()).await;
    ensure!(
        !sandbox.host_dir().join("background.marker").exists(),
        "a background process (ignoring SIGTERM, output to /dev/null) outlived the execution \
         that started it and wrote background.marker 1 s later"
    );
    Ok(())
}

/// How many times the race between cancel and completion is run.
const RACE_ROUNDS: u32 = 40;

pub(crate) async fn abort_is_never_success(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    // How long a trivial execution takes, to spread the cancels around its end.
    let probe = Instant::now();
    let r = exec(&*sandbox, sh("exit 0", &[])).await?;
    ensure!(r.is_success(), "`sh -c 'exit 0'` failed: {}", brief(&r));
    let typical = probe.elapsed().max(Duration::from_millis(1));

    for round in 0..RACE_ROUNDS {
        let token = CancelToken::new();
        let pre_cancel = round == 0;
        let mut won = pre_cancel && token.cancel();
        let returned = Arc::new(AtomicBool::new(false));
        let task = {
            let sandbox = sandbox.clone();
            let token = token.clone();
            let returned = returned.clone();
            tokio::spawn(async move {
                let r = sandbox.exec(sh("exit 0", &[]), &DiscardSink, token).await;
                returned.store(true, Ordering::SeqCst);
                r
            })
        };
        let mut returned_first = false;
        if !pre_cancel {
            let delay = typical.mul_f64(f64::from(round % 20) / 10.0);
            if delay.is_zero() {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(delay).await;
            }
            returned_first = returned.load(Ordering::SeqCst);
            won = token.cancel();
        }
        let r = task
            .await
            .map_err(|e| Stop::Fail(format!("round {round}: the exec task failed: {e}")))?;
        let r = match r {
            // A request cancelled before it started may be refused instead.
            Err(e) if pre_cancel && e.code == ErrorCode::Cancelled => continue,
            Err(e) => fail!("round {round}: exec failed with {e}"),
            Ok(r) => r,
        };
        let state = token.state();
        if won && !returned_first {
            ensure!(
                r.outcome == Outcome::Cancelled,
                "round {round}: cancel() returned true before exec returned, so the execution \
                 was cancelled; it must be reported as Cancelled (never a clean success), got {} \
                 (pre-cancelled: {pre_cancel})",
                brief(&r)
            );
        } else if won {
            fail!(
                "round {round}: exec returned {} but left the cancel token live, so a later \
                 cancel() still won; an engine must settle the token with CancelToken::finish \
                 when the program exits, so a racing cancel is never lost",
                brief(&r)
            );
        } else {
            ensure!(
                state == TokenState::Finished,
                "round {round}: cancel() lost the race but the token is {state:?}"
            );
            ensure!(
                r.is_success(),
                "round {round}: the engine finished the token (the program completed before any \
                 cancel), so the result must be the program's clean success; got {}",
                brief(&r)
            );
        }
    }
    Ok(())
}

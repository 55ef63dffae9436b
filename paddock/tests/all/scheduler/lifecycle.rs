//! Scheduler lifecycle: the circuit breaker, panics in engine code, recycling limits,
//! idle reaping, tainted instances, streaming backpressure, the limiter and the audit
//! log in the pipeline, telemetry, and shutdown.
//!
//! Most tests run the real subprocess engine; the breaker and panic tests use a small
//! scripted engine (the thing under test is the pool around it).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use paddock::PaddockConfig;
use paddock_core::{
    CancelToken, Capabilities, Engine, EngineName, Error, ErrorCode, ExecRequest, ExecResult,
    ExecutionId, FileEntry, IsolationLevel, Language, Outcome, OutputChunk, OutputSink, Program,
    ProgramKind, Result, Sandbox, SandboxSpec, SandboxStatus, StreamKind,
};
use paddock_pool::audit::{AuditConfig, AuditEntry, AuditOutcome, AuditQuery, KillReason};
use paddock_pool::limiter::LimiterConfig;
use paddock_pool::streamer::StreamerConfig;
use paddock_pool::{Execute, Paddock, PoolStats, StreamEvent};

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(Program::command(["sh", "-c", script]))
}

/// The default pool (network policy `none`) of `engine`.
async fn pool_stats(paddock: &Paddock, engine: EngineName) -> PoolStats {
    let stats = paddock.stats().await.unwrap();
    stats
        .pools
        .into_iter()
        .find(|p| p.engine == engine && p.network == "none")
        .unwrap_or_else(|| panic!("no default {engine} pool"))
}

/// Polls `check` every 10 ms until it returns true or `limit` passes.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Cancels `id` as soon as it shows up as running.
async fn cancel_when_running(paddock: &Paddock, id: &ExecutionId) {
    let p = paddock.clone();
    let cancelled = eventually(Duration::from_secs(3), || {
        let p = p.clone();
        let id = id.clone();
        async move { p.cancel(&paddock_pool::Caller::Embedder, &id) }
    })
    .await;
    assert!(cancelled, "execution {id} never showed up as running");
}

// ---------------------------------------------------------------------------------
// A scripted engine: creation can be made to fail, an execution can be made to panic.
// ---------------------------------------------------------------------------------

#[derive(Debug)]
struct Flaky {
    caps: Capabilities,
    /// `create` fails (naming a missing interpreter) while this is false.
    healthy: AtomicBool,
    /// The next `exec` panics.
    panic_next: Arc<AtomicBool>,
    create_calls: AtomicUsize,
    next_id: AtomicU64,
    /// How long `create` works on a blocking thread before its sandbox exists, as
    /// engines make workdirs and cgroups.
    create_delay_ms: AtomicU64,
    /// Sandboxes `create` finished making, and how many of them were destroyed.
    made: Arc<AtomicUsize>,
    destroyed: Arc<AtomicUsize>,
}

impl Flaky {
    fn new(healthy: bool) -> Arc<Flaky> {
        Arc::new(Flaky {
            caps: Capabilities::new(
                IsolationLevel::None,
                &[ProgramKind::Command],
                &["none"],
                &[],
            ),
            healthy: AtomicBool::new(healthy),
            panic_next: Arc::new(AtomicBool::new(false)),
            create_calls: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            create_delay_ms: AtomicU64::new(0),
            made: Arc::default(),
            destroyed: Arc::default(),
        })
    }
}

#[async_trait]
impl Engine for Flaky {
    fn name(&self) -> EngineName {
        EngineName::NOOP
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    async fn create(&self, _spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        self.create_calls.fetch_add(1, Ordering::SeqCst);
        if !self.healthy.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorCode::SpawnFailed,
                "interpreter missing: `python9` was not found on PATH",
            ));
        }
        let delay = Duration::from_millis(self.create_delay_ms.load(Ordering::SeqCst));
        let made = self.made.clone();
        // Made on a blocking thread, which goes on whether or not anybody still
        // waits for it.
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(delay);
            made.fetch_add(1, Ordering::SeqCst);
        })
        .await
        .unwrap();
        let n = self.next_id.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(FlakySandbox {
            id: format!("flaky-{n}"),
            panic_next: self.panic_next.clone(),
            destroyed: self.destroyed.clone(),
        }))
    }
}

#[derive(Debug)]
struct FlakySandbox {
    id: String,
    panic_next: Arc<AtomicBool>,
    destroyed: Arc<AtomicUsize>,
}

#[async_trait]
impl Sandbox for FlakySandbox {
    fn id(&self) -> &str {
        &self.id
    }
    fn engine(&self) -> EngineName {
        EngineName::NOOP
    }
    fn root_dir(&self) -> &Path {
        Path::new("/flaky")
    }
    fn status(&self) -> SandboxStatus {
        SandboxStatus::Ready
    }
    async fn exec(
        &self,
        request: ExecRequest,
        _sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        tokio::task::yield_now().await;
        if self.panic_next.swap(false, Ordering::SeqCst) {
            panic!("scripted exec panic in {}", self.id);
        }
        Ok(ExecResult::empty(
            request.id,
            ExecResult::noop_outcome(&cancel),
            EngineName::NOOP,
            self.id.clone(),
        ))
    }
    async fn write_file(&self, _: &str, _: &[u8]) -> Result<()> {
        Ok(())
    }
    async fn read_file(&self, _: &str) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }
    async fn list_files(&self, _: &str) -> Result<Vec<FileEntry>> {
        Ok(Vec::new())
    }
    async fn recycle(&self) -> Result<()> {
        Ok(())
    }
    async fn destroy(&self) -> Result<()> {
        self.destroyed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn start_flaky(engine: Arc<Flaky>, config: PaddockConfig) -> Paddock {
    paddock::builder()
        .config(config)
        .without_subprocess()
        .without_isolate()
        .engine(engine)
        .start()
        .unwrap()
}

// ---------------------------------------------------------------------------------
// 1. Circuit breaker
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_that_outlives_its_caller_is_finished_and_destroyed() {
    // The caller stops waiting (here: `create_timeout_ms`) while the engine is
    // still making the sandbox; what the engine made is destroyed, not left behind.
    let engine = Flaky::new(true);
    engine.create_delay_ms.store(600, Ordering::SeqCst);
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 0;
    config.pool.max_size = 1;
    config.pool.create_timeout_ms = 100;
    let paddock = start_flaky(engine.clone(), config);
    let e = paddock
        .execute(ExecRequest::new(Program::command(["x"])))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::EngineFailed, "{e}");
    assert!(e.message.contains("took longer than 100 ms"), "{e}");
    assert_eq!(engine.made.load(Ordering::SeqCst), 0);
    // Until it is made and destroyed, the pool counts it as being destroyed (a
    // shutdown waits for it).
    let p = pool_stats(&paddock, EngineName::NOOP).await;
    assert_eq!(p.destroying, 1, "{p:?}");
    let settled = eventually(Duration::from_secs(5), || {
        let (engine, paddock) = (engine.clone(), paddock.clone());
        async move {
            let p = pool_stats(&paddock, EngineName::NOOP).await;
            engine.made.load(Ordering::SeqCst) == 1
                && engine.destroyed.load(Ordering::SeqCst) == 1
                && p.destroying == 0
        }
    })
    .await;
    assert!(
        settled,
        "made {}, destroyed {}, {:?}",
        engine.made.load(Ordering::SeqCst),
        engine.destroyed.load(Ordering::SeqCst),
        pool_stats(&paddock, EngineName::NOOP).await
    );
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_creation_opens_the_breaker_and_a_success_closes_it() {
    let engine = Flaky::new(false);
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 0;
    config.pool.max_size = 2;
    config.pool.failure_threshold = 3;
    config.pool.backoff_initial_ms = 300;
    config.pool.backoff_max_ms = 5_000;
    let paddock = start_flaky(engine.clone(), config);
    let run = || paddock.execute(ExecRequest::new(Program::command(["x"])));

    // Below the threshold every caller tries, and sees the engine's own error.
    for i in 1..=3 {
        let e = run().await.unwrap_err();
        assert_eq!(e.code, ErrorCode::SpawnFailed, "attempt {i}: {e}");
        assert!(e.message.contains("interpreter missing"), "{e}");
        assert_eq!(engine.create_calls.load(Ordering::SeqCst), i);
    }
    let p = pool_stats(&paddock, EngineName::NOOP).await;
    assert!(p.degraded, "{p:?}");
    let cause = p
        .degraded_cause
        .clone()
        .expect("a degraded pool names its cause");
    assert!(cause.contains("interpreter missing"), "{cause}");
    assert_eq!(p.create_failures_total, 3);

    // Open: refused fast, naming the cause, with a retry hint within the backoff.
    let e = run().await.unwrap_err();
    assert_eq!(e.code, ErrorCode::EngineFailed, "{e}");
    assert!(e.message.contains("interpreter missing"), "{e}");
    assert!(e.message.contains("degraded"), "{e}");
    let retry = e.retry_after_ms.expect("retry_after_ms while degraded");
    assert!(retry > 0 && retry <= 300, "retry_after_ms {retry}");
    assert_eq!(
        engine.create_calls.load(Ordering::SeqCst),
        3,
        "an open breaker must not call the engine"
    );

    // Half-open: one probe after the backoff; it fails, so the breaker reopens at
    // once with a doubled backoff.
    tokio::time::sleep(Duration::from_millis(retry + 50)).await;
    let e = run().await.unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::SpawnFailed,
        "the probe reaches the engine: {e}"
    );
    assert_eq!(engine.create_calls.load(Ordering::SeqCst), 4);
    let e = run().await.unwrap_err();
    assert_eq!(e.code, ErrorCode::EngineFailed, "{e}");
    assert!(e.message.contains("4 times in a row"), "{e}");
    let retry = e.retry_after_ms.expect("retry_after_ms while degraded");
    assert!(retry > 300 && retry <= 600, "doubled backoff, got {retry}");

    // The engine recovers: after the backoff a success closes the breaker.
    engine.healthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(retry + 50)).await;
    let r = run().await.unwrap();
    assert!(r.is_success(), "{r:?}");
    let p = pool_stats(&paddock, EngineName::NOOP).await;
    assert!(!p.degraded, "{p:?}");
    assert_eq!(p.degraded_cause, None);
    assert_eq!(p.created_total, 1);
    assert!(run().await.unwrap().is_success());
    paddock.shutdown(Duration::from_secs(2)).await.unwrap();
}

// ---------------------------------------------------------------------------------
// 2. Engine panic
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_exec_fails_the_call_and_retires_the_instance() {
    let engine = Flaky::new(true);
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 0;
    config.pool.max_size = 1;
    let paddock = start_flaky(engine.clone(), config);
    let run = || paddock.execute(ExecRequest::new(Program::command(["x"])));

    let first = run().await.unwrap();
    let before = pool_stats(&paddock, EngineName::NOOP).await;
    assert_eq!(before.retired_total, 0);

    engine.panic_next.store(true, Ordering::SeqCst);
    let req = ExecRequest::new(Program::command(["x"]));
    let panicked_id = req.id.clone();
    let e = paddock.execute(req).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::EngineFailed, "{e}");
    assert!(e.message.contains("panic"), "{e}");
    assert!(e.message.contains("scripted exec panic"), "{e}");

    let after = pool_stats(&paddock, EngineName::NOOP).await;
    assert_eq!(
        after.retired_total,
        before.retired_total + 1,
        "the instance that panicked is retired: {after:?}"
    );
    // The scheduler is still alive and the next execution gets a fresh instance.
    let next = run().await.unwrap();
    assert!(next.is_success());
    assert_ne!(next.instance_id, first.instance_id);
    assert_eq!(
        pool_stats(&paddock, EngineName::NOOP).await.created_total,
        2
    );

    let entries = paddock
        .audit(&paddock_pool::Caller::Embedder, AuditQuery::default())
        .await
        .unwrap();
    let entry = entries
        .iter()
        .find(|e| e.id == panicked_id)
        .expect("the failed execution is audited");
    assert_eq!(entry.outcome, AuditOutcome::Failed);
    assert_eq!(entry.error_code, Some(ErrorCode::EngineFailed));
    paddock.shutdown(Duration::from_secs(2)).await.unwrap();
}

// ---------------------------------------------------------------------------------
// 3. Recycling limits
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_retire_at_their_execution_limit() {
    let mut config = PaddockConfig::default();
    // One slot, so a clean instance is always reused when it may be.
    config.pool.max_size = 1;
    config.pool.min_idle = 0;
    config.pool.max_executions_per_engine = 2;
    let paddock = paddock::builder().config(config).start().unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        let r = paddock.execute(sh("true")).await.unwrap();
        assert!(r.is_success(), "{r:?}");
        ids.push(r.instance_id);
    }
    // Two executions per instance: A A B B C.
    assert_eq!(ids[0], ids[1], "{ids:?}");
    assert_eq!(ids[2], ids[3], "{ids:?}");
    assert_ne!(ids[1], ids[2], "{ids:?}");
    assert_ne!(ids[3], ids[4], "{ids:?}");
    assert_ne!(ids[0], ids[4], "{ids:?}");
    let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
    assert!(p.created_total >= 3, "{p:?}");
    assert_eq!(p.retired_total, 2, "{p:?}");
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_older_than_max_age_are_not_reused() {
    let mut config = PaddockConfig::default();
    config.pool.max_size = 1;
    config.pool.min_idle = 0;
    config.pool.max_age_ms = 1_000;
    let paddock = paddock::builder().config(config).start().unwrap();
    let a = paddock.execute(sh("true")).await.unwrap();
    let b = paddock.execute(sh("true")).await.unwrap();
    assert_eq!(a.instance_id, b.instance_id, "a young instance is reused");
    let created = pool_stats(&paddock, EngineName::SUBPROCESS)
        .await
        .created_total;
    assert_eq!(created, 1);

    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let c = paddock.execute(sh("true")).await.unwrap();
    assert!(c.is_success());
    assert_ne!(
        c.instance_id, a.instance_id,
        "an old instance is not reused"
    );
    let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
    assert_eq!(p.created_total, created + 1, "{p:?}");
    assert!(p.retired_total >= 1, "{p:?}");
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

// ---------------------------------------------------------------------------------
// 4. Idle reaping
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_instances_are_reaped_down_to_min_idle() {
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 1;
    config.pool.max_size = 4;
    config.pool.idle_timeout_ms = 300;
    let paddock = paddock::builder().config(config).start().unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let p = paddock.clone();
            tokio::spawn(async move { p.execute(sh("sleep 0.5")).await })
        })
        .collect();
    let grown = eventually(Duration::from_secs(3), || async {
        pool_stats(&paddock, EngineName::SUBPROCESS).await.busy == 4
    })
    .await;
    assert!(
        grown,
        "the pool never ran 4 at once: {:?}",
        pool_stats(&paddock, EngineName::SUBPROCESS).await
    );
    for t in tasks {
        assert!(t.await.unwrap().unwrap().is_success());
    }
    let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
    assert_eq!(p.size, 4, "clean instances are kept at first: {p:?}");
    let retired_before = p.retired_total;

    // The maintenance tick (every 500 ms) reaps what idled past idle_timeout.
    let reaped = eventually(Duration::from_secs(3), || async {
        pool_stats(&paddock, EngineName::SUBPROCESS).await.size <= 1
    })
    .await;
    let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
    assert!(reaped, "idle instances were not reaped: {p:?}");
    assert_eq!(p.size, 1, "min_idle is kept: {p:?}");
    assert_eq!(p.idle, 1, "{p:?}");
    assert!(p.retired_total >= retired_before + 3, "{p:?}");
    assert_eq!(p.created_total - p.retired_total, 1, "{p:?}");
    // And the survivor still works.
    assert!(paddock.execute(sh("true")).await.unwrap().is_success());
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// Opens `n` sandboxes of the subprocess engine at once, and keeps them.
async fn open_burst(paddock: &Paddock, n: usize) -> Vec<paddock_pool::SandboxHandle> {
    let opens = (0..n).map(|i| {
        let spec = SandboxSpec {
            tenant: Some(format!("burst-{i}")),
            ..SandboxSpec::default()
        };
        paddock.open_sandbox(spec, Some(EngineName::SUBPROCESS))
    });
    futures_util::future::join_all(opens)
        .await
        .into_iter()
        .map(|s| s.expect("a sandbox opens"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_burst_the_pool_keeps_as_many_ready_for_the_next() {
    for (min_idle, burst_idle_max, want) in [(1, 8, 4), (1, 2, 2), (0, 8, 0)] {
        let mut config = PaddockConfig::default();
        config.pool.min_idle = min_idle;
        config.pool.burst_idle_max = burst_idle_max;
        config.pool.max_size = 16;
        config.pool.idle_timeout_ms = 1_000;
        let paddock = paddock::builder()
            .config(config)
            .without_container()
            .start()
            .unwrap();
        if min_idle == 1 && burst_idle_max == 8 {
            // Callers one after another, however many a second, are no burst: at
            // most one serving and one being recycled were in use at once.
            for _ in 0..12 {
                assert!(paddock.execute(sh("true")).await.unwrap().is_success());
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
            let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
            assert!(p.size <= 3, "sequential callers grew the pool: {p:?}");
        }
        let held = open_burst(&paddock, 4).await;
        // The pool refills behind the burst: as many as it took, up to the cap.
        let refilled = eventually(Duration::from_secs(10), || async {
            pool_stats(&paddock, EngineName::SUBPROCESS).await.idle == want
        })
        .await;
        let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
        assert!(
            refilled,
            "min_idle {min_idle}, burst_idle_max {burst_idle_max}: {p:?}"
        );
        assert_eq!(p.busy, 4, "{p:?}");
        // No more than that, for a while.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
        assert_eq!(p.idle, want, "{p:?}");
        for s in held {
            s.destroy().await.unwrap();
        }
        if min_idle > 0 {
            // Once no burst as large came within idle_timeout, back to min_idle.
            let shrunk = eventually(Duration::from_secs(10), || async {
                pool_stats(&paddock, EngineName::SUBPROCESS).await.idle == min_idle
            })
            .await;
            let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
            assert!(shrunk, "{p:?}");
        }
        paddock.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_burst_of_eight_finds_them_ready_and_a_smaller_pool_keeps_itself_full() {
    // The default max_size (8), and a smaller one.
    for (max_size, want) in [(8, 8), (3, 3)] {
        let mut config = PaddockConfig::default();
        config.pool.max_size = max_size;
        let paddock = paddock::builder()
            .config(config)
            .without_container()
            .start()
            .unwrap();
        // Made from the start, before anything is asked of the pool.
        let ready = eventually(Duration::from_secs(20), || async {
            let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
            p.idle == want && p.creating == 0
        })
        .await;
        let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
        assert!(ready, "max_size {max_size}: {p:?}");
        assert_eq!(p.size, want, "no more than that: {p:?}");
        if want == 8 {
            // The burst takes them: none was made for it (nor could one be: the
            // pool is at its size).
            let created = p.created_total;
            let held = open_burst(&paddock, 8).await;
            let p = pool_stats(&paddock, EngineName::SUBPROCESS).await;
            assert_eq!(p.busy, 8, "{p:?}");
            assert_eq!(p.created_total, created, "{p:?}");
            for s in held {
                s.destroy().await.unwrap();
            }
        }
        paddock.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

// ---------------------------------------------------------------------------------
// 5. Taint on timeout and cancel
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_and_cancelled_instances_are_retired() {
    let mut config = PaddockConfig::default();
    config.pool.max_size = 1;
    config.pool.min_idle = 0;
    let paddock = paddock::builder().config(config).start().unwrap();
    let stats = || pool_stats(&paddock, EngineName::SUBPROCESS);

    let a = paddock.execute(sh("true")).await.unwrap();
    let timed_out = paddock
        .execute(sh("sleep 5").with_timeout_ms(200))
        .await
        .unwrap();
    assert_eq!(timed_out.outcome, Outcome::TimedOut);
    assert_eq!(
        timed_out.instance_id, a.instance_id,
        "the clean instance was reused for the next execution"
    );
    assert_eq!(
        stats().await.retired_total,
        1,
        "a timeout taints the instance"
    );
    let b = paddock.execute(sh("true")).await.unwrap();
    assert_ne!(
        b.instance_id, a.instance_id,
        "the timed-out instance came back"
    );

    let req = sh("sleep 30");
    let id = req.id.clone();
    let p = paddock.clone();
    let running = tokio::spawn(async move { p.execute(req).await });
    cancel_when_running(&paddock, &id).await;
    let cancelled = running.await.unwrap().unwrap();
    assert_eq!(cancelled.outcome, Outcome::Cancelled);
    assert_eq!(cancelled.instance_id, b.instance_id);
    assert_eq!(
        stats().await.retired_total,
        2,
        "a cancel taints the instance"
    );
    let c = paddock.execute(sh("true")).await.unwrap();
    assert!(c.is_success());
    assert_ne!(
        c.instance_id, b.instance_id,
        "the cancelled instance came back"
    );
    assert_eq!(stats().await.created_total, 3);
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

// ---------------------------------------------------------------------------------
// 6. Streaming backpressure end to end
// ---------------------------------------------------------------------------------

/// Counts the bytes the engine got past the stream buffer (the supervisor hands a
/// chunk to this extra sink only after the buffer accepted it).
#[derive(Debug, Default)]
struct Counting(AtomicU64);

#[async_trait]
impl OutputSink for Counting {
    async fn chunk(&self, chunk: OutputChunk) -> Result<()> {
        self.0.fetch_add(chunk.data.len() as u64, Ordering::SeqCst);
        Ok(())
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS in /proc/self/status");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS value");
    kb * 1024
}

/// The stream buffer of the streaming tests.
const STREAM_BUFFER: usize = 64 << 10;
/// `seq 1 SEQ_LINES` writes about 8.5 MB.
const SEQ_LINES: u32 = 1_200_000;

fn streaming_paddock() -> Paddock {
    paddock::builder()
        .streamer(StreamerConfig {
            buffer_bytes: STREAM_BUFFER,
            ..StreamerConfig::default()
        })
        .start()
        .unwrap()
}

/// `seq 1 SEQ_LINES`, with an output cap far above what it writes.
fn seq_request(timeout_ms: u64) -> ExecRequest {
    let mut req = ExecRequest::new(Program::command(["seq", "1", &SEQ_LINES.to_string()]));
    req.limits.max_output_bytes = Some(64 << 20);
    req.limits.timeout_ms = Some(timeout_ms);
    req
}

fn seq_output() -> String {
    (1..=SEQ_LINES).map(|n| format!("{n}\n")).collect()
}

/// What a slow reader (5 ms between reads) of a streamed `seq` saw.
struct SlowRead {
    received: Vec<u8>,
    /// The most the engine was ahead of the reader.
    max_lag: u64,
    /// The most the process RSS grew while reading.
    rss_growth: u64,
    result: ExecResult,
    pushed: u64,
}

async fn read_slowly(paddock: &Paddock, expected_len: usize) -> SlowRead {
    let counting = Arc::new(Counting::default());
    let mut msg = Execute::new(seq_request(30_000));
    msg.sink = Some(counting.clone());
    let mut received = Vec::with_capacity(expected_len);
    let rss_before = rss_bytes();
    let mut rss_peak = rss_before;
    let mut max_lag = 0u64;
    let mut result = None;
    let mut stream = paddock.execute_stream(msg).await.unwrap();
    while let Some(ev) = stream.next().await {
        match ev {
            StreamEvent::Output(c) => {
                assert_eq!(c.stream, StreamKind::Stdout);
                received.extend_from_slice(&c.data);
                let lag = counting
                    .0
                    .load(Ordering::SeqCst)
                    .saturating_sub(received.len() as u64);
                max_lag = max_lag.max(lag);
                rss_peak = rss_peak.max(rss_bytes());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            StreamEvent::Finished(r) => result = Some(r),
        }
    }
    SlowRead {
        received,
        max_lag,
        rss_growth: rss_peak - rss_before,
        result: result.expect("a final result").unwrap(),
        pushed: counting.0.load(Ordering::SeqCst),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_slows_the_program_down() {
    let paddock = streaming_paddock();
    let expected = seq_output();
    assert!(expected.len() > 8_000_000);
    let read = read_slowly(&paddock, expected.len()).await;
    let result = &read.result;
    assert!(result.is_success(), "{:?}", result.outcome);
    assert!(!result.stdout_truncated);
    assert!(
        result.stdout == expected,
        "the result holds the whole output"
    );
    // Nearly all of it went through the stream while the reader was slow (see
    // `a_slow_subscriber_receives_every_byte_in_order` for the exact count).
    assert!(
        read.received.len() as u64 + 2 * (STREAM_BUFFER as u64) >= expected.len() as u64,
        "only {} of {} bytes were streamed",
        read.received.len(),
        expected.len()
    );
    assert!(read.pushed >= read.received.len() as u64);
    // Backpressure: the engine never ran ahead of the reader by more than the buffer
    // plus a chunk in flight either side (a pipe read is at most 64 KiB).
    assert!(
        read.max_lag <= 4 * STREAM_BUFFER as u64,
        "the producer ran {} bytes ahead of a slow reader",
        read.max_lag
    );
    // A coarse bound on the whole process (other tests share it).
    assert!(
        read.rss_growth < 64 << 20,
        "RSS grew by {} MiB while streaming",
        read.rss_growth >> 20
    );
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_receives_every_byte_in_order() {
    let paddock = streaming_paddock();
    let expected = seq_output();
    let read = read_slowly(&paddock, expected.len()).await;
    assert!(read.result.is_success(), "{:?}", read.result.outcome);
    if let Some(at) = read
        .received
        .iter()
        .zip(expected.as_bytes())
        .position(|(a, b)| a != b)
    {
        panic!(
            "the stream differs from the output at byte {at} ({} of {} bytes streamed)",
            read.received.len(),
            expected.len()
        );
    }
    assert_eq!(
        read.received.len(),
        expected.len(),
        "every byte was streamed"
    );
    assert_eq!(read.pushed, expected.len() as u64);
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_leaves_does_not_block_the_execution() {
    let paddock = streaming_paddock();
    // If the engine stayed blocked on the abandoned buffer, this would time out.
    let req = seq_request(20_000);
    let id = req.id.clone();
    let mut stream = paddock.execute_stream(Execute::new(req)).await.unwrap();
    match stream.next().await {
        Some(StreamEvent::Output(_)) => {}
        other => panic!("expected output first, got {other:?}"),
    }
    // The buffer is full by now and the engine waits for this reader.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(stream);
    let p = paddock.clone();
    let finished = eventually(Duration::from_secs(10), || {
        let p = p.clone();
        let id = id.clone();
        async move {
            p.audit(&paddock_pool::Caller::Embedder, AuditQuery::default())
                .await
                .unwrap()
                .iter()
                .any(|e| e.id == id)
        }
    })
    .await;
    assert!(finished, "the execution stalled after its subscriber left");
    let entries = paddock
        .audit(&paddock_pool::Caller::Embedder, AuditQuery::default())
        .await
        .unwrap();
    let entry = entries.iter().find(|e| e.id == id).unwrap();
    assert_eq!(entry.outcome, AuditOutcome::Completed, "{entry:?}");
    assert_eq!(entry.exit_code, Some(0), "{entry:?}");
    assert_eq!(paddock.stats().await.unwrap().in_flight, 0);
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

// ---------------------------------------------------------------------------------
// 7. Limiter through the pipeline
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_refuses_a_tenant_over_its_rate() {
    let paddock = paddock::builder()
        .limiter(LimiterConfig {
            max_executions_per_window: Some(2),
            window_ms: 60_000,
            ..LimiterConfig::default()
        })
        .start()
        .unwrap();
    let for_tenant = |tenant: &str| {
        let mut r = sh("true");
        r.tenant = Some(tenant.to_string());
        r
    };
    for _ in 0..2 {
        assert!(paddock
            .execute(for_tenant("acme"))
            .await
            .unwrap()
            .is_success());
    }
    let refused_req = for_tenant("acme");
    let refused_id = refused_req.id.clone();
    let e = paddock.execute(refused_req).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::RateLimited, "{e}");
    let retry = e.retry_after_ms.expect("a retry hint");
    assert!(retry > 0 && retry <= 60_000, "retry_after_ms {retry}");
    // Another tenant has its own window.
    assert!(paddock
        .execute(for_tenant("other"))
        .await
        .unwrap()
        .is_success());

    let stats = paddock.stats().await.unwrap();
    assert_eq!(stats.accepted_total.unwrap_or_default(), 3);
    assert_eq!(stats.refused_total.unwrap_or_default(), 1);
    let audit = paddock
        .audit_statistics(&paddock_pool::Caller::Embedder)
        .await
        .unwrap();
    assert_eq!(audit.total, 3, "refused requests are not audited");
    let entries = paddock
        .audit(
            &paddock_pool::Caller::Embedder,
            AuditQuery {
                limit: Some(1000),
                ..AuditQuery::default()
            },
        )
        .await
        .unwrap();
    assert!(entries.iter().all(|e| e.id != refused_id));
    let acme = paddock
        .audit(
            &paddock_pool::Caller::Embedder,
            AuditQuery {
                tenant: Some("acme".into()),
                ..AuditQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(acme.len(), 2);
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

// ---------------------------------------------------------------------------------
// 8. Audit: exactly one entry per accepted execution
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_execution_is_audited_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("audit.ndjson");
    let mut config = PaddockConfig::default();
    config.pool.max_size = 2;
    config.pool.min_idle = 0;
    config.pool.max_waiting = 1;
    config.pool.acquire_timeout_ms = 600;
    let paddock = paddock::builder()
        .config(config)
        .audit(AuditConfig {
            file: Some(file.clone()),
            ..AuditConfig::default()
        })
        .start()
        .unwrap();

    let mut expect: HashMap<ExecutionId, &str> = HashMap::new();
    for _ in 0..3 {
        let r = sh("true");
        expect.insert(r.id.clone(), "ok");
        assert!(paddock.execute(r).await.unwrap().is_success());
    }
    for _ in 0..2 {
        let r = sh("exit 1");
        expect.insert(r.id.clone(), "exit1");
        assert_eq!(paddock.execute(r).await.unwrap().exit_code(), Some(1));
    }
    let r = sh("sleep 5").with_timeout_ms(200);
    expect.insert(r.id.clone(), "timeout");
    assert_eq!(paddock.execute(r).await.unwrap().outcome, Outcome::TimedOut);

    let r = sh("sleep 30");
    let id = r.id.clone();
    expect.insert(id.clone(), "cancel");
    let p = paddock.clone();
    let running = tokio::spawn(async move { p.execute(r).await });
    cancel_when_running(&paddock, &id).await;
    assert_eq!(running.await.unwrap().unwrap().outcome, Outcome::Cancelled);

    // Refused by policy: never accepted, never audited.
    let blocked = paddock
        .execute(ExecRequest::new(Program::code(
            Language::Javascript,
            "process.exit(0)",
        )))
        .await
        .unwrap_err();
    assert_eq!(blocked.code, ErrorCode::CodeBlocked);

    // Both slots busy, one caller queued (it times out), one refused at once.
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let r = sh("sleep 1.5");
            expect.insert(r.id.clone(), "ok");
            let p = paddock.clone();
            tokio::spawn(async move { p.execute(r).await })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(3), || async {
            pool_stats(&paddock, EngineName::SUBPROCESS).await.busy == 2
        })
        .await
    );
    let r = sh("true");
    expect.insert(r.id.clone(), "exhausted");
    let p = paddock.clone();
    let queued = tokio::spawn(async move { p.execute(r).await });
    assert!(
        eventually(Duration::from_secs(3), || async {
            pool_stats(&paddock, EngineName::SUBPROCESS).await.waiting == 1
        })
        .await
    );
    let r = sh("true");
    expect.insert(r.id.clone(), "exhausted");
    let full = paddock.execute(r).await.unwrap_err();
    assert_eq!(full.code, ErrorCode::PoolExhausted, "{full}");
    let waited = queued.await.unwrap().unwrap_err();
    assert_eq!(waited.code, ErrorCode::PoolExhausted, "{waited}");
    for t in busy {
        assert!(t.await.unwrap().unwrap().is_success());
    }

    let stats = paddock.stats().await.unwrap();
    assert_eq!(
        stats.accepted_total.unwrap_or_default(),
        expect.len() as u64
    );
    assert_eq!(stats.refused_total.unwrap_or_default(), 1);
    assert_eq!(
        paddock
            .audit_statistics(&paddock_pool::Caller::Embedder)
            .await
            .unwrap()
            .total,
        stats.accepted_total.unwrap_or_default()
    );
    let entries = paddock
        .audit(
            &paddock_pool::Caller::Embedder,
            AuditQuery {
                limit: Some(1000),
                ..AuditQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(entries.len(), expect.len(), "{entries:?}");
    let mut seen = HashSet::new();
    for e in &entries {
        assert!(seen.insert(e.id.clone()), "audited twice: {e:?}");
        let kind = expect
            .get(&e.id)
            .unwrap_or_else(|| panic!("an entry for an unknown id: {e:?}"));
        check_entry(kind, e);
    }

    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        expect.len(),
        "one NDJSON line per entry:\n{text}"
    );
    let file_ids: HashSet<ExecutionId> = lines
        .iter()
        .map(|l| serde_json::from_str::<AuditEntry>(l).unwrap().id)
        .collect();
    assert_eq!(file_ids, seen);
}

fn check_entry(kind: &str, e: &AuditEntry) {
    match kind {
        "ok" => assert!(e.is_success(), "{e:?}"),
        "exit1" => {
            assert_eq!(e.outcome, AuditOutcome::Completed, "{e:?}");
            assert_eq!(e.exit_code, Some(1), "{e:?}");
        }
        "timeout" => {
            assert_eq!(e.outcome, AuditOutcome::TimedOut, "{e:?}");
            assert_eq!(e.kill_reason, Some(KillReason::Timeout), "{e:?}");
        }
        "cancel" => {
            assert_eq!(e.outcome, AuditOutcome::Cancelled, "{e:?}");
            assert_eq!(e.kill_reason, Some(KillReason::Cancel), "{e:?}");
        }
        "exhausted" => {
            assert_eq!(e.outcome, AuditOutcome::Failed, "{e:?}");
            assert_eq!(e.error_code, Some(ErrorCode::PoolExhausted), "{e:?}");
        }
        other => unreachable!("{other}"),
    }
}

// ---------------------------------------------------------------------------------
// 9. Telemetry
// ---------------------------------------------------------------------------------

/// The value of the one Prometheus sample named `name` whose labels include `want`.
fn metric(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (n, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            let has = |k: &str, v: &str| labels.contains(&format!("{k}=\"{v}\""));
            (n == name && want.iter().all(|(k, v)| has(k, v))).then(|| value.parse().unwrap())
        })
        .collect();
    assert!(found.len() <= 1, "{name} {want:?} is ambiguous:\n{text}");
    found.first().copied()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_show_up_in_the_metrics() {
    let paddock = paddock::builder().start().unwrap();
    for _ in 0..3 {
        assert!(paddock.execute(sh("true")).await.unwrap().is_success());
    }
    let r = paddock
        .execute(sh("sleep 5").with_timeout_ms(200))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut);
    let e = paddock
        .execute(ExecRequest::new(Program::code(
            Language::Javascript,
            "process.exit(1)",
        )))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::CodeBlocked);

    let text = paddock.telemetry().render_prometheus();
    let sub = ("engine", "subprocess");
    assert_eq!(
        metric(
            &text,
            "paddock_executions_total",
            &[sub, ("outcome", "completed")]
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "paddock_executions_total",
            &[sub, ("outcome", "timed_out")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "paddock_execution_duration_ms_count",
            &[sub, ("outcome", "completed")]
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "paddock_pool_acquisitions_total",
            &[sub, ("result", "ok")]
        ),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "paddock_rule_blocks_total",
            &[("rule", "block-process")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "paddock_kills_total", &[("reason", "timeout")]),
        Some(1.0),
        "{text}"
    );
    let size = metric(&text, "paddock_pool_size", &[sub]).expect("pool size gauge");
    assert!(size >= 1.0, "{text}");
    assert!(
        metric(&text, "paddock_pool_idle", &[sub]).is_some(),
        "{text}"
    );
    assert!(
        metric(&text, "paddock_pool_busy", &[sub]).is_some(),
        "{text}"
    );
    paddock.shutdown(Duration::from_secs(5)).await.unwrap();
}

// ---------------------------------------------------------------------------------
// 10. Shutdown
// ---------------------------------------------------------------------------------

/// Sandbox workdirs under `root` (`root/<engine dir>/<sandbox dir>`).
fn sandbox_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for engine_dir in std::fs::read_dir(root).unwrap() {
        let engine_dir = engine_dir.unwrap().path();
        if engine_dir.is_dir() {
            for sandbox in std::fs::read_dir(&engine_dir).unwrap() {
                out.push(sandbox.unwrap().path());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_cancels_and_cleans_up() {
    let root = tempfile::tempdir().unwrap();
    let mut config = PaddockConfig::default();
    config.subprocess.workdir_root = Some(root.path().to_path_buf());
    let paddock = paddock::builder().config(config).start().unwrap();

    let short = sh("sleep 0.2");
    let long = sh("sleep 30");
    let long_id = long.id.clone();
    let p = paddock.clone();
    let short = tokio::spawn(async move { p.execute(short).await });
    let p = paddock.clone();
    let long = tokio::spawn(async move { p.execute(long).await });
    assert!(
        eventually(Duration::from_secs(3), || async {
            paddock.stats().await.unwrap().in_flight == 2
        })
        .await
    );
    assert!(
        !sandbox_dirs(root.path()).is_empty(),
        "sandbox workdirs live under the configured root"
    );

    // A grace well above the short one's 0.2 s (a loaded machine may stretch it
    // past 1 s), well below the long one's 30 s.
    let started = Instant::now();
    let report = paddock.shutdown(Duration::from_secs(3)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert_eq!(report.cancelled, 1, "{report:?}");
    assert_eq!(report.drained, 1, "{report:?}");
    assert!(short.await.unwrap().unwrap().is_success());
    let long = long.await.unwrap().unwrap();
    assert_eq!(long.id, long_id);
    assert_eq!(long.outcome, Outcome::Cancelled);

    let after = paddock.execute(sh("true")).await.unwrap_err();
    assert_eq!(after.code, ErrorCode::EngineDisposed, "{after}");
    let left = sandbox_dirs(root.path());
    assert!(left.is_empty(), "workdirs left after shutdown: {left:?}");
    // The engine's own directory goes with the engine.
    let left: Vec<PathBuf> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left after shutdown: {left:?}");
}

// ---------------------------------------------------------------------------------
// Limits an engine does not enforce
// ---------------------------------------------------------------------------------

/// An engine that lists only the deadline among its limits: a request or sandbox
/// that sets another is refused with CAPABILITY_NOT_SUPPORTED naming it, never run
/// unbounded; one that sets none runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_the_engine_does_not_enforce_is_refused() {
    let engine = Flaky::new(true);
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 0;
    let paddock = start_flaky(engine.clone(), config);
    let name = engine.name();
    let caps = &paddock
        .capabilities()
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1;
    assert_eq!(
        caps.limits.iter().cloned().collect::<Vec<_>>(),
        vec!["timeout_ms".to_string()]
    );
    for (field, set) in [
        (
            "memory_bytes",
            (|l: &mut paddock_core::Limits| l.memory_bytes = Some(64 << 20)) as fn(&mut _),
        ),
        ("disk_bytes", |l| l.disk_bytes = Some(16 << 20)),
        ("cpu_ms", |l| l.cpu_ms = Some(100)),
    ] {
        let mut request = sh("true");
        set(&mut request.limits);
        let e = paddock
            .execute_with(Execute::new(request).on(name.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::CapabilityNotSupported, "{e}");
        assert!(e.message.contains(&format!("limits.{field}")), "{e}");
        let mut spec = paddock_core::SandboxSpec::default();
        set(&mut spec.limits);
        let e = paddock
            .open_sandbox(spec, Some(name.clone()))
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::CapabilityNotSupported, "{e}");
    }
    let mut request = sh("true");
    request.limits.timeout_ms = Some(5_000);
    let r = paddock
        .execute_with(Execute::new(request).on(name))
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    let _ = paddock.shutdown(Duration::from_secs(5)).await;
}

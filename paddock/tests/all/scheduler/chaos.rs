//! The pool chaos matrix: every combination of ok / error / slow / never over create,
//! recycle and exec, with waiters aborted partway. After every run the pool's size,
//! queue and audit invariants must hold.
//!
//! The scripted engine here is a stand-in for a misbehaving engine; the thing under
//! test is the pool and supervisor, which run for real.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use paddock::PaddockConfig;
use paddock_core::{
    CancelToken, Capabilities, Engine, EngineName, Error, ErrorCode, ExecRequest, ExecResult,
    FileEntry, IsolationLevel, Outcome, OutputSink, Program, ProgramKind, Result, Sandbox,
    SandboxSpec, SandboxStatus,
};
use paddock_pool::Execute;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    Ok,
    Fail,
    Slow,
    Never,
}

const ALL: [Behaviour; 4] = [
    Behaviour::Ok,
    Behaviour::Fail,
    Behaviour::Slow,
    Behaviour::Never,
];

async fn act(b: Behaviour, what: &str) -> Result<()> {
    match b {
        Behaviour::Ok => Ok(()),
        Behaviour::Fail => Err(Error::new(
            ErrorCode::EngineFailed,
            format!("scripted {what} failure"),
        )),
        Behaviour::Slow => {
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok(())
        }
        Behaviour::Never => std::future::pending().await,
    }
}

#[derive(Debug)]
struct Scripted {
    create: Behaviour,
    recycle: Behaviour,
    exec: Behaviour,
    caps: Capabilities,
    live: Arc<AtomicUsize>,
}

#[async_trait]
impl Engine for Scripted {
    fn name(&self) -> EngineName {
        EngineName::NOOP
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    async fn create(&self, _spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        act(self.create, "create").await?;
        self.live.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(ScriptedSandbox {
            recycle: self.recycle,
            exec: self.exec,
            live: self.live.clone(),
            destroyed: AtomicBool::new(false),
        }))
    }
}

#[derive(Debug)]
struct ScriptedSandbox {
    recycle: Behaviour,
    exec: Behaviour,
    live: Arc<AtomicUsize>,
    destroyed: AtomicBool,
}

#[async_trait]
impl Sandbox for ScriptedSandbox {
    fn id(&self) -> &str {
        "scripted"
    }
    fn engine(&self) -> EngineName {
        EngineName::NOOP
    }
    fn root_dir(&self) -> &Path {
        Path::new("/scripted")
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
        tokio::select! {
            r = act(self.exec, "exec") => r?,
            _ = cancel.cancelled() => {}
        }
        Ok(ExecResult::empty(
            request.id,
            ExecResult::noop_outcome(&cancel),
            EngineName::NOOP,
            "scripted",
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
        act(self.recycle, "recycle").await
    }
    async fn destroy(&self) -> Result<()> {
        if !self.destroyed.swap(true, Ordering::SeqCst) {
            self.live.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

fn config() -> PaddockConfig {
    let mut c = PaddockConfig::default();
    c.pool.max_size = 2;
    c.pool.min_idle = 1;
    c.pool.max_waiting = 4;
    c.pool.acquire_timeout_ms = 150;
    c.pool.create_timeout_ms = 100;
    c.pool.recycle_timeout_ms = 100;
    c.pool.watchdog_grace_ms = 50;
    c.pool.failure_threshold = 1_000;
    c.subprocess.enabled = false;
    c
}

async fn run_combo(create: Behaviour, recycle: Behaviour, exec: Behaviour) -> String {
    let live = Arc::new(AtomicUsize::new(0));
    let engine = Arc::new(Scripted {
        create,
        recycle,
        exec,
        caps: Capabilities::new(
            IsolationLevel::None,
            &[ProgramKind::Command],
            &["none"],
            &[],
        ),
        live: live.clone(),
    });
    let paddock = paddock::builder()
        .config(config())
        .without_subprocess()
        .without_isolate()
        .engine(engine)
        .start()
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..10 {
        let p = paddock.clone();
        tasks.push(tokio::spawn(async move {
            let req = ExecRequest::new(Program::command(["x"])).with_timeout_ms(100);
            let fut = p.execute_with(Execute::new(req));
            if i % 3 == 0 {
                // This caller gives up partway.
                tokio::time::timeout(Duration::from_millis(20), fut)
                    .await
                    .ok()
            } else {
                // A caller that waits must get its answer (bounded: a hang fails).
                Some(
                    tokio::time::timeout(Duration::from_secs(10), fut)
                        .await
                        .expect("a waiting caller got no answer within 10 s"),
                )
            }
        }));
    }
    let mut answered = 0;
    for t in tasks {
        if let Some(r) = t.await.unwrap() {
            answered += 1;
            if let Ok(r) = r {
                assert!(
                    r.outcome != Outcome::Cancelled || exec == Behaviour::Never,
                    "{r:?}"
                );
            }
        }
    }
    // Let background work (recycles, destroys, replacements) settle.
    let mut stats = paddock.stats().await.unwrap();
    for _ in 0..200 {
        if stats.in_flight == 0
            && stats
                .pools
                .iter()
                .all(|p| p.busy == 0 && p.waiting == 0 && p.creating == 0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        stats = paddock.stats().await.unwrap();
    }
    let label = format!("create={create:?} recycle={recycle:?} exec={exec:?}");
    for p in &stats.pools {
        assert!(
            p.size <= p.max_size,
            "{label}: size {} > max {}",
            p.size,
            p.max_size
        );
        assert_eq!(p.waiting, 0, "{label}: waiters left queued: {p:?}");
        assert_eq!(
            p.busy, 0,
            "{label}: a slot is still leased after every caller finished: {p:?}"
        );
        assert_eq!(
            p.creating, 0,
            "{label}: a creation reservation leaked: {p:?}"
        );
    }
    assert_eq!(stats.in_flight, 0, "{label}");
    let audited = paddock
        .audit_statistics(&paddock_pool::Caller::Embedder)
        .await
        .unwrap()
        .total;
    assert_eq!(
        audited,
        stats.accepted_total.unwrap_or_default(),
        "{label}: audit entries != accepted executions"
    );
    assert!(answered >= 6, "{label}: {answered} callers answered");
    paddock.shutdown(Duration::from_secs(2)).await.unwrap();
    // Every instance the engine created was destroyed (creations still pending at
    // shutdown never produced one).
    assert_eq!(live.load(Ordering::SeqCst), 0, "{label}: instances leaked");
    label
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_combination_keeps_the_invariants() {
    let mut ran = 0;
    for create in ALL {
        for recycle in ALL {
            for exec in ALL {
                run_combo(create, recycle, exec).await;
                ran += 1;
            }
        }
    }
    assert_eq!(ran, 64);
}

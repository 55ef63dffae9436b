//! One door to an instance: an engine that panics in any one of its methods makes
//! that call `ENGINE_FAILED`, never a crash of the scheduler, and its instance is
//! never leased again. One case per engine method the scheduler calls.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use paddock::PaddockConfig;
use paddock_core::{
    CancelToken, Capabilities, Engine, EngineName, Error, ErrorCode, ExecRequest, ExecResult,
    FileEntry, IsolationLevel, OutputSink, ProcessSpec, Program, ProgramKind, Result, Sandbox,
    SandboxSpec, SandboxStatus, TcpTarget, TerminalSpec,
};
use paddock_pool::{Paddock, SandboxHandle};

/// An engine whose sandboxes panic in the method named `method`, and behave
/// otherwise.
#[derive(Debug)]
struct Panicky {
    caps: Capabilities,
    method: &'static str,
    next: AtomicU64,
}

#[derive(Debug)]
struct PanickySandbox {
    id: String,
    method: &'static str,
}

impl PanickySandbox {
    fn maybe_panic(&self, method: &str) {
        if self.method == method {
            panic!("scripted panic in {method}");
        }
    }
}

#[async_trait]
impl Engine for Panicky {
    fn name(&self) -> EngineName {
        EngineName::NOOP
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    async fn create(&self, _spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(PanickySandbox {
            id: format!("panicky-{n}"),
            method: self.method,
        }))
    }
}

fn refuse(what: &str) -> Error {
    Error::new(ErrorCode::CapabilityNotSupported, format!("no {what} here"))
}

#[async_trait]
impl Sandbox for PanickySandbox {
    fn id(&self) -> &str {
        &self.id
    }
    fn engine(&self) -> EngineName {
        EngineName::NOOP
    }
    fn root_dir(&self) -> &Path {
        Path::new("/panicky")
    }
    fn status(&self) -> SandboxStatus {
        self.maybe_panic("status");
        SandboxStatus::Ready
    }
    async fn exec(
        &self,
        request: ExecRequest,
        _sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        self.maybe_panic("exec");
        Ok(ExecResult::empty(
            request.id,
            ExecResult::noop_outcome(&cancel),
            EngineName::NOOP,
            self.id.clone(),
        ))
    }
    async fn write_file(&self, _: &str, _: &[u8]) -> Result<()> {
        self.maybe_panic("write_file");
        Ok(())
    }
    async fn read_file(&self, _: &str) -> Result<Vec<u8>> {
        self.maybe_panic("read_file");
        Ok(b"data".to_vec())
    }
    async fn list_files(&self, _: &str) -> Result<Vec<FileEntry>> {
        self.maybe_panic("list_files");
        Ok(Vec::new())
    }
    async fn open_read(&self, path: &str) -> Result<paddock_core::FileReader> {
        self.maybe_panic("open_read");
        Ok(paddock_core::FileReader::from_bytes(
            self.read_file(path).await?,
        ))
    }
    async fn write_from(
        &self,
        _path: &str,
        _source: paddock_core::ByteSource,
        _max_bytes: u64,
    ) -> Result<u64> {
        self.maybe_panic("write_from");
        Ok(0)
    }
    async fn pause(&self) -> Result<()> {
        self.maybe_panic("pause");
        Ok(())
    }
    async fn unpause(&self) -> Result<()> {
        self.maybe_panic("unpause");
        Ok(())
    }
    async fn start_process(&self, _spec: ProcessSpec) -> Result<paddock_core::ProcessHandle> {
        self.maybe_panic("start_process");
        Err(refuse("processes"))
    }
    async fn open_terminal(&self, _spec: TerminalSpec) -> Result<paddock_core::TerminalHandle> {
        self.maybe_panic("open_terminal");
        Err(refuse("terminals"))
    }
    async fn open_tcp_connection(&self, _t: TcpTarget) -> Result<paddock_core::TcpConnection> {
        self.maybe_panic("open_tcp_connection");
        Err(refuse("tcp"))
    }
    async fn recycle(&self) -> Result<()> {
        self.maybe_panic("recycle");
        Ok(())
    }
    async fn destroy(&self) -> Result<()> {
        self.maybe_panic("destroy");
        Ok(())
    }
    fn leased(&self) {
        self.maybe_panic("leased");
    }
}

fn start(method: &'static str) -> Paddock {
    let mut config = PaddockConfig::default();
    config.pool.min_idle = 0;
    paddock::builder()
        .config(config)
        .without_subprocess()
        .without_isolate()
        .without_container()
        .engine(Arc::new(Panicky {
            caps: Capabilities::new(
                IsolationLevel::None,
                &[ProgramKind::Command],
                &["none"],
                &["pause", "process", "terminal", "tcp"],
            ),
            method,
            next: AtomicU64::new(0),
        }))
        .start()
        .unwrap()
}

fn command() -> ExecRequest {
    ExecRequest::new(Program::command(["true"]))
}

/// The panic came back as `ENGINE_FAILED` naming the method.
fn assert_caught<T: std::fmt::Debug>(method: &str, r: std::result::Result<T, Error>) {
    let e = r.expect_err(&format!("a panic in {method} was not reported"));
    assert_eq!(e.code, ErrorCode::EngineFailed, "{method}: {e}");
    assert!(
        e.message.contains("panicked")
            && e.message.contains(&format!("scripted panic in {method}")),
        "{method}: {e}"
    );
}

/// Calls `method` on an open sandbox of the engine that panics there.
async fn call(method: &str, sb: &SandboxHandle) -> std::result::Result<(), Error> {
    match method {
        "exec" => sb.exec(command()).await.map(drop),
        "write_file" => sb.write_file("a", b"x").await,
        "read_file" => sb.read_file("a").await.map(drop),
        "list_files" => sb.list_files("").await.map(drop),
        "open_read" => sb.open_read("a").await.map(drop),
        "write_from" => sb
            .write_from("a", Box::pin(std::io::Cursor::new(b"x".to_vec())), 8)
            .await
            .map(drop),
        "pause" => sb.pause().await,
        "unpause" => sb.unpause().await,
        "start_process" => sb.start_process(ProcessSpec::new(["true"])).await.map(drop),
        "open_terminal" => sb.open_terminal(TerminalSpec::default()).await.map(drop),
        "open_tcp_connection" => sb
            .open_tcp_connection(TcpTarget {
                port: 80,
                host: "127.0.0.1".into(),
            })
            .await
            .map(drop),
        other => unreachable!("no case for {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_any_session_method_is_engine_failed_and_the_scheduler_goes_on() {
    for method in [
        "exec",
        "write_file",
        "read_file",
        "list_files",
        "open_read",
        "write_from",
        "pause",
        "unpause",
        "start_process",
        "open_terminal",
        "open_tcp_connection",
        "recycle",
    ] {
        let p = start(method);
        let sb = p.open_sandbox(SandboxSpec::default(), None).await.unwrap();
        if method == "recycle" {
            // A session's destroy recycles its instance for the next session: a
            // panic there does not reach the caller, whose session has ended, but
            // the instance is retired.
            sb.destroy().await.unwrap();
            assert_eq!(p.stats().await.unwrap().sandboxes, 0, "{method}");
        } else {
            assert_caught(method, call(method, &sb).await);
            // The scheduler still answers, and the same session's other methods
            // work.
            let other = if method == "read_file" {
                "write_file"
            } else {
                "read_file"
            };
            call(other, &sb)
                .await
                .unwrap_or_else(|e| panic!("{method}, then {other}: {e}"));
            sb.destroy().await.unwrap();
        }
        // Its instance is retired, never leased again.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pool = &p.stats().await.unwrap().pools[0];
        assert_eq!(pool.idle, 0, "{method}: {pool:?}");
        assert!(pool.retired_total >= 1, "{method}: {pool:?}");
        p.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_status_exec_recycle_leased_or_destroy_is_caught() {
    // status: read when a sandbox is opened.
    let p = start("status");
    assert_caught("status", p.open_sandbox(SandboxSpec::default(), None).await);
    assert_eq!(p.stats().await.unwrap().sandboxes, 0);
    p.shutdown(Duration::from_secs(5)).await.unwrap();

    // exec on a pooled instance.
    let p = start("exec");
    assert_caught("exec", p.execute(command()).await);
    p.shutdown(Duration::from_secs(5)).await.unwrap();

    // recycle: after a clean execution; the instance is retired, the next execution
    // gets a fresh one.
    let p = start("recycle");
    p.execute(command()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let pool = p.stats().await.unwrap().pools[0].clone();
        if pool.retired_total >= 1 && pool.idle == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the instance whose recycle panicked was not retired: {pool:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    p.execute(command()).await.unwrap();
    p.shutdown(Duration::from_secs(5)).await.unwrap();

    // leased: called as the pool hands the instance over, outside the engine
    // actor: the execution still runs, and the instance is retired after it.
    let p = start("leased");
    p.execute(command()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let pool = p.stats().await.unwrap().pools[0].clone();
        if pool.retired_total >= 1 && pool.idle == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the instance that panicked in `leased` was not retired: {pool:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    p.shutdown(Duration::from_secs(5)).await.unwrap();

    // destroy: a session's instance, recycled at its end, is destroyed when the
    // scheduler shuts down; the panic there is caught and shutdown completes.
    let p = start("destroy");
    let sb = p.open_sandbox(SandboxSpec::default(), None).await.unwrap();
    sb.write_file("a", b"x").await.unwrap();
    sb.destroy().await.unwrap();
    let pool = p.stats().await.unwrap().pools[0].clone();
    assert_eq!(
        pool.idle, 1,
        "the session's instance was recycled: {pool:?}"
    );
    let report = p.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(report.sandboxes_destroyed, 0, "{report:?}");
}

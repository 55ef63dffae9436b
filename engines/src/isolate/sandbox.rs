//! An isolate sandbox: one isolate thread and a workdir.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use paddock_core::exec::unix_ms;
use paddock_core::lifecycle::{Lifecycle, Teardown};
use paddock_core::spin::Spin;
use paddock_core::{
    CancelToken, EngineName, Error, ErrorCode, ExecResult, LimitKind, Limits, Outcome, OutputSink,
    Result, SandboxSpec, Timings, Usage, ValidRequest,
};
use tokio::sync::{mpsc, oneshot, Mutex};

use super::host::{Control, CANCELLED, DESTROYED, RUNNING};
use super::worker::{self, Ending, ExecJob, Job, JsProgram, Report};
use super::EngineInner;
use crate::host::workdir::Workdir;
use crate::sandbox::{FileOps, WorkdirBacked};
use crate::task::blocking;

/// Chunks in flight between the isolate thread and the caller's sink; a slower sink
/// makes `console.log` wait.
const EVENTS: usize = 64;
/// How long past its deadline an execution may take before the isolate is declared
/// stuck (only a host function that never returns can do that).
const STUCK_GRACE: Duration = Duration::from_secs(5);
/// How long destroy waits for the isolate thread to end.
const JOIN_GRACE: Duration = Duration::from_secs(5);
/// How long creating and destroying a sandbox poll for the isolate thread's answer
/// before parking.
const HANDOFF_SPIN: Duration = Duration::from_micros(300);
/// The stack of an isolate thread beyond the JavaScript stack limit.
const THREAD_STACK_EXTRA: usize = 2 << 20;

/// A sandbox of the isolate engine. Executions run one at a time on its thread.
#[derive(Debug)]
pub struct IsolateSandbox {
    id: String,
    engine: Arc<EngineInner>,
    limits: Limits,
    workdir: Arc<Workdir>,
    jobs: Sender<Job>,
    /// The isolate thread and the signal it fires once its runtime is gone.
    thread: parking_lot::Mutex<Option<(std::thread::JoinHandle<()>, oneshot::Receiver<()>)>>,
    run_lock: Mutex<()>,
    busy: AtomicBool,
    /// The control flag of the running execution, for destroy.
    current: parking_lot::Mutex<Option<Control>>,
    /// Set when an execution overran its deadline by [`STUCK_GRACE`]: the thread is
    /// inside a host call that does not return, and the sandbox cannot be reused.
    stuck: AtomicBool,
    lifecycle: Lifecycle,
    spin: Spin,
}

/// Where an isolate sandbox's workdir is seen, by its scripts and the files API.
pub(crate) const SHOWN_ROOT: &str = "/workspace";

impl IsolateSandbox {
    pub(super) async fn create(engine: Arc<EngineInner>, spec: &SandboxSpec) -> Result<Self> {
        let caps = &engine.caps;
        caps.check_level(&EngineName::ISOLATE, spec.level)?;
        caps.check_network(&EngineName::ISOLATE, &spec.network)?;
        if spec.home.is_some() {
            caps.check_feature(&EngineName::ISOLATE, paddock_core::engine::FEATURE_HOME)?;
        }
        spec.limits.validate("limits", false)?;
        let n = engine.next_sandbox.fetch_add(1, Ordering::Relaxed);
        // The counter names the thread only; the id is random through and through.
        let id = paddock_core::ids::tagged("iso");
        let quota = crate::host::volume::Quota::of(&spec.limits.or(&engine.defaults));
        // Making a filesystem (a copy, a loop device, mounts) blocks: off the runtime.
        let (eng, id2) = (engine.clone(), id.clone());
        let workdir = crate::task::blocking(move || {
            let disk = quota
                .filter(|_| eng.disks.backend().is_some())
                .map(|q| (&eng.disks, q));
            // Scripts and the files API see the workdir at /workspace, as in a
            // container: where it is on the host (and the server's pid in the
            // directory's name) is not theirs to know.
            Workdir::create_on(&eng.workdir_root, &id2, disk)
                .map(|w| w.shown_at(std::path::Path::new(SHOWN_ROOT)))
                .map_err(crate::host::volume::workdir_error)
        })
        .await?;
        let config = engine.worker_config();
        let (jobs, rx) = crossbeam_channel::bounded(4);
        let (ready_tx, ready_rx) = oneshot::channel();
        let (exited_tx, exited) = oneshot::channel();
        let signal = worker::ExitSignal(Some(exited_tx));
        let thread = std::thread::Builder::new()
            .name(format!("paddock-isolate-{n}"))
            .stack_size(config.stack_bytes + THREAD_STACK_EXTRA)
            .spawn(move || worker::main(config, rx, ready_tx, signal));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                let _ = workdir.remove();
                return Err(Error::engine_io("starting the isolate thread", e));
            }
        };
        // A runtime and a context take about 100 µs: poll for that long before
        // parking, which would add a thread wake-up to every sandbox creation.
        match Spin::new(HANDOFF_SPIN).run(ready_rx).await {
            Ok(Ok(())) => {}
            Ok(Err(message)) => {
                let _ = workdir.remove();
                let _ = thread.join();
                return Err(Error::new(ErrorCode::EngineFailed, message));
            }
            Err(_) => {
                let _ = workdir.remove();
                let _ = thread.join();
                return Err(Error::new(
                    ErrorCode::EngineFailed,
                    "the isolate thread ended before it was ready",
                ));
            }
        }
        Ok(IsolateSandbox {
            id,
            limits: spec.limits.or(&engine.defaults),
            spin: Spin::new(Duration::from_micros(engine.config.reply_spin_us)),
            engine,
            workdir: Arc::new(workdir),
            jobs,
            thread: parking_lot::Mutex::new(Some((thread, exited))),
            run_lock: Mutex::new(()),
            busy: AtomicBool::new(false),
            current: parking_lot::Mutex::new(None),
            stuck: AtomicBool::new(false),
            lifecycle: Lifecycle::new(),
        })
    }

    fn stuck_error(&self) -> Error {
        Error::new(
            ErrorCode::EngineFailed,
            format!(
                "isolate {} is stuck in a host function that did not return; destroy the sandbox",
                self.id
            ),
        )
    }

    /// Waits for the isolate's answer while forwarding output, passing a cancel on, and
    /// watching for a thread that overran its deadline.
    async fn wait(
        &self,
        mut events: mpsc::Receiver<paddock_core::OutputChunk>,
        mut reply: oneshot::Receiver<Report>,
        sink: &dyn OutputSink,
        cancel: &CancelToken,
        control: &Control,
        deadline: Instant,
    ) -> Report {
        let mut delivery: Option<Pin<Box<dyn Future<Output = Result<()>> + Send + '_>>> = None;
        let mut delivering = true;
        let mut cancel_sent = false;
        let stuck_at = tokio::time::Instant::from_std(deadline + STUCK_GRACE);
        let report = loop {
            tokio::select! {
                biased;
                r = &mut reply => break r.unwrap_or_else(|_| Report::thread_died()),
                _ = cancel.cancelled(), if !cancel_sent => {
                    cancel_sent = true;
                    control.store(CANCELLED, Ordering::Relaxed);
                }
                r = std::future::poll_fn(|cx| match delivery.as_mut() {
                    Some(f) => f.as_mut().poll(cx),
                    None => Poll::Pending,
                }), if delivery.is_some() => {
                    delivery = None;
                    if r.is_err() {
                        delivering = false;
                    }
                }
                chunk = events.recv(), if delivery.is_none() => {
                    if let Some(chunk) = chunk {
                        if delivering {
                            delivery = Some(sink.chunk(chunk));
                        }
                    }
                }
                _ = tokio::time::sleep_until(stuck_at) => {
                    self.stuck.store(true, Ordering::Release);
                    tracing::warn!(sandbox = %self.id, "an isolate overran its deadline in a host function; retiring it");
                    break Report::stuck(self.stuck_error());
                }
            }
        };
        // Every chunk was queued before the answer: deliver them in order.
        if let Some(f) = delivery.take() {
            if f.await.is_err() {
                delivering = false;
            }
        }
        while let Ok(chunk) = events.try_recv() {
            if delivering && sink.chunk(chunk).await.is_err() {
                delivering = false;
            }
        }
        report
    }

    /// One execution on the isolate thread (the body of
    /// [`Sandbox::exec`](paddock_core::Sandbox::exec)).
    async fn run(
        &self,
        request: ValidRequest,
        sink: &dyn OutputSink,
        cancel: CancelToken,
    ) -> Result<ExecResult> {
        let _op = self.enter()?;
        let (program, limits) = self.engine.prepare(&request, &self.limits)?;
        let request = request.into_inner();
        let queued_at_ms = unix_ms();
        let _run = self.run_lock.lock().await;
        if self.stuck.load(Ordering::Acquire) {
            return Err(self.stuck_error());
        }
        if self.destroying() {
            return Err(Error::disposed(&format!("sandbox {}", self.id)));
        }
        let control: Control = Arc::new(AtomicU8::new(0));
        *self.current.lock() = Some(control.clone());
        if self.destroying() {
            control.store(DESTROYED, Ordering::Relaxed);
        }
        let (events_tx, events) = mpsc::channel(EVENTS);
        let (reply_tx, reply) = oneshot::channel();
        let started_at_ms = unix_ms();
        let job = new_job(
            program,
            &limits,
            request.tenant.clone(),
            control.clone(),
            events_tx,
            Some(self.workdir.clone()),
        );
        let deadline = job.deadline;
        if self.jobs.send(Job::Exec(Box::new(job), reply_tx)).is_err() {
            *self.current.lock() = None;
            return Err(Error::new(
                ErrorCode::EngineFailed,
                format!("isolate {} has stopped; destroy the sandbox", self.id),
            ));
        }
        self.busy.store(true, Ordering::Release);
        // If this future is dropped before the answer (the caller gave up), the
        // script is stopped rather than left running into the next execution.
        let running = Running {
            sandbox: self,
            control: &control,
        };
        let report = self
            .spin
            .run(self.wait(events, reply, sink, &cancel, &control, deadline))
            .await;
        drop(running);

        Ok(into_result(
            report,
            request.id,
            &self.id,
            &cancel,
            queued_at_ms,
            started_at_ms,
        ))
    }
}

impl Report {
    fn thread_died() -> Report {
        Report::stuck(Error::new(
            ErrorCode::EngineFailed,
            "the isolate thread ended during the execution",
        ))
    }

    fn stuck(error: Error) -> Report {
        Report {
            ending: Ending::Failed(error),
            stdout: Default::default(),
            stderr: Default::default(),
            value: None,
            peak_memory: 0,
            cpu: Duration::ZERO,
            wall: Duration::ZERO,
        }
    }
}

fn outcome_of(ending: Ending, id: &str) -> Outcome {
    match ending {
        Ending::Completed(exit_code) => Outcome::Completed {
            exit_code,
            signal: None,
        },
        Ending::TimedOut => Outcome::TimedOut,
        Ending::Cancelled => Outcome::Cancelled,
        Ending::Destroyed => {
            tracing::debug!(sandbox = %id, "execution ended by destroy");
            Outcome::Cancelled
        }
        Ending::Memory => Outcome::LimitExceeded {
            limit: LimitKind::Memory,
        },
        Ending::Output => Outcome::LimitExceeded {
            limit: LimitKind::Output,
        },
        Ending::FileSize => Outcome::LimitExceeded {
            limit: LimitKind::FileSize,
        },
        Ending::Cpu => Outcome::LimitExceeded {
            limit: LimitKind::Cpu,
        },
        Ending::Failed(error) => Outcome::Failed { error },
    }
}

/// The job for one execution under `limits`.
pub(super) fn new_job(
    program: JsProgram,
    limits: &Limits,
    tenant: Option<String>,
    control: Control,
    events: mpsc::Sender<paddock_core::OutputChunk>,
    workdir: Option<Arc<Workdir>>,
) -> ExecJob {
    let to_usize = |v: Option<u64>, default: usize| {
        v.map_or(default, |v| usize::try_from(v).unwrap_or(usize::MAX))
    };
    ExecJob {
        program,
        tenant,
        memory_bytes: to_usize(limits.memory_bytes, 512 << 20),
        deadline: Instant::now() + limits.timeout().unwrap_or(Duration::from_secs(30)),
        output_cap: to_usize(limits.max_output_bytes, 1 << 20),
        control,
        events,
        workdir,
        file_size: limits.file_size_bytes,
        cpu_budget: limits.cpu_ms.map(Duration::from_millis),
        cpu_millicores: limits.cpu_millicores,
    }
}

/// The result for the isolate's report.
pub(super) fn into_result(
    report: Report,
    id: paddock_core::ExecutionId,
    instance_id: &str,
    cancel: &CancelToken,
    queued_at_ms: u64,
    started_at_ms: u64,
) -> ExecResult {
    let mut outcome = outcome_of(report.ending, instance_id);
    // Exactly one terminal state: a cancel that won the race is reported as such.
    if outcome != Outcome::Cancelled && !cancel.finish() {
        outcome = Outcome::Cancelled;
    }
    ExecResult {
        id,
        outcome,
        stdout_truncated: report.stdout.truncated,
        stderr_truncated: report.stderr.truncated,
        stdout: report.stdout.into_string(),
        stderr: report.stderr.into_string(),
        value: report.value,
        usage: Usage {
            cpu_ms: report.cpu.as_millis() as u64,
            wall_ms: report.wall.as_millis() as u64,
            peak_memory_bytes: report.peak_memory,
        },
        engine: EngineName::ISOLATE,
        instance_id: instance_id.to_string(),
        timings: Timings {
            queued_at_ms,
            started_at_ms,
            finished_at_ms: unix_ms(),
        },
        warnings: Vec::new(),
        egress: None,
    }
}

crate::sandbox::workdir_sandbox! {
    impl Sandbox for IsolateSandbox {
        fn id(&self) -> &str {
            &self.id
        }

        fn engine(&self) -> EngineName {
            EngineName::ISOLATE
        }

        async fn recycle(&self) -> Result<()> {
            let _op = self.enter()?;
            // The lease's watches end with it, whatever the workdir holds.
            self.workdir.end_watches();
            let _run = self.run_lock.lock().await;
            if self.stuck.load(Ordering::Acquire) {
                return Err(self.stuck_error());
            }
            if self.destroying() {
                return Err(Error::disposed(&format!("sandbox {}", self.id)));
            }
            // The next execution gets a fresh context anyway; only files carry over.
            let dirty = std::fs::read_dir(self.workdir.root())
                .map(|mut d| d.next().is_some())
                .unwrap_or(true);
            if dirty {
                let workdir = self.workdir.clone();
                blocking(move || {
                    workdir
                        .clear()
                        .map_err(|e| Error::engine_io("cleaning the sandbox workdir", e))
                })
                .await?;
            }
            Ok(())
        }
    }
}

impl WorkdirBacked for IsolateSandbox {
    fn workdir(&self) -> &Arc<Workdir> {
        &self.workdir
    }

    fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }
}

impl FileOps for IsolateSandbox {}

impl Teardown for IsolateSandbox {
    async fn stop_running(&self) {
        // A running script sees it at its next interrupt check and ends.
        if let Some(c) = self.current.lock().as_ref() {
            c.store(DESTROYED, Ordering::Relaxed);
        }
    }

    async fn teardown(&self) -> Result<()> {
        let _ = self.jobs.try_send(Job::Stop);
        let thread = self.thread.lock().take();
        if let Some((thread, exited)) = thread {
            let ended = tokio::time::timeout(JOIN_GRACE, Spin::new(HANDOFF_SPIN).run(exited)).await;
            if ended.is_ok() {
                // The runtime is gone and the thread is returning: joining takes
                // microseconds.
                let _ = thread.join();
            } else {
                tracing::warn!(sandbox = %self.id, "the isolate thread did not end in time; it ends when its host call returns");
            }
        }
        let workdir = self.workdir.clone();
        blocking(move || {
            workdir
                .remove()
                .map_err(|e| Error::engine_io("removing the sandbox workdir", e))
        })
        .await
    }

    /// Stops the thread (without waiting) and removes the workdir.
    fn teardown_now(&self) {
        if let Some(c) = self.current.lock().as_ref() {
            c.store(DESTROYED, Ordering::Relaxed);
        }
        let _ = self.jobs.try_send(Job::Stop);
        let _ = self.workdir.remove();
    }
}

/// Marks the sandbox idle again when an execution ends, and stops the script if it
/// ends by the caller dropping the execution.
struct Running<'a> {
    sandbox: &'a IsolateSandbox,
    control: &'a Control,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        // Harmless after the answer: the isolate no longer looks at this flag.
        let _ =
            self.control
                .compare_exchange(RUNNING, CANCELLED, Ordering::Relaxed, Ordering::Relaxed);
        self.sandbox.busy.store(false, Ordering::Release);
        *self.sandbox.current.lock() = None;
    }
}

impl Drop for IsolateSandbox {
    fn drop(&mut self) {
        self.lifecycle.teardown_unless_destroyed(self);
    }
}

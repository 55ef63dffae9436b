//! The isolate thread: one QuickJS runtime, a fresh context kept ready, and the loop
//! that runs jobs sent over a crossbeam channel.
//!
//! After each execution the thread answers first, then builds the next execution's
//! context, so that creating it stays off the request path; it then polls for the next
//! job for a short while before it parks, since waking a parked thread costs more than
//! a small script takes. The runtime itself is replaced after `recycle_after`
//! executions, after any execution that was stopped or hit a limit, and when the next
//! execution belongs to another tenant.

use std::cell::{Cell, RefCell};
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};
use paddock_core::{Error, ErrorCode, OutputChunk};
use rquickjs::context::EvalOptions;
use rquickjs::function::Rest;
use rquickjs::promise::PromiseState;
use rquickjs::{Context, Ctx, Module, Promise, Runtime, Value};
use tokio::sync::{mpsc, oneshot};

use super::alloc::{Meter, MeteredAlloc};
use super::host::{self, Control, RunState, CANCELLED, DESTROYED, RUNNING};
use super::js;
use super::modules::HostModules;
use crate::capture::Captured;
use crate::host::workdir::Workdir;

/// What the thread needs to know about its engine.
#[derive(Debug, Clone)]
pub(super) struct WorkerConfig {
    pub(super) stack_bytes: usize,
    pub(super) recycle_after: u32,
    pub(super) idle_spin: Duration,
    pub(super) modules: HostModules,
}

/// A message to the thread.
pub(super) enum Job {
    /// Run an execution and answer on the sender.
    Exec(Box<ExecJob>, oneshot::Sender<Report>),
    /// Drop the runtime and end the thread.
    Stop,
}

/// What an execution runs.
#[derive(Debug, Clone)]
pub(super) enum JsProgram {
    /// A script (or, when it has `import`/`export` statements, a module).
    Script(String),
    /// A function expression called with JSON arguments.
    Call {
        function: String,
        input: serde_json::Value,
    },
}

/// One execution, with everything the thread reports to.
pub(super) struct ExecJob {
    pub(super) program: JsProgram,
    pub(super) tenant: Option<String>,
    pub(super) memory_bytes: usize,
    pub(super) deadline: Instant,
    pub(super) output_cap: usize,
    pub(super) control: Control,
    pub(super) events: mpsc::Sender<OutputChunk>,
    pub(super) workdir: Option<Arc<Workdir>>,
    /// The largest file `sandbox:fs` may write (`file_size_bytes`).
    pub(super) file_size: Option<u64>,
    /// The CPU time the script may use (`cpu_ms`).
    pub(super) cpu_budget: Option<Duration>,
    /// Its share of a core, in thousandths (`cpu_millicores`; 1000 or more binds
    /// nothing: a script runs on one thread).
    pub(super) cpu_millicores: Option<u64>,
}

/// How an execution ended, as the thread saw it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Ending {
    Completed(i32),
    TimedOut,
    Cancelled,
    Destroyed,
    Memory,
    Output,
    FileSize,
    Cpu,
    Failed(Error),
}

/// The thread's answer for one execution.
#[derive(Debug)]
pub(super) struct Report {
    pub(super) ending: Ending,
    pub(super) stdout: Captured,
    pub(super) stderr: Captured,
    pub(super) value: Option<serde_json::Value>,
    pub(super) peak_memory: u64,
    pub(super) cpu: Duration,
    pub(super) wall: Duration,
}

/// Stops the running script from inside QuickJS's interrupt handler. The handler
/// runs every few microseconds of JavaScript, so it reads one atomic and the clock.
#[derive(Default)]
struct Watch {
    control: RefCell<Option<Control>>,
    deadline: Cell<Option<Instant>>,
    hit: Cell<Option<Ending>>,
    /// The CPU limits of the running script, when it has one.
    cpu: Cell<Option<CpuWatch>>,
    /// Calls since the CPU clock was last read.
    calls: Cell<u32>,
}

/// The CPU-time budget and share of one script, checked from the interrupt handler
/// every [`CPU_CHECK_EVERY`] calls (the thread's CPU clock is a system call).
#[derive(Clone, Copy)]
struct CpuWatch {
    started: Instant,
    cpu0: Duration,
    budget: Option<Duration>,
    millicores: Option<u64>,
}

const CPU_CHECK_EVERY: u32 = 64;

impl CpuWatch {
    /// `Some(Ending::Cpu)` past the budget; under a share of a core, first sleeps
    /// off what the script used beyond it, in slices of at most 10 ms, until
    /// `deadline` or until `stopped` says a cancel or destroy came.
    fn check(&self, deadline: Instant, stopped: impl Fn() -> bool) -> Option<Ending> {
        let used = thread_cpu().saturating_sub(self.cpu0);
        if self.budget.is_some_and(|b| used >= b) {
            return Some(Ending::Cpu);
        }
        if let Some(m) = self.millicores.filter(|m| *m < 1000) {
            // At `m` thousandths of a core, `used` CPU is due after used·1000/m.
            let due = used.mul_f64(1000.0 / m as f64);
            let now = Instant::now();
            let until = (self.started + due).min(deadline);
            let mut now = now;
            while now < until && !stopped() {
                std::thread::sleep((until - now).min(Duration::from_millis(10)));
                now = Instant::now();
            }
        }
        None
    }
}

impl Watch {
    fn check(&self) -> bool {
        let Some(deadline) = self.deadline.get() else {
            return false;
        };
        if self.hit_is_set() {
            return true;
        }
        let stop = self
            .control
            .borrow()
            .as_ref()
            .map_or(RUNNING, |c| c.load(Ordering::Relaxed));
        if stop == RUNNING {
            if let Some(cpu) = self.cpu.get() {
                let n = self.calls.get().wrapping_add(1);
                self.calls.set(n);
                if n.is_multiple_of(CPU_CHECK_EVERY) {
                    let stopped = || {
                        self.control
                            .borrow()
                            .as_ref()
                            .is_some_and(|c| c.load(Ordering::Relaxed) != RUNNING)
                    };
                    if let Some(ending) = cpu.check(deadline, stopped) {
                        self.hit.set(Some(ending));
                        return true;
                    }
                }
            }
        }
        let hit = match stop {
            RUNNING if Instant::now() < deadline => return false,
            RUNNING => Ending::TimedOut,
            CANCELLED => Ending::Cancelled,
            _ => Ending::Destroyed,
        };
        self.hit.set(Some(hit));
        true
    }

    fn hit_is_set(&self) -> bool {
        let hit = self.hit.take();
        let set = hit.is_some();
        self.hit.set(hit);
        set
    }

    fn arm(&self, control: Control, deadline: Instant, cpu: Option<CpuWatch>) {
        *self.control.borrow_mut() = Some(control);
        self.hit.set(None);
        self.cpu.set(cpu);
        self.calls.set(0);
        self.deadline.set(Some(deadline));
    }

    fn disarm(&self) -> Option<Ending> {
        self.deadline.set(None);
        self.cpu.set(None);
        *self.control.borrow_mut() = None;
        self.hit.take()
    }
}

/// One QuickJS runtime with its meter and watch.
struct Isolate {
    meter: Rc<Meter>,
    watch: Rc<Watch>,
    // Declared last: dropped after the contexts that use it.
    rt: Runtime,
}

impl Isolate {
    fn new(config: &WorkerConfig) -> Result<Isolate, String> {
        let meter = Meter::new(usize::MAX);
        let rt = Runtime::new_with_alloc(MeteredAlloc(meter.clone()))
            .map_err(|e| format!("creating a QuickJS runtime failed: {e}"))?;
        rt.set_max_stack_size(config.stack_bytes);
        rt.set_loader(host::HostResolver, host::HostLoader);
        let watch = Rc::new(Watch::default());
        let w = watch.clone();
        rt.set_interrupt_handler(Some(Box::new(move || w.check())));
        Ok(Isolate { meter, watch, rt })
    }

    /// A new context with the host globals installed.
    fn fresh_context(&self) -> Result<Context, String> {
        let ctx = Context::full(&self.rt).map_err(|e| format!("creating a context failed: {e}"))?;
        ctx.with(|c| host::install_globals(&c))
            .map_err(|e| format!("installing the host globals failed: {e}"))?;
        Ok(ctx)
    }
}

/// Fires when the thread's main loop ends, however it ends.
pub(super) struct ExitSignal(pub(super) Option<oneshot::Sender<()>>);

impl Drop for ExitSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// The thread's main loop. `ready` hears once whether the first runtime came up;
/// `exited` fires after the runtime is gone.
pub(super) fn main(
    config: WorkerConfig,
    jobs: Receiver<Job>,
    ready: oneshot::Sender<Result<(), String>>,
    exited: ExitSignal,
) {
    // Declared first: dropped last, after the runtime.
    let _exited = exited;
    host::set_modules(config.modules.clone());
    let mut isolate = match Isolate::new(&config) {
        Ok(i) => i,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut next = match isolate.fresh_context() {
        Ok(c) => Some(c),
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut runs_on_runtime: u32 = 0;
    let mut tenant: Option<Option<String>> = None;
    loop {
        let (job, reply) = match next_job(&jobs, config.idle_spin) {
            Some(Job::Exec(job, reply)) => (job, reply),
            Some(Job::Stop) | None => break,
        };
        if needs_fresh_runtime(runs_on_runtime, config.recycle_after, &tenant, &job.tenant) {
            next = None;
            match Isolate::new(&config) {
                Ok(i) => {
                    isolate = i;
                    runs_on_runtime = 0;
                }
                Err(e) => {
                    let _ = reply.send(Report::failed(e));
                    continue;
                }
            }
        }
        tenant = Some(job.tenant.clone());
        let ctx = match next.take().map_or_else(|| isolate.fresh_context(), Ok) {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(Report::failed(e));
                continue;
            }
        };
        let report = std::panic::catch_unwind(AssertUnwindSafe(|| run(&isolate, &ctx, &job)));
        drop(ctx);
        runs_on_runtime += 1;
        let (report, tainted) = match report {
            Ok(r) => {
                let tainted = !matches!(r.ending, Ending::Completed(_) | Ending::Failed(_));
                (r, tainted)
            }
            Err(panic) => (panicked(panic), true),
        };
        let _ = reply.send(report);
        if tainted {
            // A stopped script or a limit hit may leave the runtime in any state.
            match Isolate::new(&config) {
                Ok(i) => {
                    isolate = i;
                    runs_on_runtime = 0;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "an isolate could not replace its runtime; stopping");
                    break;
                }
            }
        }
        next = isolate.fresh_context().ok();
    }
    drop(next);
}

/// Whether the next execution needs a new runtime: the current one has served
/// `recycle_after` executions, or served another tenant (`last` is `None` before the
/// first execution).
fn needs_fresh_runtime(
    runs: u32,
    recycle_after: u32,
    last: &Option<Option<String>>,
    next: &Option<String>,
) -> bool {
    runs >= recycle_after || last.as_ref().is_some_and(|t| t != next)
}

/// The next job: polled for `spin` first, then waited for parked.
fn next_job(jobs: &Receiver<Job>, spin: Duration) -> Option<Job> {
    if !spin.is_zero() {
        let start = Instant::now();
        loop {
            match jobs.try_recv() {
                Ok(job) => return Some(job),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) if start.elapsed() >= spin => break,
                Err(TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
    }
    jobs.recv().ok()
}

impl Report {
    fn failed(message: String) -> Report {
        Report {
            ending: Ending::Failed(Error::new(ErrorCode::EngineFailed, message)),
            stdout: Captured::default(),
            stderr: Captured::default(),
            value: None,
            peak_memory: 0,
            cpu: Duration::ZERO,
            wall: Duration::ZERO,
        }
    }
}

fn panicked(panic: Box<dyn std::any::Any + Send>) -> Report {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    // The execution state may still be installed if the panic came from inside it.
    let _ = host::end();
    Report::failed(format!(
        "the isolate panicked while running the execution: {what}"
    ))
}

/// Runs one execution in a brand-new runtime on the calling thread, then drops it.
pub(super) fn run_once(config: &WorkerConfig, job: &ExecJob) -> Report {
    host::set_modules(config.modules.clone());
    let isolate = match Isolate::new(config) {
        Ok(i) => i,
        Err(e) => return Report::failed(e),
    };
    let ctx = match isolate.fresh_context() {
        Ok(c) => c,
        Err(e) => return Report::failed(e),
    };
    match std::panic::catch_unwind(AssertUnwindSafe(|| run(&isolate, &ctx, job))) {
        Ok(report) => report,
        Err(panic) => panicked(panic),
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    crate::host::sys::thread_cpu_time()
}

/// Why a script stopped before finishing: an exception, or something from outside.
enum Stop<'js> {
    /// The script threw (or a promise it awaited rejected).
    Threw(Value<'js>),
    /// The engine refused to go on (for example a handler that is not a function).
    Refused(Error),
    /// The awaited promise can never settle.
    Unsettled,
    /// A cancel, destroy or the deadline stopped it.
    Halted,
}

/// Runs one execution in `ctx` and reports how it went.
fn run(isolate: &Isolate, ctx: &Context, job: &ExecJob) -> Report {
    let started = Instant::now();
    let cpu0 = thread_cpu();
    isolate.meter.arm(job.memory_bytes);
    let cpu = (job.cpu_budget.is_some() || job.cpu_millicores.is_some_and(|m| m < 1000)).then_some(
        CpuWatch {
            started,
            cpu0,
            budget: job.cpu_budget,
            millicores: job.cpu_millicores,
        },
    );
    isolate.watch.arm(job.control.clone(), job.deadline, cpu);
    host::begin(RunState::new(
        job.output_cap,
        job.events.clone(),
        job.control.clone(),
        job.deadline,
        job.workdir.clone(),
        job.file_size,
    ));
    let (outcome, value) = ctx.with(|ctx| {
        let result = evaluate(&ctx, &job.program);
        // Timers and promise jobs still pending run to their end, as node runs them.
        let background = drain(&ctx, None);
        let (outcome, value) = match result {
            Ok(v) => match to_json_value(&ctx, v, job.output_cap) {
                Ok(value) => (Ok(()), value),
                Err(ending) => (Err(Some(ending)), None),
            },
            Err(stop) => (Err(stop_ending(&ctx, stop)), None),
        };
        let outcome = match (outcome, background) {
            (Ok(()), Err(stop)) => Err(stop_ending(&ctx, stop)),
            (o, _) => o,
        };
        host::clear_timers();
        (outcome, value)
    });
    let hit = isolate.watch.disarm();
    let refused_memory = isolate.meter.refused();
    let peak = isolate.meter.peak() as u64;
    isolate.meter.arm(usize::MAX);
    let state = host::end();
    let (stdout, stderr, blocked, file_too_big) = match state {
        Some(s) => (s.stdout, s.stderr, s.blocked, s.file_too_big),
        None => (Captured::default(), Captured::default(), None, false),
    };
    let stopped_outside = match job.control.load(Ordering::Relaxed) {
        CANCELLED => Some(Ending::Cancelled),
        DESTROYED => Some(Ending::Destroyed),
        _ if Instant::now() >= job.deadline => Some(Ending::TimedOut),
        _ => None,
    };
    let ending = if let Some(hit) = hit {
        hit
    } else if refused_memory {
        Ending::Memory
    } else if let Some(err) = blocked {
        Ending::Failed(err)
    } else if file_too_big {
        Ending::FileSize
    } else {
        match outcome {
            Ok(()) => Ending::Completed(0),
            Err(Some(e)) => e,
            // Stopped while waiting for a timer or a slow reader.
            Err(None) => stopped_outside.unwrap_or(Ending::TimedOut),
        }
    };
    Report {
        ending,
        stdout,
        stderr,
        value,
        peak_memory: peak,
        cpu: thread_cpu().saturating_sub(cpu0),
        wall: started.elapsed(),
    }
}

/// The ending for a script that stopped; an exception is printed like node prints an
/// uncaught error, and completes with exit code 1. `None` when it was stopped from
/// outside: the caller knows why.
fn stop_ending<'js>(ctx: &Ctx<'js>, stop: Stop<'js>) -> Option<Ending> {
    if host::halted() {
        // The interrupt's own exception is not the script's error.
        return None;
    }
    Some(match stop {
        Stop::Halted => return None,
        Stop::Refused(e) => Ending::Failed(e),
        Stop::Threw(v) => {
            let text = if v.is_error() {
                js::error_text(&v)
            } else {
                js::show(ctx, &v)
            };
            host::write_stderr(format!("Uncaught {text}\n").as_bytes());
            Ending::Completed(1)
        }
        Stop::Unsettled => {
            host::write_stderr(
                b"the script's promise never settled: nothing was left to run (no pending jobs or timers)\n",
            );
            Ending::Completed(1)
        }
    })
}

/// The pending exception as a [`Stop`].
fn caught<'js>(ctx: &Ctx<'js>, err: rquickjs::Error) -> Stop<'js> {
    if err.is_exception() {
        Stop::Threw(ctx.catch())
    } else {
        // A Rust-side error (a failed conversion, a resolution error) has no JS value;
        // pass its text on as the thrown message.
        Stop::Threw(
            rquickjs::String::from_str(ctx.clone(), &err.to_string())
                .map(|s| s.into_value())
                .unwrap_or_else(|_| Value::new_undefined(ctx.clone())),
        )
    }
}

fn eval_options(promise: bool, file: &str) -> EvalOptions {
    let mut opts = EvalOptions::default();
    opts.global = true;
    opts.strict = false;
    opts.promise = promise;
    opts.filename = Some(file.to_string());
    opts
}

/// Whether `source` is an ES module: a line that starts with an `import` or `export`
/// statement (`import(…)` and `import.meta` are expressions, not statements).
pub(super) fn is_module(source: &str) -> bool {
    if !(source.contains("import") || source.contains("export")) {
        return false;
    }
    source.lines().any(|line| {
        let line = line.trim_start();
        let rest = line
            .strip_prefix("import")
            .or_else(|| line.strip_prefix("export"));
        match rest.and_then(|r| r.chars().next()) {
            Some(c) => c.is_whitespace() || matches!(c, '{' | '*' | '"' | '\''),
            None => false,
        }
    })
}

fn evaluate<'js>(ctx: &Ctx<'js>, program: &JsProgram) -> Result<Value<'js>, Stop<'js>> {
    match program {
        JsProgram::Script(source) if is_module(source) => {
            let module = Module::declare(ctx.clone(), "main.mjs", source.as_str())
                .map_err(|e| caught(ctx, e))?;
            let (module, promise) = module.eval().map_err(|e| caught(ctx, e))?;
            settle(ctx, promise)?;
            let namespace = module.namespace().map_err(|e| caught(ctx, e))?;
            namespace
                .get::<_, Value>("default")
                .map_err(|e| caught(ctx, e))
        }
        JsProgram::Script(source) => {
            let asynchronous = source.contains("await");
            let v: Value = ctx
                .eval_with_options(source.as_str(), eval_options(asynchronous, "main.js"))
                .map_err(|e| caught(ctx, e))?;
            let v = if asynchronous {
                // Top-level await: the promise resolves to `{ value: <completion> }`.
                let wrapped = match v.into_promise() {
                    Some(p) => settle(ctx, p)?,
                    None => return Ok(Value::new_undefined(ctx.clone())),
                };
                match wrapped.as_object() {
                    Some(o) => o.get::<_, Value>("value").map_err(|e| caught(ctx, e))?,
                    None => wrapped,
                }
            } else {
                v
            };
            // A completion value that is a promise is awaited too.
            match v.as_promise() {
                Some(p) => settle(ctx, p.clone()),
                None => Ok(v),
            }
        }
        JsProgram::Call { function, input } => {
            let f: Value = ctx
                .eval_with_options(
                    format!("(\n{function}\n)"),
                    eval_options(false, "handler.js"),
                )
                .map_err(|e| caught(ctx, e))?;
            let Some(f) = f.into_function() else {
                return Err(Stop::Refused(Error::invalid_options(
                    "program.handler",
                    "does not evaluate to a function; give a function expression such as `(a, b) => a * b`",
                )));
            };
            let args: Vec<serde_json::Value> = match input {
                serde_json::Value::Null => Vec::new(),
                serde_json::Value::Array(items) => items.clone(),
                other => vec![other.clone()],
            };
            let mut js_args = Vec::with_capacity(args.len());
            for a in args {
                js_args.push(ctx.json_parse(a.to_string()).map_err(|e| caught(ctx, e))?);
            }
            let r: Value = f.call((Rest(js_args),)).map_err(|e| caught(ctx, e))?;
            match r.clone().into_promise() {
                Some(p) => settle(ctx, p),
                None => Ok(r),
            }
        }
    }
}

/// Runs promise jobs and timers until `until` settles, or until nothing is left.
fn drain<'js>(ctx: &Ctx<'js>, until: Option<&Promise<'js>>) -> Result<(), Stop<'js>> {
    loop {
        if host::halted() {
            return Err(Stop::Halted);
        }
        if until.is_some_and(|p| p.state() != PromiseState::Pending) {
            return Ok(());
        }
        if ctx.execute_pending_job() {
            continue;
        }
        match host::fire_next_timer(ctx) {
            Ok(true) => {}
            Ok(false) if host::halted() => return Err(Stop::Halted),
            Ok(false) => return Ok(()),
            Err(e) => return Err(caught(ctx, e)),
        }
    }
}

/// Awaits `promise` by running jobs and timers, under the deadline.
fn settle<'js>(ctx: &Ctx<'js>, promise: Promise<'js>) -> Result<Value<'js>, Stop<'js>> {
    drain(ctx, Some(&promise))?;
    match promise.result::<Value>() {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(caught(ctx, e)),
        None => Err(Stop::Unsettled),
    }
}

/// The result value as JSON; what JSON cannot hold (functions, symbols, BigInt,
/// cycles) comes back as its `String()` form. `undefined` is no value.
fn to_json_value<'js>(
    ctx: &Ctx<'js>,
    v: Value<'js>,
    cap: usize,
) -> Result<Option<serde_json::Value>, Ending> {
    if v.is_undefined() {
        return Ok(None);
    }
    let text = match ctx.json_stringify(v.clone()) {
        Ok(Some(s)) => s.to_string().ok(),
        Ok(None) => None,
        Err(_) => {
            let _ = ctx.catch();
            None
        }
    };
    if let Some(text) = text {
        if text.len() > cap {
            return Err(Ending::Output);
        }
        if let Ok(json) = serde_json::from_str(&text) {
            return Ok(Some(json));
        }
    }
    let shown = js::coerce(ctx, &v);
    if shown.len() > cap {
        return Err(Ending::Output);
    }
    Ok(Some(serde_json::Value::String(shown)))
}

#[cfg(test)]
mod tests {
    use super::{is_module, needs_fresh_runtime};

    #[test]
    fn runtimes_are_replaced_when_worn_and_on_tenant_change() {
        let a = Some("a".to_string());
        let b = Some("b".to_string());
        // The first execution keeps the runtime the thread started with.
        assert!(!needs_fresh_runtime(0, 1000, &None, &a));
        assert!(!needs_fresh_runtime(5, 1000, &Some(a.clone()), &a));
        assert!(needs_fresh_runtime(1000, 1000, &Some(a.clone()), &a));
        assert!(needs_fresh_runtime(1, 1, &Some(a.clone()), &a));
        assert!(needs_fresh_runtime(5, 1000, &Some(a.clone()), &b));
        assert!(needs_fresh_runtime(5, 1000, &Some(None), &a));
        assert!(needs_fresh_runtime(5, 1000, &Some(a), &None));
    }

    #[test]
    fn module_detection_looks_for_statements() {
        for m in [
            "import fs from 'fs'",
            "import { a } from 'x'",
            "import * as m from 'x'",
            "import 'side-effect'",
            "const a = 1;\n  export default a",
            "export{a}",
        ] {
            assert!(is_module(m), "{m}");
        }
        for s in [
            "1 + 1",
            "const m = await import('x')",
            "import.meta",
            "const important = 1; exported()",
            "// nothing to import here",
        ] {
            assert!(!is_module(s), "{s}");
        }
    }
}

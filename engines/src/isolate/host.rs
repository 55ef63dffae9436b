//! What a script sees of the host: `console`, timers, registered modules and
//! `sandbox:fs`, all bound to the execution that runs on this thread.
//!
//! One isolate runs one execution at a time on its own thread, so the execution's
//! state (captured output, timers, the workdir) lives in a thread-local that the host
//! functions reach without any locking.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{Error, ErrorCode, OutputChunk, StreamKind};
use rquickjs::function::{Opt, Rest};
use rquickjs::loader::{ImportAttributes, Loader, Resolver};
use rquickjs::module::{Declarations, Exports, ModuleDef};
use rquickjs::{Coerced, Ctx, Exception, Function, Module, Object, Persistent, Value};
use tokio::sync::mpsc;

use super::js::show;
use super::modules::{blocked, blocked_error, Export, HostModules, ModuleBody, SANDBOX_FS};
use crate::capture::Captured;
use crate::host::workdir::Workdir;

/// Timers one execution may have pending at once.
const MAX_TIMERS: usize = 10_000;

/// Why an execution was stopped from outside (the values of [`Control`]).
pub(super) const RUNNING: u8 = 0;
/// The caller cancelled the execution.
pub(super) const CANCELLED: u8 = 1;
/// The sandbox is being destroyed.
pub(super) const DESTROYED: u8 = 2;

/// The flag the async side sets to stop a running execution.
pub(super) type Control = Arc<AtomicU8>;

/// The state of the execution running on this thread.
pub(super) struct RunState {
    pub(super) stdout: Captured,
    pub(super) stderr: Captured,
    cap: usize,
    events: mpsc::Sender<OutputChunk>,
    delivering: bool,
    control: Control,
    deadline: Instant,
    workdir: Option<Arc<Workdir>>,
    /// The first denylisted import the script attempted.
    pub(super) blocked: Option<Error>,
    /// The largest file `sandbox:fs` may write.
    file_size: Option<u64>,
    /// Whether the script tried to write a larger one (the execution then ends
    /// `limit_exceeded`, even if the script caught the error).
    pub(super) file_too_big: bool,
    timers: BTreeMap<u64, Timer>,
    next_timer: u64,
}

struct Timer {
    due: Instant,
    callback: Persistent<Function<'static>>,
    args: Vec<Persistent<Value<'static>>>,
}

thread_local! {
    static RUN: RefCell<Option<RunState>> = const { RefCell::new(None) };
    static MODULES: RefCell<HostModules> = RefCell::new(HostModules::new());
}

impl RunState {
    pub(super) fn new(
        cap: usize,
        events: mpsc::Sender<OutputChunk>,
        control: Control,
        deadline: Instant,
        workdir: Option<Arc<Workdir>>,
        file_size: Option<u64>,
    ) -> RunState {
        RunState {
            stdout: Captured::default(),
            stderr: Captured::default(),
            cap,
            events,
            delivering: true,
            control,
            deadline,
            workdir,
            blocked: None,
            file_size,
            file_too_big: false,
            timers: BTreeMap::new(),
            next_timer: 1,
        }
    }

    /// Whether the caller stopped the execution or its deadline passed.
    fn halted(&self) -> bool {
        self.control.load(Ordering::Relaxed) != RUNNING || Instant::now() >= self.deadline
    }

    /// Keeps what fits under the cap and streams it; the first byte past the cap adds
    /// the truncation marker, and later output is dropped.
    fn write(&mut self, stream: StreamKind, data: &[u8]) {
        let capture = match stream {
            StreamKind::Stdout => &mut self.stdout,
            StreamKind::Stderr => &mut self.stderr,
        };
        let deliver = capture.keep(data, self.cap as u64);
        if !deliver.is_empty() {
            self.deliver(OutputChunk {
                stream,
                data: deliver,
            });
        }
    }

    /// Streams a chunk; a full channel (a slow reader) makes the script wait, but never
    /// past its deadline or a cancel.
    fn deliver(&mut self, mut chunk: OutputChunk) {
        if !self.delivering {
            return;
        }
        let mut pause = Duration::from_micros(50);
        loop {
            match self.events.try_send(chunk) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.delivering = false;
                    return;
                }
                Err(mpsc::error::TrySendError::Full(back)) => {
                    if self.halted() {
                        return;
                    }
                    chunk = back;
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(2));
                }
            }
        }
    }
}

/// Installs the state of the execution about to run on this thread.
pub(super) fn begin(state: RunState) {
    RUN.with(|r| *r.borrow_mut() = Some(state));
}

/// Removes and returns the state of the execution that ran on this thread. Timers
/// still pending are dropped with it; call it inside the context they belong to.
pub(super) fn end() -> Option<RunState> {
    RUN.with(|r| r.borrow_mut().take())
}

fn with_run<R>(f: impl FnOnce(&mut RunState) -> R) -> Option<R> {
    RUN.with(|r| r.borrow_mut().as_mut().map(f))
}

/// Sets the modules scripts on this thread may import.
pub(super) fn set_modules(modules: HostModules) {
    MODULES.with(|m| *m.borrow_mut() = modules);
}

/// Appends to the running execution's stderr (and streams it).
pub(super) fn write_stderr(data: &[u8]) {
    with_run(|r| r.write(StreamKind::Stderr, data));
}

/// Whether the running execution was stopped or ran out of time.
pub(super) fn halted() -> bool {
    with_run(|r| r.halted()).unwrap_or(true)
}

/// The earliest pending timer's due time.
pub(super) fn next_timer() -> Option<Instant> {
    with_run(|r| r.timers.values().map(|t| t.due).min()).flatten()
}

/// Waits for the earliest timer and runs it. Returns `Ok(false)` when no timer is
/// pending or the execution was stopped while waiting, and the exception when the
/// callback threw.
pub(super) fn fire_next_timer<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<bool> {
    let Some(due) = next_timer() else {
        return Ok(false);
    };
    loop {
        if halted() {
            return Ok(false);
        }
        let now = Instant::now();
        if now >= due {
            break;
        }
        std::thread::sleep((due - now).min(Duration::from_millis(5)));
    }
    let timer = with_run(|r| {
        let id = r
            .timers
            .iter()
            .min_by_key(|(id, t)| (t.due, **id))
            .map(|(id, _)| *id)?;
        r.timers.remove(&id)
    })
    .flatten();
    let Some(timer) = timer else {
        return Ok(false);
    };
    let callback = timer.callback.restore(ctx)?;
    let args = timer
        .args
        .into_iter()
        .map(|a| a.restore(ctx))
        .collect::<rquickjs::Result<Vec<_>>>()?;
    callback.call::<_, ()>((Rest(args),))?;
    Ok(true)
}

/// Drops pending timers; their callbacks never run.
pub(super) fn clear_timers() {
    let timers = with_run(|r| std::mem::take(&mut r.timers));
    drop(timers);
}

/// Installs `console` and the timer functions on a fresh context's global object.
pub(super) fn install_globals<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<()> {
    let globals = ctx.globals();
    let console = Object::new(ctx.clone())?;
    for (name, stream) in [
        ("log", StreamKind::Stdout),
        ("info", StreamKind::Stdout),
        ("debug", StreamKind::Stdout),
        ("warn", StreamKind::Stderr),
        ("error", StreamKind::Stderr),
    ] {
        let f = Function::new(ctx.clone(), move |ctx: Ctx<'js>, args: Rest<Value<'js>>| {
            let mut line = String::new();
            for (i, v) in args.0.iter().enumerate() {
                if i > 0 {
                    line.push(' ');
                }
                line.push_str(&show(&ctx, v));
            }
            line.push('\n');
            with_run(|r| r.write(stream, line.as_bytes()));
        })?
        .with_name(name)?;
        console.set(name, f)?;
    }
    globals.set("console", console)?;

    let set_timeout = Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>, callback: Value<'js>, delay: Opt<Value<'js>>, args: Rest<Value<'js>>| {
            let Some(callback) = callback.into_function() else {
                return Err(Exception::throw_type(
                    &ctx,
                    "setTimeout: the callback is not a function",
                ));
            };
            let ms = delay
                .0
                .and_then(|d| d.as_number())
                .filter(|d| d.is_finite() && *d > 0.0)
                .unwrap_or(0.0)
                .min(f64::from(i32::MAX));
            let timer = Timer {
                due: Instant::now() + Duration::from_micros((ms * 1000.0) as u64),
                callback: Persistent::save(&ctx, callback),
                args: args
                    .0
                    .into_iter()
                    .map(|a| Persistent::save(&ctx, a))
                    .collect(),
            };
            let id = with_run(|r| {
                if r.timers.len() >= MAX_TIMERS {
                    return None;
                }
                let id = r.next_timer;
                r.next_timer += 1;
                r.timers.insert(id, timer);
                Some(id)
            })
            .flatten();
            match id {
                Some(id) => Ok(id as f64),
                None => Err(Exception::throw_range(
                    &ctx,
                    &format!("setTimeout: more than {MAX_TIMERS} timers are pending"),
                )),
            }
        },
    )?
    .with_name("setTimeout")?;
    globals.set("setTimeout", set_timeout)?;
    let clear_timeout = Function::new(ctx.clone(), |id: Opt<Value<'js>>| {
        if let Some(id) = id.0.and_then(|v| v.as_number()) {
            if id >= 1.0 {
                with_run(|r| r.timers.remove(&(id as u64)));
            }
        }
    })?
    .with_name("clearTimeout")?;
    globals.set("clearTimeout", clear_timeout)?;
    Ok(())
}

/// Throws a JS `Error` whose `code` property holds the Paddock error code.
fn throw_coded(ctx: &Ctx<'_>, err: &Error) -> rquickjs::Error {
    let message = format!("{}: {}", err.code, err.message);
    match Exception::from_message(ctx.clone(), &message) {
        Ok(exception) => {
            let _ = exception.set("code", err.code.as_str());
            ctx.throw(exception.into_value())
        }
        Err(e) => e,
    }
}

/// Resolves import specifiers: registered names and `sandbox:fs` only.
#[derive(Debug, Default)]
pub(super) struct HostResolver;

impl Resolver for HostResolver {
    fn resolve<'js>(
        &mut self,
        _ctx: &Ctx<'js>,
        base: &str,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<String> {
        if let Some(denied) = blocked(name) {
            let err = blocked_error(name, denied);
            let message = err.message.clone();
            with_run(|r| {
                r.blocked.get_or_insert(err);
            });
            return Err(rquickjs::Error::new_resolving_message(base, name, message));
        }
        let known = name == SANDBOX_FS || MODULES.with(|m| m.borrow().contains(name));
        if known {
            Ok(name.to_string())
        } else {
            Err(rquickjs::Error::new_resolving_message(
                base,
                name,
                "no such module: an isolate imports only the host modules it was given and `sandbox:fs`",
            ))
        }
    }
}

/// Loads registered modules and `sandbox:fs`.
#[derive(Debug, Default)]
pub(super) struct HostLoader;

impl Loader for HostLoader {
    fn load<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<Module<'js, rquickjs::module::Declared>> {
        if name == SANDBOX_FS {
            return Module::declare_def::<SandboxFs, _>(ctx.clone(), name);
        }
        let source = MODULES.with(|m| match m.borrow().get(name) {
            Some(ModuleBody::Source(s)) => Some(Some(s.clone())),
            Some(ModuleBody::Host(_)) => Some(None),
            None => None,
        });
        match source {
            Some(Some(source)) => Module::declare(ctx.clone(), name, source),
            Some(None) => Module::declare_def::<HostModule, _>(ctx.clone(), name),
            None => Err(rquickjs::Error::new_loading_message(name, "not registered")),
        }
    }
}

/// A registered module of JSON values and host functions.
struct HostModule;

fn host_exports(name: &str) -> BTreeMap<String, Export> {
    MODULES.with(|m| match m.borrow().get(name) {
        Some(ModuleBody::Host(exports)) => exports.clone(),
        _ => BTreeMap::new(),
    })
}

impl ModuleDef for HostModule {
    fn declare<'js>(decl: &Declarations<'js>) -> rquickjs::Result<()> {
        let name: String = decl.module().name()?;
        for export in host_exports(&name).keys() {
            decl.declare(export.as_str())?;
        }
        decl.declare("default")?;
        Ok(())
    }

    fn evaluate<'js>(ctx: &Ctx<'js>, exports: &Exports<'js>) -> rquickjs::Result<()> {
        let name: String = exports.module().name()?;
        let all = Object::new(ctx.clone())?;
        for (export, value) in host_exports(&name) {
            let v: Value<'js> = match value {
                Export::Value(json) => ctx.json_parse(json.to_string())?,
                Export::Function(f) => host_function(ctx, &export, f)?.into_value(),
            };
            all.set(export.as_str(), v.clone())?;
            exports.export(export.as_str(), v)?;
        }
        exports.export("default", all)?;
        Ok(())
    }
}

/// Wraps a host function: arguments go out as JSON, the answer comes back as JSON.
fn host_function<'js>(
    ctx: &Ctx<'js>,
    name: &str,
    f: super::modules::HostFn,
) -> rquickjs::Result<Function<'js>> {
    let label = name.to_string();
    Function::new(ctx.clone(), move |ctx: Ctx<'js>, args: Rest<Value<'js>>| {
        let mut json = Vec::with_capacity(args.0.len());
        for v in args.0 {
            json.push(to_json(&ctx, v)?);
        }
        match f(json) {
            Ok(answer) => ctx.json_parse(answer.to_string()),
            Err(message) => Err(Exception::throw_message(
                &ctx,
                &format!("{label}: {message}"),
            )),
        }
    })?
    .with_name(name)
}

/// A JS value as JSON; `undefined` and functions become `null`.
fn to_json<'js>(ctx: &Ctx<'js>, v: Value<'js>) -> rquickjs::Result<serde_json::Value> {
    match ctx.json_stringify(v)? {
        None => Ok(serde_json::Value::Null),
        Some(s) => {
            let s = s.to_string()?;
            serde_json::from_str(&s)
                .map_err(|e| Exception::throw_type(ctx, &format!("not JSON: {e}")))
        }
    }
}

/// `sandbox:fs`: the file contract of the sandbox workdir, from inside the script.
struct SandboxFs;

const FS_EXPORTS: &[&str] = &["readFile", "writeFile", "listFiles", "exists"];

fn workdir() -> Option<Arc<Workdir>> {
    with_run(|r| r.workdir.clone()).flatten()
}

fn fs_call<'js, T>(
    ctx: &Ctx<'js>,
    f: impl FnOnce(&Workdir) -> paddock_core::Result<T>,
) -> rquickjs::Result<T> {
    let Some(dir) = workdir() else {
        return Err(throw_coded(
            ctx,
            &Error::new(
                ErrorCode::CapabilityNotSupported,
                "`sandbox:fs` needs a sandbox workdir; this execution runs without one",
            ),
        ));
    };
    f(&dir).map_err(|e| throw_coded(ctx, &e))
}

impl ModuleDef for SandboxFs {
    fn declare<'js>(decl: &Declarations<'js>) -> rquickjs::Result<()> {
        for name in FS_EXPORTS {
            decl.declare(*name)?;
        }
        decl.declare("default")?;
        Ok(())
    }

    fn evaluate<'js>(ctx: &Ctx<'js>, exports: &Exports<'js>) -> rquickjs::Result<()> {
        let read = Function::new(ctx.clone(), |ctx: Ctx<'js>, path: String| {
            let bytes = fs_call(&ctx, |d| d.read_file(&path))?;
            Ok::<_, rquickjs::Error>(String::from_utf8_lossy(&bytes).into_owned())
        })?
        .with_name("readFile")?;
        let write = Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, path: String, data: Coerced<String>| {
                let len = data.0.len() as u64;
                let limit = with_run(|r| r.file_size).flatten();
                if let Some(max) = limit.filter(|&max| len > max) {
                    with_run(|r| r.file_too_big = true);
                    return Err(throw_coded(
                        &ctx,
                        &Error::new(
                            ErrorCode::LimitsExceeded,
                            format!("writeFile(`{path}`): {len} bytes is more than file_size_bytes ({max})"),
                        ),
                    ));
                }
                fs_call(&ctx, |d| d.write_file(&path, data.0.as_bytes()))
            },
        )?
        .with_name("writeFile")?;
        let list = Function::new(ctx.clone(), |ctx: Ctx<'js>, path: Opt<String>| {
            let path = path.0.unwrap_or_default();
            let entries = fs_call(&ctx, |d| d.list_files(&path))?;
            let out = rquickjs::Array::new(ctx.clone())?;
            for (i, e) in entries.into_iter().enumerate() {
                let o = Object::new(ctx.clone())?;
                o.set("path", e.path)?;
                o.set("size", e.size as f64)?;
                o.set("isDir", e.is_dir)?;
                out.set(i, o)?;
            }
            Ok::<_, rquickjs::Error>(out)
        })?
        .with_name("listFiles")?;
        let exists = Function::new(ctx.clone(), |ctx: Ctx<'js>, path: String| {
            fs_call(&ctx, |d| d.exists(&path))
        })?
        .with_name("exists")?;
        let all = Object::new(ctx.clone())?;
        for (name, f) in [
            ("readFile", read),
            ("writeFile", write),
            ("listFiles", list),
            ("exists", exists),
        ] {
            all.set(name, f.clone())?;
            exports.export(name, f)?;
        }
        exports.export("default", all)?;
        Ok(())
    }
}

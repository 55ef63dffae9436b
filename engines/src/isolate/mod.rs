//! The isolate engine: JavaScript in pooled QuickJS runtimes, one per dedicated
//! thread (the `context-isolated` level).
//!
//! A sandbox is one isolate thread plus a workdir. Each execution gets a fresh
//! context, built while the isolate is idle; the runtime is replaced after
//! `recycle_after` executions, after any execution that was stopped or hit a limit,
//! and when the tenant changes, so no state leaks from one execution to the next.
//!
//! - `Code { language: javascript }` runs a script; its completion value (awaited when
//!   it is a promise) is the result's `value`. Source with `import`/`export`
//!   statements runs as a module whose default export is the value. Top-level `await`
//!   works in both.
//! - `Invoke { handler, input }` calls a function: `handler` names a configured
//!   handler or is itself a function expression; an array `input` is spread into the
//!   arguments, `null` passes none, and any other value is the single argument.
//! - Limits: the isolate's heap (`memory_bytes`, `MEMORY_EXCEEDED` even if the script
//!   catches the allocation failure), its stack, and the deadline and cancel through
//!   QuickJS's interrupt handler. `console.*` is captured, capped and streamed.
//! - Modules: registered host modules and `sandbox:fs` only; Node's system modules are
//!   refused with `BLOCKED_MODULE` (see [`modules`]).
//!
//! ```no_run
//! # async fn demo() -> paddock_core::Result<()> {
//! use paddock_core::{CancelToken, DiscardSink, Engine, ExecRequest, Program, SandboxSpec};
//! use paddock_engines::isolate::IsolateEngine;
//!
//! let engine = IsolateEngine::with_defaults()?;
//! let sandbox = engine.create(&SandboxSpec::default()).await?;
//! let call = Program::Invoke { handler: "(a, b) => a * b".into(), input: serde_json::json!([6, 7]) };
//! let result = sandbox.exec(ExecRequest::new(call), &DiscardSink, CancelToken::new()).await?;
//! assert_eq!(result.value, Some(serde_json::json!(42)));
//! sandbox.destroy().await?;
//! # Ok(()) }
//! ```

mod alloc;
mod config;
mod host;
mod js;
pub mod modules;
mod sandbox;
mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use paddock_core::{
    CancelToken, Capabilities, Engine, EngineName, Error, ErrorCode, ExecRequest, ExecResult,
    IsolationLevel, Language, Limits, Program, ProgramKind, Result, Sandbox, SandboxSpec,
    ValidRequest,
};

pub use config::IsolateConfig;
pub use modules::{HostFn, HostModules};
pub use sandbox::IsolateSandbox;

static NEXT_ENGINE: AtomicU64 = AtomicU64::new(0);

/// The QuickJS isolate engine.
#[derive(Debug, Clone)]
pub struct IsolateEngine {
    inner: Arc<EngineInner>,
}

#[derive(Debug)]
pub(crate) struct EngineInner {
    pub(crate) config: IsolateConfig,
    pub(crate) modules: HostModules,
    pub(crate) handlers: BTreeMap<String, String>,
    pub(crate) caps: Capabilities,
    /// The limits a sandbox gets where its spec sets none.
    pub(crate) defaults: Limits,
    pub(crate) workdir_root: PathBuf,
    /// The sandboxes' own filesystems (the disk quota of `sandbox:fs`).
    pub(crate) disks: crate::host::volume::Disks,
    pub(crate) next_sandbox: AtomicU64,
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        // Sandboxes remove their own workdirs; the engine's directory goes when empty.
        let _ = std::fs::remove_dir(&self.workdir_root);
    }
}

impl EngineInner {
    fn worker_config(&self) -> worker::WorkerConfig {
        worker::WorkerConfig {
            stack_bytes: self.config.stack_bytes as usize,
            recycle_after: self.config.recycle_after,
            idle_spin: std::time::Duration::from_micros(self.config.idle_spin_us),
            modules: self.modules.clone(),
        }
    }

    /// The program as the isolate runs it and the limits it runs under, or why it
    /// cannot run.
    fn prepare(
        &self,
        request: &ValidRequest,
        base: &Limits,
    ) -> Result<(worker::JsProgram, Limits)> {
        let program = self.js_program(request)?;
        Ok((program, request.limits.or(base)))
    }

    fn js_program(&self, request: &ExecRequest) -> Result<worker::JsProgram> {
        self.caps
            .check_program(&EngineName::ISOLATE, request.program.kind())?;
        let refuse = |what: &str| {
            Err(Error::new(
                ErrorCode::CapabilityNotSupported,
                format!("the isolate engine has no {what}; pass data in the source or as the `input` of an Invoke"),
            ))
        };
        if request.stdin.is_some() {
            return refuse("stdin");
        }
        if !request.env.is_empty() {
            return refuse("environment variables");
        }
        if request.cwd.is_some() {
            return refuse("working directory (`sandbox:fs` paths are relative to the workdir)");
        }
        match &request.program {
            Program::Code { source, .. } => Ok(worker::JsProgram::Script(source.clone())),
            Program::Invoke { handler, input } => Ok(worker::JsProgram::Call {
                function: self
                    .handlers
                    .get(handler)
                    .cloned()
                    .unwrap_or_else(|| handler.clone()),
                input: input.clone(),
            }),
            Program::Command { .. } | Program::Resume { .. } => Err(Error::new(
                ErrorCode::CapabilityNotSupported,
                "the isolate engine runs neither commands nor resumes",
            )),
        }
    }
}

impl IsolateEngine {
    /// An engine with the configuration's JSON host modules and handlers.
    pub fn new(config: &IsolateConfig) -> Result<IsolateEngine> {
        IsolateEngine::with_modules(config, HostModules::new())
    }

    /// An engine with the default configuration.
    pub fn with_defaults() -> Result<IsolateEngine> {
        IsolateEngine::new(&IsolateConfig::default())
    }

    /// An engine with `modules` (which may hold Rust host functions) plus the
    /// configuration's JSON modules. A name registered twice is `INVALID_MODULE`.
    pub fn with_modules(config: &IsolateConfig, modules: HostModules) -> Result<IsolateEngine> {
        IsolateEngine::configured(config, modules, Limits::defaults())
    }

    /// [`with_modules`](IsolateEngine::with_modules), with these default limits
    /// (unset fields fall back to [`Limits::defaults`]).
    pub fn configured(
        config: &IsolateConfig,
        mut modules: HostModules,
        defaults: Limits,
    ) -> Result<IsolateEngine> {
        config.validate()?;
        let defaults = defaults.or(&Limits::defaults());
        defaults.validate("limits", true)?;
        for (name, exports) in &config.modules {
            modules.json(name, exports.clone())?;
        }
        let parent = config
            .workdir_root
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let disks = crate::host::volume::Disks::new(&parent);
        let caps = Capabilities::new(
            IsolationLevel::ContextIsolated,
            &[ProgramKind::Code(Language::Javascript), ProgramKind::Invoke],
            &["none"],
            &[
                "streaming",
                "files",
                paddock_core::engine::FEATURE_FILEOPS,
                "output_cap",
                "value",
                "js_invoke",
                "js_heap_limit",
                "module_denylist",
                "sandbox_fs",
            ],
        )
        // A script starts no process and holds no descriptor of its own, so `pids`
        // and `open_files` hold by construction; `file_size_bytes` bounds
        // `sandbox:fs` writes; the interrupt handler holds the CPU time and share.
        .with_limits(&[
            "cpu_ms",
            "cpu_millicores",
            "memory_bytes",
            "max_output_bytes",
            "file_size_bytes",
            "pids",
            "open_files",
        ]);
        let caps = if disks.backend().is_some() {
            caps.with_limits(&["disk_bytes", "disk_files"])
        } else {
            caps
        };
        let workdir_root = parent.join(format!(
            "paddock-isolate-{}-{}",
            std::process::id(),
            NEXT_ENGINE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&workdir_root).map_err(|e| {
            Error::invalid_config(
                "isolate.workdir_root",
                format!("cannot create `{}`: {e}", workdir_root.display()),
            )
        })?;
        Ok(IsolateEngine {
            inner: Arc::new(EngineInner {
                config: config.clone(),
                handlers: config.handlers.clone(),
                modules,
                caps,
                defaults,
                workdir_root,
                disks,
                next_sandbox: AtomicU64::new(0),
            }),
        })
    }

    /// Runs one execution in a brand-new runtime on the calling thread and drops the
    /// runtime: no pool, no thread hand-off, no workdir (`sandbox:fs` is refused) and
    /// no streaming (output comes back in the result). Blocks until the script ends
    /// or its deadline passes, so call it where blocking is fine.
    pub fn run_blocking(&self, request: ExecRequest) -> Result<ExecResult> {
        let request = ValidRequest::new(request)?;
        let (program, limits) = self.inner.prepare(&request, &self.inner.defaults)?;
        let request = request.into_inner();
        let (events, _dropped) = tokio::sync::mpsc::channel(1);
        let control = Arc::new(std::sync::atomic::AtomicU8::new(0));
        let job = sandbox::new_job(
            program,
            &limits,
            request.tenant.clone(),
            control,
            events,
            None,
        );
        let config = self.inner.worker_config();
        let started = paddock_core::exec::unix_ms();
        let report = worker::run_once(&config, &job);
        Ok(sandbox::into_result(
            report,
            request.id,
            "oneshot",
            &CancelToken::new(),
            started,
            started,
        ))
    }

    /// The host modules scripts may import (besides `sandbox:fs`).
    pub fn modules(&self) -> &HostModules {
        &self.inner.modules
    }
}

#[async_trait]
impl Engine for IsolateEngine {
    fn name(&self) -> EngineName {
        EngineName::ISOLATE
    }

    fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Sandbox>> {
        Ok(Arc::new(
            IsolateSandbox::create(self.inner.clone(), spec).await?,
        ))
    }
}

//! The callers: exactly-once bookkeeping, the counts, and one caller's loop that
//! runs the mix and checks every answer.

use super::*;

/// What happened to one request id so far.
#[derive(Debug, Default)]
pub(super) struct Track {
    pub(super) answered: bool,
    pub(super) audits: u32,
}

/// Exactly-once bookkeeping: ids stay in `open` until they have their answer and
/// their audit entry.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    pub(super) open: Mutex<HashMap<ExecutionId, Track>>,
    pub(super) issued: AtomicU64,
    pub(super) answered: AtomicU64,
    pub(super) audited: AtomicU64,
    pub(super) duplicate_answers: AtomicU64,
    pub(super) duplicate_audits: AtomicU64,
    /// Audit entries for ids that were never issued, or whose entry had already come.
    pub(super) unmatched_audits: AtomicU64,
}

impl Ledger {
    pub(super) fn open(&self) -> std::sync::MutexGuard<'_, HashMap<ExecutionId, Track>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn issue(&self, id: &ExecutionId) {
        self.issued.fetch_add(1, Ordering::Relaxed);
        self.open().insert(id.clone(), Track::default());
    }

    pub(super) fn answer(&self, id: &ExecutionId) {
        let mut open = self.open();
        match open.get_mut(id) {
            Some(t) if !t.answered => {
                t.answered = true;
                self.answered.fetch_add(1, Ordering::Relaxed);
                if t.audits == 1 {
                    open.remove(id);
                }
            }
            _ => {
                self.duplicate_answers.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(super) fn audit(&self, id: &ExecutionId) {
        self.audited.fetch_add(1, Ordering::Relaxed);
        let mut open = self.open();
        match open.get_mut(id) {
            Some(t) => {
                t.audits += 1;
                if t.audits > 1 {
                    self.duplicate_audits.fetch_add(1, Ordering::Relaxed);
                } else if t.answered {
                    open.remove(id);
                }
            }
            None => {
                self.unmatched_audits.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Answered ids without an audit entry: refused before acceptance, or lost by
    /// the audit.
    pub(super) fn answered_without_audit(&self) -> u64 {
        let open = self.open();
        open.values()
            .filter(|t| t.answered && t.audits == 0)
            .count() as u64
    }
}

/// How an answer was counted.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    Ok,
    FailedAsExpected,
    TimedOut,
    Cancelled,
    Truncated,
}

/// Counters of the whole run.
#[derive(Debug)]
pub(super) struct Counts {
    pub(super) by_task: Vec<AtomicU64>,
    pub(super) unexpected_by_task: Vec<AtomicU64>,
    pub(super) ok: AtomicU64,
    pub(super) failed_as_expected: AtomicU64,
    pub(super) timed_out: AtomicU64,
    pub(super) cancelled: AtomicU64,
    pub(super) truncated: AtomicU64,
    /// Refusals that were retried: of executions, and of session opens.
    pub(super) rejected: AtomicU64,
    pub(super) sessions: AtomicU64,
    pub(super) unexpected: AtomicU64,
    pub(super) first_unexpected: Mutex<Option<String>>,
}

impl Counts {
    pub(super) fn new(tasks: usize) -> Counts {
        let zeros = || (0..tasks).map(|_| AtomicU64::new(0)).collect();
        Counts {
            by_task: zeros(),
            unexpected_by_task: zeros(),
            ok: AtomicU64::new(0),
            failed_as_expected: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            sessions: AtomicU64::new(0),
            unexpected: AtomicU64::new(0),
            first_unexpected: Mutex::new(None),
        }
    }

    pub(super) fn count(&self, kind: Kind) {
        let counter = match kind {
            Kind::Ok => &self.ok,
            Kind::FailedAsExpected => &self.failed_as_expected,
            Kind::TimedOut => &self.timed_out,
            Kind::Cancelled => &self.cancelled,
            Kind::Truncated => &self.truncated,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn unexpected(&self, task: usize, name: &str, why: String) {
        self.unexpected.fetch_add(1, Ordering::Relaxed);
        self.unexpected_by_task[task].fetch_add(1, Ordering::Relaxed);
        let mut first = self
            .first_unexpected
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        first.get_or_insert_with(|| format!("{name}: {why}"));
    }
}

/// What the callers share.
#[derive(Debug)]
pub(super) struct Ctx {
    pub(super) paddock: Paddock,
    pub(super) tasks: Vec<Task>,
    pub(super) schedule: Vec<usize>,
    pub(super) next: AtomicUsize,
    /// Engines sessions take turns on.
    pub(super) session_engines: Vec<EngineName>,
    pub(super) next_session: AtomicUsize,
    pub(super) ledger: Arc<Ledger>,
    pub(super) counts: Counts,
    pub(super) stop: AtomicBool,
}

/// Refusals a well-behaved caller retries after `retry_after_ms`.
pub(super) fn retryable(e: &Error) -> bool {
    matches!(e.code, ErrorCode::PoolExhausted | ErrorCode::RateLimited)
}

/// Waits as the refusal advises (5 ms to 1 s).
pub(super) async fn back_off(e: &Error) {
    let ms = e.retry_after_ms.unwrap_or(50).clamp(5, 1_000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// The first `n` characters of `s`.
pub(super) fn head(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// A result in one line, for the first unexpected example.
pub(super) fn brief(r: &ExecResult) -> String {
    let outcome = serde_json::to_string(&r.outcome).unwrap_or_default();
    format!(
        "{outcome} on {} ({}); stdout {:?} ({} bytes{}); stderr {:?}; warnings {:?}",
        r.engine,
        r.instance_id,
        head(&r.stdout, 80),
        r.stdout.len(),
        if r.stdout_truncated {
            ", truncated"
        } else {
            ""
        },
        head(&r.stderr, 200),
        r.warnings,
    )
}

/// Checks an answer against the expectation.
pub(super) fn check(exec: &Exec, id: &ExecutionId, r: &ExecResult) -> Result<Kind, String> {
    if &r.id != id {
        return Err(format!("the answer to {id} carries id {}", r.id));
    }
    if r.engine != exec.engine {
        return Err(format!(
            "ran on {} instead of {}: {}",
            r.engine,
            exec.engine,
            brief(r)
        ));
    }
    let within_cap = r.stdout.len() as u64 <= CAP + 128;
    match exec.expect {
        Expect::Ok(out) if r.is_success() && r.stdout == out && !r.stdout_truncated => Ok(Kind::Ok),
        Expect::Exit(code, marker) if r.exit_code() == Some(code) && r.stderr.contains(marker) => {
            Ok(Kind::FailedAsExpected)
        }
        Expect::TimedOut if r.outcome == Outcome::TimedOut => Ok(Kind::TimedOut),
        Expect::Cancelled if r.outcome == Outcome::Cancelled => Ok(Kind::Cancelled),
        Expect::Truncated if r.is_success() && r.stdout_truncated && within_cap => {
            Ok(Kind::Truncated)
        }
        _ => Err(format!("expected {:?}, got {}", exec.expect, brief(r))),
    }
}

impl Ctx {
    /// Runs one piece of work of the mix, retrying refusals.
    pub(super) async fn run(self: &Arc<Self>, task: usize) {
        let name = self.tasks[task].name;
        self.counts.by_task[task].fetch_add(1, Ordering::Relaxed);
        match &self.tasks[task].work {
            Work::Exec(exec) => {
                if let Err(why) = self.exec(exec).await {
                    self.counts.unexpected(task, name, why);
                }
            }
            Work::Session => {
                let n = self.next_session.fetch_add(1, Ordering::Relaxed);
                let engine = self.session_engines[n % self.session_engines.len()].clone();
                match self.session(engine.clone(), n).await {
                    Ok(()) => {
                        self.counts.sessions.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(why) => self
                        .counts
                        .unexpected(task, name, format!("{engine}: {why}")),
                }
            }
        }
    }

    /// One pooled execution, checked; refusals are retried with a fresh id.
    pub(super) async fn exec(self: &Arc<Self>, exec: &Exec) -> Result<(), String> {
        loop {
            let mut request = ExecRequest::new(exec.program.clone());
            request.limits = exec.limits.clone();
            let id = request.id.clone();
            let mut msg = Execute::new(request);
            msg.order.level = level_of(&exec.engine);
            self.ledger.issue(&id);
            let answer = tokio::time::timeout(ANSWER_LIMIT, self.drive(exec.drive, msg))
                .await
                .map_err(|_| format!("no answer for {id} within {ANSWER_LIMIT:?}"))?;
            self.ledger.answer(&id);
            match answer {
                Err(e) if retryable(&e) => {
                    self.counts.rejected.fetch_add(1, Ordering::Relaxed);
                    back_off(&e).await;
                }
                Err(e) => return Err(format!("refused: {e}")),
                Ok(r) => {
                    let kind = check(exec, &id, &r)?;
                    self.counts.count(kind);
                    return Ok(());
                }
            }
        }
    }

    pub(super) async fn drive(
        self: &Arc<Self>,
        drive: Drive,
        msg: Execute,
    ) -> Result<ExecResult, Error> {
        let id = msg.order.request.id.clone();
        match drive {
            Drive::Call => self.paddock.execute_with(msg).await,
            Drive::CancelById(after) => {
                let paddock = self.paddock.clone();
                let run = tokio::spawn(async move { paddock.execute_with(msg).await });
                tokio::time::sleep(after).await;
                // Until it is registered (it may still be on its way to the supervisor).
                while !run.is_finished()
                    && !self.paddock.cancel(&paddock_pool::Caller::Embedder, &id)
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                run.await.unwrap_or_else(|e| {
                    Err(Error::new(
                        ErrorCode::EngineFailed,
                        format!("the caller's task failed: {e}"),
                    ))
                })
            }
            Drive::CancelOnOutput => {
                let mut stream = self.paddock.execute_stream(msg).await?;
                let mut cancelled = false;
                loop {
                    match stream.next().await {
                        Some(StreamEvent::Output(_)) => {
                            if !cancelled {
                                cancelled = true;
                                self.paddock.cancel(&paddock_pool::Caller::Embedder, &id);
                            }
                        }
                        Some(StreamEvent::Finished(r)) => return *r,
                        None => {
                            return Err(Error::new(
                                ErrorCode::StreamClosed,
                                "the stream ended without a result",
                            ))
                        }
                    }
                }
            }
        }
    }

    /// An execution in a session, tracked like any other.
    pub(super) async fn session_exec(
        &self,
        sandbox: &SandboxHandle,
        program: Program,
    ) -> Result<ExecResult, String> {
        let request = ExecRequest::new(program);
        let id = request.id.clone();
        self.ledger.issue(&id);
        let answer = tokio::time::timeout(ANSWER_LIMIT, sandbox.exec(request))
            .await
            .map_err(|_| format!("no answer for {id} within {ANSWER_LIMIT:?}"))?;
        self.ledger.answer(&id);
        let r = answer.map_err(|e| format!("exec refused: {e}"))?;
        if r.id != id {
            return Err(format!("the answer to {id} carries id {}", r.id));
        }
        Ok(r)
    }

    /// Opens a session on `engine`, uses it, destroys it, and checks that it is gone.
    pub(super) async fn session(
        self: &Arc<Self>,
        engine: EngineName,
        n: usize,
    ) -> Result<(), String> {
        let spec = SandboxSpec {
            level: level_of(&engine),
            ..SandboxSpec::default()
        };
        let sandbox = loop {
            match self
                .paddock
                .open_sandbox(spec.clone(), Some(engine.clone()))
                .await
            {
                Ok(s) => break s,
                Err(e) if retryable(&e) => {
                    self.counts.rejected.fetch_add(1, Ordering::Relaxed);
                    back_off(&e).await;
                }
                Err(e) => return Err(format!("open_sandbox refused: {e}")),
            }
        };
        let used = self.use_session(&sandbox, engine, n).await;
        let destroyed = sandbox.destroy().await;
        used?;
        destroyed.map_err(|e| format!("destroy failed: {e}"))?;
        sandbox
            .destroy()
            .await
            .map_err(|e| format!("a second destroy failed: {e}"))?;
        match sandbox.status().await {
            Ok(SandboxStatus::Destroyed) => {}
            other => return Err(format!("status after destroy: {other:?}")),
        }
        // Refused before it is admitted, so it is no execution: not tracked.
        match sandbox.exec(ExecRequest::new(sh("true"))).await {
            Err(e) if e.code == ErrorCode::EngineDisposed => Ok(()),
            other => Err(format!(
                "exec after destroy must be ENGINE_DISPOSED: {other:?}"
            )),
        }
    }

    pub(super) async fn use_session(
        &self,
        sandbox: &SandboxHandle,
        engine: EngineName,
        n: usize,
    ) -> Result<(), String> {
        let data = format!("soak-{n}");
        sandbox
            .write_file("in/soak.txt", data.as_bytes())
            .await
            .map_err(|e| format!("write_file: {e}"))?;
        let (reader, failing) = if engine == EngineName::ISOLATE {
            (
                Program::code(
                    Language::Javascript,
                    "import { readFile, writeFile } from 'sandbox:fs';\n\
                     console.log(readFile('in/soak.txt'));\n\
                     writeFile('out.txt', 'done\\n');",
                ),
                Program::code(Language::Javascript, "throw new Error('soak-session')"),
            )
        } else {
            (
                sh("cat in/soak.txt; echo done > out.txt"),
                sh("echo soak-session >&2; exit 3"),
            )
        };
        let r = self.session_exec(sandbox, reader).await?;
        if !(r.is_success() && r.stdout.trim_end() == data) {
            return Err(format!("reading the written file: {}", brief(&r)));
        }
        self.counts.count(Kind::Ok);
        let out = sandbox
            .read_file("out.txt")
            .await
            .map_err(|e| format!("read_file: {e}"))?;
        if out != b"done\n" {
            return Err(format!("out.txt holds {:?}", String::from_utf8_lossy(&out)));
        }
        let listed = sandbox
            .list_files("in")
            .await
            .map_err(|e| format!("list_files: {e}"))?;
        if !listed
            .iter()
            .any(|f| f.path.ends_with("/in/soak.txt") && f.size == data.len() as u64)
        {
            return Err(format!("list_files(\"in\") gave {listed:?}"));
        }
        let r = self.session_exec(sandbox, failing).await?;
        let code = if engine == EngineName::ISOLATE { 1 } else { 3 };
        if !(r.exit_code() == Some(code) && r.stderr.contains("soak-session")) {
            return Err(format!("a failing exec: {}", brief(&r)));
        }
        self.counts.count(Kind::FailedAsExpected);
        Ok(())
    }
}

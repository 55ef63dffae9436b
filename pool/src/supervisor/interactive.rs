//! Background processes, terminals and TCP streams of sessions.
//!
//! A process or terminal is checked by the policy like an execution (its command is a
//! `Program::Command`), gets an execution id, and is audited once, when it ends, with
//! its exit status. The session remembers it so that callers (the HTTP API's attach
//! endpoints) can find it by id; finished ones beyond [`KEEP_FINISHED`] are forgotten.

use std::collections::BTreeMap;
use std::rc::Rc;

use actix::prelude::*;
use paddock_core::{
    code_hash, unix_ms, Error, ErrorCode, ExecResult, ExecutionId, Outcome, Program,
};
use tracing::warn;

use super::{Session, Supervisor};
use crate::audit::{AuditEntry, Record};
use crate::messages::{
    Attachable, CheckProgram, GetProcess, ListProcesses, OpenTcpConnection, OpenTerminal,
    ProcessInfo, ProcessSelector, StartProcess, Started,
};
use crate::pipeline::Pipeline;

/// Finished processes a session keeps listing.
const KEEP_FINISHED: usize = 64;

/// A session's processes and terminals, by number.
#[derive(Debug, Default)]
pub(crate) struct Processes {
    entries: BTreeMap<u32, Started>,
    /// The last number given.
    last: u32,
    /// Places taken by processes being started.
    starting: usize,
}

impl Processes {
    /// A number and a place for a process about to start: `RATE_LIMITED` while
    /// `max` run (or are being started) in the session.
    fn reserve(&mut self, max: usize) -> Result<u32, Error> {
        let running = self
            .entries
            .values()
            .filter(|s| s.handle.shared().exit().is_none())
            .count();
        if running + self.starting >= max {
            return Err(Error::new(
                ErrorCode::RateLimited,
                format!(
                    "{max} processes and terminals run in this sandbox \
                     (pool.max_processes_per_sandbox); end one first"
                ),
            ));
        }
        let number = self.last.checked_add(1).ok_or_else(|| {
            Error::new(
                ErrorCode::RateLimited,
                "this sandbox has started as many processes as it may; open another",
            )
        })?;
        self.last = number;
        self.starting += 1;
        Ok(number)
    }

    /// Records a started process in its reserved place, and forgets the oldest
    /// finished ones beyond [`KEEP_FINISHED`].
    fn insert(&mut self, started: Started) {
        self.entries.insert(started.info.number, started);
        let finished: Vec<u32> = self
            .entries
            .iter()
            .filter(|(_, s)| s.handle.shared().exit().is_some())
            .map(|(k, _)| *k)
            .collect();
        if finished.len() > KEEP_FINISHED {
            for k in &finished[..finished.len() - KEEP_FINISHED] {
                self.entries.remove(k);
            }
        }
    }

    fn get(&self, which: &ProcessSelector) -> Option<Started> {
        let found = match which {
            ProcessSelector::Id(id) => self.entries.values().find(|s| &s.info.id == id),
            ProcessSelector::Number(n) => self.entries.get(n),
            ProcessSelector::Tag(tag) => self
                .entries
                .values()
                .rev()
                .find(|s| s.info.tag.as_deref() == Some(tag.as_str())),
        };
        found.map(refresh)
    }

    fn list(&self) -> Vec<ProcessInfo> {
        self.entries.values().map(|s| refresh(s).info).collect()
    }

    /// Whether a process or terminal is still running.
    pub(super) fn any_live(&self) -> bool {
        self.entries
            .values()
            .any(|s| s.handle.shared().exit().is_none())
    }
}

/// A place reserved in a session's process table: given back when dropped, whether
/// the start succeeded (its record then takes the place) or not.
struct Reserved {
    session: Rc<Session>,
    number: u32,
}

impl Reserved {
    fn take(session: &Rc<Session>, max: usize) -> Result<Reserved, Error> {
        let number = session.processes.borrow_mut().reserve(max)?;
        Ok(Reserved {
            session: session.clone(),
            number,
        })
    }

    /// Records the started process.
    fn fill(self, started: Started) {
        self.session.processes.borrow_mut().insert(started);
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let mut processes = self.session.processes.borrow_mut();
        processes.starting = processes.starting.saturating_sub(1);
    }
}

/// The record with the exit as it is now.
fn refresh(s: &Started) -> Started {
    let mut s = s.clone();
    s.info.exit = s.handle.shared().exit();
    s
}

impl Pipeline {
    /// Refuses a command the policy blocks, as for an execution.
    fn check_command(&self, argv: &[String]) -> Result<(), Error> {
        let program = Program::command(argv.iter().cloned());
        self.check_program(&program, "a background process")
            .map(|_| ())
    }

    /// Refuses a program the policy blocks, as for an execution (counted and measured
    /// the same); its warnings otherwise.
    fn check_program(&self, program: &Program, what: &str) -> Result<Vec<String>, Error> {
        self.policy.check(program).map_err(|r| {
            tracing::info!(rule = %r.rule, "policy refused {what}");
            self.telemetry.record_rule_block(&r.rule);
            self.shared
                .refused_total
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            r.error
        })
    }

    /// Bounds a new process's input by its tenant's budgets, before any caller can
    /// write to it.
    fn limit_input(&self, session: &Session, shared: &paddock_core::interactive::ProcessShared) {
        let memory = self.shares.borrow().memory.clone();
        memory.limit_input(shared, session.tenant.as_deref());
    }

    /// Records the process's one audit entry when it ends.
    fn audit_on_exit(self: Rc<Self>, session: &Session, started: &Started) {
        let handle = started.handle.clone();
        let id = started.info.execution_id.clone();
        let started_at_ms = started.info.started_at_ms;
        let tenant = session.tenant.clone();
        let engine = session.engine.clone();
        let instance = session.lease.instance().sandbox.id().to_string();
        let hash = code_hash(&Program::command(started.info.argv.iter().cloned()).audit_text());
        self.shared
            .accepted_total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        actix::spawn(async move {
            let exit = handle.shared().wait().await;
            let mut result = ExecResult::empty(
                id,
                Outcome::Completed {
                    exit_code: exit.exit_code,
                    signal: exit.signal,
                },
                engine,
                instance,
            );
            result.timings.queued_at_ms = started_at_ms;
            result.timings.started_at_ms = started_at_ms;
            result.timings.finished_at_ms = unix_ms();
            result.usage.wall_ms = result.timings.finished_at_ms.saturating_sub(started_at_ms);
            let entry = AuditEntry::from_result(&result, tenant.as_deref(), hash);
            if let Err(e) = self.audit.send(Record(entry)).await {
                warn!(error = %e, "the audit actor is gone; a background process's entry was lost");
            }
        });
    }
}

/// What was asked of a process, for its record.
struct Asked {
    kind: &'static str,
    argv: Vec<String>,
    tag: Option<String>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
}

fn started(asked: Asked, number: u32, handle: Attachable) -> Started {
    let shared = handle.shared().clone();
    Started {
        info: ProcessInfo {
            id: shared.id().to_string(),
            kind: asked.kind,
            execution_id: ExecutionId::new(),
            argv: asked.argv,
            pid: shared.pid(),
            started_at_ms: unix_ms(),
            exit: shared.exit(),
            number,
            tag: asked.tag,
            cwd: asked.cwd,
            env: asked.env,
        },
        handle,
    }
}

impl Handler<StartProcess> for Supervisor {
    type Result = ResponseFuture<Result<Started, Error>>;

    fn handle(&mut self, msg: StartProcess, _ctx: &mut Self::Context) -> Self::Result {
        // The place is taken here, in the actor's turn, so that concurrent starts
        // cannot pass the cap together.
        let max = self.pool_config.max_processes_per_sandbox;
        let reserved = self
            .session_for(&msg.caller, &msg.sandbox)
            .and_then(|session| Reserved::take(&session, max).map(|r| (session, r)));
        let (session, reserved) = match reserved {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let pipeline = self.pipeline.clone();
        Box::pin(async move {
            pipeline.check_command(&msg.spec.argv)?;
            let asked = Asked {
                kind: "process",
                argv: msg.spec.argv.clone(),
                tag: msg.spec.tag.clone(),
                cwd: msg.spec.cwd.clone(),
                env: msg.spec.env.clone(),
            };
            let spec = msg.spec;
            let handle = session
                .call("start_process", move |sb| {
                    Box::pin(async move { sb.start_process(spec).await })
                })
                .await?;
            pipeline.limit_input(&session, handle.shared());
            let s = started(asked, reserved.number, Attachable::Process(handle));
            pipeline.audit_on_exit(&session, &s);
            reserved.fill(s.clone());
            Ok(s)
        })
    }
}

impl Handler<CheckProgram> for Supervisor {
    type Result = Result<Vec<String>, Error>;

    fn handle(&mut self, msg: CheckProgram, _ctx: &mut Self::Context) -> Self::Result {
        self.session_for(&msg.caller, &msg.sandbox)?;
        self.pipeline
            .check_program(&msg.program, "a program of a session")
    }
}

impl Handler<OpenTerminal> for Supervisor {
    type Result = ResponseFuture<Result<Started, Error>>;

    fn handle(&mut self, msg: OpenTerminal, _ctx: &mut Self::Context) -> Self::Result {
        let max = self.pool_config.max_processes_per_sandbox;
        let reserved = self
            .session_for(&msg.caller, &msg.sandbox)
            .and_then(|session| Reserved::take(&session, max).map(|r| (session, r)));
        let (session, reserved) = match reserved {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let pipeline = self.pipeline.clone();
        Box::pin(async move {
            let asked = Asked {
                kind: "terminal",
                argv: msg.spec.argv(),
                tag: msg.spec.tag.clone(),
                cwd: msg.spec.cwd.clone(),
                env: msg.spec.env.clone(),
            };
            pipeline.check_command(&asked.argv)?;
            let spec = msg.spec;
            let handle = session
                .call("open_terminal", move |sb| {
                    Box::pin(async move { sb.open_terminal(spec).await })
                })
                .await?;
            pipeline.limit_input(&session, handle.shared());
            let s = started(asked, reserved.number, Attachable::Terminal(handle));
            pipeline.audit_on_exit(&session, &s);
            reserved.fill(s.clone());
            Ok(s)
        })
    }
}

impl Handler<OpenTcpConnection> for Supervisor {
    type Result = ResponseFuture<Result<paddock_core::TcpConnection, Error>>;

    fn handle(&mut self, msg: OpenTcpConnection, _ctx: &mut Self::Context) -> Self::Result {
        let session = match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let target = msg.target;
        let call = session.call("open_tcp_connection", move |sb| {
            Box::pin(async move { sb.open_tcp_connection(target).await })
        });
        Box::pin(async move {
            // Held until connected: the instance is not recycled meanwhile.
            let _held = session;
            call.await
        })
    }
}

impl Handler<GetProcess> for Supervisor {
    type Result = Result<Started, Error>;

    fn handle(&mut self, msg: GetProcess, _ctx: &mut Self::Context) -> Self::Result {
        let session = self.session_for(&msg.caller, &msg.sandbox)?;
        let found = session.processes.borrow().get(&msg.process);
        found.ok_or_else(|| {
            Error::new(
                ErrorCode::NotFound,
                format!(
                    "sandbox {} has no process or terminal {} (list them with GET /v1/sandboxes/{}/processes)",
                    msg.sandbox, msg.process, msg.sandbox
                ),
            )
        })
    }
}

impl Handler<ListProcesses> for Supervisor {
    type Result = Result<Vec<ProcessInfo>, Error>;

    fn handle(&mut self, msg: ListProcesses, _ctx: &mut Self::Context) -> Self::Result {
        let session = self.session_for(&msg.caller, &msg.sandbox)?;
        let list = session.processes.borrow().list();
        Ok(list)
    }
}

//! The mix: what each kind of work runs, on which engine, and what it must end as.

use super::*;

/// What an execution must end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// Completed with exit code 0, this stdout, nothing cut.
    Ok(&'static str),
    /// Completed with this exit code, stderr containing the text.
    Exit(i32, &'static str),
    /// Killed at its deadline.
    TimedOut,
    /// Cancelled while it ran.
    Cancelled,
    /// Completed with exit code 0, stdout cut at [`CAP`].
    Truncated,
}

/// How an execution is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Drive {
    /// `Paddock::execute_with`, awaited.
    Call,
    /// Started on its own task and cancelled by id (`Paddock::cancel`) after a pause.
    CancelById(Duration),
    /// `Paddock::execute_stream`, cancelled as soon as its first output arrives.
    CancelOnOutput,
}

/// One execution of the mix.
#[derive(Debug, Clone)]
pub(super) struct Exec {
    pub(super) engine: EngineName,
    pub(super) program: Program,
    pub(super) limits: Limits,
    pub(super) drive: Drive,
    pub(super) expect: Expect,
}

/// One kind of work in the mix.
#[derive(Debug, Clone)]
pub(super) enum Work {
    /// A pooled execution.
    Exec(Box<Exec>),
    /// A sandbox session on the next engine in turn.
    Session,
}

/// A named kind of work and its share of the mix.
#[derive(Debug, Clone)]
pub(super) struct Task {
    pub(super) name: &'static str,
    pub(super) weight: usize,
    pub(super) work: Work,
}

pub(super) fn sh(script: &str) -> Program {
    Program::command(["sh", "-c", script])
}

/// An execution on `engine` that must end as `expect`, adjusted by `with`.
pub(super) fn exec_with(
    engine: EngineName,
    program: Program,
    expect: Expect,
    with: impl FnOnce(&mut Exec),
) -> Work {
    let mut exec = Exec {
        engine,
        program,
        limits: Limits::default(),
        drive: Drive::Call,
        expect,
    };
    with(&mut exec);
    Work::Exec(Box::new(exec))
}

/// An execution on `engine` that must end as `expect`.
pub(super) fn exec(engine: EngineName, program: Program, expect: Expect) -> Work {
    exec_with(engine, program, expect, |_| {})
}

/// An execution killed at a deadline of `timeout_ms`.
pub(super) fn times_out(engine: EngineName, program: Program, timeout_ms: u64) -> Work {
    exec_with(engine, program, Expect::TimedOut, |e| {
        e.limits.timeout_ms = Some(timeout_ms);
    })
}

/// An execution cancelled mid-run (its own deadline 10 s away).
pub(super) fn cancelled(engine: EngineName, program: Program, drive: Drive) -> Work {
    exec_with(engine, program, Expect::Cancelled, |e| {
        e.limits.timeout_ms = Some(10_000);
        e.drive = drive;
    })
}

/// An execution whose output passes [`CAP`].
pub(super) fn floods(engine: EngineName, program: Program) -> Work {
    exec_with(engine, program, Expect::Truncated, |e| {
        e.limits.max_output_bytes = Some(CAP);
    })
}

/// The mix: every task the host can run, with its weight.
pub(super) fn mix(python: bool, container: bool) -> Vec<Task> {
    const SUBPROCESS: EngineName = EngineName::SUBPROCESS;
    const ISOLATE: EngineName = EngineName::ISOLATE;
    const CONTAINER: EngineName = EngineName::CONTAINER;
    use Expect::{Exit, Ok};
    let task = |name, weight, work| Task { name, weight, work };
    let js = |source: &str| Program::code(Language::Javascript, source);
    let py = |source: &str| Program::code(Language::Python, source);
    let sleep = || Program::command(["sleep", "5"]);
    let fail = || sh("echo soak-fail >&2; exit 1");
    let flood = || sh("yes 0123456789 | head -c 2000000");
    let js_flood = js("for (let i = 0; i < 20000; i++) console.log('0123456789'.repeat(10))");
    let js_throw = js("throw new Error('soak-boom')");
    let js_started = js("console.log('started'); while (true) {}");
    let py_flood = py("import sys\nsys.stdout.write('0123456789' * 200000)");
    let py_raise = py("raise ValueError('soak-raise')");
    let ctr_started = sh("echo started; exec sleep 5");
    let by_id = Drive::CancelById(Duration::from_millis(150));
    let on_output = Drive::CancelOnOutput;
    let mut tasks = vec![
        task("cmd_ok", 4, exec(SUBPROCESS, sh("echo 42"), Ok("42\n"))),
        task(
            "cmd_fail",
            1,
            exec(SUBPROCESS, fail(), Exit(1, "soak-fail")),
        ),
        task("cmd_timeout", 1, times_out(SUBPROCESS, sleep(), 250)),
        task("cmd_cancel", 1, cancelled(SUBPROCESS, sleep(), by_id)),
        task("cmd_flood", 1, floods(SUBPROCESS, flood())),
        task(
            "js_ok",
            4,
            exec(ISOLATE, js("console.log(6 * 7)"), Ok("42\n")),
        ),
        task("js_throw", 1, exec(ISOLATE, js_throw, Exit(1, "soak-boom"))),
        task(
            "js_timeout",
            1,
            times_out(ISOLATE, js("while (true) {}"), 200),
        ),
        task("js_cancel", 1, cancelled(ISOLATE, js_started, on_output)),
        task("js_flood", 1, floods(ISOLATE, js_flood)),
        task("session", 1, Work::Session),
    ];
    if python {
        tasks.extend([
            task("py_ok", 3, exec(SUBPROCESS, py("print(6 * 7)"), Ok("42\n"))),
            task(
                "py_raise",
                1,
                exec(SUBPROCESS, py_raise, Exit(1, "ValueError: soak-raise")),
            ),
            task(
                "py_timeout",
                1,
                times_out(SUBPROCESS, py("import time; time.sleep(5)"), 300),
            ),
            task("py_flood", 1, floods(SUBPROCESS, py_flood)),
        ]);
    }
    if container {
        tasks.extend([
            task("ctr_ok", 2, exec(CONTAINER, sh("echo 42"), Ok("42\n"))),
            task("ctr_fail", 1, exec(CONTAINER, fail(), Exit(1, "soak-fail"))),
            task("ctr_timeout", 1, times_out(CONTAINER, sleep(), 300)),
            task(
                "ctr_cancel",
                1,
                cancelled(CONTAINER, ctr_started, on_output),
            ),
            task("ctr_flood", 1, floods(CONTAINER, flood())),
        ]);
    }
    tasks
}

/// Task indices, each repeated by its weight, in a fixed shuffled order.
pub(super) fn schedule(tasks: &[Task]) -> Vec<usize> {
    let mut order: Vec<usize> = tasks
        .iter()
        .enumerate()
        .flat_map(|(i, t)| std::iter::repeat_n(i, t.weight))
        .collect();
    // Fisher–Yates with a fixed xorshift seed: the same order on every run.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

/// The isolation level that routes a request to `engine` without naming it.
pub(super) fn level_of(engine: &EngineName) -> IsolationLevel {
    if *engine == EngineName::ISOLATE {
        IsolationLevel::ContextIsolated
    } else if *engine == EngineName::CONTAINER {
        IsolationLevel::Strict
    } else {
        IsolationLevel::None
    }
}

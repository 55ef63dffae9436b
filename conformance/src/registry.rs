//! The table of cases, in the order they run.

use paddock_core::{Language, ProgramKind};

use crate::case::{Case, Requirement};

const COMMAND: &[Requirement] = &[Requirement::Program(ProgramKind::Command)];
const JS: Requirement = Requirement::Program(ProgramKind::Code(Language::Javascript));
const JS_ONLY: &[Requirement] = &[JS];
// The feature first: an engine without it skips saying so.
const PROCESS: &[Requirement] = &[
    Requirement::Feature(paddock_core::interactive::FEATURE_PROCESS),
    Requirement::Program(ProgramKind::Command),
];
const TERMINAL: &[Requirement] = &[
    Requirement::Feature(paddock_core::interactive::FEATURE_TERMINAL),
    Requirement::Program(ProgramKind::Command),
];
const TCP: &[Requirement] = &[
    Requirement::Feature(paddock_core::interactive::FEATURE_TCP),
    Requirement::Feature(paddock_core::interactive::FEATURE_PROCESS),
    Requirement::Program(ProgramKind::Command),
];
const FILEOPS: &[Requirement] = &[Requirement::Feature(paddock_core::engine::FEATURE_FILEOPS)];
const FILEOPS_COMMAND: &[Requirement] = &[
    Requirement::Feature(paddock_core::engine::FEATURE_FILEOPS),
    Requirement::Program(ProgramKind::Command),
];
/// The handler cases need `Invoke` and the conformance handler registered under
/// [`crate::HANDLER_NAME`], which engines that advertise `suspend` promise.
const HANDLER: &[Requirement] = &[
    Requirement::Program(ProgramKind::Invoke),
    Requirement::Program(ProgramKind::Resume),
    Requirement::Feature("suspend"),
];

macro_rules! entry {
    ($module:ident :: $name:ident, $requires:expr, $description:literal) => {
        Case {
            name: stringify!($name),
            description: $description,
            requires: $requires,
            body: |ctx| Box::pin(crate::cases::$module::$name(ctx)),
        }
    };
}

static CASES: &[Case] = &[
    entry!(exec::exec_exit_code, COMMAND,
        "the exit code comes back as `completed`, with the request id, engine kind and instance id"),
    entry!(exec::exec_reports_signal, COMMAND,
        "a program killed by a signal completes with exit code 128+N and the signal"),
    entry!(exec::exec_captures_output, COMMAND,
        "stdout and stderr are captured separately, stdin is delivered, and the sink sees the same bytes"),
    entry!(exec::exec_stdin_is_closed, COMMAND,
        "a program reading stdin without request stdin sees end-of-file at once"),
    entry!(exec::exec_streams_live, COMMAND,
        "output printed before a sleep reaches the sink before the program exits"),
    entry!(process::exec_reaps_background, COMMAND,
        "a background process left by an execution does not outlive it"),
    entry!(lifecycle::status_busy_while_running, COMMAND,
        "status is `busy` while an execution runs and `ready` before and after"),
    entry!(process::abort_kills_process_tree, COMMAND,
        "cancel kills the whole tree, including a TERM-trapping child and a background grandchild, and reports `cancelled`"),
    entry!(process::abort_is_never_success, COMMAND,
        "a cancel that wins the token race is never reported as a clean success, and a completion settles the token"),
    entry!(process::timeout_kills_process_tree, COMMAND,
        "the wall-clock deadline yields `timed_out` promptly and kills a TERM-trapping tree"),
    entry!(files::files_round_trip, &[],
        "UTF-8 and binary files round-trip, parents are created, overwrites truncate, missing files are NOT_FOUND"),
    entry!(files::files_list, COMMAND,
        "list_files gives absolute paths with sizes from the workdir root (``, `.`, `/`) and subdirectories; a missing directory lists empty"),
    entry!(files::files_under_root_dir, &[],
        "`${root_dir}/dir` and `dir` name the same directory: files written by either path list under `${root_dir}/dir` and read back by the listed path"),
    entry!(files::files_path_escape, COMMAND,
        "`..`, absolute paths outside the workdir and symlink escapes are refused with PATH_ESCAPE"),
    entry!(fileops::fileops_stat_list_make_move_remove, FILEOPS,
        "stat, list_dir with a depth, make_dir (true, then false), rename into new directories and remove (a tree, a file) answer as the contract says, with NOT_FOUND and INVALID_OPTIONS where it says"),
    entry!(fileops::fileops_refusals, FILEOPS,
        "`..` in any file operation's path is PATH_ESCAPE; a NUL is INVALID_OPTIONS"),
    entry!(fileops::fileops_watch_events, FILEOPS_COMMAND,
        "a recursive watch reports create, a program's write and chmod, rename (old name, then the new one in a new directory) and remove, and nothing while nothing changes"),
    entry!(files::cwd_path_escape, COMMAND,
        "an execution's cwd resolves beneath the workdir: a symlink out is PATH_ESCAPE, a missing directory NOT_FOUND"),
    entry!(files::files_shared_with_program, COMMAND,
        "a program reads files the caller wrote and the caller reads files the program wrote"),
    entry!(lifecycle::sandboxes_are_separate, COMMAND,
        "sandboxes of one engine, and of two engines, have their own ids and workdirs"),
    entry!(lifecycle::destroy_is_idempotent, &[],
        "destroy twice, and eight destroys at once, all succeed and leave the sandbox `destroyed`"),
    entry!(lifecycle::destroy_refuses_later_calls, &[],
        "after destroy every call is refused with ENGINE_DISPOSED and the workdir is gone"),
    entry!(lifecycle::destroy_kills_running_exec, COMMAND,
        "destroy during an execution ends it promptly and never as a clean success"),
    entry!(environment::env_is_sanitized, COMMAND,
        "secret-looking host variables are hidden, ordinary ones (only listed ones when strict) and request env are visible"),
    entry!(limits::output_is_capped, COMMAND,
        "`max_output_bytes` bounds stdout and stderr and sets the truncated flags"),
    entry!(refusals::refuses_unsupported_program, &[],
        "a program kind outside the capabilities is refused with CAPABILITY_NOT_SUPPORTED"),
    entry!(refusals::refuses_stronger_level, &[],
        "an isolation level above `max_level` is refused with LEVEL_NOT_SUPPORTED; weaker ones are met"),
    entry!(refusals::refuses_unenforceable_network, &[],
        "a network policy the engine cannot enforce is refused with CAPABILITY_NOT_SUPPORTED"),
    entry!(refusals::refuses_invalid_request, &[],
        "a malformed request is refused with INVALID_OPTIONS before anything runs"),
    entry!(javascript::js_exit_status, JS_ONLY,
        "a script that prints completes with exit code 0; an uncaught error completes with exit code 1 and is printed on stderr"),
    entry!(javascript::js_console_streams_live, JS_ONLY,
        "console output reaches the sink while the script still runs, stdout and stderr apart"),
    entry!(javascript::js_timeout_stops_busy_loop, JS_ONLY,
        "`while (true) {}` ends as timed_out shortly after its deadline, and the sandbox runs again"),
    entry!(javascript::js_cancel_stops_busy_loop, JS_ONLY,
        "cancel stops `while (true) {}` promptly and reports cancelled"),
    entry!(javascript::js_output_is_capped, JS_ONLY,
        "console output past `max_output_bytes` is cut and flagged truncated"),
    entry!(javascript::js_no_state_between_executions, JS_ONLY,
        "a global or prototype change made by one execution is invisible to the next"),
    entry!(javascript::js_status_busy_while_running, JS_ONLY,
        "status is `busy` while a script runs and `ready` before and after"),
    entry!(javascript::js_destroy_stops_running_script, JS_ONLY,
        "destroy during `while (true) {}` ends it promptly, never as a clean success, and leaves the sandbox `destroyed`"),
    entry!(javascript::js_values_round_trip, &[JS, Requirement::Feature("value")],
        "the script's completion value (a promise awaited) comes back as JSON; BigInt in string form, undefined as none"),
    entry!(javascript::js_invoke_calls_function, &[Requirement::Program(ProgramKind::Invoke), Requirement::Feature("js_invoke")],
        "an Invoke of a function expression with an array input spreads it into the arguments and returns the value"),
    entry!(javascript::js_heap_limit, &[JS, Requirement::Feature("js_heap_limit")],
        "a memory bomb ends as MEMORY_EXCEEDED even when the script catches the allocation failure, and the sandbox recovers"),
    entry!(javascript::js_blocked_modules, &[JS, Requirement::Feature("module_denylist")],
        "static and dynamic imports of denylisted modules (with or without `node:`) are refused with BLOCKED_MODULE"),
    entry!(javascript::js_sandbox_fs_shares_files, &[JS, Requirement::Feature("sandbox_fs")],
        "`sandbox:fs` reads what the caller wrote, writes what the caller reads, and refuses escapes with PATH_ESCAPE"),
    entry!(interactive::process_streams_and_exits, PROCESS,
        "a background process outlives the call, streams stdout and stderr apart, and reports its exit code"),
    entry!(interactive::process_stdin_round_trip, PROCESS,
        "a process reads what is written to its stdin and sees end-of-file on close; writes after close, or without stdin, are STREAM_CLOSED"),
    entry!(interactive::process_signal_and_kill, PROCESS,
        "a signal reaches the process (a TERM trap runs), kill ends it by SIGKILL, and a bad signal is INVALID_OPTIONS"),
    entry!(interactive::process_owned_by_sandbox, PROCESS,
        "destroy kills a background `sleep 30`, and its exit is known when destroy returns"),
    entry!(interactive::terminal_is_a_tty, TERMINAL,
        "a terminal is a real tty of the asked size, resizes, takes input, and reports the shell's exit code"),
    entry!(interactive::terminal_owned_by_sandbox, TERMINAL,
        "destroy kills a `sleep 30` terminal and a shell, and both `exited` have resolved before destroy returns"),
    entry!(interactive::tcp_reaches_guest_listener, TCP,
        "a TCP stream reaches a listener a background process started on the guest's loopback; a closed port is NOT_FOUND"),
    entry!(interactive::tcp_refuses_non_loopback, &[Requirement::Feature(paddock_core::interactive::FEATURE_TCP)],
        "a TCP stream to a host that is not the guest's loopback is refused with INVALID_OPTIONS (nothing is sent)"),
    entry!(interactive::interactive_refused_after_destroy, &[],
        "after destroy, start_process, open_terminal and open_tcp_connection are refused"),
    entry!(interactive::interactive_unsupported_is_refused, &[],
        "an interactive capability the engine does not advertise is refused with CAPABILITY_NOT_SUPPORTED, never accepted and ignored"),
    entry!(handlers::handler_suspend_and_resume, HANDLER,
        "a handler's `suspend` ends the execution as suspended with its token; resume continues it once, then NOT_FOUND"),
    entry!(handlers::handler_dies_mid_frame, HANDLER,
        "a handler that dies mid-frame fails the execution (WORKER_FAILED or PROTOCOL_ERROR) and the next invocation gets a working handler"),
];

/// Every case, in the order [`run_all`](crate::run_all) runs them.
pub fn cases() -> &'static [Case] {
    CASES
}

/// The case called `name`.
pub fn case(name: &str) -> Option<&'static Case> {
    CASES.iter().find(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macro_names_match_the_table() {
        let stamped: &[&str] = crate::__with_case_names!(__case_name_list {});
        let table: Vec<&str> = cases().iter().map(|c| c.name).collect();
        assert_eq!(stamped, table.as_slice());
        let mut unique = table.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), table.len(), "duplicate case names");
        assert!(case("abort_kills_process_tree").is_some());
        assert!(case("no_such_case").is_none());
    }

    #[test]
    fn can_run_checks_programs_and_features() {
        use paddock_core::{Capabilities, IsolationLevel, Language};
        let shell_only = Capabilities::new(
            IsolationLevel::None,
            &[ProgramKind::Code(Language::Shell)],
            &["none"],
            &[],
        );
        let c = case("exec_exit_code").unwrap();
        let reason = c.can_run(&shell_only).unwrap_err();
        assert!(reason.contains("command"), "{reason}");
        let commands = Capabilities::new(IsolationLevel::None, &[ProgramKind::Command], &[], &[]);
        assert!(c.can_run(&commands).is_ok());
        let needs_feature = Case {
            requires: &[Requirement::Feature("terminal")],
            ..*c
        };
        assert!(needs_feature.can_run(&commands).is_err());
    }
}

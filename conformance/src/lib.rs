//! # paddock-conformance
//!
//! The Paddock engine contract as a reusable test suite. Every engine runs the same
//! cases through nothing but the [`Engine`](paddock_core::Engine) and
//! [`Sandbox`](paddock_core::Sandbox) traits: exit codes and output capture, live
//! streaming, status, abort and timeout killing the whole process tree, the file
//! contract with path confinement, destroy semantics, environment sanitizing, the
//! output cap and the typed refusals.
//!
//! Each case returns a [`CaseResult`]: `Passed`, `Skipped(reason)` (the engine or host
//! cannot do what the case needs, see [`Case::can_run`]) or `Failed(message)`.
//! [`conformance_tests!`] stamps one `#[test]` per case for an engine; [`run_all`]
//! runs the whole suite programmatically, which is how the [`broken`] engines prove
//! that the suite catches real defects.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use paddock_core::Engine;
//! use paddock_engines::subprocess::{SubprocessConfig, SubprocessEngine};
//!
//! // One `#[test]` per case, in a module named `subprocess`.
//! paddock_conformance::conformance_tests!(subprocess, || async {
//!     Arc::new(SubprocessEngine::new(&SubprocessConfig::default()).unwrap()) as Arc<dyn Engine>
//! });
//!
//! // Or run every case and look at the results.
//! async fn whole_suite() {
//!     let results = paddock_conformance::run_all(|| async {
//!         Arc::new(SubprocessEngine::new(&SubprocessConfig::default()).unwrap())
//!             as Arc<dyn Engine>
//!     })
//!     .await;
//!     for (name, result) in results {
//!         println!("{name}: {result}");
//!     }
//! }
//! # fn main() {}
//! ```
//!
//! The factory is called once per case, before the case creates its sandboxes, so
//! every case starts from a fresh engine. A factory may also return
//! `Result<Arc<dyn Engine>, E>`: an `Err` means the engine cannot run on this host, and
//! every case is skipped with the error as the reason.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unused_must_use)]
#![forbid(unsafe_code)]

#[macro_use]
mod macros;

pub mod broken;
mod case;
mod cases;
mod context;
mod env;
mod factory;
mod handler;
mod registry;
mod suite;

pub use case::{Case, CaseResult, Requirement};
pub use env::{prepare_process_env, HOST_ENV, LISTED_HOST_VAR};
pub use factory::{BoxFuture, EngineFactory, IntoEngine};
pub use handler::{handler_command, HANDLER_NAME, HANDLER_SCRIPT};
pub use registry::{case, cases};
pub use suite::{run_all, run_case};

#[doc(hidden)]
pub use suite::run_stamped as __run_stamped;

/// Stamps one `#[test]` per conformance case for an engine.
///
/// `conformance_tests!(name, factory)` expands to `mod name { … }` with one test per
/// case, named after the case. `factory` is an expression evaluating to an
/// [`EngineFactory`], typically `|| async { Arc::new(MyEngine::new()) as Arc<dyn
/// Engine> }`; it is evaluated inside the generated module, which glob-imports its
/// parent, so names imported next to the macro call resolve.
///
/// Each generated test calls [`prepare_process_env`] first, then runs its case on a
/// fresh multi-thread tokio runtime: `Failed` panics with the case's message,
/// `Skipped` prints the reason and passes.
///
/// `conformance_tests!(name, factory, requires = check)` stamps the same tests for an
/// engine that needs something the host may lack (an OCI runtime, say): `check` is a
/// `fn() -> Result<(), String>`, and each test first calls it and, on `Err(why)`,
/// prints that it skipped and why, and passes.
#[macro_export]
macro_rules! conformance_tests {
    ($engine:ident, $factory:expr $(,)?) => {
        mod $engine {
            #[allow(unused_imports)]
            use super::*;

            $crate::__with_case_names!(__stamp_tests { $factory });
        }
    };
    ($engine:ident, $factory:expr, requires = $requires:expr $(,)?) => {
        mod $engine {
            #[allow(unused_imports)]
            use super::*;

            $crate::__with_case_names!(__stamp_tests_requiring {
                $factory,
                $requires
            });
        }
    };
}

/// Calls `$crate::$callback!{ $args ; name, name, … }` with the name of every case,
/// in the order of [`cases`]. The one list of case names the macros use.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_case_names {
    ($callback:ident { $($args:tt)* }) => {
        $crate::$callback! { $($args)* ;
            exec_exit_code,
            exec_reports_signal,
            exec_captures_output,
            exec_stdin_is_closed,
            exec_streams_live,
            exec_reaps_background,
            status_busy_while_running,
            abort_kills_process_tree,
            abort_is_never_success,
            timeout_kills_process_tree,
            files_round_trip,
            files_list,
            files_under_root_dir,
            files_path_escape,
            fileops_stat_list_make_move_remove,
            fileops_refusals,
            fileops_watch_events,
            cwd_path_escape,
            files_shared_with_program,
            sandboxes_are_separate,
            destroy_is_idempotent,
            destroy_refuses_later_calls,
            destroy_kills_running_exec,
            env_is_sanitized,
            output_is_capped,
            refuses_unsupported_program,
            refuses_stronger_level,
            refuses_unenforceable_network,
            refuses_invalid_request,
            js_exit_status,
            js_console_streams_live,
            js_timeout_stops_busy_loop,
            js_cancel_stops_busy_loop,
            js_output_is_capped,
            js_no_state_between_executions,
            js_status_busy_while_running,
            js_destroy_stops_running_script,
            js_values_round_trip,
            js_invoke_calls_function,
            js_heap_limit,
            js_blocked_modules,
            js_sandbox_fs_shares_files,
            process_streams_and_exits,
            process_stdin_round_trip,
            process_signal_and_kill,
            process_owned_by_sandbox,
            terminal_is_a_tty,
            terminal_owned_by_sandbox,
            tcp_reaches_guest_listener,
            tcp_refuses_non_loopback,
            interactive_refused_after_destroy,
            interactive_unsupported_is_refused,
            handler_suspend_and_resume,
            handler_dies_mid_frame,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __stamp_tests {
    ($factory:expr ; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::prepare_process_env();
                $crate::__run_stamped(stringify!($name), $factory);
            }
        )*
    };
}

/// [`__stamp_tests`] with a host check first (see [`conformance_tests!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __stamp_tests_requiring {
    ($factory:expr, $requires:expr ; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let check: fn() -> ::std::result::Result<(), ::std::string::String> = $requires;
                if let Err(why) = check() {
                    println!("conformance case `{}` skipped: {why}", stringify!($name));
                    return;
                }
                $crate::prepare_process_env();
                $crate::__run_stamped(stringify!($name), $factory);
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __case_name_list {
    (; $($name:ident),* $(,)?) => {
        &[$(stringify!($name)),*]
    };
}

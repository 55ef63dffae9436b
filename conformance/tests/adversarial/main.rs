//! The adversarial and fault-injection suite: hostile programs, broken handlers and
//! abusive callers, run against every engine through the whole scheduler
//! (policy → limiter → pool → engine → streamer → audit).
//!
//! Each case runs once per [`Target`]: the subprocess engine with cold commands, the
//! subprocess engine's warm Python workers, the QuickJS isolate engine, and the
//! container engine with warm and with cold containers. Every run gets a fresh
//! `Paddock` whose engines keep their workdirs in a directory of the run's own, and
//! the harness checks after the case, whatever the case itself asserted:
//!
//! - no process the case started survives (what a hostile program leaves behind
//!   carries the run's token in its command line; cases also check right after the
//!   execution that ended it);
//! - every pool is back at a healthy size: nothing busy, queued or creating, not
//!   degraded, between `min_idle` and `max_size`, no sandbox session open;
//! - the audit log holds exactly one entry per accepted execution;
//! - after shutdown: no process descending from this one or in the engines' cgroups
//!   (this catches survivors without the token, such as a warm worker's forks), no
//!   workdir, no cgroup and no mount is left, and the open descriptors of this
//!   process are back at their baseline.
//!
//! A case an engine cannot defend against is reported as skipped with the reason (the
//! same limits are listed in `docs/security.md`). The cases run one at a time: the
//! process and descriptor counts are of this whole test process.

/// Fails the case with a formatted message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::harness::Stop::Fail(format!($($fmt)+)));
        }
    };
}

/// Fails the case with a formatted message.
macro_rules! fail {
    ($($fmt:tt)+) => {
        return Err($crate::harness::Stop::Fail(format!($($fmt)+)))
    };
}

/// Skips the case with a formatted reason.
macro_rules! skip {
    ($($fmt:tt)+) => {
        return Err($crate::harness::Stop::Skip(format!($($fmt)+)))
    };
}

mod escape;
mod exhaustion;
mod handlers;
mod harness;
mod matrix;
mod outside;
mod scheduling;

/// Stamps `mod case { #[test] fn target() … }` for every case and target.
macro_rules! adversarial {
    ($($module:ident :: $case:ident),* $(,)?) => {
        $(
            mod $case {
                adversarial!(@targets $module :: $case;
                    subprocess => Subprocess,
                    warm_python => WarmPython,
                    isolate => Isolate,
                    container => Container,
                    container_cold => ContainerCold);
            }
        )*
    };
    (@targets $module:ident :: $case:ident; $($test:ident => $target:ident),*) => {
        $(
            #[test]
            fn $test() {
                crate::harness::run(
                    crate::harness::Target::$target,
                    stringify!($case),
                    |h| Box::pin(crate::$module::$case(h)),
                );
            }
        )*
    };
}

adversarial! {
    exhaustion::fork_bomb,
    exhaustion::memory_bomb,
    exhaustion::cpu_spin,
    exhaustion::output_flood,
    exhaustion::huge_file,
    exhaustion::many_files,
    exhaustion::disk_quota,
    exhaustion::file_count_cap,
    exhaustion::more_than_the_sandbox,
    escape::term_trapping_tree,
    escape::setsid_daemon,
    escape::background_children,
    outside::writes_outside_workdir,
    outside::symlink_escape,
    outside::secrets_in_environment,
    outside::network_under_none,
    outside::network_under_allowlist,
    outside::allowlist_naming_the_host,
    handlers::malformed_frames,
    handlers::handler_never_answers,
    handlers::handler_crashes_mid_frame,
    scheduling::slow_subscriber,
    scheduling::cancel_at_every_stage,
    scheduling::destroy_during_exec,
    scheduling::ten_thousand_queued,
    scheduling::engine_creation_fails,
    matrix::limits_matrix,
}

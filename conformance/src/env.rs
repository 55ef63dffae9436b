//! The host environment the suite plants before engines snapshot it.

use std::sync::Once;

/// The variables [`prepare_process_env`] sets in the host process.
///
/// `SECRET_X` and `API_KEY` look secret and must not reach programs;
/// `PADDOCK_CONFORMANCE_PLAIN` is an ordinary variable and must.
pub const HOST_ENV: &[(&str, &str)] = &[
    ("SECRET_X", "conformance-secret"),
    ("API_KEY", "conformance-key"),
    ("PADDOCK_CONFORMANCE_PLAIN", "visible"),
];

static PREPARE: Once = Once::new();

/// Sets [`HOST_ENV`] in the host process, once.
///
/// Engines snapshot the host environment when they are created, and setting
/// variables while other threads read the environment is racy, so call this before
/// the first engine of the process is created. [`conformance_tests!`](crate::conformance_tests)
/// calls it at the start of every generated test, and [`run_all`](crate::run_all) /
/// [`run_case`](crate::run_case) call it too.
pub fn prepare_process_env() {
    PREPARE.call_once(|| {
        for (name, value) in HOST_ENV {
            std::env::set_var(name, value);
        }
    });
}

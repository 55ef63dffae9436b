//! JavaScript peers of the `isolate` scenario, measured by node itself: node's
//! `vm.runInNewContext` per operation inside one warm node process, and a fresh
//! `isolated-vm` isolate per operation (create, context, eval, dispose).
//!
//! The peer script (`isolate_peers.js`) is embedded in the binary, written to a
//! temporary directory for each run and removed afterwards. `isolated-vm` is installed
//! with npm into the temporary directory once per isolated-vm and node version and
//! reused by later runs; it builds a native addon with node-gyp when no prebuilt
//! binary can be downloaded, which takes about a minute.
//! Setting `PADDOCK_ISOLATED_VM_NODE_MODULES` to a `node_modules` directory that
//! already holds `isolated-vm` skips the install.
//!
//! Every function here blocks the calling thread for the whole run.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

/// The peer script, run as `node isolate_peers.js <mode> <iterations> <scenario> [dir]`.
const SCRIPT: &str = include_str!("isolate_peers.js");

/// The `isolated-vm` release installed: 5.x supports node 18 and 20; 6.x needs
/// node 22 or later.
const ISOLATED_VM_VERSION: &str = "5.0.4";

/// A `node_modules` directory holding `isolated-vm`, used instead of installing it.
const MODULES_ENV: &str = "PADDOCK_ISOLATED_VM_NODE_MODULES";

/// Name prefix of the `isolated-vm` install directories.
const INSTALL_PREFIX: &str = "paddock-isolated-vm-";

/// Upper bound for `npm install`, native build included.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(900);

/// The scenarios the peer script knows.
const SCENARIOS: &[&str] = &["one_plus_one", "loop"];

/// The outcome of one peer run.
#[derive(Debug, Clone)]
pub(super) struct PeerStats {
    /// Median latency of one operation, in microseconds.
    pub(super) p50_us: f64,
    /// 99th-percentile latency of one operation, in microseconds.
    pub(super) p99_us: f64,
    /// The peer's JSON report, plus `node_path` (the node binary that ran it).
    pub(super) detail: Value,
}

/// `vm.runInNewContext` per operation inside one warm node process.
///
/// `scenario` is `one_plus_one` or `loop`. Fails with a message saying what to fix
/// when node is missing or the run fails.
pub(super) fn node_vm(scenario: &str, iterations: usize) -> Result<PeerStats, String> {
    run_peer("vm", scenario, iterations, None)
}

/// A fresh `isolated-vm` isolate (32 MiB memory limit) per operation: create, context,
/// eval, dispose.
///
/// The first call in a process installs `isolated-vm` with npm (see the module
/// documentation); a failed install is remembered and reported by every later call.
pub(super) fn isolated_vm(scenario: &str, iterations: usize) -> Result<PeerStats, String> {
    check_args(scenario, iterations)?;
    let modules = isolated_vm_modules()?;
    run_peer("ivm", scenario, iterations, Some(&modules))
}

/// Rejects what the peer script would reject, before anything is started.
fn check_args(scenario: &str, iterations: usize) -> Result<(), String> {
    if !SCENARIOS.contains(&scenario) {
        return Err(format!(
            "unknown isolate peer scenario `{scenario}`; use one of {SCENARIOS:?}"
        ));
    }
    if iterations == 0 {
        return Err("the isolate peers need at least one iteration".to_owned());
    }
    Ok(())
}

/// Runs the peer script once and parses its report.
fn run_peer(
    mode: &str,
    scenario: &str,
    iterations: usize,
    modules: Option<&Path>,
) -> Result<PeerStats, String> {
    check_args(scenario, iterations)?;
    let node = which("node").ok_or_else(|| {
        "node is not on PATH; install Node.js 18 or 20 to benchmark the JavaScript peers".to_owned()
    })?;
    let scratch = ScratchDir::new("paddock-isolate-peers-")?;
    let script = scratch.path().join("isolate_peers.js");
    std::fs::write(&script, SCRIPT)
        .map_err(|e| format!("cannot write the peer script to {}: {e}", script.display()))?;

    let mut cmd = Command::new(&node);
    // isolated-vm needs node's own startup snapshot off on node 20 and later.
    let flags: &[&str] = if modules.is_some() {
        &["--no-node-snapshot"]
    } else {
        &[]
    };
    cmd.args(flags)
        .arg(&script)
        .arg(mode)
        .arg(iterations.to_string())
        .arg(scenario)
        .current_dir(scratch.path());
    if let Some(dir) = modules {
        cmd.arg(dir);
    }
    // A hang guard only: the script takes a few milliseconds per operation at most.
    let timeout = Duration::from_secs(60)
        + Duration::from_millis(20).saturating_mul(u32::try_from(iterations).unwrap_or(u32::MAX));
    let what = format!("the node `{mode}` peer ({scenario}, {iterations} iterations)");
    let out = run(&mut cmd, timeout, &what)?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            tail(&out.stderr, 2000)
        ));
    }
    let line = out
        .stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| {
            format!(
                "{what} printed no report; stderr: {}",
                tail(&out.stderr, 2000)
            )
        })?;
    let mut detail: Value = serde_json::from_str(line)
        .map_err(|e| format!("{what} printed an unreadable report ({e}): {line}"))?;
    let number = |key: &str| {
        detail
            .get(key)
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("{what} reported no valid `{key}`: {line}"))
    };
    let (p50_us, p99_us) = (number("p50_us")?, number("p99_us")?);
    let fields = detail
        .as_object_mut()
        .ok_or_else(|| format!("{what} printed a report that is not an object: {line}"))?;
    fields.insert("node_path".to_owned(), node.display().to_string().into());
    fields.insert("node_flags".to_owned(), flags.into());
    if let Some(dir) = modules {
        fields.insert(
            "ivm_node_modules".to_owned(),
            dir.display().to_string().into(),
        );
    }
    Ok(PeerStats {
        p50_us,
        p99_us,
        detail,
    })
}

/// The `node_modules` directory holding `isolated-vm`, installed on first use.
fn isolated_vm_modules() -> Result<PathBuf, String> {
    static MODULES: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    MODULES.get_or_init(locate_or_install).clone()
}

/// `$PADDOCK_ISOLATED_VM_NODE_MODULES` when set, else a fresh npm install.
fn locate_or_install() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(MODULES_ENV).filter(|v| !v.is_empty()) {
        let dir = absolute(PathBuf::from(dir));
        if dir.join("isolated-vm").join("package.json").is_file() {
            return Ok(dir);
        }
        return Err(format!(
            "${MODULES_ENV} is {}, which holds no isolated-vm/package.json; point it at a \
             node_modules directory with isolated-vm@{ISOLATED_VM_VERSION} in it, or unset it \
             to have npm install it",
            dir.display()
        ));
    }
    let need = |tool: &str| {
        which(tool).ok_or_else(|| {
            format!(
                "{tool} is not on PATH; install Node.js 18 or 20 with npm to benchmark against \
                 isolated-vm, or set ${MODULES_ENV} to a node_modules directory holding \
                 isolated-vm@{ISOLATED_VM_VERSION}"
            )
        })
    };
    // npm is a node script, and the install runs node-gyp with node.
    let node = need("node")?;
    let npm = need("npm")?;
    // Installed once per isolated-vm version and node version into the temporary
    // directory, and reused by later runs: the native build takes most of a minute.
    let stable = std::env::temp_dir().join(format!(
        "{INSTALL_PREFIX}{ISOLATED_VM_VERSION}-node-{}",
        node_version(&node)?
    ));
    let modules = stable.join("node_modules");
    if addon_path(&modules).is_file() {
        return Ok(modules);
    }
    let dir = unique_dir(INSTALL_PREFIX)?;
    let result = npm_install(&npm, &dir);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&dir);
        return result;
    }
    // Another run may have finished first: keep whichever landed.
    let _ = std::fs::remove_dir_all(&stable);
    if std::fs::rename(&dir, &stable).is_err() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if addon_path(&modules).is_file() {
        Ok(modules)
    } else {
        Err(format!(
            "isolated-vm was built but {} is missing afterwards",
            addon_path(&modules).display()
        ))
    }
}

/// The native addon inside a `node_modules` directory.
fn addon_path(modules: &Path) -> PathBuf {
    modules
        .join("isolated-vm")
        .join("out")
        .join("isolated_vm.node")
}

/// `node --version`, trimmed (`v20.20.2`).
fn node_version(node: &Path) -> Result<String, String> {
    let out = run(
        Command::new(node).arg("--version"),
        Duration::from_secs(30),
        "`node --version`",
    )?;
    let v = out.stdout.trim().to_string();
    if !out.status.success() || v.is_empty() || v.contains('/') {
        return Err(format!("`node --version` gave {:?}", v));
    }
    Ok(v)
}

/// `npm install isolated-vm@ISOLATED_VM_VERSION` into `dir`; returns its `node_modules`.
fn npm_install(npm: &Path, dir: &Path) -> Result<PathBuf, String> {
    let package = format!("isolated-vm@{ISOLATED_VM_VERSION}");
    let mut cmd = Command::new(npm);
    cmd.args(["install", "--no-audit", "--no-fund", "--prefix"])
        .arg(dir)
        .arg(&package)
        .env("npm_config_update_notifier", "false")
        .current_dir(dir);
    let what = format!("`npm install {package}` into {}", dir.display());
    let out = run(&mut cmd, INSTALL_TIMEOUT, &what)?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}); it needs the npm registry, and g++, make and python3 to \
             build the native addon when no prebuilt one downloads: {}",
            out.status,
            tail(&format!("{}{}", out.stdout, out.stderr), 3000)
        ));
    }
    let modules = dir.join("node_modules");
    let addon = addon_path(&modules);
    if !addon.is_file() {
        return Err(format!(
            "{what} succeeded but built no native addon ({} is missing); npm probably skipped \
             install scripts (check npm's ignore-scripts setting and `npm install-scripts ls`): {}",
            addon.display(),
            tail(&format!("{}{}", out.stdout, out.stderr), 2000)
        ));
    }
    Ok(modules)
}

/// The first executable `name` on `PATH`, as an absolute path.
fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| absolute(dir).join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `path` made absolute against the current directory (when that is known).
fn absolute(path: PathBuf) -> PathBuf {
    if path.is_absolute() {
        return path;
    }
    match std::env::current_dir() {
        Ok(cwd) => cwd.join(path),
        Err(_) => path,
    }
}

/// A new, empty directory in the temporary directory, named `<prefix><pid>-<unique>`.
fn unique_dir(prefix: &str) -> Result<PathBuf, String> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut name = OsString::from(prefix);
    name.push(format!("{}-{nanos}-{n}", std::process::id()));
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir(&dir).map_err(|e| {
        format!(
            "cannot create the temporary directory {}: {e}; check TMPDIR",
            dir.display()
        )
    })?;
    Ok(dir)
}

/// A temporary directory removed with everything in it when dropped.
#[derive(Debug)]
struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates a fresh directory (see [`unique_dir`]).
    fn new(prefix: &str) -> Result<Self, String> {
        unique_dir(prefix).map(Self)
    }

    /// The directory.
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a finished child process printed.
#[derive(Debug)]
struct Output {
    /// How it ended.
    status: ExitStatus,
    /// Its standard output, lossily decoded.
    stdout: String,
    /// Its standard error, lossily decoded.
    stderr: String,
}

/// Runs `cmd` to completion with its output captured, killing it after `timeout`.
///
/// `what` names the command in errors.
fn run(cmd: &mut Command, timeout: Duration, what: &str) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {what}: {e}"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                // The readers are left to finish on their own: grandchildren that
                // outlive the kill may hold the pipes open.
                return Err(format!(
                    "{what} did not finish within {} s and was killed",
                    timeout.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("cannot wait for {what}: {e}"));
            }
        }
    };
    let join = |h: std::thread::JoinHandle<String>| h.join().unwrap_or_default();
    Ok(Output {
        status,
        stdout: join(stdout),
        stderr: join(stderr),
    })
}

/// Reads `pipe` to its end on a thread of its own.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// The last `max` bytes of `text` (at a character boundary), trimmed.
fn tail(text: &str, max: usize) -> &str {
    let text = text.trim();
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_vm_one_plus_one() {
        if which("node").is_none() {
            eprintln!("skipping node_vm_one_plus_one: node is not on PATH");
            return;
        }
        let stats = node_vm("one_plus_one", 50).expect("the node vm peer runs");
        assert!(stats.p50_us > 0.0, "{:?}", stats.detail);
        assert!(stats.p99_us >= stats.p50_us, "{:?}", stats.detail);
        assert_eq!(stats.detail["mode"], "vm");
        assert_eq!(stats.detail["scenario"], "one_plus_one");
        assert_eq!(stats.detail["iterations"], 50);
        let node_path = stats.detail["node_path"].as_str().unwrap_or_default();
        assert!(Path::new(node_path).is_absolute(), "{:?}", stats.detail);
    }

    #[test]
    fn bad_arguments_are_refused_before_running() {
        assert!(node_vm("two_plus_two", 10)
            .err()
            .is_some_and(|e| e.contains("unknown isolate peer scenario")));
        assert!(isolated_vm("loop", 0).is_err());
    }

    #[test]
    fn tail_keeps_the_end_at_a_char_boundary() {
        assert_eq!(tail("  abc  ", 10), "abc");
        assert_eq!(tail("abcdef", 3), "def");
        assert_eq!(tail("aé", 1), "");
    }
}

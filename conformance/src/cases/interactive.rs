//! Background processes, terminals and TCP streams into the guest.

use std::time::Duration;

use paddock_core::interactive::{FEATURE_PROCESS, FEATURE_TCP, FEATURE_TERMINAL};
use paddock_core::{
    ErrorCode, OutputReader, ProcessSpec, StreamKind, TcpTarget, TerminalSize, TerminalSpec,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::case::{expect_code, Check, OrFail, Stop};
use crate::context::Ctx;

/// How long a case waits for output it expects.
const PATIENCE: Duration = Duration::from_secs(15);

/// Everything read so far, by stream.
#[derive(Default)]
struct Seen {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Seen {
    fn get(&self, stream: StreamKind) -> &[u8] {
        match stream {
            StreamKind::Stdout => &self.stdout,
            StreamKind::Stderr => &self.stderr,
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// Reads until `stream` contains `needle` (or, with an empty needle, until the output
/// ends); fails after [`PATIENCE`].
async fn read_until(
    reader: &mut OutputReader,
    seen: &mut Seen,
    stream: StreamKind,
    needle: &str,
    what: &str,
) -> Check {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if !needle.is_empty() && contains(seen.get(stream), needle.as_bytes()) {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, reader.next()).await {
            Ok(Some(chunk)) => match chunk.stream {
                StreamKind::Stdout => seen.stdout.extend_from_slice(&chunk.data),
                StreamKind::Stderr => seen.stderr.extend_from_slice(&chunk.data),
            },
            Ok(None) if needle.is_empty() => return Ok(()),
            Ok(None) => fail!(
                "{what}: the output ended without {needle:?} on {stream:?}; stdout {:?}, stderr {:?}",
                String::from_utf8_lossy(&seen.stdout),
                String::from_utf8_lossy(&seen.stderr)
            ),
            Err(_) => fail!(
                "{what}: no {needle:?} on {stream:?} within {PATIENCE:?}; stdout {:?}, stderr {:?}",
                String::from_utf8_lossy(&seen.stdout),
                String::from_utf8_lossy(&seen.stderr)
            ),
        }
    }
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> Result<T, Stop> {
    tokio::time::timeout(PATIENCE, f)
        .await
        .map_err(|_| Stop::Fail(format!("{what} did not happen within {PATIENCE:?}")))
}

pub(crate) async fn process_streams_and_exits(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let p = sandbox
        .start_process(ProcessSpec::new([
            "sh",
            "-c",
            "echo to-stdout; echo to-stderr >&2; sleep 0.2; echo later; exit 3",
        ]))
        .await
        .or_fail("start_process of a short script")?;
    let mut reader = p.output();
    let mut seen = Seen::default();
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "to-stdout",
        "stdout",
    )
    .await?;
    ensure!(
        p.try_wait().is_none(),
        "the process must still run while it sleeps; it reported {:?}",
        p.try_wait()
    );
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "",
        "the rest of the output",
    )
    .await?;
    let exit = within("the process's exit", p.wait()).await?;
    ensure!(
        exit.exit_code == 3 && exit.signal.is_none(),
        "`exit 3` must report exit code 3; got {exit:?}"
    );
    ensure!(
        seen.stdout == b"to-stdout\nlater\n" && seen.stderr == b"to-stderr\n",
        "stdout and stderr must come apart and whole; got stdout {:?}, stderr {:?}",
        String::from_utf8_lossy(&seen.stdout),
        String::from_utf8_lossy(&seen.stderr)
    );
    // The call returned at once; the sandbox still runs executions meanwhile.
    ensure!(
        sandbox.status() != paddock_core::SandboxStatus::Destroyed,
        "the sandbox must stay live"
    );
    Ok(())
}

pub(crate) async fn process_stdin_round_trip(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let cat = sandbox
        .start_process(ProcessSpec::new(["cat"]).with_stdin())
        .await
        .or_fail("start_process of `cat` with stdin")?;
    let mut reader = cat.output();
    let mut seen = Seen::default();
    cat.write_stdin(b"first line\n")
        .await
        .or_fail("write_stdin")?;
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "first line\n",
        "cat's echo",
    )
    .await?;
    cat.write_stdin(b"second").await.or_fail("write_stdin")?;
    cat.close_stdin().await.or_fail("close_stdin")?;
    let exit = within("cat's exit after close_stdin", cat.wait()).await?;
    ensure!(
        exit.exit_code == 0,
        "cat must exit 0 at end of input; got {exit:?}"
    );
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "",
        "cat's output",
    )
    .await?;
    ensure!(
        seen.stdout == b"first line\nsecond",
        "cat must echo what was written; got {:?}",
        String::from_utf8_lossy(&seen.stdout)
    );
    expect_code(
        cat.write_stdin(b"late").await,
        ErrorCode::StreamClosed,
        "write_stdin after close_stdin",
    )?;
    let no_stdin = sandbox
        .start_process(ProcessSpec::new(["sleep", "5"]))
        .await
        .or_fail("start_process of `sleep 5`")?;
    expect_code(
        no_stdin.write_stdin(b"x").await,
        ErrorCode::StreamClosed,
        "write_stdin to a process started without stdin",
    )?;
    no_stdin.kill().or_fail("kill")?;
    within("the killed process's exit", no_stdin.wait()).await?;
    Ok(())
}

pub(crate) async fn process_signal_and_kill(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let trapper = sandbox
        .start_process(ProcessSpec::new([
            "sh",
            "-c",
            "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done",
        ]))
        .await
        .or_fail("start_process of a TERM-trapping script")?;
    let mut reader = trapper.output();
    let mut seen = Seen::default();
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "ready",
        "the script's start",
    )
    .await?;
    trapper.signal(15).or_fail("signal(TERM)")?;
    let exit = within("the exit after TERM", trapper.wait()).await?;
    ensure!(
        exit.exit_code == 7,
        "the trap must run and exit 7; got {exit:?}"
    );
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "got-term",
        "the trap's output",
    )
    .await?;

    let sleeper = sandbox
        .start_process(ProcessSpec::new(["sleep", "30"]))
        .await
        .or_fail("start_process of `sleep 30`")?;
    sleeper.kill().or_fail("kill")?;
    let exit = within("the exit after kill", sleeper.wait()).await?;
    ensure!(
        exit.signal == Some(9) && exit.exit_code == 137,
        "kill must end it by SIGKILL (exit code 137); got {exit:?}"
    );
    expect_code(
        sleeper.signal(0).map(|_| ()),
        ErrorCode::InvalidOptions,
        "signal 0",
    )?;
    Ok(())
}

pub(crate) async fn process_owned_by_sandbox(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let sleeper = sandbox
        .start_process(ProcessSpec::new(["sleep", "30"]))
        .await
        .or_fail("start_process of `sleep 30`")?;
    let started = std::time::Instant::now();
    within("destroy", sandbox.destroy())
        .await?
        .or_fail("destroy")?;
    // No await between destroy and the check: destroy itself waited for the exit.
    let exit = sleeper.try_wait();
    ensure!(
        exit.is_some(),
        "when destroy returns, a background `sleep 30` must have exited; its exit is still unknown"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(10),
        "destroy must kill `sleep 30`, not wait for it ({:?})",
        started.elapsed()
    );
    Ok(())
}

pub(crate) async fn terminal_is_a_tty(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let term = sandbox
        .open_terminal(TerminalSpec {
            size: TerminalSize { rows: 30, cols: 90 },
            ..TerminalSpec::new("sh", Vec::<String>::new())
        })
        .await
        .or_fail("open_terminal of `sh`")?;
    let mut reader = term.output();
    let mut seen = Seen::default();
    // The shell's own echo shows the typed line; the markers are built so that only
    // the command's output matches.
    term.write(b"test -t 0 && test -t 1 && echo tty-$((40+2)); stty size | sed 's/ /x/'\n")
        .await
        .or_fail("typing into the terminal")?;
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "tty-42",
        "the tty check",
    )
    .await?;
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "30x90",
        "the initial size",
    )
    .await?;
    term.resize(TerminalSize {
        rows: 41,
        cols: 101,
    })
    .or_fail("resize")?;
    term.write(b"stty size | sed 's/ /y/'\n")
        .await
        .or_fail("typing into the terminal")?;
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "41y101",
        "the new size",
    )
    .await?;
    ensure!(
        seen.stderr.is_empty(),
        "a terminal has one stream; stderr got {:?}",
        String::from_utf8_lossy(&seen.stderr)
    );
    term.write(b"exit 5\n").await.or_fail("typing `exit 5`")?;
    let exit = within("the shell's exit", term.exited()).await?;
    ensure!(
        exit.exit_code == 5,
        "`exit 5` in the terminal must report exit code 5; got {exit:?}"
    );
    expect_code(
        term.resize(TerminalSize { rows: 0, cols: 80 }),
        ErrorCode::InvalidOptions,
        "resize to 0 rows",
    )?;
    Ok(())
}

pub(crate) async fn terminal_owned_by_sandbox(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let term = sandbox
        .open_terminal(TerminalSpec::new("sleep", ["30"]))
        .await
        .or_fail("open_terminal of `sleep 30`")?;
    let other = sandbox
        .open_terminal(TerminalSpec::default())
        .await
        .or_fail("open_terminal of the default shell")?;
    within("destroy", sandbox.destroy())
        .await?
        .or_fail("destroy")?;
    // No await between destroy and the checks.
    let (a, b) = (term.try_exited(), other.try_exited());
    ensure!(
        a.is_some() && b.is_some(),
        "when destroy returns, every terminal's `exited` must have resolved; `sleep 30`: {a:?}, shell: {b:?}"
    );
    ensure!(
        a.is_some_and(|e| e.exit_code != 0),
        "a terminal destroy killed must not report a clean exit; got {a:?}"
    );
    Ok(())
}

/// A listener for the guest: binds a free loopback port, prints it, answers one
/// connection's line with `conformance-reply:<line>`.
const LISTENER: &str = r#"
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
print("port=%d" % s.getsockname()[1], flush=True)
c, _ = s.accept()
data = b""
while not data.endswith(b"\n"):
    more = c.recv(4096)
    if not more:
        break
    data += more
c.sendall(b"conformance-reply:" + data.strip() + b"\n")
c.close()
"#;

pub(crate) async fn tcp_reaches_guest_listener(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let listener = match sandbox
        .start_process(ProcessSpec::new(["python3", "-c", LISTENER]))
        .await
    {
        Ok(p) => p,
        Err(e) if e.code == ErrorCode::SpawnFailed => {
            skip!("the guest has no python3 to run the listener: {e}")
        }
        Err(e) => fail!("start_process of the listener: unexpected error {e}"),
    };
    let mut reader = listener.output();
    let mut seen = Seen::default();
    read_until(
        &mut reader,
        &mut seen,
        StreamKind::Stdout,
        "\n",
        "the listener's port",
    )
    .await?;
    let line = String::from_utf8_lossy(&seen.stdout).into_owned();
    let port: u16 = line
        .trim()
        .strip_prefix("port=")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| Stop::Fail(format!("the listener printed {line:?}, not port=N")))?;
    let mut conn = sandbox
        .open_tcp_connection(TcpTarget::loopback(port))
        .await
        .or_fail(format_args!("open_tcp_connection to guest port {port}"))?;
    ensure!(
        conn.target.port() == port && conn.target.ip().is_loopback(),
        "the stream must report the guest address it reached; got {}",
        conn.target
    );
    let payload = format!("hello-{port}");
    conn.stream
        .write_all(format!("{payload}\n").as_bytes())
        .await
        .map_err(|e| Stop::Fail(format!("writing to the stream: {e}")))?;
    let mut reply = Vec::new();
    within("the listener's reply", conn.stream.read_to_end(&mut reply))
        .await?
        .map_err(|e| Stop::Fail(format!("reading the reply: {e}")))?;
    let want = format!("conformance-reply:{payload}\n");
    ensure!(
        reply == want.as_bytes(),
        "the guest's listener must answer {want:?}; got {:?}",
        String::from_utf8_lossy(&reply)
    );
    let exit = within("the listener's exit", listener.wait()).await?;
    ensure!(
        exit.exit_code == 0,
        "the listener must exit 0; got {exit:?}"
    );
    // Nothing listens there any more: the refusal is typed.
    expect_code(
        sandbox
            .open_tcp_connection(TcpTarget::loopback(port))
            .await
            .map(|c| c.target),
        ErrorCode::NotFound,
        "a connection to a port nothing listens on",
    )?;
    Ok(())
}

pub(crate) async fn tcp_refuses_non_loopback(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    // Refusals only: these never reach the network, and the addresses are
    // documentation ranges besides.
    for host in ["192.0.2.1", "2001:db8::1", "0.0.0.0", "example.com"] {
        expect_code(
            sandbox
                .open_tcp_connection(TcpTarget {
                    port: 80,
                    host: host.into(),
                })
                .await
                .map(|c| c.target),
            ErrorCode::InvalidOptions,
            format_args!("open_tcp_connection to {host}"),
        )?;
    }
    Ok(())
}

pub(crate) async fn interactive_refused_after_destroy(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    sandbox.destroy().await.or_fail("destroy")?;
    let engine = ctx.engine();
    let caps = engine.capabilities();
    // An engine without a feature may refuse it as unsupported; one with it must
    // refuse because the sandbox is gone.
    let want = |feature: &str| {
        if caps.has_feature(feature) {
            ErrorCode::EngineDisposed
        } else {
            ErrorCode::CapabilityNotSupported
        }
    };
    expect_code(
        sandbox
            .start_process(ProcessSpec::new(["true"]))
            .await
            .map(|p| p.id().to_string()),
        want(FEATURE_PROCESS),
        "start_process after destroy",
    )?;
    expect_code(
        sandbox
            .open_terminal(TerminalSpec::default())
            .await
            .map(|t| t.id().to_string()),
        want(FEATURE_TERMINAL),
        "open_terminal after destroy",
    )?;
    expect_code(
        sandbox
            .open_tcp_connection(TcpTarget::loopback(80))
            .await
            .map(|c| c.target),
        want(FEATURE_TCP),
        "open_tcp_connection after destroy",
    )?;
    Ok(())
}

pub(crate) async fn interactive_unsupported_is_refused(ctx: Ctx) -> Check {
    let engine = ctx.engine();
    let caps = engine.capabilities();
    let missing: Vec<&str> = [FEATURE_PROCESS, FEATURE_TERMINAL, FEATURE_TCP]
        .into_iter()
        .filter(|f| !caps.has_feature(f))
        .collect();
    if missing.is_empty() {
        skip!("the engine advertises process, terminal and tcp; nothing to refuse");
    }
    let sandbox = ctx.sandbox().await?;
    for feature in missing {
        let r = match feature {
            FEATURE_PROCESS => sandbox
                .start_process(ProcessSpec::new(["true"]))
                .await
                .map(|p| p.id().to_string()),
            FEATURE_TERMINAL => sandbox
                .open_terminal(TerminalSpec::default())
                .await
                .map(|t| t.id().to_string()),
            _ => sandbox
                .open_tcp_connection(TcpTarget::loopback(80))
                .await
                .map(|c| c.target.to_string()),
        };
        expect_code(
            r,
            ErrorCode::CapabilityNotSupported,
            format_args!("a call needing `{feature}`, which the engine does not advertise"),
        )?;
    }
    Ok(())
}

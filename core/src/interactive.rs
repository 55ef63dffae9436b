//! Interactive sandboxes: background processes, terminals and TCP streams to services
//! inside the guest.
//!
//! These are optional capabilities of a [`Sandbox`](crate::Sandbox). An engine that
//! offers one advertises its feature ([`FEATURE_PROCESS`], [`FEATURE_TERMINAL`],
//! [`FEATURE_TCP`]); the others answer `CAPABILITY_NOT_SUPPORTED`.
//!
//! A process or terminal is owned by its sandbox: destroying the sandbox kills it and
//! waits for it, so that when `destroy` returns its exit status is already known.
//!
//! The engine side and the caller side share one [`ProcessShared`]: the engine pushes
//! output into it, reports the exit once, and implements [`ProcessControl`] for
//! input, signals and resizes; callers hold [`ProcessHandle`] or [`TerminalHandle`]
//! (cheap clones of the same process) and read output through an [`OutputReader`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Result};
use crate::exec::OutputChunk;
use crate::input::{InputBuffer, InputLimits, InputWait};
use crate::stream_buffer::{StreamBuffer, SubscriberId};

/// The feature of engines that run background processes.
pub const FEATURE_PROCESS: &str = "process";
/// The feature of engines that open terminals.
pub const FEATURE_TERMINAL: &str = "terminal";
/// The feature of engines that open TCP streams to the guest's loopback.
pub const FEATURE_TCP: &str = "tcp";

/// Most arguments (and environment variables) a process may get.
const MAX_ARGS: usize = 4096;
/// Most bytes of all arguments and environment variables together.
const MAX_ARG_BYTES: usize = 1 << 20;
/// Default bytes of unread output kept per process.
pub const DEFAULT_OUTPUT_BUFFER: usize = 1 << 20;

/// A background process to start in a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    /// The program and its arguments; a bare name is looked up on the sandbox's PATH.
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub argv: Vec<String>,
    /// Environment variables added to the sandbox's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory, inside the sandbox's workdir (default: the workdir).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Whether stdin is a pipe the handle writes to; otherwise it reads as empty.
    #[serde(default)]
    pub stdin: bool,
}

impl ProcessSpec {
    /// A process running `argv`, stdin empty.
    pub fn new<I, S>(argv: I) -> ProcessSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ProcessSpec {
            argv: argv.into_iter().map(Into::into).collect(),
            ..ProcessSpec::default()
        }
    }

    /// With stdin open for writes through the handle.
    pub fn with_stdin(mut self) -> ProcessSpec {
        self.stdin = true;
        self
    }

    /// `INVALID_OPTIONS` for an empty argv, NUL bytes or oversized arguments.
    pub fn validate(&self) -> Result<()> {
        validate_command("argv", &self.argv, &self.env)
    }
}

/// The most rows (and columns) a terminal may have.
const MAX_TERMINAL_SIDE: u16 = 1000;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Rows (1..=1000).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_TERMINAL_SIDE)))]
    pub rows: u16,
    /// Columns (1..=1000).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_TERMINAL_SIDE)))]
    pub cols: u16,
}

impl Default for TerminalSize {
    fn default() -> Self {
        TerminalSize { rows: 24, cols: 80 }
    }
}

impl TerminalSize {
    /// `INVALID_OPTIONS` unless both sides are within 1..=1000.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("size.rows", self.rows), ("size.cols", self.cols)] {
            if !(1..=MAX_TERMINAL_SIDE).contains(&v) {
                return Err(Error::invalid_options(
                    name,
                    format!("{v} is out of range; use 1 to 1000"),
                ));
            }
        }
        Ok(())
    }
}

/// A terminal to open in a sandbox: a command on a pseudo-terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TerminalSpec {
    /// The command (default `/bin/sh`); a bare name is looked up on the sandbox's PATH.
    #[serde(default = "default_shell")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The initial size.
    #[serde(default)]
    pub size: TerminalSize,
    /// Environment variables added to the sandbox's own (`TERM` defaults to
    /// `xterm-256color`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory, inside the sandbox's workdir (default: the workdir).
    #[serde(default)]
    pub cwd: Option<String>,
}

fn default_shell() -> String {
    "/bin/sh".into()
}

impl Default for TerminalSpec {
    fn default() -> Self {
        TerminalSpec {
            command: default_shell(),
            args: Vec::new(),
            size: TerminalSize::default(),
            env: BTreeMap::new(),
            cwd: None,
        }
    }
}

impl TerminalSpec {
    /// A terminal running `command` with `args`.
    pub fn new<I, S>(command: impl Into<String>, args: I) -> TerminalSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        TerminalSpec {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
            ..TerminalSpec::default()
        }
    }

    /// The argv: the command, then its arguments.
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.command.clone())
            .chain(self.args.iter().cloned())
            .collect()
    }

    /// `INVALID_OPTIONS` for an empty command, NUL bytes, oversized arguments or a
    /// size out of range.
    pub fn validate(&self) -> Result<()> {
        validate_command("command", &self.argv(), &self.env)?;
        self.size.validate()
    }
}

fn validate_command(field: &str, argv: &[String], env: &BTreeMap<String, String>) -> Result<()> {
    if argv.first().is_none_or(|a| a.is_empty()) {
        return Err(Error::invalid_options(field, "name a program to run"));
    }
    if argv.len() + env.len() > MAX_ARGS {
        return Err(Error::invalid_options(
            field,
            format!("too many arguments and variables; at most {MAX_ARGS}"),
        ));
    }
    let mut bytes = 0;
    for s in argv.iter().chain(env.values()) {
        bytes += s.len();
        if s.contains('\0') {
            return Err(Error::invalid_options(field, "remove the NUL byte"));
        }
    }
    for k in env.keys() {
        bytes += k.len();
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(Error::invalid_options(
                "env",
                format!("{k:?} is not a variable name"),
            ));
        }
    }
    if bytes > MAX_ARG_BYTES {
        return Err(Error::invalid_options(
            field,
            format!("arguments and variables take {bytes} bytes; at most {MAX_ARG_BYTES}"),
        ));
    }
    Ok(())
}

/// Where a TCP stream into the guest goes: a port on the guest's own loopback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpTarget {
    /// The port (1..=65535).
    pub port: u16,
    /// `127.0.0.1` (default), any `127.x.y.z`, `::1` or `localhost`.
    #[serde(default = "default_host")]
    pub host: String,
}

fn default_host() -> String {
    "127.0.0.1".into()
}

impl TcpTarget {
    /// Port `port` on the guest's `127.0.0.1`.
    pub fn loopback(port: u16) -> TcpTarget {
        TcpTarget {
            port,
            host: default_host(),
        }
    }

    /// The address to connect to inside the guest. Anything but a loopback address
    /// (or `localhost`) is refused with `INVALID_OPTIONS`: the stream reaches
    /// services in the sandbox, never another machine, and names are not resolved.
    pub fn loopback_addr(&self) -> Result<SocketAddr> {
        if self.port == 0 {
            return Err(Error::invalid_options(
                "port",
                "0 is no port; name the port the service listens on",
            ));
        }
        let ip: IpAddr = if self.host.eq_ignore_ascii_case("localhost") {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            let bare = self.host.trim_start_matches('[').trim_end_matches(']');
            bare.parse().map_err(|_| refused(&self.host))?
        };
        if !ip.is_loopback() {
            return Err(refused(&self.host));
        }
        Ok(SocketAddr::new(ip, self.port))
    }
}

fn refused(host: &str) -> Error {
    Error::invalid_options(
        "host",
        format!(
            "{host:?} is not the guest's loopback: a TCP stream reaches services inside the sandbox only; use 127.0.0.1, ::1 or localhost"
        ),
    )
}

/// How a background process or terminal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessExit {
    /// The exit code; `128 + N` when signal N killed it.
    pub exit_code: i32,
    /// The signal that killed it.
    pub signal: Option<i32>,
}

/// Parses a signal by name (`TERM`, `SIGTERM`, case-insensitive) or number (1..=64).
pub fn parse_signal(s: &str) -> Result<i32> {
    const NAMES: &[(&str, i32)] = &[
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("PIPE", 13),
        ("ALRM", 14),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
        ("TSTP", 20),
        ("WINCH", 28),
    ];
    let upper = s.trim().to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Some((_, n)) = NAMES.iter().find(|(k, _)| *k == name) {
        return Ok(*n);
    }
    match name.parse::<i32>() {
        Ok(n) => check_signal(n),
        Err(_) => Err(Error::invalid_options(
            "signal",
            format!("{s:?} is not a signal; use a name like TERM, INT or KILL, or a number"),
        )),
    }
}

/// The highest signal number [`check_signal`] takes.
pub const MAX_SIGNAL: i32 = 64;

/// `INVALID_OPTIONS` unless `signal` is 1..=[`MAX_SIGNAL`].
pub fn check_signal(signal: i32) -> Result<i32> {
    if (1..=MAX_SIGNAL).contains(&signal) {
        Ok(signal)
    } else {
        Err(Error::invalid_options(
            "signal",
            format!("{signal} is not a signal number; use 1 to 64"),
        ))
    }
}

/// The engine's side of a running process or terminal: input, signals, resizes.
#[async_trait]
pub trait ProcessControl: Send + Sync + fmt::Debug {
    /// Writes to the process's stdin (the terminal's input). Waits while the pipe is
    /// full; `STREAM_CLOSED` once stdin is closed or the process has exited.
    async fn write(&self, data: &[u8]) -> Result<()>;

    /// Closes stdin: the process reads end of file. Closing twice is a no-op.
    async fn close_stdin(&self) -> Result<()>;

    /// Whether stdin is open for writes: `false` for a process started without
    /// stdin, and once it was closed or broke. Writes are refused at once then,
    /// before they are buffered.
    fn input_open(&self) -> bool {
        true
    }

    /// Sends `signal` to the process (its whole process group). A process that has
    /// exited ignores it.
    fn signal(&self, signal: i32) -> Result<()>;

    /// Resizes the terminal. Processes without one answer `CAPABILITY_NOT_SUPPORTED`.
    fn resize(&self, size: TerminalSize) -> Result<()> {
        let _ = size;
        Err(Error::new(
            ErrorCode::CapabilityNotSupported,
            "this process has no terminal to resize",
        ))
    }
}

/// What the engine and every handle of one process share.
#[derive(Debug)]
pub struct ProcessShared {
    id: String,
    pid: Option<u32>,
    output: StreamBuffer,
    exit: tokio::sync::watch::Sender<Option<ProcessExit>>,
    control: Arc<dyn ProcessControl>,
    input: InputBuffer,
}

impl ProcessShared {
    /// A process `id` (unique in its sandbox), running as `pid` where the caller can
    /// see it, controlled through `control`; output beyond `buffer_bytes` unread is
    /// dropped oldest first while nobody reads, and holds the process back while
    /// someone does.
    pub fn new(
        id: impl Into<String>,
        pid: Option<u32>,
        control: Arc<dyn ProcessControl>,
        buffer_bytes: usize,
    ) -> Arc<ProcessShared> {
        Arc::new(ProcessShared {
            id: id.into(),
            pid,
            output: StreamBuffer::new(buffer_bytes),
            exit: tokio::sync::watch::channel(None).0,
            control,
            input: InputBuffer::default(),
        })
    }

    /// Bounds the process's input buffer (see [`crate::input`]): the first call wins,
    /// and only before the first write; until then the defaults hold.
    pub fn limit_input(&self, limits: InputLimits) {
        self.input.limit(limits);
    }

    /// Writes to stdin (a terminal's input) through the process's bounded input
    /// buffer: answered once `data` is buffered, written out in order behind the
    /// input before it. `RATE_LIMITED` when there is no room for it (within the
    /// buffer's wait, for [`InputWait::Bounded`]); `STREAM_CLOSED` once stdin is
    /// closed or the process has exited.
    pub async fn send_input(&self, data: Vec<u8>, wait: InputWait) -> Result<()> {
        if self.exit().is_some() {
            return Err(crate::input::stdin_closed());
        }
        self.input.send(&self.control, data, wait).await
    }

    /// Closes stdin once the input buffered before is written; later writes are
    /// refused. Closing twice is a no-op.
    pub fn close_input(&self) {
        self.input.close(&self.control);
    }

    /// The process's id in its sandbox.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its pid, where the host can see it.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// A reader of its output, from the oldest output buffered.
    pub fn output(self: &Arc<Self>) -> OutputReader {
        OutputReader {
            sub: self.output.subscribe(),
            shared: self.clone(),
        }
    }

    /// Its input, signals and size.
    pub fn control(&self) -> &Arc<dyn ProcessControl> {
        &self.control
    }

    /// Offers output (see [`StreamBuffer::push`]).
    pub async fn push_output(&self, chunk: OutputChunk) -> Result<()> {
        self.output.push(chunk).await
    }

    /// Ends the output: readers drain what is left, then see the end.
    pub fn close_output(&self) {
        self.output.close();
    }

    /// Records the exit; the first report wins.
    pub fn set_exit(&self, exit: ProcessExit) {
        self.exit.send_if_modified(|e| {
            if e.is_some() {
                return false;
            }
            *e = Some(exit);
            true
        });
    }

    /// The exit, once known.
    pub fn exit(&self) -> Option<ProcessExit> {
        *self.exit.borrow()
    }

    /// Waits for the exit.
    pub async fn wait(&self) -> ProcessExit {
        let mut rx = self.exit.subscribe();
        loop {
            if let Some(e) = *rx.borrow_and_update() {
                return e;
            }
            // The sender lives in `self`, so the channel cannot close while we wait.
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Bytes of output dropped unread because nobody was reading.
    pub fn dropped_output_bytes(&self) -> u64 {
        self.output.evicted_bytes()
    }
}

/// Reads a process's output: the oldest output still buffered first, then live
/// output as it is written. Unsubscribes when dropped.
#[derive(Debug)]
pub struct OutputReader {
    shared: Arc<ProcessShared>,
    sub: SubscriberId,
}

impl OutputReader {
    /// The next chunk (consecutive chunks of one stream joined up to 64 KiB); `None`
    /// once the process's output has ended and everything was read.
    pub async fn next(&mut self) -> Option<OutputChunk> {
        self.shared.output.next(self.sub, 64 * 1024).await
    }
}

impl Drop for OutputReader {
    fn drop(&mut self) {
        self.shared.output.unsubscribe(self.sub);
    }
}

/// A background process in a sandbox. Clones are handles to the same process.
#[derive(Debug, Clone)]
pub struct ProcessHandle {
    shared: Arc<ProcessShared>,
}

impl ProcessHandle {
    /// A handle on `shared` (engines make these).
    pub fn new(shared: Arc<ProcessShared>) -> ProcessHandle {
        ProcessHandle { shared }
    }

    /// The process's id in its sandbox.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// Its pid, where the host can see it (`None` inside a container).
    pub fn pid(&self) -> Option<u32> {
        self.shared.pid
    }

    /// A reader of its stdout and stderr, starting at the oldest output buffered.
    pub fn output(&self) -> OutputReader {
        self.shared.output()
    }

    /// Writes to its stdin: answered once `data` is in the process's bounded input
    /// buffer, written out in order (see [`crate::input`]). `STREAM_CLOSED` when it
    /// was started without stdin, after [`close_stdin`](Self::close_stdin), or once
    /// it exited; `RATE_LIMITED` when the buffer (or the tenant's budget) stays full.
    pub async fn write_stdin(&self, data: &[u8]) -> Result<()> {
        self.send_stdin(data.to_vec()).await
    }

    /// [`write_stdin`](Self::write_stdin) of a buffer the caller gives up, without
    /// a copy.
    pub async fn send_stdin(&self, data: Vec<u8>) -> Result<()> {
        self.shared.send_input(data, InputWait::Bounded).await
    }

    /// Closes its stdin once the input already written has been delivered.
    pub async fn close_stdin(&self) -> Result<()> {
        self.shared.close_input();
        Ok(())
    }

    /// Sends a signal (1..=64) to its process group.
    pub fn signal(&self, signal: i32) -> Result<()> {
        self.shared.control.signal(check_signal(signal)?)
    }

    /// Sends SIGKILL.
    pub fn kill(&self) -> Result<()> {
        self.shared.control.signal(9)
    }

    /// Waits for it to exit.
    pub async fn wait(&self) -> ProcessExit {
        self.shared.wait().await
    }

    /// Its exit, if it has exited.
    pub fn try_wait(&self) -> Option<ProcessExit> {
        self.shared.exit()
    }

    /// The shared state (for servers that relay it).
    pub fn shared(&self) -> &Arc<ProcessShared> {
        &self.shared
    }
}

/// A command running on a pseudo-terminal in a sandbox. Its output (one stream,
/// reported as stdout) is what the terminal shows; clones are handles to the same
/// terminal.
#[derive(Debug, Clone)]
pub struct TerminalHandle {
    shared: Arc<ProcessShared>,
}

impl TerminalHandle {
    /// A handle on `shared` (engines make these).
    pub fn new(shared: Arc<ProcessShared>) -> TerminalHandle {
        TerminalHandle { shared }
    }

    /// The terminal's id in its sandbox.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The command's pid, where the host can see it.
    pub fn pid(&self) -> Option<u32> {
        self.shared.pid
    }

    /// A reader of what the terminal shows, from the oldest output buffered.
    pub fn output(&self) -> OutputReader {
        self.shared.output()
    }

    /// Types into the terminal, through its bounded input buffer (as
    /// [`ProcessHandle::write_stdin`]).
    pub async fn write(&self, data: &[u8]) -> Result<()> {
        self.send(data.to_vec()).await
    }

    /// [`write`](Self::write) of a buffer the caller gives up, without a copy.
    pub async fn send(&self, data: Vec<u8>) -> Result<()> {
        self.shared.send_input(data, InputWait::Bounded).await
    }

    /// Resizes it (the command gets SIGWINCH).
    pub fn resize(&self, size: TerminalSize) -> Result<()> {
        size.validate()?;
        self.shared.control.resize(size)
    }

    /// Kills the command (SIGKILL to its process group); once it has exited, what it
    /// left running is killed too (see `docs/interactive.md`).
    pub fn kill(&self) -> Result<()> {
        self.shared.control.signal(9)
    }

    /// Sends a signal (1..=64) to the command's process group.
    pub fn signal(&self, signal: i32) -> Result<()> {
        self.shared.control.signal(check_signal(signal)?)
    }

    /// Waits for the command to exit.
    pub async fn exited(&self) -> ProcessExit {
        self.shared.wait().await
    }

    /// Its exit, if it has exited.
    pub fn try_exited(&self) -> Option<ProcessExit> {
        self.shared.exit()
    }

    /// The shared state (for servers that relay it).
    pub fn shared(&self) -> &Arc<ProcessShared> {
        &self.shared
    }
}

/// A two-way byte stream to a service listening inside a sandbox.
// tokio's networking is configured out under the loom models' `--cfg loom`.
#[cfg(not(loom))]
#[derive(Debug)]
pub struct TcpConnection {
    /// The connected stream (registered with the current tokio runtime).
    pub stream: tokio::net::TcpStream,
    /// The guest address it reached.
    pub target: SocketAddr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_are_accepted() {
        for host in [
            "127.0.0.1",
            "127.3.2.1",
            "::1",
            "[::1]",
            "localhost",
            "LOCALHOST",
        ] {
            let t = TcpTarget {
                port: 80,
                host: host.into(),
            };
            let addr = t.loopback_addr().unwrap_or_else(|e| panic!("{host}: {e}"));
            assert!(addr.ip().is_loopback());
            assert_eq!(addr.port(), 80);
        }
        for host in [
            "10.0.0.1",
            "0.0.0.0",
            "192.168.1.1",
            "::",
            "example.com",
            "localhost.example.com",
            "",
            "::ffff:127.0.0.1",
        ] {
            let t = TcpTarget {
                port: 80,
                host: host.into(),
            };
            let e = t.loopback_addr().unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidOptions, "{host}");
            assert!(e.message.contains("loopback"), "{host}: {}", e.message);
        }
        let zero = TcpTarget::loopback(0).loopback_addr().unwrap_err();
        assert_eq!(zero.code, ErrorCode::InvalidOptions);
    }

    #[test]
    fn specs_are_validated() {
        assert!(ProcessSpec::new(["sleep", "1"]).validate().is_ok());
        assert_eq!(
            ProcessSpec::new(Vec::<String>::new())
                .validate()
                .unwrap_err()
                .code,
            ErrorCode::InvalidOptions
        );
        assert!(ProcessSpec::new(["a\0b"]).validate().is_err());
        let mut bad_env = ProcessSpec::new(["true"]);
        bad_env.env.insert("A=B".into(), "1".into());
        assert!(bad_env.validate().is_err());
        assert!(TerminalSpec::default().validate().is_ok());
        let mut t = TerminalSpec::default();
        t.size.cols = 0;
        assert!(t.validate().unwrap_err().message.contains("size.cols"));
        let spec: TerminalSpec =
            serde_json::from_str(r#"{"command":"bash","size":{"rows":40,"cols":120}}"#).unwrap();
        assert_eq!(spec.argv(), vec!["bash"]);
        assert_eq!(
            spec.size,
            TerminalSize {
                rows: 40,
                cols: 120
            }
        );
        assert!(serde_json::from_str::<ProcessSpec>(r#"{"argv":["x"],"bogus":1}"#).is_err());
    }

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(parse_signal("TERM").unwrap(), 15);
        assert_eq!(parse_signal("sigkill").unwrap(), 9);
        assert_eq!(parse_signal("2").unwrap(), 2);
        assert!(parse_signal("0").is_err());
        assert!(parse_signal("65").is_err());
        assert!(parse_signal("BOGUS").is_err());
    }

    #[derive(Debug)]
    struct NoInput;

    #[async_trait]
    impl ProcessControl for NoInput {
        async fn write(&self, _: &[u8]) -> Result<()> {
            Err(Error::new(ErrorCode::StreamClosed, "no stdin"))
        }
        async fn close_stdin(&self) -> Result<()> {
            Ok(())
        }
        fn signal(&self, _: i32) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_first_exit_wins_and_readers_see_buffered_output() {
        let shared = ProcessShared::new("p1", None, Arc::new(NoInput), 1024);
        let handle = ProcessHandle::new(shared.clone());
        shared
            .push_output(OutputChunk {
                stream: crate::StreamKind::Stdout,
                data: b"early".to_vec(),
            })
            .await
            .unwrap();
        let mut reader = handle.output();
        assert_eq!(reader.next().await.unwrap().data, b"early");
        let waiter = {
            let h = handle.clone();
            tokio::spawn(async move { h.wait().await })
        };
        shared.set_exit(ProcessExit {
            exit_code: 3,
            signal: None,
        });
        shared.set_exit(ProcessExit {
            exit_code: 137,
            signal: Some(9),
        });
        assert_eq!(waiter.await.unwrap().exit_code, 3);
        assert_eq!(handle.try_wait().unwrap().exit_code, 3);
        shared.close_output();
        assert!(reader.next().await.is_none());
        assert!(handle.resize_is_refused());
        assert_eq!(
            handle.signal(0).unwrap_err().code,
            ErrorCode::InvalidOptions
        );
    }

    impl ProcessHandle {
        fn resize_is_refused(&self) -> bool {
            self.shared.control.resize(TerminalSize::default()).is_err()
        }
    }
}

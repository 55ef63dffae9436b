//! Background processes and terminals that a sandbox owns, run as host processes, and
//! TCP streams into a network namespace.
//!
//! A started process is watched by one task: it streams the process's pipes (or its
//! terminal) into the shared output buffer, notices the exit through the pidfd, kills
//! whatever the process left running (its process group and its own cgroup) while the
//! exited leader still holds its pid, reaps it, and reports the exit. The sandbox keeps
//! every process in a [`Processes`] registry and, on destroy or recycle, kills them all
//! and waits for their tasks.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use paddock_core::interactive::{ProcessControl, ProcessExit, ProcessShared, TerminalSize};
use paddock_core::{Error, ErrorCode, OutputChunk, Result, StreamKind};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::unix::pipe;

use crate::host::cgroup::Cgroup;
use crate::host::spawn::SpawnedChild;
use crate::host::sys;

/// The calls of a sandbox that runs background processes and terminals and opens TCP
/// streams into its guest (features `process`, `terminal`, `tcp`); see the
/// [`Sandbox`](paddock_core::Sandbox) methods of the same names.
/// [`workdir_sandbox!`](crate::sandbox::workdir_sandbox) makes them the `Sandbox`'s
/// for a type that has them.
pub(crate) trait ProcessOps {
    /// [`Sandbox::start_process`](paddock_core::Sandbox::start_process).
    fn start_process(
        &self,
        spec: paddock_core::ProcessSpec,
    ) -> impl std::future::Future<Output = Result<paddock_core::ProcessHandle>> + Send;

    /// [`Sandbox::open_terminal`](paddock_core::Sandbox::open_terminal).
    fn open_terminal(
        &self,
        spec: paddock_core::TerminalSpec,
    ) -> impl std::future::Future<Output = Result<paddock_core::TerminalHandle>> + Send;

    /// [`Sandbox::open_tcp_connection`](paddock_core::Sandbox::open_tcp_connection).
    fn open_tcp_connection(
        &self,
        target: paddock_core::TcpTarget,
    ) -> impl std::future::Future<Output = Result<paddock_core::TcpConnection>> + Send;
}

/// Most background processes and terminals one sandbox runs at once.
pub(crate) const MAX_PROCESSES: usize = 64;
/// How long output still open after a process's tree was killed is read, at most (a
/// writer outside the process group and cgroup).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

/// A process or terminal a sandbox owns.
#[derive(Debug)]
struct Owned {
    shared: Arc<ProcessShared>,
    control: Arc<dyn ProcessControl>,
    task: tokio::task::JoinHandle<()>,
}

/// The processes and terminals of one sandbox.
#[derive(Debug, Default)]
pub(crate) struct Processes {
    inner: parking_lot::Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    live: Vec<Owned>,
    /// Ids handed out for processes still being started.
    pending: usize,
    /// Set for good once the sandbox is being destroyed: nothing more is admitted.
    closed: bool,
}

impl Processes {
    /// A place and a fresh random id (`p-{32 hex digits}` for a process, `t-…` for a
    /// terminal: see [`paddock_core::ids`]) for one more process, or
    /// `LIMITS_EXCEEDED` when the sandbox already runs (or is starting)
    /// [`MAX_PROCESSES`]. The place is given back if the reservation is dropped
    /// unused.
    pub(crate) fn reserve(&self, prefix: &str) -> Result<Reservation<'_>> {
        let mut s = self.inner.lock();
        if s.closed {
            return Err(Error::new(
                ErrorCode::EngineDisposed,
                "the sandbox is being destroyed; start processes in a live sandbox",
            ));
        }
        // A process stops counting once its exit is known (the last thing its task
        // does), so a caller that waited for it finds its place free.
        s.live.retain(|o| o.shared.exit().is_none());
        if s.live.len() + s.pending >= MAX_PROCESSES {
            return Err(Error::new(
                ErrorCode::LimitsExceeded,
                format!(
                    "the sandbox already runs {MAX_PROCESSES} background processes and terminals; wait for or kill one first"
                ),
            ));
        }
        s.pending += 1;
        Ok(Reservation {
            id: paddock_core::ids::tagged(prefix),
            processes: self,
            used: false,
        })
    }

    /// Whether any process or terminal still runs.
    pub(crate) fn has_live(&self) -> bool {
        self.inner
            .lock()
            .live
            .iter()
            .any(|o| o.shared.exit().is_none())
    }

    /// Takes ownership of a started process. When the registry was closed meanwhile
    /// (a destroy began), the process is killed at once.
    fn add(&self, mut place: Reservation<'_>, owned: Owned) {
        place.used = true;
        let mut s = self.inner.lock();
        s.pending -= 1;
        if s.closed {
            drop(s);
            let _ = owned.control.signal(libc::SIGKILL);
            owned.shared.close_output();
            return;
        }
        s.live.push(owned);
    }

    /// Kills every process and terminal and waits until each has exited, its output
    /// has ended and its resources are freed. With `close`, nothing is admitted
    /// afterwards.
    pub(crate) async fn kill_all(&self, close: bool) {
        let live = {
            let mut s = self.inner.lock();
            s.closed |= close;
            std::mem::take(&mut s.live)
        };
        for o in &live {
            let _ = o.control.signal(libc::SIGKILL);
            // A reader that stopped reading must not hold the task (and so the
            // destroy) up: what is buffered stays readable, nothing more is added.
            o.shared.close_output();
        }
        for o in live {
            if o.task.await.is_err() {
                // The watcher died (it does not panic; a runtime shutting down can
                // cancel it): the promise that the exit is known still holds.
                o.shared.close_output();
                o.shared.set_exit(ProcessExit {
                    exit_code: -1,
                    signal: None,
                });
            }
        }
    }

    /// Kills everything without waiting (a sandbox dropped without destroy).
    pub(crate) fn kill_now(&self) {
        let mut s = self.inner.lock();
        s.closed = true;
        for o in s.live.drain(..) {
            let _ = o.control.signal(libc::SIGKILL);
            o.shared.close_output();
        }
    }
}

/// A place for one process in a sandbox's [`Processes`], with its id.
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    /// The process's id.
    pub(crate) id: String,
    processes: &'a Processes,
    used: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.processes.inner.lock().pending -= 1;
        }
    }
}

/// Where a host process's output comes from.
pub(crate) enum Source {
    /// A pipe (stdout or stderr).
    Pipe(pipe::Receiver, StreamKind),
    /// A terminal's master side (reported as stdout).
    Pty(Arc<AsyncFd<OwnedFd>>),
}

impl Source {
    /// Reads what is there; `Ok(0)` at the end. A terminal whose every slave
    /// descriptor is closed reads `EIO`, which is its end.
    async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Source::Pipe(p, _) => loop {
                p.readable().await?;
                match p.try_read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            },
            Source::Pty(fd) => loop {
                let mut guard = fd.readable().await?;
                let r = guard.try_io(|inner| sys::read(inner, buf));
                match r {
                    Ok(Ok(n)) => return Ok(n),
                    Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                    Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Ok(Err(e)) => return Err(e),
                    Err(_would_block) => continue,
                }
            },
        }
    }

    fn stream(&self) -> StreamKind {
        match self {
            Source::Pipe(_, k) => *k,
            Source::Pty(_) => StreamKind::Stdout,
        }
    }
}

/// Streams one source into the output buffer until its end, or until the buffer is
/// closed.
async fn pump(shared: &ProcessShared, source: &Source) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match source.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let chunk = OutputChunk {
                    stream: source.stream(),
                    data: buf[..n].to_vec(),
                };
                if shared.push_output(chunk).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The leader of a host process, guarded so that no signal reaches a pid the kernel
/// may have given to another process: signals are sent only while it is not reaped.
#[derive(Debug)]
struct Leader {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    reaped: parking_lot::Mutex<bool>,
    cgroup: Option<Arc<Cgroup>>,
}

/// Delivers signals to a process's group, wherever it runs.
pub(crate) trait Signaller: Send + Sync + std::fmt::Debug {
    /// Sends `signal`; a process that has ended ignores it.
    fn signal(&self, signal: libc::c_int);
}

impl Signaller for Leader {
    /// Sends `signal` to the leader and its process group (while unreaped).
    fn signal(&self, signal: libc::c_int) {
        let reaped = self.reaped.lock();
        if !*reaped {
            // The group holds the leader unless it moved to another one: then it
            // gets its own copy, and never two.
            // The pid cannot be reused while unreaped.
            if sys::process_group(self.pid).ok() != Some(self.pid) {
                let _ = sys::pidfd_send_signal(&self.pidfd, signal);
            }
            sys::kill_group(self.pid, signal);
        }
    }
}

/// Input and signals of a process started with pipes.
#[derive(Debug)]
struct PipeControl {
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    /// Whether `stdin` still holds the pipe (readable without waiting for a writer).
    open: std::sync::atomic::AtomicBool,
    leader: Arc<dyn Signaller>,
}

fn stdin_closed() -> Error {
    Error::new(
        ErrorCode::StreamClosed,
        "the process's stdin is closed (start it with stdin: true to write to it; it closes on close_stdin and when the process exits)",
    )
}

#[async_trait]
impl ProcessControl for PipeControl {
    async fn write(&self, data: &[u8]) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(stdin_closed());
        };
        if pipe.write_all(data).await.is_err() {
            *stdin = None;
            self.open.store(false, std::sync::atomic::Ordering::Release);
            return Err(stdin_closed());
        }
        Ok(())
    }

    async fn close_stdin(&self) -> Result<()> {
        self.open.store(false, std::sync::atomic::Ordering::Release);
        self.stdin.lock().await.take();
        Ok(())
    }

    fn input_open(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::Acquire)
    }

    fn signal(&self, signal: i32) -> Result<()> {
        self.leader.signal(signal);
        Ok(())
    }
}

/// Input, signals and size of a process on a terminal.
#[derive(Debug)]
struct PtyControl {
    master: Arc<AsyncFd<OwnedFd>>,
    /// Serializes writers, so that one write's bytes are not interleaved with another's.
    writing: tokio::sync::Mutex<()>,
    leader: Arc<dyn Signaller>,
}

#[async_trait]
impl ProcessControl for PtyControl {
    async fn write(&self, data: &[u8]) -> Result<()> {
        let _one = self.writing.lock().await;
        let mut rest = data;
        while !rest.is_empty() {
            let mut guard = self.master.writable().await.map_err(|_| stdin_closed())?;
            let r = guard.try_io(|inner| sys::write(inner, rest));
            match r {
                Ok(Ok(n)) => rest = &rest[n..],
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(_)) => return Err(stdin_closed()),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    /// A terminal has no stdin of its own to close: this types the end-of-file
    /// character (Ctrl-D).
    async fn close_stdin(&self) -> Result<()> {
        self.write(b"\x04").await
    }

    fn signal(&self, signal: i32) -> Result<()> {
        self.leader.signal(signal);
        Ok(())
    }

    fn resize(&self, size: TerminalSize) -> Result<()> {
        crate::host::pty::set_window_size(self.master.get_ref(), size)
            .map_err(|e| Error::engine_io("resizing the terminal", e))
    }
}

/// How a started host process talks to the caller.
pub(crate) enum Wiring {
    /// Pipes: stdin (when asked for), stdout, stderr.
    Pipes {
        stdin: Option<OwnedFd>,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    /// A terminal's master side.
    Pty(OwnedFd),
}

/// Pipes for a process started with pipes: the child's three ends (its stdin is
/// `/dev/null` unless `stdin`), and our ends as the wiring to watch it with.
pub(crate) fn pipes(stdin: bool) -> Result<([OwnedFd; 3], Wiring)> {
    let pipe = || sys::pipe().map_err(|e| Error::engine_io("creating a pipe", e));
    let (stdin_r, stdin_w) = if stdin {
        let (r, w) = pipe()?;
        (r, Some(w))
    } else {
        let null: OwnedFd = std::fs::File::open("/dev/null")
            .map_err(|e| Error::engine_io("opening /dev/null", e))?
            .into();
        (null, None)
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    Ok((
        [stdin_r, out_w, err_w],
        Wiring::Pipes {
            stdin: stdin_w,
            stdout: out_r,
            stderr: err_r,
        },
    ))
}

/// Watches a started host process and registers it with `processes`; returns the
/// shared state the caller's handle wraps. `cgroup` is the process's own group
/// (killed and removed when it exits).
pub(crate) fn adopt(
    place: Reservation<'_>,
    child: SpawnedChild,
    wiring: Wiring,
    cgroup: Option<Arc<Cgroup>>,
    buffer_bytes: usize,
) -> Result<Arc<ProcessShared>> {
    let io_err = |e: io::Error| Error::engine_io("watching the started process", e);
    let pid = child.pid;
    let leader = Arc::new(Leader {
        pid,
        pidfd: child.pidfd,
        reaped: parking_lot::Mutex::new(false),
        cgroup,
    });
    // A process that cannot be watched is not left running.
    let abandon = |e: Error| {
        leader.signal(libc::SIGKILL);
        *leader.reaped.lock() = true;
        let _ = sys::reap(pid);
        if let Some(g) = &leader.cgroup {
            let _ = g.remove();
        }
        e
    };
    // The AsyncFd owns its own clone of the pidfd.
    let exited = leader
        .pidfd
        .try_clone()
        .and_then(|fd| sys::async_fd(fd, Interest::READABLE))
        .map_err(io_err)
        .map_err(abandon)?;
    let exit = Box::pin(host_exit(leader.clone(), exited));
    adopt_with(
        place,
        Some(pid as u32),
        wiring,
        leader.clone(),
        exit,
        buffer_bytes,
    )
    .map_err(abandon)
}

/// Watches a process that runs elsewhere (in a container, through its agent): its
/// output comes through `wiring`, signals go through `signaller`, and `exit` resolves
/// with its end.
pub(crate) fn adopt_remote(
    place: Reservation<'_>,
    wiring: Wiring,
    signaller: Arc<dyn Signaller>,
    exit: tokio::sync::oneshot::Receiver<ProcessExit>,
    buffer_bytes: usize,
) -> Result<Arc<ProcessShared>> {
    let exit = Box::pin(async move {
        // A channel dropped unanswered means the container went away, and with it
        // every process in it.
        exit.await.unwrap_or(ProcessExit {
            exit_code: 128 + libc::SIGKILL,
            signal: Some(libc::SIGKILL),
        })
    });
    adopt_with(place, None, wiring, signaller, exit, buffer_bytes)
}

type ExitFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ProcessExit> + Send>>;

fn adopt_with(
    place: Reservation<'_>,
    pid: Option<u32>,
    wiring: Wiring,
    signaller: Arc<dyn Signaller>,
    exit: ExitFuture,
    buffer_bytes: usize,
) -> Result<Arc<ProcessShared>> {
    let io_err = |e: io::Error| Error::engine_io("watching the started process", e);
    let (control, sources): (Arc<dyn ProcessControl>, Vec<Source>) = match wiring {
        Wiring::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            let stdin = stdin
                .map(pipe::Sender::from_owned_fd)
                .transpose()
                .map_err(io_err)?;
            let sources = vec![
                Source::Pipe(
                    pipe::Receiver::from_owned_fd(stdout).map_err(io_err)?,
                    StreamKind::Stdout,
                ),
                Source::Pipe(
                    pipe::Receiver::from_owned_fd(stderr).map_err(io_err)?,
                    StreamKind::Stderr,
                ),
            ];
            (
                Arc::new(PipeControl {
                    open: std::sync::atomic::AtomicBool::new(stdin.is_some()),
                    stdin: tokio::sync::Mutex::new(stdin),
                    leader: signaller,
                }),
                sources,
            )
        }
        Wiring::Pty(master) => {
            sys::set_nonblocking(master.as_raw_fd());
            let master = Arc::new(
                sys::async_fd(master, Interest::READABLE | Interest::WRITABLE).map_err(io_err)?,
            );
            (
                Arc::new(PtyControl {
                    master: master.clone(),
                    writing: tokio::sync::Mutex::new(()),
                    leader: signaller,
                }),
                vec![Source::Pty(master)],
            )
        }
    };
    let shared = ProcessShared::new(place.id.clone(), pid, control.clone(), buffer_bytes);
    let task = tokio::spawn(watch(shared.clone(), sources, exit));
    let processes = place.processes;
    processes.add(
        place,
        Owned {
            shared: shared.clone(),
            control,
            task,
        },
    );
    Ok(shared)
}

/// The task of one process: its output until it ends, its exit, then the end of its
/// output (what is still open after the exit is read for [`DRAIN_GRACE`] at most).
async fn watch(shared: Arc<ProcessShared>, sources: Vec<Source>, exit: ExitFuture) {
    let pumps = pump_all(&shared, &sources);
    tokio::pin!(pumps);
    tokio::pin!(exit);
    let mut pumped = false;
    let status = loop {
        tokio::select! {
            _ = &mut pumps, if !pumped => pumped = true,
            status = &mut exit => break status,
        }
    };
    if !pumped {
        let _ = tokio::time::timeout(DRAIN_GRACE, &mut pumps).await;
    }
    shared.close_output();
    // Last: whoever waits for the exit finds everything about the process over.
    shared.set_exit(status);
}

/// The end of a host process: its exit is noticed through the pidfd; whatever it left
/// running is killed while the unreaped leader still holds its pid (and so its
/// process group id); then it is reaped and its cgroup removed.
async fn host_exit(leader: Arc<Leader>, exited: AsyncFd<OwnedFd>) -> ProcessExit {
    loop {
        match exited.readable().await {
            Ok(_) => break,
            // Cannot happen for a registered pidfd; fall back to polling.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
        if sys::pidfd_exited(&leader.pidfd) {
            break;
        }
    }
    sys::kill_group(leader.pid, libc::SIGKILL);
    if let Some(g) = leader.cgroup.clone() {
        let _ = crate::task::blocking(move || {
            g.kill_all()
                .map_err(|e| Error::engine_io("killing the process's tree", e))
        })
        .await;
    }
    let status = {
        let mut reaped = leader.reaped.lock();
        let status = sys::reap(leader.pid);
        *reaped = true;
        status
    };
    if let Some(g) = leader.cgroup.clone() {
        let _ = crate::task::blocking(move || {
            g.remove()
                .map_err(|e| Error::engine_io("removing the process's cgroup", e))
        })
        .await;
    }
    match status {
        Ok(st) => match (st.code, st.signal) {
            (Some(c), _) => ProcessExit {
                exit_code: c,
                signal: None,
            },
            (None, Some(s)) => ProcessExit {
                exit_code: 128 + s,
                signal: Some(s),
            },
            (None, None) => ProcessExit {
                exit_code: -1,
                signal: None,
            },
        },
        Err(_) => ProcessExit {
            exit_code: -1,
            signal: None,
        },
    }
}

/// Pumps every source (a process has one or two) concurrently until each has ended.
async fn pump_all(shared: &ProcessShared, sources: &[Source]) {
    match sources {
        [] => {}
        [one] => pump(shared, one).await,
        [a, b] => {
            tokio::join!(pump(shared, a), pump(shared, b));
        }
        _ => unreachable!("a process has at most two output sources"),
    }
}

/// Refuses a stream to one of the egress gateway's ports (its proxy, transparent
/// path and DNS stub, [`paddock_egress::PORTS`]) in a sandbox that has a gateway:
/// they are Paddock's, not servers of the sandbox, and a stream from outside would
/// use the sandbox's allowlist as its own. `INVALID_OPTIONS`, naming the port.
pub(crate) fn refuse_gateway_port(target: &paddock_core::TcpTarget, gateway: bool) -> Result<()> {
    let ports = paddock_egress::PORTS;
    if gateway && [ports.proxy, ports.transparent, ports.dns].contains(&target.port) {
        return Err(Error::new(
            ErrorCode::InvalidOptions,
            format!(
                "port {} of this sandbox is its egress gateway's, not a server of the sandbox's (ports {}, {} and {} are the gateway's in a sandbox with a network); listen on another port",
                target.port, ports.proxy, ports.transparent, ports.dns
            ),
        ));
    }
    Ok(())
}

/// A TCP stream to `addr` inside `netns` (or the host's own loopback without one),
/// ready for tokio. A refused connection is `NOT_FOUND`: nothing listens there.
pub(crate) async fn connect(
    netns: Option<RawFd>,
    target: &paddock_core::TcpTarget,
) -> Result<paddock_core::TcpConnection> {
    let addr = target.loopback_addr()?;
    // The fd stays open for the call: the sandbox is kept alive by the caller.
    let stream = crate::task::blocking(move || {
        let r = match netns {
            Some(fd) => crate::host::netns::connect_in(fd, addr),
            None => std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)),
        };
        r.map_err(|e| connect_error(addr, e))
    })
    .await?;
    stream
        .set_nonblocking(true)
        .map_err(|e| Error::engine_io("preparing the TCP stream", e))?;
    let stream = tokio::net::TcpStream::from_std(stream)
        .map_err(|e| Error::engine_io("registering the TCP stream", e))?;
    Ok(paddock_core::TcpConnection {
        stream,
        target: addr,
    })
}

fn connect_error(addr: SocketAddr, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => Error::new(
            ErrorCode::NotFound,
            format!("nothing listens on {addr} inside the sandbox; start the service first (and have it bind that address)"),
        ),
        io::ErrorKind::TimedOut => Error::new(
            ErrorCode::Timeout,
            format!("connecting to {addr} inside the sandbox timed out after 5 s"),
        ),
        _ => Error::engine_io(&format!("connecting to {addr} inside the sandbox"), e),
    }
}

//! Warm workers: long-lived handler processes that take json-stdio turns.
//!
//! A worker is started ahead of need (in the sandbox's cgroup and network namespace,
//! in its own process group) and then serves one turn at a time: the host writes an
//! `invoke` frame to the worker's stdin and reads frames back until the turn's
//! terminal frame, so an execution costs one frame round trip instead of an
//! interpreter start.
//!
//! Two wirings:
//! - **Built-in runners** (python, node) write frames on fd 3. Their stdout and stderr
//!   (fd 1 and 2) belong to the snippet and are captured as the execution's output,
//!   byte for byte, so nothing a snippet prints can be mistaken for a frame.
//! - **Custom handlers** speak the protocol on stdout, as `docs/protocol.md` says;
//!   their `log` frames become output and their stderr is captured as stderr.
//!
//! Any fault — a deadline or cancel the worker did not honour within the grace
//! period, a malformed frame, an exit mid-turn — leaves the worker unusable: the
//! caller drops it, which kills its process group, and starts another.

use std::os::fd::OwnedFd;
use std::time::Duration;

use paddock_core::protocol::{encode, Frame, FrameDecoder, HandlerError, ProtocolError};
use paddock_core::{OutputChunk, OutputSink, StreamKind};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::unix::pipe;
use tokio::time::Instant;

use crate::capture::Captured;
use crate::host::spawn::{spawn, spawn_async, SpawnSpec, SpawnedChild};
use crate::host::sys;
use crate::task::sleep_until_opt;

/// How long a worker has to end its turn after a `cancel` frame before it is killed.
pub(crate) const CANCEL_GRACE: Duration = Duration::from_millis(500);
/// How long one chunk may wait for a slow sink before streaming to it stops.
const SINK_GRACE: Duration = Duration::from_secs(5);
/// Bytes read at a time.
const READ_SIZE: usize = 64 * 1024;

/// Where a worker writes its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FramesOn {
    /// fd 3; stdout and stderr are the program's own output (built-in runners).
    Fd3,
    /// stdout; stderr is diagnostic output (custom handlers, as the protocol says).
    /// Only the tests use it until custom handlers are configurable.
    #[cfg_attr(not(test), allow(dead_code))]
    Stdout,
}

/// How a turn ended, when the worker ended it by the protocol.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TurnEnd {
    /// An `output` frame.
    Output(serde_json::Value),
    /// An `error` frame.
    Error(HandlerError),
    /// A `suspend` frame.
    Suspend(String),
}

/// Why a turn did not end by the protocol. The worker is unusable after any of these.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TurnFault {
    /// The deadline passed (the worker was asked to stop, then killed if needed).
    TimedOut,
    /// The caller cancelled (likewise).
    Cancelled,
    /// The worker broke the protocol.
    Protocol(ProtocolError),
    /// The worker exited, or closed its frame channel, before the terminal frame.
    Died(String),
}

/// One turn's outcome and output.
#[derive(Debug)]
pub(crate) struct Turn {
    pub(crate) end: Result<TurnEnd, TurnFault>,
    pub(crate) stdout: Captured,
    pub(crate) stderr: Captured,
}

/// The CPU time a worker had used when a turn started (see [`Worker::usage_mark`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct UsageMark {
    cpu_ticks: u64,
}

/// What a worker used during one turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TurnUsage {
    /// CPU time, user and system, of the worker and the children it reaped.
    pub(crate) cpu_ms: u64,
    /// Peak resident memory of the worker process during the turn.
    pub(crate) peak_memory_bytes: u64,
    /// Resident memory of the worker process after the turn.
    pub(crate) rss_bytes: u64,
}

/// utime + stime + cutime + cstime of `pid`, in clock ticks.
fn cpu_ticks(pid: libc::pid_t) -> Option<u64> {
    let stat = crate::host::sys::read_small(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last
    // ')', with the state (field 3) first, so utime (field 14) is the 12th.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let mut total = 0u64;
    for field in fields.get(11..15)? {
        total += field.parse::<i64>().ok()?.max(0) as u64;
    }
    Some(total)
}

/// A `/proc/<pid>/status` size (`  1234 kB`) in bytes.
fn kib(field: &str) -> u64 {
    field
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
        * 1024
}

/// A running worker process.
#[derive(Debug)]
pub(crate) struct Worker {
    child: Option<SpawnedChild>,
    exited: AsyncFd<OwnedFd>,
    input: pipe::Sender,
    frames: pipe::Receiver,
    /// The program's stdout when frames are on fd 3.
    stdout: Option<pipe::Receiver>,
    stderr: pipe::Receiver,
    decoder: FrameDecoder,
    /// Whether a cancel is also delivered as SIGINT (the built-in runners read frames
    /// only between turns, so a snippet is interrupted by the signal).
    interrupt_on_cancel: bool,
    /// Read buffers kept between turns (frames, stdout, stderr): a turn does not
    /// allocate and zero them again.
    bufs: Vec<Vec<u8>>,
    /// Turns served so far.
    pub(crate) turns: u32,
    /// When the worker started.
    pub(crate) started: std::time::Instant,
    /// Whether another process reaps it (a container's agent, whose child it is):
    /// it is then watched and killed through its pidfd only.
    reaped_elsewhere: bool,
}

/// The child's ends of a worker's pipes, for a worker another process starts (see
/// [`Worker::adopt`]): its stdin, stdout, stderr and fd 3.
#[derive(Debug)]
pub(crate) struct ChildEnds {
    pub(crate) stdio: [OwnedFd; 3],
    pub(crate) fd3: OwnedFd,
}

/// Our ends of a worker's pipes.
#[derive(Debug)]
pub(crate) struct Ends {
    input: OwnedFd,
    frames: OwnedFd,
    stdout: Option<OwnedFd>,
    stderr: OwnedFd,
}

fn worker_failed(e: crate::host::spawn::SpawnError) -> std::io::Error {
    std::io::Error::new(
        e.error.kind(),
        format!(
            "{} failed: {}",
            e.stage.map_or("starting the worker", |s| s.describe()),
            e.error
        ),
    )
}

impl Worker {
    /// Starts `spec` (its stdio is replaced) with frames on `frames_on`, on this
    /// thread: for programs that exec at once (an OCI runtime), not for a program
    /// that joins a sandbox's cgroups first (see [`Worker::start_async`]).
    pub(crate) fn start(spec: SpawnSpec, frames_on: FramesOn) -> std::io::Result<Worker> {
        let (spec, ends) = Self::wire(spec, frames_on)?;
        let child = spawn(&spec).map_err(worker_failed)?;
        // Our copies of the child's ends go now, so EOF means the worker closed them.
        drop(spec);
        Self::assemble(child, ends, frames_on)
    }

    /// [`Worker::start`] with the spawn on the blocking pool (`spawn_async`): a
    /// worker in a sandbox at its limits may take seconds to exec, and the thread
    /// that waits for it is not the actor thread.
    pub(crate) async fn start_async(
        spec: SpawnSpec,
        frames_on: FramesOn,
    ) -> std::io::Result<Worker> {
        let (spec, ends) = Self::wire(spec, frames_on)?;
        let child = spawn_async(spec).await.map_err(worker_failed)?;
        Self::assemble(child, ends, frames_on)
    }

    /// The worker's pipes: `spec` gets the child's ends, the rest are ours.
    fn wire(mut spec: SpawnSpec, frames_on: FramesOn) -> std::io::Result<(SpawnSpec, Ends)> {
        let (in_r, in_w) = sys::pipe()?;
        let (out_r, out_w) = sys::pipe()?;
        let (err_r, err_w) = sys::pipe()?;
        let (frames_r, stdout) = match frames_on {
            FramesOn::Stdout => (out_r, None),
            FramesOn::Fd3 => {
                let (fr, fw) = sys::pipe()?;
                spec.fd3 = Some(fw);
                (fr, Some(out_r))
            }
        };
        spec.stdio = [in_r, out_w, err_w];
        Ok((
            spec,
            Ends {
                input: in_w,
                frames: frames_r,
                stdout,
                stderr: err_r,
            },
        ))
    }

    /// Pipes for a built-in runner (frames on fd 3) that another process starts:
    /// the child's ends to pass along, and ours for [`Worker::adopt`].
    pub(crate) fn runner_pipes() -> std::io::Result<(ChildEnds, Ends)> {
        let (in_r, in_w) = sys::pipe()?;
        let (out_r, out_w) = sys::pipe()?;
        let (err_r, err_w) = sys::pipe()?;
        let (frames_r, frames_w) = sys::pipe()?;
        Ok((
            ChildEnds {
                stdio: [in_r, out_w, err_w],
                fd3: frames_w,
            },
            Ends {
                input: in_w,
                frames: frames_r,
                stdout: Some(out_r),
                stderr: err_r,
            },
        ))
    }

    /// A built-in runner that another process started and reaps (a container's
    /// agent), on our `ends` of [`Worker::runner_pipes`]: watched, interrupted and
    /// killed through `pidfd`. The child's ends must be closed here by now, so that
    /// EOF means the runner closed them.
    pub(crate) fn adopt(pidfd: OwnedFd, ends: Ends) -> std::io::Result<Worker> {
        use std::os::fd::AsRawFd;
        let pid = crate::host::spawn::pidfd_pid(pidfd.as_raw_fd()).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the runner's pidfd names no process (it has exited)",
            )
        })?;
        let mut worker = Self::assemble(SpawnedChild { pid, pidfd }, ends, FramesOn::Fd3)?;
        worker.reaped_elsewhere = true;
        Ok(worker)
    }

    /// The worker around its started child and our ends of its pipes.
    fn assemble(child: SpawnedChild, ends: Ends, frames_on: FramesOn) -> std::io::Result<Worker> {
        // The AsyncFd owns its own clone of the pidfd.
        let exited = sys::async_fd(child.pidfd.try_clone()?, Interest::READABLE)?;
        Ok(Worker {
            child: Some(child),
            exited,
            input: pipe::Sender::from_owned_fd(ends.input)?,
            frames: pipe::Receiver::from_owned_fd(ends.frames)?,
            stdout: ends.stdout.map(pipe::Receiver::from_owned_fd).transpose()?,
            stderr: pipe::Receiver::from_owned_fd(ends.stderr)?,
            decoder: FrameDecoder::new(),
            interrupt_on_cancel: frames_on == FramesOn::Fd3,
            bufs: Vec::new(),
            turns: 0,
            started: std::time::Instant::now(),
            reaped_elsewhere: false,
        })
    }

    /// The worker's pid (also its process group).
    pub(crate) fn pid(&self) -> Option<libc::pid_t> {
        self.child.as_ref().map(|c| c.pid)
    }

    /// Starts measuring a turn: resets the process's peak resident memory (the kernel's
    /// `VmHWM`, through `clear_refs`) and reads the CPU time it has used so far.
    pub(crate) fn usage_mark(&self) -> UsageMark {
        let Some(pid) = self.pid() else {
            return UsageMark { cpu_ticks: 0 };
        };
        let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
        UsageMark {
            cpu_ticks: cpu_ticks(pid).unwrap_or(0),
        }
    }

    /// What the worker used since `mark`: CPU time (its own and its reaped
    /// children's), its peak resident memory, and its resident memory now.
    pub(crate) fn usage_since(&self, mark: UsageMark) -> TurnUsage {
        let Some(pid) = self.pid() else {
            return TurnUsage::default();
        };
        let hz = sys::clock_ticks_per_second();
        let ticks = cpu_ticks(pid).unwrap_or(mark.cpu_ticks);
        let (mut peak, mut rss) = (0, 0);
        if let Ok(status) = crate::host::sys::read_small(format!("/proc/{pid}/status")) {
            for line in status.lines() {
                if let Some(rest) = line.strip_prefix("VmHWM:") {
                    peak = kib(rest);
                } else if let Some(rest) = line.strip_prefix("VmRSS:") {
                    rss = kib(rest);
                }
            }
        }
        TurnUsage {
            cpu_ms: ticks.saturating_sub(mark.cpu_ticks) * 1000 / hz,
            peak_memory_bytes: peak.max(rss),
            rss_bytes: rss,
        }
    }

    /// Runs one turn: sends `invoke` with `id` (the execution's) and `input`, streams output to `sink` (each
    /// stream kept up to `cap` bytes), and waits for the terminal frame. A cancel or
    /// the deadline sends `cancel` and, after [`CANCEL_GRACE`], kills the worker.
    ///
    /// `abort` ending (the sandbox being destroyed) ends the turn at once as cancelled;
    /// the caller then kills the worker. Returns the turn's id with the turn.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn invoke(
        &mut self,
        id: String,
        input: serde_json::Value,
        sink: &dyn OutputSink,
        cancel: &paddock_core::CancelToken,
        deadline: Instant,
        cap: usize,
        abort: std::pin::Pin<&mut (dyn std::future::Future<Output = ()> + Send)>,
    ) -> (String, Turn) {
        let frame = Frame::invoke(id.clone(), input);
        let turn = self
            .run_turn(&id, frame, sink, cancel, deadline, cap, abort)
            .await;
        (id, turn)
    }

    /// Runs the next turn of the invocation `id`, suspended on `token_id`, with the
    /// value the token resolved to; otherwise as [`Worker::invoke`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn resume(
        &mut self,
        id: &str,
        token_id: &str,
        value: serde_json::Value,
        sink: &dyn OutputSink,
        cancel: &paddock_core::CancelToken,
        deadline: Instant,
        cap: usize,
        abort: std::pin::Pin<&mut (dyn std::future::Future<Output = ()> + Send)>,
    ) -> Turn {
        let frame = Frame::resume(id, token_id, value);
        self.run_turn(id, frame, sink, cancel, deadline, cap, abort)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_turn(
        &mut self,
        id: &str,
        first: Frame,
        sink: &dyn OutputSink,
        cancel: &paddock_core::CancelToken,
        deadline: Instant,
        cap: usize,
        mut abort: std::pin::Pin<&mut (dyn std::future::Future<Output = ()> + Send)>,
    ) -> Turn {
        self.turns += 1;
        let id = id.to_string();
        let mut turn = Turn {
            end: Err(TurnFault::Died(String::new())),
            stdout: Captured::within(sink.allowance()),
            stderr: Captured::within(sink.allowance()),
        };
        let mut delivering = true;
        let frame = encode(&first);
        let written = tokio::time::timeout_at(deadline, self.input.write_all(&frame)).await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                turn.end = Err(TurnFault::Died(format!(
                    "writing the invoke frame failed: {e}"
                )));
                return turn;
            }
            Err(_) => {
                turn.end = Err(TurnFault::TimedOut);
                return turn;
            }
        }

        // Set once the worker was asked to stop: why, and when it gets killed.
        let mut stopping: Option<(TurnFault, Instant)> = None;
        let mut bufs = std::mem::take(&mut self.bufs);
        bufs.resize_with(3, || vec![0u8; READ_SIZE]);
        let [frame_buf, out_buf, err_buf] = &mut bufs[..] else {
            unreachable!("three buffers")
        };
        let end = loop {
            let kill_at = stopping.as_ref().map(|(_, at)| *at);
            tokio::select! {
                biased;
                r = self.frames.readable() => {
                    if let Err(e) = r {
                        break Err(TurnFault::Died(format!("reading frames failed: {e}")));
                    }
                    match self.frames.try_read(frame_buf) {
                        Ok(0) => break Err(self.died_mid_turn("closed its frame channel")),
                        Ok(n) => {
                            let mut decided = None;
                            for item in self.decoder.decode(&frame_buf[..n]) {
                                match item.map_err(TurnFault::Protocol).and_then(|f| check(&id, f)) {
                                    Ok(Frame::Log { stream, data, .. }) => {
                                        deliver(&mut turn, stream, data.as_bytes(), cap, sink, &mut delivering).await;
                                    }
                                    Ok(Frame::Output { output, .. }) => { decided = Some(Ok(TurnEnd::Output(output))); break; }
                                    Ok(Frame::Error { error, .. }) => { decided = Some(Ok(TurnEnd::Error(error))); break; }
                                    Ok(Frame::Suspend { token_id, .. }) => { decided = Some(Ok(TurnEnd::Suspend(token_id))); break; }
                                    Ok(_) => unreachable!("check() lets through handler frames only"),
                                    Err(fault) => { decided = Some(Err(fault)); break; }
                                }
                            }
                            if let Some(end) = decided {
                                // A frame after the terminal one in the same read is a
                                // violation the next turn would trip over.
                                if end.is_ok() && self.decoder.buffered_len() > 0 {
                                    break Err(TurnFault::Protocol(ProtocolError::new(
                                        paddock_core::protocol::ProtocolErrorKind::OutOfOrder,
                                        "bytes after the terminal frame of a turn",
                                    )));
                                }
                                break end;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => break Err(TurnFault::Died(format!("reading frames failed: {e}"))),
                    }
                }
                r = read_some(self.stdout.as_ref(), out_buf) => {
                    if let Some(bytes) = r {
                        deliver(&mut turn, StreamKind::Stdout, bytes, cap, sink, &mut delivering).await;
                    }
                }
                r = read_some(Some(&self.stderr), err_buf) => {
                    if let Some(bytes) = r {
                        deliver(&mut turn, StreamKind::Stderr, bytes, cap, sink, &mut delivering).await;
                    }
                }
                _ = cancel.cancelled(), if stopping.is_none() => {
                    stopping = Some((TurnFault::Cancelled, Instant::now() + CANCEL_GRACE));
                    self.send_cancel(&id).await;
                }
                _ = tokio::time::sleep_until(deadline), if stopping.is_none() => {
                    stopping = Some((TurnFault::TimedOut, Instant::now() + CANCEL_GRACE));
                    self.send_cancel(&id).await;
                }
                _ = abort.as_mut() => {
                    break Err(TurnFault::Cancelled);
                }
                _ = sleep_until_opt(kill_at) => {
                    break Err(stopping.take().map_or(TurnFault::TimedOut, |(f, _)| f));
                }
                r = self.exited.readable() => {
                    let _ = r;
                    break Err(self.died_mid_turn("exited"));
                }
            }
        };
        // A turn that was being stopped is reported as stopped, whatever the worker
        // answered meanwhile: an `output` racing a cancel is not a success.
        turn.end = match (stopping, end) {
            (Some((fault, _)), _) => Err(fault),
            (None, end) => end,
        };
        // The worker flushed its output before the terminal frame, so everything it
        // wrote during the turn is in the pipes now.
        if turn.end.is_ok() {
            self.drain(&mut turn, cap, sink, &mut delivering, &mut bufs[1])
                .await;
        }
        self.bufs = bufs;
        turn
    }

    /// Asks the worker to stop the turn: a `cancel` frame, and SIGINT for runners.
    async fn send_cancel(&mut self, id: &str) {
        let frame = encode(&Frame::cancel(id));
        let _ = tokio::time::timeout(CANCEL_GRACE, self.input.write_all(&frame)).await;
        if self.interrupt_on_cancel {
            if let Some(child) = &self.child {
                let _ = sys::pidfd_send_signal(&child.pidfd, libc::SIGINT);
            }
        }
    }

    fn died_mid_turn(&mut self, what: &str) -> TurnFault {
        let pending = self.decoder.buffered_len();
        let detail = if pending > 0 {
            format!("the worker {what} in the middle of a frame ({pending} bytes of it arrived)")
        } else {
            format!("the worker {what} before the turn's terminal frame")
        };
        TurnFault::Died(detail)
    }

    async fn drain(
        &mut self,
        turn: &mut Turn,
        cap: usize,
        sink: &dyn OutputSink,
        delivering: &mut bool,
        buf: &mut [u8],
    ) {
        for stream in [StreamKind::Stdout, StreamKind::Stderr] {
            let pipe = match stream {
                StreamKind::Stdout => self.stdout.as_ref(),
                StreamKind::Stderr => Some(&self.stderr),
            };
            let Some(pipe) = pipe else { continue };
            // A plain non-blocking read: tokio's `try_read` answers from its cached
            // readiness, which may not have seen these bytes yet. Bounded, so a
            // writer that keeps writing cannot hold the turn open.
            for _ in 0..64 {
                let n = match sys::read(pipe, buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                deliver(turn, stream, &buf[..n], cap, sink, delivering).await;
            }
        }
    }

    /// Waits up to `within` for the worker to exit by itself (a one-shot handler exits
    /// with code 42 after `suspend`); its exit code when it did (-1 for a worker
    /// reaped elsewhere, whose code is not known here). The worker is then reaped and
    /// no longer usable.
    pub(crate) async fn exited_within(&mut self, within: Duration) -> Option<i32> {
        if within.is_zero() {
            // Without a timer: tokio's would round zero up to its next millisecond tick.
            if !crate::host::sys::pidfd_exited(self.exited.get_ref()) {
                return None;
            }
        } else {
            let _ready = tokio::time::timeout(within, self.exited.readable())
                .await
                .ok()?
                .ok()?;
        }
        let child = self.child.take()?;
        if self.reaped_elsewhere {
            return Some(-1);
        }
        let status = sys::reap(child.pid).ok();
        drop(child);
        status.and_then(|s| s.code)
    }

    /// Kills the worker and waits up to `within` until it has exited (for a worker
    /// reaped elsewhere: until the process that reaps it can), then as
    /// [`Worker::kill`].
    pub(crate) async fn kill_and_wait(&mut self, within: Duration) {
        if let Some(child) = &self.child {
            let _ = sys::pidfd_send_signal(&child.pidfd, libc::SIGKILL);
            let _ = tokio::time::timeout(within, self.exited.readable()).await;
        }
        self.kill();
    }

    /// Kills the worker's process group and reaps it in the background.
    pub(crate) fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = sys::pidfd_send_signal(&child.pidfd, libc::SIGKILL);
            if self.reaped_elsewhere {
                // Only through the pidfd: the pid may be reaped and reused by now.
                // The process that reaps it (a container's agent, the fork server)
                // kills the rest of its session then.
                return;
            }
            sys::kill_group(child.pid, libc::SIGKILL);
            std::thread::spawn(move || {
                let _ = sys::reap(child.pid);
                drop(child);
            });
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Lets through the handler's frames for `id`; anything else breaks the protocol.
fn check(id: &str, frame: Frame) -> Result<Frame, TurnFault> {
    use paddock_core::protocol::ProtocolErrorKind;
    let violation = |message: String| {
        Err(TurnFault::Protocol(ProtocolError::new(
            ProtocolErrorKind::OutOfOrder,
            message,
        )))
    };
    match &frame {
        Frame::Invoke { .. } | Frame::Resume { .. } | Frame::Cancel { .. } => violation(format!(
            "the worker sent a `{}` frame, which only the host sends",
            frame.kind().as_str()
        )),
        f if f.id() != id => violation(format!(
            "the worker sent a frame for `{}` during the turn of `{id}`",
            f.id()
        )),
        _ => Ok(frame),
    }
}

/// Keeps and streams `bytes`.
async fn deliver(
    turn: &mut Turn,
    stream: StreamKind,
    bytes: &[u8],
    cap: usize,
    sink: &dyn OutputSink,
    delivering: &mut bool,
) {
    let kept = match stream {
        StreamKind::Stdout => &mut turn.stdout,
        StreamKind::Stderr => &mut turn.stderr,
    };
    let data = kept.keep(bytes, cap as u64);
    if data.is_empty() || !*delivering {
        return;
    }
    let sent = tokio::time::timeout(SINK_GRACE, sink.chunk(OutputChunk { stream, data })).await;
    if !matches!(sent, Ok(Ok(()))) {
        *delivering = false;
    }
}

/// Waits until `pipe` has bytes and reads them; pending forever without a pipe, and
/// after EOF (the worker's exit is noticed through its pidfd).
async fn read_some<'a>(pipe: Option<&pipe::Receiver>, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    let Some(pipe) = pipe else {
        return std::future::pending().await;
    };
    loop {
        if pipe.readable().await.is_err() {
            return std::future::pending().await;
        }
        match pipe.try_read(buf) {
            Ok(0) => return std::future::pending().await,
            Ok(n) => return Some(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::sys::cstring;
    use paddock_core::{CancelToken, DiscardSink};

    /// A custom handler (frames on stdout) written in Python.
    const HANDLER: &str = r#"
import json, sys
for line in sys.stdin:
    f = json.loads(line)
    if f["kind"] != "invoke":
        continue
    if f["input"] == "garbage":
        print("this is not a frame", flush=True)
        continue
    print(json.dumps({"v": 1, "kind": "log", "id": f["id"], "stream": "stdout", "data": "working\n"}), flush=True)
    print("diagnostics", file=sys.stderr, flush=True)
    print(json.dumps({"v": 1, "kind": "output", "id": f["id"], "output": f["input"] * 2}), flush=True)
"#;

    fn python() -> Option<String> {
        let path = std::env::var("PATH").ok()?;
        std::env::split_paths(&path)
            .map(|d| d.join("python3"))
            .find(|p| p.is_file())
            .map(|p| p.to_string_lossy().into_owned())
    }

    fn spec(python: &str) -> SpawnSpec {
        let null = || -> OwnedFd { std::fs::File::open("/dev/null").unwrap().into() };
        SpawnSpec {
            path: cstring(python).unwrap(),
            argv: vec![
                cstring(python).unwrap(),
                cstring("-c").unwrap(),
                cstring(HANDLER).unwrap(),
            ],
            env: std::env::vars()
                .filter(|(k, _)| k == "PATH" || k.starts_with("PYENV"))
                .map(|(k, v)| cstring(format!("{k}={v}")).unwrap())
                .collect(),
            cwd: cstring("/").unwrap(),
            stdio: [null(), null(), null()],
            fd3: None,
            rlimits: Vec::new(),
            cgroup_procs: Vec::new(),
            netns: None,
            mntns: None,
            controlling_tty: false,
        }
    }

    #[tokio::test]
    async fn a_custom_handler_speaks_the_protocol_on_stdout() {
        let Some(python) = python() else {
            eprintln!("skipped: no python3 on PATH");
            return;
        };
        let mut worker = Worker::start(spec(&python), FramesOn::Stdout).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in [1, 2] {
            let (_, turn) = worker
                .invoke(
                    format!("t-{n}"),
                    serde_json::json!(n * 21),
                    &DiscardSink,
                    &CancelToken::new(),
                    deadline,
                    1 << 20,
                    std::pin::pin!(std::future::pending::<()>()),
                )
                .await;
            assert_eq!(turn.end, Ok(TurnEnd::Output(serde_json::json!(n * 42))));
            assert_eq!(
                turn.stdout.into_string(),
                "working\n",
                "log frames are output"
            );
            assert_eq!(turn.stderr.into_string(), "diagnostics\n");
        }
        assert_eq!(worker.turns, 2);
        let (_, turn) = worker
            .invoke(
                "t-garbage".to_string(),
                serde_json::json!("garbage"),
                &DiscardSink,
                &CancelToken::new(),
                deadline,
                1 << 20,
                std::pin::pin!(std::future::pending::<()>()),
            )
            .await;
        assert!(
            matches!(turn.end, Err(TurnFault::Protocol(_))),
            "{:?}",
            turn.end
        );
    }
}

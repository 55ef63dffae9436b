//! A running process or terminal: the [`ProcessControl`] its engine implements, the
//! [`ProcessShared`] state the engine shares with every handle, the caller's
//! [`ProcessHandle`] and [`TerminalHandle`], and the [`OutputReader`] they read through.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{check_signal, TerminalSize};
use crate::error::{Error, ErrorCode, Result};
use crate::exec::OutputChunk;
use crate::input::{InputBuffer, InputLimits, InputWait};
use crate::stream_buffer::{StreamBuffer, SubscriberId};

/// How a background process or terminal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessExit {
    /// The exit code; `128 + N` when signal N killed it.
    pub exit_code: i32,
    /// The signal that killed it.
    pub signal: Option<i32>,
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

#[cfg(test)]
mod tests {
    use super::*;

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

//! A background process's input buffer: what callers wrote to its stdin (or its
//! terminal) that it has not read yet, bounded per process and per tenant.
//!
//! A write is accepted once its bytes are in the buffer, and answered then; one task
//! per process writes the buffer out in order, and a close of stdin takes its place
//! behind the input written before it. Room is taken before a chunk is queued:
//! - from the process's buffer ([`InputLimits::buffer_bytes`]), waiting up to
//!   [`InputLimits::wait`] for the process to read; a chunk larger than the buffer
//!   takes all of it, so it waits alone;
//! - from its tenant's budget ([`InputLimits::tenant`]), at once or not at all, so
//!   that writers waiting for room are counted too.
//!
//! A writer that gets no room is refused with `RATE_LIMITED` and lets go of its chunk:
//! however many writers pile on a process that never reads, the host holds at most
//! the process's buffer, and a tenant at most its budget, of their input.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::budget::TenantBudget;
use crate::error::{Error, ErrorCode, Result};
use crate::interactive::ProcessControl;

/// Default bytes of input one process may have waiting ([`InputLimits::buffer_bytes`]).
pub const DEFAULT_INPUT_BUFFER: usize = 1 << 20;
/// Default longest wait for room in a process's input buffer.
pub const DEFAULT_INPUT_WAIT: Duration = Duration::from_secs(5);
/// The `retry_after_ms` of a refused write.
const RETRY_AFTER_MS: u64 = 1_000;

/// How much input may wait for one process, how long a writer waits for room, and
/// the tenant's budget it draws on.
#[derive(Debug, Clone)]
pub struct InputLimits {
    /// Bytes of input accepted for the process and not yet read by it (at least 1).
    pub buffer_bytes: usize,
    /// How long a write waits for room in the process's buffer before it is refused.
    pub wait: Duration,
    /// The budget of the process's tenant, across all its processes (`None`: only
    /// the process's own buffer bounds it).
    pub tenant: Option<TenantBudget>,
}

impl Default for InputLimits {
    fn default() -> Self {
        InputLimits {
            buffer_bytes: DEFAULT_INPUT_BUFFER,
            wait: DEFAULT_INPUT_WAIT,
            tenant: None,
        }
    }
}

/// How long a write may wait for room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputWait {
    /// Up to [`InputLimits::wait`] for the process's buffer; the tenant's budget at
    /// once. For request/response surfaces: the caller lets go of its chunk when
    /// refused.
    Bounded,
    /// As long as it takes, for both. For a stream that holds its source back
    /// meanwhile (a WebSocket that is not read while it waits), whose own buffer is
    /// bounded.
    Unbounded,
}

/// The buffer and the task that writes it out.
#[derive(Debug, Default)]
pub(crate) struct InputBuffer {
    limits: OnceLock<Gate>,
    queue: Arc<parking_lot::Mutex<Queue>>,
}

#[derive(Debug)]
struct Gate {
    limits: InputLimits,
    room: Arc<Semaphore>,
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Item>,
    /// A task is writing the items out.
    draining: bool,
    /// Stdin was closed (by a caller or because a write failed): nothing more is
    /// accepted.
    closed: bool,
}

#[derive(Debug)]
enum Item {
    Data(Vec<u8>, Held),
    Close,
}

/// Room a queued chunk holds until it has been written.
#[derive(Debug)]
struct Held {
    _process: OwnedSemaphorePermit,
    _tenant: Option<OwnedSemaphorePermit>,
}

impl InputBuffer {
    /// Sets the limits; the first call wins, and only before the first write.
    pub(crate) fn limit(&self, limits: InputLimits) {
        let _ = self.limits.set(Gate::new(limits));
    }

    fn gate(&self) -> &Gate {
        self.limits
            .get_or_init(|| Gate::new(InputLimits::default()))
    }

    /// Whether stdin was closed through this buffer (or broke).
    pub(crate) fn closed(&self) -> bool {
        self.queue.lock().closed
    }

    /// Queues `data` for the process once there is room (see the module's docs).
    pub(crate) async fn send(
        &self,
        control: &Arc<dyn ProcessControl>,
        data: Vec<u8>,
        wait: InputWait,
    ) -> Result<()> {
        if self.closed() || !control.input_open() {
            return Err(stdin_closed());
        }
        if data.is_empty() {
            return Ok(());
        }
        let gate = self.gate();
        let held = gate.room_for(data.len(), wait).await?;
        let mut q = self.queue.lock();
        if q.closed {
            return Err(stdin_closed());
        }
        q.items.push_back(Item::Data(data, held));
        self.start_draining(&mut q, control);
        Ok(())
    }

    /// Closes stdin after the input queued before: nothing more is accepted.
    pub(crate) fn close(&self, control: &Arc<dyn ProcessControl>) {
        let mut q = self.queue.lock();
        if q.closed {
            return;
        }
        q.closed = true;
        q.items.push_back(Item::Close);
        self.start_draining(&mut q, control);
    }

    fn start_draining(&self, q: &mut Queue, control: &Arc<dyn ProcessControl>) {
        if !q.draining {
            q.draining = true;
            tokio::spawn(drain(self.queue.clone(), control.clone()));
        }
    }
}

impl Gate {
    fn new(limits: InputLimits) -> Gate {
        let size = limits.buffer_bytes.clamp(1, u32::MAX as usize);
        Gate {
            room: Arc::new(Semaphore::new(size)),
            limits: InputLimits {
                buffer_bytes: size,
                ..limits
            },
        }
    }

    /// Room for `len` bytes: the tenant's first (at once, unless unbounded), then the
    /// process's (waiting).
    async fn room_for(&self, len: usize, wait: InputWait) -> Result<Held> {
        let tenant = match &self.limits.tenant {
            None => None,
            Some(budget) => {
                let want = (len as u64).min(budget.limit()).min(u64::from(u32::MAX)) as u32;
                let sem = budget.bytes.clone();
                Some(match wait {
                    InputWait::Bounded => sem.try_acquire_many_owned(want).map_err(|_| {
                        Error::new(
                            ErrorCode::RateLimited,
                            format!(
                                "this tenant's processes already have {} bytes of input waiting to be read (limiter.max_input_bytes_per_tenant); wait for them to read it, or close or kill the ones that do not read",
                                budget.limit() - budget.available()
                            ),
                        )
                        .with_retry_after_ms(RETRY_AFTER_MS)
                    })?,
                    InputWait::Unbounded => sem
                        .acquire_many_owned(want)
                        .await
                        .map_err(|_| stdin_closed())?,
                })
            }
        };
        let want = len.min(self.limits.buffer_bytes) as u32;
        let process = self.room.clone().acquire_many_owned(want);
        let process = match wait {
            InputWait::Bounded => match tokio::time::timeout(self.limits.wait, process).await {
                Ok(p) => p,
                Err(_) => {
                    return Err(Error::new(
                        ErrorCode::RateLimited,
                        format!(
                            "the process has not read the input already sent to it ({} bytes wait, its buffer's size: limiter.max_input_bytes_per_process) for {} ms; send more once it reads, or close its stdin or kill it",
                            self.limits.buffer_bytes - self.room.available_permits(),
                            self.limits.wait.as_millis()
                        ),
                    )
                    .with_retry_after_ms(RETRY_AFTER_MS))
                }
            },
            InputWait::Unbounded => process.await,
        }
        .map_err(|_| stdin_closed())?;
        Ok(Held {
            _process: process,
            _tenant: tenant,
        })
    }
}

/// Writes the queued input out in order; ends when the queue is empty, or for good
/// when a write fails (the process closed its stdin or exited): what is queued is
/// dropped and later writes are refused.
async fn drain(queue: Arc<parking_lot::Mutex<Queue>>, control: Arc<dyn ProcessControl>) {
    // A task dropped midway (its runtime shut down) lets the next write start another;
    // one that ends by itself has said so under the lock.
    struct Draining(Arc<parking_lot::Mutex<Queue>>, bool);
    impl Drop for Draining {
        fn drop(&mut self) {
            if self.1 {
                self.0.lock().draining = false;
            }
        }
    }
    let mut draining = Draining(queue.clone(), true);
    loop {
        let item = {
            let mut q = queue.lock();
            match q.items.pop_front() {
                Some(item) => item,
                None => {
                    q.draining = false;
                    draining.1 = false;
                    return;
                }
            }
        };
        match item {
            Item::Data(data, held) => {
                let written = control.write(&data).await;
                drop((data, held));
                if written.is_err() {
                    let mut q = queue.lock();
                    q.closed = true;
                    q.items.clear();
                    q.draining = false;
                    draining.1 = false;
                    return;
                }
            }
            Item::Close => {
                let _ = control.close_stdin().await;
            }
        }
    }
}

/// `STREAM_CLOSED` for a write to a closed stdin.
pub(crate) fn stdin_closed() -> Error {
    Error::new(
        ErrorCode::StreamClosed,
        "the process's stdin is closed (start it with stdin: true to write to it; it closes on close_stdin and when the process exits)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::TenantBudget;
    use async_trait::async_trait;

    /// A process that reads nothing until `reading` is set, then everything.
    #[derive(Debug, Default)]
    struct Reader {
        reading: tokio::sync::Notify,
        open: std::sync::atomic::AtomicBool,
        read: parking_lot::Mutex<Vec<u8>>,
        closed: std::sync::atomic::AtomicBool,
        broken: std::sync::atomic::AtomicBool,
    }

    impl Reader {
        fn start(&self) {
            self.open.store(true, std::sync::atomic::Ordering::SeqCst);
            self.reading.notify_waiters();
        }
    }

    #[async_trait]
    impl ProcessControl for Reader {
        async fn write(&self, data: &[u8]) -> Result<()> {
            while !self.open.load(std::sync::atomic::Ordering::SeqCst) {
                let woken = self.reading.notified();
                if self.open.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                woken.await;
            }
            if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(stdin_closed());
            }
            self.read.lock().extend_from_slice(data);
            Ok(())
        }
        async fn close_stdin(&self) -> Result<()> {
            self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
        fn signal(&self, _: i32) -> Result<()> {
            Ok(())
        }
    }

    fn limits(buffer_bytes: usize, wait_ms: u64, tenant: Option<TenantBudget>) -> InputLimits {
        InputLimits {
            buffer_bytes,
            wait: Duration::from_millis(wait_ms),
            tenant,
        }
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what} did not happen within 5 s");
    }

    #[tokio::test]
    async fn writers_past_the_buffer_are_refused_and_the_accepted_are_delivered() {
        let reader = Arc::new(Reader::default());
        let control: Arc<dyn ProcessControl> = reader.clone();
        let buffer = Arc::new(InputBuffer::default());
        buffer.limit(limits(10, 50, None));
        let writes: Vec<_> = (0..20u8)
            .map(|i| {
                let (buffer, control) = (buffer.clone(), control.clone());
                tokio::spawn(async move {
                    buffer
                        .send(&control, vec![i; 4], InputWait::Bounded)
                        .await
                        .map(|()| i)
                })
            })
            .collect();
        let mut accepted = Vec::new();
        for w in writes {
            match w.await.unwrap() {
                Ok(i) => accepted.push(i),
                Err(e) => {
                    assert_eq!(e.code, ErrorCode::RateLimited, "{e}");
                    assert!(e.message.contains("has not read"), "{}", e.message);
                }
            }
        }
        assert_eq!(accepted.len(), 2, "10 bytes of room hold two 4-byte chunks");
        assert!(reader.read.lock().is_empty(), "nothing was read yet");
        // The process starts reading: what was accepted reaches it, and it takes
        // more input again.
        reader.start();
        until("the accepted input's delivery", || {
            reader.read.lock().len() == 8
        })
        .await;
        buffer
            .send(&control, b"more".to_vec(), InputWait::Bounded)
            .await
            .unwrap();
        buffer.close(&control);
        until("the close", || {
            reader.closed.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await;
        let read = reader.read.lock().clone();
        assert_eq!(&read[8..], b"more", "in order, before the close");
        assert_eq!(
            buffer
                .send(&control, b"late".to_vec(), InputWait::Bounded)
                .await
                .unwrap_err()
                .code,
            ErrorCode::StreamClosed
        );
    }

    #[tokio::test]
    async fn a_chunk_larger_than_the_buffer_waits_alone() {
        let reader = Arc::new(Reader::default());
        let control: Arc<dyn ProcessControl> = reader.clone();
        let buffer = InputBuffer::default();
        buffer.limit(limits(4, 20, None));
        buffer
            .send(&control, vec![1; 100], InputWait::Bounded)
            .await
            .unwrap();
        let e = buffer
            .send(&control, vec![2; 1], InputWait::Bounded)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::RateLimited);
        reader.start();
        until("the delivery", || reader.read.lock().len() == 100).await;
    }

    #[tokio::test]
    async fn a_tenant_over_its_budget_is_refused_at_once_on_every_process() {
        let tenant = TenantBudget::alone(10);
        let stuck = Arc::new(Reader::default());
        let stuck_control: Arc<dyn ProcessControl> = stuck.clone();
        let first = InputBuffer::default();
        first.limit(limits(8, 60_000, Some(tenant.clone())));
        first
            .send(&stuck_control, vec![0; 8], InputWait::Bounded)
            .await
            .unwrap();
        let other = Arc::new(Reader::default());
        other.start();
        let other_control: Arc<dyn ProcessControl> = other.clone();
        let second = InputBuffer::default();
        second.limit(limits(8, 60_000, Some(tenant.clone())));
        // 2 bytes of the tenant's 10 are left: a 4-byte chunk is refused without
        // waiting for the stuck process (whose wait would be a minute).
        let e = second
            .send(&other_control, vec![1; 4], InputWait::Bounded)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert!(
            e.message.contains("max_input_bytes_per_tenant"),
            "{}",
            e.message
        );
        second
            .send(&other_control, vec![1; 2], InputWait::Bounded)
            .await
            .unwrap();
        until("the reader's input", || other.read.lock().len() == 2).await;
        // Its bytes come back once read.
        until("the budget's return", || tenant.available() == 2).await;
    }

    #[tokio::test]
    async fn a_broken_stdin_drops_what_waits_and_refuses_more() {
        let reader = Arc::new(Reader::default());
        reader
            .broken
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let control: Arc<dyn ProcessControl> = reader.clone();
        let tenant = TenantBudget::alone(100);
        let buffer = InputBuffer::default();
        buffer.limit(limits(50, 20, Some(tenant.clone())));
        buffer
            .send(&control, vec![0; 10], InputWait::Bounded)
            .await
            .unwrap();
        reader.start();
        until("the failed write", || buffer.closed()).await;
        assert_eq!(
            buffer
                .send(&control, vec![0; 1], InputWait::Bounded)
                .await
                .unwrap_err()
                .code,
            ErrorCode::StreamClosed
        );
        assert_eq!(
            tenant.available(),
            100,
            "nothing is held for a broken stdin"
        );
    }
}

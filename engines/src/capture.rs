//! Reading a program's output: streamed to a sink as it arrives, kept up to a cap,
//! drained (and dropped) past it so the program never blocks on a full pipe and the
//! host never holds more than the cap.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use paddock_core::budget::OutputAllowance;
use paddock_core::{OutputChunk, OutputSink, StreamKind};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio::time::Instant;

/// Bytes read from a pipe at a time.
const READ_SIZE: usize = 64 * 1024;

pub use paddock_core::output::truncation_marker;

/// What one stream produced.
#[derive(Debug, Default)]
pub struct Captured {
    /// The kept bytes (at most the cap), followed by the marker if truncated.
    pub data: Vec<u8>,
    /// Whether output went past the cap.
    pub truncated: bool,
    /// Every byte the program wrote, kept or not.
    pub total: u64,
    /// The execution's share of its tenant's budget of retained output, if any.
    allowance: Option<Arc<OutputAllowance>>,
}

impl Captured {
    /// A capture that also keeps within `allowance` (the tenant's budget of retained
    /// output, [`OutputSink::allowance`]): past what it grants, output is cut as at
    /// the cap.
    pub fn within(allowance: Option<Arc<OutputAllowance>>) -> Captured {
        Captured {
            allowance,
            ..Captured::default()
        }
    }

    /// Counts `bytes`, keeps what fits under `cap` and the allowance (adding the
    /// truncation marker at the first byte past either) and returns what to stream:
    /// the kept bytes, plus the marker when this piece crossed the cap; nothing once
    /// output is truncated.
    pub fn keep(&mut self, bytes: &[u8], cap: u64) -> Vec<u8> {
        self.total += bytes.len() as u64;
        if self.truncated {
            return Vec::new();
        }
        let room =
            usize::try_from(cap.saturating_sub(self.data.len() as u64)).unwrap_or(usize::MAX);
        let mut take = bytes.len().min(room);
        let mut cut_at = cap;
        if let Some(a) = &self.allowance {
            let granted = a.take(take as u64) as usize;
            if granted < take {
                take = granted;
                cut_at = (self.data.len() + granted) as u64;
            }
        }
        let mut deliver = bytes[..take].to_vec();
        self.data.extend_from_slice(&bytes[..take]);
        if take < bytes.len() {
            self.truncated = true;
            let marker = truncation_marker(cut_at);
            self.data.extend_from_slice(marker.as_bytes());
            deliver.extend_from_slice(marker.as_bytes());
        }
        deliver
    }

    /// The kept output as text.
    pub fn into_string(self) -> String {
        match String::from_utf8(self.data) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// How long after the stop deadline a stalled subscriber may hold back delivery before
/// the engine stops streaming to it (the result still carries the output).
pub const DELIVERY_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads `fd` to EOF, or until the `stop` deadline passes while waiting for more bytes
/// (a writer that outlived the program must not hold the execution open).
///
/// Only waiting for *more* bytes is cut short by `stop`: bytes already in the pipe are
/// read, and a chunk already read is delivered to the sink — the subscriber gets every
/// byte in order — unless the sink stalls past `stop + DELIVERY_GRACE`, after which
/// streaming ends for it and the rest is only captured. Reading itself ends at
/// `stop + DELIVERY_GRACE` at the latest (the output is then marked truncated), so a
/// descendant that escaped the kill and writes forever cannot hold the execution.
pub async fn pump(
    fd: OwnedFd,
    stream: StreamKind,
    cap: u64,
    sink: &dyn OutputSink,
    mut stop: watch::Receiver<Option<Instant>>,
) -> std::io::Result<Captured> {
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?;
    let mut out = Captured::within(sink.allowance());
    let mut sink_open = true;
    let mut buf = vec![0u8; READ_SIZE];
    loop {
        // A writer that escaped the kill and keeps writing must not hold the
        // execution open: past the stop deadline plus the delivery grace, reading
        // ends even while bytes keep coming, and the output is marked truncated.
        if let Some(at) = *stop.borrow() {
            if Instant::now() >= at + DELIVERY_GRACE {
                out.truncated = true;
                return Ok(out);
            }
        }
        // Read: interrupted by the stop deadline only while no byte is available.
        let n = loop {
            let deadline = *stop.borrow();
            match deadline {
                Some(at) => match tokio::time::timeout_at(at, pipe.read(&mut buf)).await {
                    Ok(r) => break r?,
                    Err(_) => return Ok(out),
                },
                None => tokio::select! {
                    r = pipe.read(&mut buf) => break r?,
                    changed = stop.changed() => {
                        if changed.is_err() {
                            return Ok(out);
                        }
                    }
                },
            }
        };
        if n == 0 {
            return Ok(out);
        }
        let deliver = out.keep(&buf[..n], cap);
        if sink_open && !deliver.is_empty() {
            let chunk = OutputChunk {
                stream,
                data: deliver,
            };
            sink_open = deliver_chunk(sink, chunk, &mut stop).await;
        }
    }
}

/// Delivers one chunk, waiting for the sink; gives up (returns `false`) when the sink
/// fails or stalls past the stop deadline plus [`DELIVERY_GRACE`].
async fn deliver_chunk(
    sink: &dyn OutputSink,
    chunk: OutputChunk,
    stop: &mut watch::Receiver<Option<Instant>>,
) -> bool {
    let delivery = sink.chunk(chunk);
    tokio::pin!(delivery);
    loop {
        let deadline = *stop.borrow();
        match deadline {
            Some(at) => {
                return matches!(
                    tokio::time::timeout_at(at + DELIVERY_GRACE, &mut delivery).await,
                    Ok(Ok(()))
                )
            }
            None => tokio::select! {
                r = &mut delivery => return r.is_ok(),
                changed = stop.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::Write;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Collect(Mutex<Vec<OutputChunk>>);

    #[async_trait::async_trait]
    impl OutputSink for Collect {
        async fn chunk(&self, chunk: OutputChunk) -> paddock_core::Result<()> {
            self.0.lock().unwrap().push(chunk);
            Ok(())
        }
    }

    #[tokio::test]
    async fn caps_marks_and_drains() {
        let (r, w) = crate::host::sys::pipe().unwrap();
        let writer = std::thread::spawn(move || {
            let mut f = std::fs::File::from(w);
            for _ in 0..64 {
                f.write_all(&[b'x'; 16 * 1024]).unwrap();
            }
        });
        let sink = Collect::default();
        let (_tx, rx) = watch::channel(None);
        let got = pump(r, StreamKind::Stdout, 1000, &sink, rx).await.unwrap();
        writer.join().unwrap();
        assert!(got.truncated);
        assert_eq!(got.total, 64 * 16 * 1024);
        let marker = truncation_marker(1000);
        assert_eq!(got.data.len(), 1000 + marker.len());
        let streamed: usize = sink.0.lock().unwrap().iter().map(|c| c.data.len()).sum();
        assert_eq!(streamed, got.data.len());
    }

    #[tokio::test]
    async fn stop_deadline_ends_a_pipe_held_open() {
        let (r, w) = crate::host::sys::pipe().unwrap();
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(async move {
            let sink = paddock_core::DiscardSink;
            pump(r, StreamKind::Stderr, 10, &sink, rx).await
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        tx.send(Some(Instant::now() + std::time::Duration::from_millis(10)))
            .unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("pump did not stop")
            .unwrap()
            .unwrap();
        assert_eq!(got.total, 0);
        drop(w);
    }

    #[test]
    fn kept_output_stops_where_the_tenants_budget_runs_out() {
        use paddock_core::budget::{OutputAllowance, TenantBudget};
        let tenant = TenantBudget::alone(10);
        let first = Arc::new(OutputAllowance::new(tenant.clone()));
        let mut a = Captured::within(Some(first.clone()));
        assert_eq!(a.keep(b"12345678", 100), b"12345678");
        let second = Arc::new(OutputAllowance::new(tenant.clone()));
        let mut b = Captured::within(Some(second.clone()));
        let streamed = b.keep(b"abcdef", 100);
        assert!(b.truncated, "the budget cut it");
        assert!(second.cut());
        assert!(streamed.starts_with(b"ab\n[output truncated at 2 bytes]"));
        assert!(
            b.keep(b"more", 100).is_empty(),
            "nothing is kept past the cut"
        );
        assert_eq!(b.total, 10, "every byte is counted");
        assert!(!a.truncated);
        drop((a, b, first, second));
        assert_eq!(
            tenant.available(),
            10,
            "an ended execution gives its bytes back"
        );
    }

    #[test]
    fn kept_output_stops_at_the_cap_with_a_marker() {
        let mut kept = Captured::default();
        assert_eq!(kept.keep(b"hello", 8), b"hello");
        let streamed = kept.keep(b" world", 8);
        assert!(streamed.starts_with(b" wo"));
        assert!(kept.truncated);
        assert!(kept.keep(b"more", 8).is_empty());
        assert_eq!(kept.total, 15, "every byte is counted");
        assert!(kept
            .into_string()
            .starts_with("hello wo\n[output truncated at 8 bytes]"));
    }
}

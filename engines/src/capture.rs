//! Reading a program's output: streamed to a sink as it arrives, kept up to a cap,
//! drained (and dropped) past it so the program never blocks on a full pipe and the
//! host never holds more than the cap.

use std::os::fd::OwnedFd;

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
}

impl Captured {
    /// The kept output as text.
    pub fn into_string(self) -> String {
        match String::from_utf8(self.data) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// Reads `fd` to EOF, or until the `stop` deadline passes (a writer that outlived the
/// program must not hold the execution open).
pub async fn pump(
    fd: OwnedFd,
    stream: StreamKind,
    cap: u64,
    sink: &dyn OutputSink,
    mut stop: watch::Receiver<Option<Instant>>,
) -> std::io::Result<Captured> {
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?;
    let mut out = Captured::default();
    let mut sink_open = true;
    let mut buf = vec![0u8; READ_SIZE];
    loop {
        let step = async {
            let n = pipe.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            out.total += n as u64;
            let room = cap.saturating_sub(out.data.len() as u64) as usize;
            let mut deliver = Vec::new();
            if !out.truncated {
                let keep = room.min(n);
                out.data.extend_from_slice(&buf[..keep]);
                deliver.extend_from_slice(&buf[..keep]);
                if keep < n {
                    out.truncated = true;
                    let marker = truncation_marker(cap);
                    out.data.extend_from_slice(marker.as_bytes());
                    deliver.extend_from_slice(marker.as_bytes());
                }
            }
            if sink_open && !deliver.is_empty() {
                let chunk = OutputChunk {
                    stream,
                    data: deliver,
                };
                if sink.chunk(chunk).await.is_err() {
                    sink_open = false;
                }
            }
            Ok(true)
        };
        let deadline = *stop.borrow();
        let more = match deadline {
            Some(at) => match tokio::time::timeout_at(at, step).await {
                Ok(r) => r?,
                Err(_) => false,
            },
            None => {
                tokio::select! {
                    r = step => r?,
                    changed = stop.changed() => {
                        if changed.is_err() {
                            // The sender is gone: treat as an immediate stop.
                            false
                        } else {
                            true
                        }
                    }
                }
            }
        };
        if !more {
            return Ok(out);
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
        let (r, w) = crate::sys::pipe().unwrap();
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
        let (r, w) = crate::sys::pipe().unwrap();
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
}

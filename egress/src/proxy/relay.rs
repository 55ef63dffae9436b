//! The relay of an admitted connection: bytes moved both ways in the kernel and
//! counted.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::log::Counters;

/// Copies both ways between the sandbox's `client` and `upstream`, counting bytes;
/// `first` (bytes already read from the client) goes first. The bytes move in the
/// kernel (`splice` through a pipe per direction), never through a buffer here.
pub(super) async fn pump(
    client: TcpStream,
    upstream: TcpStream,
    first: Vec<u8>,
    counters: Arc<Counters>,
) {
    let up = async {
        if write_all(&upstream, &first).await.is_ok() {
            counters
                .out
                .fetch_add(first.len() as u64, Ordering::Relaxed);
            let _ = relay(&client, &upstream, &counters.out).await;
        }
        crate::sys::shutdown_write(upstream.as_raw_fd());
    };
    let down = async {
        let _ = relay(&upstream, &client, &counters.r#in).await;
        crate::sys::shutdown_write(client.as_raw_fd());
    };
    tokio::join!(up, down);
    counters.closed.store(true, Ordering::Release);
}

/// Writes all of `bytes` to `to`.
async fn write_all(to: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        to.writable().await?;
        match to.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Moves everything `from` sends to `to` until `from` ends (or either fails),
/// adding the bytes to `count`.
async fn relay(from: &TcpStream, to: &TcpStream, count: &AtomicU64) -> std::io::Result<()> {
    use tokio::io::Interest;
    let (pipe_r, pipe_w) = crate::sys::splice_pipe()?;
    loop {
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                crate::sys::splice(from.as_raw_fd(), pipe_w.as_raw_fd(), 1 << 20)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                crate::sys::splice(pipe_r.as_raw_fd(), to.as_raw_fd(), left)
            }) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}

//! Small async helpers the engines share.

use std::os::fd::OwnedFd;

use paddock_core::{Error, ErrorCode, Result};
use tokio::sync::watch;
use tokio::time::Instant;

/// Runs `f` on tokio's blocking pool; works on any runtime flavour.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        Error::new(
            ErrorCode::EngineFailed,
            format!("a blocking engine task failed: {e}"),
        )
    })?
}

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes `data` into a program's stdin pipe. A program that exits without reading
/// closes the pipe: not an error. A reader that outlives the program (an escaped
/// descendant that never reads) must not hold the execution open: writing stops
/// when `stop` is set (the program is gone).
pub(crate) async fn feed_stdin(
    pipe: Option<OwnedFd>,
    data: Option<Vec<u8>>,
    mut stop: watch::Receiver<Option<Instant>>,
) {
    let (Some(fd), Some(data)) = (pipe, data) else {
        return;
    };
    use tokio::io::AsyncWriteExt;
    let Ok(mut tx) = tokio::net::unix::pipe::Sender::from_owned_fd(fd) else {
        return;
    };
    tokio::select! {
        _ = tx.write_all(&data) => {}
        _ = stop.wait_for(Option::is_some) => {}
    }
}

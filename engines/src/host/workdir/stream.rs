//! Streaming transfers: a file read or written through one buffer of
//! [`STREAM_BUFFER_BYTES`], whatever its size.

use std::io::Write;
use std::sync::Arc;

use paddock_core::files::{source_failed, too_long};
use paddock_core::{ByteSource, FileReader, Result};
use tokio::io::AsyncReadExt;

use super::resolve::map_io;
use super::{Workdir, STREAM_BUFFER_BYTES};
use crate::task::blocking;

impl Workdir {
    /// A streaming read of `path` (see [`Sandbox::open_read`]): opened as
    /// [`open_file`](Workdir::open_file) opens it, then read through one buffer of
    /// [`STREAM_BUFFER_BYTES`], at most the size it had when opened. No size limit.
    ///
    /// [`Sandbox::open_read`]: paddock_core::Sandbox::open_read
    pub async fn open_read(self: &Arc<Self>, path: &str) -> Result<FileReader> {
        let (workdir, owned) = (self.clone(), path.to_string());
        let (file, size) = blocking(move || workdir.open_file(&owned)).await?;
        let mut file = tokio::fs::File::from_std(file);
        file.set_max_buf_size(STREAM_BUFFER_BYTES);
        Ok(FileReader::new(size, Box::pin(file.take(size))))
    }

    /// A streaming write of `source` to `path` (see [`Sandbox::write_from`]): the file
    /// is created as [`write_file`](Workdir::write_file) creates it, then filled one
    /// buffer of [`STREAM_BUFFER_BYTES`] at a time; never more than `max_bytes` reach
    /// it. Any refusal removes the file.
    ///
    /// `admit` is asked before each step that touches the workdir and its guard is
    /// held only during that step, so a destroy waits for one buffer's write at most,
    /// never for a slow source; an `admit` error ends the write (for a source that
    /// stalls, when it next yields bytes or ends).
    ///
    /// [`Sandbox::write_from`]: paddock_core::Sandbox::write_from
    pub async fn write_from<G>(
        self: &Arc<Self>,
        path: &str,
        mut source: ByteSource,
        max_bytes: u64,
        admit: impl Fn() -> Result<G>,
    ) -> Result<u64> {
        let guard = admit()?;
        let (workdir, owned) = (self.clone(), path.to_string());
        let mut new = blocking(move || workdir.create_file(&owned)).await?;
        drop(guard);
        let mut buf = vec![0u8; STREAM_BUFFER_BYTES];
        let mut written: u64 = 0;
        let ended: Result<()> = loop {
            // One byte past the limit is enough to tell that the source is too long.
            let room = max_bytes.saturating_sub(written).saturating_add(1);
            let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            let n = match source.read(&mut buf[..want]).await {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) => break Err(source_failed(path, written, &e)),
            };
            if written + n as u64 > max_bytes {
                break Err(too_long(path, max_bytes));
            }
            let guard = match admit() {
                Ok(g) => g,
                Err(e) => break Err(e),
            };
            let shown = path.to_string();
            let (back, back_buf, wrote) = blocking(move || {
                let wrote = (&new.file)
                    .write_all(&buf[..n])
                    .map_err(|e| map_io(e, &shown));
                Ok((new, buf, wrote))
            })
            .await?;
            drop(guard);
            (new, buf) = (back, back_buf);
            if let Err(e) = wrote {
                break Err(e);
            }
            written += n as u64;
        };
        match ended {
            Ok(()) => Ok(written),
            Err(e) => {
                blocking(move || {
                    new.discard();
                    Ok(())
                })
                .await?;
                Err(e)
            }
        }
    }
}

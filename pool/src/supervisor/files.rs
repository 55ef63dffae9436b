//! Session messages served by one engine method each: files (whole and streamed),
//! the file operations (stat, list, make, move, remove, watch), pause and unpause.
//! None takes an execution permit or writes an execution audit entry: they run no
//! program.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use paddock_core::Error;

use crate::messages::*;

use super::{Busy, Session, Supervisor};

/// A session message handled by one engine method, called through the engine actor.
macro_rules! session_op {
    ($msg:ty, $out:ty, $what:literal, |$s:ident, $m:ident| $body:expr) => {
        impl Handler<$msg> for Supervisor {
            type Result = ResponseFuture<Result<$out, Error>>;

            fn handle(&mut self, $m: $msg, _ctx: &mut Self::Context) -> Self::Result {
                let session = match self.session_for(&$m.caller, &$m.sandbox) {
                    Ok(s) => s,
                    Err(e) => return Box::pin(async move { Err(e) }),
                };
                let call = session.call($what, move |$s| Box::pin($body));
                Box::pin(async move {
                    // The session (so its instance) is not recycled while a call on
                    // it runs: a write never lands in the next session's files.
                    let _held = session;
                    call.await
                })
            }
        }
    };
}

session_op!(WriteFile, (), "write_file", |sb, msg| async move {
    sb.write_file(&msg.path, &msg.data).await
});
session_op!(ReadFile, Vec<u8>, "read_file", |sb, msg| async move {
    sb.read_file(&msg.path).await
});
impl Handler<OpenRead> for Supervisor {
    type Result = ResponseFuture<Result<paddock_core::FileReader, Error>>;

    fn handle(&mut self, msg: OpenRead, _ctx: &mut Self::Context) -> Self::Result {
        let session = match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        Box::pin(async move {
            let path = msg.path;
            let reader = session
                .call("open_read", move |sb| {
                    Box::pin(async move { sb.open_read(&path).await })
                })
                .await?;
            // Ended while it opened: no reader of a session that is going.
            if session.ended.borrow().is_some() {
                return Err(Error::disposed("the sandbox"));
            }
            // The sandbox counts as in use until the reader is done.
            let guard = Transfer::new(&session);
            Ok(paddock_core::FileReader::new(
                reader.size,
                Box::pin(Guarded {
                    inner: reader.reader,
                    _guard: guard,
                }),
            ))
        })
    }
}

impl Handler<WriteFrom> for Supervisor {
    type Result = ResponseFuture<Result<u64, Error>>;

    fn handle(&mut self, msg: WriteFrom, _ctx: &mut Self::Context) -> Self::Result {
        let session = match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        Box::pin(async move {
            // In use while the upload lasts.
            let _busy = Busy::new(session.clone());
            let WriteFrom {
                path,
                source,
                max_bytes,
                ..
            } = msg;
            session
                .call("write_from", move |sb| {
                    Box::pin(async move { sb.write_from(&path, source, max_bytes).await })
                })
                .await
        })
    }
}

/// A download of a session's file in progress, counted so that idle expiry spares
/// the session; it notes when it ended.
struct Transfer {
    count: Arc<std::sync::atomic::AtomicUsize>,
    ended_ms: Arc<AtomicU64>,
    opened: Instant,
}

impl Transfer {
    fn new(session: &Session) -> Transfer {
        session.transfers.fetch_add(1, Ordering::AcqRel);
        Transfer {
            count: session.transfers.clone(),
            ended_ms: session.transfer_ended_ms.clone(),
            opened: session.opened,
        }
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        self.ended_ms.fetch_max(ms, Ordering::AcqRel);
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A reader that holds a [`Transfer`] while it lives.
struct Guarded {
    inner: paddock_core::ByteSource,
    _guard: Transfer,
}

impl tokio::io::AsyncRead for Guarded {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.inner.as_mut().poll_read(cx, buf)
    }
}
session_op!(PauseSandbox, (), "pause", |sb, _msg| async move {
    sb.pause().await
});
session_op!(UnpauseSandbox, (), "unpause", |sb, _msg| async move {
    sb.unpause().await
});
session_op!(
    ListFiles,
    Vec<paddock_core::FileEntry>,
    "list_files",
    |sb, msg| async move { sb.list_files(&msg.path).await }
);
session_op!(
    StatPath,
    paddock_core::FileInfo,
    "stat",
    |sb, msg| async move { sb.stat(&msg.path).await }
);
session_op!(
    ListDir,
    Vec<paddock_core::FileInfo>,
    "list_dir",
    |sb, msg| async move { sb.list_dir(&msg.path, msg.depth).await }
);
session_op!(MakeDir, bool, "make_dir", |sb, msg| async move {
    sb.make_dir(&msg.path).await
});
session_op!(MovePath, (), "rename", |sb, msg| async move {
    sb.rename(&msg.from, &msg.to).await
});
session_op!(
    GetUsage,
    paddock_core::SandboxUsage,
    "usage",
    |sb, _msg| async move { sb.usage().await }
);
session_op!(SetMetadata, (), "set_metadata", |sb, msg| async move {
    sb.set_metadata(&msg.path, &msg.metadata).await
});
session_op!(RemovePath, (), "remove", |sb, msg| async move {
    sb.remove(&msg.path).await
});

impl Handler<WatchDir> for Supervisor {
    type Result = ResponseFuture<Result<paddock_core::FileWatch, Error>>;

    fn handle(&mut self, msg: WatchDir, _ctx: &mut Self::Context) -> Self::Result {
        let session = match self.session_for(&msg.caller, &msg.sandbox) {
            Ok(s) => s,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        Box::pin(async move {
            let WatchDir {
                path, recursive, ..
            } = msg;
            let watch = session
                .call("watch", move |sb| {
                    Box::pin(async move { sb.watch(&path, recursive).await })
                })
                .await?;
            // Ended while it started: no watch of a session that is going (the
            // engine's recycle ends the watches that were already there).
            if session.ended.borrow().is_some() {
                return Err(Error::disposed("the sandbox"));
            }
            Ok(watch)
        })
    }
}

//! Files of a sandbox: streaming transfer between a caller and a sandbox's workdir,
//! and the file operations' types (entries, watches and their events).
//!
//! [`Sandbox::open_read`](crate::Sandbox::open_read) hands out a [`FileReader`]: the
//! file's size and a stream of its bytes. [`Sandbox::write_from`](crate::Sandbox::write_from)
//! takes a [`ByteSource`] and a byte limit. Engines that implement them hold one
//! bounded buffer per transfer, whatever the file's size; the trait's defaults (for
//! engines that do not) go through `read_file` and `write_file` and hold the whole
//! file in memory.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use crate::error::{Error, ErrorCode, Result};

/// A stream of bytes to write into a sandbox, such as an upload's body.
pub type ByteSource = Pin<Box<dyn AsyncRead + Send>>;

/// A file of a sandbox opened for reading: its size when it was opened, and its bytes.
///
/// The reader yields at most `size` bytes: bytes a program appends after the file was
/// opened are not read, and a file that shrinks meanwhile ends early. It implements
/// [`AsyncRead`] itself, so it can be passed to [`tokio::io::copy`] as it is.
pub struct FileReader {
    /// The file's size in bytes when it was opened.
    pub size: u64,
    /// The file's bytes.
    pub reader: ByteSource,
}

impl FileReader {
    /// A reader of `size` bytes from `reader`.
    pub fn new(size: u64, reader: ByteSource) -> FileReader {
        FileReader { size, reader }
    }

    /// A reader over bytes already in memory.
    pub fn from_bytes(data: Vec<u8>) -> FileReader {
        FileReader::new(data.len() as u64, Box::pin(io::Cursor::new(data)))
    }
}

impl fmt::Debug for FileReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileReader")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl AsyncRead for FileReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.reader.as_mut().poll_read(cx, buf)
    }
}

/// What kind of file an entry is (a symlink is itself, never what it points to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// One entry of [`Sandbox::stat`](crate::Sandbox::stat) and
/// [`Sandbox::list_dir`](crate::Sandbox::list_dir): what `lstat` says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// The absolute path as the sandbox's programs see it.
    pub path: String,
    /// Its kind.
    pub kind: FileKind,
    /// Size in bytes (a symlink's is the length of its target).
    pub size: u64,
    /// The permission bits (`0o7777` of `st_mode`).
    pub mode: u32,
    /// The owner's uid, as the sandbox's programs see it.
    pub uid: u32,
    /// The group's gid, as the sandbox's programs see it.
    pub gid: u32,
    /// When it was last written.
    pub modified: std::time::SystemTime,
    /// Where a symlink points (as written in it, unresolved).
    pub symlink_target: Option<String>,
    /// Its user metadata (see [`FileMetadata`]); empty when it has none.
    pub metadata: FileMetadata,
}

impl FileInfo {
    /// The last component of the path (`/` for the root).
    pub fn name(&self) -> &str {
        if self.path == "/" {
            return "/";
        }
        self.path
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
    }
}

/// A file's user metadata: keys and values kept as extended attributes of the file
/// in the [`METADATA_XATTR_PREFIX`] namespace, one attribute per key, so that they
/// stay with the file through renames and are seen by the sandbox's own programs
/// (`getfattr`, `os.getxattr`).
pub type FileMetadata = std::collections::BTreeMap<String, String>;

/// The extended attribute namespace of [`FileMetadata`]. It is the one E2B's sandbox
/// daemon uses, so that what tools made for E2B sandboxes set is read the same here.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";

/// The longest key of [`FileMetadata`], in bytes: the kernel's 255-byte limit on an
/// attribute's name, less the prefix.
pub const MAX_METADATA_KEY: usize = 255 - METADATA_XATTR_PREFIX.len();

/// The most bytes a file's metadata may take in all: keys (each with the prefix)
/// plus values, within what one inode keeps for attributes on common file systems.
pub const MAX_METADATA_BYTES: usize = 4096;

/// Checks metadata to be set on a file: keys not empty and at most
/// [`MAX_METADATA_KEY`] bytes, keys and values printable ASCII (`0x20`–`0x7E`), and
/// [`MAX_METADATA_BYTES`] in all. `field` names it in the error
/// (`INVALID_OPTIONS`).
pub fn check_metadata(field: &str, metadata: &FileMetadata) -> Result<()> {
    let printable = |s: &str| s.bytes().all(|b| (0x20..=0x7e).contains(&b));
    let mut total = 0usize;
    for (key, value) in metadata {
        if key.is_empty() {
            return Err(Error::invalid_options(field, "a key is empty"));
        }
        if !printable(key) {
            return Err(Error::invalid_options(
                field,
                format!("key {key:?} has a byte outside printable ASCII (0x20-0x7E)"),
            ));
        }
        if key.len() > MAX_METADATA_KEY {
            // Printable ASCII: any byte is a character boundary.
            return Err(Error::invalid_options(
                field,
                format!(
                    "key `{}…` is {} bytes; at most {MAX_METADATA_KEY}",
                    &key[..16],
                    key.len()
                ),
            ));
        }
        if !printable(value) {
            return Err(Error::invalid_options(
                field,
                format!("the value of `{key}` has a byte outside printable ASCII (0x20-0x7E)"),
            ));
        }
        total += METADATA_XATTR_PREFIX.len() + key.len() + value.len();
    }
    if total > MAX_METADATA_BYTES {
        return Err(Error::invalid_options(
            field,
            format!("{total} bytes in all (keys with their prefix, and values); at most {MAX_METADATA_BYTES}"),
        ));
    }
    Ok(())
}

/// What happened to a watched path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileEventKind {
    /// It was created (or moved in under this name).
    Create,
    /// Its contents were written.
    Write,
    /// It was removed.
    Remove,
    /// It was moved away from this name (the new name, when watched, comes as a
    /// [`Create`](FileEventKind::Create)).
    Rename,
    /// Its permissions, owner or other attributes changed.
    Chmod,
}

/// One change [`Sandbox::watch`](crate::Sandbox::watch) reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEvent {
    /// The absolute path, as the sandbox's programs see it.
    pub path: String,
    /// What happened.
    pub kind: FileEventKind,
}

/// Most events a [`FileWatch`] holds before its reader takes them; past that, events
/// are dropped and counted ([`FileWatch::dropped`]).
pub const WATCH_BUFFER_EVENTS: usize = 1024;

/// A watch over a directory: the changes below it, as they happen, in a bounded
/// buffer. Dropping it stops the watch (and frees what the engine holds for it).
///
/// The stream ends (`next` answers `None`) when the watched directory goes, the
/// sandbox is recycled or destroyed, or the engine stops the watch.
pub struct FileWatch {
    events: tokio::sync::mpsc::Receiver<FileEvent>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
    _held: Box<dyn std::any::Any + Send + Sync>,
}

impl FileWatch {
    /// A watch that yields what `events` receives, counting in `dropped` the events
    /// the producer could not buffer, and holding `held` (what stops the producer
    /// when dropped) while it lives.
    pub fn new(
        events: tokio::sync::mpsc::Receiver<FileEvent>,
        dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
        held: Box<dyn std::any::Any + Send + Sync>,
    ) -> FileWatch {
        FileWatch {
            events,
            dropped,
            _held: held,
        }
    }

    /// A bounded channel for a watch's producer: its sending end, and the
    /// receiving end for [`FileWatch::new`].
    pub fn channel() -> (
        tokio::sync::mpsc::Sender<FileEvent>,
        tokio::sync::mpsc::Receiver<FileEvent>,
    ) {
        tokio::sync::mpsc::channel(WATCH_BUFFER_EVENTS)
    }

    /// The next change, or `None` when the watch has ended.
    pub async fn next(&mut self) -> Option<FileEvent> {
        self.events.recv().await
    }

    /// The next change already buffered, without waiting.
    pub fn try_next(&mut self) -> Option<FileEvent> {
        self.events.try_recv().ok()
    }

    /// How many events were dropped because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Holds `more` as long as the watch lives too (a caller's guard).
    pub fn holding(self, more: Box<dyn std::any::Any + Send + Sync>) -> FileWatch {
        FileWatch {
            events: self.events,
            dropped: self.dropped,
            _held: Box::new((self._held, more)),
        }
    }
}

impl fmt::Debug for FileWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileWatch")
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

/// `LIMITS_EXCEEDED` for a source longer than `max_bytes`, naming the limit.
pub fn too_long(path: &str, max_bytes: u64) -> Error {
    Error::new(
        ErrorCode::LimitsExceeded,
        format!(
            "the data for `{path}` is longer than the limit of {max_bytes} bytes (max_bytes); nothing was kept: send less, or raise the limit"
        ),
    )
}

/// `INVALID_OPTIONS` for a source that failed after `read` bytes.
pub fn source_failed(path: &str, read: u64, err: &io::Error) -> Error {
    Error::invalid_options(
        "source",
        format!(
            "reading the data for `{path}` failed after {read} bytes ({err}); nothing was kept: send it again"
        ),
    )
}

/// Reads all of `source` into memory, refusing more than `max_bytes`: the default of
/// [`Sandbox::write_from`](crate::Sandbox::write_from). Holds up to `max_bytes`.
pub(crate) async fn read_to_limit(
    path: &str,
    source: ByteSource,
    max_bytes: u64,
) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    source
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut data)
        .await
        .map_err(|e| source_failed(path, data.len() as u64, &e))?;
    if data.len() as u64 > max_bytes {
        return Err(too_long(path, max_bytes));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use async_trait::async_trait;

    use super::*;
    use crate::{
        CancelToken, EngineName, ExecRequest, ExecResult, FileEntry, OutputSink, Sandbox,
        SandboxStatus,
    };

    /// A sandbox with files in memory and nothing else: only the required methods, so
    /// the streaming methods are the trait's defaults.
    #[derive(Debug, Default)]
    struct MemorySandbox {
        files: parking_lot::Mutex<BTreeMap<String, Vec<u8>>>,
    }

    #[async_trait]
    impl Sandbox for MemorySandbox {
        fn id(&self) -> &str {
            "memory"
        }
        fn engine(&self) -> EngineName {
            EngineName::NOOP
        }
        fn root_dir(&self) -> &Path {
            Path::new("/memory")
        }
        fn status(&self) -> SandboxStatus {
            SandboxStatus::Ready
        }
        async fn exec(
            &self,
            _request: ExecRequest,
            _sink: &dyn OutputSink,
            _cancel: CancelToken,
        ) -> Result<ExecResult> {
            Err(Error::new(ErrorCode::CapabilityNotSupported, "no programs"))
        }
        async fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
            if path.starts_with("..") {
                return Err(Error::new(ErrorCode::PathEscape, "outside"));
            }
            self.files.lock().insert(path.to_string(), data.to_vec());
            Ok(())
        }
        async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
            self.files
                .lock()
                .get(path)
                .cloned()
                .ok_or_else(|| Error::new(ErrorCode::NotFound, format!("`{path}` does not exist")))
        }
        async fn list_files(&self, _path: &str) -> Result<Vec<FileEntry>> {
            Ok(Vec::new())
        }
        async fn recycle(&self) -> Result<()> {
            Ok(())
        }
        async fn destroy(&self) -> Result<()> {
            Ok(())
        }
    }

    /// A source of `n` bytes (`i % 251` at position `i`), made as it is read.
    struct Generated {
        n: u64,
        at: u64,
    }

    impl AsyncRead for Generated {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            while self.at < self.n && buf.remaining() > 0 {
                buf.put_slice(&[(self.at % 251) as u8]);
                self.at += 1;
            }
            Poll::Ready(Ok(()))
        }
    }

    fn generated(n: u64) -> ByteSource {
        Box::pin(Generated { n, at: 0 })
    }

    /// A source that fails after a few bytes.
    struct Failing;

    impl AsyncRead for Failing {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            _buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, "gone")))
        }
    }

    #[tokio::test]
    async fn the_defaults_go_through_read_file_and_write_file() {
        let sb = MemorySandbox::default();
        let n = sb
            .write_from("gen", generated(10_000), 10_000)
            .await
            .unwrap();
        assert_eq!(n, 10_000);
        let stored = sb.read_file("gen").await.unwrap();
        assert_eq!(stored.len(), 10_000);
        assert!(stored
            .iter()
            .enumerate()
            .all(|(i, b)| *b == (i % 251) as u8));

        let mut reader = sb.open_read("gen").await.unwrap();
        assert_eq!(reader.size, 10_000);
        let mut back = Vec::new();
        reader.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, stored);

        // One byte over the limit: refused, and nothing is written.
        let e = sb
            .write_from("over", generated(101), 100)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::LimitsExceeded, "{e}");
        assert!(e.message.contains("100 bytes"), "{e}");
        assert_eq!(
            sb.read_file("over").await.unwrap_err().code,
            ErrorCode::NotFound
        );
        assert_eq!(sb.write_from("empty", generated(0), 0).await.unwrap(), 0);

        let e = sb
            .write_from("failing", Box::pin(Failing), 100)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}");
        // The write_file's and read_file's errors come through as they are.
        let e = sb.write_from("../x", generated(1), 10).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::PathEscape);
        let e = sb.open_read("missing").await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
    }

    #[tokio::test]
    async fn a_file_reader_reads_what_it_holds() {
        let mut r = FileReader::from_bytes(b"abc".to_vec());
        assert_eq!(r.size, 3);
        let mut out = Vec::new();
        tokio::io::copy(&mut r, &mut out).await.unwrap();
        assert_eq!(out, b"abc");
        assert!(format!("{r:?}").contains("size: 3"));
    }

    #[test]
    fn metadata_is_printable_ascii_with_bounded_keys_and_size() {
        let meta = |pairs: &[(&str, &str)]| -> FileMetadata {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(check_metadata("m", &meta(&[])).is_ok());
        assert!(check_metadata("m", &meta(&[("author", "mish"), ("a b", "x y")])).is_ok());
        for (bad, why) in [
            (meta(&[("", "v")]), "empty"),
            (meta(&[("key\n", "v")]), "printable"),
            (meta(&[("k", "v\n")]), "printable"),
            (meta(&[("k", "caf\u{e9}")]), "printable"),
            (meta(&[("\u{e9}".repeat(200).as_str(), "v")]), "printable"),
        ] {
            let e = check_metadata("metadata", &bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidOptions);
            assert!(e.message.contains(why), "{bad:?}: {e}");
            assert!(e.message.contains("metadata"), "{e}");
        }
        let long = "k".repeat(MAX_METADATA_KEY);
        assert!(check_metadata("m", &meta(&[(long.as_str(), "v")])).is_ok());
        let longer = "k".repeat(MAX_METADATA_KEY + 1);
        let e = check_metadata("m", &meta(&[(longer.as_str(), "v")])).unwrap_err();
        assert!(e.message.contains("at most 246"), "{e}");
        // 4096 bytes in all, the prefix counted once per key.
        let value = "v".repeat(MAX_METADATA_BYTES - METADATA_XATTR_PREFIX.len() - 1);
        assert!(check_metadata("m", &meta(&[("k", value.as_str())])).is_ok());
        let e = check_metadata("m", &meta(&[("k", value.as_str()), ("j", "")])).unwrap_err();
        assert!(e.message.contains("at most 4096"), "{e}");
    }
}

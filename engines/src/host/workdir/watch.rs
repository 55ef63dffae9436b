//! Watching a directory beneath the workdir with inotify: one inotify descriptor
//! per watch, read by a task that sleeps on it (no polling: a watch costs nothing
//! while nothing changes). Directories are watched through fds resolved beneath
//! the workdir, never by a path the kernel would resolve again.
//!
//! A recursive watch adds each directory created (or moved in) below it, and reports
//! what that directory already holds when it is added as created, so that what a
//! program writes into a directory it has just made is not missed.
//!
//! [`Workdir::clear`] and [`Workdir::remove`] end every watch of the workdir: a watch
//! never sees the next lease's files.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use paddock_core::{Error, ErrorCode, FileEvent, FileEventKind, FileWatch, Result};
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use tokio::sync::mpsc::error::TrySendError;

use super::resolve::{cpath, map_io, openat_beneath};
use super::{Workdir, MAX_LIST_ENTRIES};
use crate::task::blocking;

/// Most directories one recursive watch follows.
const MAX_WATCHED_DIRS: usize = 8192;

/// What a watched directory reports.
fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MODIFY
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE_SELF
        | WatchFlags::ONLYDIR
}

/// One watch's state: the inotify descriptor and which directory each of its
/// watch descriptors stands for.
struct Watcher {
    inotify: OwnedFd,
    /// Watch descriptor → the directory's path below the workdir's root.
    dirs: HashMap<i32, PathBuf>,
    /// The watched directory's own watch descriptor.
    top: i32,
    recursive: bool,
    /// The root as programs see it (event paths are under it).
    shown: PathBuf,
    /// The workdir's fd, to open new directories beneath it.
    root: Arc<Workdir>,
    events: tokio::sync::mpsc::Sender<FileEvent>,
    dropped: Arc<AtomicU64>,
}

impl Workdir {
    /// Watches directory `path` (see [`Sandbox::watch`]). Must be called within a
    /// tokio runtime, which runs the watch's task.
    ///
    /// [`Sandbox::watch`]: paddock_core::Sandbox::watch
    pub async fn watch(self: &Arc<Self>, path: &str, recursive: bool) -> Result<FileWatch> {
        let (workdir, owned) = (self.clone(), path.to_string());
        let (tx, rx) = FileWatch::channel();
        let dropped = Arc::new(AtomicU64::new(0));
        let counted = dropped.clone();
        let watcher = blocking(move || {
            let rel = workdir.relative_strict(&owned)?;
            let fd = openat_beneath(
                workdir.fd.as_raw_fd(),
                &cpath(&rel)?,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                0,
            )
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOTDIR) => {
                    Error::invalid_options("path", format!("`{owned}` is not a directory"))
                }
                _ => map_io(e, &owned),
            })?;
            let inotify =
                inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
                    .map_err(|e| Error::engine_io("starting a watch (inotify_init)", e.into()))?;
            let top = add(&inotify, &fd).map_err(|e| match e {
                rustix::io::Errno::NOSPC | rustix::io::Errno::MFILE => Error::new(
                    ErrorCode::LimitsExceeded,
                    "the host's inotify watches are used up; stop other watches first",
                ),
                e => map_io(e.into(), &owned),
            })?;
            let mut w = Watcher {
                inotify,
                dirs: HashMap::from([(top, rel.clone())]),
                top,
                recursive,
                shown: workdir.shown.clone(),
                root: workdir.clone(),
                events: tx,
                dropped: counted,
            };
            if recursive {
                // What is below already: watched, not reported.
                w.follow(&fd, &rel, false);
            }
            Ok(w)
        })
        .await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        self.watches.lock().retain(|s| !s.is_closed());
        self.watches.lock().push(stop);
        tokio::spawn(watcher.run(stopped));
        Ok(FileWatch::new(rx, dropped, Box::new(())))
    }

    /// Ends every watch of this workdir (a recycle does, before the next lease:
    /// [`clear`](Workdir::clear) and [`remove`](Workdir::remove) do too).
    pub fn end_watches(&self) {
        self.watches.lock().clear();
    }
}

/// Adds a watch on the directory `dir` (through its fd's `/proc` link, so the
/// kernel watches the directory the fd holds, whatever its path says now).
fn add(inotify: &OwnedFd, dir: &OwnedFd) -> rustix::io::Result<i32> {
    inotify::add_watch(
        inotify,
        format!("/proc/self/fd/{}", dir.as_raw_fd()).as_str(),
        mask(),
    )
}

impl Watcher {
    /// Watches every directory below `dir` (at `rel`), reporting each entry as
    /// created when `report`.
    fn follow(&mut self, dir: &OwnedFd, rel: &Path, report: bool) {
        let mut stack: Vec<(OwnedFd, PathBuf)> = Vec::new();
        let mut seen = 0usize;
        let mut current = Some((None::<OwnedFd>, rel.to_path_buf()));
        while let Some((fd, dir_rel)) = current.take() {
            let raw = fd.as_ref().map_or(dir.as_raw_fd(), |f| f.as_raw_fd());
            if let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{raw}")) {
                for entry in entries.flatten() {
                    seen += 1;
                    if seen > MAX_LIST_ENTRIES {
                        return;
                    }
                    let child = dir_rel.join(entry.file_name());
                    if report {
                        self.send(&child, FileEventKind::Create);
                    }
                    if !entry.file_type().map(|t| t.is_dir()).unwrap_or(false)
                        || self.dirs.len() >= MAX_WATCHED_DIRS
                    {
                        continue;
                    }
                    let Ok(name) = cpath(Path::new(&entry.file_name())) else {
                        continue;
                    };
                    let Ok(sub) = openat_beneath(
                        raw,
                        &name,
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                        0,
                    ) else {
                        continue;
                    };
                    if let Ok(wd) = add(&self.inotify, &sub) {
                        self.dirs.insert(wd, child.clone());
                        stack.push((sub, child));
                    }
                }
            }
            if let Some((fd, r)) = stack.pop() {
                current = Some((Some(fd), r));
            }
        }
    }

    /// A directory that appeared at `rel`: watched, and what it holds reported.
    fn appeared(&mut self, rel: &Path) {
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            return;
        }
        let Ok(c) = cpath(rel) else { return };
        let Ok(fd) = openat_beneath(
            self.root.fd.as_raw_fd(),
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0,
        ) else {
            return;
        };
        if let Ok(wd) = add(&self.inotify, &fd) {
            self.dirs.insert(wd, rel.to_path_buf());
            self.follow(&fd, rel, true);
        }
    }

    /// A directory that went from `rel` (moved away): it and what is below it are
    /// no longer watched here.
    fn went(&mut self, rel: &Path) {
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(wd, p)| **wd != self.top && p.starts_with(rel))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            let _ = inotify::remove_watch(&self.inotify, wd);
        }
    }

    /// Queues an event; a full buffer drops it (counted).
    fn send(&self, rel: &Path, kind: FileEventKind) -> bool {
        let event = FileEvent {
            path: self.shown.join(rel).to_string_lossy().into_owned(),
            kind,
        };
        match self.events.try_send(event) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(TrySendError::Closed(_)) => false,
        }
    }

    /// Handles one inotify event; `false` when the watch is over.
    fn handle(&mut self, wd: i32, flags: ReadFlags, name: Option<PathBuf>) -> bool {
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        if flags.contains(ReadFlags::IGNORED) {
            self.dirs.remove(&wd);
            return wd != self.top;
        }
        let Some(dir) = self.dirs.get(&wd).cloned() else {
            return true;
        };
        let Some(name) = name else {
            // The directory itself: its own removal shows in its parent (or, for
            // the watched directory, ends the watch with IN_IGNORED).
            return true;
        };
        let rel = dir.join(name);
        let is_dir = flags.contains(ReadFlags::ISDIR);
        let kind = if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
            FileEventKind::Create
        } else if flags.contains(ReadFlags::MODIFY) {
            FileEventKind::Write
        } else if flags.contains(ReadFlags::DELETE) {
            FileEventKind::Remove
        } else if flags.contains(ReadFlags::MOVED_FROM) {
            FileEventKind::Rename
        } else if flags.contains(ReadFlags::ATTRIB) {
            FileEventKind::Chmod
        } else {
            return true;
        };
        if is_dir && kind == FileEventKind::Rename {
            self.went(&rel);
        }
        if !self.send(&rel, kind) {
            return false;
        }
        if is_dir && self.recursive && kind == FileEventKind::Create {
            self.appeared(&rel);
        }
        true
    }

    /// Reads events until the watch ends: its reader went, the workdir ended it, or
    /// the watched directory went.
    async fn run(mut self, mut stop: tokio::sync::oneshot::Receiver<()>) {
        let Ok(fd) = self
            .inotify
            .try_clone()
            .and_then(|fd| crate::host::sys::async_fd(fd, tokio::io::Interest::READABLE))
        else {
            return;
        };
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 16 << 10];
        loop {
            let ready = tokio::select! {
                biased;
                _ = &mut stop => return,
                () = self.events.closed() => return,
                r = fd.readable() => r,
            };
            let Ok(mut guard) = ready else { return };
            let mut batch = Vec::new();
            {
                let mut reader = inotify::Reader::new(fd.get_ref().as_fd(), &mut buf);
                loop {
                    match reader.next() {
                        Ok(e) => batch.push((
                            e.wd(),
                            e.events(),
                            e.file_name()
                                .filter(|n| !n.is_empty())
                                .map(|n| PathBuf::from(std::ffi::OsStr::from_bytes(n.to_bytes()))),
                        )),
                        Err(rustix::io::Errno::AGAIN) => {
                            guard.clear_ready();
                            break;
                        }
                        Err(rustix::io::Errno::INTR) => continue,
                        Err(_) => return,
                    }
                }
            }
            for (wd, flags, name) in batch {
                if !self.handle(wd, flags, name) {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_workdir as wd;
    use super::*;

    async fn next(w: &mut FileWatch) -> FileEvent {
        tokio::time::timeout(std::time::Duration::from_secs(5), w.next())
            .await
            .expect("an event within 5 s")
            .expect("the watch goes on")
    }

    #[tokio::test]
    async fn changes_arrive_as_events() {
        let (_t, w) = wd();
        let w = Arc::new(w);
        w.write_file("d/old", b"1").unwrap();
        let root = w.root().to_string_lossy().into_owned();
        let mut watch = w.watch("d", true).await.unwrap();
        w.write_file("d/new", b"x").unwrap();
        assert_eq!(
            next(&mut watch).await,
            FileEvent {
                path: format!("{root}/d/new"),
                kind: FileEventKind::Create
            }
        );
        assert_eq!(next(&mut watch).await.kind, FileEventKind::Write);
        w.rename("d/new", "d/renamed").unwrap();
        assert_eq!(next(&mut watch).await.kind, FileEventKind::Rename);
        let e = next(&mut watch).await;
        assert_eq!(
            (e.path.as_str(), e.kind),
            (format!("{root}/d/renamed").as_str(), FileEventKind::Create)
        );
        w.remove_path("d/renamed").unwrap();
        assert_eq!(next(&mut watch).await.kind, FileEventKind::Remove);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            w.root().join("d/old"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        assert_eq!(next(&mut watch).await.kind, FileEventKind::Chmod);
        // Recursive: a new directory and what is written in it at once.
        w.write_file("d/sub/deep", b"1").unwrap();
        let mut seen = Vec::new();
        while !seen.contains(&(format!("{root}/d/sub/deep"), FileEventKind::Create)) {
            let e = next(&mut watch).await;
            seen.push((e.path, e.kind));
        }
        // Nothing changes: the watch's task sleeps on inotify, so the thread that
        // runs it (this one: the test's runtime has one thread) wakes once, at the end
        // of the sleep, not at a polling interval.
        let switches = || {
            // SAFETY: getrusage fills the plain struct it is given.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            assert_eq!(
                unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) },
                0
            );
            usage.ru_nvcsw + usage.ru_nivcsw
        };
        let before = switches();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let woke = switches() - before;
        assert!(
            woke <= 3,
            "the idle watch woke its thread {woke} times in 1 s"
        );
        assert!(watch.try_next().is_none());
        // The watch ends when the workdir is cleared.
        w.clear().unwrap();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while watch.next().await.is_some() {}
        })
        .await;
        assert!(ended.is_ok(), "the watch ended");
        // Refusals.
        assert_eq!(
            w.watch("../x", false).await.unwrap_err().code,
            ErrorCode::PathEscape
        );
        assert_eq!(
            w.watch("nope", false).await.unwrap_err().code,
            ErrorCode::NotFound
        );
        w.write_file("f", b"1").unwrap();
        assert_eq!(
            w.watch("f", false).await.unwrap_err().code,
            ErrorCode::InvalidOptions
        );
    }
}

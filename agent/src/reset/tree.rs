//! The trees a reset returns to their first state (`/tmp`, `/dev/shm`,
//! `/dev/mqueue`, `/dev/pts`, `/dev`): a snapshot of each at start, and how one is
//! put back (what was added removed, what changed put right where the agent can) and
//! checked.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::sys;

/// What an entry found in a tree but not in its snapshot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Extra {
    /// Something the last lease made: removed.
    Removed,
    /// A terminal whose master is still open (devpts entries cannot be removed).
    OpenTerminal,
}

/// One tree's snapshot: every entry by its path relative to the root (the root
/// itself is the empty path).
#[derive(Debug)]
pub(super) struct Tree {
    pub(super) root: PathBuf,
    extra: Extra,
    taken: Result<Listing, String>,
}

impl Tree {
    /// The snapshot of the tree at `root`, whose added entries are `extra`.
    pub(super) fn take(root: &Path, extra: Extra) -> Tree {
        Tree {
            root: root.to_path_buf(),
            extra,
            taken: scan(root, false).map_err(|e| e.to_string()),
        }
    }
}

/// A tree as read: the device of its filesystem, and its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listing {
    dev: u64,
    entries: BTreeMap<PathBuf, Entry>,
}

/// One entry of a tree, as far as a reset compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: Kind,
    /// Permission bits, set-id and sticky bits included (not compared for symlinks).
    mode: u32,
    uid: u32,
    gid: u32,
    /// Another filesystem, or a bound file, over the tree's own: never removed,
    /// never entered.
    mount: bool,
    /// Extended attributes (name, value) of a directory or file of the tree's own.
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The type of an entry, with what makes two of a type the same.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink(PathBuf),
    CharDevice(u64),
    BlockDevice(u64),
    Fifo,
    Socket,
}

impl Kind {
    /// Whether the agent can make one again (without `mknod`).
    fn remakeable(&self) -> bool {
        matches!(self, Kind::Dir | Kind::Symlink(_))
    }

    fn name(&self) -> String {
        match self {
            Kind::Dir => "a directory".into(),
            Kind::File => "a regular file".into(),
            Kind::Symlink(t) => format!("a symlink to `{}`", t.display()),
            Kind::CharDevice(d) => format!("character device {}:{}", major(*d), minor(*d)),
            Kind::BlockDevice(d) => format!("block device {}:{}", major(*d), minor(*d)),
            Kind::Fifo => "a FIFO".into(),
            Kind::Socket => "a socket".into(),
        }
    }
}

fn major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)
}

fn minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
}

/// The entry at `path`, whose metadata (not following a symlink) is `meta`.
fn entry(path: &Path, meta: &std::fs::Metadata, mount: bool) -> io::Result<Entry> {
    let ft = meta.file_type();
    let kind = if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink(std::fs::read_link(path)?)
    } else if ft.is_char_device() {
        Kind::CharDevice(meta.rdev())
    } else if ft.is_block_device() {
        Kind::BlockDevice(meta.rdev())
    } else if ft.is_fifo() {
        Kind::Fifo
    } else if ft.is_socket() {
        Kind::Socket
    } else {
        Kind::File
    };
    let xattrs = if !mount && (ft.is_dir() || ft.is_file()) {
        sys::xattrs(path)?
    } else {
        Vec::new()
    };
    Ok(Entry {
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mount,
        xattrs,
    })
}

/// Reads the tree at `root`: every entry, not following symlinks nor entering
/// mount points. With `open_up`, a directory its owner (the agent's user) cannot
/// read, search or write is given those rights first (the listing keeps the mode it
/// had): the agent has no `CAP_DAC_OVERRIDE`.
fn scan(root: &Path, open_up: bool) -> io::Result<Listing> {
    let meta = std::fs::symlink_metadata(root)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "`{}` is not a directory",
            root.display()
        )));
    }
    let dev = meta.dev();
    let mut entries = BTreeMap::new();
    entries.insert(PathBuf::new(), entry(root, &meta, false)?);
    walk(root, Path::new(""), dev, open_up, &mut entries)?;
    Ok(Listing { dev, entries })
}

fn walk(
    root: &Path,
    rel: &Path,
    dev: u64,
    open_up: bool,
    entries: &mut BTreeMap<PathBuf, Entry>,
) -> io::Result<()> {
    let dir = root.join(rel);
    if open_up {
        let mode = std::fs::symlink_metadata(&dir)?.mode() & 0o7777;
        if mode & 0o700 != 0o700 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o700))?;
        }
    }
    for e in std::fs::read_dir(&dir)? {
        let e = e?;
        let rel = rel.join(e.file_name());
        let path = root.join(&rel);
        let meta = std::fs::symlink_metadata(&path)?;
        let mount = meta.dev() != dev;
        let descend = meta.is_dir() && !mount;
        entries.insert(rel.clone(), entry(&path, &meta, mount)?);
        if descend {
            walk(root, &rel, dev, open_up, entries)?;
        }
    }
    Ok(())
}

/// One step of putting a tree back.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// Remove the entry (recursively).
    Remove(PathBuf),
    /// Make the directory or symlink again.
    Make(PathBuf, Kind),
    /// Restore the mode.
    Chmod(PathBuf, u32),
    /// Remove an extended attribute added since the start.
    DropXattr(PathBuf, Vec<u8>),
    /// A difference the agent cannot put right.
    Unfixable(PathBuf, String),
}

/// What turns the tree `now` back into `then`, for a tree whose added entries are
/// `extra`. Removals come first, then what is made again (parents first), then
/// modes (children first, so that a parent's mode never stands in the way) and
/// extended attributes.
fn plan(then: &Listing, now: &Listing, extra: Extra) -> Vec<Action> {
    let mut removals = Vec::new();
    let mut makes = Vec::new();
    let mut fixes = Vec::new();
    let mut unfixable = Vec::new();
    let mut removed: Vec<PathBuf> = Vec::new();
    let mut settled: BTreeSet<PathBuf> = BTreeSet::new();
    let under = |removed: &[PathBuf], p: &Path| removed.iter().any(|r| p.starts_with(r));
    // Parents sort before their children.
    for (path, is) in &now.entries {
        if under(&removed, path) {
            continue;
        }
        match then.entries.get(path) {
            None if is.mount => unfixable.push(Action::Unfixable(
                path.clone(),
                "a mount point that was not there at start".into(),
            )),
            None => match extra {
                Extra::Removed => {
                    removals.push(Action::Remove(path.clone()));
                    removed.push(path.clone());
                }
                Extra::OpenTerminal => unfixable.push(Action::Unfixable(
                    path.clone(),
                    "a terminal of the last lease is still open (its master is held outside the container)".into(),
                )),
            },
            Some(was) if was.kind == is.kind && was.mount == is.mount => {
                if (was.uid, was.gid) != (is.uid, is.gid) {
                    unfixable.push(Action::Unfixable(
                        path.clone(),
                        format!(
                            "owned by {}:{}, was {}:{}",
                            is.uid, is.gid, was.uid, was.gid
                        ),
                    ));
                }
                if was.mode != is.mode && !matches!(was.kind, Kind::Symlink(_)) {
                    fixes.push(Action::Chmod(path.clone(), was.mode));
                }
                for (name, value) in &is.xattrs {
                    match was.xattrs.iter().find(|(n, _)| n == name) {
                        None => fixes.push(Action::DropXattr(path.clone(), name.clone())),
                        Some((_, v)) if v != value => unfixable.push(Action::Unfixable(
                            path.clone(),
                            format!(
                                "extended attribute `{}` changed",
                                String::from_utf8_lossy(name)
                            ),
                        )),
                        Some(_) => {}
                    }
                }
            }
            Some(was) => {
                settled.insert(path.clone());
                // A mount point, the tree's root and a devpts entry are never
                // removed.
                let fixed = !(is.mount
                    || was.mount
                    || path.as_os_str().is_empty()
                    || extra == Extra::OpenTerminal);
                if !fixed {
                    unfixable.push(Action::Unfixable(
                        path.clone(),
                        format!("{}, was {}", describe(is), describe(was)),
                    ));
                } else {
                    removals.push(Action::Remove(path.clone()));
                    removed.push(path.clone());
                    if was.kind.remakeable() {
                        makes.push(Action::Make(path.clone(), was.kind.clone()));
                        if was.kind == Kind::Dir {
                            fixes.push(Action::Chmod(path.clone(), was.mode));
                        }
                    } else {
                        unfixable.push(Action::Unfixable(
                            path.clone(),
                            format!(
                                "{} was replaced by {}, and cannot be made again",
                                was.kind.name(),
                                is.kind.name()
                            ),
                        ));
                    }
                }
            }
        }
    }
    // What is gone (or was inside something removed) is made again where it can be.
    for (path, was) in &then.entries {
        if settled.contains(path) {
            continue;
        }
        let gone = !now.entries.contains_key(path) || under(&removed, path);
        if !gone {
            continue;
        }
        if was.kind.remakeable() && !was.mount {
            makes.push(Action::Make(path.clone(), was.kind.clone()));
            if !matches!(was.kind, Kind::Symlink(_)) {
                fixes.push(Action::Chmod(path.clone(), was.mode));
            }
        } else {
            unfixable.push(Action::Unfixable(
                path.clone(),
                format!("{} is gone, and cannot be made again", describe(was)),
            ));
        }
    }
    // Parents are made before their children; modes are set deepest first.
    makes.sort_by(|a, b| match (a, b) {
        (Action::Make(p, _), Action::Make(q, _)) => p.cmp(q),
        _ => std::cmp::Ordering::Equal,
    });
    fixes.sort_by(|a, b| {
        let key = |x: &Action| match x {
            Action::Chmod(p, _) | Action::DropXattr(p, _) => p.clone(),
            _ => PathBuf::new(),
        };
        key(b).cmp(&key(a))
    });
    let mut all = removals;
    all.extend(makes);
    all.extend(fixes);
    all.extend(unfixable);
    all
}

fn describe(e: &Entry) -> String {
    if e.mount {
        format!("a mount point ({})", e.kind.name())
    } else {
        e.kind.name()
    }
}

/// What differs between `then` and `now`, as (path, what).
fn differences(then: &Listing, now: &Listing) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    if then.dev != now.dev {
        out.push((PathBuf::new(), "another filesystem than at start".into()));
    }
    for (path, was) in &then.entries {
        match now.entries.get(path) {
            None => out.push((path.clone(), format!("{} is gone", describe(was)))),
            Some(is) if is == was => {}
            Some(is) if is.kind != was.kind || is.mount != was.mount => out.push((
                path.clone(),
                format!("{}, was {}", describe(is), describe(was)),
            )),
            Some(is) if is.mode != was.mode && !matches!(was.kind, Kind::Symlink(_)) => out.push((
                path.clone(),
                format!("mode {:o}, was {:o}", is.mode, was.mode),
            )),
            Some(is) if is.xattrs != was.xattrs => {
                out.push((path.clone(), "extended attributes differ".into()))
            }
            Some(is) if (is.uid, is.gid) != (was.uid, was.gid) => out.push((
                path.clone(),
                format!(
                    "owned by {}:{}, was {}:{}",
                    is.uid, is.gid, was.uid, was.gid
                ),
            )),
            Some(_) => {}
        }
    }
    for (path, is) in &now.entries {
        if !then.entries.contains_key(path) {
            out.push((path.clone(), format!("{} was added", describe(is))));
        }
    }
    out
}

/// Removes `path` and, for a directory, everything in it, never following a
/// symlink and never removing a mount point (a filesystem other than `dev`).
fn remove_tree(path: &Path, dev: u64) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.dev() != dev {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    if !meta.is_dir() {
        return std::fs::remove_file(path);
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o700 != 0o700 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o700))?;
    }
    let mut first_error = None;
    for e in std::fs::read_dir(path)? {
        if let Err(err) = remove_tree(&e?.path(), dev) {
            first_error.get_or_insert(err);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => std::fs::remove_dir(path),
    }
}

/// Carries out `actions` in the tree at `root` (whose filesystem is `dev`); the
/// problems found, by path.
fn apply(root: &Path, dev: u64, actions: &[Action], problems: &mut BTreeMap<PathBuf, String>) {
    let at = |p: &Path| -> PathBuf {
        if p.as_os_str().is_empty() {
            root.to_path_buf()
        } else {
            root.join(p)
        }
    };
    for action in actions {
        let (path, done) = match action {
            Action::Remove(p) => (p, remove_tree(&at(p), dev)),
            Action::Make(p, Kind::Dir) => (p, std::fs::create_dir(at(p))),
            Action::Make(p, Kind::Symlink(target)) => {
                (p, std::os::unix::fs::symlink(target, at(p)))
            }
            Action::Make(p, _) => (p, Err(io::Error::from_raw_os_error(libc::EPERM))),
            Action::Chmod(p, mode) => (
                p,
                std::fs::set_permissions(at(p), std::fs::Permissions::from_mode(*mode)),
            ),
            Action::DropXattr(p, name) => (p, sys::remove_xattr(&at(p), name)),
            Action::Unfixable(p, why) => {
                problems.entry(at(p)).or_insert_with(|| why.clone());
                continue;
            }
        };
        if let Err(e) = done {
            problems
                .entry(at(path))
                .or_insert_with(|| format!("{action:?} failed: {e}"));
        }
    }
}

impl Tree {
    /// Puts the tree back as it was at start, and checks it is; problems by path.
    pub(super) fn restore(&self, problems: &mut BTreeMap<PathBuf, String>) {
        let then = match &self.taken {
            Ok(l) => l,
            Err(e) => {
                problems.insert(self.root.clone(), format!("no snapshot from start: {e}"));
                return;
            }
        };
        let now = match scan(&self.root, true) {
            Ok(l) => l,
            Err(e) => {
                problems.insert(self.root.clone(), format!("cannot be read: {e}"));
                return;
            }
        };
        if now.dev != then.dev {
            problems.insert(self.root.clone(), "another filesystem than at start".into());
            return;
        }
        if now != *then {
            apply(
                &self.root,
                then.dev,
                &plan(then, &now, self.extra),
                problems,
            );
        }
        match scan(&self.root, false) {
            Ok(after) => {
                for (path, what) in differences(then, &after) {
                    problems.entry(self.root.join(path)).or_insert(what);
                }
            }
            Err(e) => {
                problems
                    .entry(self.root.clone())
                    .or_insert_with(|| format!("cannot be read after the reset: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(kind: Kind, mode: u32) -> Entry {
        Entry {
            kind,
            mode,
            uid: 0,
            gid: 0,
            mount: false,
            xattrs: Vec::new(),
        }
    }

    fn listing(entries: &[(&str, Entry)]) -> Listing {
        Listing {
            dev: 7,
            entries: entries
                .iter()
                .map(|(p, e)| (PathBuf::from(p), e.clone()))
                .collect(),
        }
    }

    /// A container's /dev as the runtime makes it, in a user namespace (devices
    /// bound from the host) or not (device nodes).
    fn dev(bound: bool) -> Listing {
        let device = |rdev| Entry {
            mount: bound,
            ..e(Kind::CharDevice(rdev), 0o666)
        };
        let mount_dir = |mode| Entry {
            mount: true,
            ..e(Kind::Dir, mode)
        };
        listing(&[
            ("", e(Kind::Dir, 0o755)),
            ("null", device(0x103)),
            ("zero", device(0x105)),
            ("fd", e(Kind::Symlink("/proc/self/fd".into()), 0o777)),
            ("stdin", e(Kind::Symlink("/proc/self/fd/0".into()), 0o777)),
            ("ptmx", e(Kind::Symlink("pts/ptmx".into()), 0o777)),
            ("shm", mount_dir(0o1777)),
            ("pts", mount_dir(0o755)),
            ("mqueue", mount_dir(0o1777)),
        ])
    }

    #[test]
    fn an_unchanged_dev_needs_nothing() {
        let then = dev(true);
        assert_eq!(plan(&then, &then, Extra::Removed), Vec::new());
        assert_eq!(differences(&then, &then), Vec::new());
    }

    #[test]
    fn added_entries_are_removed_and_changed_links_and_modes_put_back() {
        let then = dev(false);
        let mut now = then.clone();
        // Added: a file, and a directory with a file in it (removed as one).
        now.entries.insert("secret".into(), e(Kind::File, 0o644));
        now.entries.insert("d".into(), e(Kind::Dir, 0o000));
        now.entries.insert("d/x".into(), e(Kind::File, 0o600));
        // A symlink replaced by a file; another gone.
        now.entries.insert("stdin".into(), e(Kind::File, 0o644));
        now.entries.remove(Path::new("fd"));
        // A device's mode changed, /dev's own too, an xattr added to /dev.
        now.entries.get_mut(Path::new("null")).unwrap().mode = 0o600;
        let root = now.entries.get_mut(Path::new("")).unwrap();
        root.mode = 0o777;
        root.xattrs = vec![(b"user.note".to_vec(), b"hi".to_vec())];
        let actions = plan(&then, &now, Extra::Removed);
        assert_eq!(
            actions,
            vec![
                Action::Remove("d".into()),
                Action::Remove("secret".into()),
                Action::Remove("stdin".into()),
                Action::Make("fd".into(), Kind::Symlink("/proc/self/fd".into())),
                Action::Make("stdin".into(), Kind::Symlink("/proc/self/fd/0".into())),
                Action::Chmod("null".into(), 0o666),
                Action::Chmod("".into(), 0o755),
                Action::DropXattr("".into(), b"user.note".to_vec()),
            ]
        );
        assert!(!actions.iter().any(|a| matches!(a, Action::Unfixable(..))));
        let found = differences(&then, &now);
        assert_eq!(found.len(), 7, "{found:?}");
    }

    #[test]
    fn a_replaced_or_missing_device_cannot_be_put_right() {
        let then = dev(false);
        let mut now = then.clone();
        now.entries.insert("null".into(), e(Kind::File, 0o644));
        now.entries.remove(Path::new("zero"));
        let actions = plan(&then, &now, Extra::Removed);
        let unfixable: Vec<&PathBuf> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Unfixable(p, _) => Some(p),
                _ => None,
            })
            .collect();
        assert_eq!(unfixable, [Path::new("null"), Path::new("zero")]);
        // The file over /dev/null goes all the same.
        assert!(actions.contains(&Action::Remove("null".into())));
    }

    #[test]
    fn mount_points_are_never_removed_and_open_terminals_fail() {
        let then = dev(true);
        let mut now = then.clone();
        now.entries.get_mut(Path::new("pts")).unwrap().mount = false;
        let actions = plan(&then, &now, Extra::Removed);
        assert!(matches!(&actions[..], [Action::Unfixable(p, _)] if p == Path::new("pts")));
        let pts = listing(&[
            ("", e(Kind::Dir, 0o755)),
            ("ptmx", e(Kind::CharDevice(0x502), 0o666)),
        ]);
        let mut open = pts.clone();
        open.entries
            .insert("0".into(), e(Kind::CharDevice(0x8800), 0o620));
        let actions = plan(&pts, &open, Extra::OpenTerminal);
        assert!(
            matches!(&actions[..], [Action::Unfixable(p, why)] if p == Path::new("0") && why.contains("terminal")),
            "{actions:?}"
        );
    }

    /// A scratch directory of its own under the temp dir.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("paddock-agent-reset-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_tree_is_put_back_as_it_was() {
        use std::os::unix::fs::symlink;
        let root = scratch("tree");
        std::fs::create_dir(root.join("keep")).unwrap();
        symlink("/proc/self/fd", root.join("keep/fd")).unwrap();
        let tree = Tree::take(&root, Extra::Removed);
        // A lease's leftovers: files, a directory its owner cannot enter, a symlink
        // out of the tree (never followed), a kept symlink replaced by a file, a
        // kept directory's mode changed.
        let outside = scratch("outside");
        std::fs::write(outside.join("victim"), b"stays").unwrap();
        std::fs::write(root.join("a"), b"x").unwrap();
        std::fs::create_dir_all(root.join("deep/er")).unwrap();
        std::fs::write(root.join("deep/er/f"), b"x").unwrap();
        std::fs::set_permissions(root.join("deep"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        symlink(&outside, root.join("out")).unwrap();
        std::fs::remove_file(root.join("keep/fd")).unwrap();
        std::fs::write(root.join("keep/fd"), b"not a link").unwrap();
        std::fs::set_permissions(root.join("keep"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let mut problems = BTreeMap::new();
        tree.restore(&mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(scan(&root, false).unwrap(), *tree.taken.as_ref().unwrap());
        assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"stays");
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }
}

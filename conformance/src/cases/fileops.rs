//! The file operations (feature `fileops`): stat, listing with a depth, making
//! directories, moving, removing, and watching a directory's changes.

use std::time::Duration;

use paddock_core::{ErrorCode, FileEventKind, FileKind, FileWatch, Sandbox};

use crate::case::{expect_code, Check, OrFail};
use crate::context::{brief, exec, sh, Ctx};

/// `rel` under the sandbox's root, as its programs see it.
fn under(sandbox: &dyn Sandbox, rel: &str) -> String {
    let root = sandbox.root_dir().to_string_lossy().into_owned();
    format!("{}/{rel}", root.trim_end_matches('/'))
}

pub(crate) async fn fileops_stat_list_make_move_remove(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let sb = sandbox.as_ref();
    sb.write_file("d/a.txt", b"hello")
        .await
        .or_fail("write_file")?;
    let a = sb.stat("d/a.txt").await.or_fail("stat(d/a.txt)")?;
    ensure!(
        a.kind == FileKind::File
            && a.size == 5
            && a.path == under(sb, "d/a.txt")
            && a.name() == "a.txt",
        "stat of a 5-byte file under the root: got {a:?}"
    );
    let by_abs = sb
        .stat(&under(sb, "d/a.txt"))
        .await
        .or_fail("stat(absolute)")?;
    ensure!(
        by_abs == a,
        "a relative and an absolute path name the same file: {by_abs:?} vs {a:?}"
    );
    let d = sb.stat("d").await.or_fail("stat(d)")?;
    ensure!(
        d.kind == FileKind::Directory,
        "stat(d) is a directory: {d:?}"
    );
    expect_code(
        sb.stat("d/missing").await,
        ErrorCode::NotFound,
        "stat of a missing file",
    )?;

    ensure!(
        sb.make_dir("d/x/y").await.or_fail("make_dir(d/x/y)")?,
        "make_dir answers true when it made the directory"
    );
    ensure!(
        !sb.make_dir("d/x/y").await.or_fail("make_dir again")?,
        "make_dir answers false for an existing directory"
    );
    expect_code(
        sb.make_dir("d/a.txt").await,
        ErrorCode::InvalidOptions,
        "make_dir over a file",
    )?;

    let one = sb.list_dir("d", 1).await.or_fail("list_dir(d, 1)")?;
    let names: Vec<&str> = one.iter().map(|e| e.name()).collect();
    ensure!(
        names == ["a.txt", "x"],
        "list_dir(d, 1) lists its own entries, sorted: {names:?}"
    );
    let deep = sb.list_dir("d", 3).await.or_fail("list_dir(d, 3)")?;
    let paths: Vec<&str> = deep.iter().map(|e| e.path.as_str()).collect();
    ensure!(
        paths == [under(sb, "d/a.txt"), under(sb, "d/x"), under(sb, "d/x/y")],
        "list_dir(d, 3) walks down, sorted by path: {paths:?}"
    );
    expect_code(
        sb.list_dir("d/none", 1).await,
        ErrorCode::NotFound,
        "list_dir of a missing directory",
    )?;
    expect_code(
        sb.list_dir("d/a.txt", 1).await,
        ErrorCode::InvalidOptions,
        "list_dir of a file",
    )?;

    sb.rename("d/a.txt", "e/f/b.txt")
        .await
        .or_fail("rename into a new directory")?;
    let back = sb
        .read_file("e/f/b.txt")
        .await
        .or_fail("read_file after rename")?;
    ensure!(back == b"hello", "the moved file keeps its bytes: {back:?}");
    expect_code(
        sb.stat("d/a.txt").await,
        ErrorCode::NotFound,
        "the old name after rename",
    )?;
    expect_code(
        sb.rename("d/a.txt", "g").await,
        ErrorCode::NotFound,
        "rename of a missing file",
    )?;

    sb.remove("d").await.or_fail("remove(d), a tree")?;
    expect_code(
        sb.stat("d/x/y").await,
        ErrorCode::NotFound,
        "stat below a removed tree",
    )?;
    sb.remove("e/f/b.txt").await.or_fail("remove a file")?;
    expect_code(
        sb.remove("e/f/b.txt").await,
        ErrorCode::NotFound,
        "remove of a missing file",
    )?;
    expect_code(
        sb.remove("").await,
        ErrorCode::InvalidOptions,
        "remove of the root itself",
    )?;
    let root = sb.stat("").await.or_fail("stat of the root")?;
    ensure!(
        root.kind == FileKind::Directory,
        "the root is still there: {root:?}"
    );
    Ok(())
}

pub(crate) async fn fileops_refusals(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let sb = sandbox.as_ref();
    sb.write_file("x", b"1").await.or_fail("write_file(x)")?;
    for p in ["../x", "a/../../x"] {
        expect_code(
            sb.stat(p).await,
            ErrorCode::PathEscape,
            format_args!("stat({p:?})"),
        )?;
        expect_code(
            sb.list_dir(p, 1).await,
            ErrorCode::PathEscape,
            format_args!("list_dir({p:?})"),
        )?;
        expect_code(
            sb.make_dir(p).await,
            ErrorCode::PathEscape,
            format_args!("make_dir({p:?})"),
        )?;
        expect_code(
            sb.remove(p).await,
            ErrorCode::PathEscape,
            format_args!("remove({p:?})"),
        )?;
        expect_code(
            sb.rename("x", p).await,
            ErrorCode::PathEscape,
            format_args!("rename to {p:?}"),
        )?;
        expect_code(
            sb.rename(p, "y").await,
            ErrorCode::PathEscape,
            format_args!("rename of {p:?}"),
        )?;
        match sb.watch(p, false).await {
            Err(e) if e.code == ErrorCode::PathEscape => {}
            Err(e) => fail!("watch({p:?}): expected PATH_ESCAPE, got {e}"),
            Ok(_) => fail!("watch({p:?}): expected PATH_ESCAPE, but it succeeded"),
        }
    }
    expect_code(
        sb.stat("a\0b").await,
        ErrorCode::InvalidOptions,
        "stat of a path with NUL",
    )?;
    Ok(())
}

/// Waits for each of the events `wanted` (a path and a kind), in any order,
/// skipping others; fails after 10 s. (What a new directory already holds when the
/// watch reaches it may be reported before the event that made it.)
async fn expect_events(
    watch: &mut FileWatch,
    wanted: &[(String, FileEventKind)],
    what: &str,
) -> Check {
    let mut missing: Vec<(String, FileEventKind)> = wanted.to_vec();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !missing.is_empty() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, watch.next()).await {
            Ok(Some(e)) => {
                missing.retain(|(p, k)| !(*p == e.path && *k == e.kind));
                seen.push(e);
            }
            Ok(None) => fail!("{what}: the watch ended; missing {missing:?}, saw {seen:?}"),
            Err(_) => fail!("{what}: missing {missing:?} after 10 s; saw {seen:?}"),
        }
    }
    Ok(())
}

/// Waits for the event (`path`, `kind`), skipping others; fails after 10 s.
async fn expect_event(watch: &mut FileWatch, path: &str, kind: FileEventKind, what: &str) -> Check {
    expect_events(watch, &[(path.to_string(), kind)], what).await
}

pub(crate) async fn fileops_watch_events(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let sb = sandbox.as_ref();
    sb.make_dir("w").await.or_fail("make_dir(w)")?;
    let mut watch = sb.watch("w", true).await.or_fail("watch(w, recursive)")?;
    sb.write_file("w/new.txt", b"1")
        .await
        .or_fail("write_file")?;
    expect_event(
        &mut watch,
        &under(sb, "w/new.txt"),
        FileEventKind::Create,
        "a file written",
    )
    .await?;
    let r = exec(sb, sh("echo more >> w/new.txt; chmod 600 w/new.txt", &[])).await?;
    ensure!(
        r.exit_code() == Some(0),
        "the program that writes: {}",
        brief(&r)
    );
    expect_event(
        &mut watch,
        &under(sb, "w/new.txt"),
        FileEventKind::Write,
        "a program's append",
    )
    .await?;
    expect_event(
        &mut watch,
        &under(sb, "w/new.txt"),
        FileEventKind::Chmod,
        "a program's chmod",
    )
    .await?;
    sb.rename("w/new.txt", "w/sub/moved.txt")
        .await
        .or_fail("rename")?;
    expect_events(
        &mut watch,
        &[
            (under(sb, "w/new.txt"), FileEventKind::Rename),
            (under(sb, "w/sub/moved.txt"), FileEventKind::Create),
        ],
        "a move into a new directory (the old name, the new one)",
    )
    .await?;
    sb.remove("w/sub/moved.txt").await.or_fail("remove")?;
    expect_event(
        &mut watch,
        &under(sb, "w/sub/moved.txt"),
        FileEventKind::Remove,
        "a removal below",
    )
    .await?;
    // Nothing more happens: nothing more arrives.
    match tokio::time::timeout(Duration::from_millis(500), watch.next()).await {
        Err(_) => {}
        Ok(Some(e)) => fail!("an event while nothing changed: {e:?}"),
        Ok(None) => fail!("the watch ended while its directory is there"),
    }
    ensure!(
        watch.dropped() == 0,
        "no event was dropped: {}",
        watch.dropped()
    );
    drop(watch);
    // A watch of a file, or of nothing, is refused.
    sb.write_file("f", b"1").await.or_fail("write_file(f)")?;
    match sb.watch("f", false).await {
        Err(e) if e.code == ErrorCode::InvalidOptions => {}
        other => fail!(
            "watch of a file: expected INVALID_OPTIONS, got {:?}",
            other.map(|_| ())
        ),
    }
    match sb.watch("none", false).await {
        Err(e) if e.code == ErrorCode::NotFound => {}
        other => fail!(
            "watch of a missing directory: expected NOT_FOUND, got {:?}",
            other.map(|_| ())
        ),
    }
    Ok(())
}

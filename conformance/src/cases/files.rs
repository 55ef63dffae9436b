//! The file contract: round trips, listings, confinement, sharing with programs.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use paddock_core::{CancelToken, DiscardSink, ErrorCode, FileEntry, Sandbox};

use crate::case::{expect_code, Check, OrFail, Stop};
use crate::context::{brief, exec, sh, Ctx};

pub(crate) async fn files_round_trip(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let text = "héllo, wörld ✓ 世界\nsecond line\n";
    let binary: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let files: [(&str, &[u8]); 4] = [
        ("text.txt", text.as_bytes()),
        ("bin/all-bytes.bin", &binary),
        ("a/b/c.txt", b"nested"),
        ("empty", b""),
    ];
    for (path, data) in files {
        sandbox
            .write_file(path, data)
            .await
            .or_fail(format_args!("write_file({path:?})"))?;
    }
    for (path, data) in files {
        let back = sandbox
            .read_file(path)
            .await
            .or_fail(format_args!("read_file({path:?})"))?;
        ensure!(
            back == data,
            "read_file({path:?}) returned {} bytes that differ from the {} bytes written \
             (first difference at byte {:?})",
            back.len(),
            data.len(),
            back.iter().zip(data).position(|(a, b)| a != b)
        );
    }
    sandbox
        .write_file("text.txt", b"short")
        .await
        .or_fail("overwriting text.txt")?;
    let back = sandbox.read_file("text.txt").await.or_fail("read_file")?;
    ensure!(
        back == b"short",
        "overwriting a file with fewer bytes must replace it; read back {:?}",
        String::from_utf8_lossy(&back)
    );
    expect_code(
        sandbox.read_file("missing.txt").await,
        ErrorCode::NotFound,
        "read_file of a missing file",
    )?;
    expect_code(
        sandbox.read_file("no/such/dir/file.txt").await,
        ErrorCode::NotFound,
        "read_file in a missing directory",
    )?;
    Ok(())
}

/// The one entry whose path ends with `/suffix`, checked to be a file of `size` bytes.
fn find_file<'a>(
    entries: &'a [FileEntry],
    suffix: &str,
    size: u64,
    what: &str,
) -> Result<&'a FileEntry, Stop> {
    let wanted = format!("/{suffix}");
    let found: Vec<&FileEntry> = entries
        .iter()
        .filter(|e| e.path.ends_with(&wanted))
        .collect();
    let [entry] = found.as_slice() else {
        fail!("{what}: expected exactly one entry ending with {wanted:?}; got {entries:?}");
    };
    ensure!(
        !entry.is_dir && entry.size == size,
        "{what}: {wanted:?} must be a file of {size} bytes; got {entry:?}"
    );
    Ok(entry)
}

fn sorted(mut entries: Vec<FileEntry>) -> Vec<FileEntry> {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries
}

pub(crate) async fn files_list(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    sandbox
        .write_file("top.txt", b"abc")
        .await
        .or_fail("write_file(top.txt)")?;
    sandbox
        .write_file("a/b/c.txt", b"hello")
        .await
        .or_fail("write_file(a/b/c.txt)")?;

    let root = sorted(sandbox.list_files("").await.or_fail("list_files(\"\")")?);
    let top = find_file(&root, "top.txt", 3, "list_files(\"\")")?;
    let nested = find_file(&root, "a/b/c.txt", 5, "list_files(\"\")")?;
    ensure!(
        top.path.starts_with('/'),
        "list_files must give absolute paths; got {:?}",
        top.path
    );
    let prefix = top.path.strip_suffix("/top.txt").unwrap_or_default();
    ensure!(
        nested.path == format!("{prefix}/a/b/c.txt"),
        "entries must share the workdir prefix {prefix:?}; got {:?}",
        nested.path
    );
    for entry in &root {
        ensure!(
            entry.path.starts_with(&format!("{prefix}/")) && !entry.path.contains("/../"),
            "every entry must lie under the workdir {prefix:?}; got {entry:?}"
        );
        if entry.path == format!("{prefix}/a") || entry.path == format!("{prefix}/a/b") {
            ensure!(
                entry.is_dir,
                "{:?} is a directory; got {entry:?}",
                entry.path
            );
        }
    }
    for alias in [".", "/"] {
        let listed = sorted(
            sandbox
                .list_files(alias)
                .await
                .or_fail(format_args!("list_files({alias:?}) (the workdir root)"))?,
        );
        ensure!(
            listed == root,
            "list_files({alias:?}) must list the workdir root like list_files(\"\"); got {listed:?}, expected {root:?}"
        );
    }

    let sub = sandbox.list_files("a").await.or_fail("list_files(\"a\")")?;
    let in_sub = find_file(&sub, "a/b/c.txt", 5, "list_files(\"a\")")?;
    ensure!(
        in_sub.path == nested.path,
        "the same file must have the same absolute path in every listing: {:?} vs {:?}",
        in_sub.path,
        nested.path
    );
    ensure!(
        !sub.iter().any(|e| e.path.ends_with("/top.txt")),
        "list_files(\"a\") must list only the subdirectory; got {sub:?}"
    );

    let missing = sandbox
        .list_files("missing/dir")
        .await
        .or_fail("list_files of a missing directory")?;
    ensure!(
        missing.is_empty(),
        "a missing directory must list as empty; got {missing:?}"
    );

    // The absolute path is the one the program sees.
    let r = exec(&*sandbox, sh("cat \"$1\"", &[&top.path])).await?;
    ensure!(
        r.is_success() && r.stdout == "abc",
        "the program must be able to read the listed absolute path {:?}; got {}",
        top.path,
        brief(&r)
    );
    Ok(())
}

/// One path model on every engine: `root_dir` is the root as programs see it, the
/// files API takes paths under it or relative to it, and lists paths under it.
pub(crate) async fn files_under_root_dir(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let root = sandbox.root_dir().to_string_lossy().into_owned();
    ensure!(
        root.starts_with('/'),
        "root_dir must be an absolute path; got {root:?}"
    );
    let dir = format!("{}/dir", root.trim_end_matches('/'));
    let absolute = format!("{dir}/a.txt");
    sandbox
        .write_file(&absolute, b"by root_dir")
        .await
        .or_fail(format_args!("write_file({absolute:?})"))?;
    sandbox
        .write_file("dir/b.txt", b"relative")
        .await
        .or_fail("write_file(\"dir/b.txt\")")?;
    for listed_as in [dir.as_str(), "dir"] {
        let entries = sorted(
            sandbox
                .list_files(listed_as)
                .await
                .or_fail(format_args!("list_files({listed_as:?})"))?,
        );
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        let expected = [format!("{dir}/a.txt"), format!("{dir}/b.txt")];
        ensure!(
            paths == expected,
            "list_files({listed_as:?}) must list {expected:?} (under root_dir {root:?}); got {paths:?}"
        );
        for (entry, data) in entries.iter().zip([&b"by root_dir"[..], b"relative"]) {
            let back = sandbox.read_file(&entry.path).await.or_fail(format_args!(
                "read_file of the listed path {:?}",
                entry.path
            ))?;
            ensure!(
                back == data,
                "read_file({:?}) returned {:?}",
                entry.path,
                String::from_utf8_lossy(&back)
            );
        }
    }
    let top = sandbox
        .list_files(&root)
        .await
        .or_fail("list_files(root_dir)")?;
    ensure!(
        top.iter().any(|e| e.path == dir && e.is_dir),
        "list_files(root_dir) must hold {dir:?} as a directory; got {top:?}"
    );
    Ok(())
}

static ESCAPE_SEQ: AtomicU32 = AtomicU32::new(0);

/// Removes `path` if a broken engine created it, and says whether it existed.
fn existed_and_removed(path: &Path) -> bool {
    let existed = path.exists();
    if existed {
        let _ = std::fs::remove_file(path);
    }
    existed
}

/// The symlinks `files_path_escape` plants in the workdir.
const ESCAPE_LINKS: [&str; 2] = ["escape", "escape_etc"];

pub(crate) async fn files_path_escape(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let result = path_escape_checks(&*sandbox).await;
    // Remove the links to outside directories before anything deletes the workdir, so
    // that not even a destroy that wrongly follows symlinks can reach them.
    for link in ESCAPE_LINKS {
        let _ = std::fs::remove_file(sandbox.host_dir().join(link));
    }
    result
}

async fn path_escape_checks(sandbox: &dyn Sandbox) -> Check {
    let root = sandbox.host_dir().to_path_buf();
    let outside = tempfile::Builder::new()
        .prefix("paddock-conformance-outside-")
        .tempdir()
        .map_err(|e| {
            Stop::Skip(format!(
                "cannot create a directory outside the workdir: {e}"
            ))
        })?;
    let outside_path = outside.path().to_path_buf();
    let Some(outside_str) = outside_path.to_str() else {
        skip!("the temp dir path {} is not UTF-8", outside_path.display());
    };
    ensure!(
        !outside_path.starts_with(&root) && !root.starts_with(&outside_path),
        "the temp dir {} overlaps the workdir {}",
        outside_path.display(),
        root.display()
    );
    std::fs::write(outside_path.join("secret.txt"), "outside-secret")
        .map_err(|e| Stop::Skip(format!("cannot write outside the workdir: {e}")))?;

    let r = exec(
        sandbox,
        sh(
            "ln -s \"$1\" escape && ln -s /etc escape_etc",
            &[outside_str],
        ),
    )
    .await?;
    ensure!(
        r.is_success(),
        "the program could not create symlinks in its workdir: {}",
        brief(&r)
    );

    let outside_secret = format!("{outside_str}/secret.txt");
    for path in [
        "../x",
        "a/../../x",
        "/etc/passwd",
        outside_secret.as_str(),
        "escape/secret.txt",
        "escape_etc/passwd",
    ] {
        expect_code(
            sandbox
                .read_file(path)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned()),
            ErrorCode::PathEscape,
            format_args!("read_file({path:?})"),
        )?;
    }

    let seq = ESCAPE_SEQ.fetch_add(1, Ordering::Relaxed);
    let stray = format!(
        "paddock-conformance-escape-{}-{seq}.txt",
        std::process::id()
    );
    let parent = root.parent().map(Path::to_path_buf).unwrap_or_default();
    let dotdot = format!("../{stray}");
    let deep_dotdot = format!("a/../../{stray}");
    let outside_abs = format!("{outside_str}/absolute.txt");
    let writes: [(&str, std::path::PathBuf); 5] = [
        (dotdot.as_str(), parent.join(&stray)),
        (deep_dotdot.as_str(), parent.join(&stray)),
        (outside_abs.as_str(), outside_path.join("absolute.txt")),
        ("escape/written.txt", outside_path.join("written.txt")),
        (
            "escape/newdir/written.txt",
            outside_path.join("newdir/written.txt"),
        ),
    ];
    for (path, lands_at) in &writes {
        let result = sandbox.write_file(path, b"escaped").await;
        let created = existed_and_removed(lands_at);
        expect_code(
            result,
            ErrorCode::PathEscape,
            format_args!("write_file({path:?})"),
        )?;
        ensure!(
            !created,
            "write_file({path:?}) was refused but still created {}",
            lands_at.display()
        );
    }

    for path in ["../", "/etc", "escape"] {
        expect_code(
            sandbox.list_files(path).await,
            ErrorCode::PathEscape,
            format_args!("list_files({path:?})"),
        )?;
    }
    let secret = std::fs::read_to_string(outside_path.join("secret.txt")).unwrap_or_default();
    ensure!(
        secret == "outside-secret",
        "a file outside the workdir was changed: {secret:?}"
    );
    Ok(())
}

/// The symlink `cwd_path_escape` has a program plant.
const CWD_ESCAPE_LINK: &str = "cwd_escape";

pub(crate) async fn cwd_path_escape(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let result = cwd_escape_checks(&*sandbox).await;
    let _ = std::fs::remove_file(sandbox.host_dir().join(CWD_ESCAPE_LINK));
    result
}

async fn cwd_escape_checks(sandbox: &dyn Sandbox) -> Check {
    sandbox
        .write_file("sub/dir/keep", b"")
        .await
        .or_fail("write_file(\"sub/dir/keep\")")?;
    let r = exec(sandbox, sh("ln -s / \"$1\"", &[CWD_ESCAPE_LINK])).await?;
    ensure!(
        r.is_success(),
        "the program could not create a symlink in its workdir: {}",
        brief(&r)
    );
    let in_dir = |cwd: &str| {
        let mut request = sh("pwd", &[]);
        request.cwd = Some(cwd.to_string());
        request
    };
    let r = exec(sandbox, in_dir("sub/dir")).await?;
    ensure!(
        r.is_success() && r.stdout.trim_end().ends_with("/sub/dir"),
        "a program run with cwd \"sub/dir\" must start in that directory of its workdir: {}",
        brief(&r)
    );
    let through_link = format!("{CWD_ESCAPE_LINK}/etc");
    for cwd in [CWD_ESCAPE_LINK, through_link.as_str(), "../..", "sub/../.."] {
        expect_code(
            sandbox
                .exec(in_dir(cwd), &DiscardSink, CancelToken::new())
                .await,
            ErrorCode::PathEscape,
            format_args!("exec with cwd {cwd:?} (outside the workdir)"),
        )?;
    }
    expect_code(
        sandbox
            .exec(in_dir("sub/missing"), &DiscardSink, CancelToken::new())
            .await,
        ErrorCode::InvalidOptions,
        "exec with cwd \"sub/missing\" (a directory that does not exist)",
    )?;
    Ok(())
}

pub(crate) async fn files_shared_with_program(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    sandbox
        .write_file("in.txt", b"from-caller")
        .await
        .or_fail("write_file(in.txt)")?;
    sandbox
        .write_file("dir/sub/deep.txt", b"deep")
        .await
        .or_fail("write_file(dir/sub/deep.txt)")?;
    let r = exec(
        &*sandbox,
        sh("cat in.txt; printf :; cat dir/sub/deep.txt", &[]),
    )
    .await?;
    ensure!(
        r.is_success() && r.stdout == "from-caller:deep",
        "the program must read the files the caller wrote, from its working directory; got {}",
        brief(&r)
    );

    let r = exec(
        &*sandbox,
        sh(
            "mkdir -p made/by && printf from-program > made/by/program.txt",
            &[],
        ),
    )
    .await?;
    ensure!(
        r.is_success(),
        "the program could not write a file: {}",
        brief(&r)
    );
    let back = sandbox
        .read_file("made/by/program.txt")
        .await
        .or_fail("read_file of a file the program wrote")?;
    ensure!(
        back == b"from-program",
        "read_file must see what the program wrote; got {:?}",
        String::from_utf8_lossy(&back)
    );
    let listed = sandbox
        .list_files("made")
        .await
        .or_fail("list_files(\"made\")")?;
    find_file(&listed, "made/by/program.txt", 12, "list_files(\"made\")")?;
    Ok(())
}

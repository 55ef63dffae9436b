//! The filesystem service by commands run in the sandbox (`find`, `mkdir`, `mv`,
//! `rm`), for engines without the contract's file operations (the container engine,
//! until its agent serves them). Each command passes the policy, takes a limiter
//! permit and is audited as the sandbox's own command. The paths are passed as
//! arguments, never spliced into a script.

use paddock_core::{ExecRequest, Program};
use serde_json::{json, Value};

use crate::connect::{Code, ConnectError};
use crate::registry::Sbx;

use super::{MAX_DEPTH, MAX_ENTRIES};

/// How long a filesystem command may take.
const FS_TIMEOUT_MS: u64 = 30_000;

/// The `find -printf` format of an entry: type, size, permission bits, symbolic
/// mode, owner, group, mtime, symlink target, path; NUL-terminated.
const FORMAT: &str = "%y\\t%s\\t%m\\t%M\\t%u\\t%g\\t%T@\\t%l\\t%p\\0";

/// Exit codes the scripts use for a missing path and an existing one.
const MISSING: i32 = 3;
const EXISTS: i32 = 4;

/// Runs `script` in the sandbox with `args` as `$1`, `$2`, …
async fn sh(sbx: &Sbx, script: &str, args: &[&str]) -> Result<(i32, String, String), ConnectError> {
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        script.into(),
        "sh".into(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    let request = ExecRequest::new(Program::Command { argv }).with_timeout_ms(FS_TIMEOUT_MS);
    let r = sbx.handle.exec(request).await?;
    let code = r.exit_code().unwrap_or(-1);
    if r.outcome == paddock_core::Outcome::TimedOut {
        return Err(ConnectError::new(
            Code::DeadlineExceeded,
            format!(
                "the filesystem call took longer than {} s",
                FS_TIMEOUT_MS / 1000
            ),
        ));
    }
    if r.stdout_truncated {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            "the listing is larger than the sandbox's output limit; list a smaller directory or a lower depth",
        ));
    }
    Ok((code, r.stdout, r.stderr))
}

fn entry(record: &str) -> Option<Value> {
    let mut f = record.splitn(9, '\t');
    let kind = f.next()?;
    let size: i64 = f.next()?.parse().ok()?;
    let mode = u32::from_str_radix(f.next()?, 8).ok()?;
    let permissions = f.next()?;
    let owner = f.next()?;
    let group = f.next()?;
    let mtime: f64 = f.next()?.parse().ok()?;
    let target = f.next()?;
    let path = f.next()?;
    let kind = match kind {
        "d" => "FILE_TYPE_DIRECTORY",
        "l" => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_FILE",
    };
    let secs = mtime.floor();
    let when = time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .ok()
        .map(|t| t + time::Duration::nanoseconds(((mtime - secs) * 1e9) as i64))
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default();
    let name = if path == "/" {
        "/".to_string()
    } else {
        path.trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let mut v = json!({
        "name": name,
        "type": kind,
        "path": path,
        "size": size.to_string(),
        "mode": mode,
        "permissions": permissions,
        "owner": owner,
        "group": group,
        "modifiedTime": when,
    });
    if !target.is_empty() {
        v["symlinkTarget"] = json!(target);
    }
    Some(v)
}

pub(super) async fn stat(sbx: &Sbx, path: &str) -> Result<Value, ConnectError> {
    let script = format!(
        "[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; exec find \"$1\" -maxdepth 0 -printf '{FORMAT}'"
    );
    let (code, out, err) = sh(sbx, &script, &[path]).await?;
    match code {
        0 => out
            .split('\0')
            .find(|r| !r.is_empty())
            .and_then(entry)
            .ok_or_else(|| ConnectError::new(Code::Internal, "an entry could not be read")),
        MISSING => Err(ConnectError::not_found(format!(
            "path '{path}' does not exist"
        ))),
        _ => Err(ConnectError::new(
            Code::Internal,
            format!("stat `{path}`: {}", err.trim()),
        )),
    }
}

/// The entries below directory `path` (an absolute path of the sandbox), `depth`
/// levels down (1 to 32), at most 10 000.
pub(super) async fn list(sbx: &Sbx, path: &str, depth: u32) -> Result<Vec<Value>, ConnectError> {
    let path = path.to_string();
    let depth = depth.clamp(1, MAX_DEPTH).to_string();
    let script = format!(
        "[ -e \"$1\" ] || exit {MISSING}; [ -d \"$1\" ] || exit {EXISTS}; exec find -H \"$1\" -mindepth 1 -maxdepth \"$2\" -printf '{FORMAT}'"
    );
    let (code, out, err) = sh(sbx, &script, &[&path, &depth]).await?;
    match code {
        0 => {}
        MISSING => {
            return Err(ConnectError::not_found(format!(
                "directory '{path}' does not exist"
            )))
        }
        EXISTS => {
            return Err(ConnectError::invalid(format!(
                "path '{path}' is not a directory"
            )))
        }
        // A listing that met unreadable parts still lists the rest.
        _ if !out.is_empty() => {}
        _ => {
            return Err(ConnectError::new(
                Code::Internal,
                format!("listing `{path}`: {}", err.trim()),
            ))
        }
    }
    let entries: Vec<Value> = out
        .split('\0')
        .filter(|r| !r.is_empty())
        .filter_map(entry)
        .take(MAX_ENTRIES)
        .collect();
    Ok(entries)
}

/// `MakeDir`: the new directory's entry, or `ALREADY_EXISTS`.
pub(super) async fn make_dir(sbx: &Sbx, path: &str) -> Result<Value, ConnectError> {
    let script = format!("[ -e \"$1\" ] && exit {EXISTS}; mkdir -p -- \"$1\"");
    let (code, _, err) = sh(sbx, &script, &[path]).await?;
    match code {
        0 => Ok(json!({ "entry": stat(sbx, path).await? })),
        EXISTS => Err(ConnectError::new(
            Code::AlreadyExists,
            format!("directory '{path}' already exists"),
        )),
        _ => Err(ConnectError::invalid(format!(
            "making `{path}`: {}",
            err.trim()
        ))),
    }
}

/// `Move`: the moved entry at its new path.
pub(super) async fn rename(sbx: &Sbx, from: &str, to: &str) -> Result<Value, ConnectError> {
    let script = format!(
        "[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; mkdir -p -- \"$(dirname -- \"$2\")\" && mv -f -T -- \"$1\" \"$2\""
    );
    let (code, _, err) = sh(sbx, &script, &[from, to]).await?;
    match code {
        0 => Ok(json!({ "entry": stat(sbx, to).await? })),
        MISSING => Err(ConnectError::not_found(format!(
            "path '{from}' does not exist"
        ))),
        _ => Err(ConnectError::invalid(format!(
            "moving `{from}` to `{to}`: {}",
            err.trim()
        ))),
    }
}

/// `Remove`.
pub(super) async fn remove(sbx: &Sbx, path: &str) -> Result<Value, ConnectError> {
    let script = format!("[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; rm -rf -- \"$1\"");
    let (code, _, err) = sh(sbx, &script, &[path]).await?;
    match code {
        0 => Ok(json!({})),
        MISSING => Err(ConnectError::not_found(format!(
            "path '{path}' does not exist"
        ))),
        _ => Err(ConnectError::invalid(format!(
            "removing `{path}`: {}",
            err.trim()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_records_become_entries() {
        let v =
            entry("f\t5\t644\t-rw-r--r--\troot\troot\t1700000000.5\t\t/home/user/a.txt").unwrap();
        assert_eq!(v["name"], "a.txt");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "5");
        assert_eq!(v["mode"], 0o644);
        assert_eq!(v["modifiedTime"], "2023-11-14T22:13:20.5Z");
        assert!(v.get("symlinkTarget").is_none());
        let l = entry("l\t1\t777\tlrwxrwxrwx\tu\tg\t0\t/etc\t/home/user/link").unwrap();
        assert_eq!(l["type"], "FILE_TYPE_SYMLINK");
        assert_eq!(l["symlinkTarget"], "/etc");
        // A path with a tab in it keeps it.
        let t = entry("d\t0\t755\tdrwxr-xr-x\tu\tg\t0\t\t/home/user/a\tb").unwrap();
        assert_eq!(t["name"], "a\tb");
        assert!(entry("garbage").is_none());
    }
}

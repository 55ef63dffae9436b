//! Builds the container agent (`paddock-agent`, the workspace's `agent/` crate) as a
//! static executable for the target, for the container engine to carry
//! (`container/agent.rs` includes it; `docs/container.md`, "The agent").
//!
//! The agent is pid 1 of warm containers, whose root filesystem may have no C
//! library at all, or another one than the host's: so it is linked statically
//! (`+crt-static` on the target's own C library; glibc's `libc.a` comes with
//! Debian's `libc6-dev`, Fedora's `glibc-static`). It is built by a nested `cargo
//! build` of that one package, in release, with:
//! - `--target` the outer build's target, so that the static flag reaches the
//!   agent's code and not the build scripts and procedural macros of the host;
//! - a target directory of its own beside the outer one (`<target>/agent-static`),
//!   shared by every profile and command (`build`, `test`, `clippy`, `doc`), so the
//!   agent is built once, and the outer build's directory lock is never waited on;
//! - the outer build's compiler and jobserver (its `-j` bounds both builds), none of
//!   its `RUSTFLAGS` or wrappers (`clippy-driver`), `--locked --offline` (the outer
//!   build has resolved and fetched everything the agent needs).
//!
//! `PADDOCK_EMBED_AGENT=0` builds the engines without it: warm containers then need
//! a `paddock-agent` binary of their own (`container.agent_path`, or beside the
//! executable, or on `PATH`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The agent's file in `OUT_DIR`, empty when none is carried.
const EMBEDDED: &str = "paddock-agent";

fn main() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    println!("cargo::rerun-if-env-changed=PADDOCK_EMBED_AGENT");
    let agent = match built(&out_dir, &manifest_dir) {
        Ok(bytes) => bytes,
        Err(why) => {
            // Without it the engines still build; the container engine then looks
            // for the agent on disk, and says why there is none.
            println!("cargo::rustc-env=PADDOCK_AGENT_NOT_EMBEDDED={why}");
            Vec::new()
        }
    };
    write_if_changed(&out_dir.join(EMBEDDED), &agent);
}

/// The static agent's bytes, or why this build carries none. A failed build of
/// the agent fails the whole build (with what to do about it).
fn built(out_dir: &Path, manifest_dir: &Path) -> Result<Vec<u8>, String> {
    if std::env::var_os("PADDOCK_EMBED_AGENT").is_some_and(|v| v == "0") {
        return Err("built with PADDOCK_EMBED_AGENT=0".into());
    }
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return Err("containers need Linux".into());
    }
    let workspace = manifest_dir.parent().unwrap_or(manifest_dir);
    let manifest = workspace.join("agent").join("Cargo.toml");
    if !manifest.is_file() {
        // A packaged `paddock-engines`, without the workspace around it.
        println!(
            "cargo::warning=the agent's sources are not beside paddock-engines: no agent is built in"
        );
        return Err("built without the workspace's `agent/` crate".into());
    }
    for path in [
        workspace.join("agent").join("src"),
        manifest.clone(),
        workspace.join("core").join("src"),
        workspace.join("core").join("Cargo.toml"),
        workspace.join("Cargo.toml"),
        workspace.join("Cargo.lock"),
    ] {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let target_dir = nested_target_dir(out_dir);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["--package", "paddock-agent", "--bin", "paddock-agent"])
        .args(["--release", "--locked", "--offline", "--target", &target])
        .arg("--target-dir")
        .arg(&target_dir)
        // Static, small: no debug information, no symbols. Set here, in the
        // environment, over the workspace's release profile (which keeps line
        // tables for the host binaries' backtraces).
        .env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        // Not the outer build's flags (`--cfg loom`, a coverage or sanitizer
        // build's) nor its wrapper for workspace members (clippy's driver, whose
        // lints are the outer command's business).
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET");
    // Cargo's `Compiling …` lines on the outer build's stderr would interleave with
    // its own; they are kept for the error instead.
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("{}", failure(&format!("cannot start cargo: {e}"))));
    if !output.status.success() {
        panic!(
            "{}",
            failure(&format!(
                "`cargo build` of the agent failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        );
    }
    let binary = target_dir
        .join(&target)
        .join("release")
        .join("paddock-agent");
    Ok(std::fs::read(&binary)
        .unwrap_or_else(|e| panic!("{}", failure(&format!("reading {}: {e}", binary.display())))))
}

/// The message of a failed agent build: what failed, and what to do.
fn failure(what: &str) -> String {
    format!(
        "building the container agent (paddock-agent) as a static program failed: {what}\n\
         It needs the target's static C library (Debian, Ubuntu: `libc6-dev`; Fedora: \
         `glibc-static`). To build without it, set PADDOCK_EMBED_AGENT=0; warm \
         containers then need a `paddock-agent` binary (container.agent_path)."
    )
}

/// `<target>/agent-static` for an `OUT_DIR` of `<target>/[<triple>/]<profile>/build/
/// <package>-<hash>/out`: beside the outer build's profiles, shared by them. Any
/// other layout gets a directory inside `OUT_DIR` (correct, but not shared).
fn nested_target_dir(out_dir: &Path) -> PathBuf {
    let mut up = out_dir.ancestors();
    match (up.nth(2), up.nth(1)) {
        (Some(build), Some(target)) if build.file_name().is_some_and(|n| n == "build") => {
            target.join("agent-static")
        }
        _ => out_dir.join("agent-static"),
    }
}

/// Writes `bytes` to `path` unless it holds them already: the file is included
/// into the crate, whose recompilation (and its dependents') a new modification
/// time would force.
fn write_if_changed(path: &Path, bytes: &[u8]) {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return;
    }
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

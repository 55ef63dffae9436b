//! The agent binary warm containers run as their pid 1 (the `paddock_agent` crate),
//! and where the engine gets it.
//!
//! This crate carries the agent: `build.rs` builds it as a static executable, which
//! runs in any root filesystem, one without a C library included. Each engine
//! writes it into its own directory when it starts, and binds it from there into
//! every warm container, read-only, at [`AGENT_INSIDE`](super::warm::AGENT_INSIDE).
//!
//! The order: `container.agent_path` when set; else the carried agent; else a
//! `paddock-agent` file beside the running executable (or one directory up: a test
//! binary in `target/*/deps`), else on `PATH`. Those last two are for builds made
//! without the carried agent (`PADDOCK_EMBED_AGENT=0`), and need the host's C
//! library in the container's root unless they are static too.

use std::path::{Path, PathBuf};

/// The static agent, as `build.rs` built it; empty when this build carries none.
static EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/paddock-agent"));

/// Why this build carries no agent (`None` when it does).
const NOT_EMBEDDED: Option<&str> = option_env!("PADDOCK_AGENT_NOT_EMBEDDED");

/// The agent's file name: in the engine's directory, beside the executable, on
/// `PATH`.
const NAME: &str = "paddock-agent";

/// Where an engine's agent comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentSource {
    /// `container.agent_path`.
    Configured,
    /// The static agent this build carries, written into the engine's directory.
    Embedded,
    /// A `paddock-agent` file beside the running executable or on `PATH`.
    Found,
}

impl AgentSource {
    /// Its name in reports: `configured`, `embedded`, `found`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentSource::Configured => "configured",
            AgentSource::Embedded => "embedded",
            AgentSource::Found => "found",
        }
    }
}

/// The size of the agent this build carries, in bytes; `None` when it carries none.
pub fn embedded_agent_size() -> Option<usize> {
    (!EMBEDDED.is_empty()).then_some(EMBEDDED.len())
}

/// The agent for an engine whose directory is `engine_dir` (private to it, made
/// before): its path and where it came from, or why there is none.
pub(crate) fn find(
    configured: Option<&Path>,
    engine_dir: &Path,
) -> Result<(PathBuf, AgentSource), String> {
    if let Some(p) = configured {
        return if p.is_file() {
            Ok((p.to_path_buf(), AgentSource::Configured))
        } else {
            Err(format!(
                "container.agent_path `{}` is not a file",
                p.display()
            ))
        };
    }
    let carried = if EMBEDDED.is_empty() {
        format!(
            "this build carries no agent ({})",
            NOT_EMBEDDED.unwrap_or("not built")
        )
    } else {
        let path = engine_dir.join(NAME);
        match write_embedded(&path) {
            Ok(()) => return Ok((path, AgentSource::Embedded)),
            Err(e) => format!(
                "the carried agent could not be written to `{}`: {e}",
                path.display()
            ),
        }
    };
    on_disk().map(|p| (p, AgentSource::Found)).ok_or_else(|| {
        format!(
            "{carried}, and `{NAME}` was found neither beside this executable nor on PATH; \
             build it (`cargo build --release -p paddock-agent`) or set container.agent_path"
        )
    })
}

/// Writes the carried agent to `path` (a new file, mode 0755: the containers' root,
/// another host user under a user namespace, executes it). The engine's directory is
/// its own and new, so nobody else can have put a file there or see this one
/// half-written; the file is closed before any container starts.
fn write_embedded(path: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(path)?;
    file.write_all(EMBEDDED)?;
    // Whatever the process's umask (0077 under some service managers): the mode is
    // set, not masked.
    file.set_permissions(std::fs::Permissions::from_mode(0o755))
}

/// `paddock-agent` beside the running executable or one directory up, else on
/// `PATH`.
fn on_disk() -> Option<PathBuf> {
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            let candidate = dir.join(NAME);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    let path = std::env::var("PATH").unwrap_or_default();
    crate::env::resolve_program(NAME, &path, Path::new("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_carried_agent_is_a_static_executable() {
        let Some(_) = embedded_agent_size() else {
            // Built with PADDOCK_EMBED_AGENT=0.
            return;
        };
        // ELF, and no program interpreter (PT_INTERP, type 3): no dynamic loader,
        // no shared C library to find in the container's root.
        assert_eq!(&EMBEDDED[..4], b"\x7fELF");
        assert_eq!(EMBEDDED[4], 2, "64-bit");
        let at = |o: usize, n: usize| -> u64 {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&EMBEDDED[o..o + n]);
            u64::from_le_bytes(b)
        };
        let (phoff, phentsize, phnum) = (at(0x20, 8) as usize, at(0x36, 2) as usize, at(0x38, 2));
        let kinds: Vec<u64> = (0..phnum as usize)
            .map(|i| at(phoff + i * phentsize, 4))
            .collect();
        assert!(!kinds.is_empty());
        assert!(!kinds.contains(&3), "a dynamically linked agent: {kinds:?}");
    }

    #[test]
    fn the_carried_agent_is_written_executable_into_the_engine_directory() {
        if embedded_agent_size().is_none() {
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (path, source) = find(None, dir.path()).unwrap();
        assert_eq!(source, AgentSource::Embedded);
        assert_eq!(path, dir.path().join(NAME));
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
        assert_eq!(std::fs::read(&path).unwrap(), EMBEDDED);
        // The configured path comes first, and must be a file.
        let configured = dir.path().join("mine");
        std::fs::write(&configured, b"").unwrap();
        assert_eq!(
            find(Some(&configured), dir.path()).unwrap(),
            (configured, AgentSource::Configured)
        );
        let e = find(Some(&dir.path().join("none")), dir.path()).unwrap_err();
        assert!(e.contains("is not a file"), "{e}");
    }
}

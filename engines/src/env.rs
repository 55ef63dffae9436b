//! Environment sanitization for programs started on the host.

use std::collections::BTreeMap;
use std::ffi::OsString;

/// Substrings that mark a variable as secret (matched case-insensitively).
pub const SECRET_MARKERS: &[&str] = &["SECRET", "KEY", "TOKEN", "PASSWORD", "CREDENTIAL", "AUTH"];
/// Variables that describe the host user and are always dropped.
pub const DROPPED: &[&str] = &["HOME", "USER", "SHELL", "LOGNAME"];
/// `PATH` given to programs when the host has none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// Whether the host variable `name` may pass to a program: not secret-looking and not
/// a host identity variable, unless `passthrough` names it explicitly.
pub fn allowed(name: &str, passthrough: &[String]) -> bool {
    if passthrough.iter().any(|p| p == name) {
        return true;
    }
    let upper = name.to_ascii_uppercase();
    !DROPPED.contains(&upper.as_str()) && !SECRET_MARKERS.iter().any(|m| upper.contains(m))
}

/// The sanitized base environment: the host's variables that are [`allowed`], with a
/// `PATH` guaranteed. Captured once per engine, so the spawn path never reads the
/// process environment.
pub fn sanitized_host_env(passthrough: &[String]) -> BTreeMap<String, String> {
    sanitized_env(std::env::vars_os(), passthrough)
}

/// [`sanitized_host_env`] over `host` instead of the process environment.
pub fn sanitized_env<I, K, V>(host: I, passthrough: &[String]) -> BTreeMap<String, String>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<OsString>,
    V: Into<OsString>,
{
    let mut env = utf8_vars(host)
        .filter(|(k, _)| allowed(k, passthrough))
        .collect::<BTreeMap<_, _>>();
    env.entry("PATH".into())
        .or_insert_with(|| DEFAULT_PATH.into());
    env
}

/// The host variables a container receives: exactly those `passthrough` names, taken
/// from `host` (the process environment when the engine starts). Nothing else of the
/// host's environment is passed, whatever its name: the engine sets the container's
/// own `PATH`, `HOME`, `PWD` and `TMPDIR` itself, and a request adds its own `env`.
pub fn listed_env<I, K, V>(host: I, passthrough: &[String]) -> BTreeMap<String, String>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<OsString>,
    V: Into<OsString>,
{
    utf8_vars(host)
        .filter(|(k, _)| passthrough.iter().any(|p| p == k))
        .collect()
}

/// The variables of `host` whose names and values are UTF-8 (others are skipped).
fn utf8_vars<I, K, V>(host: I) -> impl Iterator<Item = (String, String)>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<OsString>,
    V: Into<OsString>,
{
    host.into_iter()
        .filter_map(|(k, v)| Some((k.into().into_string().ok()?, v.into().into_string().ok()?)))
}

/// Looks `program` up on `path` (a `PATH` value) the way `execvp` would; names with a
/// `/` are taken as they are.
pub fn resolve_program(
    program: &str,
    path: &str,
    cwd: &std::path::Path,
) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.contains('/') {
        let p = cwd.join(program);
        return executable(&p).then_some(p);
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| executable(p))
}

/// An interpreter found on `PATH`, and the binary behind it, found once, on first
/// use ([`Interpreter::path`]) or ahead of it ([`Interpreter::resolve_in_background`]).
#[derive(Clone)]
pub struct Interpreter {
    found: std::path::PathBuf,
    language: paddock_core::Language,
    env: std::sync::Arc<std::collections::BTreeMap<String, String>>,
    real: std::sync::Arc<std::sync::OnceLock<std::path::PathBuf>>,
}

impl std::fmt::Debug for Interpreter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interpreter")
            .field("found", &self.found)
            .field("real", &self.real.get())
            .finish()
    }
}

impl PartialEq for Interpreter {
    fn eq(&self, other: &Self) -> bool {
        self.found == other.found && self.language == other.language
    }
}

impl Eq for Interpreter {}

impl Interpreter {
    /// `found` on `PATH` for `language`; `env` is what the launcher runs with when it
    /// is asked for the binary behind it.
    pub fn new(
        found: std::path::PathBuf,
        language: paddock_core::Language,
        env: std::sync::Arc<std::collections::BTreeMap<String, String>>,
    ) -> Interpreter {
        Interpreter {
            found,
            language,
            env,
            real: Default::default(),
        }
    }

    /// What `PATH` gave (a launcher, or the binary itself).
    pub fn found(&self) -> &std::path::Path {
        &self.found
    }

    /// The binary to run: [`real_interpreter`] of what was found, asked once (the
    /// first call may start the launcher, and blocks for it).
    pub fn path(&self) -> &std::path::Path {
        self.real
            .get_or_init(|| real_interpreter(self.found.clone(), self.language, &self.env))
    }

    /// Finds the binary now, in a thread of its own, so that the first execution
    /// does not wait for it.
    pub fn resolve_in_background(&self) {
        if self.real.get().is_some() {
            return;
        }
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("paddock-interp".into())
            .spawn(move || {
                me.path();
            });
    }
}

/// The binary behind an interpreter found on `PATH`.
///
/// Version managers put launcher scripts on `PATH` (pyenv's `python3` is a bash script
/// that runs `pyenv exec`); starting one costs many times what the interpreter itself
/// costs. When `found` is a script, the interpreter is asked for its own executable
/// (`sys.executable`, `process.execPath`) once, and that absolute path is used; when
/// asking fails, `found` is kept.
pub fn real_interpreter(
    found: std::path::PathBuf,
    language: paddock_core::Language,
    env: &std::collections::BTreeMap<String, String>,
) -> std::path::PathBuf {
    use std::io::Read;
    let mut head = [0u8; 2];
    let is_script = std::fs::File::open(&found)
        .and_then(|mut f| f.read_exact(&mut head))
        .map(|()| head == *b"#!")
        .unwrap_or(false);
    let ask: &[&str] = match language {
        paddock_core::Language::Python => &["-c", "import sys; print(sys.executable)"],
        paddock_core::Language::Javascript => &["-p", "process.execPath"],
        paddock_core::Language::Shell => return found,
    };
    if !is_script {
        return found;
    }
    let out = std::process::Command::new(&found)
        .args(ask)
        .env_clear()
        .envs(env)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let Ok(out) = out else { return found };
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let real = std::path::PathBuf::from(&text);
    if out.status.success() && real.is_absolute() && real.is_file() {
        real
    } else {
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_looking_and_identity_variables_are_dropped() {
        for name in [
            "SECRET_X",
            "API_KEY",
            "github_token",
            "DB_PASSWORD",
            "AWS_CREDENTIALS",
            "AUTH",
            "HOME",
            "user",
            "SHELL",
            "LOGNAME",
            "keychain",
        ] {
            assert!(!allowed(name, &[]), "{name}");
        }
        for name in ["PATH", "LANG", "TERM", "TZ"] {
            assert!(allowed(name, &[]), "{name}");
        }
        assert!(allowed("API_KEY", &["API_KEY".to_string()]));
    }

    #[test]
    fn the_sanitized_env_drops_secrets_and_keeps_the_rest() {
        let host = [
            ("DATABASE_PASSWORD", "hunter2"),
            ("LANG", "C.UTF-8"),
            ("HOME", "/root"),
        ];
        let env = sanitized_env(host, &[]);
        assert_eq!(env.get("LANG").map(String::as_str), Some("C.UTF-8"));
        assert!(!env.contains_key("DATABASE_PASSWORD"));
        assert!(!env.contains_key("HOME"));
        assert_eq!(env.get("PATH").map(String::as_str), Some(DEFAULT_PATH));
    }

    #[test]
    fn the_listed_env_holds_only_listed_variables() {
        let host = [
            ("DATABASE_URL", "postgres://u:pass@h/db"),
            ("PADDOCK_LEAK_PROBE", "x"),
            ("LANG", "C.UTF-8"),
            ("PATH", "/host/bin"),
            ("AWS_PROFILE", "dev"),
            ("API_TOKEN", "t0k3n"),
        ];
        let listed = ["AWS_PROFILE".to_string(), "API_TOKEN".to_string()];
        let env = listed_env(host, &listed);
        assert_eq!(
            env,
            BTreeMap::from([
                ("API_TOKEN".to_string(), "t0k3n".to_string()),
                ("AWS_PROFILE".to_string(), "dev".to_string()),
            ])
        );
        assert!(listed_env(host, &[]).is_empty());
        // Listed but not set on the host: absent, not empty.
        assert!(listed_env(host, &["UNSET_HERE".to_string()]).is_empty());
        // Names match exactly, case included.
        assert!(listed_env(host, &["aws_profile".to_string()]).is_empty());
        // A value that is not UTF-8 is skipped rather than mangled.
        use std::os::unix::ffi::OsStringExt;
        let odd = [(OsString::from("ODD"), OsString::from_vec(vec![0xff, 0xfe]))];
        assert!(listed_env(odd, &["ODD".to_string()]).is_empty());
    }

    #[test]
    fn resolves_on_path() {
        let sh = resolve_program("sh", DEFAULT_PATH, std::path::Path::new("/")).unwrap();
        assert!(sh.is_absolute());
        assert!(resolve_program(
            "no-such-program-xyz",
            DEFAULT_PATH,
            std::path::Path::new("/")
        )
        .is_none());
        assert_eq!(
            resolve_program("/bin/sh", "", std::path::Path::new("/")).unwrap(),
            std::path::PathBuf::from("/bin/sh")
        );
    }
}

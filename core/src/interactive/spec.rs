//! What to start in a sandbox: a background process ([`ProcessSpec`]) or a terminal
//! ([`TerminalSpec`] of a [`TerminalSize`]), and their validation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Most arguments (and environment variables) a process may get.
const MAX_ARGS: usize = 4096;
/// Most bytes of all arguments and environment variables together.
const MAX_ARG_BYTES: usize = 1 << 20;
/// Most bytes of a process's tag.
const MAX_TAG_BYTES: usize = 256;

/// A background process to start in a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    /// The program and its arguments; a bare name is looked up on the sandbox's PATH.
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub argv: Vec<String>,
    /// Environment variables added to the sandbox's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory, inside the sandbox's workdir (default: the workdir).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Whether stdin is a pipe the handle writes to; otherwise it reads as empty.
    #[serde(default)]
    pub stdin: bool,
    /// A name of the caller's to find the process by among the sandbox's (the
    /// latest one started with it); at most 256 bytes, no control characters.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(length(max = 256)))]
    pub tag: Option<String>,
}

impl ProcessSpec {
    /// A process running `argv`, stdin empty.
    pub fn new<I, S>(argv: I) -> ProcessSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ProcessSpec {
            argv: argv.into_iter().map(Into::into).collect(),
            ..ProcessSpec::default()
        }
    }

    /// With stdin open for writes through the handle.
    pub fn with_stdin(mut self) -> ProcessSpec {
        self.stdin = true;
        self
    }

    /// `INVALID_OPTIONS` for an empty argv, NUL bytes or oversized arguments.
    pub fn validate(&self) -> Result<()> {
        validate_command("argv", &self.argv, &self.env)?;
        validate_tag(self.tag.as_deref())
    }
}

/// The most rows (and columns) a terminal may have.
const MAX_TERMINAL_SIDE: u16 = 1000;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Rows (1..=1000).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_TERMINAL_SIDE)))]
    pub rows: u16,
    /// Columns (1..=1000).
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_TERMINAL_SIDE)))]
    pub cols: u16,
}

impl Default for TerminalSize {
    fn default() -> Self {
        TerminalSize { rows: 24, cols: 80 }
    }
}

impl TerminalSize {
    /// `INVALID_OPTIONS` unless both sides are within 1..=1000.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("size.rows", self.rows), ("size.cols", self.cols)] {
            if !(1..=MAX_TERMINAL_SIDE).contains(&v) {
                return Err(Error::invalid_options(
                    name,
                    format!("{v} is out of range; use 1 to 1000"),
                ));
            }
        }
        Ok(())
    }
}

/// A terminal to open in a sandbox: a command on a pseudo-terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TerminalSpec {
    /// The command (default `/bin/sh`); a bare name is looked up on the sandbox's PATH.
    #[serde(default = "default_shell")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The initial size.
    #[serde(default)]
    pub size: TerminalSize,
    /// Environment variables added to the sandbox's own (`TERM` defaults to
    /// `xterm-256color`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory, inside the sandbox's workdir (default: the workdir).
    #[serde(default)]
    pub cwd: Option<String>,
    /// A name of the caller's to find the terminal by, as [`ProcessSpec::tag`].
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(length(max = 256)))]
    pub tag: Option<String>,
}

fn default_shell() -> String {
    "/bin/sh".into()
}

impl Default for TerminalSpec {
    fn default() -> Self {
        TerminalSpec {
            command: default_shell(),
            args: Vec::new(),
            size: TerminalSize::default(),
            env: BTreeMap::new(),
            cwd: None,
            tag: None,
        }
    }
}

impl TerminalSpec {
    /// A terminal running `command` with `args`.
    pub fn new<I, S>(command: impl Into<String>, args: I) -> TerminalSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        TerminalSpec {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
            ..TerminalSpec::default()
        }
    }

    /// The argv: the command, then its arguments.
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.command.clone())
            .chain(self.args.iter().cloned())
            .collect()
    }

    /// `INVALID_OPTIONS` for an empty command, NUL bytes, oversized arguments or a
    /// size out of range.
    pub fn validate(&self) -> Result<()> {
        validate_command("command", &self.argv(), &self.env)?;
        validate_tag(self.tag.as_deref())?;
        self.size.validate()
    }
}

/// `INVALID_OPTIONS` for a tag over [`MAX_TAG_BYTES`] or with control characters.
fn validate_tag(tag: Option<&str>) -> Result<()> {
    let Some(tag) = tag else {
        return Ok(());
    };
    if tag.len() > MAX_TAG_BYTES {
        return Err(Error::invalid_options(
            "tag",
            format!("{} bytes; at most {MAX_TAG_BYTES}", tag.len()),
        ));
    }
    if tag.chars().any(char::is_control) {
        return Err(Error::invalid_options(
            "tag",
            "remove the control characters",
        ));
    }
    Ok(())
}

fn validate_command(field: &str, argv: &[String], env: &BTreeMap<String, String>) -> Result<()> {
    if argv.first().is_none_or(|a| a.is_empty()) {
        return Err(Error::invalid_options(field, "name a program to run"));
    }
    if argv.len() + env.len() > MAX_ARGS {
        return Err(Error::invalid_options(
            field,
            format!("too many arguments and variables; at most {MAX_ARGS}"),
        ));
    }
    let mut bytes = 0;
    for s in argv.iter().chain(env.values()) {
        bytes += s.len();
        if s.contains('\0') {
            return Err(Error::invalid_options(field, "remove the NUL byte"));
        }
    }
    for k in env.keys() {
        bytes += k.len();
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(Error::invalid_options(
                "env",
                format!("{k:?} is not a variable name"),
            ));
        }
    }
    if bytes > MAX_ARG_BYTES {
        return Err(Error::invalid_options(
            field,
            format!("arguments and variables take {bytes} bytes; at most {MAX_ARG_BYTES}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorCode;

    use super::*;

    #[test]
    fn specs_are_validated() {
        assert!(ProcessSpec::new(["sleep", "1"]).validate().is_ok());
        assert_eq!(
            ProcessSpec::new(Vec::<String>::new())
                .validate()
                .unwrap_err()
                .code,
            ErrorCode::InvalidOptions
        );
        assert!(ProcessSpec::new(["a\0b"]).validate().is_err());
        let mut bad_env = ProcessSpec::new(["true"]);
        bad_env.env.insert("A=B".into(), "1".into());
        assert!(bad_env.validate().is_err());
        assert!(TerminalSpec::default().validate().is_ok());
        let mut t = TerminalSpec::default();
        t.size.cols = 0;
        assert!(t.validate().unwrap_err().message.contains("size.cols"));
        let spec: TerminalSpec =
            serde_json::from_str(r#"{"command":"bash","size":{"rows":40,"cols":120}}"#).unwrap();
        assert_eq!(spec.argv(), vec!["bash"]);
        assert_eq!(
            spec.size,
            TerminalSize {
                rows: 40,
                cols: 120
            }
        );
        assert!(serde_json::from_str::<ProcessSpec>(r#"{"argv":["x"],"bogus":1}"#).is_err());
    }

    #[test]
    fn tags_are_bounded_and_printable() {
        let tagged = |tag: &str| ProcessSpec {
            tag: Some(tag.into()),
            ..ProcessSpec::new(["true"])
        };
        assert!(tagged("web-server").validate().is_ok());
        assert!(tagged(&"x".repeat(MAX_TAG_BYTES)).validate().is_ok());
        let e = tagged(&"x".repeat(MAX_TAG_BYTES + 1))
            .validate()
            .unwrap_err();
        assert_eq!(
            (e.code, e.message.contains("tag")),
            (ErrorCode::InvalidOptions, true)
        );
        assert!(tagged("a\nb").validate().is_err());
        let t = TerminalSpec {
            tag: Some("\u{7}".into()),
            ..TerminalSpec::default()
        };
        assert!(t.validate().unwrap_err().message.contains("tag"));
    }
}

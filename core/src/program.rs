//! What an execution runs: a command, a code snippet, or a json-stdio handler.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The program an execution runs.
///
/// On the wire it is one of `{"command":[…]}`, `{"language":"python","code":"…"}`,
/// `{"handler":"name","input":{…}}` or `{"resume":"token","value":…}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged, deny_unknown_fields)]
pub enum Program {
    /// Run an argv directly; `argv[0]` is looked up on `PATH`.
    Command {
        /// The argument vector; must not be empty.
        #[serde(rename = "command")]
        #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
        argv: Vec<String>,
    },
    /// Run source code with the language's interpreter.
    Code {
        /// The language of `source`.
        language: Language,
        /// The source code.
        #[serde(rename = "code")]
        source: String,
    },
    /// Call a named json-stdio handler with a JSON input.
    Invoke {
        /// The handler's name, as configured.
        #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
        handler: String,
        /// The JSON input passed in the `invoke` frame.
        #[serde(default)]
        input: serde_json::Value,
    },
    /// Continue an invocation that ended [`Outcome::Suspended`](crate::Outcome), in
    /// the sandbox that holds it, with the value its token resolved to.
    Resume {
        /// The token the invocation waits for.
        #[serde(rename = "resume")]
        #[cfg_attr(feature = "schema", schemars(length(min = 1)))]
        token_id: String,
        /// What the token resolved to.
        #[serde(default)]
        value: serde_json::Value,
    },
}

impl Program {
    /// Shorthand for a [`Program::Command`].
    pub fn command<I, S>(argv: I) -> Program
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Program::Command {
            argv: argv.into_iter().map(Into::into).collect(),
        }
    }

    /// Shorthand for a [`Program::Code`].
    pub fn code(language: Language, source: impl Into<String>) -> Program {
        Program::Code {
            language,
            source: source.into(),
        }
    }

    /// The kind of program, for capability checks.
    pub fn kind(&self) -> ProgramKind {
        match self {
            Program::Command { .. } => ProgramKind::Command,
            Program::Code { language, .. } => ProgramKind::Code(*language),
            Program::Invoke { .. } => ProgramKind::Invoke,
            Program::Resume { .. } => ProgramKind::Resume,
        }
    }

    /// The text whose hash the audit log records: the source, the argv joined by
    /// NUL, the handler name, or the token resumed.
    pub fn audit_text(&self) -> String {
        match self {
            Program::Command { argv } => argv.join("\0"),
            Program::Code { source, .. } => source.clone(),
            Program::Invoke { handler, .. } => handler.clone(),
            Program::Resume { token_id, .. } => token_id.clone(),
        }
    }

    /// Checks the program's own shape (non-empty argv, no NUL bytes).
    pub fn validate(&self) -> Result<()> {
        match self {
            Program::Command { argv } => {
                if argv.is_empty() || argv[0].is_empty() {
                    return Err(Error::invalid_options(
                        "program.command",
                        "must hold at least the program name",
                    ));
                }
                if argv.iter().any(|a| a.contains('\0')) {
                    return Err(Error::invalid_options(
                        "program.command",
                        "arguments must not contain NUL bytes",
                    ));
                }
            }
            Program::Code { source, .. } => {
                if source.contains('\0') {
                    return Err(Error::invalid_options(
                        "program.code",
                        "source must not contain NUL bytes",
                    ));
                }
            }
            Program::Invoke { handler, .. } => {
                if handler.is_empty() {
                    return Err(Error::invalid_options(
                        "program.handler",
                        "must name a configured handler",
                    ));
                }
            }
            Program::Resume { token_id, .. } => {
                if token_id.is_empty() || token_id.contains('\0') {
                    return Err(Error::invalid_options(
                        "program.resume",
                        "must be the token_id of a suspended execution",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A source language for [`Program::Code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Python 3 (`python3`).
    Python,
    /// JavaScript (`node` for processes, QuickJS for isolates).
    Javascript,
    /// POSIX shell (`sh`).
    Shell,
}

impl Language {
    /// Every language, in declaration order.
    pub const ALL: &'static [Language] = &[Language::Python, Language::Javascript, Language::Shell];

    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Javascript => "javascript",
            Language::Shell => "shell",
        }
    }

    /// Parses a wire name; `js`, `node`, `py`, `sh` and `bash` are accepted aliases.
    pub fn parse(s: &str) -> Option<Language> {
        match s.to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => Some(Language::Python),
            "javascript" | "js" | "node" => Some(Language::Javascript),
            "shell" | "sh" | "bash" => Some(Language::Shell),
            _ => None,
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a [`Program`], as engines advertise it in their capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramKind {
    /// [`Program::Command`].
    Command,
    /// [`Program::Code`] in the given language.
    Code(Language),
    /// [`Program::Invoke`].
    Invoke,
    /// [`Program::Resume`].
    Resume,
}

impl fmt::Display for ProgramKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramKind::Command => f.write_str("command"),
            ProgramKind::Code(l) => write!(f, "{l} code"),
            ProgramKind::Invoke => f.write_str("handler invocation"),
            ProgramKind::Resume => f.write_str("resume of a suspended invocation"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_forms_parse() {
        let p: Program = serde_json::from_str(r#"{"command":["sh","-c","echo hi"]}"#).unwrap();
        assert_eq!(p, Program::command(["sh", "-c", "echo hi"]));
        let p: Program =
            serde_json::from_str(r#"{"language":"python","code":"print(1)"}"#).unwrap();
        assert_eq!(p, Program::code(Language::Python, "print(1)"));
        let p: Program = serde_json::from_str(r#"{"handler":"h","input":{"a":1}}"#).unwrap();
        assert_eq!(p.kind(), ProgramKind::Invoke);
        assert!(serde_json::from_str::<Program>(r#"{"language":"cobol","code":"x"}"#).is_err());
        assert!(serde_json::from_str::<Program>(r#"{"nothing":1}"#).is_err());
    }

    #[test]
    fn validation_names_the_field() {
        let e = Program::command(Vec::<String>::new())
            .validate()
            .unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidOptions);
        assert!(e.message.contains("program.command"));
        assert!(Program::command(["a\0b"]).validate().is_err());
        assert!(Program::command(["true"]).validate().is_ok());
    }
}

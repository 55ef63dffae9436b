//! One conformance case and its result.

use std::fmt;

use paddock_core::{Capabilities, ErrorCode, ProgramKind};

use crate::context::Ctx;
use crate::factory::BoxFuture;

/// The result of one case against one engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseResult {
    /// The engine met the contract the case checks.
    Passed,
    /// The engine or host cannot do what the case needs; the reason says what.
    Skipped(String),
    /// The engine broke the contract; the message says what was expected and what
    /// came back.
    Failed(String),
}

impl CaseResult {
    /// Whether the case passed.
    pub fn is_passed(&self) -> bool {
        matches!(self, CaseResult::Passed)
    }

    /// Whether the case was skipped.
    pub fn is_skipped(&self) -> bool {
        matches!(self, CaseResult::Skipped(_))
    }

    /// Whether the case failed.
    pub fn is_failed(&self) -> bool {
        matches!(self, CaseResult::Failed(_))
    }
}

impl fmt::Display for CaseResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseResult::Passed => f.write_str("passed"),
            CaseResult::Skipped(reason) => write!(f, "skipped: {reason}"),
            CaseResult::Failed(message) => write!(f, "FAILED: {message}"),
        }
    }
}

/// Something a case needs from the engine, checked against its [`Capabilities`]
/// before the case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// The engine runs this kind of program (the cases use `Program::Command` with
    /// `sh -c` scripts).
    Program(ProgramKind),
    /// The engine advertises this feature in [`Capabilities::features`].
    Feature(&'static str),
}

/// How a case stops early.
#[derive(Debug)]
pub(crate) enum Stop {
    Skip(String),
    Fail(String),
}

/// What a case body returns: `Ok(())` is a pass.
pub(crate) type Check = Result<(), Stop>;

/// The body of a case.
pub(crate) type CaseFn = fn(Ctx) -> BoxFuture<'static, Check>;

/// One case of the suite.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name, which is also the name of its generated `#[test]`.
    pub name: &'static str,
    /// What the case checks, in one sentence.
    pub description: &'static str,
    /// What the case needs from the engine.
    pub requires: &'static [Requirement],
    pub(crate) body: CaseFn,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("requires", &self.requires)
            .finish_non_exhaustive()
    }
}

impl Case {
    /// `Ok` when an engine with `caps` can run this case, or the reason it cannot.
    pub fn can_run(&self, caps: &Capabilities) -> Result<(), String> {
        for req in self.requires {
            match req {
                Requirement::Program(kind) if !caps.supports_program(*kind) => {
                    return Err(format!(
                        "the engine does not run {kind} programs (it runs: {})",
                        caps.programs.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
                Requirement::Feature(feature) if !caps.has_feature(feature) => {
                    return Err(format!(
                        "the engine does not advertise the `{feature}` feature"
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Turns an unexpected engine error into a failure that says which call it was.
pub(crate) trait OrFail<T> {
    fn or_fail(self, what: impl fmt::Display) -> Result<T, Stop>;
}

impl<T> OrFail<T> for paddock_core::Result<T> {
    fn or_fail(self, what: impl fmt::Display) -> Result<T, Stop> {
        self.map_err(|e| Stop::Fail(format!("{what}: unexpected error {e}")))
    }
}

/// Checks that `result` is an error with `code`.
pub(crate) fn expect_code<T: fmt::Debug>(
    result: paddock_core::Result<T>,
    code: ErrorCode,
    what: impl fmt::Display,
) -> Check {
    match result {
        Err(e) if e.code == code => Ok(()),
        Err(e) => fail!("{what}: expected {code}, got error {e}"),
        Ok(v) => {
            let shown = format!("{v:?}");
            fail!(
                "{what}: expected {code}, but it succeeded with {}",
                clip(&shown, 300)
            )
        }
    }
}

/// At most `max` characters of `s`, with an ellipsis when cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

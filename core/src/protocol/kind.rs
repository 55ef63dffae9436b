//! The kinds of json-stdio protocol v1 frame, who sends each, and the protocol's
//! constants.

use std::fmt;

/// The protocol version this crate speaks; every frame carries it as `"v"`.
pub const PROTOCOL_VERSION: u64 = 1;

/// The exit code with which a one-shot handler ends after writing a `suspend` frame.
pub const SUSPEND_EXIT_CODE: i32 = 42;

/// Who sends a kind of frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Written by the host to the handler's stdin.
    HostToHandler,
    /// Written by the handler to its stdout.
    HandlerToHost,
}

/// The `kind` of a frame, without its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// `invoke`: run the handler on an input.
    Invoke,
    /// `resume`: continue a suspended invocation with a value.
    Resume,
    /// `cancel`: stop an invocation.
    Cancel,
    /// `output`: the invocation's result.
    Output,
    /// `error`: the invocation failed.
    Error,
    /// `suspend`: the invocation waits on an external token.
    Suspend,
    /// `log`: a piece of the handler's diagnostic output.
    Log,
}

impl FrameKind {
    /// Every kind, in the order the specification lists them.
    pub const ALL: &'static [FrameKind] = &[
        FrameKind::Invoke,
        FrameKind::Resume,
        FrameKind::Cancel,
        FrameKind::Output,
        FrameKind::Error,
        FrameKind::Suspend,
        FrameKind::Log,
    ];

    /// The wire name, for example `"invoke"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            FrameKind::Invoke => "invoke",
            FrameKind::Resume => "resume",
            FrameKind::Cancel => "cancel",
            FrameKind::Output => "output",
            FrameKind::Error => "error",
            FrameKind::Suspend => "suspend",
            FrameKind::Log => "log",
        }
    }

    /// Looks a kind up by its wire name.
    pub fn from_wire(s: &str) -> Option<FrameKind> {
        FrameKind::ALL.iter().copied().find(|k| k.as_str() == s)
    }

    /// Who sends frames of this kind.
    pub const fn direction(self) -> Direction {
        match self {
            FrameKind::Invoke | FrameKind::Resume | FrameKind::Cancel => Direction::HostToHandler,
            FrameKind::Output | FrameKind::Error | FrameKind::Suspend | FrameKind::Log => {
                Direction::HandlerToHost
            }
        }
    }

    /// Whether a frame of this kind ends the handler's turn for an id: `output`,
    /// `error` and `suspend`. Exactly one of them answers each `invoke` and `resume`.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            FrameKind::Output | FrameKind::Error | FrameKind::Suspend
        )
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

//! [`ProtocolError`]: what was wrong with a frame, and where in the stream it was.

use std::fmt;

use crate::error::{Error, ErrorCode};

/// What kind of protocol violation a [`ProtocolError`] reports.
///
/// Every kind maps to the single wire code [`ErrorCode::ProtocolError`]; the kind lets
/// Rust callers and tests tell the cases apart without matching on message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProtocolErrorKind {
    /// A line was longer than the decoder's maximum frame size.
    TooLarge,
    /// The stream ended in the middle of a line (no terminating newline).
    Truncated,
    /// [`parse`](super::parse) was given an empty or whitespace-only line.
    Empty,
    /// [`parse`](super::parse) was given bytes that contain a newline before the end.
    NotOneLine,
    /// The line is not valid UTF-8.
    InvalidUtf8,
    /// The line is not valid JSON (or nests deeper than the parser allows).
    InvalidJson,
    /// The line is valid JSON but not a JSON object.
    NotAnObject,
    /// The `v` field is missing or is not the integer `1`.
    Version,
    /// The `kind` field names a kind that protocol v1 does not define.
    UnknownKind,
    /// A field of a known kind is missing, has the wrong type or an invalid value.
    InvalidField,
    /// A well-formed frame arrived where the turn rules do not allow it: a host
    /// kind from a handler, another invocation's id, or bytes after a terminal frame.
    OutOfOrder,
}

/// A malformed json-stdio frame.
///
/// `line` and `offset` are set when the error comes from a
/// [`FrameDecoder`](super::FrameDecoder): `line` is the 1-based number of the offending
/// line in the stream and `offset` the byte offset at which that line starts. Both are
/// `None` for an error from [`parse`](super::parse), which sees one line only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ProtocolError {
    /// Which rule the frame broke.
    pub kind: ProtocolErrorKind,
    /// What was wrong and what to do about it.
    pub message: String,
    /// The 1-based line number in the stream, when known.
    pub line: Option<u64>,
    /// The byte offset of the start of the line in the stream, when known.
    pub offset: Option<u64>,
}

impl ProtocolError {
    /// An error of `kind` with `message` and no stream position.
    pub fn new(kind: ProtocolErrorKind, message: impl Into<String>) -> ProtocolError {
        ProtocolError {
            kind,
            message: message.into(),
            line: None,
            offset: None,
        }
    }

    /// The same error located at `line` (1-based) starting at byte `offset`.
    pub fn at(mut self, line: u64, offset: u64) -> ProtocolError {
        self.line = Some(line);
        self.offset = Some(offset);
        self
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.offset) {
            (Some(line), Some(offset)) => write!(f, "line {line} (byte {offset}): ")?,
            (Some(line), None) => write!(f, "line {line}: ")?,
            (None, Some(offset)) => write!(f, "byte {offset}: ")?,
            (None, None) => {}
        }
        f.write_str(&self.message)
    }
}

impl From<ProtocolError> for Error {
    fn from(err: ProtocolError) -> Error {
        Error::new(ErrorCode::ProtocolError, err.to_string())
    }
}

/// Shortens text taken from an untrusted frame before it is quoted in a message, so
/// that an error about a 1 MiB field is not itself 1 MiB long.
pub(crate) fn excerpt(text: &str) -> String {
    const MAX_CHARS: usize = 64;
    let mut out: String = text.chars().take(MAX_CHARS).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_to_protocol_error_code_with_location() {
        let e = ProtocolError::new(ProtocolErrorKind::InvalidJson, "bad").at(3, 120);
        assert_eq!(e.to_string(), "line 3 (byte 120): bad");
        let err: Error = e.into();
        assert_eq!(err.code, ErrorCode::ProtocolError);
        assert_eq!(err.message, "line 3 (byte 120): bad");

        let e = ProtocolError::new(ProtocolErrorKind::Empty, "empty");
        assert_eq!(Error::from(e).message, "empty");
    }

    #[test]
    fn excerpt_bounds_quoted_text() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(100);
        let ex = excerpt(&long);
        assert_eq!(ex.chars().count(), 65);
        assert!(ex.ends_with('…'));
    }
}

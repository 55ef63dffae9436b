//! W3C Trace Context `traceparent` header parsing.
//!
//! The header value is `version "-" trace-id "-" parent-id "-" trace-flags`, every
//! field lowercase hex (W3C Trace Context, "traceparent Header"):
//!
//! ```text
//! 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
//! ```
//!
//! Version `00` is exactly 55 characters. A trace id or parent id of all zeros is
//! invalid, and so is version `ff`. A higher version is parsed as the spec asks: the
//! first four fields as in `00`, and anything after them must start with `-`.
//! Parsing never panics: the value comes from an untrusted request header.

use std::fmt;

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// Length of a version `00` header value.
const LEN_V00: usize = 55;

/// A parsed, valid `traceparent` header value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    version: u8,
    trace_id: TraceId,
    parent_id: SpanId,
    flags: TraceFlags,
}

/// Why a `traceparent` header value was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceParentError {
    /// The value has the wrong length for its version (55 characters for `00`).
    #[error(
        "traceparent has {len} bytes; version 00 takes exactly 55 (`00-<32 hex>-<16 hex>-<2 hex>`)"
    )]
    Length {
        /// Length of the trimmed value in bytes.
        len: usize,
    },
    /// A `-` is missing between two fields, or after the flags of a higher version.
    #[error("traceparent fields must be separated by `-`")]
    Delimiter,
    /// The version is not two lowercase hex digits, or is the forbidden `ff`.
    #[error("traceparent version must be two lowercase hex digits other than `ff`")]
    Version,
    /// The trace id is not 32 lowercase hex digits.
    #[error("traceparent trace id must be 32 lowercase hex digits")]
    TraceId,
    /// The trace id is all zeros.
    #[error("traceparent trace id must not be all zeros")]
    ZeroTraceId,
    /// The parent id is not 16 lowercase hex digits.
    #[error("traceparent parent id must be 16 lowercase hex digits")]
    ParentId,
    /// The parent id is all zeros.
    #[error("traceparent parent id must not be all zeros")]
    ZeroParentId,
    /// The trace flags are not two lowercase hex digits.
    #[error("traceparent flags must be two lowercase hex digits")]
    Flags,
}

impl TraceParent {
    /// Parses a `traceparent` header value.
    ///
    /// Optional whitespace (spaces and tabs) around the value is ignored, as HTTP
    /// does for header values. Everything else must match the W3C grammar.
    ///
    /// ```
    /// use paddock_telemetry::TraceParent;
    ///
    /// let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")?;
    /// assert!(tp.sampled());
    /// assert_eq!(tp.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    /// assert!(TraceParent::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_err());
    /// # Ok::<(), paddock_telemetry::TraceParentError>(())
    /// ```
    pub fn parse(value: &str) -> Result<Self, TraceParentError> {
        let b = value.trim_matches([' ', '\t']).as_bytes();
        if b.len() < LEN_V00 {
            return Err(TraceParentError::Length { len: b.len() });
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(TraceParentError::Delimiter);
        }
        let version = hex_byte(&b[0..2]).ok_or(TraceParentError::Version)?;
        if version == 0xff {
            return Err(TraceParentError::Version);
        }
        if version == 0 && b.len() != LEN_V00 {
            return Err(TraceParentError::Length { len: b.len() });
        }
        // A future version may append fields, each introduced by `-`.
        if b.len() > LEN_V00 && b[LEN_V00] != b'-' {
            return Err(TraceParentError::Delimiter);
        }

        let mut trace_id = [0u8; 16];
        hex_into(&b[3..35], &mut trace_id).ok_or(TraceParentError::TraceId)?;
        if trace_id == [0; 16] {
            return Err(TraceParentError::ZeroTraceId);
        }
        let mut parent_id = [0u8; 8];
        hex_into(&b[36..52], &mut parent_id).ok_or(TraceParentError::ParentId)?;
        if parent_id == [0; 8] {
            return Err(TraceParentError::ZeroParentId);
        }
        let flags = hex_byte(&b[53..55]).ok_or(TraceParentError::Flags)?;

        Ok(Self {
            version,
            trace_id: TraceId::from_bytes(trace_id),
            parent_id: SpanId::from_bytes(parent_id),
            flags: TraceFlags::new(flags),
        })
    }

    /// The version field (`0` for the current spec).
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The trace id shared by every span of the trace.
    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// The id of the caller's span, which becomes the parent of the execution span.
    pub fn parent_id(&self) -> SpanId {
        self.parent_id
    }

    /// The trace flags byte.
    pub fn flags(&self) -> TraceFlags {
        self.flags
    }

    /// Whether the caller sampled (recorded) this trace.
    pub fn sampled(&self) -> bool {
        self.flags.is_sampled()
    }

    /// The remote span context this header describes.
    pub fn span_context(&self) -> SpanContext {
        SpanContext::new(
            self.trace_id,
            self.parent_id,
            self.flags,
            true,
            TraceState::default(),
        )
    }
}

/// Renders the value in its version `00` form, ready to forward as a header.
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.parent_id,
            self.flags.to_u8()
        )
    }
}

impl std::str::FromStr for TraceParent {
    type Err = TraceParentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Parses a `traceparent` header value; see [`TraceParent::parse`].
pub fn parse_traceparent(value: &str) -> Result<TraceParent, TraceParentError> {
    TraceParent::parse(value)
}

/// The value of one lowercase hex digit.
fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Two lowercase hex digits as a byte.
fn hex_byte(pair: &[u8]) -> Option<u8> {
    match pair {
        [hi, lo] => Some(hex_digit(*hi)? << 4 | hex_digit(*lo)?),
        _ => None,
    }
}

/// Decodes `2 * out.len()` lowercase hex digits into `out`.
fn hex_into(hex: &[u8], out: &mut [u8]) -> Option<()> {
    if hex.len() != out.len() * 2 {
        return None;
    }
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = hex_byte(pair)?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn err(value: &str) -> TraceParentError {
        TraceParent::parse(value).expect_err(value)
    }

    #[test]
    fn parses_the_spec_example() {
        let tp = TraceParent::parse(VALID).unwrap();
        assert_eq!(tp.version(), 0);
        assert_eq!(
            tp.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(
            tp.parent_id(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap()
        );
        assert!(tp.sampled());
        assert_eq!(tp.to_string(), VALID);

        let sc = tp.span_context();
        assert!(sc.is_valid());
        assert!(sc.is_remote());
        assert!(sc.is_sampled());
    }

    #[test]
    fn unsampled_and_unknown_flag_bits_are_kept() {
        let tp: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
            .parse()
            .unwrap();
        assert!(!tp.sampled());
        let tp =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff").unwrap();
        assert!(tp.sampled());
        assert_eq!(tp.flags().to_u8(), 0xff);
    }

    #[test]
    fn surrounding_whitespace_is_ignored() {
        assert_eq!(
            TraceParent::parse(&format!(" \t{VALID}  ")).unwrap(),
            TraceParent::parse(VALID).unwrap()
        );
    }

    #[test]
    fn wrong_length_is_rejected() {
        assert_eq!(err(""), TraceParentError::Length { len: 0 });
        assert_eq!(err(&VALID[..54]), TraceParentError::Length { len: 54 });
        // Version 00 takes no trailing fields, not even well-delimited ones.
        assert_eq!(
            err(&format!("{VALID}-extra")),
            TraceParentError::Length { len: 61 }
        );
        assert_eq!(
            err(&format!("{VALID}0")),
            TraceParentError::Length { len: 56 }
        );
    }

    #[test]
    fn missing_delimiters_are_rejected() {
        for pos in [2, 35, 52] {
            let mut bytes = VALID.as_bytes().to_vec();
            bytes[pos] = b'_';
            let value = String::from_utf8(bytes).unwrap();
            assert_eq!(err(&value), TraceParentError::Delimiter, "{value}");
        }
    }

    #[test]
    fn bad_versions_are_rejected() {
        assert_eq!(
            err("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            TraceParentError::Version
        );
        assert_eq!(
            err("0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            TraceParentError::Version
        );
        assert_eq!(
            err("0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            TraceParentError::Version
        );
    }

    #[test]
    fn higher_versions_parse_their_known_prefix() {
        let tp =
            TraceParent::parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(tp.version(), 0xcc);
        let tp = TraceParent::parse(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
        )
        .unwrap();
        assert_eq!(tp.to_string(), VALID);
        assert_eq!(
            err("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.what"),
            TraceParentError::Delimiter
        );
    }

    #[test]
    fn bad_trace_ids_are_rejected() {
        assert_eq!(
            err("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            TraceParentError::ZeroTraceId
        );
        assert_eq!(
            err("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
            TraceParentError::TraceId
        );
        assert_eq!(
            err("00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01"),
            TraceParentError::TraceId
        );
    }

    #[test]
    fn bad_parent_ids_are_rejected() {
        assert_eq!(
            err("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
            TraceParentError::ZeroParentId
        );
        assert_eq!(
            err("00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01"),
            TraceParentError::ParentId
        );
        assert_eq!(
            err("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b.-01"),
            TraceParentError::ParentId
        );
    }

    #[test]
    fn bad_flags_are_rejected() {
        assert_eq!(
            err("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x"),
            TraceParentError::Flags
        );
        assert_eq!(
            err("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-A1"),
            TraceParentError::Flags
        );
    }

    #[test]
    fn non_ascii_input_is_an_error_not_a_panic() {
        // Multi-byte characters at field boundaries must not split a char.
        let value = "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01";
        assert!(TraceParent::parse(value).is_err());
        let value = "é0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(TraceParent::parse(value).is_err());
        let value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0€";
        assert!(TraceParent::parse(value).is_err());
    }

    #[test]
    fn no_prefix_of_a_valid_value_panics() {
        for end in 0..=VALID.len() {
            let _ = TraceParent::parse(&VALID[..end]);
        }
        for byte in 0..=255u8 {
            for pos in 0..VALID.len() {
                let mut bytes = VALID.as_bytes().to_vec();
                bytes[pos] = byte;
                if let Ok(value) = String::from_utf8(bytes) {
                    let parsed = TraceParent::parse(&value);
                    // Only a hex digit (or a flags digit) keeps a value valid.
                    if parsed.is_ok() && value != VALID {
                        assert!(byte.is_ascii_hexdigit() && !byte.is_ascii_uppercase());
                    }
                }
            }
        }
    }
}

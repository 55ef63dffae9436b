//! Oracles: properties of the parsers checked on arbitrary bytes; each panics when
//! one is violated.

use super::*;

// ---------------------------------------------------------------------------------
// Equivalence
// ---------------------------------------------------------------------------------

/// Whether two JSON values are equal, floats compared within
/// [`FLOAT_ULP_TOLERANCE`] ULPs. Integers and floats never compare equal to each
/// other, and integers must match exactly.
pub fn json_equivalent(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y
                || match (x.is_f64(), y.is_f64(), x.as_f64(), y.as_f64()) {
                    (true, true, Some(x), Some(y)) => floats_close(x, y),
                    _ => false,
                }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_equivalent(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equivalent(v, w)))
        }
        _ => a == b,
    }
}

pub(super) fn floats_close(x: f64, y: f64) -> bool {
    if x == y {
        return true;
    }
    if x.is_sign_negative() != y.is_sign_negative() {
        return false;
    }
    x.to_bits().abs_diff(y.to_bits()) <= FLOAT_ULP_TOLERANCE
}

/// Whether two frames are equal, floats compared as [`json_equivalent`] does.
pub fn frames_equivalent(a: &Frame, b: &Frame) -> bool {
    match (serde_json::to_value(a), serde_json::to_value(b)) {
        (Ok(a), Ok(b)) => json_equivalent(&a, &b),
        _ => false,
    }
}

// ---------------------------------------------------------------------------------
// Oracles
// ---------------------------------------------------------------------------------

/// Checks that `frame` survives `parse(encode(frame))`, and that the encoded line has
/// the documented shape and decodes the same way through a [`FrameDecoder`].
///
/// `frame` must be one that [`parse`] could produce (non-empty ids, nesting within the
/// limit); the generators only make such frames.
pub fn frame_round_trip(frame: &Frame) {
    let line = encode(frame);
    assert!(
        line.starts_with(b"{\"v\":1,\"kind\":\""),
        "encoded frame does not start with v and kind: {}",
        String::from_utf8_lossy(&line)
    );
    assert_eq!(
        line.iter().position(|&b| b == b'\n'),
        Some(line.len() - 1),
        "encoded frame is not exactly one line"
    );
    let back = match parse(&line) {
        Ok(back) => back,
        Err(e) => panic!(
            "encode produced a line parse refuses: {e}\nframe: {frame:?}\nline: {}",
            String::from_utf8_lossy(&line)
        ),
    };
    assert!(
        frames_equivalent(frame, &back),
        "round trip changed the frame\nbefore: {frame:?}\nafter:  {back:?}"
    );
    let decoded = decode_all(&line, line.len());
    assert!(
        matches!(decoded.as_slice(), [Ok(f)] if *f == back),
        "decoder disagrees with parse: {decoded:?}"
    );
}

/// The `frame_parse` oracle; returns whether `data` parsed as a frame.
pub fn frame_parse(data: &[u8]) -> bool {
    let parsed = parse(data);
    match &parsed {
        Ok(frame) => frame_round_trip(frame),
        Err(e) => check_protocol_error(e, None),
    }
    let mut rng = Rng::from_bytes(data);
    frame_round_trip(&arbitrary_frame(&mut rng));
    parsed.is_ok()
}

/// What [`frame_decoder`] saw in its input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeSummary {
    /// Frames decoded.
    pub frames: usize,
    /// Errors of any kind.
    pub errors: usize,
    /// [`ProtocolErrorKind::TooLarge`] errors.
    pub too_large: usize,
    /// [`ProtocolErrorKind::Truncated`] errors.
    pub truncated: usize,
}

/// The `frame_decoder` oracle, with a maximum frame size of
/// [`DECODER_MAX_FRAME_SIZE`].
pub fn frame_decoder(data: &[u8]) -> DecodeSummary {
    let max = DECODER_MAX_FRAME_SIZE;
    let whole = decode_in_chunks(data, max, |_, rest| rest);
    let reference = reference_decode(data, max);
    assert_eq!(
        whole.len(),
        reference.len(),
        "decoder and reference model disagree\ndecoder:   {whole:?}\nreference: {reference:?}"
    );
    for (got, want) in whole.iter().zip(&reference) {
        let agree = match (got, want) {
            (Ok(a), Ok(b)) => a == b,
            (Err(a), Err(b)) => {
                a.kind == b.kind
                    && a.line == b.line
                    && a.offset == b.offset
                    && (matches!(
                        a.kind,
                        ProtocolErrorKind::TooLarge | ProtocolErrorKind::Truncated
                    ) || a.message == b.message)
            }
            _ => false,
        };
        assert!(agree, "decoder gave {got:?}, reference model {want:?}");
    }

    let byte_by_byte = decode_in_chunks(data, max, |_, _| 1);
    assert_eq!(byte_by_byte, whole, "byte-by-byte decoding differs");

    let mut rng = Rng::from_bytes(data);
    let random_cuts = decode_in_chunks(data, max, |_, _| rng.index(2 * max + 2));
    assert_eq!(random_cuts, whole, "decoding at random cut points differs");

    // Cut points read from the data itself: each chunk is as long as the byte that
    // starts it (so zero-length chunks happen too).
    let data_cuts = decode_in_chunks(data, max, |at, _| usize::from(data[at]));
    assert_eq!(
        data_cuts, whole,
        "decoding at data-derived cut points differs"
    );

    let mut summary = DecodeSummary::default();
    let mut last_line = 0;
    for result in &whole {
        match result {
            Ok(_) => summary.frames += 1,
            Err(e) => {
                check_protocol_error(e, Some(max));
                let line = e.line.unwrap_or(0);
                assert!(line > last_line, "error lines out of order: {whole:?}");
                last_line = line;
                summary.errors += 1;
                match e.kind {
                    ProtocolErrorKind::TooLarge => summary.too_large += 1,
                    ProtocolErrorKind::Truncated => summary.truncated += 1,
                    _ => {}
                }
            }
        }
    }
    summary
}

/// Feeds `data` to a fresh decoder in chunks whose lengths `next_len(position,
/// remaining)` chooses, then finishes; asserts the buffer bound after every call.
pub(super) fn decode_in_chunks(
    data: &[u8],
    max: usize,
    mut next_len: impl FnMut(usize, usize) -> usize,
) -> Vec<Result<Frame, ProtocolError>> {
    let mut decoder = FrameDecoder::with_max_frame_size(max);
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let mut len = next_len(at, data.len() - at).min(data.len() - at);
        if len == 0 {
            // An empty feed is legal and must change nothing; then move on by a byte so
            // that a generator returning 0 cannot stall the loop.
            out.extend(decoder.decode(&[]));
            len = 1;
        }
        out.extend(decoder.decode(&data[at..at + len]));
        at += len;
        assert!(
            decoder.buffered_len() <= max && decoder.buffer_capacity() <= max,
            "decoder buffers {} bytes in {} allocated, more than its maximum of {max}",
            decoder.buffered_len(),
            decoder.buffer_capacity()
        );
    }
    assert_eq!(decoder.bytes_consumed(), data.len() as u64);
    out.extend(decoder.finish().map(Err));
    assert_eq!(decoder.buffered_len(), 0, "finish left bytes buffered");
    out
}

/// The decoder's rules, applied to a whole input split on `\n` (see
/// [`FrameDecoder`]); messages of size and truncation errors are not modelled.
pub(super) fn reference_decode(data: &[u8], max: usize) -> Vec<Result<Frame, ProtocolError>> {
    let blank = |line: &[u8]| line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r'));
    let mut out = Vec::new();
    let mut offset = 0u64;
    let mut line_no = 1u64;
    let mut rest = data;
    loop {
        match rest.iter().position(|&b| b == b'\n') {
            Some(end) => {
                let line = &rest[..end];
                if line.len() > max {
                    out.push(Err(
                        ProtocolError::new(ProtocolErrorKind::TooLarge, "").at(line_no, offset)
                    ));
                } else if !blank(line) {
                    out.push(parse(line).map_err(|e| e.at(line_no, offset)));
                }
                offset += end as u64 + 1;
                line_no += 1;
                rest = &rest[end + 1..];
            }
            None => {
                if rest.len() > max {
                    out.push(Err(
                        ProtocolError::new(ProtocolErrorKind::TooLarge, "").at(line_no, offset)
                    ));
                } else if !blank(rest) {
                    out.push(Err(
                        ProtocolError::new(ProtocolErrorKind::Truncated, "").at(line_no, offset)
                    ));
                }
                return out;
            }
        }
    }
}

pub(super) fn check_protocol_error(e: &ProtocolError, max: Option<usize>) {
    assert!(!e.message.is_empty(), "protocol error without a message");
    assert!(
        e.message.len() <= 512,
        "protocol error message of {} bytes quotes too much input",
        e.message.len()
    );
    assert_eq!(
        e.line.is_some(),
        max.is_some(),
        "location set wrongly: {e:?}"
    );
    let err = Error::from(e.clone());
    assert_eq!(err.code, ErrorCode::ProtocolError);
}

/// What [`http_bodies`] saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BodySummary {
    /// Bodies (of any kind) that parsed.
    pub parsed: usize,
    /// Of those, bodies that also passed their own validation.
    pub valid: usize,
}

/// The HTTP API's work-carrying bodies on arbitrary bytes, and on a body generated from
/// them: [`crate::api::parse_body`] never panics and refuses only with
/// `INVALID_OPTIONS`; a body that parses is validated (executions, sandboxes,
/// processes, terminals, TCP targets) without panicking, and a TCP target that passes
/// is a loopback address.
pub fn http_bodies(data: &[u8]) -> BodySummary {
    let mut summary = BodySummary::default();
    check_bodies(data, &mut summary);
    let mut rng = Rng::from_bytes(data);
    let generated = serde_json::to_vec(&arbitrary_body(&mut rng)).expect("JSON serializes");
    check_bodies(&generated, &mut summary);
    summary
}

pub(super) fn check_bodies(data: &[u8], summary: &mut BodySummary) {
    use crate::api::{parse_body, ExecBody, SandboxBody};
    use crate::interactive::{ProcessSpec, TcpTarget, TerminalSpec};
    fn parsed<T: serde::de::DeserializeOwned>(data: &[u8], summary: &mut BodySummary) -> Option<T> {
        match parse_body::<T>(data) {
            Ok(v) => {
                summary.parsed += 1;
                Some(v)
            }
            Err(e) => {
                assert_eq!(
                    e.code,
                    ErrorCode::InvalidOptions,
                    "a body refused with the wrong code: {e}"
                );
                None
            }
        }
    }
    let valid = usize::from;
    let mut count = 0;
    if let Some(b) = parsed::<ExecBody>(data, summary) {
        let order = b.into_order(None);
        let _ = order.network.name();
        count += valid(order.request.validate().is_ok());
        let _ = order.request.program.audit_text();
    }
    if let Some(b) = parsed::<SandboxBody>(data, summary) {
        count += valid(b.limits.validate("limits", false).is_ok());
    }
    if let Some(p) = parsed::<ProcessSpec>(data, summary) {
        count += valid(p.validate().is_ok());
    }
    if let Some(t) = parsed::<TerminalSpec>(data, summary) {
        count += valid(t.validate().is_ok());
    }
    if let Some(t) = parsed::<TcpTarget>(data, summary) {
        match t.loopback_addr() {
            Ok(addr) => {
                assert!(addr.ip().is_loopback(), "{t:?} passed as {addr}");
                count += 1;
            }
            Err(e) => assert_eq!(e.code, ErrorCode::InvalidOptions, "{e}"),
        }
    }
    summary.valid += count;
}

//! Generators and oracles for Paddock's parsers of untrusted input.
//!
//! The fuzz targets in the repository's `fuzz/` crate are thin wrappers around the
//! oracles here, and the unit tests at the bottom of this file run the same oracles on
//! thousands of generated cases under `cargo test`, so a property that the fuzzer
//! checks is also checked on every test run.
//!
//! Every oracle takes arbitrary bytes, panics if a property is violated and otherwise
//! returns a small summary (used by the tests to prove that the generated cases reach
//! the interesting paths):
//!
//! - [`frame_parse`]: [`parse`] never panics; every error is a `PROTOCOL_ERROR`; every
//!   frame that parses survives `parse(encode(f))`; and a frame generated from the
//!   input's bytes survives the same round trip.
//! - [`frame_decoder`]: the [`FrameDecoder`] gives the same results whether the input
//!   arrives whole, byte by byte or split at points derived from the input; it agrees
//!   with a line-by-line reference model; it never buffers more than its maximum.
//! - [`config_parse`]: [`PaddockConfig::from_toml_str`] and
//!   [`PaddockConfig::from_json_str`] never panic and fail only with `INVALID_CONFIG`;
//!   every accepted config, and a config generated from the input's bytes, round-trip
//!   through TOML and JSON.
//!
//! Randomness comes from [`Rng`], a splitmix64 generator, so every case is
//! reproducible from its seed.
//!
//! **Floats.** serde_json parses floats with a fast algorithm that may land one or two
//! units in the last place (ULP) away from the correctly rounded value (its
//! `float_roundtrip` feature, not enabled here, makes it exact). A round trip
//! therefore compares floats within [`FLOAT_ULP_TOLERANCE`] ULPs; everything else,
//! integers included, must match exactly.
//!
//! This module exists for testing; it is public so the fuzz crate can reach it, and
//! it is not part of Paddock's stable API.

use serde_json::{Map, Number, Value};

use crate::config::{CgroupMode, PaddockConfig};
use crate::error::{Error, ErrorCode};
use crate::exec::StreamKind;
use crate::limits::Limits;
use crate::protocol::{
    decode_all, encode, parse, Frame, FrameDecoder, FrameKind, ProtocolError, ProtocolErrorKind,
};

/// The maximum frame size the decoder oracle uses: small, so that fuzz inputs of a few
/// kilobytes cross it often.
pub const DECODER_MAX_FRAME_SIZE: usize = 256;

/// How many units in the last place two floats may differ by and still count as equal
/// after a JSON round trip (see the module documentation).
pub const FLOAT_ULP_TOLERANCE: u64 = 4;

/// Nesting depth of generated JSON values; well inside serde_json's limit of 128.
const MAX_JSON_DEPTH: u32 = 6;

// ---------------------------------------------------------------------------------
// Randomness
// ---------------------------------------------------------------------------------

/// A small deterministic pseudo-random generator (splitmix64).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// A generator seeded with a hash (FNV-1a) of `data`, so that a fuzz input decides
    /// everything generated from it.
    pub fn from_bytes(data: &[u8]) -> Rng {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in data {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Rng::new(hash)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`, or 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// A `usize` in `0..n`, or 0 when `n` is 0.
    pub fn index(&mut self, n: usize) -> usize {
        // `n` fits in u64 on every supported target, and the result is below `n`.
        self.below(n as u64) as usize
    }

    /// `true` with probability 1/`n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// A random element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

// ---------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------

/// A random string of up to `max_chars` characters, mixing ASCII, control characters,
/// JSON-significant characters, line separators, BOMs and non-BMP characters.
pub fn arbitrary_string(rng: &mut Rng, max_chars: usize) -> String {
    const SPECIAL: &[char] = &[
        '"', '\\', '/', '\n', '\r', '\t', '\0', '\u{7f}', '\u{2028}', '\u{2029}', '\u{feff}',
        '\u{fffd}', '=', '#', '\'', '[', ']', '{', '}',
    ];
    let len = rng.index(max_chars + 1);
    let mut s = String::with_capacity(len);
    for _ in 0..len {
        let c = match rng.below(10) {
            0..=4 => char::from(0x20 + rng.below(0x5f) as u8),
            5 => char::from(rng.below(0x20) as u8),
            6 => *rng.pick(SPECIAL),
            7 => char::from_u32(0x80 + rng.below(0xd800 - 0x80) as u32).unwrap_or('?'),
            8 => char::from_u32(0xe000 + rng.below(0x1_0000 - 0xe000) as u32).unwrap_or('?'),
            _ => char::from_u32(0x1_0000 + rng.below(0x10_0000) as u32).unwrap_or('?'),
        };
        s.push(c);
    }
    s
}

/// A random non-empty identifier: sometimes UUID-shaped, sometimes arbitrary text.
pub fn arbitrary_id(rng: &mut Rng) -> String {
    if rng.one_in(3) {
        let hex: String = (0..32)
            .map(|_| char::from(b"0123456789abcdef"[rng.index(16)]))
            .collect();
        return format!(
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        );
    }
    let mut s = arbitrary_string(rng, 24);
    if s.is_empty() {
        s.push('x');
    }
    s
}

/// A random finite JSON number: small and extreme integers of every sign, and floats
/// from simple fractions to random bit patterns, subnormals and the extremes.
pub fn arbitrary_number(rng: &mut Rng) -> Number {
    match rng.below(8) {
        0 => Number::from(rng.below(100)),
        1 => Number::from(rng.next_u64()),
        2 => Number::from(rng.next_u64() as i64),
        3 => Number::from(*rng.pick(&[0, u64::MAX, i64::MAX as u64, 1 << 53])),
        4 => Number::from(*rng.pick(&[i64::MIN, -1, -(1 << 53)])),
        5 => float(*rng.pick(&[
            0.0,
            -0.0,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            f64::EPSILON,
            5e-324,
            0.1,
            1e21,
        ])),
        6 => float((rng.next_u64() as i64 as f64) / f64::from(1u32 << rng.below(30))),
        _ => loop {
            let f = f64::from_bits(rng.next_u64());
            if f.is_finite() {
                break float(f);
            }
        },
    }
}

fn float(f: f64) -> Number {
    Number::from_f64(f).unwrap_or_else(|| Number::from(0))
}

/// A random JSON value nested at most `depth` levels.
pub fn arbitrary_json(rng: &mut Rng, depth: u32) -> Value {
    let choices = if depth == 0 { 5 } else { 7 };
    match rng.below(choices) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => Value::Number(arbitrary_number(rng)),
        3 => Value::Number(arbitrary_number(rng)),
        4 => Value::String(arbitrary_string(rng, 16)),
        5 => {
            let len = rng.index(5);
            Value::Array((0..len).map(|_| arbitrary_json(rng, depth - 1)).collect())
        }
        _ => Value::Object(arbitrary_object(rng, depth - 1)),
    }
}

/// A random JSON object whose values nest at most `depth` levels.
pub fn arbitrary_object(rng: &mut Rng, depth: u32) -> Map<String, Value> {
    let len = rng.index(5);
    (0..len)
        .map(|_| (arbitrary_string(rng, 8), arbitrary_json(rng, depth)))
        .collect()
}

/// A random structurally valid frame of any kind.
pub fn arbitrary_frame(rng: &mut Rng) -> Frame {
    let id = arbitrary_id(rng);
    let depth = rng.below(u64::from(MAX_JSON_DEPTH) + 1) as u32;
    match rng.pick(FrameKind::ALL) {
        FrameKind::Invoke => Frame::Invoke {
            id,
            input: arbitrary_json(rng, depth),
            ctx: if rng.one_in(2) {
                Some(arbitrary_object(rng, depth))
            } else {
                None
            },
        },
        FrameKind::Resume => Frame::Resume {
            id,
            token_id: arbitrary_id(rng),
            value: arbitrary_json(rng, depth),
        },
        FrameKind::Cancel => Frame::Cancel { id },
        FrameKind::Output => Frame::Output {
            id,
            output: arbitrary_json(rng, depth),
        },
        FrameKind::Error => Frame::error(id, arbitrary_id(rng), arbitrary_string(rng, 40)),
        FrameKind::Suspend => Frame::Suspend {
            id,
            token_id: arbitrary_id(rng),
        },
        FrameKind::Log => Frame::Log {
            id,
            stream: if rng.one_in(2) {
                StreamKind::Stdout
            } else {
                StreamKind::Stderr
            },
            data: arbitrary_string(rng, 64),
        },
    }
}

/// A random configuration that passes validation.
pub fn arbitrary_config(rng: &mut Rng) -> PaddockConfig {
    let mut config = PaddockConfig::default();
    // Each limit is kept only if the validator accepts it on its own, so the config
    // stays valid whatever the ranges are; the candidates cover both ends of every
    // current range.
    for field in 0..LIMIT_FIELDS {
        let mut alone = Limits::default();
        *limit_field(&mut alone, field) = arbitrary_limit(rng);
        if alone.validate("limits", true).is_ok() {
            *limit_field(&mut config.limits.defaults, field) = *limit_field(&mut alone, field);
        }
        // Half the time a ceiling too, at or above the default (a default above its
        // ceiling is refused); otherwise none, or the built-in one where it holds.
        let default = *limit_field(&mut config.limits.defaults, field);
        if rng.one_in(2) {
            let mut alone = Limits::default();
            *limit_field(&mut alone, field) = arbitrary_limit(rng);
            let candidate = *limit_field(&mut alone, field);
            if alone.validate("limits.max", true).is_ok() && candidate >= default {
                *limit_field(&mut config.limits.max, field) = candidate;
            }
        }
        if let Some(d) = default {
            let in_force = *limit_field(&mut config.limits.ceilings(), field);
            if in_force.is_some_and(|c| d > c) {
                *limit_field(&mut config.limits.max, field) = Some(d);
            }
        }
    }
    let s = &mut config.subprocess;
    s.enabled = rng.one_in(2);
    s.workdir_root = if rng.one_in(2) {
        let segments = rng.index(4);
        let mut path = String::new();
        for _ in 0..=segments {
            path.push('/');
            path.push_str(&arbitrary_string(rng, 12).replace(['\0', '/'], "_"));
        }
        Some(path.into())
    } else {
        None
    };
    s.env_passthrough = (0..rng.index(4))
        .map(|_| {
            let name = arbitrary_string(rng, 16).replace(['\0', '='], "_");
            format!("V{name}")
        })
        .collect();
    s.python = interpreter(rng);
    s.node = interpreter(rng);
    s.shell = interpreter(rng);
    s.cgroup = *rng.pick(&[CgroupMode::Auto, CgroupMode::Required, CgroupMode::Off]);
    config
}

const LIMIT_FIELDS: usize = 7;

fn limit_field(limits: &mut Limits, field: usize) -> &mut Option<u64> {
    match field {
        0 => &mut limits.timeout_ms,
        1 => &mut limits.memory_bytes,
        2 => &mut limits.cpu_ms,
        3 => &mut limits.pids,
        4 => &mut limits.max_output_bytes,
        5 => &mut limits.file_size_bytes,
        _ => &mut limits.open_files,
    }
}

fn arbitrary_limit(rng: &mut Rng) -> Option<u64> {
    match rng.below(4) {
        0 => None,
        1 => Some(*rng.pick(&[
            0,
            1,
            7,
            8,
            1 << 20,
            (1 << 20) - 1,
            1 << 22,
            1 << 32,
            1 << 46,
        ])),
        2 => Some(rng.below(1 << 16)),
        _ => Some(1 + rng.below(1 << 46)),
    }
}

fn interpreter(rng: &mut Rng) -> String {
    let rest = arbitrary_string(rng, 20).replace('\0', "_");
    format!("{}{rest}", rng.pick(&["python3", "node", "sh", "é"]))
}

/// Applies one random mutation to `data`: overwrite, delete, insert random bytes,
/// insert a token that matters to JSON, TOML or the protocol, duplicate a range, or
/// truncate.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    const TOKENS: &[&[u8]] = &[
        b"\"v\":1,",
        b"\"v\":2,",
        b"\"v\":1.0,",
        b"\"kind\":\"",
        b"\"id\":\"",
        b"\"id\":7,",
        b"\"ctx\":null,",
        b"\"input\":",
        b"null",
        b"true",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b"\\",
        b":",
        b",",
        b"\n",
        b"\r\n",
        b"\\u0000",
        b"\\ud800",
        b"\\ud83d\\ude00",
        b"1e999",
        b"-0",
        b"18446744073709551616",
        b"\xff",
        b"\xc3",
        b"\xe2\x82",
        b"invoke",
        b"output",
        b"suspend",
        b"stderr",
        b" = ",
        b"[[",
        b"]]",
        b"\"\"\"",
        b"'''",
        b"#",
        b"[limits]\n",
        b"[subprocess]\n",
        b"timeout_ms",
        b"cgroup = \"off\"\n",
    ];
    let len = data.len();
    match rng.below(6) {
        0 if len > 0 => {
            let at = rng.index(len);
            data[at] = rng.next_u64() as u8;
        }
        1 if len > 0 => {
            let at = rng.index(len);
            let end = (at + 1 + rng.index(8)).min(len);
            data.drain(at..end);
        }
        2 => {
            let at = rng.index(len + 1);
            let count = 1 + rng.index(8);
            let bytes = rng.bytes(count);
            data.splice(at..at, bytes);
        }
        3 | 0 | 1 => {
            let at = rng.index(len + 1);
            let token = rng.pick(TOKENS).to_vec();
            data.splice(at..at, token);
        }
        4 if len > 0 => {
            let at = rng.index(len);
            let end = (at + 1 + rng.index(32)).min(len);
            let copy = data[at..end].to_vec();
            let to = rng.index(len + 1);
            data.splice(to..to, copy);
        }
        _ => {
            let at = rng.index(len + 1);
            data.truncate(at);
        }
    }
}

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

fn floats_close(x: f64, y: f64) -> bool {
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
fn decode_in_chunks(
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
fn reference_decode(data: &[u8], max: usize) -> Vec<Result<Frame, ProtocolError>> {
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

fn check_protocol_error(e: &ProtocolError, max: Option<usize>) {
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

/// Checks that a valid config survives TOML and JSON round trips.
pub fn config_round_trip(config: &PaddockConfig) {
    if let Err(e) = config.validate() {
        panic!("config expected to be valid is not: {e}\n{config:?}");
    }
    let text = match toml::to_string(config) {
        Ok(text) => text,
        Err(e) => panic!("a valid config does not serialize to TOML: {e}\n{config:?}"),
    };
    match PaddockConfig::from_toml_str(&text) {
        Ok(back) => assert_eq!(&back, config, "TOML round trip changed the config\n{text}"),
        Err(e) => panic!("TOML written for a valid config is refused: {e}\n{text}"),
    }
    let json = match serde_json::to_string(config) {
        Ok(json) => json,
        Err(e) => panic!("a valid config does not serialize to JSON: {e}\n{config:?}"),
    };
    match PaddockConfig::from_json_str(&json) {
        Ok(back) => assert_eq!(&back, config, "JSON round trip changed the config\n{json}"),
        Err(e) => panic!("JSON written for a valid config is refused: {e}\n{json}"),
    }
}

/// The `config_parse` oracle; returns whether `data` (read as lossy UTF-8) was
/// accepted as TOML or as JSON.
pub fn config_parse(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let mut accepted = false;
    for result in [
        PaddockConfig::from_toml_str(&text),
        PaddockConfig::from_json_str(&text),
    ] {
        match result {
            Ok(config) => {
                config_round_trip(&config);
                accepted = true;
            }
            Err(e) => assert_eq!(
                e.code,
                ErrorCode::InvalidConfig,
                "config parsing failed with the wrong code: {e}"
            ),
        }
    }
    let mut rng = Rng::from_bytes(data);
    config_round_trip(&arbitrary_config(&mut rng));
    accepted
}

/// The fields of each HTTP body, so generated bodies reach past "unknown field".
const BODY_SHAPES: &[&[&str]] = &[
    // An execution.
    &[
        "engine", "program", "stdin", "env", "cwd", "limits", "network", "level",
    ],
    // A sandbox.
    &["engine", "limits", "network", "level"],
    // A process.
    &["argv", "env", "cwd", "stdin"],
    // A terminal.
    &["command", "args", "size", "env", "cwd"],
    // A TCP target.
    &["port", "host"],
];

const LIMIT_NAMES: &[&str] = &[
    "timeout_ms",
    "memory_bytes",
    "cpu_ms",
    "pids",
    "max_output_bytes",
    "file_size_bytes",
    "open_files",
];

/// A random body: usually one of the HTTP bodies' shapes with values of the right
/// kind, sometimes with a wrong value or a stray field.
pub fn arbitrary_body(rng: &mut Rng) -> Value {
    fn strings(rng: &mut Rng, n: usize) -> Value {
        Value::Array(
            (0..rng.index(n + 1))
                .map(|_| Value::String(arbitrary_string(rng, 12)))
                .collect(),
        )
    }
    fn number(rng: &mut Rng) -> Value {
        if rng.one_in(2) {
            Value::from(rng.below(70_000))
        } else {
            Value::Number(arbitrary_number(rng))
        }
    }
    fn value_for(rng: &mut Rng, field: &str) -> Value {
        if rng.one_in(6) {
            return arbitrary_json(rng, 2);
        }
        match field {
            "argv" | "args" => strings(rng, 3),
            "env" => Value::Object(
                (0..rng.index(3))
                    .map(|_| {
                        (
                            arbitrary_string(rng, 6),
                            Value::String(arbitrary_string(rng, 6)),
                        )
                    })
                    .collect(),
            ),
            "stdin" if rng.one_in(2) => Value::Bool(rng.one_in(2)),
            "stdin" | "cwd" => Value::String(arbitrary_string(rng, 12)),
            "command" => Value::String(rng.pick(&["sh", "/bin/sh", "", "bash"]).to_string()),
            "engine" => Value::String(
                rng.pick(&["subprocess", "isolate", "container", "noop", "bogus"])
                    .to_string(),
            ),
            "level" => Value::String(
                rng.pick(&["none", "context-isolated", "strict", "max"])
                    .to_string(),
            ),
            "network" => match rng.below(3) {
                0 => Value::String(rng.pick(&["none", "unrestricted", "allowlist"]).to_string()),
                1 => serde_json::json!({"allowlist": {"hosts": strings(rng, 2)}}),
                _ => arbitrary_json(rng, 1),
            },
            "host" => Value::String(
                rng.pick(&[
                    "127.0.0.1",
                    "::1",
                    "localhost",
                    "10.0.0.1",
                    "[::1]",
                    "example.com",
                    "",
                ])
                .to_string(),
            ),
            "program" => match rng.below(4) {
                0 => serde_json::json!({"command": strings(rng, 3)}),
                1 => serde_json::json!({
                    "language": *rng.pick(&["python", "javascript", "shell", "cobol"]),
                    "code": arbitrary_string(rng, 20),
                }),
                2 => {
                    serde_json::json!({"handler": arbitrary_string(rng, 8), "input": arbitrary_json(rng, 1)})
                }
                _ => {
                    serde_json::json!({"resume": arbitrary_string(rng, 8), "value": arbitrary_json(rng, 1)})
                }
            },
            "limits" => Value::Object(
                (0..rng.index(4))
                    .map(|_| (rng.pick(LIMIT_NAMES).to_string(), number(rng)))
                    .collect(),
            ),
            "size" => serde_json::json!({"rows": number(rng), "cols": number(rng)}),
            _ => number(rng),
        }
    }
    let shape = *rng.pick(BODY_SHAPES);
    let mut body = Map::new();
    for field in shape {
        if !rng.one_in(3) {
            let value = value_for(rng, field);
            body.insert(field.to_string(), value);
        }
    }
    if rng.one_in(8) {
        body.insert(arbitrary_string(rng, 8), arbitrary_json(rng, 1));
    }
    Value::Object(body)
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

fn check_bodies(data: &[u8], summary: &mut BodySummary) {
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
        let (request, _, network, _) = b.into_request(None);
        let _ = network.name();
        count += valid(request.validate().is_ok());
        let _ = request.program.audit_text();
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const CASES: usize = 1_000;

    /// Random bytes biased toward the characters JSON and TOML care about.
    fn noisy_bytes(rng: &mut Rng, max_len: usize) -> Vec<u8> {
        const ALPHABET: &[u8] = b"{}[]\":,\\ \n\r\tvkindtrufalsenul0123456789.-+eE=#'";
        let len = rng.index(max_len + 1);
        (0..len)
            .map(|_| {
                if rng.one_in(4) {
                    rng.next_u64() as u8
                } else {
                    *rng.pick(ALPHABET)
                }
            })
            .collect()
    }

    fn mutated(rng: &mut Rng, mut data: Vec<u8>) -> Vec<u8> {
        for _ in 0..1 + rng.index(3) {
            mutate(rng, &mut data);
        }
        data
    }

    #[test]
    fn rng_is_deterministic_and_spreads() {
        let a: Vec<u64> = (0..4)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
        assert_ne!(
            Rng::from_bytes(b"ab").next_u64(),
            Rng::from_bytes(b"ba").next_u64()
        );
        let mut rng = Rng::new(1);
        let seen: BTreeSet<u64> = (0..1000).map(|_| rng.below(10)).collect();
        assert_eq!(seen.len(), 10);
        assert_eq!(rng.below(0), 0);
    }

    #[test]
    fn equivalence_tolerates_float_noise_only() {
        let x = 0.1f64;
        let next = f64::from_bits(x.to_bits() + 1);
        assert!(json_equivalent(&Value::from(x), &Value::from(next)));
        let far = f64::from_bits(x.to_bits() + FLOAT_ULP_TOLERANCE + 1);
        assert!(!json_equivalent(&Value::from(x), &Value::from(far)));
        assert!(json_equivalent(&Value::from(0.0), &Value::from(-0.0)));
        assert!(!json_equivalent(&Value::from(1), &Value::from(1.0)));
        assert!(!json_equivalent(&Value::from(1u64), &Value::from(2u64)));
        assert!(!json_equivalent(
            &serde_json::json!({"a": 1}),
            &serde_json::json!({"b": 1})
        ));
        assert!(!json_equivalent(
            &serde_json::json!([1, 2]),
            &serde_json::json!([1])
        ));
        assert!(!frames_equivalent(&Frame::cancel("a"), &Frame::cancel("b")));
        assert!(frames_equivalent(
            &Frame::output("a", Value::from(x)),
            &Frame::output("a", Value::from(next))
        ));
    }

    #[test]
    #[should_panic(expected = "encode produced a line parse refuses")]
    fn round_trip_oracle_catches_an_unparsable_frame() {
        // `encode` does not validate; the oracle must notice that `parse` refuses this.
        frame_round_trip(&Frame::cancel(""));
    }

    #[test]
    fn generated_frames_round_trip() {
        let mut rng = Rng::new(0x5eed_0001);
        let mut kinds = BTreeSet::new();
        let mut with_floats = 0;
        for _ in 0..2 * CASES {
            let frame = arbitrary_frame(&mut rng);
            kinds.insert(frame.kind());
            let text = String::from_utf8(encode(&frame)).unwrap();
            if text.contains('.') || text.contains('e') {
                with_floats += 1;
            }
            frame_round_trip(&frame);
        }
        assert_eq!(
            kinds.len(),
            FrameKind::ALL.len(),
            "not every kind generated"
        );
        assert!(
            with_floats > 100,
            "too few frames with floats: {with_floats}"
        );
    }

    #[test]
    fn frame_parse_on_random_bytes() {
        let mut rng = Rng::new(0x5eed_0002);
        let mut accepted = 0;
        for _ in 0..CASES {
            let data = noisy_bytes(&mut rng, 120);
            accepted += usize::from(frame_parse(&data));
        }
        // Random bytes almost never form a frame; the oracle still ran on each.
        assert!(accepted < CASES / 10, "{accepted}");
        // Fixed inputs that exercise each error kind.
        assert!(!frame_parse(b""));
        assert!(!frame_parse(b"\xff\xfe"));
        assert!(frame_parse(
            b"{\"v\":1,\"kind\":\"cancel\",\"id\":\"x\"}\r\n"
        ));
    }

    #[test]
    fn frame_parse_on_mutated_frames() {
        let mut rng = Rng::new(0x5eed_0003);
        let (mut accepted, mut refused) = (0, 0);
        let mut error_kinds = BTreeSet::new();
        for _ in 0..2 * CASES {
            let line = encode(&arbitrary_frame(&mut rng));
            let data = mutated(&mut rng, line);
            if frame_parse(&data) {
                accepted += 1;
            } else {
                refused += 1;
                error_kinds.insert(format!("{:?}", parse(&data).unwrap_err().kind));
            }
        }
        assert!(
            accepted >= 100,
            "only {accepted} mutated frames still parsed"
        );
        assert!(refused >= 500, "only {refused} mutated frames were refused");
        for kind in ["InvalidJson", "InvalidUtf8", "Version", "NotOneLine"] {
            assert!(
                error_kinds.contains(kind),
                "{kind} never hit: {error_kinds:?}"
            );
        }
    }

    /// A stream of encoded frames mixed with the things a decoder must survive.
    fn arbitrary_stream(rng: &mut Rng) -> Vec<u8> {
        let mut stream = Vec::new();
        for _ in 0..rng.index(8) {
            match rng.below(7) {
                0..=2 => stream.extend(encode(&arbitrary_frame(rng))),
                3 => {
                    let line = encode(&arbitrary_frame(rng));
                    stream.extend(mutated(rng, line));
                }
                4 => stream.extend(*rng.pick(&[&b"\n"[..], b"\r\n", b"  \t\n", b"\r"])),
                5 => {
                    // A line around the maximum size, valid JSON or not.
                    let len = DECODER_MAX_FRAME_SIZE - 8 + rng.index(24);
                    if rng.one_in(2) {
                        let frame = Frame::log("big", StreamKind::Stdout, "x".repeat(len));
                        let line = encode(&frame);
                        let cut = line.len() - 1 - len.min(line.len() - 1) / 2;
                        stream.extend(&line[..cut]);
                        stream.extend(&line[line.len() - 3..]);
                    } else {
                        stream.extend(rng.bytes(len));
                        stream.push(b'\n');
                    }
                }
                _ => stream.extend(noisy_bytes(rng, 40)),
            }
        }
        if rng.one_in(4) {
            // End inside a frame.
            let line = encode(&arbitrary_frame(rng));
            stream.extend(&line[..rng.index(line.len())]);
        }
        stream
    }

    #[test]
    fn frame_decoder_on_generated_streams() {
        let mut rng = Rng::new(0x5eed_0004);
        let mut total = DecodeSummary::default();
        for _ in 0..CASES {
            let s = frame_decoder(&arbitrary_stream(&mut rng));
            total.frames += s.frames;
            total.errors += s.errors;
            total.too_large += s.too_large;
            total.truncated += s.truncated;
        }
        assert!(total.frames > 1_000, "{total:?}");
        assert!(total.errors > 300, "{total:?}");
        assert!(total.too_large > 50, "{total:?}");
        assert!(total.truncated > 50, "{total:?}");
    }

    #[test]
    fn frame_decoder_on_random_bytes() {
        let mut rng = Rng::new(0x5eed_0005);
        let mut errors = 0;
        for _ in 0..CASES {
            let data = noisy_bytes(&mut rng, 700);
            errors += frame_decoder(&data).errors;
        }
        assert!(errors > CASES, "{errors}");
        // The bound holds for one long line with no newline at all.
        let s = frame_decoder(&vec![b'{'; 10 * DECODER_MAX_FRAME_SIZE]);
        assert_eq!((s.frames, s.too_large, s.truncated), (0, 1, 0));
    }

    #[test]
    fn generated_configs_round_trip() {
        let mut rng = Rng::new(0x5eed_0006);
        let (mut with_limits, mut with_root) = (0, 0);
        for _ in 0..CASES {
            let config = arbitrary_config(&mut rng);
            with_limits += usize::from(config.limits.defaults != Limits::default());
            with_root += usize::from(config.subprocess.workdir_root.is_some());
            config_round_trip(&config);
        }
        assert!(with_limits > CASES / 2, "{with_limits}");
        assert!(with_root > CASES / 4, "{with_root}");
    }

    #[test]
    fn http_bodies_on_random_bytes_and_generated_bodies() {
        let mut rng = Rng::new(0x5eed_0009);
        let mut total = BodySummary::default();
        for _ in 0..4 * CASES {
            let s = http_bodies(&noisy_bytes(&mut rng, 160));
            total.parsed += s.parsed;
            total.valid += s.valid;
        }
        // The generator reaches past parsing, and past validation, often enough.
        assert!(total.parsed >= 500, "{total:?}");
        assert!(total.valid >= 100, "{total:?}");
        let s = http_bodies(br#"{"program": {"command": ["true"]}}"#);
        assert!(s.parsed >= 1 && s.valid >= 1, "{s:?}");
        assert!(http_bodies(br#"{"port": 8080, "host": "::1"}"#).valid >= 1);
    }

    #[test]
    fn config_parse_on_random_bytes() {
        let mut rng = Rng::new(0x5eed_0007);
        for _ in 0..CASES {
            config_parse(&noisy_bytes(&mut rng, 120));
        }
        assert!(config_parse(b""));
        assert!(config_parse(b"{}"));
        assert!(!config_parse(b"[limits]\ntimeout_ms = 0\n"));
    }

    #[test]
    fn config_parse_on_mutated_configs() {
        let mut rng = Rng::new(0x5eed_0008);
        let (mut accepted, mut refused) = (0, 0);
        for i in 0..2 * CASES {
            let config = arbitrary_config(&mut rng);
            let text = if i % 2 == 0 {
                toml::to_string(&config).unwrap()
            } else {
                serde_json::to_string(&config).unwrap()
            };
            if config_parse(&mutated(&mut rng, text.into_bytes())) {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        // A floor that keeps the accepted path exercised (mutations of the now
        // larger default document break it more often than not).
        assert!(
            accepted >= 50,
            "only {accepted} mutated configs still parsed"
        );
        assert!(
            refused >= 500,
            "only {refused} mutated configs were refused"
        );
    }
}

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
//! - [`http_bodies`]: the HTTP API's bodies parse and validate without panicking.
//!
//! The configuration's oracles are the `paddock` crate's (`paddock::fuzzing`), where
//! the whole document lives; they use the [`Rng`], [`mutate`] and limit generators
//! here.
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

use crate::error::{Error, ErrorCode};
use crate::exec::StreamKind;
use crate::limits::Limits;
use crate::protocol::{
    decode_all, encode, parse, Frame, FrameDecoder, FrameKind, ProtocolError, ProtocolErrorKind,
};

mod generators;
mod mutators;
mod oracles;

pub use generators::*;
pub use mutators::*;
pub use oracles::*;

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

/// Random bytes biased toward the characters JSON and TOML care about.
pub fn noisy_bytes(rng: &mut Rng, max_len: usize) -> Vec<u8> {
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

/// `data` after one to three [`mutate`] steps.
pub fn mutated(rng: &mut Rng, mut data: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.index(3) {
        mutate(rng, &mut data);
    }
    data
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const CASES: usize = 1_000;

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
}

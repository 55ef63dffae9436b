//! Mutators: small random edits of a byte string that keep it near the inputs that
//! matter to the parsers.

use super::*;

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

//! Generators: random strings, ids, numbers, JSON, frames, limits and HTTP bodies,
//! each reproducible from an [`Rng`] seed.

use super::*;

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

pub(super) fn float(f: f64) -> Number {
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

/// How many limits a [`Limits`] has.
pub const LIMIT_FIELDS: usize = crate::limits::LIMIT_TABLE.len();

/// The `field`th limit of `limits` (in [`crate::limits::LIMIT_TABLE`] order).
pub fn limit_field(limits: &mut Limits, field: usize) -> &mut Option<u64> {
    let [a, b, c, d, e, f, g, h, i, j] = limits.fields_mut();
    match field {
        0 => a,
        1 => b,
        2 => c,
        3 => d,
        4 => e,
        5 => f,
        6 => g,
        7 => h,
        8 => i,
        _ => j,
    }
}

/// A random limit value: none, or a number at either end of the ranges in force.
pub fn arbitrary_limit(rng: &mut Rng) -> Option<u64> {
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

/// A random interpreter name or path that the config validator accepts.
pub fn interpreter(rng: &mut Rng) -> String {
    let rest = arbitrary_string(rng, 20).replace('\0', "_");
    format!("{}{rest}", rng.pick(&["python3", "node", "sh", "é"]))
}

/// The fields of each HTTP body, so generated bodies reach past "unknown field".
pub(super) const BODY_SHAPES: &[&[&str]] = &[
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

pub(super) const LIMIT_NAMES: &[&str] = &[
    "timeout_ms",
    "memory_bytes",
    "cpu_ms",
    "cpu_millicores",
    "pids",
    "max_output_bytes",
    "file_size_bytes",
    "open_files",
    "disk_bytes",
    "disk_files",
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

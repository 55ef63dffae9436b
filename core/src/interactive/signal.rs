//! Signals by name or number, and the range a process may be sent.

use crate::error::{Error, Result};

/// Parses a signal by name (`TERM`, `SIGTERM`, case-insensitive) or number (1..=64).
pub fn parse_signal(s: &str) -> Result<i32> {
    const NAMES: &[(&str, i32)] = &[
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("PIPE", 13),
        ("ALRM", 14),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
        ("TSTP", 20),
        ("WINCH", 28),
    ];
    let upper = s.trim().to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Some((_, n)) = NAMES.iter().find(|(k, _)| *k == name) {
        return Ok(*n);
    }
    match name.parse::<i32>() {
        Ok(n) => check_signal(n),
        Err(_) => Err(Error::invalid_options(
            "signal",
            format!("{s:?} is not a signal; use a name like TERM, INT or KILL, or a number"),
        )),
    }
}

/// The highest signal number [`check_signal`] takes.
pub const MAX_SIGNAL: i32 = 64;

/// `INVALID_OPTIONS` unless `signal` is 1..=[`MAX_SIGNAL`].
pub fn check_signal(signal: i32) -> Result<i32> {
    if (1..=MAX_SIGNAL).contains(&signal) {
        Ok(signal)
    } else {
        Err(Error::invalid_options(
            "signal",
            format!("{signal} is not a signal number; use 1 to 64"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(parse_signal("TERM").unwrap(), 15);
        assert_eq!(parse_signal("sigkill").unwrap(), 9);
        assert_eq!(parse_signal("2").unwrap(), 2);
        assert!(parse_signal("0").is_err());
        assert!(parse_signal("65").is_err());
        assert!(parse_signal("BOGUS").is_err());
    }
}

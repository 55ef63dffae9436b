//! Parsing of human-friendly durations and sizes in command-line flags.

use std::time::Duration;

/// Parses `500ms`, `5s`, `2m`, `1h`, or a bare number of seconds (`1.5`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration; use e.g. 500ms, 5s, 2m"))?;
    let secs = match unit.trim() {
        "" | "s" | "sec" => value,
        "ms" => value / 1000.0,
        "us" | "µs" => value / 1_000_000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit `{other}` in `{s}`; use ms, s, m or h"
            ))
        }
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 {
        return Err(format!(
            "`{s}` is out of range: use more than 0 and at most 24h"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `512`, `64k`, `512M`, `1G`, `1GiB` (binary multiples; `B` and `iB` optional).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size; use e.g. 512M, 1G, 64k"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return Err(format!("unknown size unit in `{s}`; use k, M, G or T")),
    };
    value
        .checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        for bad in ["", "abc", "5 parsecs", "0", "-1s", "100h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1gb").unwrap(), 1 << 30);
        for bad in ["", "M", "12X", "99999999999999999999"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}

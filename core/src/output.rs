//! The output cap's shared vocabulary: the truncation sentinel every engine and the
//! scheduler append when output passes its cap, and a UTF-8-safe cut.

/// The sentinel appended when output passes a cap of `cap` bytes:
/// `"\n[output truncated at {cap} bytes]\n"`.
///
/// ```
/// assert_eq!(
///     paddock_core::output::truncation_marker(10),
///     "\n[output truncated at 10 bytes]\n"
/// );
/// ```
pub fn truncation_marker(cap: u64) -> String {
    format!("\n[output truncated at {cap} bytes]\n")
}

/// Cuts `text` to at most `max_bytes` bytes, backing off to the previous UTF-8 char
/// boundary, and appends [`truncation_marker`]`(max_bytes)`. Returns the text and
/// whether it was cut; text within the cap is returned unchanged.
///
/// ```
/// use paddock_core::output::truncate_output;
///
/// assert_eq!(truncate_output("hello", 5), ("hello".to_string(), false));
/// let (cut, truncated) = truncate_output("héllo", 2); // 'é' is two bytes
/// assert!(truncated);
/// assert_eq!(cut, "h\n[output truncated at 2 bytes]\n");
/// ```
pub fn truncate_output(text: &str, max_bytes: u64) -> (String, bool) {
    if text.len() as u64 <= max_bytes {
        return (text.to_owned(), false);
    }
    // `max_bytes < text.len()` here, so it fits in usize.
    let mut end = max_bytes as usize;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let marker = truncation_marker(max_bytes);
    let mut out = String::with_capacity(end + marker.len());
    out.push_str(&text[..end]);
    out.push_str(&marker);
    (out, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_a_char_boundary() {
        let text = "ab€cd"; // '€' is three bytes: 2..5
        for cap in 2..5 {
            let (cut, truncated) = truncate_output(text, cap);
            assert!(truncated);
            assert_eq!(cut, format!("ab{}", truncation_marker(cap)));
        }
        let (cut, truncated) = truncate_output(text, 5);
        assert!(truncated);
        assert_eq!(cut, format!("ab€{}", truncation_marker(5)));
        assert_eq!(truncate_output(text, 7), (text.to_string(), false));
        assert_eq!(truncate_output("", 0), (String::new(), false));
        assert_eq!(truncate_output("x", 0).0, truncation_marker(0));
    }
}

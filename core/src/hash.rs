//! Hashing helpers.

use sha2::{Digest, Sha256};

/// The code hash the audit log records: SHA-256 of `text`, first 16 hex characters.
///
/// ```
/// assert_eq!(paddock_core::code_hash("print(1)").len(), 16);
/// ```
pub fn code_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(16);
    for byte in &digest[..8] {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_vector() {
        // sha256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
        assert_eq!(super::code_hash("abc"), "ba7816bf8f01cfea");
    }
}

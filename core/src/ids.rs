//! Ids that cannot be guessed.
//!
//! Every sandbox, process and execution id Paddock hands out carries a UUIDv4: 122
//! bits from the operating system's random source, with no clock and no counter in
//! it. Knowing one id (or a thousand made in the same burst) tells nothing of the
//! next, so an id alone is worth nothing to someone who was not given it. Ids do not
//! sort by creation time: whatever lists things in the order they were made orders
//! them by a timestamp of its own.
//!
//! A tagged id is `{tag}-{32 lowercase hex digits}`: valid as a file, cgroup and
//! container name, and as a DNS label (`{port}-{id}.{domain}` in E2B's addressing).
//!
//! ```
//! let id = paddock_core::ids::tagged("sp");
//! assert_eq!(id.len(), 35);
//! assert!(paddock_core::ids::random_part(&id, "sp").is_some());
//! ```

/// Random bits in every id made here (those of a UUIDv4).
pub const RANDOM_BITS: u32 = 122;

/// Hex digits of the random part of a tagged id.
pub const RANDOM_HEX_DIGITS: usize = 32;

/// A fresh random UUID (version 4, from the OS's random source).
pub fn random_uuid() -> uuid::Uuid {
    uuid::Uuid::new_v4()
}

/// A fresh id `{tag}-{32 hex digits}` whose hex digits are a UUIDv4.
pub fn tagged(tag: &str) -> String {
    format!("{tag}-{}", random_uuid().simple())
}

/// The UUIDv4 inside `id` when it is a tagged id of `tag` as [`tagged`] makes them
/// (used by tests and by anyone checking an id it was handed).
pub fn random_part(id: &str, tag: &str) -> Option<uuid::Uuid> {
    let hex = id.strip_prefix(tag)?.strip_prefix('-')?;
    if hex.len() != RANDOM_HEX_DIGITS
        || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let u = uuid::Uuid::try_parse(hex).ok()?;
    is_random(&u).then_some(u)
}

/// The UUIDv4 `text` holds (hyphenated, as execution ids are written), if it is one.
pub fn parse_random(text: &str) -> Option<uuid::Uuid> {
    let u = uuid::Uuid::try_parse(text).ok()?;
    is_random(&u).then_some(u)
}

/// Whether `u` is a UUIDv4 of the RFC 4122 variant: 122 random bits.
pub fn is_random(u: &uuid::Uuid) -> bool {
    u.get_version_num() == 4 && u.get_variant() == uuid::Variant::RFC4122
}

/// The longest prefix (in characters) that any two of `ids` share: a test's measure
/// of how much of an id the ids made before it give away.
pub fn longest_shared_prefix<S: AsRef<str>>(ids: &[S]) -> usize {
    let mut sorted: Vec<&str> = ids.iter().map(AsRef::as_ref).collect();
    sorted.sort_unstable();
    // In sorted order the longest shared prefix is between neighbours.
    sorted
        .windows(2)
        .map(|w| {
            w[0].bytes()
                .zip(w[1].bytes())
                .take_while(|(a, b)| a == b)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_made_in_a_burst_share_nothing_but_their_tag() {
        let ids: Vec<String> = (0..4096).map(|_| tagged("ct")).collect();
        for id in &ids {
            let u = random_part(id, "ct").unwrap_or_else(|| panic!("{id} is not a tagged v4 id"));
            assert!(is_random(&u), "{id}");
        }
        let unique: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
        // 4096 ids of 122 random bits: two sharing 8 hex digits after the tag has a
        // chance of about 2^-9 under 4096^2/2 pairs of 2^-32 each; 10 digits, 2^-17.
        let shared = longest_shared_prefix(&ids);
        assert!(
            shared < "ct-".len() + 10,
            "two ids share {shared} characters"
        );
    }

    #[test]
    fn only_tagged_v4_ids_pass_the_check() {
        let v7 = format!("sp-{}", uuid::Uuid::now_v7().simple());
        assert!(random_part(&v7, "sp").is_none(), "a clock-ordered id");
        let id = tagged("sp");
        assert!(random_part(&id, "ct").is_none(), "another tag");
        assert!(random_part(&format!("{id}-1"), "sp").is_none(), "a counter");
        assert!(
            random_part(&id.to_uppercase(), "SP").is_none(),
            "upper case"
        );
        assert!(random_part("sp-0", "sp").is_none());
        let exec = crate::ExecutionId::new().to_string();
        assert!(parse_random(&exec).is_some(), "{exec}");
        assert!(parse_random(&uuid::Uuid::now_v7().to_string()).is_none());
        assert_eq!(longest_shared_prefix(&["ab1", "ab2", "x"]), 2);
        assert_eq!(longest_shared_prefix::<&str>(&[]), 0);
    }
}

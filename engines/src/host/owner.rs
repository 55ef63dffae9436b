//! Which Paddock process owns a host resource it named, and whether that owner is
//! gone.
//!
//! Cgroups, container state and workdirs outlive a Paddock process that crashes, so a
//! new engine removes what dead ones left. Their names start with the owner's pid and
//! end with `-ns<inode>`, the owner's pid namespace. A pid is only meaningful in its own
//! namespace: two Paddocks in two containers that share a cgroup hierarchy or a temp dir
//! each see the other's pid as absent. An owner from another pid namespace is therefore
//! never judged gone, and its resources are left alone.

use std::path::Path;
use std::sync::OnceLock;

/// This process's pid namespace, as the inode of `/proc/self/ns/pid` (0 when it
/// cannot be read, which matches no other owner).
fn own_namespace() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .and_then(|l| namespace_inode(&l.to_string_lossy()))
            .unwrap_or(0)
    })
}

/// The inode in a namespace link such as `pid:[4026531836]`.
fn namespace_inode(link: &str) -> Option<u64> {
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// The suffix that names this process's pid namespace: `-ns<inode>`.
pub(crate) fn namespace_suffix() -> String {
    format!("-ns{}", own_namespace())
}

/// Whether the owner of a resource named `<pid>-…-ns<inode>` (the part after its
/// prefix) is gone: it is of this pid namespace and no process has its pid. A name
/// without the namespace suffix (made before it was added) is judged by its pid alone;
/// a name that does not start with a pid is never judged gone.
pub(crate) fn owner_is_gone(name: &str) -> bool {
    owner_is_gone_in(name, own_namespace(), |pid| {
        Path::new(&format!("/proc/{pid}")).exists()
    })
}

fn owner_is_gone_in(name: &str, own_ns: u64, alive: impl Fn(u32) -> bool) -> bool {
    let Some(pid) = name.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    if let Some((_, ns)) = name.rsplit_once("-ns") {
        match ns.parse::<u64>() {
            Ok(ns) if ns != own_ns => return false,
            _ => {}
        }
    }
    !alive(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_owner_of_this_namespace_is_judged_by_its_pid() {
        let dead = |_| false;
        let alive = |_| true;
        assert!(owner_is_gone_in("42-0-ns7", 7, dead));
        assert!(!owner_is_gone_in("42-0-ns7", 7, alive));
        // Another namespace: its pid says nothing here.
        assert!(!owner_is_gone_in("42-0-ns8", 7, dead));
        // Names from before the suffix: judged by the pid.
        assert!(owner_is_gone_in("42-0", 7, dead));
        assert!(owner_is_gone_in("42-0-ab12cd34", 7, dead));
        // Not a pid: never.
        assert!(!owner_is_gone_in("ct-42-0", 7, dead));
        assert!(!owner_is_gone_in("", 7, dead));
    }

    #[test]
    fn this_process_has_a_namespace_and_is_not_gone() {
        assert_eq!(namespace_inode("pid:[4026531836]"), Some(4026531836));
        assert_eq!(namespace_inode("net:[1]"), None);
        assert_ne!(own_namespace(), 0);
        let mine = format!("{}-0{}", std::process::id(), namespace_suffix());
        assert!(!owner_is_gone(&mine));
        let foreign = format!("{}-0-ns{}", u32::MAX - 1, own_namespace() + 1);
        assert!(!owner_is_gone(&foreign));
        let dead_here = format!("{}-0{}", u32::MAX - 1, namespace_suffix());
        assert!(owner_is_gone(&dead_here));
    }
}

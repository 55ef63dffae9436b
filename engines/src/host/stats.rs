//! What this process has used, as the benchmarks measure it: CPU time (its own and
//! its reaped children's), the allocator's heap, and the kernel's clock tick (the unit
//! of the CPU times in `/proc/<pid>/stat`).

// `getrusage`, `mallinfo2` and `sysconf` are `unsafe` to call; each is made here
// behind a safe function.
#![allow(unsafe_code)]

use std::time::Duration;

/// Whose CPU time [`cpu_time`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose {
    /// This process's threads.
    Process,
    /// This process's children that have ended and been waited for.
    Children,
}

/// User plus system CPU time of `whose`; zero if it cannot be read.
pub fn cpu_time(whose: Whose) -> Duration {
    let who = match whose {
        Whose::Process => libc::RUSAGE_SELF,
        Whose::Children => libc::RUSAGE_CHILDREN,
    };
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the local struct it is given.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The allocator's heap, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heap {
    /// Handed out and not given back (a leak grows this).
    pub in_use: u64,
    /// Free, but kept in the allocator's arenas. RSS holds both.
    pub free: u64,
}

/// The allocator's heap, from glibc's `mallinfo2`; `None` with another C library.
pub fn heap() -> Option<Heap> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no pointers; it only reads the allocator's counters.
        let m = unsafe { libc::mallinfo2() };
        Some(Heap {
            in_use: (m.uordblks + m.hblkhd) as u64,
            free: m.fordblks as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Clock ticks a second, the unit of the CPU times in `/proc/<pid>/stat`.
pub fn clock_ticks_per_second() -> u64 {
    super::sys::clock_ticks_per_second()
}

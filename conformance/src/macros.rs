//! Assertion macros for cases: each returns early with a [`crate::case::Stop`].

/// Fails the case with a formatted message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::case::Stop::Fail(format!($($fmt)+)));
        }
    };
}

/// Fails the case with a formatted message.
macro_rules! fail {
    ($($fmt:tt)+) => {
        return Err($crate::case::Stop::Fail(format!($($fmt)+)))
    };
}

/// Skips the case with a formatted reason.
macro_rules! skip {
    ($($fmt:tt)+) => {
        return Err($crate::case::Stop::Skip(format!($($fmt)+)))
    };
}

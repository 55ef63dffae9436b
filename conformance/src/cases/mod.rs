//! The case bodies, grouped by area.

pub(crate) mod environment;
pub(crate) mod exec;
pub(crate) mod fileops;
pub(crate) mod files;
pub(crate) mod handlers;
pub(crate) mod interactive;
pub(crate) mod javascript;
pub(crate) mod lifecycle;
pub(crate) mod limits;
pub(crate) mod process;
pub(crate) mod refusals;

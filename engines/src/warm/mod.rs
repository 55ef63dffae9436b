//! Warm runners, shared by the engines that keep interpreters running between
//! executions (subprocess and container): the runner scripts, and the worker that
//! speaks the frame protocol to one runner process and serves one turn at a time.
//! Each engine decides where its runners live and when they are replaced; this
//! module knows neither engine.

pub(crate) mod scripts;
pub(crate) mod worker;

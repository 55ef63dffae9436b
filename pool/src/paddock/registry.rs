//! [`EngineRegistry`]: where a [`PaddockBuilder`](super::PaddockBuilder) gets the
//! engines the configuration enables.
//!
//! The scheduler knows no engine type. A builder runs the engines registered in code
//! with [`PaddockBuilder::engine`](super::PaddockBuilder::engine), and those its
//! registry makes from the configuration; the `paddock` crate's `paddock::builder()`
//! gives it the built-in engines of `paddock-engines` (subprocess, isolate, container
//! and the `[engines.NAME]` sections). A builder without a registry runs only the
//! engines registered in code.

use std::sync::Arc;

use paddock_core::{Engine, EngineName, Error};

/// The engines a registry made, and the ones it could not.
#[derive(Debug, Default)]
pub struct MadeEngines {
    /// The engines that started, in the registry's order (the first one that is not
    /// of an `[engines.NAME]` section is the default when nothing else decides).
    pub engines: Vec<Arc<dyn Engine>>,
    /// The engines the config enables that cannot run on this host, and why (for
    /// instance a host without a usable OCI runtime). The others run without them;
    /// `paddock doctor` says the same.
    pub unavailable: Vec<(EngineName, String)>,
}

/// Makes the engines a configuration enables.
///
/// A registry holds the sections of the engines it makes (the scheduler's own
/// configuration names none of them). Implemented by the `paddock` crate for the
/// built-in engines, which it makes with their sections of the whole document;
/// implement it to give a builder engines of your own made from settings of your
/// own, or register ready engines with
/// [`PaddockBuilder::engine`](super::PaddockBuilder::engine) instead.
pub trait EngineRegistry: Send + Sync + std::fmt::Debug {
    /// Makes every engine its configuration enables whose name `wanted` accepts: the builder
    /// leaves out the names its [`without`](super::PaddockBuilder::without) lists and
    /// those of the engines registered in code.
    ///
    /// An engine that cannot run on this host goes to [`MadeEngines::unavailable`];
    /// an error (an invalid section, say) fails the builder's start.
    fn make(
        &self,
        wanted: &dyn Fn(&EngineName) -> bool,
    ) -> Result<MadeEngines, Error>;
}

//! The scheduler end to end: the `Paddock` handle, the actor message API, sessions,
//! and the pool chaos matrix.

mod actor_api;
mod chaos;
mod facade;
mod lifecycle;
mod memory;
mod panics;
mod suspend;
mod tenancy;
mod validation;

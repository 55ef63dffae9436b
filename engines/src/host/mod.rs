//! The host layer: the operating-system mechanisms the engines stand on.
//!
//! Starting a program without forking the host ([`spawn`]), cgroups ([`cgroup`]),
//! network and mount namespaces ([`netns`]), a sandbox's working directory with its
//! path confinement ([`workdir`]) and its own filesystem, the disk quota ([`volume`]), pseudo-terminals ([`pty`]), the thin,
//! checked wrappers over single system calls ([`sys`]), and what this process has
//! used, for the benchmarks ([`stats`]). The engines above (and the CLI) call these
//! safe functions; the system calls themselves are made here.

pub mod cgroup;
pub(crate) mod egress;
pub mod netns;
pub(crate) mod owner;
pub(crate) mod pty;
pub(crate) mod spawn;
pub mod stats;
pub(crate) mod sys;
pub mod volume;
pub mod workdir;

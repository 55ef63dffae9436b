//! Integration tests of the engines against the real host.

mod cgroup_v2;
mod container;
mod files;
mod isolate;
mod subprocess;
mod warm;

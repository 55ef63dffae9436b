//! Integration tests of the engines against the real host.

mod cgroup_v2;
mod container;
mod egress;
mod files;
mod gateway_ports;
mod ids;
mod isolate;
mod subprocess;
mod warm;

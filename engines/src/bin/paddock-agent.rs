//! `paddock-agent`: pid 1 of a warm container of the container engine (see
//! `paddock_engines::agent`).
#![forbid(unsafe_code)]

fn main() {
    std::process::exit(paddock_engines::agent::main());
}

//! `paddock-agent`: pid 1 of a warm container of the container engine (see the
//! `paddock_agent` library).
#![forbid(unsafe_code)]

fn main() {
    std::process::exit(paddock_agent::main());
}

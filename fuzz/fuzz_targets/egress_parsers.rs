//! The egress gateway's parsers of what a sandbox sends: the TLS ClientHello and
//! HTTP request sniffers, authority splitting, and the DNS stub's answer. No panic;
//! a name the sniffers return is lower case and non-empty; an answer to a query
//! with an id carries that id; a name the allowlist does not admit is never
//! answered with an address.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use paddock_core::egress::EgressRules;
use paddock_egress::dns::{answer, Decision, Upstream};
use paddock_egress::sniff::{self, Sniffed};

struct Fixture {
    rt: tokio::runtime::Runtime,
    rules: EgressRules,
    // No resolver: an admitted name fails upstream (SERVFAIL), and nothing leaves
    // this machine.
    upstream: Upstream,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| Fixture {
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        rules: EgressRules::compile(
            "network.allowlist",
            &["allowed.test".to_string(), "*.wild.test".to_string()],
            &[],
        )
        .unwrap(),
        upstream: Upstream::new(Vec::new(), Duration::from_millis(10)),
    })
}

fuzz_target!(|data: &[u8]| {
    match sniff::sniff(data) {
        Sniffed::Tls(name) | Sniffed::Http(name) => {
            assert!(!name.is_empty(), "an empty name was sniffed");
            assert_eq!(name, name.to_ascii_lowercase(), "names are lower case");
        }
        _ => {}
    }
    let _ = sniff::http_host(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = sniff::split_host_port(text);
    }
    let f = fixture();
    let decision = f.rt.block_on(answer(data, &f.rules, &f.upstream));
    if let Decision::Answer {
        reply,
        allowed,
        addrs,
        ..
    } = decision
    {
        assert!(reply.len() >= 12, "an answer has a DNS header");
        assert_eq!(reply[..2], data[..2], "an answer carries the query's id");
        if !allowed {
            assert!(addrs.is_empty(), "a refused name got addresses");
        }
    }
});

//! The egress gateway's ports in a sandbox's namespace (its proxy, transparent path
//! and DNS stub) are Paddock's, not the sandbox's: a TCP stream "into the guest" to
//! them is refused, while the sandbox's own servers stay reachable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::{
    Engine, ErrorCode, NetworkPolicy, ProcessSpec, Sandbox, SandboxSpec, TcpTarget,
};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::SubprocessConfig;

/// A server on the sandbox's loopback port 8000 that answers every connection.
const SERVER: &str = "import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 8000)); s.listen(8)
while True:
    c, _ = s.accept(); c.sendall(b'mine'); c.close()
";

/// Waits up to 15 s for a stream to port 8000 of `sb`.
async fn reach_own_server(sb: &dyn Sandbox) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match sb.open_tcp_connection(TcpTarget::loopback(8000)).await {
            Ok(_) => return,
            Err(e) if e.code == ErrorCode::NotFound && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the sandbox's own server is not reached: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_ports_are_not_reached_by_a_stream_into_the_sandbox() {
    let engine = SubprocessEngine::new(&SubprocessConfig::default()).expect("engine starts");
    if !engine.capabilities().network.contains("allowlist") {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_none(),
            "allowlists must be enforced here: {:?}",
            engine.host_support().egress
        );
        eprintln!("skipped: {:?}", engine.host_support().egress);
        return;
    }
    let spec = SandboxSpec {
        network: NetworkPolicy::Allowlist {
            hosts: vec!["example.test".into()],
            ports: vec![],
        },
        ..SandboxSpec::default()
    };
    let sb: Arc<dyn Sandbox> = engine
        .create(&spec)
        .await
        .expect("an allowlist sandbox opens");
    let server = sb
        .start_process(ProcessSpec {
            argv: vec!["python3".into(), "-c".into(), SERVER.into()],
            ..Default::default()
        })
        .await
        .expect("the server starts");
    reach_own_server(&*sb).await;
    for port in [3128, 15001, 53] {
        let Err(e) = sb.open_tcp_connection(TcpTarget::loopback(port)).await else {
            panic!("a stream reached the gateway's port {port}");
        };
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{port}: {e}");
        assert!(
            e.message.contains(&format!("port {port} ")) && e.message.contains("gateway"),
            "{e}"
        );
    }
    drop(server);
    sb.destroy().await.expect("destroyed");

    // Without a network there is no gateway: its ports are the sandbox's to use (here
    // nothing listens on them).
    let plain = engine
        .create(&SandboxSpec::default())
        .await
        .expect("a sandbox opens");
    let Err(e) = plain.open_tcp_connection(TcpTarget::loopback(3128)).await else {
        panic!("nothing listens on 3128 in a sandbox without a network");
    };
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    plain.destroy().await.expect("destroyed");
}

//! Network `allowlist` on the engines, against the small internet the egress tests
//! build (`egress/tests/internet`): what passes, what is refused and how fast, what
//! each execution's result lists, and that nothing of the sandbox's network is left
//! after destroy.

#[path = "../../../egress/tests/internet/mod.rs"]
mod internet;

use std::sync::Arc;
use std::time::Duration;

use paddock_core::egress::{EgressVerdict, EgressVia};
use paddock_core::{
    CancelToken, DiscardSink, Engine, ExecRequest, ExecResult, Language, NetworkPolicy, Program,
    Sandbox, SandboxSpec,
};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::{EgressConfig, SubprocessConfig};

fn required() -> bool {
    std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some()
}

/// The internet, or `None` (the test skips) where it cannot be built.
fn internet(tag: &str) -> Option<internet::Internet> {
    let why = internet::unavailable().or_else(|| {
        paddock_egress::find_nft()
            .is_none()
            .then(|| "no nft (Debian's nftables)".to_string())
    });
    if let Some(why) = why {
        assert!(!required(), "the egress tests must run: {why}");
        eprintln!("skipped: {why}");
        return None;
    }
    Some(internet::Internet::start(tag).expect("the test's internet"))
}

fn allowlist(hosts: &[&str]) -> SandboxSpec {
    SandboxSpec {
        network: NetworkPolicy::Allowlist {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ports: vec![],
        },
        ..SandboxSpec::default()
    }
}

async fn run(sb: &dyn Sandbox, argv: &[&str]) -> ExecResult {
    let mut req = ExecRequest::new(Program::Command {
        argv: argv.iter().map(|s| s.to_string()).collect(),
    });
    req.limits.timeout_ms = Some(20_000);
    sb.exec(req, &DiscardSink, CancelToken::new())
        .await
        .expect("the execution runs")
}

async fn python(sb: &dyn Sandbox, source: &str) -> ExecResult {
    let req = ExecRequest::new(Program::Code {
        language: Language::Python,
        source: source.to_string(),
    });
    sb.exec(req, &DiscardSink, CancelToken::new())
        .await
        .expect("the execution runs")
}

const PY_CONNECT: &str = "import socket,sys,time
t = time.time()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).recv(1)
    print('open')
except OSError as e:
    print('refused', type(e).__name__, round(time.time() - t, 3))
";

/// That `r`'s egress lists the refusal at connect of its connection to `addr:80`.
fn assert_refusal_listed(r: &ExecResult, addr: &str) {
    let report = r.egress.as_ref().expect("the result lists its egress");
    assert!(
        report.events.iter().any(|e| e.via == EgressVia::Transparent
            && e.host == addr
            && e.port == 80
            && e.addr.as_deref() == Some(&*format!("{addr}:80"))
            && e.verdict == EgressVerdict::Denied),
        "{addr}: {report:#?}"
    );
    assert_eq!(report.denied, 1, "{addr}: {report:#?}");
}

/// The network namespaces of every process, and of the fds this process holds.
fn live_namespaces() -> Vec<String> {
    let mut seen = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return seen;
    };
    for p in procs.flatten() {
        if let Ok(link) = std::fs::read_link(p.path().join("ns/net")) {
            seen.push(link.to_string_lossy().into_owned());
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                seen.push(link.to_string_lossy().into_owned());
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_on_the_subprocess_engine_admits_what_it_names_and_nothing_else() {
    let Some(net) = internet("s") else {
        return;
    };
    let config = SubprocessConfig {
        egress: EgressConfig {
            resolvers: vec![net.resolver().to_string()],
            ..EgressConfig::default()
        },
        ..SubprocessConfig::default()
    };
    let engine = SubprocessEngine::new(&config).expect("the engine starts");
    assert_eq!(engine.host_support().egress, Ok(()));
    assert!(
        engine.capabilities().network.contains("allowlist"),
        "{:?}",
        engine.capabilities()
    );
    let sb: Arc<dyn Sandbox> = engine
        .create(&allowlist(&["allowed.test"]))
        .await
        .expect("an allowlist sandbox opens");
    let ca = net.ca();
    let ca = ca.to_str().unwrap();

    // Allowed: through the proxy the sandbox is pointed at (plain and CONNECT), and
    // transparently for a program that ignores proxies.
    let r = run(
        &*sb,
        &["curl", "-sS", "--max-time", "5", "http://allowed.test/"],
    )
    .await;
    assert_eq!(
        r.stdout, "hello from 198.51.100.2 for allowed.test\n",
        "{r:?}"
    );
    let r = run(
        &*sb,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--cacert",
            ca,
            "https://allowed.test/",
        ],
    )
    .await;
    assert_eq!(
        r.stdout, "hello from 198.51.100.2 for allowed.test\n",
        "{r:?}"
    );
    let connect = r.egress.expect("the result lists its egress");
    assert!(
        connect.events.iter().any(|e| e.via == EgressVia::Connect
            && e.host == "allowed.test"
            && e.port == 443
            && e.verdict == EgressVerdict::Allowed
            && e.bytes_in > 0),
        "{connect:#?}"
    );
    let r = run(
        &*sb,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--noproxy",
            "*",
            "--cacert",
            ca,
            "https://allowed.test/",
        ],
    )
    .await;
    assert_eq!(
        r.stdout, "hello from 198.51.100.2 for allowed.test\n",
        "{r:?}"
    );
    let transparent = r.egress.expect("the result lists its egress");
    assert!(
        transparent
            .events
            .iter()
            .any(|e| e.via == EgressVia::Transparent && e.verdict == EgressVerdict::Allowed),
        "{transparent:#?}"
    );

    // Denied, fast: a name outside the list (403 from the proxy, NXDOMAIN), the
    // denied server's address, the metadata address, and UDP.
    let r = run(
        &*sb,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "-w",
            " %{http_code}",
            "http://denied.test/",
        ],
    )
    .await;
    assert!(r.stdout.ends_with(" 403"), "{r:?}");
    assert!(r.usage.wall_ms < 1_000, "{r:?}");
    let r = run(
        &*sb,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--noproxy",
            "*",
            "http://denied.test/",
        ],
    )
    .await;
    assert_eq!(r.exit_code(), Some(6), "curl cannot resolve it: {r:?}");
    // Refused at connect by the sandbox's firewall, and listed as denied.
    for addr in [internet::DENIED, "169.254.169.254"] {
        let r = run(&*sb, &["python3", "-c", PY_CONNECT, addr, "80"]).await;
        assert!(
            r.stdout.starts_with("refused ConnectionRefusedError"),
            "{addr}: {r:?}"
        );
        assert!(r.usage.wall_ms < 1_000, "{addr}: {r:?}");
        assert_refusal_listed(&r, addr);
    }
    let r = run(
        &*sb,
        &[
            "python3",
            "-c",
            "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('198.51.100.2', 9999)); print('sent')\nexcept OSError as e: print('refused', type(e).__name__)",
        ],
    )
    .await;
    assert_eq!(r.stdout.trim(), "refused PermissionError", "{r:?}");

    // Warm Python (the sandbox's interpreter, started when it opened) is inside too:
    // urllib follows the proxy variables.
    let r = python(
        &*sb,
        "import urllib.request, urllib.error\n\
         print(urllib.request.urlopen('http://allowed.test/', timeout=5).read().decode(), end='')\n\
         try:\n    urllib.request.urlopen('http://denied.test/', timeout=5)\n\
         except urllib.error.HTTPError as e:\n    print('denied', e.code)",
    )
    .await;
    assert_eq!(r.exit_code(), Some(0), "{r:?}");
    assert_eq!(
        r.stdout, "hello from 198.51.100.2 for allowed.test\ndenied 403\n",
        "{r:?}"
    );
    let both = r.egress.expect("the result lists its egress");
    assert!(
        both.events
            .iter()
            .any(|e| e.host == "allowed.test" && e.verdict == EgressVerdict::Allowed),
        "{both:#?}"
    );
    assert!(
        both.events
            .iter()
            .any(|e| e.host == "denied.test" && e.verdict == EgressVerdict::Denied),
        "{both:#?}"
    );
    assert_eq!((both.allowed, both.denied), (1, 1), "{both:#?}");

    // Nothing of its network is left after destroy.
    let r = run(&*sb, &["readlink", "/proc/self/ns/net"]).await;
    let ns = r.stdout.trim().to_string();
    assert!(ns.starts_with("net:["), "{r:?}");
    assert!(live_namespaces().contains(&ns));
    sb.destroy().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while live_namespaces().contains(&ns) {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox's namespace {ns} outlived its destroy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_allowlist_that_does_not_parse_is_refused_with_the_entry_named() {
    let engine = SubprocessEngine::new(&SubprocessConfig::default()).expect("the engine starts");
    let Err(e) = engine
        .create(&allowlist(&["pypi.org", "bad host name"]))
        .await
    else {
        panic!("an allowlist with a bad entry opened a sandbox");
    };
    if engine.capabilities().network.contains("allowlist") {
        assert_eq!(e.code, paddock_core::ErrorCode::InvalidOptions, "{e}");
        assert!(e.message.contains("network.allowlist.hosts[1]"), "{e}");
    } else {
        assert_eq!(
            e.code,
            paddock_core::ErrorCode::CapabilityNotSupported,
            "{e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_on_crun_holds_in_warm_and_cold_containers() {
    on_the_container_engine(paddock_engines::OciRuntime::Crun, "k").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_on_runc_holds_in_warm_and_cold_containers() {
    on_the_container_engine(paddock_engines::OciRuntime::Runc, "r").await;
}

async fn on_the_container_engine(runtime: paddock_engines::OciRuntime, tag: &str) {
    let Some(net) = internet(tag) else {
        return;
    };
    let config = paddock_engines::ContainerConfig {
        runtime,
        egress: EgressConfig {
            resolvers: vec![net.resolver().to_string()],
            ..EgressConfig::default()
        },
        ..paddock_engines::ContainerConfig::default()
    };
    let engine = match paddock_engines::container::ContainerEngine::new(&config) {
        Ok(e) => e,
        Err(e) => {
            assert!(!required(), "the container engine must start here: {e}");
            eprintln!("skipped: {e}");
            return;
        }
    };
    if engine.runtime_info().kind.user_space_kernel() {
        assert!(!engine.capabilities().network.contains("allowlist"));
        eprintln!("skipped: gVisor does not offer allowlists");
        return;
    }
    assert!(
        engine.capabilities().network.contains("allowlist"),
        "{:?}",
        engine.capabilities()
    );
    let sb: Arc<dyn Sandbox> = engine
        .create(&allowlist(&["allowed.test"]))
        .await
        .expect("an allowlist sandbox opens");
    let ca = net.ca();
    // The test CA, where the container can read it.
    sb.write_file("ca.crt", &std::fs::read(&ca).unwrap())
        .await
        .unwrap();

    // In the warm container, then in one of its own (a CPU-time limit needs one).
    for cold in [false, true] {
        let exec = |argv: &[&str]| {
            let mut req = ExecRequest::new(Program::Command {
                argv: argv.iter().map(|s| s.to_string()).collect(),
            });
            req.limits.timeout_ms = Some(20_000);
            if cold {
                req.limits.cpu_ms = Some(10_000);
            }
            req
        };
        let run = |req: ExecRequest| {
            let sb = sb.clone();
            async move {
                sb.exec(req, &DiscardSink, CancelToken::new())
                    .await
                    .expect("the execution runs")
            }
        };
        let r = run(exec(&[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "http://allowed.test/",
        ]))
        .await;
        assert_eq!(
            r.stdout, "hello from 198.51.100.2 for allowed.test\n",
            "cold {cold}: {r:?}"
        );
        let r = run(exec(&[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--noproxy",
            "*",
            "--cacert",
            "ca.crt",
            "https://allowed.test/",
        ]))
        .await;
        assert_eq!(
            r.stdout, "hello from 198.51.100.2 for allowed.test\n",
            "cold {cold}: {r:?}"
        );
        let report = r.egress.expect("the result lists its egress");
        assert!(
            report
                .events
                .iter()
                .any(|e| e.via == EgressVia::Transparent && e.verdict == EgressVerdict::Allowed),
            "cold {cold}: {report:#?}"
        );
        let r = run(exec(&[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "-w",
            " %{http_code}",
            "http://denied.test/",
        ]))
        .await;
        assert!(r.stdout.ends_with(" 403"), "cold {cold}: {r:?}");
        for addr in [internet::DENIED, "169.254.169.254"] {
            let r = run(exec(&["python3", "-c", PY_CONNECT, addr, "80"])).await;
            assert!(
                r.stdout.starts_with("refused ConnectionRefusedError"),
                "cold {cold}: {addr}: {r:?}"
            );
            assert_refusal_listed(&r, addr);
        }
    }
    let r = run(&*sb, &["readlink", "/proc/self/ns/net"]).await;
    let ns = r.stdout.trim().to_string();
    assert!(ns.starts_with("net:["), "{r:?}");
    sb.destroy().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while live_namespaces().contains(&ns) {
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox's namespace {ns} outlived its destroy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrestricted_on_the_container_engine_goes_through_the_gateway_to_any_host_but_not_link_local(
) {
    let Some(net) = internet("u") else {
        return;
    };
    let config = paddock_engines::ContainerConfig {
        runtime: paddock_engines::OciRuntime::Crun,
        egress: EgressConfig {
            resolvers: vec![net.resolver().to_string()],
            ..EgressConfig::default()
        },
        ..paddock_engines::ContainerConfig::default()
    };
    let engine = match paddock_engines::container::ContainerEngine::new(&config) {
        Ok(e) => e,
        Err(e) => {
            assert!(!required(), "the container engine must start here: {e}");
            eprintln!("skipped: {e}");
            return;
        }
    };
    assert!(
        engine.capabilities().network.contains("unrestricted"),
        "{:?}",
        engine.capabilities()
    );
    let sb: Arc<dyn Sandbox> = engine
        .create(&SandboxSpec {
            network: NetworkPolicy::Unrestricted,
            ..SandboxSpec::default()
        })
        .await
        .expect("an unrestricted sandbox opens");
    sb.write_file("ca.crt", &std::fs::read(net.ca()).unwrap())
        .await
        .unwrap();
    for cold in [false, true] {
        let run = |argv: &[&str]| {
            let mut req = ExecRequest::new(Program::Command {
                argv: argv.iter().map(|s| s.to_string()).collect(),
            });
            req.limits.timeout_ms = Some(20_000);
            if cold {
                req.limits.cpu_ms = Some(10_000);
            }
            let sb = sb.clone();
            async move {
                sb.exec(req, &DiscardSink, CancelToken::new())
                    .await
                    .expect("the execution runs")
            }
        };
        // No proxy is set: every connection is carried transparently.
        let r = run(&["sh", "-c", "env | grep -ci _proxy || true"]).await;
        assert_eq!(r.stdout.trim(), "0", "cold {cold}: {r:?}");
        // Any name, any port, by name or by address.
        let r = run(&["curl", "-sS", "--max-time", "5", "http://denied.test/"]).await;
        assert_eq!(
            r.stdout, "hello from 198.51.100.3 for denied.test\n",
            "cold {cold}: {r:?}"
        );
        let report = r.egress.expect("the result lists its egress");
        assert!(
            report.events.iter().any(|e| e.via == EgressVia::Transparent
                && e.host == "denied.test"
                && e.port == 80
                && e.verdict == EgressVerdict::Allowed
                && e.reason == "unrestricted"
                && e.bytes_in > 0),
            "cold {cold}: {report:#?}"
        );
        let r = run(&[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--cacert",
            "ca.crt",
            "https://allowed.test/",
        ])
        .await;
        assert_eq!(
            r.stdout, "hello from 198.51.100.2 for allowed.test\n",
            "cold {cold}: {r:?}"
        );
        let url = format!("http://{}:8080/", internet::DENIED);
        let r = run(&["curl", "-sS", "--max-time", "5", &url]).await;
        assert_eq!(
            r.stdout,
            format!("hello from 198.51.100.3 for {}:8080\n", internet::DENIED),
            "cold {cold}: {r:?}"
        );
        // Never the metadata address, by address or by a name that resolves there,
        // and fast.
        let r = run(&["python3", "-c", PY_CONNECT, "169.254.169.254", "80"]).await;
        assert!(
            r.stdout.starts_with("refused ConnectionRefusedError"),
            "cold {cold}: {r:?}"
        );
        assert!(r.usage.wall_ms < 1_000, "cold {cold}: {r:?}");
        assert_refusal_listed(&r, "169.254.169.254");
        let r = run(&["curl", "-sS", "--max-time", "5", "http://metadata.test/"]).await;
        assert_ne!(r.exit_code(), Some(0), "cold {cold}: {r:?}");
        let report = r.egress.expect("the result lists its egress");
        assert!(
            report
                .events
                .iter()
                .any(|e| e.host == "metadata.test" && e.verdict == EgressVerdict::Denied),
            "cold {cold}: {report:#?}"
        );
        // UDP other than DNS is not carried.
        let r = run(&[
            "python3",
            "-c",
            "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('198.51.100.2', 9999)); print('sent')\nexcept OSError as e: print('refused', type(e).__name__)",
        ])
        .await;
        assert_eq!(
            r.stdout.trim(),
            "refused PermissionError",
            "cold {cold}: {r:?}"
        );
    }
    sb.destroy().await.unwrap();
}

//! The gateway against a small internet the test builds (see `internet/`): what an
//! allowlist lets through, what it refuses and how fast, and what it records.

// Entering the gateway's namespace from a test thread is a `setns`.
#![allow(unsafe_code)]

mod internet;

use std::os::fd::{AsRawFd, BorrowedFd};
use std::process::Command;
use std::time::{Duration, Instant};

use paddock_core::egress::{EgressRules, EgressVerdict, EgressVia};
use paddock_egress::{Gateway, GatewayConfig};

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `argv` inside the namespace `netns`, with the proxy variables when `proxy`.
fn run_in(netns: BorrowedFd<'_>, argv: &[&str], proxy: bool) -> Ran {
    let fd = netns.as_raw_fd();
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        // SAFETY: setns changes this thread's namespace only; it ends after the run.
        assert_eq!(unsafe { libc::setns(fd, libc::CLONE_NEWNET) }, 0);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_remove("http_proxy")
            .env_remove("https_proxy");
        cmd.env_remove("HTTP_PROXY").env_remove("HTTPS_PROXY");
        if proxy {
            cmd.envs(Gateway::proxy_env());
        }
        let t = Instant::now();
        let out = cmd.output().unwrap();
        Ran {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            took: t.elapsed(),
        }
    })
    .join()
    .unwrap()
}

fn skip() -> Option<String> {
    if let Some(why) = internet::unavailable() {
        return Some(why);
    }
    if paddock_egress::find_nft().is_none() {
        return Some("no nft".into());
    }
    None
}

fn required() -> bool {
    std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some()
}

const PY_RAW_HTTP: &str = "import socket,sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(b'GET / HTTP/1.1\\r\\nHost: ' + sys.argv[3].encode() + b'\\r\\nConnection: close\\r\\n\\r\\n')
out = b''
while True:
    b = s.recv(4096)
    if not b: break
    out += b
print(out.decode().split('\\r\\n\\r\\n', 1)[-1], end='')
";

const PY_CONNECT_ONLY: &str = "import socket,sys,time
t = time.time()
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    s.sendall(b'x')
    got = s.recv(10)
    print('open', got)
except OSError as e:
    print('refused', type(e).__name__, e)
";

const PY_UDP: &str = "import socket,sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(1)
try:
    u.sendto(b'ping', (sys.argv[1], int(sys.argv[2])))
    print('sent', u.recvfrom(10))
except OSError as e:
    print('refused', type(e).__name__, e)
";

const PY_RESOLVE: &str = "import socket,sys
try:
    print('resolved', socket.gethostbyname(sys.argv[1]))
except socket.gaierror as e:
    print('gaierror', e.errno)
";

#[test]
fn an_allowlist_lets_through_what_it_names_and_nothing_else() {
    if let Some(why) = skip() {
        assert!(!required(), "the egress test must run: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let net = internet::Internet::start("g").expect("the test's internet");
    let mut cfg = GatewayConfig::detect().unwrap();
    cfg.resolvers = vec![net.resolver()];
    let hosts: Vec<String> = ["allowed.test", "private.test", "metadata.test"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rules = EgressRules::compile("network.allowlist", &hosts, &[]).unwrap();
    let gw = Gateway::open(rules, &cfg).expect("a gateway");
    let ns = gw.netns();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ca = net.ca();
    let ca = ca.to_str().unwrap();
    let mark = gw.mark();

    // Allowed: through the proxy (plain HTTP and CONNECT), and transparently.
    let r = run_in(
        ns,
        &["curl", "-sS", "--max-time", "5", "http://allowed.test/"],
        true,
    );
    assert_eq!(
        r.stdout, "hello from 198.51.100.2 for allowed.test\n",
        "{}",
        r.stderr
    );
    let r = run_in(
        ns,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--cacert",
            ca,
            "https://allowed.test/",
        ],
        true,
    );
    assert_eq!(
        r.stdout, "hello from 198.51.100.2 for allowed.test\n",
        "{}",
        r.stderr
    );
    let r = run_in(
        ns,
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
        false,
    );
    assert_eq!(
        r.stdout, "hello from 198.51.100.2 for allowed.test\n",
        "{}",
        r.stderr
    );
    let r = run_in(
        ns,
        &[
            "python3",
            "-c",
            PY_RAW_HTTP,
            "allowed.test",
            "80",
            "allowed.test",
        ],
        false,
    );
    assert_eq!(
        r.stdout, "hello from 198.51.100.2 for allowed.test\n",
        "{}",
        r.stderr
    );
    // A download arrives whole through the tunnel and the transparent path, and is
    // counted.
    const BIG: u64 = 24 << 20;
    let url = format!("https://allowed.test/bytes/{BIG}");
    for proxy in [true, false] {
        let r = run_in(
            ns,
            &[
                "curl",
                "-sS",
                "--max-time",
                "20",
                "--cacert",
                ca,
                "-o",
                "/dev/null",
                "-w",
                "%{size_download}",
                &url,
            ],
            proxy,
        );
        assert_eq!(r.stdout, BIG.to_string(), "proxy {proxy}: {}", r.stderr);
    }

    // Denied, and fast: by the proxy with a 403 naming why, by DNS with NXDOMAIN.
    let r = run_in(
        ns,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "-w",
            "%{http_code}",
            "http://denied.test/",
        ],
        true,
    );
    assert!(
        r.stdout
            .starts_with("paddock egress: host `denied.test` matches no rule"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.ends_with("403"), "{}", r.stdout);
    assert!(r.took < Duration::from_secs(1), "{:?}", r.took);
    let r = run_in(
        ns,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--cacert",
            ca,
            "https://denied.test/",
        ],
        true,
    );
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("403"), "{}", r.stderr);
    assert!(r.took < Duration::from_secs(1), "{:?}", r.took);
    let r = run_in(ns, &["python3", "-c", PY_RESOLVE, "denied.test"], false);
    assert_eq!(
        r.stdout.trim(),
        format!("gaierror {}", -2),
        "NXDOMAIN is EAI_NONAME: {}",
        r.stdout
    );
    assert!(r.took < Duration::from_secs(1), "{:?}", r.took);
    let r = run_in(
        ns,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--noproxy",
            "*",
            "http://denied.test/",
        ],
        false,
    );
    assert_eq!(r.code, Some(6), "could not resolve: {}", r.stderr);
    // A raw connect to the denied server's address, and to the metadata address.
    for addr in [internet::DENIED, "169.254.169.254"] {
        let r = run_in(ns, &["python3", "-c", PY_CONNECT_ONLY, addr, "80"], false);
        assert!(r.stdout.starts_with("refused"), "{addr}: {}", r.stdout);
        assert!(r.took < Duration::from_secs(1), "{addr}: {:?}", r.took);
    }
    // Names that resolve to private or link-local addresses.
    for (name, why) in [
        (
            "private.test",
            "private address, which no address rule of the allowlist covers",
        ),
        (
            "metadata.test",
            "link-local address, which no sandbox reaches",
        ),
    ] {
        let r = run_in(
            ns,
            &["curl", "-sS", "--max-time", "5", &format!("http://{name}/")],
            true,
        );
        assert!(r.stdout.contains(why), "{name}: {}", r.stdout);
        let r = run_in(ns, &["python3", "-c", PY_RESOLVE, name], false);
        assert!(r.stdout.starts_with("gaierror"), "{name}: {}", r.stdout);
    }
    // A port the allowlist does not name, on the allowed host.
    let r = run_in(
        ns,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "-w",
            "%{http_code}",
            "http://allowed.test:8080/",
        ],
        true,
    );
    assert!(
        r.stdout
            .contains("port 8080 is not among the allowlist's ports (80, 443)"),
        "{}",
        r.stdout
    );
    // UDP anywhere but DNS.
    let r = run_in(
        ns,
        &["python3", "-c", PY_UDP, internet::ALLOWED, "9999"],
        false,
    );
    assert!(
        r.stdout.starts_with("refused PermissionError"),
        "{}",
        r.stdout
    );

    let (events, lost) = rt.block_on(gw.events_since(mark));
    assert_eq!(lost, 0);
    let find = |via, host: &str, verdict| {
        events
            .iter()
            .find(|e| e.via == via && e.host == host && e.verdict == verdict)
            .unwrap_or_else(|| panic!("no {via:?} {host} {verdict:?} in {events:#?}"))
    };
    let ok = find(EgressVia::Http, "allowed.test", EgressVerdict::Allowed);
    assert_eq!(ok.reason, "allowed.test");
    assert_eq!(ok.addr.as_deref(), Some("198.51.100.2:80"));
    assert!(ok.bytes_in > 0 && ok.bytes_out > 0, "{ok:?}");
    find(EgressVia::Connect, "allowed.test", EgressVerdict::Allowed);
    for via in [EgressVia::Connect, EgressVia::Transparent] {
        assert!(
            events.iter().any(|e| e.via == via && e.bytes_in >= BIG),
            "no {via:?} event counts the download: {events:#?}"
        );
    }
    find(
        EgressVia::Transparent,
        "allowed.test",
        EgressVerdict::Allowed,
    );
    find(EgressVia::Dns, "allowed.test", EgressVerdict::Allowed);
    find(EgressVia::Http, "denied.test", EgressVerdict::Denied);
    find(EgressVia::Connect, "denied.test", EgressVerdict::Denied);
    find(EgressVia::Dns, "denied.test", EgressVerdict::Denied);
    find(
        EgressVia::Transparent,
        internet::DENIED,
        EgressVerdict::Denied,
    );
    find(
        EgressVia::Transparent,
        "169.254.169.254",
        EgressVerdict::Denied,
    );
    let (allowed, denied, _) = gw.totals();
    assert!(allowed >= 6 && denied >= 8, "{allowed} {denied}");
}

#[test]
fn connections_per_sandbox_are_bounded() {
    if let Some(why) = skip() {
        assert!(!required(), "the egress test must run: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let net = internet::Internet::start("c").expect("the test's internet");
    let mut cfg = GatewayConfig::detect().unwrap();
    cfg.resolvers = vec![net.resolver()];
    cfg.limits.max_connections = 2;
    let rules =
        EgressRules::compile("network.allowlist", &["allowed.test".to_string()], &[]).unwrap();
    let gw = Gateway::open(rules, &cfg).expect("a gateway");
    // Two held CONNECT tunnels, then a third: 503.
    let script = "import socket
held = []
for i in range(3):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=5)
    s.sendall(b'CONNECT allowed.test:443 HTTP/1.1\\r\\nHost: allowed.test:443\\r\\n\\r\\n')
    print(s.recv(200).split(b'\\r\\n')[0].decode())
    held.append(s)
";
    let r = run_in(gw.netns(), &["python3", "-c", script], false);
    assert_eq!(
        r.stdout,
        "HTTP/1.1 200 Connection established\nHTTP/1.1 200 Connection established\nHTTP/1.1 503 Service Unavailable\n",
        "{}",
        r.stderr
    );
}

const PY_CONNECT_STATUS: &str = "import socket,sys
s = socket.create_connection(('127.0.0.1', 3128), timeout=5)
s.sendall(b'CONNECT ' + sys.argv[1].encode() + b' HTTP/1.1\\r\\nHost: ' + sys.argv[1].encode() + b'\\r\\n\\r\\n')
print(s.recv(300).split(b'\\r\\n')[0].decode())
";

/// What `unrestricted` never reaches, no allowlist reaches either: the host's
/// loopback in every spelling, and the host's own addresses (here its end of the
/// test's veth), named directly or through a name that resolves to them. Neither
/// the proxy nor the transparent path dials them, under an allowlist whose range
/// holds the host's address or under `unrestricted`; the host's listeners see no
/// connection.
#[test]
fn no_policy_reaches_the_host_itself() {
    if let Some(why) = skip() {
        assert!(!required(), "the egress test must run: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let net = internet::Internet::start("h").expect("the test's internet");
    let loopback = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let own = std::net::TcpListener::bind((internet::HOST_SIDE, 0)).unwrap();
    loopback.set_nonblocking(true).unwrap();
    own.set_nonblocking(true).unwrap();
    let (lo_port, own_port) = (
        loopback.local_addr().unwrap().port(),
        own.local_addr().unwrap().port(),
    );
    let mut cfg = GatewayConfig::detect().unwrap();
    cfg.resolvers = vec![net.resolver()];
    let hosts: Vec<String> = ["198.51.100.0/24", "loopback.test", "host.test", "localhost"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let listed =
        EgressRules::compile("network.allowlist", &hosts, &[80, lo_port, own_port]).unwrap();
    for (what, rules) in [
        ("an allowlist", listed),
        ("unrestricted", EgressRules::unrestricted(true)),
    ] {
        let gw = Gateway::open(rules, &cfg).expect("a gateway");
        let ns = gw.netns();
        // The range is open: its other addresses are reached.
        let r = run_in(
            ns,
            &["python3", "-c", PY_CONNECT_STATUS, "198.51.100.2:80"],
            false,
        );
        assert_eq!(
            r.stdout.trim(),
            "HTTP/1.1 200 Connection established",
            "{what}: {}",
            r.stderr
        );
        for target in [
            format!("127.0.0.1:{lo_port}"),
            format!("127.1:{lo_port}"),
            format!("2130706433:{lo_port}"),
            format!("0x7f.0.0.1:{lo_port}"),
            format!("0177.0.0.1:{lo_port}"),
            format!("[::ffff:127.0.0.1]:{lo_port}"),
            format!("[::1]:{lo_port}"),
            format!("loopback.test:{lo_port}"),
            format!("localhost:{lo_port}"),
            format!("{}:{own_port}", internet::HOST_SIDE),
            format!("host.test:{own_port}"),
        ] {
            let r = run_in(ns, &["python3", "-c", PY_CONNECT_STATUS, &target], false);
            let status = r.stdout.trim();
            assert!(
                status.starts_with("HTTP/1.1 4") || status.starts_with("HTTP/1.1 5"),
                "{what}, {target}: {status:?} {}",
                r.stderr
            );
        }
        // Transparently: a program that ignores the proxy.
        let r = run_in(
            ns,
            &[
                "python3",
                "-c",
                PY_CONNECT_ONLY,
                internet::HOST_SIDE,
                &own_port.to_string(),
            ],
            false,
        );
        assert!(r.stdout.starts_with("refused"), "{what}: {}", r.stdout);
    }
    for (name, l) in [("loopback", &loopback), ("own", &own)] {
        match l.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("the host's {name} listener was reached: {other:?}"),
        }
    }
}

//! Reaching outside: writes outside the workdir, symlink escapes, probing for secrets,
//! and network connections under policy `none` to listeners this test starts on
//! loopback and on a veth address in a namespace of its own.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use paddock_core::ErrorCode;
use paddock_pool::audit::AuditQuery;

use crate::exhaustion::still_works;
use crate::harness::{clip, Check, Lang, Stop, Target, H, HOST_SECRETS};

/// Why the subprocess engine cannot keep a program off the host's files and processes.
const HOST_USER: &str = "the subprocess engine runs a program as this process's user on the host's file system and process table (no mount or pid namespace); it cannot stop that user's writes or reads outside the workdir. Use the container engine (`level: strict`) for untrusted code; see docs/security.md";

fn shares_host(target: Target) -> bool {
    matches!(target, Target::Subprocess | Target::WarmPython)
}

pub(crate) async fn writes_outside_workdir(h: Arc<H>) -> Check {
    let sandbox = h.sandbox().await?;
    let workdir = PathBuf::from(&sandbox.info().host_dir);
    let name = format!("paddock-adversarial-{}", h.token);
    let targets = [
        format!("/tmp/{name}"),
        format!("/var/tmp/{name}"),
        format!("/etc/{name}"),
        format!("../{name}"),
    ];
    let on_host: Vec<PathBuf> = targets
        .iter()
        .map(|p| match p.strip_prefix("../") {
            Some(rel) => workdir.parent().unwrap_or(Path::new("/")).join(rel),
            None => PathBuf::from(p),
        })
        .collect();
    let list = targets.join(" ");
    let quoted = targets
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let r = sandbox
        .exec(h.program(
            &format!("for p in {list}; do echo hostile > \"$p\" 2>/dev/null && echo \"wrote $p\"; done; true"),
            &format!("for p in [{quoted}]:\n    try:\n        open(p, 'w').write('hostile')\n        print('wrote', p)\n    except OSError:\n        pass"),
            &format!("import {{ writeFile }} from 'sandbox:fs';\nfor (const p of [{quoted}]) {{ try {{ writeFile(p, 'hostile'); console.log('wrote', p); }} catch (e) {{ console.log('refused', p, e.code); }} }}"),
        ))
        .await
        .map_err(|e| Stop::Fail(format!("exec: {e}")))?;
    let written: Vec<&PathBuf> = on_host.iter().filter(|p| p.exists()).collect();
    let shown = format!("{written:?}");
    for p in &written {
        let _ = std::fs::remove_file(p);
    }
    sandbox
        .destroy()
        .await
        .map_err(|e| Stop::Fail(format!("destroy: {e}")))?;
    ensure!(r.is_success(), "the program failed: {r:?}");
    if h.target.lang() == Lang::Js {
        let refused = r
            .stdout
            .lines()
            .filter(|l| l.ends_with("PATH_ESCAPE"))
            .count();
        ensure!(
            refused == targets.len(),
            "every write outside the workdir must throw PATH_ESCAPE: {}",
            r.stdout
        );
    }
    if !written.is_empty() {
        if shares_host(h.target) {
            skip!("{HOST_USER} (observed: the program wrote {shown})");
        }
        fail!("the program wrote outside its workdir: {shown}");
    }
    still_works(&h).await
}

pub(crate) async fn symlink_escape(h: Arc<H>) -> Check {
    let sandbox = h.sandbox().await?;
    let workdir = PathBuf::from(&sandbox.info().host_dir);
    if h.target.lang() == Lang::Js {
        // A script cannot make a symlink; plant them as another program sharing the
        // workdir could have.
        for (link, to) in [
            ("rootlink", "/"),
            ("hostname", "/etc/hostname"),
            ("up", ".."),
        ] {
            std::os::unix::fs::symlink(to, workdir.join(link))
                .map_err(|e| Stop::Fail(format!("planting {link}: {e}")))?;
        }
        let r = sandbox
            .exec(h.program(
                "",
                "",
                "import { readFile, writeFile, listFiles } from 'sandbox:fs';\nconst tries = [() => readFile('hostname'), () => readFile('rootlink/etc/hostname'), () => listFiles('rootlink'), () => writeFile('up/escaped', 'x')];\nfor (const f of tries) { try { f(); console.log('allowed'); } catch (e) { console.log(e.code); } }",
            ))
            .await
            .map_err(|e| Stop::Fail(format!("exec: {e}")))?;
        ensure!(
            r.is_success()
                && r.stdout.lines().all(|l| l == "PATH_ESCAPE")
                && r.stdout.lines().count() == 4,
            "sandbox:fs must refuse every escape through a symlink with PATH_ESCAPE: {r:?}"
        );
    } else {
        let r = sandbox
            .exec(h.program(
                "ln -s / rootlink && ln -s /etc/hostname hostname && ln -s .. up && echo linked",
                "import os\nos.symlink('/', 'rootlink')\nos.symlink('/etc/hostname', 'hostname')\nos.symlink('..', 'up')\nprint('linked')",
                "",
            ))
            .await
            .map_err(|e| Stop::Fail(format!("exec: {e}")))?;
        ensure!(
            r.stdout.trim() == "linked",
            "the links were not made: {r:?}"
        );
    }
    let host_file = PathBuf::from(format!("/tmp/paddock-adversarial-{}", h.token));
    let escapes = [
        (
            "read_file(hostname)",
            sandbox.read_file("hostname").await.map(drop),
        ),
        (
            "read_file(rootlink/etc/hostname)",
            sandbox.read_file("rootlink/etc/hostname").await.map(drop),
        ),
        (
            "list_files(rootlink)",
            sandbox.list_files("rootlink").await.map(drop),
        ),
        (
            "write_file(rootlink/tmp/…)",
            sandbox
                .write_file(
                    &format!("rootlink/tmp/paddock-adversarial-{}", h.token),
                    b"x",
                )
                .await,
        ),
        (
            "write_file(up/…)",
            sandbox.write_file("up/escaped", b"x").await,
        ),
    ];
    let escaped_up = workdir.parent().map(|p| p.join("escaped"));
    let wrote_host = host_file.exists();
    let _ = std::fs::remove_file(&host_file);
    let wrote_up = escaped_up.as_ref().is_some_and(|p| p.exists());
    if let Some(p) = &escaped_up {
        let _ = std::fs::remove_file(p);
    }
    sandbox
        .destroy()
        .await
        .map_err(|e| Stop::Fail(format!("destroy: {e}")))?;
    for (what, result) in escapes {
        match result {
            Err(e) if e.code == ErrorCode::PathEscape => {}
            Err(e) => fail!("{what}: expected PATH_ESCAPE, got {e}"),
            Ok(()) => fail!("{what} followed a symlink out of the workdir"),
        }
    }
    ensure!(
        !wrote_host && !wrote_up,
        "a write through a symlink reached the host"
    );
    still_works(&h).await
}

pub(crate) async fn secrets_in_environment(h: Arc<H>) -> Check {
    let caller_secret = format!("caller-secret-{}", h.token);
    let mut request = h.program(
        "echo OWN; env; cat /proc/self/environ | tr '\\0' '\\n'; echo PROC; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\"; done 2>/dev/null; true",
        "import os, glob\nprint('OWN')\nfor k, v in os.environ.items():\n    print(f'{k}={v}')\nprint(open('/proc/self/environ').read().replace('\\0', '\\n'))\nprint('PROC')\nfor f in glob.glob('/proc/[0-9]*/environ'):\n    try:\n        print(open(f, errors='replace').read().replace('\\0', '\\n'))\n    except OSError:\n        pass",
        "console.log('OWN'); console.log(typeof std, typeof os, typeof Deno, typeof Bun); console.log('PROC');",
    );
    request.limits.max_output_bytes = Some(16 << 20);
    let js = h.target.lang() == Lang::Js;
    if !js {
        request
            .env
            .insert("CALLER_TOKEN".into(), caller_secret.clone());
    }
    let id = request.id.clone();
    // A host process started with the secrets in its environment, as a server
    // launched with credentials is (this process set them after it started, so its
    // own `/proc/self/environ` does not show them).
    let mut holder = Command::new("sleep")
        .arg("60")
        .envs(HOST_SECRETS.iter().copied())
        .spawn()
        .map_err(|e| Stop::Fail(format!("starting the secret holder: {e}")))?;
    let r = h.exec(request).await;
    let _ = holder.kill();
    let _ = holder.wait();
    let r = r?;
    ensure!(r.is_success(), "the probe failed: {r:?}");
    let (own, procs) = r
        .stdout
        .split_once("\nPROC\n")
        .ok_or_else(|| Stop::Fail(format!("no PROC marker: {}", clip(&r.stdout, 300))))?;
    for (name, value) in HOST_SECRETS {
        ensure!(
            !own.contains(value),
            "the host's {name} reached the program's environment"
        );
    }
    if js {
        ensure!(
            own.contains("undefined undefined undefined undefined"),
            "a script sees an environment API: {own}"
        );
    } else {
        ensure!(
            own.contains(&format!("CALLER_TOKEN={caller_secret}")),
            "the caller's own variable must reach the program"
        );
    }
    // The audit log holds a hash of the code, never the environment.
    let audit = h
        .paddock()
        .audit(&paddock_pool::Caller::Embedder, AuditQuery::default())
        .await
        .map_err(|e| Stop::Fail(format!("audit: {e}")))?;
    let entry = audit
        .iter()
        .find(|e| e.id == id)
        .ok_or_else(|| Stop::Fail("the probe has no audit entry".into()))?;
    let logged = serde_json::to_string(entry).unwrap_or_default();
    ensure!(
        !logged.contains(&caller_secret) && HOST_SECRETS.iter().all(|(_, v)| !logged.contains(v)),
        "a secret reached the audit log: {logged}"
    );
    let leaked: Vec<&str> = HOST_SECRETS
        .iter()
        .filter(|(_, v)| procs.contains(v))
        .map(|(n, _)| *n)
        .collect();
    if !leaked.is_empty() {
        if shares_host(h.target) {
            skip!("{HOST_USER}: through /proc/<pid>/environ of host processes it reads the host's secrets (observed: {leaked:?})");
        }
        fail!("the program read the host's secrets through /proc: {leaked:?}");
    }
    still_works(&h).await
}

/// A network namespace with a veth pair to the host, removed on drop.
struct TestNet {
    name: String,
    host_if: String,
}

impl TestNet {
    fn create(tag: u32) -> Result<TestNet, String> {
        let name = format!("padv{tag}");
        let host_if = format!("padv{tag}h");
        let peer = format!("padv{tag}n");
        let net = TestNet {
            name: name.clone(),
            host_if: host_if.clone(),
        };
        let ip = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        // Whatever a crashed earlier run left under these names goes first.
        drop(TestNet {
            name: name.clone(),
            host_if: host_if.clone(),
        });
        ip(&["netns", "add", &name])?;
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer,
        ])?;
        ip(&["link", "set", &peer, "netns", &name])?;
        ip(&["addr", "add", "10.203.9.1/30", "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&["-n", &name, "addr", "add", "10.203.9.2/30", "dev", &peer])?;
        ip(&["-n", &name, "link", "set", &peer, "up"])?;
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(net)
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A child process killed (and waited for) when dropped, however the case ends.
struct KillOnDrop(Child);

impl KillOnDrop {
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A listener inside the test namespace that prints `accepted` per connection.
fn veth_listener(
    net: &TestNet,
) -> Result<(KillOnDrop, BufReader<std::process::ChildStdout>), String> {
    let mut child = KillOnDrop(Command::new("ip")
        .args([
            "netns",
            "exec",
            &net.name,
            "python3",
            "-c",
            "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('10.203.9.2', 18432))\ns.listen(8)\nprint('ready', flush=True)\nwhile True:\n    c, _ = s.accept()\n    print('accepted', flush=True)\n    c.close()",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("the listener: {e}"))?);
    let mut out = BufReader::new(child.0.stdout.take().ok_or("no stdout")?);
    let mut line = String::new();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "ready" {
        return Err(format!("the listener said {line:?}"));
    }
    Ok((child, out))
}

/// A non-blocking listener on the host's loopback and its port, and, where a veth
/// namespace can be made, that namespace (drop it last) and a listener in it.
#[allow(clippy::type_complexity)]
fn outside_listeners(
    case: &str,
) -> Result<
    (
        std::net::TcpListener,
        u16,
        Result<TestNet, String>,
        Option<(KillOnDrop, BufReader<std::process::ChildStdout>)>,
    ),
    Stop,
> {
    let loopback = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Stop::Fail(format!("binding a loopback listener: {e}")))?;
    loopback
        .set_nonblocking(true)
        .map_err(|e| Stop::Fail(e.to_string()))?;
    let port = loopback
        .local_addr()
        .map_err(|e| Stop::Fail(e.to_string()))?
        .port();
    let net = TestNet::create(std::process::id() % 10_000);
    let veth = match &net {
        Ok(net) => Some(veth_listener(net).map_err(Stop::Fail)?),
        Err(why) => {
            println!("{case}: no veth namespace ({why}); loopback only");
            None
        }
    };
    Ok((loopback, port, net, veth))
}

const PROBE: &str = "import socket, sys\nfor host, port in [(sys.argv[1], int(sys.argv[2])), ('10.203.9.2', 18432)]:\n    try:\n        socket.create_connection((host, port), timeout=2).close()\n        print('reached', host)\n    except OSError as e:\n        print('refused', host, e.errno)";

pub(crate) async fn network_under_none(h: Arc<H>) -> Check {
    let (loopback, port, net, mut veth) = outside_listeners("network_under_none")?;
    if veth.is_some() {
        // The host reaches the veth listener: a refusal from inside means something.
        let from_host = Command::new("python3")
            .args(["-c", PROBE, "127.0.0.1", &port.to_string()])
            .output()
            .map_err(|e| Stop::Fail(format!("host probe: {e}")))?;
        let said = String::from_utf8_lossy(&from_host.stdout).into_owned();
        ensure!(
            said.contains("reached 127.0.0.1") && said.contains("reached 10.203.9.2"),
            "the host must reach both listeners: {said}"
        );
        let _ = loopback.accept();
    }
    let probe_sh = format!("exec python3 -c \"$1\" 127.0.0.1 {port}");
    let mut request = h.program(
        "",
        &format!("import sys\nsys.argv = ['probe', '127.0.0.1', '{port}']\n{PROBE}"),
        "console.log(typeof fetch, typeof XMLHttpRequest, typeof WebSocket);",
    );
    if h.target.lang() == Lang::Shell {
        request.program = paddock_core::Program::command(["sh", "-c", &probe_sh, "sh", PROBE]);
    }
    let r = h.exec(request).await?;
    ensure!(r.is_success(), "the probe failed: {r:?}");
    if h.target.lang() == Lang::Js {
        ensure!(
            r.stdout.trim() == "undefined undefined undefined",
            "a script sees a network API: {}",
            r.stdout
        );
        let blocked = h
            .exec(h.program(
                "",
                "",
                "import { connect } from 'net'; connect(18432, '10.203.9.2');",
            ))
            .await;
        match blocked {
            Ok(r) => ensure!(
                r.outcome.error_code() == Some(ErrorCode::BlockedModule),
                "importing `net` must fail with BLOCKED_MODULE: {r:?}"
            ),
            Err(Stop::Fail(m)) if m.contains("BLOCKED_MODULE") => {}
            Err(e) => return Err(e),
        }
    } else {
        ensure!(
            !r.stdout.contains("reached"),
            "a program under policy `none` reached a listener: {}",
            r.stdout
        );
        ensure!(
            r.stdout
                .lines()
                .filter(|l| l.starts_with("refused"))
                .count()
                == 2,
            "the probe did not try both listeners: {}",
            r.stdout
        );
    }
    // Neither listener saw a connection from the sandbox.
    ensure!(
        loopback.accept().is_err(),
        "the loopback listener accepted a connection from the sandbox"
    );
    if let Some((mut child, out)) = veth.take() {
        child.stop();
        let accepted = out
            .lines()
            .map_while(Result::ok)
            .filter(|l| l == "accepted")
            .count();
        ensure!(
            accepted == 1,
            "the veth listener accepted {accepted} connections; only the host's own probe was expected"
        );
    }
    drop(net);
    still_works(&h).await
}

/// Tries the host's loopback listener, the veth listener and the cloud metadata
/// address; then, where the program may (root in its namespace), flushes the
/// namespace's firewall and tries them all again.
const ALLOWLIST_PROBE: &str = "import socket, subprocess, sys
targets = [(sys.argv[1], int(sys.argv[2])), ('10.203.9.2', 18432), ('169.254.169.254', 80)]
def probe(tag):
    for host, port in targets:
        # A connection the gateway takes in is refused (reset) once it has looked:
        # reaching a target means the target's own answer (its data, or its close).
        try:
            c = socket.create_connection((host, port), timeout=2)
            c.sendall(b'x')
            c.recv(1)
            print('reached', tag, host)
        except OSError as e:
            print('refused', tag, host, e.errno)
probe('ruled')
try:
    flushed = subprocess.run(['nft', 'flush', 'ruleset'], capture_output=True).returncode == 0
except OSError:
    flushed = False
print('flushed', flushed)
if flushed:
    probe('unruled')";

pub(crate) async fn network_under_allowlist(h: Arc<H>) -> Check {
    if h.target.lang() == Lang::Js {
        skip!("a script in an isolate has no network API at all (network_under_none checks that)");
    }
    let spec = paddock_core::SandboxSpec {
        network: paddock_core::NetworkPolicy::Allowlist {
            hosts: vec!["allowed.invalid".into()],
            ports: vec![],
        },
        ..paddock_core::SandboxSpec::default()
    };
    let sandbox = match h
        .paddock()
        .open_sandbox(spec, Some(h.target.engine()))
        .await
    {
        Ok(s) => s,
        Err(e) if e.code == ErrorCode::CapabilityNotSupported => {
            skip!("the engine does not enforce allowlists here: {e}")
        }
        Err(e) => fail!("open_sandbox with an allowlist: {e}"),
    };
    let (loopback, port, net, mut veth) = outside_listeners("network_under_allowlist")?;
    let mut request = h.program(
        "",
        &format!("import sys\nsys.argv = ['probe', '127.0.0.1', '{port}']\n{ALLOWLIST_PROBE}"),
        "",
    );
    if h.target.lang() == Lang::Shell {
        request.program = paddock_core::Program::command([
            "python3",
            "-c",
            ALLOWLIST_PROBE,
            "127.0.0.1",
            &port.to_string(),
        ]);
    }
    let r = sandbox
        .exec(request)
        .await
        .map_err(|e| Stop::Fail(format!("the probe: {e}")))?;
    let _ = sandbox.destroy().await;
    ensure!(r.is_success(), "the probe failed: {r:?}");
    ensure!(
        !r.stdout.contains("reached"),
        "a program under an allowlist reached what it does not name: {}",
        r.stdout
    );
    let tried = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("refused"))
        .count();
    let flushed = r.stdout.contains("flushed True");
    ensure!(
        tried == if flushed { 6 } else { 3 },
        "the probe did not try every target: {}",
        r.stdout
    );
    let egress = r
        .egress
        .as_ref()
        .ok_or_else(|| Stop::Fail(format!("the result lists no egress: {r:?}")))?;
    ensure!(
        egress.allowed == 0,
        "the gateway admitted a connection: {egress:?}"
    );
    ensure!(
        loopback.accept().is_err(),
        "the loopback listener accepted a connection from the sandbox"
    );
    if let Some((mut child, out)) = veth.take() {
        child.stop();
        let accepted = out
            .lines()
            .map_while(Result::ok)
            .filter(|l| l == "accepted")
            .count();
        ensure!(
            accepted == 0,
            "the veth listener accepted {accepted} connections from the sandbox"
        );
    }
    drop(net);
    still_works(&h).await
}

/// An allowlist that names the host itself: its loopback and metadata addresses, in
/// the spellings a resolver library reads as addresses, and the ranges that hold
/// them. Each is refused before any sandbox is made, naming the entry; no engine is
/// asked (what `unrestricted` never reaches, no allowlist reaches).
pub(crate) async fn allowlist_naming_the_host(h: Arc<H>) -> Check {
    for entry in [
        "127.0.0.1",
        "2130706433",
        "0x7f.0.0.1",
        "127.1",
        "[::1]",
        "::ffff:127.0.0.1",
        "169.254.169.254",
        "0.0.0.0/0",
        "::/0",
    ] {
        let spec = paddock_core::SandboxSpec {
            network: paddock_core::NetworkPolicy::Allowlist {
                hosts: vec!["allowed.invalid".into(), entry.into()],
                ports: vec![80],
            },
            ..paddock_core::SandboxSpec::default()
        };
        match h
            .paddock()
            .open_sandbox(spec, Some(h.target.engine()))
            .await
        {
            Ok(sb) => {
                let _ = sb.destroy().await;
                fail!("an allowlist naming `{entry}` was accepted")
            }
            Err(e) => ensure!(
                e.code == ErrorCode::InvalidOptions && e.message.contains("hosts[1]"),
                "`{entry}`: {e}"
            ),
        }
    }
    still_works(&h).await
}

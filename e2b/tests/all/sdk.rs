//! The E2B-compatible API through E2B's own SDKs: the Python script
//! (`tests/sdk/sdk.py`) and the JavaScript one (`tests/sdk/sdk.mjs`), against a
//! whole node ([`paddock::node::Node`], what `paddock serve` runs) in this process,
//! on the subprocess and container engines.
//!
//! The SDKs come from `paddock-testkit`: the Python ones (`e2b` and
//! `e2b-code-interpreter`, pinned) from the interpreter `PADDOCK_E2B_PYTHON` names,
//! else from the venv `target/e2b-venv` it makes on first use; the JavaScript one
//! (`e2b` from npm, pinned) from the directory `PADDOCK_E2B_JS` names, else from
//! `target/e2b-js`, and `sdk.mjs` runs through it with node. A test that cannot have
//! them fails, unless `PADDOCK_SKIP` lists `e2b` (it then says so).

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use paddock::node::Node;
use paddock::PaddockConfig;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef00";

/// Every check of the JavaScript script; each must report `ok NAME`.
const JS_CHECKS: &[&str] = &[
    "snippet",
    "commands",
    "files",
    "pty",
    "watch",
    "lifecycle",
    "tenants",
    "ports",
];

/// Every check of the Python script; each must report `ok NAME`.
const CHECKS: &[&str] = &[
    "the_issue_snippet",
    "commands",
    "files",
    "metadata",
    "metrics",
    "pty",
    "lifecycle",
    "bad_input",
    "tenants",
    "code_interpreter",
    "ports",
    "watch",
    "network",
];

fn has_oci_runtime() -> bool {
    let found = ["crun", "runc"].iter().any(|r| {
        Command::new("sh")
            .args(["-c", &format!("command -v {r}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !found && std::env::var_os("PADDOCK_REQUIRE_CONTAINERS").is_some() {
        panic!("PADDOCK_REQUIRE_CONTAINERS is set but neither crun nor runc is installed");
    }
    found
}

/// The marker file's text in the tiny root.
const TINY_MARKER: &str = "the tiny template's own root";

/// A root filesystem of its own for the `tiny` template: a few host programs and the
/// shared libraries they (and `paddock-agent`, which warm containers run) load, as
/// `ldd` lists them, under the merged-`/usr` layout, with `/etc/paddock-root` holding
/// [`TINY_MARKER`]. No python3: the test tells the roots apart by it.
fn tiny_rootfs(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let root = dir.join("tiny-rootfs");
    for d in ["usr/bin", "usr/lib", "usr/lib64", "etc"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/bin"),
    ] {
        std::os::unix::fs::symlink(target, root.join(link)).unwrap();
    }
    std::fs::write(root.join("etc/paddock-root"), format!("{TINY_MARKER}\n")).unwrap();
    // Where a host path goes in the root: `/bin/x` and `/usr/bin/x` both at
    // `usr/bin/x` (the links above make both paths work inside).
    let inside = |p: &str| -> std::path::PathBuf {
        let p = p.trim_start_matches('/');
        let p = p.strip_prefix("usr/").unwrap_or(p);
        root.join("usr")
            .join(if let Some(rest) = p.strip_prefix("sbin/") {
                format!("bin/{rest}")
            } else {
                p.to_string()
            })
    };
    // (The warm containers' agent is the static one built into the engines: it
    // loads no library.)
    let mut libs = std::collections::BTreeSet::new();
    let mut elves = Vec::new();
    for prog in [
        "bash", "sh", "cat", "echo", "ls", "sleep", "env", "mkdir", "mv", "rm", "find", "kill",
    ] {
        // The program file (not a shell's builtin of the name).
        let path = std::env::var("PATH")
            .unwrap_or_default()
            .split(':')
            .map(|d| format!("{d}/{prog}"))
            .find(|p| p.starts_with('/') && std::path::Path::new(p).is_file())
            .unwrap_or_else(|| panic!("`{prog}` is not on this host's PATH"));
        std::fs::copy(&path, inside(&format!("/usr/bin/{prog}"))).unwrap();
        elves.push(path);
    }
    for elf in &elves {
        let out = Command::new("ldd").arg(elf).output().expect("ldd runs");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or
            // `/lib64/ld-linux-x86-64.so.2 (0x…)`.
            let path = line.split("=>").last().unwrap().split_whitespace().next();
            if let Some(p) = path.filter(|p| p.starts_with('/')) {
                libs.insert(p.to_string());
            }
        }
    }
    for lib in libs {
        let to = inside(&lib);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&lib, &to).unwrap();
    }
    // The containers' root is an unprivileged host user: it must pass through.
    for d in [dir, root.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    root
}

/// Runs the SDK scripts against a server whose templates use `engine`, with
/// `extra` added to its `[server]` section; `only` runs just those checks of the
/// Python script (and not the JavaScript one). With `tiny`, the config also has an
/// engine `tiny` with a root of its own and a template `tiny` on it, and the Python
/// script checks it (`template_rootfs`).
async fn run_sdk(engine: &str, extra: &str, only: &[&str], tiny: bool) {
    run(engine, extra, only, tiny, false).await;
}

/// A CA and a certificate for `e2b.test` and `*.e2b.test` it signed, written to
/// `dir`: (the CA's PEM, the certificate's, its key's).
fn domain_certificate(dir: &std::path::Path) -> [std::path::PathBuf; 3] {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Paddock test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let names = vec!["e2b.test".to_string(), "*.e2b.test".to_string()];
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let paths = ["ca.pem", "cert.pem", "key.pem"].map(|n| dir.join(n));
    std::fs::write(&paths[0], ca.pem()).unwrap();
    std::fs::write(&paths[1], cert.pem()).unwrap();
    std::fs::write(&paths[2], key.serialize_pem()).unwrap();
    paths
}

/// [`run_sdk`]; with `domain`, the server also listens with TLS (`[server.tls]`, a
/// certificate for `*.e2b.test` from a CA made for the run), and the Python script
/// runs only its `domain_mode` check, with `E2B_DOMAIN=e2b.test` and neither
/// `E2B_API_URL` nor `E2B_SANDBOX_URL`: every call goes to `https://` names.
async fn run(engine: &str, extra: &str, only: &[&str], tiny: bool, domain: bool) {
    let Some(python) = paddock_testkit::e2b_python() else {
        return;
    };
    // The directory the JavaScript SDK is installed in (its `node_modules/e2b`).
    let js_sdk = if only.is_empty() && !domain {
        paddock_testkit::e2b_js()
    } else {
        None
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = domain.then(|| domain_certificate(dir.path()));
    let tls_section = match &certs {
        Some([_, cert, key]) => format!(
            "[server.tls]\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            key.display()
        ),
        None => String::new(),
    };
    let tiny_sections = if tiny {
        format!(
            "[engines.tiny]\nkind = \"container\"\nrootfs = \"{}\"\n[templates.tiny]\nengine = \"tiny\"\n",
            tiny_rootfs(dir.path()).display()
        )
    } else {
        String::new()
    };
    let toml = format!(
        r#"
[server]
allowed_levels = ["none", "context-isolated", "strict"]
allowed_networks = ["none", "allowlist", "unrestricted"]
{extra}
[[server.api_keys]]
key = "{ALICE}"
tenant = "alice"
[[server.api_keys]]
key = "{BOB}"
tenant = "bob"
[[policy.custom_rules]]
name = "no-marker"
pattern = "PADDOCK_POLICY_MARKER"
language = "python"
action = "block"
message = "the marker is not allowed here"
[e2b]
enabled = true
domain = "e2b.test"
[templates.base]
engine = "{engine}"
[templates.code-interpreter-v1]
engine = "{engine}"
code_interpreter = true
warm_pool = 2
[templates.open]
engine = "{engine}"
network = "unrestricted"
{tiny_sections}{tls_section}"#
    );
    let mut config = PaddockConfig::from_toml_str(&toml).expect("the test's config");
    config.server.listen = "127.0.0.1:0".into();
    let node = Node::start(config).await.expect("the node starts");
    let url = format!("http://{}", node.local_addr());
    // The TLS listener's.
    let tls_url = domain.then(|| {
        let at = node.server().tls_addr().expect("the TLS listener");
        format!("https://{at}")
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/sdk.py");
    let mut sdk = Command::new(&python);
    if tiny {
        sdk.env("PADDOCK_TINY_MARKER", TINY_MARKER);
    }
    match (&tls_url, &certs) {
        (Some(tls), Some([ca, _, _])) => {
            let port = tls.rsplit(':').next().unwrap();
            sdk.env("E2B_DOMAIN", "e2b.test")
                .env("SSL_CERT_FILE", ca)
                .env("PADDOCK_TLS_PORT", port)
                .env_remove("E2B_API_URL")
                .env_remove("E2B_SANDBOX_URL");
        }
        _ => {
            sdk.env("E2B_API_URL", &url).env("E2B_SANDBOX_URL", &url);
        }
    }
    sdk.arg(script)
        .args(only)
        .env("E2B_API_KEY", ALICE)
        .env("ALICE_KEY", ALICE)
        .env("BOB_KEY", BOB)
        .env("PADDOCK_ENGINE", engine);
    let out = output(sdk).await;
    let js = match js_sdk {
        Some(dir) => {
            let mut js = Command::new("node");
            js.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/sdk.mjs"))
                .arg(dir)
                .env("E2B_API_URL", &url)
                .env("E2B_SANDBOX_URL", &url)
                .env("E2B_API_KEY", ALICE)
                .env("ALICE_KEY", ALICE)
                .env("BOB_KEY", BOB)
                .env("PADDOCK_ENGINE", engine);
            Some(output(js).await)
        }
        None => None,
    };
    node.stop(Duration::from_secs(5))
        .await
        .expect("the node stops");
    let mut python_checks = if only.is_empty() {
        CHECKS.to_vec()
    } else {
        only.to_vec()
    };
    if tiny && only.is_empty() {
        python_checks.push("template_rootfs");
    }
    for (sdk, out, checks) in [
        ("Python", Some(out), &python_checks[..]),
        ("JavaScript", js, JS_CHECKS),
    ] {
        let Some(out) = out else {
            continue;
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let passed: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("ok "))
            .collect();
        assert!(
            out.status.success() && checks.iter().all(|c| passed.contains(c)),
            "the {sdk} SDK's checks on {engine}: passed {passed:?} of {checks:?}\n{stdout}\n{stderr}"
        );
    }
}

/// Runs `command` to its end off the test's runtime (the node's servers run on it).
async fn output(mut command: Command) -> Output {
    command.stdin(Stdio::null());
    tokio::task::spawn_blocking(move || command.output().expect("the SDK's runtime runs"))
        .await
        .expect("the SDK's run")
}

/// `E2B_DOMAIN` set, and nothing else: the SDK reaches `https://api.e2b.test` and
/// `https://{port}-{id}.e2b.test`, which the server's TLS listener serves (the
/// script's own CONNECT proxy stands in for the DNS that would point those names
/// at the host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_runs_in_the_domain_mode_over_tls() {
    run("subprocess", "", &["domain_mode"], false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_runs_unchanged_on_the_subprocess_engine() {
    run_sdk("subprocess", "", &[], false).await;
}

/// `server.max_requests_per_tenant` holds for E2B's requests: streams held open
/// count, another tenant goes on, a place comes back when a stream ends; and a
/// sandbox's ports take `server.max_websockets_per_tenant` WebSockets at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_requests_count_against_the_tenants_cap() {
    run_sdk(
        "subprocess",
        "max_requests_per_tenant = 3\nmax_websockets_per_tenant = 1",
        &["caps", "ws_caps"],
        false,
    )
    .await;
}

/// With a template on an engine of its own (`[engines.tiny]`, a root filesystem of
/// its own) beside the built-in ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_runs_unchanged_on_the_container_engine() {
    if !has_oci_runtime() {
        eprintln!("skipped: no OCI runtime");
        return;
    }
    run_sdk("container", "", &[], true).await;
}

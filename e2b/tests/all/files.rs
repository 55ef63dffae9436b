//! The filesystem service (`filesystem.Filesystem`) on the sandbox's own file
//! operations: no execution, so no limiter permit and no audit entry, for the
//! unary calls and for a watcher that waits, while a change still arrives as an
//! event (polled and streamed).

use std::time::Duration;

use http_body_util::BodyExt;
use paddock_e2b::TemplateConfig;
use paddock_pool::Caller;
use serde_json::{json, Value};

use crate::live::{envelope, open, send, Answer, E2bServer, Req, ALICE};

/// A call of the filesystem service of sandbox `id`.
fn fs(id: &str, token: &str, method: &str, body: Value) -> Req {
    Req::new("POST", &format!("/filesystem.Filesystem/{method}"))
        .json(&body)
        .at_port(id, "49983")
        .header("x-access-token", token)
}

/// Uploads `data` to `path` through the agent's `POST /files`.
async fn upload(t: &E2bServer, id: &str, token: &str, path: &str, data: &str) {
    let body = format!(
        "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\n{data}\r\n--B--\r\n"
    );
    let r = send(
        t.addr,
        Req::new("POST", &format!("/files?path={path}"))
            .body("multipart/form-data; boundary=B", body.into_bytes())
            .at_port(id, "49983")
            .header("x-access-token", token),
    )
    .await;
    assert_eq!(r.status, 200, "upload {path}: {}", r.text());
}

/// What would show an execution: audit entries recorded, limiter admissions, and
/// permits alive.
async fn executions(t: &E2bServer) -> (u64, u64, usize) {
    let audit = t.paddock.audit_statistics(&Caller::Embedder).await.unwrap();
    let limiter = t.paddock.limiter_stats(&Caller::Embedder).await.unwrap();
    (audit.total, limiter.admitted, limiter.in_flight)
}

fn code(a: &Answer) -> String {
    a.json()["code"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filesystem_service_runs_no_execution_and_a_waiting_watcher_costs_none() {
    let t = E2bServer::start(256, &[("base", TemplateConfig::default())]);
    let created = t.create(ALICE, "base", json!({})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    // Settle what creating the sandbox did, then take the baseline.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = executions(&t).await;

    // The unary calls.
    let r = send(
        t.addr,
        fs(&id, &token, "MakeDir", json!({"path": "/home/user/w/sub"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["entry"]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(r.json()["entry"]["path"], "/home/user/w/sub");
    let r = send(t.addr, fs(&id, &token, "MakeDir", json!({"path": "w/sub"}))).await;
    assert_eq!(
        (r.status, code(&r)),
        (409, "already_exists".into()),
        "{}",
        r.text()
    );
    upload(&t, &id, &token, "/home/user/w/a.txt", "hello").await;
    let r = send(
        t.addr,
        fs(&id, &token, "Stat", json!({"path": "/home/user/w/a.txt"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let entry = &r.json()["entry"];
    assert_eq!(
        (entry["name"].as_str(), entry["size"].as_str()),
        (Some("a.txt"), Some("5"))
    );
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    let permissions = entry["permissions"].as_str().unwrap_or_default();
    assert!(
        permissions.len() == 10 && permissions.starts_with("-rw"),
        "{entry}"
    );
    let r = send(
        t.addr,
        fs(
            &id,
            &token,
            "ListDir",
            json!({"path": "/home/user", "depth": 2}),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let paths: Vec<String> = r.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    assert!(
        paths.contains(&"/home/user/w/a.txt".to_string()),
        "{paths:?}"
    );
    assert!(paths.contains(&"/home/user/w/sub".to_string()), "{paths:?}");
    let r = send(
        t.addr,
        fs(
            &id,
            &token,
            "Move",
            json!({"source": "/home/user/w/a.txt", "destination": "/home/user/w/sub/b.txt"}),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["entry"]["path"], "/home/user/w/sub/b.txt");
    let r = send(
        t.addr,
        fs(&id, &token, "Remove", json!({"path": "/home/user/w/sub"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        t.addr,
        fs(&id, &token, "Stat", json!({"path": "/home/user/w/sub"})),
    )
    .await;
    assert_eq!(
        (r.status, code(&r)),
        (404, "not_found".into()),
        "{}",
        r.text()
    );
    let r = send(
        t.addr,
        fs(&id, &token, "Remove", json!({"path": "/home/user/nope"})),
    )
    .await;
    // As E2B's agent: a path that is not there is already removed.
    assert_eq!((r.status, r.json()), (200, json!({})), "{}", r.text());
    // Outside the home: what the sandbox's programs see, stat only.
    let r = send(t.addr, fs(&id, &token, "Stat", json!({"path": "/bin/sh"}))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for (method, body) in [
        ("ListDir", json!({"path": "/etc"})),
        ("MakeDir", json!({"path": "/etc/x"})),
        ("Remove", json!({"path": "/etc/hostname"})),
        (
            "Move",
            json!({"source": "/home/user/w", "destination": "/etc/w"}),
        ),
        ("Stat", json!({"path": "/home/user/../../etc/passwd"})),
    ] {
        let r = send(t.addr, fs(&id, &token, method, body.clone())).await;
        assert_eq!(
            (r.status, code(&r)),
            (400, "invalid_argument".into()),
            "{method} {body}: {}",
            r.text()
        );
        assert!(
            r.text().contains("PATH_ESCAPE"),
            "{method} {body}: {}",
            r.text()
        );
    }
    assert_eq!(
        executions(&t).await,
        before,
        "the filesystem calls ran no execution"
    );

    // A polled watcher and a streamed one, over a few seconds without a change.
    let r = send(
        t.addr,
        fs(
            &id,
            &token,
            "CreateWatcher",
            json!({"path": "/home/user/w", "recursive": true}),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let watcher = r.json()["watcherId"].as_str().unwrap().to_string();
    let stream = open(
        t.addr,
        Req::new("POST", "/filesystem.Filesystem/WatchDir")
            .body(
                "application/connect+json",
                envelope(&json!({"path": "/home/user/w", "recursive": true})),
            )
            .at_port(&id, "49983")
            .header("x-access-token", &token),
    )
    .await;
    assert_eq!(stream.status(), 200);
    let (tx, mut frames) = tokio::sync::mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        let mut body = stream.into_body();
        let mut buf = Vec::<u8>::new();
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                buf.extend_from_slice(&data);
            }
            while buf.len() >= 5 {
                let n = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
                if buf.len() < 5 + n {
                    break;
                }
                let v: Value = serde_json::from_slice(&buf[5..5 + n]).unwrap_or(Value::Null);
                buf.drain(..5 + n);
                let _ = tx.send(v);
            }
        }
    });
    let first = tokio::time::timeout(Duration::from_secs(5), frames.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(first.get("start").is_some(), "{first}");
    // A minute of no change, the polled watcher asked every 5 s as a client would:
    // no event, and not one permit or audit entry at any point.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let r = send(
            t.addr,
            fs(
                &id,
                &token,
                "GetWatcherEvents",
                json!({"watcherId": watcher}),
            ),
        )
        .await;
        assert_eq!(r.json()["events"], json!([]), "nothing changed");
        assert_eq!(
            executions(&t).await,
            before,
            "waiting watchers took no limiter permit and wrote no audit entry"
        );
    }

    // A change arrives, in both.
    upload(&t, &id, &token, "/home/user/w/new.txt", "new").await;
    let r = send(
        t.addr,
        fs(
            &id,
            &token,
            "GetWatcherEvents",
            json!({"watcherId": watcher}),
        ),
    )
    .await;
    let seen: Vec<(String, String)> = r.json()["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().into(),
                e["type"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(
        seen.contains(&("new.txt".into(), "EVENT_TYPE_CREATE".into())),
        "{seen:?}"
    );
    let streamed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let v = frames.recv().await.expect("the stream goes on");
            if v["filesystem"]["name"] == "new.txt" {
                return v;
            }
        }
    })
    .await
    .expect("the change streamed within 5 s");
    assert_eq!(streamed["filesystem"]["type"], "EVENT_TYPE_CREATE");
    let r = send(
        t.addr,
        fs(&id, &token, "RemoveWatcher", json!({"watcherId": watcher})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        executions(&t).await,
        before,
        "uploads and events ran nothing either"
    );
    t.stop().await;
}

/// Runs `script` with `sh` in sandbox `id` through the native API and waits (up to
/// 20 s) for it to end with 0.
async fn run(t: &E2bServer, id: &str, script: &str) {
    let r = send(
        t.addr,
        Req::new("POST", &format!("/v1/sandboxes/{id}/processes"))
            .header("authorization", &format!("Bearer {ALICE}"))
            .json(&json!({"argv": ["sh", "-c", script]})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let process = r.json()["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = send(
            t.addr,
            Req::new("GET", &format!("/v1/sandboxes/{id}/processes/{process}"))
                .header("authorization", &format!("Bearer {ALICE}")),
        )
        .await;
        let exit = &r.json()["exit"];
        if !exit.is_null() {
            assert_eq!(exit["exit_code"], 0, "{script}: {exit}");
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{script} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// As E2B's agent: a listing comes in the order of its paths, and a symlink is
/// reported with the kind of what it resolves to and that absolute path (one that
/// resolves to nothing stays a symlink with its target as written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_are_ordered_and_symlinks_resolve() {
    let t = E2bServer::start(256, &[("base", TemplateConfig::default())]);
    let created = t.create(ALICE, "base", json!({})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    run(
        &t,
        &id,
        "mkdir links && cd links && for f in zeta alpha mid; do echo $f > $f.txt; done \
         && ln -s alpha.txt l && ln -s l ll && ln -s ../links d && ln -s nowhere dangling",
    )
    .await;
    let r = send(
        t.addr,
        fs(&id, &token, "ListDir", json!({"path": "/home/user/links"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen: Vec<(String, String, Value)> = r.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["type"].as_str().unwrap().to_string(),
                e.get("symlinkTarget").cloned().unwrap_or(Value::Null),
            )
        })
        .collect();
    let file = "FILE_TYPE_FILE".to_string();
    assert_eq!(
        seen,
        [
            ("alpha.txt".into(), file.clone(), Value::Null),
            (
                "d".into(),
                "FILE_TYPE_DIRECTORY".into(),
                json!("/home/user/links")
            ),
            (
                "dangling".into(),
                "FILE_TYPE_SYMLINK".into(),
                json!("nowhere")
            ),
            (
                "l".into(),
                file.clone(),
                json!("/home/user/links/alpha.txt")
            ),
            (
                "ll".into(),
                file.clone(),
                json!("/home/user/links/alpha.txt")
            ),
            ("mid.txt".into(), file.clone(), Value::Null),
            ("zeta.txt".into(), file.clone(), Value::Null),
        ]
    );
    let r = send(
        t.addr,
        fs(&id, &token, "Stat", json!({"path": "/home/user/links/l"})),
    )
    .await;
    let entry = &r.json()["entry"];
    assert_eq!(
        (&entry["type"], &entry["symlinkTarget"], &entry["path"]),
        (
            &json!("FILE_TYPE_FILE"),
            &json!("/home/user/links/alpha.txt"),
            &json!("/home/user/links/l")
        ),
        "{entry}"
    );
    t.stop().await;
}

/// A refused upload is answered after its body is read: a client that sends its
/// whole body before it reads (as Python's HTTP clients do) gets the 400, not a
/// connection reset while it was still sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upload_is_answered_not_cut() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = E2bServer::start(256, &[("base", TemplateConfig::default())]);
    let created = t.create(ALICE, "base", json!({})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let data = "x".repeat(4 << 20);
    for (path, ctype) in [
        ("/etc/refused.txt", "multipart/form-data; boundary=B"),
        ("/home/user/ok.txt", "text/plain"),
    ] {
        let body = format!(
            "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\n{data}\r\n--B--\r\n"
        );
        let head = format!(
            "POST /files?path={path} HTTP/1.1\r\nHost: {}\r\nE2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: {token}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            t.addr,
            body.len()
        );
        let mut conn = tokio::net::TcpStream::connect(t.addr).await.unwrap();
        conn.write_all(head.as_bytes()).await.unwrap();
        conn.write_all(body.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{path} {ctype}: the body was cut off: {e}"));
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(30), conn.read_to_string(&mut answer))
            .await
            .expect("an answer within 30 s")
            .unwrap_or_else(|e| panic!("{path} {ctype}: {e}"));
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{path} {ctype}: {answer}"
        );
        assert!(answer.contains("\"code\":400"), "{answer}");
    }
    t.stop().await;
}

/// E2B's signed file URL for `path` (`download_url`, `upload_url`): the query the
/// SDK builds, signed with the sandbox's access token.
fn signed_query(token: &str, path: &str, operation: &str, expiration: Option<i64>) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let mut raw = format!("{path}:{operation}:user:{token}");
    if let Some(e) = expiration {
        raw.push_str(&format!(":{e}"));
    }
    let signature = format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD
            .encode(sha2::Sha256::digest(raw.as_bytes()))
    );
    let mut q: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("path", path)
        .append_pair("username", "user")
        .append_pair("signature", &signature)
        .finish();
    if let Some(e) = expiration {
        q.push_str(&format!("&signature_expiration={e}"));
    }
    q
}

/// Signed file URLs stand for the access token, for their own path, operation and
/// sandbox only, until they expire; one that names no sandbox (the URL mode) finds
/// the sandbox whose token signed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_urls_open_one_file_of_one_sandbox() {
    let t = E2bServer::start(256, &[("base", TemplateConfig::default())]);
    let created = t.create(ALICE, "base", json!({})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let theirs = t.create(crate::live::BOB, "base", json!({})).await;
    let their_token = theirs["envdAccessToken"].as_str().unwrap().to_string();
    upload(&t, &id, &token, "/home/user/signed.txt", "signed content").await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let get = |q: String| Req::new("GET", &format!("/files?{q}"));

    // By the sandbox's headers, and with no address at all; with and without expiry.
    for expiration in [None, Some(now + 120)] {
        let q = signed_query(&token, "signed.txt", "read", expiration);
        let r = send(t.addr, get(q.clone()).at_port(&id, "49983")).await;
        assert_eq!((r.status, r.text().as_str()), (200, "signed content"));
        let r = send(t.addr, get(q)).await;
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "signed content"),
            "the URL mode"
        );
    }
    // Expired: E2B's 401.
    let q = signed_query(&token, "signed.txt", "read", Some(now - 120));
    for req in [get(q.clone()).at_port(&id, "49983"), get(q)] {
        let r = send(t.addr, req).await;
        assert_eq!(r.status, 401, "{}", r.text());
        assert_eq!(
            r.json(),
            json!({"code": 401, "message": "signature is already expired"})
        );
    }
    // Refused as a sandbox that is not there: another path, a write's signature on a
    // read, another sandbox's token, a signature edited.
    let mut tampered = signed_query(&token, "signed.txt", "read", None);
    tampered.insert(
        tampered.find("signature=").unwrap() + "signature=v1_".len(),
        'A',
    );
    for (what, q) in [
        (
            "another path",
            signed_query(&token, "signed.txt", "read", None).replace("signed.txt", "other.txt"),
        ),
        (
            "a write's",
            signed_query(&token, "signed.txt", "write", None),
        ),
        (
            "another sandbox's token",
            signed_query(&their_token, "signed.txt", "read", None),
        ),
        ("tampered", tampered),
    ] {
        let r = send(t.addr, get(q.clone()).at_port(&id, "49983")).await;
        assert_eq!(r.status, 502, "{what}: {}", r.text());
        assert!(!r.text().contains("signed content"), "{what}");
        let r = send(t.addr, get(q)).await;
        assert!(
            !r.text().contains("signed content"),
            "{what}, the URL mode: {}",
            r.text()
        );
        assert_ne!(r.status, 200, "{what}, the URL mode");
    }
    // An upload URL writes its own path, in the URL mode too.
    let body = "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\nwritten by URL\r\n--B--\r\n";
    let r = send(
        t.addr,
        Req::new(
            "POST",
            &format!(
                "/files?{}",
                signed_query(&token, "up.txt", "write", Some(now + 60))
            ),
        )
        .body("multipart/form-data; boundary=B", body.as_bytes().to_vec()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        t.addr,
        Req::new("GET", "/files?path=up.txt")
            .at_port(&id, "49983")
            .header("x-access-token", &token),
    )
    .await;
    assert_eq!((r.status, r.text().as_str()), (200, "written by URL"));
    t.stop().await;
}

/// Octet-stream uploads (envd 0.5.7): the body is the file at `path`, gzip-encoded
/// when `Content-Encoding: gzip` says so; a gzip stream cut short writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn octet_stream_and_gzip_uploads_write_their_path() {
    use std::io::Write as _;
    let t = E2bServer::start(256, &[("base", TemplateConfig::default())]);
    let created = t.create(ALICE, "base", json!({})).await;
    assert_eq!(created["envdVersion"], "0.6.4");
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let post = |path: &str, body: Vec<u8>, encoding: Option<&str>| {
        let mut r = Req::new("POST", &format!("/files?path={path}"))
            .body("application/octet-stream", body)
            .at_port(&id, "49983")
            .header("x-access-token", &token);
        if let Some(e) = encoding {
            r = r.header("content-encoding", e);
        }
        r
    };
    let read = |path: &str| {
        Req::new("GET", &format!("/files?path={path}"))
            .at_port(&id, "49983")
            .header("x-access-token", &token)
    };
    let content: Vec<u8> = (0..200_000u32)
        .flat_map(|i| (i % 251).to_le_bytes())
        .collect();
    let r = send(t.addr, post("raw.bin", content.clone(), None)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!([{"name": "raw.bin", "type": "file", "path": "/home/user/raw.bin"}])
    );
    assert_eq!(send(t.addr, read("raw.bin")).await.body, content);

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&content).unwrap();
    let gz = gz.finish().unwrap();
    assert!(gz.len() < content.len());
    let r = send(t.addr, post("unzipped.bin", gz.clone(), Some("gzip"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(send(t.addr, read("unzipped.bin")).await.body, content);

    // Cut short: refused, and no file.
    let r = send(
        t.addr,
        post("cut.bin", gz[..gz.len() / 2].to_vec(), Some("gzip")),
    )
    .await;
    assert!(r.status >= 400, "{} {}", r.status, r.text());
    assert_eq!(send(t.addr, read("cut.bin")).await.status, 404);
    // Another encoding, and no path: refused with what to do.
    let r = send(t.addr, post("x.bin", b"x".to_vec(), Some("br"))).await;
    assert_eq!(r.status, 415, "{}", r.text());
    let r = send(
        t.addr,
        Req::new("POST", "/files")
            .body("application/octet-stream", b"x".to_vec())
            .at_port(&id, "49983")
            .header("x-access-token", &token),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("path"), "{}", r.text());
    t.stop().await;
}

/// File metadata (envd 0.6.2) as the server checks it, whatever the client: the
/// `X-Metadata-*` headers of an upload (the first of a repeated key), refused
/// before a byte is written when a key or value is not printable ASCII or the
/// whole is over 4,096 bytes; `Stat` and `ListDir` give it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_metadata_is_checked_by_the_server_and_read_back() {
    let t = E2bServer::start(256, &[("base", TemplateConfig::default())]);
    let created = t.create(ALICE, "base", json!({})).await;
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let post = |path: &str, headers: &[(&str, &str)]| {
        let mut r = Req::new("POST", &format!("/files?path={path}"))
            .body("application/octet-stream", b"content".to_vec())
            .at_port(&id, "49983")
            .header("x-access-token", &token);
        for (k, v) in headers {
            r = r.header(k, v);
        }
        r
    };
    let r = send(
        t.addr,
        post(
            "m/a.txt",
            &[
                ("X-Metadata-Author", "mish"),
                ("x-metadata-author", "second"),
                ("X-Metadata-Purpose", "a test"),
            ],
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let meta = json!({ "author": "mish", "purpose": "a test" });
    assert_eq!(r.json()[0]["metadata"], meta, "{}", r.text());
    let stat = send(
        t.addr,
        fs(&id, &token, "Stat", json!({ "path": "m/a.txt" })),
    )
    .await;
    assert_eq!(stat.json()["entry"]["metadata"], meta, "{}", stat.text());
    let list = send(t.addr, fs(&id, &token, "ListDir", json!({ "path": "m" }))).await;
    assert_eq!(
        list.json()["entries"][0]["metadata"],
        meta,
        "{}",
        list.text()
    );

    let big = "v".repeat(4096);
    for (headers, why) in [
        (vec![("X-Metadata-Key", "tab\tinside")], "printable"),
        (vec![("X-Metadata-Key", "caf\u{e9}")], "printable"),
        (vec![("X-Metadata-Key", big.as_str())], "4096"),
    ] {
        let r = send(t.addr, post("m/refused.txt", &headers)).await;
        assert_eq!(r.status, 400, "{headers:?}: {}", r.text());
        assert!(r.text().contains(why), "{headers:?}: {}", r.text());
    }
    let stat = send(
        t.addr,
        fs(&id, &token, "Stat", json!({ "path": "m/refused.txt" })),
    )
    .await;
    assert_eq!(
        code(&stat),
        "not_found",
        "a refused upload wrote nothing: {}",
        stat.text()
    );
    // An upload without metadata clears what the file had.
    let r = send(t.addr, post("m/a.txt", &[])).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()[0].get("metadata").is_none(), "{}", r.text());
    let stat = send(
        t.addr,
        fs(&id, &token, "Stat", json!({ "path": "m/a.txt" })),
    )
    .await;
    assert!(
        stat.json()["entry"].get("metadata").is_none(),
        "{}",
        stat.text()
    );
    t.stop().await;
}

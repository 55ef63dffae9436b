//! Memory bounded per tenant, through the `Paddock` handle on the subprocess engine:
//! input waiting for processes that do not read it (`limiter.max_input_bytes_per_*`)
//! and output kept by running executions (`limiter.max_output_bytes_per_tenant`).

use std::time::Duration;

use paddock::PaddockConfig;
use paddock_core::{ErrorCode, ExecRequest, ProcessSpec, Program, SandboxSpec};
use paddock_pool::{Caller, Execute, Paddock, SandboxHandle, StreamEvent};

const KIB: usize = 1 << 10;

fn start(config: PaddockConfig) -> Paddock {
    paddock::builder()
        .config(config)
        .without_isolate()
        .without_container()
        .start()
        .expect("starts")
}

async fn sandbox_of(p: &Paddock, tenant: &str) -> SandboxHandle {
    p.open_sandbox(
        SandboxSpec {
            tenant: Some(tenant.into()),
            ..SandboxSpec::default()
        },
        None,
    )
    .await
    .expect("opens a sandbox")
}

/// A process that reads none of its stdin until the file `go` appears in its
/// workdir, then counts what it reads.
fn stuck_until(go: &str) -> ProcessSpec {
    ProcessSpec::new([
        "sh".to_string(),
        "-c".to_string(),
        format!("while [ ! -e {go} ]; do sleep 0.05; done; exec wc -c"),
    ])
    .with_stdin()
}

/// `writers` concurrent writes of `size` bytes each: how many were accepted, and
/// the refusals.
async fn flood(
    handle: &paddock_core::ProcessHandle,
    writers: usize,
    size: usize,
) -> (usize, Vec<paddock_core::Error>) {
    let writes: Vec<_> = (0..writers)
        .map(|_| {
            let h = handle.clone();
            tokio::spawn(async move { h.send_stdin(vec![b'x'; size]).await })
        })
        .collect();
    let mut accepted = 0;
    let mut refused = Vec::new();
    for w in writes {
        match w.await.expect("the writer's task") {
            Ok(()) => accepted += 1,
            Err(e) => refused.push(e),
        }
    }
    (accepted, refused)
}

/// Everything the process prints until its output ends.
async fn all_output(handle: &paddock_core::ProcessHandle) -> String {
    let mut reader = handle.output();
    let mut out = Vec::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(20), reader.next())
        .await
        .expect("the process's output ended")
    {
        out.extend_from_slice(&chunk.data);
    }
    String::from_utf8_lossy(&out).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_to_a_process_that_never_reads_are_answered_within_the_bounds() {
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = false;
    config.pool.min_idle = 1;
    config.limiter.max_input_bytes_per_process = 256 * KIB as u64;
    config.limiter.max_input_bytes_per_tenant = 384 * KIB as u64;
    config.limiter.input_wait_ms = 200;
    let p = start(config);
    let alice = sandbox_of(&p, "alice").await;
    let bob = sandbox_of(&p, "bob").await;
    let first = alice.start_process(stuck_until("go1")).await.unwrap();
    let second = alice.start_process(stuck_until("go2")).await.unwrap();
    let bobs = bob.start_process(stuck_until("go")).await.unwrap();
    let (first, second, bobs) = match (first.handle, second.handle, bobs.handle) {
        (
            paddock_pool::Attachable::Process(a),
            paddock_pool::Attachable::Process(b),
            paddock_pool::Attachable::Process(c),
        ) => (a, b, c),
        _ => panic!("processes were started"),
    };

    // 24 writers of 64 KiB on a process that reads nothing: every one is answered,
    // each refusal is RATE_LIMITED (for the process's buffer, or for the tenant's
    // budget that writers waiting for room count against), and what is accepted
    // fits the process's buffer (plus the pipe the kernel holds).
    let (accepted, refused) = flood(&first, 24, 64 * KIB).await;
    assert_eq!(accepted + refused.len(), 24);
    assert!(accepted >= 1, "nothing was accepted");
    assert!(
        !refused.is_empty(),
        "every write was taken: the buffer is unbounded"
    );
    for e in &refused {
        assert_eq!(e.code, ErrorCode::RateLimited, "{e}");
        assert!(
            e.message.contains("has not read") || e.message.contains("max_input_bytes_per_tenant"),
            "{}",
            e.message
        );
    }
    assert!(
        accepted * 64 * KIB <= 256 * KIB + 64 * KIB,
        "{accepted} chunks of 64 KiB were accepted"
    );

    // The tenant's second stuck process gets what is left of alice's 384 KiB, and
    // is then refused at once for the tenant.
    let (also, refused_too) = flood(&second, 8, 64 * KIB).await;
    assert!(also < 8, "the tenant's budget did not bind");
    assert!(
        refused_too
            .iter()
            .any(|e| e.message.contains("max_input_bytes_per_tenant")),
        "{refused_too:?}"
    );

    // Bob's budget is his own: 256 KiB for his stuck process, in 64 KiB writes.
    for _ in 0..4 {
        bobs.send_stdin(vec![b'y'; 64 * KIB]).await.unwrap();
    }

    // The process is still usable: once it reads, everything accepted reaches it,
    // it takes more, and it ends at the close.
    alice.write_file("go1", b"").await.unwrap();
    let mut more = 0;
    for _ in 0..200 {
        match first.send_stdin(vec![b'z'; 64 * KIB]).await {
            Ok(()) => {
                more = 64 * KIB;
                break;
            }
            Err(e) if e.code == ErrorCode::RateLimited => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(more, 64 * KIB, "the reading process never took more input");
    first.close_stdin().await.unwrap();
    let counted = all_output(&first).await;
    assert_eq!(counted, (accepted * 64 * KIB + more).to_string());
    assert_eq!(first.wait().await.exit_code, 0);

    for (sandbox, go, handle) in [(&alice, "go2", &second), (&bob, "go", &bobs)] {
        sandbox.write_file(go, b"").await.unwrap();
        handle.close_stdin().await.unwrap();
        let _ = all_output(handle).await;
        handle.wait().await;
    }
    alice.destroy().await.unwrap();
    bob.destroy().await.unwrap();
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

fn print_as(tenant: &str, bytes: usize, then: &str) -> ExecRequest {
    let mut r = ExecRequest::new(Program::command([
        "sh".to_string(),
        "-c".to_string(),
        format!("head -c {bytes} /dev/zero | tr '\\0' x; {then}"),
    ]));
    r.tenant = Some(tenant.into());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_output_budget_is_truncated_and_another_is_whole() {
    let mut config = PaddockConfig::default();
    config.subprocess.warm.enabled = false;
    config.limiter.max_output_bytes_per_tenant = 1 << 20;
    let p = start(config);
    let alice = Caller::tenant("alice");

    // Alice's first execution keeps 768 KiB and goes on running.
    let holder = print_as("alice", 768 * KIB, "sleep 30");
    let holder_id = holder.id.clone();
    let mut stream = p.execute_stream(Execute::new(holder)).await.unwrap();
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
    let holding = tokio::spawn(async move {
        let mut seen = 0;
        let mut seen_tx = Some(seen_tx);
        loop {
            match stream.next().await {
                Some(StreamEvent::Output(c)) => {
                    seen += c.data.len();
                    if seen >= 768 * KIB {
                        if let Some(tx) = seen_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                }
                Some(StreamEvent::Finished(r)) => return *r,
                None => panic!("the stream ended without a result"),
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(20), seen_rx)
        .await
        .expect("the first execution's output")
        .unwrap();

    // Her second gets the 256 KiB left: cut, flagged, with the marker and a warning.
    let cut = p
        .execute(print_as("alice", 768 * KIB, "true"))
        .await
        .unwrap();
    assert!(
        cut.stdout_truncated,
        "alice's output past her budget was kept"
    );
    assert!(
        cut.stdout.len() < 300 * KIB,
        "{} bytes kept",
        cut.stdout.len()
    );
    assert!(cut.stdout.contains("[output truncated at"), "no marker");
    assert!(
        cut.warnings
            .iter()
            .any(|w| w.contains("max_output_bytes_per_tenant")),
        "{:?}",
        cut.warnings
    );

    // Bob's output is whole meanwhile: the budget is per tenant.
    let whole = p.execute(print_as("bob", 768 * KIB, "true")).await.unwrap();
    assert!(!whole.stdout_truncated);
    assert_eq!(whole.stdout.len(), 768 * KIB);
    assert!(whole.warnings.is_empty(), "{:?}", whole.warnings);

    // Once her first execution ends, its bytes are hers again.
    assert!(p.cancel(&alice, &holder_id));
    let held = holding.await.unwrap().unwrap();
    assert_eq!(
        held.stdout.len(),
        768 * KIB,
        "the first execution kept its output"
    );
    let again = p
        .execute(print_as("alice", 768 * KIB, "true"))
        .await
        .unwrap();
    assert!(!again.stdout_truncated);
    assert_eq!(again.stdout.len(), 768 * KIB);
    p.shutdown(Duration::from_secs(5)).await.unwrap();
}

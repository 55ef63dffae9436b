//! A host that holds more descriptors than a program's `open_files` limit can still
//! spawn programs under that limit. (Its own test binary: it opens 1,100 descriptors
//! in this process, which other tests must not see.)

use std::os::fd::OwnedFd;

use paddock_core::{CancelToken, DiscardSink, Engine, ExecRequest, Program, SandboxSpec};
use paddock_engines::subprocess::SubprocessEngine;
use paddock_engines::SubprocessConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_more_descriptors_than_the_limit_still_spawns() {
    // What a server holding dozens of sandboxes looks like: well over 1,024 open
    // descriptors, against the default `open_files` limit of 1,024.
    let null = std::fs::File::open("/dev/null").unwrap();
    let held: Vec<OwnedFd> = (0..1_100)
        .map(|_| OwnedFd::from(null.try_clone().unwrap()))
        .collect();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count();
    assert!(open > 1_100, "only {open} descriptors are open");
    let engine = SubprocessEngine::new(&SubprocessConfig::default()).unwrap();
    let sandbox = engine.create(&SandboxSpec::default()).await.unwrap();
    let mut request = ExecRequest::new(Program::command(["sh", "-c", "ulimit -n"]));
    request.limits.open_files = Some(1024);
    let r = sandbox
        .exec(request, &DiscardSink, CancelToken::new())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    assert_eq!(r.stdout.trim(), "1024", "{r:?}");
    sandbox.destroy().await.unwrap();
    drop(held);
}

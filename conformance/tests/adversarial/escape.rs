//! Escaping the kill: a tree that traps SIGTERM, a double-forked `setsid` daemon,
//! background children left behind by a program that exits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_core::Outcome;

use crate::exhaustion::still_works;
use crate::harness::{Check, Lang, H};

const NO_PROCESSES: &str =
    "a script in an isolate has no way to create a process: there is no tree to escape with";

pub(crate) async fn term_trapping_tree(h: Arc<H>) -> Check {
    if h.target.lang() == Lang::Js {
        skip!("{NO_PROCESSES}");
    }
    let t = &h.token;
    let mut request = h.program(
        &format!(
            "trap '' TERM INT HUP
             (trap '' TERM INT HUP; sleep {t}) &
             (trap '' TERM INT HUP; sh -c \"trap '' TERM INT HUP; sleep {t} & sleep {t}\") &
             echo started; while :; do sleep 1; done # {t}"
        ),
        &format!(
            "import signal, subprocess, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n    signal.signal(s, signal.SIG_IGN)\nfor _ in range(3):\n    subprocess.Popen(['sh', '-c', \"trap '' TERM INT HUP; sleep {t} & sleep {t}\"])\nprint('started', flush=True)\nwhile True:\n    time.sleep(1)"
        ),
        "",
    );
    request.limits.timeout_ms = Some(1_500);
    let started = Instant::now();
    let r = h.exec(request).await?;
    let took = started.elapsed();
    ensure!(r.outcome == Outcome::TimedOut, "expected timed_out: {r:?}");
    ensure!(
        r.stdout.contains("started"),
        "the tree never started: {r:?}"
    );
    ensure!(
        took < Duration::from_secs(8),
        "a 1.5 s deadline took {took:?} against a TERM-trapping tree"
    );
    h.no_survivors("the TERM-trapping tree's deadline").await?;
    still_works(&h).await
}

pub(crate) async fn setsid_daemon(h: Arc<H>) -> Check {
    if h.target.lang() == Lang::Js {
        skip!("{NO_PROCESSES}");
    }
    let t = &h.token;
    // The classic daemon: fork, setsid, fork again, ignore the hangup; the program
    // then exits at once, successfully.
    let r = h
        .exec(h.program(
            &format!(
                "setsid sh -c \"setsid sh -c 'trap \\\"\\\" TERM HUP; sleep {t}' & \" </dev/null >/dev/null 2>&1 & sleep 0.3; echo parent-done"
            ),
            &format!(
                "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.setsid()\n        fd = os.open('/dev/null', os.O_RDWR)\n        for n in (0, 1, 2):\n            os.dup2(fd, n)\n        os.execvp('sleep', ['sleep', '{t}'])\n    os._exit(0)\ntime.sleep(0.3)\nprint('parent-done')"
            ),
            "",
        ))
        .await?;
    ensure!(
        r.is_success() && r.stdout.trim() == "parent-done",
        "expected a clean exit: {r:?}"
    );
    h.no_survivors("a program that left a setsid daemon")
        .await?;
    still_works(&h).await
}

pub(crate) async fn background_children(h: Arc<H>) -> Check {
    if h.target.lang() == Lang::Js {
        skip!("{NO_PROCESSES}");
    }
    let t = &h.token;
    let r = h
        .exec(h.program(
            &format!("sleep {t} & sleep {t} & (sleep {t} &) ; echo done"),
            &format!(
                "import subprocess\nfor _ in range(3):\n    subprocess.Popen(['sleep', '{t}'])\nprint('done')"
            ),
            "",
        ))
        .await?;
    ensure!(
        r.is_success() && r.stdout.trim() == "done",
        "expected a clean exit: {r:?}"
    );
    h.no_survivors("a program that left background children")
        .await?;
    still_works(&h).await
}

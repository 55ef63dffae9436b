//! The suite must catch deliberately broken engines: each flaw fails exactly the cases
//! that check what it breaks, while every case the real engine passes and that is
//! unrelated to the flaw still passes.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use paddock_conformance::broken::{Broken, Flaw};
use paddock_conformance::{cases, run_all, CaseResult};

use crate::subprocess::subprocess_engine;

type Results = BTreeMap<&'static str, CaseResult>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The real engine's results, computed once for every flaw test.
fn baseline() -> &'static Results {
    static BASELINE: OnceLock<Results> = OnceLock::new();
    BASELINE.get_or_init(|| {
        paddock_conformance::prepare_process_env();
        runtime()
            .block_on(run_all(|| async { subprocess_engine() }))
            .into_iter()
            .collect()
    })
}

fn check_flaw(flaw: Flaw) {
    paddock_conformance::prepare_process_env();
    let baseline = baseline();
    let broken: Results = runtime()
        .block_on(run_all(move || async move {
            Broken::wrap(subprocess_engine(), flaw)
        }))
        .into_iter()
        .collect();
    assert_eq!(broken.len(), cases().len());

    let caught_by = flaw.caught_by();
    for name in caught_by {
        assert!(
            baseline[name].is_passed(),
            "{flaw}: the real engine must pass `{name}` for the suite to prove it catches \
             the flaw; it got {}",
            baseline[name]
        );
        assert!(
            broken[name].is_failed(),
            "{flaw}: `{name}` must fail for an engine with this flaw; it got {}",
            broken[name]
        );
    }
    for (name, real) in baseline {
        if caught_by.contains(name) || !real.is_passed() {
            continue;
        }
        assert!(
            broken[name].is_passed(),
            "{flaw}: `{name}` is unrelated to the flaw and passes on the real engine, so it \
             must pass on the broken one; it got {}",
            broken[name]
        );
    }
}

#[test]
fn ignores_cancel_is_caught() {
    check_flaw(Flaw::IgnoresCancel);
}

#[test]
fn reports_success_on_cancel_is_caught() {
    check_flaw(Flaw::ReportsSuccessOnCancel);
}

#[test]
fn loses_cancel_race_is_caught() {
    check_flaw(Flaw::LosesCancelRace);
}

#[test]
fn ignores_timeout_is_caught() {
    check_flaw(Flaw::IgnoresTimeout);
}

#[test]
fn buffers_output_is_caught() {
    check_flaw(Flaw::BuffersOutput);
}

#[test]
fn no_path_confinement_is_caught() {
    check_flaw(Flaw::NoPathConfinement);
}

#[test]
fn leaks_secrets_is_caught() {
    check_flaw(Flaw::LeaksSecrets);
}

#[test]
fn deaf_watch_is_caught() {
    check_flaw(Flaw::DeafWatch);
}

#[test]
fn every_flaw_is_tested() {
    assert_eq!(Flaw::ALL.len(), 8, "add a test for the new flaw");
    for flaw in Flaw::ALL {
        for name in flaw.caught_by() {
            assert!(
                cases().iter().any(|c| c.name == *name),
                "{flaw} names the unknown case `{name}`"
            );
        }
    }
}

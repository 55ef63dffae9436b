//! The program's environment: secrets hidden, ordinary variables and request env
//! visible; with `strict` isolation, only the host variables the engine is configured
//! to pass.

use std::collections::BTreeMap;

use crate::case::Check;
use crate::context::{brief, exec, sh, Ctx};
use crate::env::{HOST_ENV, LISTED_HOST_VAR, UNLISTED_HOST_VAR};
use paddock_core::IsolationLevel;

pub(crate) async fn env_is_sanitized(ctx: Ctx) -> Check {
    for (name, value) in HOST_ENV {
        ensure!(
            std::env::var(name).as_deref() == Ok(*value),
            "the host variable {name} is not {value:?}; prepare_process_env must run before \
             anything else changes the environment"
        );
    }
    let sandbox = ctx.sandbox().await?;
    let mut request = sh("env", &[]);
    request
        .env
        .insert("PADDOCK_CONFORMANCE_REQUEST".into(), "from-request".into());
    let r = exec(&*sandbox, request).await?;
    ensure!(r.is_success(), "`env` failed: {}", brief(&r));
    let vars: BTreeMap<&str, &str> = r.stdout.lines().filter_map(|l| l.split_once('=')).collect();

    for name in ["SECRET_X", "API_KEY"] {
        ensure!(
            !vars.contains_key(name),
            "the secret-looking host variable {name} reached the program: {name}={:?}",
            vars[name]
        );
    }
    for (_, secret) in HOST_ENV
        .iter()
        .filter(|(n, _)| ![LISTED_HOST_VAR, UNLISTED_HOST_VAR].contains(n))
    {
        ensure!(
            !r.stdout.contains(secret),
            "the value of a secret host variable ({secret:?}) appears in the program's environment"
        );
    }
    ensure!(
        vars.get("PATH").is_some_and(|p| !p.is_empty()),
        "PATH must be set for the program; its environment was {vars:?}"
    );
    ensure!(
        vars.get(LISTED_HOST_VAR) == Some(&"visible"),
        "the ordinary host variable {LISTED_HOST_VAR}=visible must reach the program (an \
         engine that passes only listed host variables must be configured to pass it); \
         got {:?}",
        vars.get(LISTED_HOST_VAR)
    );
    if ctx.engine().capabilities().max_level == IsolationLevel::Strict {
        let unlisted = HOST_ENV
            .iter()
            .find(|(n, _)| *n == UNLISTED_HOST_VAR)
            .map_or("", |(_, v)| *v);
        ensure!(
            !vars.contains_key(UNLISTED_HOST_VAR) && !r.stdout.contains(unlisted),
            "a strict engine passed the host variable {UNLISTED_HOST_VAR}, which it was not \
             configured to pass: a strict sandbox must get only listed host variables"
        );
    }
    ensure!(
        vars.get("PADDOCK_CONFORMANCE_REQUEST") == Some(&"from-request"),
        "a variable from the request's env must reach the program; got {:?}",
        vars.get("PADDOCK_CONFORMANCE_REQUEST")
    );
    Ok(())
}

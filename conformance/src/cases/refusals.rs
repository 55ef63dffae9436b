//! Typed refusals: unsupported programs, levels and network policies, bad requests.

use paddock_core::{
    ErrorCode, ExecRequest, IsolationLevel, Language, NetworkPolicy, Program, SandboxSpec,
};

use crate::case::{expect_code, Check, OrFail};
use crate::context::{brief, exec, sh, Ctx};

/// One program of every kind.
fn one_of_each_kind() -> Vec<Program> {
    let mut programs = vec![
        Program::command(["sh", "-c", "exit 0"]),
        Program::Invoke {
            handler: "paddock-conformance-handler".into(),
            input: serde_json::Value::Null,
        },
        Program::Resume {
            token_id: "paddock-conformance-token".into(),
            value: serde_json::Value::Null,
        },
    ];
    for language in Language::ALL {
        let source = match language {
            Language::Python => "pass",
            Language::Javascript => "0",
            Language::Shell => "exit 0",
        };
        programs.push(Program::code(*language, source));
    }
    programs
}

pub(crate) async fn refuses_unsupported_program(ctx: Ctx) -> Check {
    let engine = ctx.engine();
    let caps = engine.capabilities();
    let Some(program) = one_of_each_kind()
        .into_iter()
        .find(|p| !caps.supports_program(p.kind()))
    else {
        skip!("the engine runs every program kind");
    };
    let kind = program.kind();
    let sandbox = ctx.sandbox().await?;
    let request = ExecRequest::new(program);
    expect_code(
        sandbox
            .exec(request, &paddock_core::DiscardSink, Default::default())
            .await
            .map(|r| brief(&r)),
        ErrorCode::CapabilityNotSupported,
        format_args!("exec of a {kind} program, which the engine does not advertise"),
    )?;
    if caps.supports_program(paddock_core::ProgramKind::Command) {
        let r = exec(&*sandbox, sh("exit 0", &[])).await?;
        ensure!(
            r.is_success(),
            "the sandbox must still run programs after a refusal; got {}",
            brief(&r)
        );
    }
    Ok(())
}

pub(crate) async fn refuses_stronger_level(ctx: Ctx) -> Check {
    let engine = ctx.engine();
    let max = engine.capabilities().max_level;
    let stronger = match max {
        IsolationLevel::None => IsolationLevel::ContextIsolated,
        IsolationLevel::ContextIsolated => IsolationLevel::Strict,
        IsolationLevel::Strict => skip!("the engine already provides the strictest level"),
    };
    for level in [stronger, IsolationLevel::Strict] {
        let spec = SandboxSpec {
            level,
            ..SandboxSpec::default()
        };
        let result = engine.create(&spec).await;
        if let Ok(sandbox) = &result {
            ctx.track(sandbox.clone());
        }
        expect_code(
            result.map(|s| s.id().to_string()),
            ErrorCode::LevelNotSupported,
            format_args!("create with level `{level}` on an engine whose max_level is `{max}`"),
        )?;
    }
    for level in [IsolationLevel::None, max] {
        let spec = SandboxSpec {
            level,
            ..SandboxSpec::default()
        };
        let sandbox = engine.create(&spec).await.or_fail(format_args!(
            "create with level `{level}` (at most max_level `{max}`)"
        ))?;
        ctx.track(sandbox);
    }
    Ok(())
}

pub(crate) async fn refuses_unenforceable_network(ctx: Ctx) -> Check {
    let engine = ctx.engine();
    let caps = engine.capabilities();
    let policies = [
        NetworkPolicy::None,
        NetworkPolicy::Allowlist {
            hosts: vec!["example.com".into()],
            ports: vec![],
        },
        NetworkPolicy::Unrestricted,
    ];
    let Some(policy) = policies
        .into_iter()
        .find(|p| !caps.network.contains(p.name()))
    else {
        skip!("the engine enforces every network policy");
    };
    let spec = SandboxSpec {
        network: policy.clone(),
        ..SandboxSpec::default()
    };
    let result = engine.create(&spec).await;
    if let Ok(sandbox) = &result {
        ctx.track(sandbox.clone());
    }
    expect_code(
        result.map(|s| s.id().to_string()),
        ErrorCode::CapabilityNotSupported,
        format_args!(
            "create with network policy `{}`, which the engine does not list in capabilities().network",
            policy.name()
        ),
    )
}

pub(crate) async fn refuses_invalid_request(ctx: Ctx) -> Check {
    let sandbox = ctx.sandbox().await?;
    let empty = ExecRequest::new(Program::command(Vec::<String>::new()));
    expect_code(
        sandbox
            .exec(empty, &paddock_core::DiscardSink, Default::default())
            .await
            .map(|r| brief(&r)),
        ErrorCode::InvalidOptions,
        "exec with an empty argv",
    )?;
    let mut bad_env = sh("exit 0", &[]);
    bad_env.env.insert("A=B".into(), "x".into());
    expect_code(
        sandbox
            .exec(bad_env, &paddock_core::DiscardSink, Default::default())
            .await
            .map(|r| brief(&r)),
        ErrorCode::InvalidOptions,
        "exec with the env variable name `A=B`",
    )
}

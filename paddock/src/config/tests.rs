//! The checks of every section, through the whole document: each error names its key.

use paddock_core::{EngineName, ErrorCode};
use paddock_engines::{
    CgroupMode, ContainerConfig, OciRuntime, RunscPlatform, MAX_ENGINE_DEFS, USERNS_IDS_PER_SANDBOX,
};

use super::PaddockConfig;

#[test]
fn empty_document_is_the_default() {
    assert_eq!(
        PaddockConfig::from_toml_str("").unwrap(),
        PaddockConfig::default()
    );
    assert_eq!(
        PaddockConfig::from_json_str("{}").unwrap(),
        PaddockConfig::default()
    );
}

#[test]
fn unknown_fields_are_refused() {
    let e = PaddockConfig::from_toml_str("[subprocess]\npyhton = \"x\"\n").unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(e.message.contains("pyhton"), "{}", e.message);
}

#[test]
fn bad_values_name_the_field() {
    let e = PaddockConfig::from_toml_str("[limits]\ntimeout_ms = 0\n").unwrap_err();
    assert!(e.message.contains("limits.timeout_ms"), "{}", e.message);
    let e = PaddockConfig::from_toml_str("[subprocess]\nworkdir_root = \"rel\"\n").unwrap_err();
    assert!(
        e.message.contains("subprocess.workdir_root"),
        "{}",
        e.message
    );
    let e = PaddockConfig::from_toml_str("[subprocess]\ncgroup = \"maybe\"\n").unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
}

#[test]
fn env_passthrough_names_are_checked() {
    let c = PaddockConfig::from_toml_str(
        "[container]\nenv_passthrough = [\"AWS_PROFILE\", \"DATABASE_URL\"]\n",
    )
    .unwrap();
    assert_eq!(c.container.env_passthrough, ["AWS_PROFILE", "DATABASE_URL"]);
    for (doc, field) in [
        (
            "[container]\nenv_passthrough = [\"A=B\"]\n",
            "container.env_passthrough",
        ),
        (
            "[container]\nenv_passthrough = [\"\"]\n",
            "container.env_passthrough",
        ),
        (
            "[container]\nenv_passthrough = [\"PATH\"]\n",
            "container.env_passthrough",
        ),
        (
            "[subprocess]\nenv_passthrough = [\"A=B\"]\n",
            "subprocess.env_passthrough",
        ),
    ] {
        let e = PaddockConfig::from_toml_str(doc).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig, "{doc}");
        assert!(e.message.contains(field), "{doc}: {e}");
    }
    let e = ContainerConfig {
        env_passthrough: vec!["HOME".into()],
        ..ContainerConfig::default()
    }
    .validate()
    .unwrap_err();
    assert!(e.message.contains("`HOME`"), "{e}");
}

#[test]
fn full_document_round_trips() {
    let mut c = PaddockConfig::default();
    c.limits.defaults.timeout_ms = Some(1000);
    c.subprocess.env_passthrough = vec!["AWS_PROFILE".into()];
    c.subprocess.cgroup = CgroupMode::Off;
    let text = toml::to_string(&c).unwrap();
    assert_eq!(PaddockConfig::from_toml_str(&text).unwrap(), c);
}

#[test]
fn user_namespace_ranges_and_the_runsc_platform_are_checked() {
    let c = PaddockConfig::from_toml_str(
        "[container]\nruntime = \"runsc\"\nrunsc_platform = \"kvm\"\nuserns_slots = 8\n",
    )
    .unwrap();
    assert_eq!(c.container.runtime, OciRuntime::Runsc);
    assert_eq!(c.container.runsc_platform, RunscPlatform::Kvm);
    assert_eq!(c.container.userns_slots, 8);
    assert!(c.container.user_namespace);
    for (doc, field) in [
        (
            "[container]\nuserns_first_id = 0\n",
            "container.userns_first_id",
        ),
        ("[container]\nuserns_slots = 0\n", "container.userns_slots"),
        (
            "[container]\nuserns_first_id = 4294950000\nuserns_slots = 1\n",
            "container.userns_slots",
        ),
        // The parser names the choices (a bad enum value carries no key).
        (
            "[container]\nrunsc_platform = \"vm\"\n",
            "`ptrace`, `kvm`, `systrap`",
        ),
    ] {
        let e = PaddockConfig::from_toml_str(doc).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig, "{doc}");
        assert!(e.message.contains(field), "{doc}: {e}");
    }
    // The last range may end at the largest id.
    let c = ContainerConfig {
        userns_first_id: u32::MAX - USERNS_IDS_PER_SANDBOX,
        userns_slots: 1,
        ..ContainerConfig::default()
    };
    assert!(c.validate().is_ok());
}

#[test]
fn named_engines_inherit_the_container_section_and_are_checked() {
    let c = PaddockConfig::from_toml_str(
        r#"
            [container]
            cpus = 2.0
            runtime = "crun"
            [engines.py311]
            kind = "container"
            rootfs = "/srv/rootfs/py311"
            [engines.gvisor]
            kind = "container"
            runtime = "runsc"
            "#,
    )
    .unwrap();
    let py = c.engines[&EngineName::new("py311").unwrap()].container_config(&c.container);
    assert_eq!(
        py.rootfs.as_deref(),
        Some(std::path::Path::new("/srv/rootfs/py311"))
    );
    assert_eq!((py.cpus, py.runtime), (2.0, OciRuntime::Crun));
    let gv = c.engines[&EngineName::new("gvisor").unwrap()].container_config(&c.container);
    assert_eq!((gv.rootfs, gv.runtime), (None, OciRuntime::Runsc));
    // A round trip keeps them.
    let text = toml::to_string(&c).unwrap();
    assert_eq!(PaddockConfig::from_toml_str(&text).unwrap(), c);

    for (text, names) in [
        (
            "[engines.container]\nkind = \"container\"",
            "built-in engine's name",
        ),
        ("[engines.x]\nkind = \"vm\"", "unknown variant `vm`"),
        ("[engines.x]\nrootfs = \"/r\"", "missing field `kind`"),
        (
            "[engines.x]\nkind = \"container\"\nmemory = 1",
            "unknown field `memory`",
        ),
        ("[engines.Bad]\nkind = \"container\"", "engine name"),
        (
            "[engines.x]\nkind = \"container\"\nrootfs = \"relative\"",
            "`engines.x.rootfs`",
        ),
        (
            "[engines.x]\nkind = \"container\"\ncpus = 0.0",
            "`engines.x.cpus`",
        ),
    ] {
        let e = PaddockConfig::from_toml_str(text).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig, "{text}");
        assert!(e.message.contains(names), "{text}: {e}");
    }
    // A template names an engine there is.
    let e = PaddockConfig::from_toml_str(
        "[engines.tiny]\nkind = \"container\"\n[templates.t]\nengine = \"tyni\"\n",
    )
    .unwrap_err();
    assert!(
        e.message.contains("`templates.t.engine`") && e.message.contains("tiny"),
        "{e}"
    );
    PaddockConfig::from_toml_str(
        "[engines.tiny]\nkind = \"container\"\n[templates.t]\nengine = \"tiny\"\n",
    )
    .unwrap();
    let many: String = (0..=MAX_ENGINE_DEFS)
        .map(|i| format!("[engines.e{i}]\nkind = \"container\"\n"))
        .collect();
    let e = PaddockConfig::from_toml_str(&many).unwrap_err();
    assert!(e.message.contains("at most 16"), "{e}");
}

#[test]
fn limiter_and_policy_sections_are_checked() {
    let e = PaddockConfig::from_toml_str("[limiter]\nmax_executions_per_window = 0\n").unwrap_err();
    assert!(
        e.message.contains("limiter.max_executions_per_window"),
        "{}",
        e.message
    );
    let c = PaddockConfig::from_toml_str(
            "[limiter]\nmax_executions_per_window = 5\n\n[policy]\nmax_code_length = 10\ndisable = [\"warn-while-true\"]\n",
        )
        .unwrap();
    assert_eq!(c.limiter.max_executions_per_window, Some(5));
    assert_eq!(c.policy.max_code_length, 10);
    let e = PaddockConfig::from_toml_str("[policy]\nmax_lenght = 1\n").unwrap_err();
    assert!(e.message.contains("max_lenght"), "{}", e.message);
}

#[test]
fn pool_values_are_checked() {
    let e = PaddockConfig::from_toml_str("[pool]\nmax_size = 0\n").unwrap_err();
    assert!(e.message.contains("pool.max_size"), "{}", e.message);
    let e = PaddockConfig::from_toml_str("[pool]\nmin_idle = 100001\n").unwrap_err();
    assert!(e.message.contains("pool.min_idle"), "{}", e.message);
    // Above max_size is allowed (the default 8 with a smaller pool): the pool
    // keeps max_size ready.
    let c = PaddockConfig::from_toml_str("[pool]\nmin_idle = 9\nmax_size = 2\n").unwrap();
    assert_eq!(c.pool.min_idle, 9);
    let c = PaddockConfig::from_toml_str("[pool]\nmax_size = 2\nmin_idle = 0\n").unwrap();
    assert_eq!(c.pool.max_size, 2);
    let e = PaddockConfig::from_toml_str("[pool]\nmax_processes_per_sandbox = 0\n").unwrap_err();
    assert!(
        e.message.contains("pool.max_processes_per_sandbox"),
        "{}",
        e.message
    );
}

#[test]
fn the_close_linger_is_bounded() {
    let c = PaddockConfig::from_toml_str("[server]\nclose_linger_ms = 2000\n").unwrap();
    assert_eq!(c.server.close_linger_ms, 2000);
    let e = PaddockConfig::from_toml_str("[server]\nclose_linger_ms = 60001\n").unwrap_err();
    assert!(
        e.message.contains("server.close_linger_ms"),
        "{}",
        e.message
    );
}

#[test]
fn read_timeouts_and_unauthenticated_connection_caps_are_bounded() {
    let c = PaddockConfig::from_toml_str(
        "[server]\nbody_read_timeout_ms = 500\nheader_read_timeout_ms = 2000\n\
             max_unauthenticated_connections = 10\n\
             max_unauthenticated_connections_per_address = 10\n",
    )
    .unwrap();
    assert_eq!(c.server.body_read_timeout_ms, 500);
    assert_eq!(c.server.header_read_timeout_ms, 2000);
    for (toml, field) in [
        ("body_read_timeout_ms = 0", "server.body_read_timeout_ms"),
        (
            "body_read_timeout_ms = 3600001",
            "server.body_read_timeout_ms",
        ),
        (
            "header_read_timeout_ms = 0",
            "server.header_read_timeout_ms",
        ),
        (
            "max_unauthenticated_connections = 0",
            "server.max_unauthenticated_connections",
        ),
        (
            "max_unauthenticated_connections = 8\nmax_unauthenticated_connections_per_address = 9",
            "server.max_unauthenticated_connections_per_address",
        ),
    ] {
        let e = PaddockConfig::from_toml_str(&format!("[server]\n{toml}\n")).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert!(e.message.contains(field), "{toml}: {}", e.message);
    }
}

#[test]
fn the_tls_listener_is_checked() {
    let ok = "[server]\nlisten = \"127.0.0.1:7878\"\n[server.tls]\nlisten = \"0.0.0.0:443\"\ncert = \"/etc/paddock/cert.pem\"\nkey = \"/etc/paddock/key.pem\"\n";
    let c = PaddockConfig::from_toml_str(ok).unwrap();
    assert_eq!(c.server.tls.as_ref().unwrap().listen, "0.0.0.0:443");
    for (text, names) in [
        (ok.replace("0.0.0.0:443", "443"), "`server.tls.listen`"),
        (ok.replace("0.0.0.0:443", "127.0.0.1:7878"), "another port"),
        (
            ok.replace("/etc/paddock/key.pem", "key.pem"),
            "`server.tls.key`",
        ),
        (
            ok.replace("cert = \"/etc/paddock/cert.pem\"\n", ""),
            "missing field `cert`",
        ),
    ] {
        let e = PaddockConfig::from_toml_str(&text).unwrap_err();
        assert!(e.message.contains(names), "{text}: {e}");
    }
}

#[test]
fn handlers_and_warm_workers_are_checked() {
    let c = PaddockConfig::from_toml_str(
            "[subprocess.warm]\nenabled = true\n[subprocess.handlers.sum]\ncommand = [\"node\", \"sum.js\"]\n",
        )
        .unwrap();
    assert!(c.subprocess.warm.enabled);
    assert_eq!(c.subprocess.handlers["sum"].command, ["node", "sum.js"]);
    for (doc, field) in [
        (
            "[subprocess.handlers.\"a b\"]\ncommand = [\"x\"]\n",
            "subprocess.handlers",
        ),
        (
            "[subprocess.handlers.x]\ncommand = []\n",
            "subprocess.handlers.x.command",
        ),
        (
            "[subprocess.warm]\nlanguages = [\"shell\"]\n",
            "subprocess.warm.languages",
        ),
        ("[subprocess.warm]\nmax_turns = 0\n", "subprocess.warm"),
        (
            "[container.runners]\nlanguages = [\"shell\"]\n",
            "container.runners.languages",
        ),
        (
            "[container.runners]\nmax_rss_bytes = 1\n",
            "container.runners",
        ),
    ] {
        let e = PaddockConfig::from_toml_str(doc).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig, "{doc}");
        assert!(e.message.contains(field), "{doc}: {e}");
    }
}

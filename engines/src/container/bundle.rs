//! The OCI bundle of one container: `config.json` (runtime spec 1.0.2) over a
//! read-only root filesystem.

use std::path::Path;

use serde_json::{json, Value};

/// The `PATH` inside containers.
pub(crate) const CONTAINER_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Where the sandbox workdir is mounted inside.
pub(crate) const WORKSPACE: &str = "/workspace";

/// Syscalls the seccomp profile refuses with `EPERM`: namespace and mount changes,
/// tracing other processes, the kernel keyring, eBPF, perf, module loading, kexec,
/// handle-based opens, userfaultfd, io_uring, and clock or host administration.
pub(crate) const DENIED_SYSCALLS: &[&str] = &[
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",
    "name_to_handle_at",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
];

/// `CLONE_NEWUSER`: a user namespace would hand the process a full capability set
/// inside it, so `clone` with this flag is refused too.
const CLONE_NEWUSER: u64 = 0x1000_0000;

/// The seccomp profile: allow by default, refuse [`DENIED_SYSCALLS`] and `clone`
/// with `CLONE_NEWUSER`; `clone3` answers `ENOSYS`, so that libc falls back to
/// `clone`, whose flags the filter can see.
///
/// On gVisor (`runsc`, with `user_space_kernel`) the `clone3` rule is left out: its
/// kernel has no `clone3` and answers `ENOSYS` itself, and its seccomp answers every
/// refusal with `EPERM` whatever `errnoRet` says, which would stop libc from falling
/// back (no thread could start).
pub(crate) fn seccomp_profile(user_space_kernel: bool) -> Value {
    let mut rules = vec![
        json!({"names": DENIED_SYSCALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM}),
        json!({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM,
         "args": [{"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}]}),
    ];
    if !user_space_kernel {
        rules.push(
            json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS}),
        );
    }
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": rules,
    })
}

/// What one container runs and under which limits.
#[derive(Debug, Clone)]
pub(crate) struct BundleSpec<'a> {
    pub(crate) args: &'a [String],
    pub(crate) env: &'a [String],
    pub(crate) cwd: &'a str,
    pub(crate) rootfs: &'a Path,
    /// Whether `rootfs` is the generated one, whose `/usr` and `/etc` are bound from
    /// the host.
    pub(crate) host_usr: bool,
    pub(crate) workdir: &'a Path,
    /// Where the workdir is mounted inside (`/workspace`, or the sandbox's home).
    pub(crate) home: &'a str,
    /// Extra read-only file mounts: (host file, path inside).
    pub(crate) files: &'a [(String, String)],
    pub(crate) cgroups_path: &'a str,
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) pids: Option<u64>,
    pub(crate) cpu_quota_us: u64,
    /// rlimits as (OCI name, soft, hard).
    pub(crate) rlimits: &'a [(&'static str, u64, u64)],
    pub(crate) seccomp: bool,
    pub(crate) hostname: &'a str,
    /// A user namespace mapping uid and gid 0 to `size - 1` inside onto the host ids
    /// `first` and up: (first, size).
    pub(crate) ids: Option<(u32, u32)>,
    /// Whether the runtime is gVisor's (see [`seccomp_profile`]).
    pub(crate) user_space_kernel: bool,
    /// A network namespace to join (an allowlist's gateway's, as a path the
    /// runtime can open) instead of a new, empty one.
    pub(crate) netns: Option<&'a str>,
}

/// The capabilities a container keeps (bounding, effective, permitted): the three of
/// crun's default spec. No `CAP_SYS_ADMIN`, `CAP_NET_RAW`, `CAP_SYS_PTRACE`,
/// `CAP_DAC_OVERRIDE`, …
const CAPABILITIES: &[&str] = &["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"];

/// Paths of `/proc` and `/sys` that read host information or control the kernel:
/// masked (an empty file or directory over them).
const MASKED: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/sysrq-trigger",
    "/sys/firmware",
    // Secrets of the host's /etc, which the default root binds (read-only) and which
    // the container's uid 0 could otherwise read.
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/security/opasswd",
    "/etc/paddock",
];

const READONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The runtime spec for `spec`.
pub(crate) fn config(spec: &BundleSpec<'_>) -> Value {
    // Not recursive: `ro` would hold for the top mount only, and mounts below the
    // host's /etc or /usr (a bound resolv.conf, say) would stay writable.
    let bind_ro = |src: &str, dst: &str| {
        json!({"destination": dst, "type": "bind", "source": src,
               "options": ["bind", "ro", "nosuid", "nodev"]})
    };
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc",
               "options": ["nosuid", "noexec", "nodev"]}),
        // The standard devices and links take no data: 1 MiB bounds what a program
        // can store there (charged to its memory cgroup like any tmpfs page).
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=1024k"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
    ];
    if !spec.user_space_kernel {
        // The IPC namespace's POSIX message queues, which can be listed only through
        // a mount: the agent's reset removes what a lease left there (see the
        // `paddock_agent` crate). gVisor's agent is never asked to reset.
        mounts.push(
            json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                           "options": ["nosuid", "noexec", "nodev"]}),
        );
    }
    if spec.host_usr {
        mounts.push(bind_ro("/usr", "/usr"));
        mounts.push(bind_ro("/etc", "/etc"));
    }
    mounts.push(
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                       "options": ["nosuid", "nodev", "mode=1777", "size=262144k"]}),
    );
    mounts.push(json!({"destination": spec.home, "type": "bind",
                       "source": spec.workdir.to_string_lossy(),
                       "options": ["rbind", "rw", "nosuid", "nodev"]}));
    for (src, dst) in spec.files {
        mounts.push(bind_ro(src, dst));
    }
    if spec.host_usr && spec.user_space_kernel {
        // runsc leaves `maskedPaths` below a bind mount unmasked (it read the host's
        // /etc/shadow): the secrets of the host's /etc are covered by mounts instead,
        // /dev/null over a file, an empty read-only tmpfs over a directory.
        for path in MASKED.iter().filter(|p| p.starts_with("/etc/")) {
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.is_dir() => mounts.push(json!({"destination": path, "type": "tmpfs",
                    "source": "tmpfs", "options": ["ro", "nosuid", "nodev", "noexec", "size=4k"]})),
                Ok(m) if m.is_file() => mounts.push(bind_ro("/dev/null", path)),
                _ => {}
            }
        }
    }

    let mut resources = json!({
        "devices": [{"allow": false, "access": "rwm"}],
        "cpu": {"quota": spec.cpu_quota_us, "period": 100_000u64},
    });
    if let Some(m) = spec.memory_bytes {
        // Swap equal to memory: the limit holds for memory and swap together.
        resources["memory"] = json!({"limit": m, "swap": m});
    }
    if let Some(p) = spec.pids {
        resources["pids"] = json!({"limit": p});
    }
    let caps: Vec<&str> = CAPABILITIES.to_vec();
    let mut namespaces = vec![
        json!({"type": "pid"}),
        match spec.netns {
            Some(path) => json!({"type": "network", "path": path}),
            None => json!({"type": "network"}),
        },
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
        json!({"type": "cgroup"}),
    ];
    if spec.ids.is_some() {
        namespaces.push(json!({"type": "user"}));
    }
    let mut linux = json!({
        "cgroupsPath": spec.cgroups_path,
        "resources": resources,
        "namespaces": namespaces,
        "maskedPaths": MASKED,
        "readonlyPaths": READONLY,
    });
    if let Some((first, size)) = spec.ids {
        let map = json!([{"containerID": 0, "hostID": first, "size": size}]);
        linux["uidMappings"] = map.clone();
        linux["gidMappings"] = map;
    }
    if spec.seccomp {
        linux["seccomp"] = seccomp_profile(spec.user_space_kernel);
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": spec.args,
            "env": spec.env,
            "cwd": spec.cwd,
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps,
                "inheritable": [], "ambient": []
            },
            "rlimits": spec.rlimits.iter().map(|(name, soft, hard)| json!({"type": name, "hard": hard, "soft": soft})).collect::<Vec<_>>(),
            "noNewPrivileges": true
        },
        "root": {"path": spec.rootfs.to_string_lossy(), "readonly": true},
        "hostname": spec.hostname,
        "mounts": mounts,
        "linux": linux,
    })
}

/// Writes `config` as the bundle's `config.json` in `dir`, readable by the runtime
/// (this process's user) alone: it holds the program's environment.
pub(crate) fn write_config(dir: &Path, config: &Value) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join("config.json"))?;
    file.write_all(&serde_json::to_vec(config)?)
}

/// The directories of the root that the bundle mounts over (besides `/usr` and
/// `/etc` of the generated root).
pub(crate) const MOUNT_POINTS: &[&str] = &["proc", "dev", "tmp", "workspace"];

/// Makes the mount points missing from a root filesystem of the operator's
/// (`container.rootfs`), as the runtime itself would without a user namespace: under
/// the mapping, the container's root cannot create them in a directory of the host's
/// root. Failures are left for the runtime to report.
pub(crate) fn prepare_mount_points(rootfs: &Path) {
    for d in MOUNT_POINTS {
        let path = rootfs.join(d);
        if std::fs::symlink_metadata(&path).is_err() {
            let _ = std::fs::create_dir(&path);
        }
    }
}

/// Creates the generated root filesystem under `dir`: empty mount points and the
/// merged-`/usr` links (`bin`, `lib`, `lib64`, `sbin` → `usr/…`).
pub(crate) fn generate_rootfs(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for d in [
        "usr",
        "etc",
        "tmp",
        "proc",
        "dev",
        "sys",
        "workspace",
        "run",
    ] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        let path = dir.join(link);
        if std::fs::symlink_metadata(&path).is_err() {
            std::os::unix::fs::symlink(target, &path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(args: &'a [String], rootfs: &'a Path) -> BundleSpec<'a> {
        BundleSpec {
            args,
            env: &[],
            cwd: "/workspace",
            rootfs,
            host_usr: true,
            workdir: Path::new("/srv/w"),
            home: WORKSPACE,
            files: &[],
            cgroups_path: "/paddock-ct-1-0/sb/c1",
            memory_bytes: Some(64 << 20),
            pids: Some(32),
            cpu_quota_us: 50_000,
            rlimits: &[("RLIMIT_CPU", 2, 3)],
            seccomp: true,
            hostname: "paddock",
            ids: None,
            user_space_kernel: false,
            netns: None,
        }
    }

    #[test]
    fn the_spec_holds_the_isolation_the_engine_promises() {
        let args = vec!["/bin/true".to_string()];
        let c = config(&spec(&args, Path::new("/r")));
        let ns: Vec<&str> = c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        for want in ["pid", "network", "ipc", "uts", "mount", "cgroup"] {
            assert!(ns.contains(&want), "{ns:?}");
        }
        assert_eq!(c["root"]["readonly"], true);
        assert_eq!(c["process"]["noNewPrivileges"], true);
        assert_eq!(
            c["linux"]["resources"]["memory"],
            json!({"limit": 64 << 20, "swap": 64 << 20})
        );
        assert_eq!(c["linux"]["resources"]["pids"]["limit"], 32);
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 50_000);
        assert_eq!(c["linux"]["cgroupsPath"], "/paddock-ct-1-0/sb/c1");
        let caps = c["process"]["capabilities"]["bounding"].as_array().unwrap();
        assert!(!caps.iter().any(|c| c == "CAP_SYS_ADMIN"), "{caps:?}");
        let denied = c["linux"]["seccomp"]["syscalls"][0]["names"]
            .as_array()
            .unwrap();
        for must in [
            "unshare",
            "mount",
            "ptrace",
            "keyctl",
            "bpf",
            "perf_event_open",
        ] {
            assert!(denied.iter().any(|n| n == must), "{must} not denied");
        }
        let mounts = c["mounts"].as_array().unwrap();
        let usr = mounts.iter().find(|m| m["destination"] == "/usr").unwrap();
        assert!(usr["options"].as_array().unwrap().iter().any(|o| o == "ro"));
        let ws = mounts
            .iter()
            .find(|m| m["destination"] == WORKSPACE)
            .unwrap();
        assert_eq!(ws["source"], "/srv/w");
        // POSIX message queues are listed where the agent's reset finds them; not
        // on gVisor, whose agent is never asked to reset.
        let mqueue = |c: &Value| {
            c["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["destination"] == "/dev/mqueue" && m["type"] == "mqueue")
        };
        assert!(mqueue(&c));
        let mut gvisor = spec(&args, Path::new("/r"));
        gvisor.user_space_kernel = true;
        assert!(!mqueue(&config(&gvisor)));
    }

    #[test]
    fn without_seccomp_or_limits_the_spec_says_so() {
        let args = vec!["/bin/true".to_string()];
        let mut s = spec(&args, Path::new("/r"));
        s.seccomp = false;
        s.memory_bytes = None;
        s.pids = None;
        let c = config(&s);
        assert!(c["linux"].get("seccomp").is_none());
        assert!(c["linux"]["resources"].get("memory").is_none());
        assert!(c["linux"]["resources"].get("pids").is_none());
    }

    #[test]
    fn a_user_namespace_maps_root_to_the_sandbox_range() {
        let args = vec!["/bin/true".to_string()];
        let c = config(&spec(&args, Path::new("/r")));
        assert!(c["linux"].get("uidMappings").is_none());
        assert!(!c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "user"));
        let mut s = spec(&args, Path::new("/r"));
        s.ids = Some((2_000_065_536, 65536));
        let c = config(&s);
        assert!(c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "user"));
        let want = json!([{"containerID": 0, "hostID": 2_000_065_536u32, "size": 65536}]);
        assert_eq!(c["linux"]["uidMappings"], want);
        assert_eq!(c["linux"]["gidMappings"], want);
        // Still root inside, and still no nested user namespaces.
        assert_eq!(c["process"]["user"]["uid"], 0);
        let clone = &c["linux"]["seccomp"]["syscalls"][1];
        assert_eq!(clone["names"], json!(["clone"]));
        assert_eq!(clone["args"][0]["value"], CLONE_NEWUSER);
    }

    #[test]
    fn on_gvisor_the_host_secrets_are_covered_by_mounts() {
        let args = vec!["/bin/true".to_string()];
        let mut s = spec(&args, Path::new("/r"));
        let over = |c: &Value, dst: &str| {
            c["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["destination"] == dst)
        };
        // Only where the host has the file: /etc/passwd is not a secret, and every
        // Debian host has /etc/shadow.
        assert!(!over(&config(&s), "/etc/shadow"));
        s.user_space_kernel = true;
        let c = config(&s);
        assert!(over(&c, "/etc/shadow"), "{c}");
        assert!(!over(&c, "/etc/passwd"));
    }

    #[test]
    fn on_gvisor_clone3_is_left_to_its_kernel() {
        let names = |p: &Value| -> Vec<String> {
            p["syscalls"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r["names"].as_array().unwrap().clone())
                .map(|n| n.as_str().unwrap().to_string())
                .collect()
        };
        let host = names(&seccomp_profile(false));
        let gvisor = names(&seccomp_profile(true));
        assert!(host.iter().any(|n| n == "clone3"));
        assert!(!gvisor.iter().any(|n| n == "clone3"));
        for must in ["clone", "unshare", "setns", "mount", "ptrace"] {
            assert!(gvisor.iter().any(|n| n == must), "{must}");
        }
    }
}

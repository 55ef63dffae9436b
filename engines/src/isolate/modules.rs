//! Host modules an isolate may import, and the names it may never import.
//!
//! A script imports only what the host registered: JSON exports, Rust host functions
//! (JSON in, JSON out) or ES module source, plus the built-in `sandbox:fs`. Node's
//! system modules (`fs`, `net`, `child_process`, …) are refused with
//! `BLOCKED_MODULE`, both when someone registers them and when a script imports them;
//! a `node:` prefix or a subpath (`fs/promises`) does not get around the list.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use paddock_core::{Error, ErrorCode, Result};

/// Module names that are never available in an isolate.
pub const DENYLIST: &[&str] = &[
    "fs",
    "net",
    "child_process",
    "cluster",
    "dgram",
    "dns",
    "http",
    "https",
    "http2",
    "tls",
    "worker_threads",
    "process",
    "os",
    "path",
    "readline",
    "repl",
    "vm",
];

/// The built-in module that reads and writes the sandbox workdir.
pub const SANDBOX_FS: &str = "sandbox:fs";

/// Longest module or export name accepted.
const MAX_NAME: usize = 128;

/// A Rust function a script can call: JSON arguments in, a JSON value or an error
/// message (thrown as a JS `Error`) out.
pub type HostFn = Arc<
    dyn Fn(Vec<serde_json::Value>) -> std::result::Result<serde_json::Value, String> + Send + Sync,
>;

/// One export of a host module.
#[derive(Clone)]
pub(crate) enum Export {
    /// A JSON value.
    Value(serde_json::Value),
    /// A host function.
    Function(HostFn),
}

/// What a registered module is made of.
#[derive(Clone)]
pub(crate) enum ModuleBody {
    /// Named exports built by the host; the default export is an object of all of them.
    Host(BTreeMap<String, Export>),
    /// ES module source, compiled when the module is registered.
    Source(String),
}

/// The modules an isolate engine offers its scripts. Cheap to clone.
#[derive(Clone, Default)]
pub struct HostModules {
    pub(crate) modules: BTreeMap<String, ModuleBody>,
}

impl fmt::Debug for HostModules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostModules")
            .field("names", &self.modules.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl HostModules {
    /// No modules besides `sandbox:fs`.
    pub fn new() -> HostModules {
        HostModules::default()
    }

    /// Registers a module whose named exports are the fields of `exports`, a JSON
    /// object; its default export is the whole object.
    pub fn json(&mut self, name: &str, exports: serde_json::Value) -> Result<&mut Self> {
        check_name(name)?;
        let serde_json::Value::Object(map) = exports else {
            return Err(invalid(
                name,
                format!(
                    "its exports must be a JSON object of named exports, not {}",
                    json_kind(&exports)
                ),
            ));
        };
        let mut built = BTreeMap::new();
        for (export, value) in map {
            check_export(name, &export)?;
            built.insert(export, Export::Value(value));
        }
        self.merge(name, built)
    }

    /// Adds a host function `export` to module `name`, creating the module if needed.
    pub fn function<F>(&mut self, name: &str, export: &str, f: F) -> Result<&mut Self>
    where
        F: Fn(Vec<serde_json::Value>) -> std::result::Result<serde_json::Value, String>
            + Send
            + Sync
            + 'static,
    {
        check_name(name)?;
        check_export(name, export)?;
        let mut built = BTreeMap::new();
        built.insert(export.to_string(), Export::Function(Arc::new(f)));
        self.merge(name, built)
    }

    /// Registers ES module source. It is compiled now, so a syntax error is an
    /// `INVALID_MODULE` here rather than a failure in some later execution.
    pub fn source(&mut self, name: &str, source: &str) -> Result<&mut Self> {
        check_name(name)?;
        if self.modules.contains_key(name) {
            return Err(invalid(name, "a module of that name is already registered"));
        }
        super::js::compile_module(name, source)
            .map_err(|message| invalid(name, format!("its source does not compile: {message}")))?;
        self.modules
            .insert(name.to_string(), ModuleBody::Source(source.to_string()));
        Ok(self)
    }

    /// The registered module names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.modules.keys().map(String::as_str)
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.modules.contains_key(name)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&ModuleBody> {
        self.modules.get(name)
    }

    fn merge(&mut self, name: &str, exports: BTreeMap<String, Export>) -> Result<&mut Self> {
        match self.modules.get_mut(name) {
            None => {
                self.modules
                    .insert(name.to_string(), ModuleBody::Host(exports));
            }
            Some(ModuleBody::Source(_)) => {
                return Err(invalid(name, "it is registered as ES module source"));
            }
            Some(ModuleBody::Host(existing)) => {
                for (export, value) in exports {
                    if existing.contains_key(&export) {
                        return Err(invalid(name, format!("it already exports `{export}`")));
                    }
                    existing.insert(export, value);
                }
            }
        }
        Ok(self)
    }
}

/// The denylisted module `specifier` refers to, if any: `fs`, `node:fs` and
/// `fs/promises` all name `fs`.
pub fn blocked(specifier: &str) -> Option<&'static str> {
    let bare = specifier.strip_prefix("node:").unwrap_or(specifier);
    let base = bare.split('/').next().unwrap_or(bare);
    DENYLIST.iter().copied().find(|d| *d == base)
}

/// The error a script gets for importing a blocked module.
pub(crate) fn blocked_error(specifier: &str, base: &str) -> Error {
    Error::new(
        ErrorCode::BlockedModule,
        format!(
            "the script imports `{specifier}`: module `{base}` is never available in an isolate; remove the import (files are in `{SANDBOX_FS}`)"
        ),
    )
}

fn check_name(name: &str) -> Result<()> {
    if let Some(base) = blocked(name) {
        return Err(Error::new(
            ErrorCode::BlockedModule,
            format!("module `{name}` cannot be registered: `{base}` is on the isolate denylist"),
        ));
    }
    if name == SANDBOX_FS {
        return Err(invalid(
            name,
            "the name is reserved for the built-in module",
        ));
    }
    if name.is_empty()
        || name.len() > MAX_NAME
        || name.starts_with('.')
        || name.starts_with('/')
        || name.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(invalid(
            name,
            format!("a module name is 1 to {MAX_NAME} characters without spaces or control characters, and does not start with `.` or `/`"),
        ));
    }
    Ok(())
}

fn check_export(module: &str, export: &str) -> Result<()> {
    let mut chars = export.chars();
    let ident = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    if !ident || export.len() > MAX_NAME {
        return Err(invalid(
            module,
            format!("export `{export}` is not a JavaScript identifier"),
        ));
    }
    if export == "default" {
        return Err(invalid(
            module,
            "`default` is the object of all exports and cannot be set on its own",
        ));
    }
    Ok(())
}

fn invalid(name: &str, problem: impl fmt::Display) -> Error {
    Error::new(
        ErrorCode::InvalidModule,
        format!("module `{name}` is invalid: {problem}"),
    )
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn denylisted_names_are_refused_in_every_spelling() {
        for name in ["fs", "node:fs", "fs/promises", "node:child_process", "vm"] {
            assert!(blocked(name).is_some(), "{name}");
            let err = HostModules::new().json(name, json!({})).unwrap_err();
            assert_eq!(err.code, ErrorCode::BlockedModule, "{name}");
        }
        for name in ["fsx", "lodash", "sandbox:fs", "my/fs"] {
            assert!(blocked(name).is_none(), "{name}");
        }
    }

    #[test]
    fn malformed_modules_are_invalid() {
        let mut m = HostModules::new();
        let code = |r: Result<&mut HostModules>| r.map(|_| ()).unwrap_err().code;
        assert_eq!(code(m.json("cfg", json!([1, 2]))), ErrorCode::InvalidModule);
        assert_eq!(
            code(m.json("cfg", json!({"not-ident": 1}))),
            ErrorCode::InvalidModule
        );
        assert_eq!(
            code(m.json("cfg", json!({"default": 1}))),
            ErrorCode::InvalidModule
        );
        assert_eq!(code(m.json("", json!({}))), ErrorCode::InvalidModule);
        assert_eq!(code(m.json("./rel", json!({}))), ErrorCode::InvalidModule);
        assert_eq!(
            code(m.json(SANDBOX_FS, json!({}))),
            ErrorCode::InvalidModule
        );
        assert_eq!(
            code(m.source("bad", "export const = 1;")),
            ErrorCode::InvalidModule
        );
        m.json("cfg", json!({"a": 1})).unwrap();
        assert_eq!(
            code(m.json("cfg", json!({"a": 2}))),
            ErrorCode::InvalidModule
        );
        m.function("cfg", "twice", |args| {
            Ok(args.into_iter().next().unwrap_or_default())
        })
        .unwrap();
        m.source("lib", "export const x = 1;").unwrap();
        assert_eq!(
            code(m.json("lib", json!({"y": 1}))),
            ErrorCode::InvalidModule
        );
        assert_eq!(m.names().collect::<Vec<_>>(), ["cfg", "lib"]);
    }
}

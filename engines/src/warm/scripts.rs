//! The built-in warm runners (Python, Node): their scripts, written where an
//! engine's runners read them.

use std::path::PathBuf;

use paddock_core::{Error, Language, Result};

/// The Python runner, written next to the engine's workdirs when warm mode is on.
const PYTHON_RUNNER: &str = include_str!("runners/python.py");
/// The Node runner, likewise.
const NODE_RUNNER: &str = include_str!("runners/node.js");

/// The built-in runner of `lang`: its file name and text.
fn runner_script(lang: Language) -> Option<(&'static str, &'static str)> {
    match lang {
        Language::Python => Some(("python.py", PYTHON_RUNNER)),
        Language::Javascript => Some(("node.js", NODE_RUNNER)),
        _ => None,
    }
}

/// Writes the built-in runners of `languages` under `dir`, readable by everyone (a
/// container's root of any user namespace reads them through a bind): each
/// language and its script's path. `INVALID_CONFIG` naming `field` for a language
/// without one.
pub(crate) fn write_runners(
    languages: &[Language],
    dir: &std::path::Path,
    field: &str,
) -> Result<Vec<(Language, PathBuf)>> {
    use std::os::unix::fs::PermissionsExt;
    let mut scripts = Vec::new();
    for lang in languages {
        let Some((name, text)) = runner_script(*lang) else {
            return Err(Error::invalid_config(
                field,
                format!("there is no built-in warm runner for {lang}"),
            ));
        };
        scripts.push((*lang, name, text));
    }
    let write = || -> std::io::Result<Vec<(Language, PathBuf)>> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        scripts
            .iter()
            .map(|(lang, name, text)| {
                let path = dir.join(name);
                std::fs::write(&path, text)?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
                Ok((*lang, path))
            })
            .collect()
    };
    write().map_err(|e| Error::engine_io("writing the warm runners", e))
}

//! The json-stdio handler the handler cases invoke.
//!
//! An engine under test that runs `Invoke` handlers and advertises the `suspend`
//! feature registers this script under [`HANDLER_NAME`], started with `python3`
//! (see [`handler_command`]). It is long-running and answers by `input.op`:
//! `echo` returns its input, `suspend` suspends on `conformance-<id>` and returns
//! `{"resumed": <value>}` when resumed, `die-mid-frame` writes half a frame and exits.

use std::path::Path;

/// The handler name the cases invoke.
pub const HANDLER_NAME: &str = "paddock-conformance-handler";

/// The handler's source (Python 3, standard library only).
pub const HANDLER_SCRIPT: &str = r#"
import json, os, sys
def send(frame):
    sys.stdout.write(json.dumps(dict({"v": 1}, **frame)) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    frame = json.loads(line)
    fid = frame["id"]
    if frame["kind"] == "invoke":
        op = (frame.get("input") or {}).get("op")
        if op == "echo":
            send({"kind": "output", "id": fid, "output": frame["input"]})
        elif op == "suspend":
            send({"kind": "suspend", "id": fid, "token_id": "conformance-" + fid})
        elif op == "die-mid-frame":
            sys.stdout.write('{"v":1,"kind":"output","id":"' + fid + '","output":')
            sys.stdout.flush()
            os._exit(1)
        else:
            send({"kind": "error", "id": fid, "error": {"code": "BAD_INPUT", "message": "unknown op"}})
    elif frame["kind"] == "resume":
        send({"kind": "output", "id": fid, "output": {"resumed": frame["value"]}})
"#;

/// Writes [`HANDLER_SCRIPT`] into `dir` and returns the command that starts it.
pub fn handler_command(dir: &Path) -> std::io::Result<Vec<String>> {
    let path = dir.join("paddock-conformance-handler.py");
    std::fs::write(&path, HANDLER_SCRIPT)?;
    Ok(vec![
        "python3".to_string(),
        path.to_string_lossy().into_owned(),
    ])
}

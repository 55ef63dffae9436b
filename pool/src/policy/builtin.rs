//! The built-in JavaScript rules.
//!
//! Each pattern is a regular expression over the source text (the `regex` crate:
//! no look-around, so a "not preceded by an identifier character" test consumes that
//! character). They catch the obvious spellings only; see the module docs of
//! [`crate::policy`] for what they cannot see.

use paddock_core::Language;

use super::{Rule, RuleAction, RuleTarget};

/// Start of an identifier: the text start or a character that cannot be part of a
/// JavaScript identifier, so `myeval` and `$process` do not count as `eval` and
/// `process`.
const ID_START: &str = r"(?:^|[^\w$])";

/// What follows an identifier used as a value: a member access, a call, or the end
/// of an expression (`= require;`, `f(eval)`, `[require]`, `{ eval }`).
const USED_AS_VALUE: &str = r"\s*(?:\?\.|\.|\[|\(|[;,)\]}])";

/// [`USED_AS_VALUE`] without the call: `process(data)` calls a function of the
/// program's own, since the `process` object is not callable.
const USED_AS_OBJECT: &str = r"\s*(?:\?\.|\.|\[|[;,)\]}])";

fn js_rule(name: &str, action: RuleAction, pattern: String, message: &str) -> Rule {
    Rule {
        name: name.to_owned(),
        language: Some(Language::Javascript),
        target: RuleTarget::Code,
        pattern,
        action,
        message: message.to_owned(),
    }
}

/// The built-in rules, in the order they are checked. All apply to JavaScript code
/// only. Any of them can be turned off with [`PolicyConfig::disable`].
///
/// | rule | action | catches |
/// |---|---|---|
/// | `block-process` | block | `process.exit(1)`, `process["env"]`, `x = process;` |
/// | `block-require` | block | `require('fs')`, `require.resolve`, `r = require;` |
/// | `block-import-dynamic` | block | `import('x')` (not static `import … from`) |
/// | `block-eval` | block | `eval("1")`, `(0, eval)(s)` |
/// | `block-function-constructor` | block | `new Function("…")`, `Function("…")` |
/// | `block-global-this` | block | `globalThis` in any position |
/// | `block-proto-access` | block | `__proto__` in any position |
/// | `block-constructor-access` | block | `x.constructor`, `x["constructor"]` |
/// | `warn-while-true` | warn | `while (true)`, `while (1)` |
/// | `warn-infinite-for` | warn | `for (;;)`, `for (let i = 0; ; i++)` |
///
/// [`PolicyConfig::disable`]: super::PolicyConfig::disable
pub fn builtin_rules() -> Vec<Rule> {
    use RuleAction::{Block, Warn};
    vec![
        js_rule(
            "block-process",
            Block,
            format!("{ID_START}process{USED_AS_OBJECT}"),
            "the `process` object is not available to sandboxed code",
        ),
        js_rule(
            "block-require",
            Block,
            format!("{ID_START}require{USED_AS_VALUE}"),
            "`require` is not available to sandboxed code",
        ),
        js_rule(
            "block-import-dynamic",
            Block,
            // A preceding `.` is a method named `import`, not the operator.
            r"(?:^|[^\w$.])import\s*\(".to_owned(),
            "dynamic `import()` is not available to sandboxed code",
        ),
        js_rule(
            "block-eval",
            Block,
            format!("{ID_START}eval{USED_AS_VALUE}"),
            "`eval` is not available to sandboxed code",
        ),
        js_rule(
            "block-function-constructor",
            Block,
            // `Function(…)`, `new Function(…)` and the tagged template form.
            r"(?:^|[^\w$.])Function\s*[(`]".to_owned(),
            "the `Function` constructor is not available to sandboxed code",
        ),
        js_rule(
            "block-global-this",
            Block,
            r"(?:^|[^\w$])globalThis(?:[^\w$]|$)".to_owned(),
            "`globalThis` is not available to sandboxed code",
        ),
        js_rule(
            "block-proto-access",
            Block,
            "__proto__".to_owned(),
            "`__proto__` access is not allowed",
        ),
        js_rule(
            "block-constructor-access",
            Block,
            r#"\.\s*constructor(?:[^\w$]|$)|\[\s*["'`]constructor["'`]\s*\]"#.to_owned(),
            "`.constructor` access is not allowed",
        ),
        js_rule(
            "warn-while-true",
            Warn,
            r"(?:^|[^\w$])while\s*\(\s*(?:true|1)\s*\)".to_owned(),
            "`while (true)` runs until the timeout unless it breaks",
        ),
        js_rule(
            "warn-infinite-for",
            Warn,
            r"(?:^|[^\w$])for\s*\([^;()]*;\s*;[^)]*\)".to_owned(),
            "a `for` loop without a condition runs until the timeout unless it breaks",
        ),
    ]
}

//! The policy stage: built-in JavaScript rules, custom rules, the length cap, config
//! validation and the cost of a check.

use std::time::Instant;

use paddock_core::{Error, ErrorCode, Language, Program};
use paddock_pool::policy::{
    builtin_rules, Policy, PolicyConfig, PolicyRefusal, Rule, RuleAction, RuleTarget,
    MAX_CODE_LENGTH_RULE,
};

fn js(source: &str) -> Program {
    Program::code(Language::Javascript, source)
}

fn blocked_by(policy: &Policy, program: &Program) -> String {
    match policy.check(program) {
        Ok(w) => panic!("{program:?} passed with warnings {w:?}"),
        Err(refusal) => {
            assert_eq!(refusal.error.code, ErrorCode::CodeBlocked, "{refusal}");
            assert!(
                refusal
                    .error
                    .message
                    .starts_with(&format!("blocked by rule {}: ", refusal.rule)),
                "{}",
                refusal.error.message
            );
            refusal.rule
        }
    }
}

fn custom(name: &str, language: Option<Language>, pattern: &str, action: RuleAction) -> Rule {
    Rule {
        name: name.into(),
        language,
        target: RuleTarget::Code,
        pattern: pattern.into(),
        action,
        message: String::new(),
    }
}

#[test]
fn builtin_rules_catch_the_obvious_forms() {
    let policy = Policy::default();
    let cases = [
        ("process.exit(1)", "block-process"),
        ("process . exit(1)", "block-process"),
        ("const e = process[\"env\"]", "block-process"),
        ("const { env } = process;", "block-process"),
        ("console.log(process)", "block-process"),
        ("process?.exit()", "block-process"),
        ("require('fs')", "block-require"),
        ("const fs = require (\"fs\")", "block-require"),
        ("const r = require;", "block-require"),
        ("require.resolve('x')", "block-require"),
        ("import('x')", "block-import-dynamic"),
        ("await import (\"./m.js\")", "block-import-dynamic"),
        ("eval(\"1\")", "block-eval"),
        ("(0, eval)(\"1\")", "block-eval"),
        ("const e = eval;", "block-eval"),
        ("new Function(\"return 1\")", "block-function-constructor"),
        ("Function(\"return 1\")()", "block-function-constructor"),
        ("Function`return 1`", "block-function-constructor"),
        ("globalThis.x = 1", "block-global-this"),
        ("const g = globalThis", "block-global-this"),
        ("obj.__proto__", "block-proto-access"),
        ("obj[\"__proto__\"] = {}", "block-proto-access"),
        ("x.constructor", "block-constructor-access"),
        (
            "x.constructor.constructor('return this')()",
            "block-constructor-access",
        ),
        ("x[\"constructor\"]", "block-constructor-access"),
        ("x['constructor']", "block-constructor-access"),
        ("x[ `constructor` ]", "block-constructor-access"),
        ("x?.constructor", "block-constructor-access"),
    ];
    for (source, rule) in cases {
        assert_eq!(blocked_by(&policy, &js(source)), rule, "{source}");
    }
}

#[test]
fn innocent_code_passes() {
    let policy = Policy::default();
    for source in [
        "const processed = 1",
        "function process(items) { return items.length }\nprocess([1, 2])",
        "const processor = { run() {} }; processor.run()",
        "myeval(1)",
        "const evaluate = (x) => x; evaluate(2)",
        "const requirement = 'x'",
        "const requirements = [requirement]",
        "class A { constructor(x) { this.x = x } }",
        "const constructorName = 'A'",
        "const Functional = 1; myFunction(2); isFunction(3)",
        "loader.import('x')",
        "import fs from './local.js'",
        "const globalThisLike = {}",
        "let $process = 1",
        "while (running) { step() }",
        "for (let i = 0; i < 10; i++) {}",
        "for (const x of xs) {}",
    ] {
        assert_eq!(policy.check(&js(source)), Ok(vec![]), "{source}");
    }
}

#[test]
fn the_limits_are_as_documented() {
    // Regexes over source text: comments and strings count, and code built at run
    // time does not. The engine is the boundary; these pin the documented behaviour.
    let policy = Policy::default();
    assert_eq!(
        blocked_by(&policy, &js("// never call eval(x)")),
        "block-eval"
    );
    assert_eq!(
        blocked_by(&policy, &js("const s = \"see x.constructor\"")),
        "block-constructor-access"
    );
    assert!(policy
        .check(&js("const k = 'constr' + 'uctor'; x[k]"))
        .is_ok());
}

#[test]
fn warnings_are_returned_once_per_rule_and_do_not_block() {
    let policy = Policy::default();
    let warnings = policy
        .check(&js(
            "while (true) { if (a) break }\nwhile(1) { if (b) break }\nfor (;;) { break }",
        ))
        .unwrap();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].starts_with("warn-while-true: "), "{warnings:?}");
    assert!(warnings[0].ends_with("(line 1)"), "{warnings:?}");
    assert!(
        warnings[1].starts_with("warn-infinite-for: "),
        "{warnings:?}"
    );
    assert!(warnings[1].ends_with("(line 3)"), "{warnings:?}");
    let w = policy
        .check(&js("for (let i = 0; ; i++) { if (i > 3) break }"))
        .unwrap();
    assert_eq!(w.len(), 1);
    assert!(w[0].starts_with("warn-infinite-for: "));
    // A block wins over a warning.
    assert_eq!(
        blocked_by(&policy, &js("while (true) { eval('1') }")),
        "block-eval"
    );
}

#[test]
fn refusal_names_the_line_and_converts_into_the_error() {
    let policy = Policy::default();
    let refusal = policy
        .check(&js("const a = 1;\nconst b = 2;\nprocess.exit(b)"))
        .unwrap_err();
    assert_eq!(refusal.rule, "block-process");
    assert!(
        refusal.error.message.ends_with("(line 3)"),
        "{}",
        refusal.error.message
    );
    assert!(
        !refusal.error.message.contains("exit(b)"),
        "the message must not echo the code"
    );
    fn stage(policy: &Policy, p: &Program) -> Result<Vec<String>, Error> {
        Ok(policy.check(p)?)
    }
    let err = stage(&policy, &js("eval('1')")).unwrap_err();
    assert_eq!(err.code, ErrorCode::CodeBlocked);
    assert!(err
        .to_string()
        .starts_with("CODE_BLOCKED: blocked by rule block-eval:"));
}

#[test]
fn javascript_rules_apply_to_javascript_code_only() {
    let policy = Policy::default();
    assert!(policy
        .check(&Program::code(Language::Python, "eval('1'); x.__proto__"))
        .is_ok());
    assert!(policy
        .check(&Program::code(Language::Shell, "echo process.exit"))
        .is_ok());
    assert!(policy
        .check(&Program::command(["node", "-e", "process.exit(1)"]))
        .is_ok());
    let invoke = Program::Invoke {
        handler: "h".into(),
        input: serde_json::json!({"code": "eval('1')"}),
    };
    assert!(policy.check(&invoke).is_ok());
}

#[test]
fn custom_rules_add_to_the_builtin_ones_and_name_their_scope() {
    let policy = Policy::new(PolicyConfig {
        custom_rules: vec![
            custom(
                "py-no-os",
                Some(Language::Python),
                r"\bimport\s+os\b",
                RuleAction::Block,
            ),
            custom("no-secrets", None, r"(?i)secret", RuleAction::Block),
            custom(
                "js-no-fetch",
                Some(Language::Javascript),
                r"\bfetch\s*\(",
                RuleAction::Warn,
            ),
            Rule {
                name: "no-curl".into(),
                language: None,
                target: RuleTarget::Command,
                pattern: r"(^| )curl( |$)".into(),
                action: RuleAction::Block,
                message: "no network fetches from commands".into(),
            },
        ],
        ..PolicyConfig::default()
    })
    .unwrap();
    let py = |s: &str| Program::code(Language::Python, s);
    assert_eq!(blocked_by(&policy, &py("import os")), "py-no-os");
    assert!(policy.check(&js("import os")).is_ok());
    assert!(policy.check(&py("import osmosis")).is_ok());
    // A rule without a language reads code in every language, not commands.
    assert_eq!(blocked_by(&policy, &py("SECRET = 1")), "no-secrets");
    assert_eq!(blocked_by(&policy, &js("let secret")), "no-secrets");
    assert_eq!(
        blocked_by(&policy, &Program::code(Language::Shell, "echo $SECRET")),
        "no-secrets"
    );
    assert!(policy.check(&Program::command(["echo", "secret"])).is_ok());
    // Command rules read the argv joined by spaces.
    let refusal = policy
        .check(&Program::command(["sh", "-c", "curl http://x"]))
        .unwrap_err();
    assert_eq!(refusal.rule, "no-curl");
    assert_eq!(
        refusal.error.message,
        "blocked by rule no-curl: no network fetches from commands (line 1)"
    );
    assert!(policy.check(&Program::command(["curlew"])).is_ok());
    // Custom warnings; built-in rules still apply before custom ones.
    let w = policy.check(&js("fetch('/x')")).unwrap();
    assert_eq!(w.len(), 1);
    assert!(
        w[0].starts_with("js-no-fetch: matches the pattern `"),
        "{w:?}"
    );
    assert_eq!(
        blocked_by(&policy, &js("eval(secret)")),
        "block-eval",
        "built-in rules come first"
    );
    assert_eq!(policy.rules().count(), builtin_rules().len() + 4);
}

#[test]
fn builtin_rules_can_be_disabled_and_replaced() {
    let config: PolicyConfig = serde_json::from_str(
        r#"{"disable": ["block-eval", "warn-while-true"],
            "custom_rules": [{"name": "block-eval", "language": "javascript",
                              "pattern": "\\beval\\s*\\(\\s*\\d", "action": "warn"}]}"#,
    )
    .unwrap();
    let policy = Policy::new(config).unwrap();
    assert_eq!(policy.check(&js("eval(x)")), Ok(vec![]));
    assert_eq!(policy.check(&js("while (true) { break }")), Ok(vec![]));
    let w = policy.check(&js("eval(1)")).unwrap();
    assert_eq!(w.len(), 1);
    assert!(w[0].starts_with("block-eval: "));
    assert_eq!(blocked_by(&policy, &js("process.exit()")), "block-process");
}

#[test]
fn code_too_long_states_the_length_and_the_cap() {
    let policy = Policy::new(PolicyConfig {
        max_code_length: 10,
        ..PolicyConfig::default()
    })
    .unwrap();
    assert!(policy
        .check(&Program::code(Language::Python, "x".repeat(10)))
        .is_ok());
    let refusal = policy
        .check(&Program::code(Language::Python, "x".repeat(11)))
        .unwrap_err();
    assert_eq!(refusal.rule, MAX_CODE_LENGTH_RULE);
    assert_eq!(refusal.error.code, ErrorCode::CodeTooLong);
    assert!(refusal.error.message.contains("11 bytes"), "{refusal}");
    assert!(
        refusal.error.message.contains("cap of 10 bytes"),
        "{refusal}"
    );
    // Length comes before rules, and commands count their joined argv.
    assert_eq!(
        policy.check(&js("process.exit(1)")).unwrap_err().error.code,
        ErrorCode::CodeTooLong
    );
    assert!(policy.check(&Program::command(["echo", "12345"])).is_ok());
    assert_eq!(
        policy
            .check(&Program::command(["echo", "123456"]))
            .unwrap_err()
            .rule,
        MAX_CODE_LENGTH_RULE
    );
    assert_eq!(Policy::default().max_code_length(), 100_000);
}

#[test]
fn bad_configs_are_refused_naming_the_field_and_rule() {
    let err = |config: PolicyConfig| -> Error { Policy::new(config).unwrap_err() };
    let with_rule = |rule: Rule| PolicyConfig {
        custom_rules: vec![custom("ok", None, "fine", RuleAction::Warn), rule],
        ..PolicyConfig::default()
    };

    let e = err(with_rule(custom(
        "bad-re",
        None,
        "(unclosed",
        RuleAction::Block,
    )));
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(e.message.contains("policy.custom_rules[1]"), "{e}");
    assert!(e.message.contains("rule `bad-re`"), "{e}");

    let e = err(with_rule(custom("empty", None, "", RuleAction::Block)));
    assert!(e.message.contains("rule `empty`"), "{e}");

    let e = err(with_rule(custom("ok", None, "x", RuleAction::Block)));
    assert!(e.message.contains("another active rule"), "{e}");

    let e = err(with_rule(custom(
        "block-eval",
        None,
        "x",
        RuleAction::Block,
    )));
    assert!(e.message.contains("disable the built-in rule"), "{e}");

    let e = err(with_rule(custom("Bad Name", None, "x", RuleAction::Block)));
    assert!(e.message.contains("lowercase"), "{e}");

    let mut command_with_language = custom("cmd", Some(Language::Shell), "x", RuleAction::Block);
    command_with_language.target = RuleTarget::Command;
    let e = err(with_rule(command_with_language));
    assert!(e.message.contains("takes no language"), "{e}");

    let e = err(with_rule(custom(
        "huge",
        None,
        r"\w{1000}\w{1000}\w{1000}",
        RuleAction::Block,
    )));
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(e.message.contains("rule `huge`"), "{e}");

    let e = err(PolicyConfig {
        disable: vec!["block-evil".into()],
        ..PolicyConfig::default()
    });
    assert!(e.message.contains("policy.disable"), "{e}");
    assert!(e.message.contains("block-evil"), "{e}");

    let e = err(PolicyConfig {
        max_code_length: 0,
        ..PolicyConfig::default()
    });
    assert!(e.message.contains("policy.max_code_length"), "{e}");

    assert!(serde_json::from_str::<PolicyConfig>(r#"{"max_code_lenght": 5}"#).is_err());
    assert!(serde_json::from_str::<PolicyConfig>(
        r#"{"custom_rules": [{"name": "x", "pattern": "y", "severity": "high"}]}"#
    )
    .is_err());
    let defaults: PolicyConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(defaults, PolicyConfig::default());
    assert_eq!(defaults.max_code_length, 100_000);
}

#[test]
fn builtin_rule_names_match_the_documented_set() {
    let names: Vec<String> = builtin_rules().into_iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        [
            "block-process",
            "block-require",
            "block-import-dynamic",
            "block-eval",
            "block-function-constructor",
            "block-global-this",
            "block-proto-access",
            "block-constructor-access",
            "warn-while-true",
            "warn-infinite-for",
        ]
    );
    for rule in builtin_rules() {
        assert_eq!(rule.language, Some(Language::Javascript));
        assert_eq!(
            rule.action == RuleAction::Warn,
            rule.name.starts_with("warn-")
        );
        assert!(!rule.message.is_empty());
    }
}

/// A realistic, innocent ~2 KB snippet: the whole text is scanned on every check.
fn snippet_2k() -> String {
    let block = r#"
// Summarise a list of orders by customer and compute running totals.
function summarise(orders) {
  const byCustomer = new Map();
  for (const order of orders) {
    const entry = byCustomer.get(order.customer) ?? { count: 0, total: 0 };
    entry.count += 1;
    entry.total += order.amount * (1 - (order.discount || 0));
    byCustomer.set(order.customer, entry);
  }
  return [...byCustomer.entries()]
    .map(([customer, { count, total }]) => ({ customer, count, total: Math.round(total * 100) / 100 }))
    .sort((a, b) => b.total - a.total);
}
"#;
    let mut out = String::new();
    while out.len() < 2048 {
        out.push_str(block);
    }
    out
}

#[test]
fn check_cost_on_a_2k_snippet() {
    let policy = Policy::default();
    let clean = js(&snippet_2k());
    let mut dirty_src = snippet_2k();
    dirty_src.push_str("\nprocess.exit(0)\n");
    let dirty = js(&dirty_src);
    assert_eq!(policy.check(&clean), Ok(vec![]));
    assert_eq!(blocked_by(&policy, &dirty), "block-process");

    let rounds = 2_000u32;
    let measure = |program: &Program| {
        let start = Instant::now();
        for _ in 0..rounds {
            let _ = std::hint::black_box(policy.check(std::hint::black_box(program)));
        }
        start.elapsed() / rounds
    };
    measure(&clean); // warm up
    let clean_cost = measure(&clean);
    let dirty_cost = measure(&dirty);
    let built = Instant::now();
    let _ = Policy::default();
    println!(
        "policy check on a {} byte snippet: {:?} when clean, {:?} when blocked; \
         Policy::default() compiles in {:?}",
        snippet_2k().len(),
        clean_cost,
        dirty_cost,
        built.elapsed()
    );
}

#[test]
fn refusal_displays_as_its_error() {
    let r = PolicyRefusal {
        rule: "x".into(),
        error: Error::new(ErrorCode::CodeBlocked, "blocked by rule x: no"),
    };
    assert_eq!(r.to_string(), "CODE_BLOCKED: blocked by rule x: no");
}

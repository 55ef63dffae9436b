//! The policy stage's settings (`[policy]`): the code length cap and the deny and
//! warn rules.

use serde::{Deserialize, Serialize};

use paddock_core::program::Language;

/// The default `max_code_length` of the policy stage.
pub const DEFAULT_MAX_CODE_LENGTH: usize = 100_000;

/// Policy settings. Every field has a default, so `{}` is the built-in policy.
///
/// ```
/// use paddock_pool::policy::PolicyConfig;
///
/// let c: PolicyConfig = serde_json::from_str(r#"{
///     "max_code_length": 20000,
///     "disable": ["warn-while-true"],
///     "custom_rules": [{
///         "name": "no-curl",
///         "target": "command",
///         "pattern": "(^| )curl( |$)",
///         "message": "no network fetches from commands"
///     }]
/// }"#).unwrap();
/// assert_eq!(c.custom_rules[0].name, "no-curl");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Longest accepted program, in bytes of UTF-8 source (or of the argv joined by
    /// spaces for a command). Default 100 000.
    pub max_code_length: usize,
    /// Names of built-in rules to turn off. Default: none. A name that is not a
    /// built-in rule is refused, so a typo cannot silently leave a rule on.
    pub disable: Vec<String>,
    /// Rules checked after the built-in ones. Default: none.
    pub custom_rules: Vec<Rule>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            max_code_length: DEFAULT_MAX_CODE_LENGTH,
            disable: Vec::new(),
            custom_rules: Vec::new(),
        }
    }
}

/// What a matching rule does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Refuse the program with `CODE_BLOCKED`. The default.
    #[default]
    Block,
    /// Run the program and add a warning to its result.
    Warn,
}

/// Which text of a program a rule reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleTarget {
    /// The source of a `Code` program. The default.
    #[default]
    Code,
    /// The argv of a `Command` program, joined by single spaces.
    Command,
}

/// One deny or warn rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// A unique name, reported in refusals and warnings: lowercase ASCII letters,
    /// digits, `-`, `_` and `.`, at most 64 characters.
    pub name: String,
    /// For `RuleTarget::Code`: the language the rule applies to; absent means every
    /// language. Must be absent for `RuleTarget::Command`.
    #[serde(default)]
    pub language: Option<Language>,
    /// What the rule reads. Default `RuleTarget::Code`.
    #[serde(default)]
    pub target: RuleTarget,
    /// A regular expression (`regex` crate syntax) searched for anywhere in the text.
    pub pattern: String,
    /// What a match does. Default `RuleAction::Block`.
    #[serde(default)]
    pub action: RuleAction,
    /// What is wrong, for the caller. Default: a mention of the pattern.
    #[serde(default)]
    pub message: String,
}

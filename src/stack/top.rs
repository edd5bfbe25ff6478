//! The stack file as a whole and its top level: the characters and sizes it may hold, the
//! stack's name (which names its state directory), `on_failure`, `timeout` and `state`. The
//! steps are read by `steps`.

use std::path::Path;
use std::time::Duration;

use rdeploy_adapters::suggest;
use rdeploy_adapters::yaml::{self, Node, Span, Spanned};
use serde::{Deserialize, Serialize};

use super::base::{parse_duration_at, Checker, TIMEOUT_BOUNDS, TOP_KEYS};

/// `on_failure:`: what a run does once a step failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    #[default]
    Stop,
    /// `--keep-going` by default: independent branches run past a failure.
    Continue,
    Revert,
}

/// The longest value a stack file may hold, in bytes: below the kernel's 128 KiB for one
/// argument or environment variable (`MAX_ARG_STRLEN`), with room for a flag or a name.
pub const MAX_VALUE_BYTES: usize = 100 * 1024;
/// The most bytes one step's values may hold in all: half the usual 2 MiB the kernel leaves
/// for a command line and environment together, the other half for rdeploy's own environment.
pub const MAX_STEP_BYTES: usize = 1024 * 1024;
/// Control characters reported one by one before the rest are counted.
const MAX_REPORTED_CHARACTERS: usize = 10;

/// Whether the text is free of the control characters YAML forbids; each one found is a
/// problem at its place.
pub(super) fn check_characters(checker: &mut Checker<'_>, text: &str) -> bool {
    // Quoted scalars are marked, so values handed to a tool keep their YAML type
    // ([`yaml::typed_json`]); serde deserializes from [`yaml::coercible`] copies, as before.
    // A NUL (or another control character YAML forbids) would end the parse early, or fail it
    // far from the character: each is reported where it is, and nothing else is read.
    let forbidden = yaml::forbidden_characters(text);
    if forbidden.is_empty() {
        return true;
    }
    {
        for (at, c) in forbidden.iter().take(MAX_REPORTED_CHARACTERS) {
            let name = if *c == '\0' {
                "a NUL byte".to_string()
            } else {
                format!("the control character U+{:04X}", *c as u32)
            };
            checker.at_location(
                Some(*at),
                format!("the stack file holds {name} here; YAML allows no control characters but tab and line breaks"),
                Some("remove it (`cat -A` shows it as `^@` or `M-`): a stack file is text".into()),
            );
        }
        if forbidden.len() > MAX_REPORTED_CHARACTERS {
            checker.at_location(
                Some(forbidden[MAX_REPORTED_CHARACTERS].0),
                format!("and {} more control characters", forbidden.len() - MAX_REPORTED_CHARACTERS),
                None,
            );
        }
    }
    false
}

/// Values too long for a tool's command line or environment, alone or a step's in all.
pub(super) fn check_sizes(checker: &mut Checker<'_>, root: &Node) {
    // Every value may reach a tool's command line or environment, where the kernel takes at
    // most 128 KiB per word and about 2 MiB for all of them (`Argument list too long`).
    let long = yaml::long_scalars(root, MAX_VALUE_BYTES);
    for (span, len) in &long {
        let (span, len) = (*span, *len);
        checker.at(
            &span,
            format!(
                "this value is {} KiB; a value in a stack file is at most {} KiB (a tool's command line or environment takes no more)",
                len.div_ceil(1024),
                MAX_VALUE_BYTES / 1024
            ),
            Some("put large content in a file beside the stack and name the file (`var_files`, `values`, a script `run` calls)".into()),
        );
    }
    // The sum is named only when no value alone was too long (that one is the thing to move).
    if let Some(steps) = root.as_mapping().and_then(|top| top.get_sequence("steps")).filter(|_| long.is_empty()) {
        for step in steps.iter() {
            let bytes = yaml::scalar_bytes(step);
            if bytes > MAX_STEP_BYTES {
                // At the step's first key (a mapping's own span starts after it).
                let at = step.as_mapping().and_then(|m| m.keys().next().map(|k| *k.span())).unwrap_or(*step.span());
                checker.at(
                    &at,
                    format!(
                        "this step's values add up to {} KiB; a step's values are at most {} KiB in all (the command line and environment of its tool)",
                        bytes.div_ceil(1024),
                        MAX_STEP_BYTES / 1024
                    ),
                    Some("move large values into files the step names".into()),
                );
            }
        }
    }
}

/// The stack's settings at the top level, besides its steps.
pub(super) struct Top {
    pub(super) name: String,
    pub(super) on_failure: OnFailure,
    pub(super) default_timeout: Option<Duration>,
    pub(super) state: Option<String>,
}

/// Reads the top level's keys; an unknown key or a bad value is a located problem (and its
/// default is read in its place).
pub(super) fn read_top(checker: &mut Checker<'_>, file: &Path, top: &yaml::MappingNode) -> Top {
    for key in top.keys() {
        if !TOP_KEYS.contains(&key.as_str()) {
            let hint = suggest(key.as_str(), TOP_KEYS).map(|s| format!("did you mean `{s}`?"));
            checker.at(key.span(), format!("unknown top-level key `{}`", key.as_str()), hint);
        }
    }
    // A top-level setting written as a list or mapping must not silently fall back to its
    // default (`on_failure: [revert]` would quietly mean `stop`).
    for key in ["name", "on_failure", "state", "timeout"] {
        if let Some(node) = top.get_node(key).filter(|n| n.as_scalar().is_none()) {
            checker.at(node.span(), format!("`{key}` must be a single value"), None);
        }
    }
    let name = match top.get_scalar("name") {
        Some(n) => {
            check_stack_name(checker, n.as_str(), Some(n.span()));
            n.as_str().to_string()
        }
        None => {
            let name = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "stack".into());
            check_stack_name(checker, &name, None);
            name
        }
    };
    let on_failure = match top.get_scalar("on_failure") {
        None => OnFailure::Stop,
        Some(v) => match v.as_str() {
            "stop" => OnFailure::Stop,
            "continue" => OnFailure::Continue,
            "revert" => OnFailure::Revert,
            other => {
                let hint = suggest(other, &["stop", "continue", "revert"]).map(|s| format!("did you mean `{s}`?"));
                checker.at(v.span(), format!("`on_failure` is `stop`, `continue` or `revert`, not `{other}`"), hint);
                OnFailure::Stop
            }
        },
    };
    let default_timeout = top.get_scalar("timeout").and_then(|t| {
        let spanned = Spanned::new(*t.span(), t.as_str().to_string());
        parse_duration_at(checker, "timeout", &spanned, TIMEOUT_BOUNDS)
    });
    let state = match top.get_scalar("state") {
        None => None,
        Some(v) if v.as_str().starts_with("postgres://") || v.as_str().starts_with("postgresql://") => {
            Some(v.as_str().to_string())
        }
        Some(v) => {
            checker.at(
                v.span(),
                "`state` is a `postgres://` URL",
                Some("leave `state` out to keep the checkpoint in the local state directory (`--state-dir`)".into()),
            );
            None
        }
    };
    Top { name, on_failure, default_timeout, state }
}

/// The longest stack name: it names a directory (`.rdeploy/NAME/`, and `.rdeploy/.moving-NAME/`
/// while an old layout moves), well below the 255 bytes a file name may take.
pub const MAX_STACK_NAME: usize = 100;

/// A stack's name names its state directory, `.rdeploy/NAME/`, beside what the shared
/// `.rdeploy/` holds itself. `span` is the `name:` value; `None` when the name is the stack
/// file's (no `name:`), which only has to make a directory of its own.
fn check_stack_name(checker: &mut Checker<'_>, name: &str, span: Option<&Span>) {
    let shown = name.escape_debug();
    let problem = if let Some(what) = crate::store::layout::reserved(name) {
        Some(format!("stack name `{shown}` is reserved: `.rdeploy/{}` is {what}", name.to_ascii_lowercase()))
    } else if name.len() > MAX_STACK_NAME {
        Some(format!("the stack name is {} bytes; at most {MAX_STACK_NAME} (it names the state directory)", name.len()))
    } else if span.is_some()
        && (name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    {
        Some(format!("stack name `{shown}` may only use letters, digits, `-` and `_`"))
    } else if span.is_none() && (name.is_empty() || name == "." || name == ".." || name.chars().any(char::is_control)) {
        Some(format!("`{shown}` cannot name a directory"))
    } else {
        None
    };
    let Some(problem) = problem else { return };
    match span {
        Some(span) => checker.at(
            span,
            problem,
            Some("the name keys the state directory (`.rdeploy/NAME/`), the checkpoint and its history: pick another, such as `shop`".into()),
        ),
        None => checker.at_location(
            None,
            format!("this stack has no `name:`, so the file's name stands for it: {problem}"),
            Some("add `name:` with letters, digits, `-` and `_`, such as `name: shop`".into()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::MAX_STACK_NAME;
    use crate::stack::{parse, problems};

    #[test]
    fn unknown_tool_and_top_key() {
        let p = problems("name: s\nstpes: []\nsteps:\n  - name: a\n    tool: terraform2\n");
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].line, p[0].column), (2, 1));
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `steps`?"));
        assert_eq!(p[1].line, 5);
        assert_eq!(p[1].hint.as_deref(), Some("did you mean `terraform`?"));
    }

    /// A stack's name names its directory in the shared `.rdeploy/`: what that directory holds
    /// itself (`fleet/`, `lock`, the old layout's files) and what cannot be a directory name are
    /// refused at the name, and without `name:`, at the top for the file's name.
    #[test]
    fn a_stack_name_that_would_collide_in_the_state_layout_is_refused() {
        let steps = "steps:\n  - name: a\n    tool: shell\n    run: x\n";
        for name in ["fleet", "lock", "Fleet", "LOCK"] {
            let p = problems(&format!("name: {name}\n{steps}"));
            assert_eq!(p.len(), 1, "{name}: {p:?}");
            assert_eq!((p[0].line, p[0].column), (1, 7), "{name}");
            assert!(
                p[0].message.starts_with(&format!("stack name `{name}` is reserved: `.rdeploy/")),
                "{}",
                p[0].message
            );
            assert!(p[0].hint.as_deref().unwrap().contains("pick another"), "{p:?}");
        }
        for name in ["\"a/b\"", "\"..\"", "\"\"", "\"a\\tb\""] {
            let p = problems(&format!("name: {name}\n{steps}"));
            assert_eq!(p.len(), 1, "{name}: {p:?}");
            assert!(p[0].message.contains("may only use letters, digits"), "{}", p[0].message);
        }
        let p = problems(&format!("name: {}\n{steps}", "a".repeat(MAX_STACK_NAME + 1)));
        assert!(p[0].message.contains("at most 100"), "{p:?}");
        assert!(parse(Path::new("fleet-app.yaml"), &format!("name: fleet-app\n{steps}")).is_ok());
        // A name the old single-stack layout used for a file is a stack's name as before.
        assert!(parse(Path::new("h.yaml"), &format!("name: history\n{steps}")).is_ok());

        // Without `name:`, the file's name is checked as a directory name.
        let p = parse(Path::new("deploy/fleet.yaml"), steps).unwrap_err().problems;
        assert_eq!((p[0].line, p[0].column), (1, 1));
        assert!(
            p[0].message.starts_with(
                "this stack has no `name:`, so the file's name stands for it: stack name `fleet` is reserved"
            ),
            "{p:?}"
        );
        assert_eq!(parse(Path::new("deploy/my.stack.yaml"), steps).unwrap().name, "my.stack");
    }
}

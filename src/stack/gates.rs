//! `gate:`: a precondition checked right before a step runs (every cluster in scope runs the
//! wanted version), its values parsed when the stack loads.

use std::path::PathBuf;
use std::time::Duration;

use rdeploy_adapters::suggest;
use rdeploy_adapters::yaml::Spanned;
use serde::Deserialize;

use super::base::{parse_duration_at, quoted, Checker, TIMEOUT_BOUNDS};
use crate::fleet::model::Kind;

/// A precondition evaluated right before a step runs. Its values are parsed when the stack
/// loads, so a bad kind, timeout or date is bad input at `validate`, not a refusal mid-deploy.
#[derive(Clone, Debug, PartialEq)]
pub struct Gate {
    pub inventory: InventoryGate,
}

/// Refuse the step unless every cluster in scope runs the wanted version.
#[derive(Clone, Debug, PartialEq)]
pub struct InventoryGate {
    pub contexts: Vec<String>,
    pub namespace: Option<String>,
    pub selector: Option<String>,
    pub image: String,
    pub version: String,
    pub kubeconfig: Option<PathBuf>,
    pub exceptions: Vec<GateException>,
    /// Only these workload kinds; all when empty.
    pub kinds: Vec<Kind>,
    /// Per-cluster time to answer before it counts as absent (`None`: the gate's default).
    pub timeout: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GateException {
    pub cluster: String,
    pub reason: String,
    /// The exception applies through the day before this date.
    pub expires: time::Date,
}

/// `gate:` as written, with the positions of the values parsed at load.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGate {
    inventory: RawInventoryGate,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInventoryGate {
    contexts: Vec<String>,
    namespace: Option<String>,
    selector: Option<String>,
    image: String,
    version: String,
    kubeconfig: Option<PathBuf>,
    #[serde(default)]
    exceptions: Vec<RawGateException>,
    #[serde(default)]
    kinds: Vec<Spanned<String>>,
    timeout: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGateException {
    cluster: String,
    reason: String,
    expires: Spanned<String>,
}

/// The gate with its values parsed; a value that does not parse is a located problem.
pub(super) fn check_gate(checker: &mut Checker<'_>, raw: RawGate) -> Gate {
    let inv = raw.inventory;
    let mut kinds = Vec::new();
    for k in &inv.kinds {
        match Kind::parse(k.as_str()) {
            Some(kind) => kinds.push(kind),
            None => {
                let names = Kind::ALL.map(Kind::name);
                let hint = suggest(k.as_str(), &names)
                    .map(|s| format!("did you mean `{s}`?"))
                    .unwrap_or_else(|| format!("use one of {}", quoted(&names)));
                checker.at(
                    k.span(),
                    format!("unknown workload kind `{}` in `gate.inventory.kinds`", k.as_str()),
                    Some(hint),
                );
            }
        }
    }
    let timeout = inv.timeout.and_then(|t| parse_duration_at(checker, "gate.inventory.timeout", &t, TIMEOUT_BOUNDS));
    let format = time::macros::format_description!("[year]-[month]-[day]");
    let exceptions = inv
        .exceptions
        .into_iter()
        .filter_map(|e| match time::Date::parse(e.expires.as_str().trim(), &format) {
            Ok(expires) => Some(GateException { cluster: e.cluster, reason: e.reason, expires }),
            Err(_) => {
                checker.at(
                    e.expires.span(),
                    format!("the exception for `{}`: `expires: {}` is not a date", e.cluster, e.expires.as_str()),
                    Some("write the date like `2026-12-31` (the exception holds until the day before)".into()),
                );
                None
            }
        })
        .collect();
    let inventory = InventoryGate {
        contexts: inv.contexts,
        namespace: inv.namespace,
        selector: inv.selector,
        image: inv.image,
        version: inv.version,
        kubeconfig: inv.kubeconfig,
        exceptions,
        kinds,
        timeout,
    };
    Gate { inventory }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::fleet::model::Kind;
    use crate::stack::{parse, problems};

    const GATED: &str = "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo\n    gate:\n      inventory:\n        contexts: [c]\n        image: r/a\n        version: \"2\"\n";

    #[test]
    fn gate_values_are_parsed_at_load() {
        let stack = parse(Path::new("stack.yaml"), &format!("{GATED}        kinds: [Deployment, daemonsets]\n        timeout: 2s\n        exceptions:\n          - {{ cluster: edge-3, reason: works, expires: 2026-06-10 }}\n")).unwrap();
        let inv = &stack.steps[0].gate.as_ref().unwrap().inventory;
        assert_eq!(inv.kinds, [Kind::Deployment, Kind::DaemonSet]);
        assert_eq!(inv.timeout, Some(Duration::from_secs(2)));
        assert_eq!(inv.exceptions[0].expires, time::macros::date!(2026 - 06 - 10));

        let p = problems(&format!("{GATED}        kinds: [Deploymnt]\n"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (11, 17));
        assert_eq!(p[0].message, "unknown workload kind `Deploymnt` in `gate.inventory.kinds`");
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `Deployment`?"));

        let p = problems(&format!("{GATED}        timeout: soon\n"));
        assert_eq!((p[0].line, p[0].column), (11, 18));
        assert!(p[0].message.starts_with("`gate.inventory.timeout: soon` is not a duration"), "{}", p[0].message);

        let p = problems(&format!(
            "{GATED}        exceptions:\n          - cluster: edge-9\n            reason: x\n            expires: not-a-date\n"
        ));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (14, 22));
        assert_eq!(p[0].message, "the exception for `edge-9`: `expires: not-a-date` is not a date");
    }
}

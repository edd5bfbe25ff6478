//! Fleet steps: a helm or kubectl step with `contexts:` or `fleet:` runs once per cluster, in
//! waves (`rollout:`), measured against `slo:`. Its scope and rollout are parsed when the stack
//! loads; `src/rollout` runs it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rdeploy_adapters::yaml::{Node, Span, Spanned};
use rdeploy_adapters::{suggest, Adapter, ToolSpec};
use serde::{Deserialize, Serialize};

use super::base::{parse_duration_at, Checker, BAKE_BOUNDS, TIMEOUT_BOUNDS};

/// A step's fleet keys as written: `contexts`, `fleet`, `selector`, `rollout`, `slo`.
pub(super) struct FleetKeys {
    pub(super) contexts: Option<Vec<String>>,
    pub(super) fleet: Option<Spanned<String>>,
    pub(super) selector: Option<Spanned<String>>,
    pub(super) rollout: Option<RolloutKeys>,
    pub(super) slo: Option<Spanned<String>>,
}

/// `rollout:` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RolloutKeys {
    #[serde(default)]
    waves: Vec<Spanned<String>>,
    parallel: Option<Spanned<String>>,
    bake: Option<Spanned<String>>,
    max_failures: Option<Spanned<String>>,
    absent: Option<Spanned<String>>,
    inventory_timeout: Option<Spanned<String>>,
}

/// A fleet step's scope and rollout, parsed when the stack loads.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetStep {
    /// Context names and globs (`edge-*`); empty with a fleet file: every cluster in it.
    pub contexts: Vec<String>,
    /// A fleet file (clusters with labels), resolved against the stack directory.
    pub fleet_file: Option<PathBuf>,
    /// A label selector over the fleet file's cluster labels (`tier=edge,site!=lab`).
    pub selector: Option<String>,
    pub rollout: Rollout,
    /// `slo: "95%@48h,100%@7d"`: completion objectives measured from the rollout's start.
    pub slo: Option<String>,
}

/// `rollout:`: cumulative waves, how many clusters at once, the bake, the stop rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rollout {
    pub waves: Vec<WaveSize>,
    pub parallel: usize,
    pub bake: Duration,
    pub max_failures: MaxFailures,
    pub absent: AbsentPolicy,
    /// How long a cluster has to answer a read before it counts as absent.
    pub inventory_timeout: Duration,
}

impl Default for Rollout {
    fn default() -> Rollout {
        Rollout {
            waves: vec![WaveSize::Percent(100.0)],
            parallel: 1,
            bake: Duration::ZERO,
            max_failures: MaxFailures::Count(0),
            absent: AbsentPolicy::Skip,
            inventory_timeout: Duration::from_secs(5),
        }
    }
}

/// One entry of `waves:`: a cumulative number of clusters, or a share of those in scope.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WaveSize {
    Count(usize),
    Percent(f64),
}

/// `max_failures:`: failed clusters tolerated before the rollout stops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MaxFailures {
    Count(usize),
    Percent(f64),
}

impl MaxFailures {
    /// The number of failures tolerated out of `total` clusters (a share rounds down).
    pub fn of(self, total: usize) -> usize {
        match self {
            MaxFailures::Count(n) => n,
            MaxFailures::Percent(p) => ((p / 100.0) * total as f64).floor() as usize,
        }
    }
}

/// `absent:`: what a wave does with a cluster that does not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AbsentPolicy {
    /// Leave it as a straggler and go on; the deploy ends partial.
    Skip,
    /// Wait for it, up to the step's `timeout`.
    Wait,
}

/// `N%` with `0 < N <= 100`.
fn parse_percent(text: &str) -> Option<f64> {
    let p: f64 = text.trim().strip_suffix('%')?.trim().parse().ok()?;
    (p > 0.0 && p <= 100.0).then_some(p)
}

/// A fleet step's `rollout:`, each value parsed; one that does not parse is a located problem
/// and its default is kept.
fn check_rollout(checker: &mut Checker<'_>, r: &RolloutKeys) -> Rollout {
    let mut out = Rollout::default();
    if !r.waves.is_empty() {
        let mut waves = Vec::new();
        for w in &r.waves {
            let text = w.as_str().trim();
            if let Some(p) = parse_percent(text) {
                waves.push(WaveSize::Percent(p));
            } else if let Some(n) = text.parse::<usize>().ok().filter(|n| *n > 0) {
                waves.push(WaveSize::Count(n));
            } else {
                checker.at(
                    w.span(),
                    format!("`rollout.waves` entry `{text}` is neither a cluster count nor a percentage"),
                    Some("waves are cumulative: `waves: [1, \"10%\", \"50%\", \"100%\"]`".into()),
                );
            }
        }
        out.waves = waves;
    }
    if let Some(p) = &r.parallel {
        match p.as_str().trim().parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => out.parallel = n,
            _ => checker.at(
                p.span(),
                format!("`rollout.parallel` is a whole number from 1 to 1000, not `{}`", p.as_str()),
                Some("it is how many clusters of a wave are applied at once".into()),
            ),
        }
    }
    if let Some(b) = &r.bake {
        if let Some(d) = parse_duration_at(checker, "rollout.bake", b, BAKE_BOUNDS) {
            out.bake = d;
        }
    }
    if let Some(t) = &r.inventory_timeout {
        if let Some(d) = parse_duration_at(checker, "rollout.inventory_timeout", t, TIMEOUT_BOUNDS) {
            out.inventory_timeout = d;
        }
    }
    if let Some(m) = &r.max_failures {
        let text = m.as_str().trim();
        if let Some(p) =
            text.strip_suffix('%').and_then(|p| p.trim().parse::<f64>().ok()).filter(|p| (0.0..=100.0).contains(p))
        {
            out.max_failures = MaxFailures::Percent(p);
        } else if let Ok(n) = text.parse::<usize>() {
            out.max_failures = MaxFailures::Count(n);
        } else {
            checker.at(
                m.span(),
                format!("`rollout.max_failures` is a number of clusters or a percentage, not `{text}`"),
                Some("`max_failures: 0` stops at the first failed cluster; `\"5%\"` tolerates one in twenty".into()),
            );
        }
    }
    if let Some(a) = &r.absent {
        match a.as_str() {
            "skip" => out.absent = AbsentPolicy::Skip,
            "wait" => out.absent = AbsentPolicy::Wait,
            other => {
                let hint = suggest(other, &["skip", "wait"]).map(|s| format!("did you mean `{s}`?"));
                checker.at(a.span(), format!("`rollout.absent` is `skip` or `wait`, not `{other}`"), hint);
            }
        }
    }
    out
}

/// A helm or kubectl step's fleet keys: `None` for a step that runs once (its fleet-only keys
/// are problems then) or when a fleet key does not parse (a located problem).
pub(super) fn check_fleet(
    checker: &mut Checker<'_>,
    dir: &Path,
    keys: FleetKeys,
    step_span: &Span,
) -> Option<FleetStep> {
    let FleetKeys { contexts, fleet, selector, rollout, slo } = keys;
    if contexts.is_none() && fleet.is_none() {
        for (key, span) in [
            ("selector", selector.as_ref().map(|s| *s.span())),
            ("rollout", rollout.as_ref().map(|_| *step_span)),
            ("slo", slo.as_ref().map(|s| *s.span())),
        ] {
            if let Some(span) = span {
                checker.at(
                    &span,
                    format!("`{key}` belongs to a fleet step, and this step has no `contexts` or `fleet`"),
                    Some("add `contexts: [edge-*]` (or `fleet: FILE`) so the step runs once per cluster".into()),
                );
            }
        }
        return None;
    }
    let before = checker.problems.len();
    let contexts = contexts.unwrap_or_default();
    if contexts.is_empty() && fleet.is_none() {
        checker.at(step_span, "`contexts` is empty", Some("name the kube contexts, or globs like `edge-*`".into()));
    }
    for c in &contexts {
        if crate::fleet::scope::is_glob(c) && glob::Pattern::new(c).is_err() {
            checker.at(step_span, format!("`contexts` entry `{c}` is not a valid glob"), None);
        }
    }
    let fleet_file = fleet.map(|f| {
        let path = dir.join(f.as_str());
        if !path.is_file() {
            checker.at(
                f.span(),
                format!("the fleet file `{}` does not exist (looked for {})", f.as_str(), path.display()),
                Some("paths are relative to the stack file's directory".into()),
            );
        }
        path
    });
    if let Some(sel) = &selector {
        if fleet_file.is_none() {
            checker.at(
                sel.span(),
                "`selector` picks clusters by their labels in a fleet file, and this step has no `fleet`",
                Some("add `fleet: fleet.yaml` (`clusters: {edge-1: {tier: edge}}`)".into()),
            );
        } else if let Err(e) = crate::fleet::analysis::Selector::parse(sel.as_str()) {
            checker.at(sel.span(), format!("`selector: {}`: {e}", sel.as_str()), None);
        }
    }
    if let Some(s) = &slo {
        if let Err(e) = crate::fleet::slo::parse(s.as_str()) {
            checker.at(s.span(), format!("`slo`: {e}"), Some("write it like `slo: \"95%@48h,100%@7d\"`".into()));
        }
    }
    let out = rollout.map(|r| check_rollout(checker, &r)).unwrap_or_default();
    (checker.problems.len() == before).then(|| FleetStep {
        contexts,
        fleet_file,
        selector: selector.map(|s| s.as_str().to_string()),
        rollout: out,
        slo: slo.map(|s| s.as_str().to_string()),
    })
}

/// A fleet step runs once per cluster of `contexts`: no `context` of its own, and resumable.
pub(super) fn check_fleet_step(
    checker: &mut Checker<'_>,
    name: &str,
    fleet: Option<&FleetStep>,
    spec: &ToolSpec,
    own_node: &Node,
    resumable: bool,
    step_span: &Span,
) {
    if fleet.is_none() {
        return;
    }
    if spec.own_context().is_some() {
        let span = own_node.as_mapping().and_then(|m| m.get_node("context")).map(|n| *n.span()).unwrap_or(*step_span);
        checker.at(
            &span,
            format!("step `{name}` has both `context` and `contexts`"),
            Some("a fleet step runs once per cluster of `contexts`: remove `context`".into()),
        );
    }
    if !resumable {
        checker.at(
            step_span,
            format!("fleet step `{name}` cannot be `resumable: false`"),
            Some("each cluster is a checkpointed sub-change".into()),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::{AbsentPolicy, MaxFailures, Rollout, WaveSize};
    use crate::stack::{parse, problems};

    const FLEET: &str = "name: s\nsteps:\n  - name: agent\n    tool: helm\n    release: agent\n    chart: repo/agent\n    contexts: [\"edge-*\", core-1]\n    slo: \"95%@48h\"\n    rollout: { waves: [1, \"10%\", \"100%\"], parallel: 20, bake: 10m, max_failures: \"5%\", absent: wait }\n";

    #[test]
    fn a_fleet_step_reads_its_scope_and_rollout() {
        let stack = parse(Path::new("stack.yaml"), FLEET).unwrap();
        let fleet = stack.step("agent").unwrap().fleet.clone().expect("a fleet step");
        assert_eq!(fleet.contexts, ["edge-*", "core-1"]);
        assert_eq!(fleet.slo.as_deref(), Some("95%@48h"));
        let r = fleet.rollout;
        assert_eq!(r.waves, [WaveSize::Count(1), WaveSize::Percent(10.0), WaveSize::Percent(100.0)]);
        assert_eq!((r.parallel, r.bake, r.absent), (20, Duration::from_secs(600), AbsentPolicy::Wait));
        assert_eq!(r.max_failures, MaxFailures::Percent(5.0));
        // Without `rollout:`: one wave of every cluster, one at a time, nothing tolerated.
        let plain = FLEET.replace("    rollout: { waves: [1, \"10%\", \"100%\"], parallel: 20, bake: 10m, max_failures: \"5%\", absent: wait }\n", "");
        let stack = parse(Path::new("stack.yaml"), &plain).unwrap();
        assert_eq!(stack.step("agent").unwrap().fleet.as_ref().unwrap().rollout, Rollout::default());
    }

    #[test]
    fn fleet_keys_are_checked_where_they_are_written() {
        let p = problems(&FLEET.replace("absent: wait", "absent: wiat").replace("bake: 10m", "bake: soon"));
        let messages: Vec<&str> = p.iter().map(|p| p.message.as_str()).collect();
        assert!(messages.iter().any(|m| m.contains("`rollout.bake: soon` is not a duration")), "{messages:?}");
        let absent = p.iter().find(|p| p.message.contains("`rollout.absent`")).expect("absent is checked");
        assert_eq!(absent.hint.as_deref(), Some("did you mean `wait`?"));
        let p = problems(&FLEET.replace("waves: [1,", "waves: [first,"));
        assert!(p[0].message.contains("`first` is neither a cluster count nor a percentage"), "{p:?}");
        let p = problems(&FLEET.replace("    contexts:", "    context: c1\n    contexts:"));
        assert!(p[0].message.contains("both `context` and `contexts`"), "{p:?}");
        let p = problems(&FLEET.replace("    contexts: [\"edge-*\", core-1]\n", "    selector: tier=edge\n"));
        assert!(p.iter().any(|p| p.message.contains("`selector` belongs to a fleet step")), "{p:?}");
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo\n    contexts: [edge-1]\n");
        assert_eq!(p[0].hint.as_deref(), Some("`contexts` is a key of fleet steps, which are helm or kubectl steps"));
    }
}

//! A fleet step's keys (`contexts`, `fleet`, `selector`, `rollout`, `slo`): its scope and rollout.

use super::*;

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

pub(super) fn parse_percent(text: &str) -> Option<f64> {
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
    keys: &mut CommonKeys,
    step_span: &Span,
) -> Option<FleetStep> {
    let contexts = keys.contexts.take();
    let fleet = keys.fleet.take();
    let selector = keys.selector.take();
    let rollout = keys.rollout.take();
    let slo = keys.slo.take();
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

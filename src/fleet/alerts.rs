//! `rdeploy alerts`: Prometheus alerting rules for the fleet, from the same facts the inventory
//! uses: the expected clusters (fleet file or kubeconfig), the recorded rollout starts and the
//! versions seen (`<state dir>/fleet/rollouts.json`), the SLO and the support window.
//!
//! Three alerts:
//! - `RdeployClusterAbsent`: an expected cluster without a successful scrape for `--absent-for`.
//!   Absence, not health: it fires when the series are gone altogether (a target dropped from
//!   service discovery), which `up == 0` alone never sees, because each expected cluster is a
//!   recorded series (`rdeploy:fleet_cluster:expected`) the check is joined against.
//! - `RdeployRolloutSLOMissed`: past an objective's due time, the share of in-scope clusters
//!   running only the wanted version is below the objective.
//! - `RdeployUnsupportedVersion`: a cluster runs a recorded version older than the newest N.
//!
//! Due times and version lists are baked into the rules, so they are regenerated when a
//! rollout starts (run `rdeploy alerts` after `rdeploy inventory` in the deploy pipeline).
//! The output is deterministic (no generation time) so it can be committed and diffed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use time::OffsetDateTime;

use super::analysis::rfc3339;
use super::model::{compare_versions, normalize_repo, split_image};
use super::scope::{self, FleetFile, Scope};
use super::slo;
use super::state::Rollouts;
use crate::exit::{Code, Refusal};

/// `rdeploy alerts`, already parsed by the command line.
#[derive(Debug)]
pub struct AlertsRequest {
    pub kubeconfig: Option<PathBuf>,
    pub contexts: Vec<String>,
    pub fleet: Option<PathBuf>,
    pub slo: Option<String>,
    pub supported: Option<usize>,
    pub components: Vec<String>,
    pub since: Option<String>,
    pub absent_for: Duration,
    pub cluster_label: String,
}

fn bad_input(message: impl Into<String>) -> anyhow::Error {
    Refusal::new(Code::BadInput, message).into()
}

/// One component's rules: what is wanted, since when, and which versions are older.
struct Component {
    name: String,
    wanted: String,
    start: Option<OffsetDateTime>,
    /// Every recorded version, newest first.
    versions: Vec<String>,
}

/// Builds the rules file.
pub fn generate(req: &AlertsRequest, state_dir: &Path) -> anyhow::Result<String> {
    let objectives = req.slo.as_deref().map(slo::parse).transpose().map_err(|e| bad_input(format!("`--slo`: {e}")))?;
    if req.supported == Some(0) {
        return Err(bad_input("`--supported` must be at least 1 (the newest version)"));
    }
    if req.absent_for < Duration::from_secs(60) {
        return Err(bad_input("`--absent-for` must be at least 1m (scrapes are usually 15s to 1m apart)"));
    }
    let label = req.cluster_label.as_str();
    if label.is_empty()
        || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || label.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(bad_input(format!("`--cluster-label {label}` is not a Prometheus label name")));
    }
    let now = OffsetDateTime::now_utc();
    let since = match req.since.as_deref() {
        Some(s) => Some(parse_since(s, now).map_err(|e| bad_input(format!("`--since`: {e}")))?),
        None => None,
    };
    let fleet = req.fleet.as_deref().map(FleetFile::load).transpose().map_err(|e| bad_input(format!("{e:#}")))?;
    let (kubeconfig, source) = match scope::read_kubeconfig(req.kubeconfig.as_deref()) {
        Ok(found) => found,
        // Rules need names, not access: the fleet file or the names given are enough.
        Err(_)
            if req.kubeconfig.is_none()
                && (fleet.as_ref().is_some_and(|f| !f.clusters.is_empty()) || !req.contexts.is_empty()) =>
        {
            (Default::default(), "the fleet file".to_string())
        }
        Err(e) => {
            return Err(Refusal::new(Code::BadInput, format!("{e:#}"))
                .with_hint("pass `--fleet FILE` (the fleet's clusters) or `--kubeconfig FILE`")
                .into());
        }
    };
    let scope =
        Scope::select(&kubeconfig, source, &req.contexts, fleet.as_ref()).map_err(|e| bad_input(format!("{e:#}")))?;
    if scope.clusters.is_empty() {
        return Err(bad_input("no cluster in the fleet: pass `--fleet FILE` or a kubeconfig with contexts"));
    }
    let components = components(req, &Rollouts::load(state_dir), since)?;
    if components.is_empty() && (objectives.is_some() || req.supported.is_some()) {
        eprintln!("warning: no rollout is recorded in {}: only the absence alert is written; run `rdeploy inventory` first, or pass `--component IMAGE:TAG --since TIME`", super::state::Rollouts::path(state_dir).display());
    }
    Ok(render(&scope, label, req.absent_for, objectives.as_deref().unwrap_or(&[]), req.supported, &components))
}

fn parse_since(text: &str, now: OffsetDateTime) -> Result<OffsetDateTime, String> {
    if let Ok(t) = OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339) {
        return Ok(t);
    }
    humantime::parse_duration(text)
        .map(|d| now - d)
        .map_err(|_| format!("`{text}` is neither an RFC 3339 time nor a duration like `36h`"))
}

fn components(
    req: &AlertsRequest,
    rollouts: &Rollouts,
    since: Option<OffsetDateTime>,
) -> anyhow::Result<Vec<Component>> {
    let asked: Vec<(String, Option<String>)> = req
        .components
        .iter()
        .map(|c| {
            if c.rsplit('/').next().is_some_and(|last| last.contains(':')) {
                let (repo, tag) = split_image(c);
                (repo, Some(tag))
            } else {
                (normalize_repo(c), None)
            }
        })
        .collect();
    let names: Vec<String> = if asked.is_empty() {
        rollouts.components.keys().cloned().collect()
    } else {
        asked.iter().map(|(n, _)| n.clone()).collect()
    };
    let mut out = Vec::new();
    for name in names {
        let mut versions: Vec<String> =
            rollouts.components.get(&name).map(|v| v.keys().cloned().collect()).unwrap_or_default();
        let tag = asked.iter().find(|(n, _)| n == &name).and_then(|(_, t)| t.clone());
        if let Some(t) = &tag {
            if !versions.contains(t) {
                versions.push(t.clone());
            }
        }
        versions.sort_by(|a, b| compare_versions(b, a));
        let Some(wanted) = tag.or_else(|| versions.first().cloned()) else {
            return Err(bad_input(format!(
                "no rollout of `{name}` is recorded: pass `--component {name}:TAG` and `--since TIME`"
            )));
        };
        let start = since.or_else(|| rollouts.start(&name, &wanted).map(|s| s.started));
        out.push(Component { name, wanted, start, versions });
    }
    Ok(out)
}

/// The rules file. Expressions are YAML block scalars and regexes PromQL raw strings
/// (backticks), so neither YAML nor PromQL escaping touches the backslashes.
fn render(
    scope: &Scope,
    label: &str,
    absent_for: Duration,
    objectives: &[slo::Objective],
    supported: Option<usize>,
    components: &[Component],
) -> String {
    let mut y = String::new();
    let _ = writeln!(y, "# Prometheus alerting rules for the fleet, written by `rdeploy alerts`.");
    let _ = writeln!(y, "# SLO due times and version lists come from the recorded rollouts: regenerate the file");
    let _ = writeln!(y, "# when a rollout starts. Check it with `promtool check rules FILE`.");
    let _ = writeln!(y, "groups:");
    // Fleet membership and absence.
    let window = absent_for * 2 / 3;
    let hold = absent_for - window;
    let _ = writeln!(y, "  - name: rdeploy-fleet");
    let _ = writeln!(y, "    rules:");
    for c in &scope.clusters {
        let _ = writeln!(y, "      - record: rdeploy:fleet_cluster:expected");
        let _ = writeln!(y, "        expr: vector(1)");
        let _ = writeln!(y, "        labels:");
        let _ = writeln!(y, "          {label}: {}", quote(&c.name));
        for (k, v) in c.labels.iter().filter(|(k, _)| k.as_str() != label && is_label_name(k)) {
            let _ = writeln!(y, "          {k}: {}", quote(v));
        }
    }
    let _ = writeln!(
        y,
        "      # No successful scrape within {} that stays so for {}: {} without a report.",
        prom_duration(window),
        prom_duration(hold),
        prom_duration(absent_for)
    );
    let _ =
        writeln!(y, "      # The hold keeps a restarted Prometheus, which has no history yet, from paging at once.");
    let _ = writeln!(y, "      - alert: RdeployClusterAbsent");
    let _ = writeln!(y, "        expr: |-");
    let _ = writeln!(y, "          rdeploy:fleet_cluster:expected");
    let _ = writeln!(y, "          unless on ({label})");
    let _ =
        writeln!(y, "          max by ({label}) (max_over_time(up{{{label}!=\"\"}}[{}])) == 1", prom_duration(window));
    let _ = writeln!(y, "        for: {}", prom_duration(hold));
    let _ = writeln!(y, "        labels:");
    let _ = writeln!(y, "          severity: critical");
    let _ = writeln!(y, "        annotations:");
    let _ = writeln!(
        y,
        "          summary: {}",
        quote(&format!("Cluster {{{{ $labels.{label} }}}} has not reported for {}", prom_duration(absent_for)))
    );
    let _ = writeln!(
        y,
        "          description: {}",
        quote(&format!("No successful scrape of {{{{ $labels.{label} }}}} for {}. It counts as not upgraded for every rollout and blocks inventory gates until it reports again.", prom_duration(absent_for)))
    );
    let with_slo: Vec<&Component> =
        if objectives.is_empty() { Vec::new() } else { components.iter().filter(|c| c.start.is_some()).collect() };
    for c in components.iter().filter(|c| !objectives.is_empty() && c.start.is_none()) {
        eprintln!(
            "warning: no rollout start is recorded for {} {}: no SLO alert for it (pass `--since TIME`)",
            c.name, c.wanted
        );
    }
    if !with_slo.is_empty() {
        let _ = writeln!(y, "  - name: rdeploy-rollout-slo");
        let _ = writeln!(y, "    rules:");
        for c in with_slo {
            let any = image_regex(&c.name, None);
            let wanted = image_regex(&c.name, Some(&c.wanted));
            let labels = format!("          component: {}\n          version: {}\n", quote(&c.name), quote(&c.wanted));
            let _ = writeln!(y, "      # Clusters running only {} {}, and the clusters in scope: those running it plus the absent ones.", c.name, c.wanted);
            let _ = writeln!(y, "      - record: rdeploy:rollout_clusters:done");
            let _ = writeln!(y, "        expr: |-");
            let _ = writeln!(y, "          count(");
            let _ = writeln!(y, "            count by ({label}) (kube_pod_container_info{{image=~`{wanted}`}})");
            let _ = writeln!(y, "            unless on ({label})");
            let _ = writeln!(
                y,
                "            count by ({label}) (kube_pod_container_info{{image=~`{any}`,image!~`{wanted}`}})"
            );
            let _ = writeln!(y, "          ) or vector(0)");
            let _ = write!(y, "        labels:\n{labels}");
            let _ = writeln!(y, "      - record: rdeploy:rollout_clusters:in_scope");
            let _ = writeln!(y, "        expr: |-");
            let _ = writeln!(y, "          count(");
            let _ = writeln!(y, "            count by ({label}) (kube_pod_container_info{{image=~`{any}`}})");
            let _ = writeln!(y, "            or on ({label})");
            let _ = writeln!(
                y,
                "            (rdeploy:fleet_cluster:expected unless on ({label}) max by ({label}) (up) == 1)"
            );
            let _ = writeln!(y, "          ) or vector(0)");
            let _ = write!(y, "        labels:\n{labels}");
            let start = c.start.expect("filtered on start");
            for o in objectives {
                let due = start + o.within;
                let sel = format!("{{component={},version={}}}", dq(&c.name), dq(&c.wanted));
                let _ = writeln!(y, "      - alert: RdeployRolloutSLOMissed");
                let _ = writeln!(y, "        expr: |-");
                let _ = writeln!(y, "          (rdeploy:rollout_clusters:done{sel} / on (component, version) rdeploy:rollout_clusters:in_scope{sel}) < {}", ratio(o.percent));
                let _ = writeln!(y, "          and on () (vector(time()) >= {})", due.unix_timestamp());
                let _ = writeln!(y, "        labels:");
                let _ = writeln!(y, "          severity: warning");
                let _ = writeln!(y, "          objective: {}", quote(&o.text));
                let _ = writeln!(y, "        annotations:");
                let _ = writeln!(
                    y,
                    "          summary: {}",
                    quote(&format!(
                        "{} {}: {{{{ $value | humanizePercentage }}}} of the fleet done, objective {} by {}",
                        c.name,
                        c.wanted,
                        o.text,
                        rfc3339(due)
                    ))
                );
                let _ = writeln!(
                    y,
                    "          description: {}",
                    quote(&format!("The rollout of {} {} started {} and misses its completion objective {}. `rdeploy inventory --component {}:{}` names the stragglers.", c.name, c.wanted, rfc3339(start), o.text, c.name, c.wanted))
                );
            }
        }
    }
    let old: Vec<(&Component, Vec<&String>, Vec<&String>)> = match supported {
        Some(n) => components
            .iter()
            .map(|c| {
                // Only versions known to be older: a newer version rdeploy has not recorded
                // yet is a new rollout, not an unsupported one.
                let wanted_at = c.versions.iter().position(|v| v == &c.wanted).unwrap_or(0);
                let window: Vec<&String> = c.versions.iter().skip(wanted_at).take(n).collect();
                let older: Vec<&String> = c.versions.iter().skip(wanted_at + n).collect();
                (c, window, older)
            })
            .filter(|(_, _, older)| !older.is_empty())
            .collect(),
        None => Vec::new(),
    };
    if !old.is_empty() {
        let _ = writeln!(y, "  - name: rdeploy-support-window");
        let _ = writeln!(y, "    rules:");
        for (c, window, older) in old {
            let versions = older.iter().map(|v| version_regex(v)).collect::<Vec<_>>().join("|");
            let window = window.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ");
            let _ = writeln!(y, "      - alert: RdeployUnsupportedVersion");
            let _ = writeln!(y, "        expr: |-");
            let _ = writeln!(
                y,
                "          count by ({label}, image) (kube_pod_container_info{{image=~`{}({versions})`}}) > 0",
                repo_regex(&c.name)
            );
            let _ = writeln!(y, "        for: 5m");
            let _ = writeln!(y, "        labels:");
            let _ = writeln!(y, "          severity: warning");
            let _ = writeln!(y, "          component: {}", quote(&c.name));
            let _ = writeln!(y, "        annotations:");
            let _ = writeln!(y, "          summary: {}", quote(&format!("{{{{ $labels.{label} }}}} runs {{{{ $labels.image }}}}, older than the supported {} versions ({window})", c.name)));
            let _ = writeln!(
                y,
                "          description: {}",
                quote(&format!("{{{{ $value }}}} container(s) on {{{{ $labels.{label} }}}} run a {} version outside the support window (the newest {}: {window}).", c.name, supported.unwrap_or(0)))
            );
        }
    }
    y
}

fn is_label_name(k: &str) -> bool {
    !k.is_empty()
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && !k.starts_with("__")
}

/// A YAML single-quoted scalar.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A PromQL double-quoted string.
fn dq(s: &str) -> String {
    format!("\"{}\"", super::prometheus::promql_escape(s))
}

/// `0.95` for 95%, without float noise.
fn ratio(percent: f64) -> String {
    let r = format!("{:.6}", percent / 100.0);
    r.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `1h30m`, `10m`, `45s`: Prometheus' duration syntax.
pub fn prom_duration(d: Duration) -> String {
    let mut s = d.as_secs();
    if s == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, n) in [("d", 86400), ("h", 3600), ("m", 60), ("s", 1)] {
        if s >= n {
            let _ = write!(out, "{}{unit}", s / n);
            s %= n;
        }
    }
    out
}

/// RE2 escaping of regex metacharacters (PromQL regexes are RE2, anchored at both ends).
fn re_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if "\\.+*?()|[]{}^$".contains(ch) {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// The repository as an image reference may spell it: Docker Hub images with or without
/// `docker.io/` and `library/`, as `normalize_repo` folds them.
fn repo_regex(component: &str) -> String {
    let first = component.split('/').next().unwrap_or_default();
    let has_registry = component.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_registry {
        return re_escape(component);
    }
    let library = if component.contains('/') { "" } else { "(library/)?" };
    format!("((docker\\.io|index\\.docker\\.io)/)?{library}{}", re_escape(component))
}

/// The tag-and-digest part for one version (as `split_image` names versions).
fn version_regex(version: &str) -> String {
    if version == "latest" {
        "(:latest)?(@.+)?".into()
    } else if version.starts_with("sha256:") {
        // A digest-only image: its version is the digest's first characters.
        format!("@{}.*", re_escape(version))
    } else {
        format!(":{}(@.+)?", re_escape(version))
    }
}

/// An image of `component`, at `version` or any.
fn image_regex(component: &str, version: Option<&str>) -> String {
    match version {
        Some(v) => format!("{}{}", repo_regex(component), version_regex(v)),
        None => format!("{}(:[^/@]+)?(@.+)?", repo_regex(component)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(re: &str, s: &str) -> bool {
        regex::Regex::new(&format!("^(?:{re})$")).unwrap().is_match(s)
    }

    #[test]
    fn image_regexes_match_what_split_image_folds() {
        let any = image_regex("nginx", None);
        for s in ["nginx", "nginx:1.27", "docker.io/library/nginx:1.27", "library/nginx@sha256:ab"] {
            assert!(matches(&any, s), "{s}");
        }
        assert!(!matches(&any, "nginx-exporter:1"));
        assert!(!matches(&any, "quay.io/nginx:1"));
        let wanted = image_regex("registry.example/node-agent", Some("2.0"));
        assert!(matches(&wanted, "registry.example/node-agent:2.0"));
        assert!(matches(&wanted, "registry.example/node-agent:2.0@sha256:ff"));
        assert!(!matches(&wanted, "registry.example/node-agent:2.0.1"));
        assert!(!matches(&wanted, "registry.example/node-agent:2x0"));
        assert!(matches(&image_regex("app", Some("latest")), "app"));
        assert!(matches(&image_regex("app", Some("sha256:0123456789ab")), "app@sha256:0123456789abcdef"));
    }

    #[test]
    fn durations_and_ratios() {
        assert_eq!(prom_duration(Duration::from_secs(900)), "15m");
        assert_eq!(prom_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(prom_duration(Duration::from_secs(600)), "10m");
        assert_eq!(ratio(95.0), "0.95");
        assert_eq!(ratio(100.0), "1");
        assert_eq!(ratio(99.9), "0.999");
        assert_eq!(quote("it's"), "'it''s'");
    }
}

//! The fleet: which version of each component every cluster runs, which clusters are absent,
//! whether a rollout meets its completion SLO (`rdeploy inventory`), and the answers gates
//! need before a step that assumes everyone upgraded.

pub mod alerts;
pub mod analysis;
pub mod collect;
pub mod html;
pub mod matrix;
pub mod model;
pub mod prometheus;
pub mod scope;
pub mod slo;
pub mod state;

use std::path::{Path, PathBuf};
use std::time::Duration;

use time::OffsetDateTime;

use crate::exit::{Code, Refusal};
use analysis::{judge, Filter, Selector};
use collect::CollectOptions;
use matrix::MatrixOptions;
use model::{normalize_repo, split_image, Kind};
use scope::{FleetFile, Scope};
use state::{LastSeen, Rollouts};

/// `rdeploy inventory`, already parsed by the command line.
#[derive(Debug, Default)]
pub struct InventoryRequest {
    pub kubeconfig: Option<PathBuf>,
    pub contexts: Vec<String>,
    pub fleet: Option<PathBuf>,
    pub json: bool,
    pub markdown: bool,
    pub supported: Option<usize>,
    pub slo: Option<String>,
    pub component: Option<String>,
    pub since: Option<String>,
    pub namespace: Option<String>,
    pub selector: Option<String>,
    pub timeout: Duration,
    /// Read the fleet from Prometheus series instead of asking each cluster's API.
    pub prometheus: Option<prometheus::PromSource>,
    /// Also write the self-contained dashboard page there.
    pub html: Option<PathBuf>,
}

fn bad_input(message: impl Into<String>) -> anyhow::Error {
    Refusal::new(Code::BadInput, message).into()
}

/// Runs the inventory and prints the report on the run's stdout `out`. Exit 0, or 1 when an
/// SLO objective is breached (so CI fails), or 2 on bad input.
pub async fn inventory(req: &InventoryRequest, state_dir: &Path, out: &crate::out::Out) -> anyhow::Result<Code> {
    let objectives = req.slo.as_deref().map(slo::parse).transpose().map_err(|e| bad_input(format!("`--slo`: {e}")))?;
    let selector =
        Selector::parse(req.selector.as_deref().unwrap_or("")).map_err(|e| bad_input(format!("`--selector`: {e}")))?;
    if req.prometheus.is_some() && req.selector.is_some() {
        // Every workload would be filtered out and the fleet would look like it runs nothing.
        return Err(bad_input("`--selector` needs `--source api`: `kube_pod_container_info` carries no pod labels (use `--namespace` or `--component`)"));
    }
    let now = OffsetDateTime::now_utc();
    let since = req
        .since
        .as_deref()
        .map(|s| parse_since(s, now))
        .transpose()
        .map_err(|e| bad_input(format!("`--since`: {e}")))?;
    let fleet = req.fleet.as_deref().map(FleetFile::load).transpose().map_err(|e| bad_input(format!("{e:#}")))?;
    let (kubeconfig, source) = match scope::read_kubeconfig(req.kubeconfig.as_deref()) {
        Ok(found) => found,
        // Prometheus needs no cluster access: the fleet file, or the names given, is the fleet.
        Err(_)
            if req.prometheus.is_some()
                && req.kubeconfig.is_none()
                && (fleet.is_some() || !req.contexts.is_empty()) =>
        {
            (Default::default(), "the fleet file".to_string())
        }
        Err(e) => {
            return Err(Refusal::new(Code::BadInput, format!("{e:#}"))
                .with_hint(format!(
                    "pass `--kubeconfig FILE`, set `KUBECONFIG`, or create {}",
                    scope::default_path().map_or_else(|| "~/.kube/config".to_string(), |p| p.display().to_string())
                ))
                .into());
        }
    };
    let scope =
        Scope::select(&kubeconfig, source, &req.contexts, fleet.as_ref()).map_err(|e| bad_input(format!("{e:#}")))?;
    if scope.clusters.is_empty() {
        return Err(bad_input("no cluster in scope: the kubeconfig has no context"));
    }
    let options =
        CollectOptions { timeout: req.timeout, namespace: req.namespace.clone(), ..CollectOptions::default() };
    let inv = match &req.prometheus {
        Some(p) => prometheus::collect(&scope, p, req.namespace.as_deref(), &LastSeen::load(state_dir))
            .await
            .map_err(|e| Refusal::new(Code::Partial, e))?,
        None => collect::collect(&scope, &options, &LastSeen::load(state_dir)).await,
    };
    if let Err(e) = LastSeen::record(state_dir, &inv) {
        tracing::warn!("could not record when clusters were last seen: {e:#}");
    }
    let mut rollouts = Rollouts::load(state_dir);
    if rollouts.note_new_versions(&inv) {
        if let Err(e) = rollouts.save(state_dir) {
            tracing::warn!("could not record rollout starts: {e:#}");
        }
    }
    let component = req.component.as_deref().map(|c| {
        // `--component app:2.0` judges against 2.0; a bare repository, against the newest.
        if c.rsplit('/').next().is_some_and(|last| last.contains(':')) {
            let (repo, tag) = split_image(c);
            (repo, Some(tag))
        } else {
            (normalize_repo(c), None)
        }
    });
    let filter = Filter { namespace: req.namespace.clone(), selector, kinds: Vec::new() };
    let mut report = matrix::build(&inv, &MatrixOptions { component, supported: req.supported, filter });
    if let Some(objectives) = &objectives {
        for c in &report.components {
            let start = match since {
                Some(t) => Some((t, "--since".to_string())),
                None => rollouts.start(&c.component, &c.wanted).map(|s| (s.started, s.source.clone())),
            };
            report.slo.push(slo::evaluate(&c.component, &c.wanted, &c.standings, start, objectives, now));
        }
    }
    if let Some(path) = &req.html {
        let from = match &req.prometheus {
            Some(p) => format!("Prometheus at {}", p.url),
            None => format!("the Kubernetes API ({})", scope.source),
        };
        fs_err::write(path, html::render(&report, &from))?;
        eprintln!("wrote the fleet dashboard to {}", path.display());
    }
    if req.json {
        outln!(out, "{}", serde_json::to_string_pretty(&report)?);
    } else if req.markdown {
        out!(out, "{}", report.render_markdown());
    } else {
        out!(out, "{}", report.render_text());
    }
    if report.slo_breached() {
        let breached: Vec<String> =
            report.slo.iter().filter(|s| s.breached).map(|s| format!("{} {}", s.component, s.version)).collect();
        eprintln!("error: the rollout-completion SLO is breached for {}", breached.join(", "));
        return Ok(Code::Partial);
    }
    Ok(Code::Ok)
}

/// `--since`: an RFC 3339 time, or a duration ago (`36h`).
fn parse_since(text: &str, now: OffsetDateTime) -> Result<OffsetDateTime, String> {
    if let Ok(t) = OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339) {
        return Ok(t);
    }
    humantime::parse_duration(text)
        .map(|d| now - d)
        .map_err(|_| format!("`{text}` is neither an RFC 3339 time nor a duration like `36h`"))
}

/// What a gate asks of the fleet.
pub struct GateQuery<'a> {
    pub contexts: &'a [String],
    pub kubeconfig: Option<PathBuf>,
    pub namespace: Option<String>,
    pub selector: Option<&'a str>,
    pub kinds: Vec<Kind>,
    pub image: &'a str,
    pub version: &'a str,
    pub timeout: Duration,
}

/// Asks the fleet for a gate and judges every cluster in scope; the state directory keeps
/// last-seen times. Errors are reasons to refuse.
pub async fn standings_for_gate(q: &GateQuery<'_>, state_dir: &Path) -> Result<Vec<analysis::ClusterStanding>, String> {
    let selector = Selector::parse(q.selector.unwrap_or("")).map_err(|e| format!("bad selector: {e}"))?;
    let last_seen = LastSeen::load(state_dir);
    let inv = match scope::read_kubeconfig(q.kubeconfig.as_deref()) {
        Ok((kubeconfig, source)) => {
            let scope = Scope::select(&kubeconfig, source, q.contexts, None).map_err(|e| format!("{e:#}"))?;
            let options = CollectOptions {
                timeout: q.timeout,
                namespace: q.namespace.clone(),
                kinds: if q.kinds.is_empty() { Kind::ALL.to_vec() } else { q.kinds.clone() },
                ..CollectOptions::default()
            };
            collect::collect(&scope, &options, &last_seen).await
        }
        // Without a kubeconfig no cluster can answer: each is absent, named, never assumed fine.
        Err(e) => model::Inventory {
            taken_at: OffsetDateTime::now_utc(),
            clusters: q
                .contexts
                .iter()
                .map(|c| model::ClusterInventory::absent(c, format!("{e:#}"), last_seen.get(c)))
                .collect(),
        },
    };
    if let Err(e) = LastSeen::record(state_dir, &inv) {
        tracing::warn!("could not record when clusters were last seen: {e:#}");
    }
    let filter = Filter { namespace: q.namespace.clone(), selector, kinds: q.kinds.clone() };
    Ok(judge(&inv, q.image, q.version, &filter))
}

//! `rdeploy inventory`: fleet version inventory: component x version x clusters.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::Global;
use super::scope::ScopeArgs;
use crate::exit::{Code, Refusal};
use crate::fleet;
use crate::ui::Ui;

#[derive(Args)]
pub struct InventoryArgs {
    #[command(flatten)]
    pub scope: ScopeArgs,
    /// Machine-readable output.
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// Markdown output.
    #[arg(long)]
    pub markdown: bool,
    /// Flag versions older than the newest N of each component as incidents.
    #[arg(long, value_name = "N")]
    pub supported: Option<usize>,
    /// Rollout-completion objectives, like `95%@48h,100%@7d`; a breach exits 1.
    #[arg(long, value_name = "OBJECTIVES")]
    pub slo: Option<String>,
    /// Only this component (image repository); `IMAGE:TAG` judges against that version.
    #[arg(long, value_name = "IMAGE")]
    pub component: Option<String>,
    /// When the rollout started (RFC 3339, or a duration ago like `36h`), instead of the time
    /// `rdeploy inventory` first saw the version (recorded in the state directory).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only workloads in this namespace.
    #[arg(long, short = 'n', value_name = "NS")]
    pub namespace: Option<String>,
    /// Only workloads whose labels (or pod template labels) match, like `app=node-agent`.
    #[arg(long, short = 'l', value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Per-cluster time to answer before it counts as absent.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub timeout: std::time::Duration,
    /// Where the fleet is read: each cluster's Kubernetes API, or Prometheus series
    /// (`kube_pod_container_info`) for clusters the runner cannot reach.
    #[arg(long, value_enum, default_value_t = InventorySource::Api)]
    pub source: InventorySource,
    /// The Prometheus base URL (with `--source prometheus`).
    #[arg(long, env = "RDEPLOY_PROMETHEUS_URL", value_name = "URL")]
    pub prometheus_url: Option<String>,
    /// The series label that names the cluster (with `--source prometheus`).
    #[arg(long, default_value = "cluster", value_name = "LABEL")]
    pub cluster_label: String,
    /// A cluster whose newest series is older than this is absent (with `--source prometheus`).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub stale_after: std::time::Duration,
    /// Also write a self-contained dashboard page (no network needed to view it).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InventorySource {
    Api,
    Prometheus,
}

pub async fn run(a: &InventoryArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let request = fleet::InventoryRequest {
        kubeconfig: a.scope.kubeconfig.clone(),
        contexts: a.scope.contexts.clone(),
        fleet: a.scope.fleet.clone(),
        json: a.json,
        markdown: a.markdown,
        supported: a.supported,
        slo: a.slo.clone(),
        component: a.component.clone(),
        since: a.since.clone(),
        namespace: a.namespace.clone(),
        selector: a.selector.clone(),
        timeout: a.timeout,
        prometheus: match (a.source, &a.prometheus_url) {
            (InventorySource::Api, _) => None,
            (InventorySource::Prometheus, Some(url)) => Some(fleet::prometheus::PromSource {
                url: url.clone(),
                cluster_label: a.cluster_label.clone(),
                stale_after: a.stale_after,
                timeout: a.timeout.max(std::time::Duration::from_secs(10)),
            }),
            (InventorySource::Prometheus, None) => {
                return Err(Refusal::new(Code::BadInput, "`--source prometheus` needs the Prometheus URL")
                    .with_hint("pass `--prometheus-url http://prometheus:9090` or set `RDEPLOY_PROMETHEUS_URL`")
                    .into())
            }
        },
        html: a.html.clone(),
    };
    fleet::inventory(&request, &global.state_dir.clone().unwrap_or_else(|| PathBuf::from(".rdeploy")), ui.out()).await
}

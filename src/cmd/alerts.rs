//! `rdeploy alerts`: prometheus alerting rules for the fleet.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::Global;
use super::scope::ScopeArgs;
use crate::exit::Code;
use crate::fleet;
use crate::ui::Ui;

#[derive(Args)]
pub struct AlertsArgs {
    #[command(flatten)]
    pub scope: ScopeArgs,
    /// Rollout-completion objectives, like `95%@48h,100%@7d`, measured from the recorded
    /// rollout start of each component's newest version.
    #[arg(long, value_name = "OBJECTIVES")]
    pub slo: Option<String>,
    /// Alert on versions older than the newest N recorded for a component.
    #[arg(long, value_name = "N")]
    pub supported: Option<usize>,
    /// Only these components (image repositories); `IMAGE:TAG` makes TAG the wanted version.
    #[arg(long, value_delimiter = ',', value_name = "IMAGE")]
    pub component: Vec<String>,
    /// When the rollout started (RFC 3339, or a duration ago like `36h`), instead of the time
    /// `rdeploy inventory` first saw the version.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// How long without a successful scrape before a cluster is reported absent.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub absent_for: std::time::Duration,
    /// The series label that names the cluster.
    #[arg(long, default_value = "cluster", value_name = "LABEL")]
    pub cluster_label: String,
    /// Write the rules to FILE instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub async fn run(a: &AlertsArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let request = fleet::alerts::AlertsRequest {
        kubeconfig: a.scope.kubeconfig.clone(),
        contexts: a.scope.contexts.clone(),
        fleet: a.scope.fleet.clone(),
        slo: a.slo.clone(),
        supported: a.supported,
        components: a.component.clone(),
        since: a.since.clone(),
        absent_for: a.absent_for,
        cluster_label: a.cluster_label.clone(),
    };
    let rules =
        fleet::alerts::generate(&request, &global.state_dir.clone().unwrap_or_else(|| PathBuf::from(".rdeploy")))?;
    match &a.output {
        Some(path) => {
            fs_err::write(path, rules)?;
            ui.info(format!("wrote the fleet alerting rules to {}", path.display()));
        }
        None => out!(ui.out(), "{rules}"),
    }
    Ok(Code::Ok)
}

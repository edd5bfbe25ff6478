//! The flags that say which clusters are the fleet, shared by `inventory` and `alerts` so that
//! both take them, and describe them, alike. `src/fleet/scope.rs` reads them.

use std::path::PathBuf;

use clap::Args;

/// Which clusters are the fleet: contexts of a kubeconfig, or the clusters of a fleet file.
#[derive(Args)]
pub struct ScopeArgs {
    /// The kubeconfig whose contexts are the fleet (default: `$KUBECONFIG`, else
    /// `~/.kube/config`).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Contexts: names or globs like `edge-*`, comma-separated (default: every cluster of the
    /// fleet file, else every context).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub contexts: Vec<String>,
    /// A fleet file, `clusters: {NAME: {LABEL: VALUE}}`: its clusters are the fleet, and their
    /// labels go with each cluster's lines and alerts.
    #[arg(long, value_name = "FILE")]
    pub fleet: Option<PathBuf>,
}

//! `rdeploy recover`: resume a stopped deploy from its checkpoint.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::{session, Global};
use crate::exit::Code;
use crate::ui::Ui;

#[derive(Args)]
pub struct RecoverArgs {
    #[arg(default_value = "stack.yaml")]
    pub stack: PathBuf,
    /// Print what recovery would do, from each tool's live state; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Recover a release stuck in pending-* even if a helm process for it seems alive.
    #[arg(long)]
    pub force: bool,
    /// Apply again what the checkpoint records done but the tool's own state says is absent
    /// (a terraform state emptied by a crash); without it `recover` stops and says how to
    /// reconcile (`terraform import`, or restore `terraform.tfstate.backup`).
    #[arg(long)]
    pub reapply_missing: bool,
    /// Run up to N independent steps at once.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub parallel: usize,
    /// After a failure, keep running the steps that do not need the failed one; the steps
    /// that do are skipped (stack key `on_failure: continue` sets this by default).
    #[arg(long)]
    pub keep_going: bool,
}

pub async fn run(args: &RecoverArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let RecoverArgs { stack, dry_run, parallel, force, reapply_missing, keep_going } = args;
    let mut s = session(stack, global, ui, *parallel)?;
    s.force = *force;
    s.reapply_missing = *reapply_missing;
    s.keep_going |= *keep_going;
    super::present(&s, &s.recover(*dry_run).await?)
}

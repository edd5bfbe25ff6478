//! `rdeploy up`: run the stack: a new deploy of every step.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::{session, Global};
use crate::exit::Code;
use crate::planfile;
use crate::ui::Ui;

#[derive(Args)]
pub struct UpArgs {
    #[arg(default_value = "stack.yaml")]
    pub stack: PathBuf,
    /// Run up to N independent steps at once.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub parallel: usize,
    /// After a failure, keep running the steps that do not need the failed one; the steps
    /// that do are skipped (stack key `on_failure: continue` sets this by default).
    #[arg(long)]
    pub keep_going: bool,
    /// Run every tool even for what its preview finds already in place (a shell sub-change
    /// whose `check` passes, a helm release, kubectl object or terraform plan with no change).
    #[arg(long)]
    pub force_apply: bool,
    /// Apply exactly the reviewed plan `rdeploy plan -o PLANFILE` saved: refused (exit 2,
    /// nothing recorded) when anything it saw has moved since; terraform applies its saved plan.
    #[arg(long, value_name = "PLANFILE")]
    pub plan: Option<PathBuf>,
}

pub async fn run(args: &UpArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let UpArgs { stack, parallel, keep_going, force_apply, plan } = args;
    let mut s = session(stack, global, ui, *parallel)?;
    s.keep_going |= *keep_going;
    s.force_apply = *force_apply;
    if let Some(path) = plan {
        s.from_plan = Some(Arc::new(planfile::load(path)?));
    }
    super::present(&s, &s.up().await?)
}

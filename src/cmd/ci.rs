//! `rdeploy ci`: CI wrapper: `up`, or `recover` when an unfinished deploy is recorded.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::{session, Global};
use crate::exit::Code;
use crate::ui::Ui;
use crate::{ci, planfile};

#[derive(Args)]
pub struct CiArgs {
    #[arg(default_value = "stack.yaml")]
    pub stack: PathBuf,
    /// Write a JUnit XML report (one test case per step) to FILE.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// For pull requests: `rdeploy plan` to stdout, the step summary and `--junit`; nothing
    /// is deployed (with `-o PLANFILE`, the plan is saved too, for `ci --plan` on merge).
    #[arg(long, conflicts_with = "plan")]
    pub plan_only: bool,
    /// With `--plan-only`: save the plan to PLANFILE (owner-only), as `plan -o` does.
    #[arg(short = 'o', long = "out", value_name = "PLANFILE", requires = "plan_only")]
    pub out: Option<PathBuf>,
    /// On merge: apply exactly the reviewed plan (`up --plan PLANFILE`), refused (exit 2)
    /// when anything it saw has moved.
    #[arg(long, value_name = "PLANFILE")]
    pub plan: Option<PathBuf>,
    /// Run up to N independent steps at once.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub parallel: usize,
    /// After a failure, keep running the steps that do not need the failed one; the steps
    /// that do are skipped (stack key `on_failure: continue` sets this by default).
    #[arg(long)]
    pub keep_going: bool,
    /// As `up --force-apply`: run every tool even for what is already in place.
    #[arg(long, conflicts_with = "plan_only")]
    pub force_apply: bool,
}

pub async fn run(args: &CiArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let CiArgs { stack, junit, plan_only, out, plan, parallel, keep_going, force_apply } = args;
    let outputs = ci::Outputs::from_env(junit.clone());
    let mut s = match session(stack, global, ui.clone(), *parallel) {
        Ok(mut s) => {
            s.keep_going |= *keep_going;
            s.force_apply = *force_apply;
            s
        }
        Err(e) => {
            let arg = stack.display().to_string();
            return Err(ci::report_error(&outputs, &ui, &arg, &arg, e));
        }
    };
    if *plan_only {
        return ci::plan_only(&s, &outputs, out.as_deref()).await;
    }
    let plan = match plan.as_deref().map(planfile::load).transpose() {
        Ok(plan) => plan,
        Err(e) => return Err(ci::report_error(&outputs, &ui, &s.stack.name, &s.stack_arg, e)),
    };
    ci::run(&mut s, &outputs, plan).await
}

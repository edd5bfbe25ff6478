//! `rdeploy plan`: what `up` would change, step by step; changes nothing.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::{session, Global};
use crate::exit::Code;
use crate::ui::Ui;
use crate::{plan, planfile};

#[derive(Args)]
pub struct PlanArgs {
    #[arg(default_value = "stack.yaml")]
    pub stack: PathBuf,
    /// Machine-readable output (its fields: docs/plan.md, "`--json`").
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// Markdown for a pull-request comment or the CI step summary.
    #[arg(long)]
    pub markdown: bool,
    /// Exit 0 when nothing would change and 7 when something would (other codes as usual).
    #[arg(long)]
    pub detailed_exitcode: bool,
    /// Also save the plan to PLANFILE (owner-only), for `rdeploy up --plan PLANFILE` to apply
    /// exactly as reviewed.
    #[arg(short = 'o', long = "out", value_name = "PLANFILE")]
    pub out: Option<PathBuf>,
}

pub async fn run(args: &PlanArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let PlanArgs { stack, json, markdown, detailed_exitcode, out } = args;
    let s = session(stack, global, ui.clone(), 1)?;
    if out.is_some() {
        planfile::refuse_fleet_steps(&s.stack, "rdeploy plan -o")?;
    }
    let plan = s.plan().await?;
    if let Some(path) = out {
        let digest =
            planfile::write(path, &planfile::build(&s.stack, &s.stack_file, &s.state.shared, &plan, &s.redactor)?)?;
        ui.info(format!(
            "saved the plan to {} (sha256:{}); apply it with `rdeploy up {} --plan {}`",
            path.display(),
            &digest[..12],
            s.stack_arg,
            path.display()
        ));
    }
    if *json {
        outln!(ui.out(), "{}", plan::render_json(&plan)?);
    } else if *markdown {
        out!(ui.out(), "{}", plan::render_markdown(&plan));
    } else {
        out!(ui.out(), "{}", plan::render_text(&plan));
    }
    Ok(if *detailed_exitcode && plan.has_changes() { Code::Changes } else { Code::Ok })
}

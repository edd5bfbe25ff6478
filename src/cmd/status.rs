//! `rdeploy status`: partial-state report of the recorded deploy.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::{session, Global};
use crate::exit::Code;
use crate::ui::Ui;
use crate::{report, ui};

#[derive(Args)]
pub struct StatusArgs {
    #[arg(default_value = "stack.yaml")]
    pub stack: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Exit with the recorded deploy's state: 0 complete (or nothing recorded), 1 stopped
    /// part-way (`recover` resumes), 3 reverted, 6 a revert failed (see docs/exit-codes.md).
    #[arg(long)]
    pub detailed_exitcode: bool,
}

pub async fn run(args: &StatusArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let StatusArgs { stack, json, detailed_exitcode } = args;
    let s = session(stack, global, ui.clone(), 1)?;
    let status = report::build(&s.stack, s.store.as_ref(), &s.state, &s.stack_arg)?;
    if *json {
        ui.out().json(&status)?;
    } else {
        let color = global.color().enabled(std::io::IsTerminal::is_terminal(&std::io::stdout()));
        out!(ui.out(), "{}", report::render_text(&status, ui::Paint { enabled: color }));
    }
    Ok(if *detailed_exitcode { status.exit_code() } else { Code::Ok })
}

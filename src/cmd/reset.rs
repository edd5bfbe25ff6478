//! `rdeploy reset`: forget the checkpoint after manual reconciliation.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::{command_args, session, Global};
use crate::exit::{Code, Refusal};
use crate::ui::Ui;

#[derive(Args)]
pub struct ResetArgs {
    #[arg(default_value = "stack.yaml")]
    pub stack: PathBuf,
    /// Confirm: the record of what is in place is archived and no longer used.
    #[arg(long)]
    pub yes: bool,
}

pub async fn run(args: &ResetArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let ResetArgs { stack, yes } = args;
    if !yes {
        return Err(Refusal::new(
            Code::BadInput,
            "`reset` forgets the checkpoint: what is in place will no longer be known to rdeploy",
        )
        .with_hint(format!(
            "reconcile by hand first (`rdeploy status {}`), then pass `--yes`",
            command_args(stack, global)
        ))
        .into());
    }
    let s = session(stack, global, ui, 1)?;
    super::present(&s, &s.reset()?)
}

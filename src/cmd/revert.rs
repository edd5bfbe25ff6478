//! `rdeploy revert`: undo the completed steps that declare `revert`, newest first.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::{session, Global};
use crate::exit::Code;
use crate::ui::Ui;

#[derive(Args)]
pub struct RevertArgs {
    #[arg(default_value = "stack.yaml")]
    pub stack: PathBuf,
}

pub async fn run(args: &RevertArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let RevertArgs { stack } = args;
    let s = session(stack, global, ui, 1)?;
    super::present(&s, &s.revert().await?)
}

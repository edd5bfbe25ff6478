//! `rdeploy runbook`: write the runbook markdown: per step how to inspect, recover, revert and verify.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::global::{session, Global};
use crate::exit::Code;
use crate::runbook;
use crate::ui::Ui;

#[derive(Args)]
pub struct RunbookArgs {
    #[arg(default_value = "stack.yaml")]
    pub stack: PathBuf,
    /// Write to FILE instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub async fn run(args: &RunbookArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let RunbookArgs { stack, output } = args;
    let s = session(stack, global, ui.clone(), 1)?;
    let text = runbook::render(&s.stack, &s.stack_file, &s.stack_arg, s.store.as_ref(), &s.state)?;
    match output {
        Some(path) => {
            // Redacted as stdout is: the file is the same runbook.
            fs_err::write(path, ui.redactor().redact_document(&text))?;
            ui.info(format!("wrote the runbook of stack {} to {}", s.stack.name, path.display()));
        }
        None => out!(ui.out(), "{text}"),
    }
    Ok(Code::Ok)
}

//! `rdeploy completions`: shell completions: `rdeploy completions bash > /etc/bash_completion.d/rdeploy`.

use clap::Args;

use crate::exit::Code;
use crate::out::Out;

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

pub fn run(args: &CompletionsArgs, mut cli: clap::Command, out: &Out) -> anyhow::Result<Code> {
    let CompletionsArgs { shell } = args;
    let mut text = Vec::new();
    clap_complete::generate(*shell, &mut cli, "rdeploy", &mut text);
    out!(out, "{}", String::from_utf8_lossy(&text));
    Ok(Code::Ok)
}

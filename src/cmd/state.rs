//! `rdeploy state`: moving checkpoints between stores (and measuring a store).

use clap::Subcommand;

use crate::exit::Code;
use crate::out::Out;
use crate::store;

#[derive(Subcommand)]
pub enum StateCommand {
    /// Move a stack's checkpoint (unfinished journal and history) between stores.
    Migrate {
        /// A state directory or a `postgres://` URL.
        #[arg(long, value_name = "DIR|URL")]
        from: String,
        /// A state directory or a `postgres://` URL.
        #[arg(long, value_name = "DIR|URL")]
        to: String,
        /// The stack's name (required when `--from` is a database, which holds many stacks).
        #[arg(long, value_name = "NAME")]
        stack: Option<String>,
    },
    /// Measure the cost of a journal record in a store (for `benches/store.sh`).
    #[command(hide = true)]
    Bench {
        /// A state directory or a `postgres://` URL.
        #[arg(long, value_name = "DIR|URL")]
        to: String,
        /// Sub-changes to record (two records each: started, synced; done, group-committed).
        #[arg(long, default_value_t = 500)]
        sub_changes: usize,
    },
}

pub fn run(args: &StateCommand, out: &Out) -> anyhow::Result<Code> {
    match args {
        StateCommand::Migrate { from, to, stack } => {
            outln!(out, "{}", store::postgres::transfer::migrate(from, to, stack.as_deref())?);
            Ok(Code::Ok)
        }
        StateCommand::Bench { to, sub_changes } => {
            outln!(out, "{}", store::postgres::bench::run(to, *sub_changes)?);
            Ok(Code::Ok)
        }
    }
}

//! rdeploy: resumable multi-tool deploys. This file parses the command line, dispatches each
//! command to its module under `cmd/` and maps errors to exit codes; the work happens in
//! `engine`, which returns a `RunReport` that `cmd` turns into output and an exit code.

/// `println!` for reports, through the run's [`out::Out`] (`outln!(ui.out(), "{x}")`): redacted
/// with the run's secrets, and a closed stdout (`rdeploy status | head`) ends the output quietly
/// instead of panicking, the command still ending with its own exit code.
macro_rules! outln {
    ($out:expr, $($arg:tt)*) => { $crate::out::Out::line($out, format_args!($($arg)*)) };
}

/// `print!` for reports, as [`outln!`].
macro_rules! out {
    ($out:expr, $($arg:tt)*) => { $crate::out::Out::text($out, format_args!($($arg)*)) };
}

mod out;

mod adapter;
mod checkpoint;
mod ci;
mod cmd;
mod diff;
#[deny(clippy::print_stdout, clippy::print_stderr)]
mod engine;
mod exit;
mod fleet;
mod gate;
mod plan;
mod planfile;
mod readiness;
mod redact;
mod reference;
mod report;
mod reporter;
mod rollout;
mod runbook;
mod signals;
mod stack;
mod store;
mod ui;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::cmd::global::Global;
use crate::exit::{Code, Refusal};
use crate::stack::StackError;
use crate::ui::Ui;

/// `rdeploy --version`: the release and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("RDEPLOY_BUILD_COMMIT"), ")");

#[derive(Parser)]
#[command(
    name = "rdeploy",
    version = VERSION,
    about = "Resumable multi-tool deploys: checkpoint every sub-change, recover through each tool's own path"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    global: Global,
}

#[derive(Subcommand)]
enum Command {
    /// Run the stack: a new deploy of every step.
    Up(cmd::up::UpArgs),
    /// Resume a stopped deploy from its checkpoint.
    Recover(cmd::recover::RecoverArgs),
    /// Partial-state report of the recorded deploy.
    Status(cmd::status::StatusArgs),
    /// The outputs the steps recorded.
    ///
    /// Those of the unfinished deploy, else of the last finished one. With STEP and KEY, the bare
    /// value, for scripts.
    #[command(override_usage = "rdeploy output [OPTIONS] [STACK] [STEP [KEY]]")]
    Output(cmd::output::OutputArgs),
    /// Undo the completed steps that declare `revert`, newest first.
    Revert(cmd::revert::RevertArgs),
    /// Forget the checkpoint after manual reconciliation.
    Reset(cmd::reset::ResetArgs),
    /// Check the stack file and that each tool is installed.
    Validate(cmd::validate::ValidateArgs),
    /// Shell completions: `rdeploy completions bash > /etc/bash_completion.d/rdeploy`.
    ///
    /// zsh: write `_rdeploy` into a directory of `$fpath`; fish: `~/.config/fish/completions/rdeploy.fish`.
    Completions(cmd::completions::CompletionsArgs),
    /// The manual page (roff): `rdeploy man > /usr/local/share/man/man1/rdeploy.1`.
    Man,
    /// Move checkpoints between stores (`state migrate --from DIR --to postgres://...`).
    #[command(subcommand)]
    State(cmd::state::StateCommand),
    /// Fleet version inventory: component x version x clusters.
    ///
    /// Stragglers and absent clusters are named. Exits 1 when `--slo` is breached (for CI), 2 on
    /// bad input.
    Inventory(cmd::inventory::InventoryArgs),
    /// Prometheus alerting rules for the fleet.
    ///
    /// A cluster that stopped reporting, a rollout that misses its SLO, a version older than the
    /// support window (check with `promtool check rules`).
    Alerts(cmd::alerts::AlertsArgs),
    /// Write the runbook markdown: per step how to inspect, recover, revert and verify.
    ///
    /// Plus the live state of a recorded deploy.
    Runbook(cmd::runbook::RunbookArgs),
    /// What `up` would change, step by step; changes nothing.
    ///
    /// From each tool's own read-only preview: terraform plan, helm's server dry-run against the
    /// live objects, kubectl diff, ansible check mode, shell checks.
    Plan(cmd::plan::PlanArgs),
    /// CI wrapper: `up`, or `recover` when an unfinished deploy is recorded.
    ///
    /// Plain lines, GitHub annotations and step summary, JUnit.
    Ci(cmd::ci::CiArgs),
}

/// The executable's `.init_array` (as std's own capture of the arguments on Linux): the noting
/// handlers are in place before Rust's runtime initialisation, not only from the first line of
/// `main`, so a signal in between (a window of microseconds that a loaded machine's scheduler
/// stretches to milliseconds) is noted too. Only `sigaction` runs there: no allocation, no std.
#[used]
#[link_section = ".init_array"]
static NOTE_SIGNALS_BEFORE_MAIN: extern "C" fn() = {
    extern "C" fn before_main() {
        signals::note_signals_until_handled();
    }
    before_main
};

fn main() -> ExitCode {
    // Before anything grows: the process that starts every tool is a copy of rdeploy as small
    // as it will ever be, and this thread (which lives as long as rdeploy) is the one whose
    // death the tools' death signal means.
    rdeploy_adapters::process::start_spawner();
    let cli = Cli::parse();
    init_tracing(cli.global.verbose);
    // `ci` is for pipelines: plain timestamped lines even on a terminal.
    let no_progress = cli.global.no_progress || matches!(cli.command, Command::Ci(_));
    // The run's secrets: this invocation is the run, and everything it writes redacts with them.
    let redactor = redact::Redactor::default();
    let ui = Arc::new(Ui::new(no_progress, cli.global.verbose, cli.global.quiet, cli.global.color(), redactor));
    // Tools are started from rdeploy's own threads where they live as long as it does: `main`'s,
    // and every thread of the runtime (see `process::runtime`).
    rdeploy_adapters::process::lives_as_long_as_rdeploy();
    let runtime = match rdeploy_adapters::process::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return Code::Partial.into();
        }
    };
    let code = match runtime.block_on(run(cli, ui.clone())) {
        Ok(code) => code,
        Err(err) => report_error(&err, &ui),
    };
    // A command that never installed the run's handlers (`validate`, `inventory`, ...) still
    // owes the operator the interrupt it swallowed.
    if let Some(name) = signals::take_early_signal() {
        ui.warn(format!("{name} received"));
        return Code::Interrupted.into();
    }
    code.into()
}

fn init_tracing(verbose: u8) {
    let level = match verbose {
        0 | 1 => "warn",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RDEPLOY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).without_time().try_init();
}

/// Prints an error in the house style and picks its exit code.
fn report_error(err: &anyhow::Error, ui: &Ui) -> Code {
    let paint = ui.paint;
    let redactor = ui.redactor();
    if let Some(stack) = err.downcast_ref::<StackError>() {
        eprint!("{}: {}", paint.bad("error"), redactor.redact_document(&stack.to_string()));
        return Code::BadInput;
    }
    if let Some(refusal) = err.downcast_ref::<Refusal>() {
        eprintln!("{}: {}", paint.bad("error"), redactor.redact_document(&refusal.message));
        if let Some(hint) = &refusal.hint {
            eprintln!("  {}: {}", paint.strong("hint"), redactor.redact_document(hint));
        }
        return refusal.code;
    }
    // Anything else happened after work may have started (input errors are refused earlier as
    // `StackError` or `Refusal`), so it is never "nothing changed".
    eprintln!("{}: {}", paint.bad("error"), redactor.redact_document(&format!("{err:#}")));
    Code::Partial
}

/// Hands the parsed command to its module under `cmd/`.
async fn run(cli: Cli, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let global = &cli.global;
    match &cli.command {
        Command::Completions(args) => cmd::completions::run(args, <Cli as clap::CommandFactory>::command(), ui.out()),
        Command::Man => cmd::man::run(<Cli as clap::CommandFactory>::command(), ui.out()),
        Command::Up(args) => cmd::up::run(args, global, ui).await,
        Command::Recover(args) => cmd::recover::run(args, global, ui).await,
        Command::Revert(args) => cmd::revert::run(args, global, ui).await,
        Command::Reset(args) => cmd::reset::run(args, global, ui).await,
        Command::Status(args) => cmd::status::run(args, global, ui).await,
        Command::Output(args) => cmd::output::run(args, global, ui).await,
        Command::Runbook(args) => cmd::runbook::run(args, global, ui).await,
        Command::Ci(args) => cmd::ci::run(args, global, ui).await,
        Command::Plan(args) => cmd::plan::run(args, global, ui).await,
        Command::Inventory(args) => cmd::inventory::run(args, global, ui).await,
        Command::Alerts(args) => cmd::alerts::run(args, global, ui).await,
        Command::State(args) => cmd::state::run(args, ui.out()),
        Command::Validate(args) => cmd::validate::run(args, global, ui).await,
    }
}

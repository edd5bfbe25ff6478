//! rdeploy: resumable multi-tool deploys. This file owns the command line and the mapping of
//! errors to exit codes; the work happens in `engine`, which returns a `RunReport` that `cmd`
//! turns into output and an exit code.

/// `println!` for reports: a closed stdout (`rdeploy status | head`) ends the output quietly
/// instead of panicking, and the command still ends with its own exit code.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::out::line(format_args!($($arg)*)) };
}

/// `print!` for reports, as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::text(format_args!($($arg)*)) };
}

mod out;

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
mod reference;
mod report;
mod reporter;
mod rollout;
mod runbook;
mod stack;
mod store;
mod ui;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Args, Parser, Subcommand};
use rdeploy_adapters::CancellationToken;

use crate::exit::{Code, Refusal};
use crate::stack::StackError;
use crate::store::StateDir;
use crate::ui::{ColorChoice, Ui};

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

#[derive(Args)]
struct Global {
    /// Where the checkpoint lives, for one stack (default: `.rdeploy/NAME/` beside the stack
    /// file, NAME being the stack's `name`).
    #[arg(long, global = true, env = "RDEPLOY_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Keep the checkpoint and the lock in PostgreSQL (`postgres://user@host/db`), shared by
    /// every runner; overrides the stack file's `state:`. Logs stay in the state directory.
    #[arg(long, global = true, env = "RDEPLOY_STATE", value_name = "URL")]
    state: Option<String>,
    /// More output: the tools' own lines (-v), debug logs (-vv).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Only errors and the report.
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Plain timestamped lines instead of progress bars.
    #[arg(long, global = true)]
    no_progress: bool,
    /// Color output (honours NO_COLOR in `auto`).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
    /// No color: the same as `--color never`.
    #[arg(long, global = true)]
    no_color: bool,
}

impl Global {
    /// `--color`, with `--no-color` winning.
    fn color(&self) -> ColorChoice {
        if self.no_color {
            ColorChoice::Never
        } else {
            self.color
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the stack: a new deploy of every step.
    Up {
        #[arg(default_value = "stack.yaml")]
        stack: PathBuf,
        /// Run up to N independent steps at once.
        #[arg(long, default_value_t = 1, value_name = "N")]
        parallel: usize,
        /// After a failure, keep running the steps that do not need the failed one; the steps
        /// that do are skipped (stack key `on_failure: continue` sets this by default).
        #[arg(long)]
        keep_going: bool,
        /// Run every tool even for what its preview finds already in place (a shell sub-change
        /// whose `check` passes, a helm release, kubectl object or terraform plan with no change).
        #[arg(long)]
        force_apply: bool,
        /// Apply exactly the reviewed plan `rdeploy plan -o PLANFILE` saved: refused (exit 2,
        /// nothing recorded) when anything it saw has moved since; terraform applies its saved plan.
        #[arg(long, value_name = "PLANFILE")]
        plan: Option<PathBuf>,
    },
    /// Resume a stopped deploy from its checkpoint.
    Recover {
        #[arg(default_value = "stack.yaml")]
        stack: PathBuf,
        /// Print what recovery would do, from each tool's live state; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Recover a release stuck in pending-* even if a helm process for it seems alive.
        #[arg(long)]
        force: bool,
        /// Apply again what the checkpoint records done but the tool's own state says is absent
        /// (a terraform state emptied by a crash); without it `recover` stops and says how to
        /// reconcile (`terraform import`, or restore `terraform.tfstate.backup`).
        #[arg(long)]
        reapply_missing: bool,
        /// Run up to N independent steps at once.
        #[arg(long, default_value_t = 1, value_name = "N")]
        parallel: usize,
        /// After a failure, keep running the steps that do not need the failed one; the steps
        /// that do are skipped (stack key `on_failure: continue` sets this by default).
        #[arg(long)]
        keep_going: bool,
    },
    /// Partial-state report of the recorded deploy.
    Status {
        #[arg(default_value = "stack.yaml")]
        stack: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Exit with the recorded deploy's state: 0 complete (or nothing recorded), 1 stopped
        /// part-way (`recover` resumes), 3 reverted, 6 a revert failed (see docs/exit-codes.md).
        #[arg(long)]
        detailed_exitcode: bool,
    },
    /// The outputs the steps recorded.
    ///
    /// Those of the unfinished deploy, else of the last finished one. With STEP and KEY, the bare
    /// value, for scripts.
    #[command(override_usage = "rdeploy output [OPTIONS] [STACK] [STEP [KEY]]")]
    Output {
        /// `[STACK] [STEP [KEY]]`: the stack file (default `stack.yaml`), a step, one of its outputs.
        #[arg(value_name = "STACK STEP KEY", num_args = 0..=3)]
        words: Vec<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Print sensitive values too, read again from the tool's own state (never recorded).
        #[arg(long)]
        show_sensitive: bool,
    },
    /// Undo the completed steps that declare `revert`, newest first.
    Revert {
        #[arg(default_value = "stack.yaml")]
        stack: PathBuf,
    },
    /// Forget the checkpoint after manual reconciliation.
    Reset {
        #[arg(default_value = "stack.yaml")]
        stack: PathBuf,
        /// Confirm: the record of what is in place is archived and no longer used.
        #[arg(long)]
        yes: bool,
    },
    /// Check the stack file and that each tool is installed.
    Validate {
        /// The stack file, or a directory holding `stack.yaml`.
        #[arg(default_value = "stack.yaml")]
        stack: PathBuf,
        /// Machine-readable output for editors and CI: `valid`, the steps, and every problem
        /// with its file, line and column (exit codes unchanged).
        #[arg(long)]
        json: bool,
    },
    /// Shell completions: `rdeploy completions bash > /etc/bash_completion.d/rdeploy`.
    ///
    /// zsh: write `_rdeploy` into a directory of `$fpath`; fish: `~/.config/fish/completions/rdeploy.fish`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The manual page (roff): `rdeploy man > /usr/local/share/man/man1/rdeploy.1`.
    Man,
    /// Move checkpoints between stores (`state migrate --from DIR --to postgres://...`).
    #[command(subcommand)]
    State(StateCommand),
    /// Fleet version inventory: component x version x clusters.
    ///
    /// Stragglers and absent clusters are named. Exits 1 when `--slo` is breached (for CI), 2 on
    /// bad input.
    Inventory(InventoryArgs),
    /// Prometheus alerting rules for the fleet.
    ///
    /// A cluster that stopped reporting, a rollout that misses its SLO, a version older than the
    /// support window (check with `promtool check rules`).
    Alerts(AlertsArgs),
    /// Write the runbook markdown: per step how to inspect, recover, revert and verify.
    ///
    /// Plus the live state of a recorded deploy.
    Runbook {
        #[arg(default_value = "stack.yaml")]
        stack: PathBuf,
        /// Write to FILE instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// What `up` would change, step by step; changes nothing.
    ///
    /// From each tool's own read-only preview: terraform plan, helm's server dry-run against the
    /// live objects, kubectl diff, ansible check mode, shell checks.
    Plan {
        #[arg(default_value = "stack.yaml")]
        stack: PathBuf,
        /// Machine-readable output (its fields: docs/plan.md, "`--json`").
        #[arg(long, conflicts_with = "markdown")]
        json: bool,
        /// Markdown for a pull-request comment or the CI step summary.
        #[arg(long)]
        markdown: bool,
        /// Exit 0 when nothing would change and 7 when something would (other codes as usual).
        #[arg(long)]
        detailed_exitcode: bool,
        /// Also save the plan to PLANFILE (owner-only), for `rdeploy up --plan PLANFILE` to apply
        /// exactly as reviewed.
        #[arg(short = 'o', long = "out", value_name = "PLANFILE")]
        out: Option<PathBuf>,
    },
    /// CI wrapper: `up`, or `recover` when an unfinished deploy is recorded.
    ///
    /// Plain lines, GitHub annotations and step summary, JUnit.
    Ci {
        #[arg(default_value = "stack.yaml")]
        stack: PathBuf,
        /// Write a JUnit XML report (one test case per step) to FILE.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// For pull requests: `rdeploy plan` to stdout, the step summary and `--junit`; nothing
        /// is deployed (with `-o PLANFILE`, the plan is saved too, for `ci --plan` on merge).
        #[arg(long, conflicts_with = "plan")]
        plan_only: bool,
        /// With `--plan-only`: save the plan to PLANFILE (owner-only), as `plan -o` does.
        #[arg(short = 'o', long = "out", value_name = "PLANFILE", requires = "plan_only")]
        out: Option<PathBuf>,
        /// On merge: apply exactly the reviewed plan (`up --plan PLANFILE`), refused (exit 2)
        /// when anything it saw has moved.
        #[arg(long, value_name = "PLANFILE")]
        plan: Option<PathBuf>,
        /// Run up to N independent steps at once.
        #[arg(long, default_value_t = 1, value_name = "N")]
        parallel: usize,
        /// After a failure, keep running the steps that do not need the failed one; the steps
        /// that do are skipped (stack key `on_failure: continue` sets this by default).
        #[arg(long)]
        keep_going: bool,
        /// As `up --force-apply`: run every tool even for what is already in place.
        #[arg(long, conflicts_with = "plan_only")]
        force_apply: bool,
    },
}

#[derive(Args)]
struct InventoryArgs {
    /// The kubeconfig (default: `$KUBECONFIG`, else `~/.kube/config`).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Contexts to ask: names or globs like `edge-*`, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    contexts: Vec<String>,
    /// A fleet file: `clusters: {NAME: {site: .., region: ..}}`; its clusters are the fleet.
    #[arg(long, value_name = "FILE")]
    fleet: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Markdown output.
    #[arg(long)]
    markdown: bool,
    /// Flag versions older than the newest N of each component as incidents.
    #[arg(long, value_name = "N")]
    supported: Option<usize>,
    /// Rollout-completion objectives, like `95%@48h,100%@7d`; a breach exits 1.
    #[arg(long, value_name = "OBJECTIVES")]
    slo: Option<String>,
    /// Only this component (image repository); `IMAGE:TAG` judges against that version.
    #[arg(long, value_name = "IMAGE")]
    component: Option<String>,
    /// When the rollout started (RFC 3339, or a duration ago like `36h`), instead of the time
    /// `rdeploy inventory` first saw the version (recorded in the state directory).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Only workloads in this namespace.
    #[arg(long, short = 'n', value_name = "NS")]
    namespace: Option<String>,
    /// Only workloads whose labels (or pod template labels) match, like `app=node-agent`.
    #[arg(long, short = 'l', value_name = "SELECTOR")]
    selector: Option<String>,
    /// Per-cluster time to answer before it counts as absent.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    timeout: std::time::Duration,
    /// Where the fleet is read: each cluster's Kubernetes API, or Prometheus series
    /// (`kube_pod_container_info`) for clusters the runner cannot reach.
    #[arg(long, value_enum, default_value_t = InventorySource::Api)]
    source: InventorySource,
    /// The Prometheus base URL (with `--source prometheus`).
    #[arg(long, env = "RDEPLOY_PROMETHEUS_URL", value_name = "URL")]
    prometheus_url: Option<String>,
    /// The series label that names the cluster (with `--source prometheus`).
    #[arg(long, default_value = "cluster", value_name = "LABEL")]
    cluster_label: String,
    /// A cluster whose newest series is older than this is absent (with `--source prometheus`).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, value_name = "DURATION")]
    stale_after: std::time::Duration,
    /// Also write a self-contained dashboard page (no network needed to view it).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum InventorySource {
    Api,
    Prometheus,
}

#[derive(Args)]
struct AlertsArgs {
    /// The kubeconfig whose contexts are the fleet, when there is no fleet file.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Contexts: names or globs like `edge-*`, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    contexts: Vec<String>,
    /// A fleet file: its clusters are the fleet, their labels go on the alerts.
    #[arg(long, value_name = "FILE")]
    fleet: Option<PathBuf>,
    /// Rollout-completion objectives, like `95%@48h,100%@7d`, measured from the recorded
    /// rollout start of each component's newest version.
    #[arg(long, value_name = "OBJECTIVES")]
    slo: Option<String>,
    /// Alert on versions older than the newest N recorded for a component.
    #[arg(long, value_name = "N")]
    supported: Option<usize>,
    /// Only these components (image repositories); `IMAGE:TAG` makes TAG the wanted version.
    #[arg(long, value_delimiter = ',', value_name = "IMAGE")]
    component: Vec<String>,
    /// When the rollout started (RFC 3339, or a duration ago like `36h`), instead of the time
    /// `rdeploy inventory` first saw the version.
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// How long without a successful scrape before a cluster is reported absent.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration, value_name = "DURATION")]
    absent_for: std::time::Duration,
    /// The series label that names the cluster.
    #[arg(long, default_value = "cluster", value_name = "LABEL")]
    cluster_label: String,
    /// Write the rules to FILE instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Subcommand)]
enum StateCommand {
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

/// A SIGINT/SIGTERM that came before the run's own handlers were installed (0: none; -1: the
/// handlers of `watch_signals` have taken over).
static EARLY_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn note_early_signal(signal: libc::c_int) {
    // Only an atomic store: async-signal-safe. Once `watch_signals` owns the signals this is a
    // no-op (tokio's handler chains to this one).
    let _ = EARLY_SIGNAL.compare_exchange(
        0,
        signal,
        std::sync::atomic::Ordering::SeqCst,
        std::sync::atomic::Ordering::SeqCst,
    );
}

/// Before Rust's runtime starts: a Ctrl-C or SIGTERM before the runtime and the run's handlers
/// exist is noted instead of killing rdeploy by the default action; `watch_signals` acts on it.
fn note_signals_until_handled() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only does an atomic compare-exchange, which is async-signal-safe;
        // the sigaction struct is zeroed and then filled as sigaction(2) requires.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = note_early_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The signal noted before the run's handlers took over, if any; from now on they do.
fn take_early_signal() -> Option<&'static str> {
    match EARLY_SIGNAL.swap(-1, std::sync::atomic::Ordering::SeqCst) {
        libc::SIGINT => Some("SIGINT"),
        libc::SIGTERM => Some("SIGTERM"),
        _ => None,
    }
}

/// The executable's `.init_array` (as std's own capture of the arguments on Linux): the noting
/// handlers are in place before Rust's runtime initialisation, not only from the first line of
/// `main`, so a signal in between (a window of microseconds that a loaded machine's scheduler
/// stretches to milliseconds) is noted too. Only `sigaction` runs there: no allocation, no std.
#[used]
#[link_section = ".init_array"]
static NOTE_SIGNALS_BEFORE_MAIN: extern "C" fn() = {
    extern "C" fn before_main() {
        note_signals_until_handled();
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
    let no_progress = cli.global.no_progress || matches!(cli.command, Command::Ci { .. });
    let ui = Arc::new(Ui::new(no_progress, cli.global.verbose, cli.global.quiet, cli.global.color()));
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
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
    if let Some(name) = take_early_signal() {
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
    if let Some(stack) = err.downcast_ref::<StackError>() {
        eprint!("{}: {}", paint.bad("error"), out::secrets().redact_document(&stack.to_string()));
        return Code::BadInput;
    }
    if let Some(refusal) = err.downcast_ref::<Refusal>() {
        eprintln!("{}: {}", paint.bad("error"), out::secrets().redact_document(&refusal.message));
        if let Some(hint) = &refusal.hint {
            eprintln!("  {}: {}", paint.strong("hint"), out::secrets().redact_document(hint));
        }
        return refusal.code;
    }
    // Anything else happened after work may have started (input errors are refused earlier as
    // `StackError` or `Refusal`), so it is never "nothing changed".
    eprintln!("{}: {}", paint.bad("error"), out::secrets().redact_document(&format!("{err:#}")));
    Code::Partial
}

/// Loads the stack file, mapping "not found" to a clear bad-input error.
fn load_stack(path: &Path) -> anyhow::Result<stack::Stack> {
    if !path.exists() {
        return Err(Refusal::new(Code::BadInput, format!("no stack file at {}", path.display()))
            .with_hint("pass the stack file: `rdeploy up path/to/stack.yaml`")
            .into());
    }
    let stack = stack::load(path).map_err(|e| match e.downcast::<StackError>() {
        Ok(stack_error) => stack_error.into(),
        Err(other) => Refusal::new(Code::BadInput, format!("{other:#}")).into(),
    });
    give_back_freed_memory();
    stack
}

/// Parsing a large stack file (its YAML tree with every span) leaves megabytes freed but held
/// by the allocator. Every tool rdeploy starts is forked from this process (see
/// `adapters/src/process.rs`), and a fork costs in proportion to the memory it maps, so hand
/// those pages back to the kernel once.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn session(stack_path: &Path, global: &Global, ui: Arc<Ui>, parallel: usize) -> anyhow::Result<engine::Session> {
    let stack_path = &stack_file_in(stack_path);
    let stack = load_stack(stack_path)?;
    let state = match &global.state_dir {
        Some(dir) => StateDir::new(dir.clone()),
        None => {
            let (state, moved) = store::layout::default_state_dir(&stack.dir, &stack.name)?;
            if let Some(moved) = moved {
                ui.warn(moved);
            }
            state
        }
    };
    let store: Arc<dyn store::Store> = match global.state.as_deref().or(stack.state.as_deref()) {
        Some(url) => Arc::new(store::postgres::PostgresStore::open(url, &stack.name, Some(state.clone()))?),
        None => {
            let local = store::local::LocalStore::new(state.clone());
            if global.state_dir.is_some() {
                store::layout::refuse_another_stack(&local, &stack.name)?;
            }
            Arc::new(local)
        }
    };
    let cancel = CancellationToken::new();
    let signal = Arc::new(Mutex::new(None));
    watch_signals(cancel.clone(), signal.clone(), ui.clone());
    let keep_going = stack.on_failure == stack::OnFailure::Continue;
    let processes = rdeploy_adapters::process::ProcessTracker::in_dir(state.path.join("running"));
    Ok(engine::Session {
        stack: Arc::new(stack),
        store,
        reporters: engine::event::Reporters::new(vec![
            ui.clone(),
            Arc::new(reporter::step_log::StepLog::new(state.clone(), ui.clone())),
        ]),
        state,
        ui,
        stack_arg: command_args(stack_path, global),
        stack_file: stack_path.display().to_string(),
        cancel,
        signal,
        parallel,
        force: false,
        force_apply: false,
        keep_going,
        reapply_missing: false,
        processes,
        sensitive: Default::default(),
        took_over: Mutex::new(None),
        from_plan: None,
    })
}

/// The stack file and the flags that locate its state, as the operator gave them, for the
/// commands rdeploy prints (`rdeploy recover STACK --state-dir DIR`): a printed command without
/// them would read another checkpoint. A flag set through its environment variable is left out
/// (the variable is still set for the next command); a database password is never printed.
fn command_args(stack_path: &Path, global: &Global) -> String {
    let mut words = vec![rdeploy_adapters::shell_quote(&stack_path.display().to_string())];
    let from_env = |var: &str, value: &str| std::env::var_os(var).is_some_and(|v| v == value);
    if let Some(dir) = &global.state_dir {
        let dir = dir.display().to_string();
        if !from_env("RDEPLOY_STATE_DIR", &dir) {
            words.push(format!("--state-dir {}", rdeploy_adapters::shell_quote(&dir)));
        }
    }
    if let Some(url) = &global.state {
        if !from_env("RDEPLOY_STATE", url) {
            // A URL that carries a password is shown without it (and its query): the next
            // command then takes the password from `PGPASSWORD`, as the docs say.
            let has_password =
                url.parse::<tokio_postgres::Config>().map(|c| c.get_password().is_some()).unwrap_or(true);
            let shown = if has_password { store::postgres::redact(url) } else { url.clone() };
            words.push(format!("--state {}", rdeploy_adapters::shell_quote(&shown)));
        }
    }
    words.join(" ")
}

/// A stack given as a directory means the `stack.yaml` in it (`rdeploy validate deploy/`).
fn stack_file_in(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("stack.yaml")
    } else {
        path.to_path_buf()
    }
}

/// `rdeploy validate --json`: the verdict as one JSON object, as `terraform validate -json`
/// gives editors and CI: `valid`, the steps in run order with their tool's version, and every
/// problem with its place (`file`, `line`, `column`; absent for a problem outside the file).
async fn validate_json(stack: &Path, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let problems = |err: &anyhow::Error| -> (Vec<serde_json::Value>, Code) {
        if let Some(e) = err.downcast_ref::<StackError>() {
            let list = e
                .problems
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "file": p.file.display().to_string(), "line": p.line, "column": p.column,
                        "message": p.message, "hint": p.hint,
                    })
                })
                .collect();
            return (list, Code::BadInput);
        }
        let (message, hint, code) = match err.downcast_ref::<Refusal>() {
            Some(r) => (r.message.clone(), r.hint.clone(), r.code),
            None => (format!("{err:#}"), None, Code::BadInput),
        };
        (vec![serde_json::json!({ "message": message, "hint": hint })], code)
    };
    let verdict = async {
        let s = session(stack, global, ui, 1)?;
        let steps: Vec<&stack::Step> = s.stack.ordered().collect();
        let tools = s.preflight(&steps).await?;
        let steps: Vec<serde_json::Value> = steps
            .iter()
            .map(|step| {
                serde_json::json!({
                    "name": step.name, "tool": step.tool.to_string(), "line": step.line,
                    "version": tools.get(&step.name).map(|t| t.version.clone()),
                    "resumable": step.resumable,
                })
            })
            .collect();
        anyhow::Ok((s.stack.name.clone(), steps))
    }
    .await;
    let (value, code) = match verdict {
        Ok((name, steps)) => (
            serde_json::json!({ "valid": true, "file": stack.display().to_string(), "stack": name, "steps": steps, "problems": [] }),
            Code::Ok,
        ),
        Err(err) => {
            let (problems, code) = problems(&err);
            (serde_json::json!({ "valid": false, "file": stack.display().to_string(), "problems": problems }), code)
        }
    };
    out::json(&value)?;
    Ok(code)
}

/// The first SIGINT/SIGTERM cancels the run: running tools get SIGINT once and are waited for.
/// A third signal exits at once; the journal is still consistent (records are whole lines).
fn watch_signals(cancel: CancellationToken, signal: Arc<Mutex<Option<String>>>, ui: Arc<Ui>) {
    use tokio::signal::unix::{signal as unix_signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (unix_signal(SignalKind::interrupt()), unix_signal(SignalKind::terminate()))
    else {
        ui.warn("could not install signal handlers; Ctrl-C will stop rdeploy without waiting for the tools");
        return;
    };
    let early = take_early_signal();
    tokio::spawn(async move {
        let mut count = 0;
        let mut early = early;
        loop {
            let name = match early.take() {
                Some(name) => name,
                None => tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                },
            };
            count += 1;
            match count {
                1 => {
                    *signal.lock().unwrap_or_else(|e| e.into_inner()) = Some(name.to_string());
                    ui.warn(format!("{name} received: stopping the running tools (forwarded once) and waiting for them to finish cleanly"));
                    cancel.cancel();
                }
                2 => ui.warn(
                    "still waiting for the tools to stop; one more signal exits now (the checkpoint stays consistent)",
                ),
                _ => std::process::exit(Code::Interrupted as i32),
            }
        }
    });
}

async fn run(cli: Cli, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let global = &cli.global;
    match &cli.command {
        Command::Completions { shell } => {
            let mut text = Vec::new();
            clap_complete::generate(*shell, &mut <Cli as clap::CommandFactory>::command(), "rdeploy", &mut text);
            out!("{}", String::from_utf8_lossy(&text));
            Ok(Code::Ok)
        }
        Command::Man => {
            let mut text = Vec::new();
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command()).render(&mut text)?;
            out!("{}", String::from_utf8_lossy(&text));
            Ok(Code::Ok)
        }
        Command::Up { stack, parallel, keep_going, force_apply, plan } => {
            let mut s = session(stack, global, ui, *parallel)?;
            s.keep_going |= *keep_going;
            s.force_apply = *force_apply;
            if let Some(path) = plan {
                s.from_plan = Some(Arc::new(planfile::load(path)?));
            }
            cmd::present(&s, &s.up().await?)
        }
        Command::Recover { stack, dry_run, parallel, force, reapply_missing, keep_going } => {
            let mut s = session(stack, global, ui, *parallel)?;
            s.force = *force;
            s.reapply_missing = *reapply_missing;
            s.keep_going |= *keep_going;
            cmd::present(&s, &s.recover(*dry_run).await?)
        }
        Command::Revert { stack } => {
            let s = session(stack, global, ui, 1)?;
            cmd::present(&s, &s.revert().await?)
        }
        Command::Reset { stack, yes } => {
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
            cmd::present(&s, &s.reset()?)
        }
        Command::Status { stack, json, detailed_exitcode } => {
            let s = session(stack, global, ui.clone(), 1)?;
            let status = report::build(&s.stack, s.store.as_ref(), &s.state, &s.stack_arg)?;
            if *json {
                out::json(&status)?;
            } else {
                let color = global.color().enabled(std::io::IsTerminal::is_terminal(&std::io::stdout()));
                out!("{}", report::render_text(&status, ui::Paint { enabled: color }));
            }
            Ok(if *detailed_exitcode { status.exit_code() } else { Code::Ok })
        }
        Command::Output { words, json, show_sensitive } => {
            let target = cmd::output::Target::from_words(words)?;
            let s = session(&target.stack, global, ui.clone(), 1)?;
            out!("{}", cmd::output::render(&s, &target, *json, *show_sensitive).await?);
            Ok(Code::Ok)
        }
        Command::Runbook { stack, output } => {
            let s = session(stack, global, ui.clone(), 1)?;
            let text = runbook::render(&s.stack, &s.stack_file, &s.stack_arg, s.store.as_ref(), &s.state)?;
            match output {
                Some(path) => {
                    fs_err::write(path, text)?;
                    ui.info(format!("wrote the runbook of stack {} to {}", s.stack.name, path.display()));
                }
                None => out!("{text}"),
            }
            Ok(Code::Ok)
        }
        Command::Ci { stack, junit, plan_only, out, plan, parallel, keep_going, force_apply } => {
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
        Command::Plan { stack, json, markdown, detailed_exitcode, out } => {
            let s = session(stack, global, ui.clone(), 1)?;
            if out.is_some() {
                planfile::refuse_fleet_steps(&s.stack, "rdeploy plan -o")?;
            }
            let plan = s.plan().await?;
            if let Some(path) = out {
                let digest = planfile::write(path, &planfile::build(&s.stack, &s.stack_file, &s.state.shared, &plan)?)?;
                ui.info(format!(
                    "saved the plan to {} (sha256:{}); apply it with `rdeploy up {} --plan {}`",
                    path.display(),
                    &digest[..12],
                    s.stack_arg,
                    path.display()
                ));
            }
            if *json {
                outln!("{}", plan::render_json(&plan)?);
            } else if *markdown {
                out!("{}", plan::render_markdown(&plan));
            } else {
                out!("{}", plan::render_text(&plan));
            }
            Ok(if *detailed_exitcode && plan.has_changes() { Code::Changes } else { Code::Ok })
        }
        Command::Inventory(a) => {
            let request = fleet::InventoryRequest {
                kubeconfig: a.kubeconfig.clone(),
                contexts: a.contexts.clone(),
                fleet: a.fleet.clone(),
                json: a.json,
                markdown: a.markdown,
                supported: a.supported,
                slo: a.slo.clone(),
                component: a.component.clone(),
                since: a.since.clone(),
                namespace: a.namespace.clone(),
                selector: a.selector.clone(),
                timeout: a.timeout,
                prometheus: match (a.source, &a.prometheus_url) {
                    (InventorySource::Api, _) => None,
                    (InventorySource::Prometheus, Some(url)) => Some(fleet::prometheus::PromSource {
                        url: url.clone(),
                        cluster_label: a.cluster_label.clone(),
                        stale_after: a.stale_after,
                        timeout: a.timeout.max(std::time::Duration::from_secs(10)),
                    }),
                    (InventorySource::Prometheus, None) => {
                        return Err(Refusal::new(Code::BadInput, "`--source prometheus` needs the Prometheus URL")
                            .with_hint("pass `--prometheus-url http://prometheus:9090` or set `RDEPLOY_PROMETHEUS_URL`")
                            .into())
                    }
                },
                html: a.html.clone(),
            };
            fleet::inventory(&request, &global.state_dir.clone().unwrap_or_else(|| PathBuf::from(".rdeploy"))).await
        }
        Command::Alerts(a) => {
            let request = fleet::alerts::AlertsRequest {
                kubeconfig: a.kubeconfig.clone(),
                contexts: a.contexts.clone(),
                fleet: a.fleet.clone(),
                slo: a.slo.clone(),
                supported: a.supported,
                components: a.component.clone(),
                since: a.since.clone(),
                absent_for: a.absent_for,
                cluster_label: a.cluster_label.clone(),
            };
            let rules = fleet::alerts::generate(
                &request,
                &global.state_dir.clone().unwrap_or_else(|| PathBuf::from(".rdeploy")),
            )?;
            match &a.output {
                Some(path) => {
                    fs_err::write(path, rules)?;
                    ui.info(format!("wrote the fleet alerting rules to {}", path.display()));
                }
                None => out!("{rules}"),
            }
            Ok(Code::Ok)
        }
        Command::State(StateCommand::Migrate { from, to, stack }) => {
            outln!("{}", store::postgres::transfer::migrate(from, to, stack.as_deref())?);
            Ok(Code::Ok)
        }
        Command::State(StateCommand::Bench { to, sub_changes }) => {
            outln!("{}", store::postgres::bench::run(to, *sub_changes)?);
            Ok(Code::Ok)
        }
        Command::Validate { stack, json } => {
            if *json {
                return validate_json(stack, global, ui).await;
            }
            let s = session(stack, global, ui, 1)?;
            let steps: Vec<&stack::Step> = s.stack.ordered().collect();
            let tools = s.preflight(&steps).await?;
            outln!("{}: ok, {} in this order:", stack.display(), out::count(steps.len(), "step"));
            for step in steps {
                let version = tools.get(&step.name).map(|t| t.version.as_str()).unwrap_or("");
                let resumable = if step.resumable { "resumable" } else { "not resumable" };
                outln!("  {} ({} {version}, {resumable})", step.name, step.tool);
            }
            Ok(Code::Ok)
        }
    }
}

//! The flags every command takes (where the state lives, how much to say) and the session they
//! locate: the stack loaded, its store opened, the run's signals watched.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use clap::Args;
use rdeploy_adapters::CancellationToken;

use crate::exit::{Code, Refusal};
use crate::redact::Redactor;
use crate::stack::StackError;
use crate::store::StateDir;
use crate::ui::{ColorChoice, Ui};
use crate::{engine, reporter, signals, stack, store};

#[derive(Args)]
pub struct Global {
    /// Where the checkpoint lives, for one stack (default: `.rdeploy/NAME/` beside the stack
    /// file, NAME being the stack's `name`).
    #[arg(long, global = true, env = "RDEPLOY_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Keep the checkpoint and the lock in PostgreSQL (`postgres://user@host/db`), shared by
    /// every runner; overrides the stack file's `state:`. Logs stay in the state directory.
    #[arg(long, global = true, env = "RDEPLOY_STATE", value_name = "URL")]
    pub state: Option<String>,
    /// More output: the tools' own lines (-v), debug logs (-vv).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors and the report.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Plain timestamped lines instead of progress bars.
    #[arg(long, global = true)]
    pub no_progress: bool,
    /// Color output (honours NO_COLOR in `auto`).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// No color: the same as `--color never`.
    #[arg(long, global = true)]
    pub no_color: bool,
}

impl Global {
    /// `--color`, with `--no-color` winning.
    pub fn color(&self) -> ColorChoice {
        if self.no_color {
            ColorChoice::Never
        } else {
            self.color
        }
    }
}

/// Loads the stack file, mapping "not found" to a clear bad-input error; the secrets it marks
/// join the run's `redactor`.
pub fn load_stack(path: &Path, redactor: &Redactor) -> anyhow::Result<stack::Stack> {
    if !path.exists() {
        return Err(Refusal::new(Code::BadInput, format!("no stack file at {}", path.display()))
            .with_hint("pass the stack file: `rdeploy up path/to/stack.yaml`")
            .into());
    }
    let stack = stack::load(path, redactor).map_err(|e| match e.downcast::<StackError>() {
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

pub fn session(stack_path: &Path, global: &Global, ui: Arc<Ui>, parallel: usize) -> anyhow::Result<engine::Session> {
    let stack_path = &stack_file_in(stack_path);
    let stack = load_stack(stack_path, ui.redactor())?;
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
    signals::watch_signals(cancel.clone(), signal.clone(), ui.clone());
    let keep_going = stack.on_failure == stack::OnFailure::Continue;
    let processes = rdeploy_adapters::process::ProcessTracker::in_dir(state.path.join("running"));
    Ok(engine::Session {
        redactor: ui.redactor().clone(),
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
pub fn command_args(stack_path: &Path, global: &Global) -> String {
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
pub fn stack_file_in(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("stack.yaml")
    } else {
        path.to_path_buf()
    }
}

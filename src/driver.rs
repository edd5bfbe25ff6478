//! The driver: runs a stack's steps in DAG order through their adapters, journals every event
//! before acting on it, and turns failures into the outcomes of docs/exit-codes.md (stop and
//! keep the checkpoint, complete-or-revert, gates, interrupts).
//!
//! The driver decides, the binary presents: every command returns a [`RunReport`] and prints
//! nothing on stdout (`main.rs` denies `print!` here); `cmd` maps the outcome to the exit code
//! and renders the report. What happens as it runs goes out as typed [`RunEvent`]s to the
//! session's reporters (the terminal's progress, the step logs): the driver never lays out a
//! line of text for them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rdeploy_adapters::outputs::OutputValue;
use rdeploy_adapters::secrets::Secret;
use rdeploy_adapters::{
    shell, Adapter, CancellationToken, Converged, Failure, PriorStep, Recovered, RunFate, StartedBy, StepContext,
    ToolInfo,
};
use tokio::task::JoinSet;

use crate::checkpoint::{Checkpoint, CheckpointGone, Deploy, DeployState, Record, StepMode, StepStatus};
use crate::diff::StackDiff;
use crate::engine::attempt::{Action, Attempts};
use crate::engine::event::Reporters;
use crate::engine::event::{Attempt, RunEvent, StepEnd, Work};
use crate::engine::journal::{SharedCheckpoint, StepJournal};
pub use crate::engine::outputs::SensitiveOutputs;
use crate::engine::schedule::{AfterFailure, Schedule, StepEnd as End};
use crate::engine::sink::StepSink;
use crate::exit::{Code, Refusal};
use crate::reference::Reference;
use crate::stack::{OnFailure, Stack, Step};
use crate::store::local::StateDir;
use crate::store::{LockGuard, Store};
use crate::ui::Ui;

/// What every command of the driver shares.
pub struct Session {
    pub stack: Arc<Stack>,
    /// Where the checkpoint and the lock live.
    pub store: Arc<dyn Store>,
    /// Local scratch: logs, adapters' work dirs, the report (the store may be remote).
    pub state: StateDir,
    pub ui: Arc<Ui>,
    /// Who is told what happens as the run goes (the progress display, the step logs).
    pub reporters: Reporters,
    /// The stack file as the operator typed it, followed by the flags that locate its state
    /// (`--state-dir`, `--state`) as given: what every command we print carries.
    pub stack_arg: String,
    /// The stack file as the operator typed it (a path: annotations, the PLANFILE).
    pub stack_file: String,
    /// Cancelled on the first SIGINT/SIGTERM.
    pub cancel: CancellationToken,
    /// The signal that cancelled, if any.
    pub signal: Arc<Mutex<Option<String>>>,
    pub parallel: usize,
    /// `recover --force`: the operator vouches that no other process is working on the
    /// release (helm's stuck pending-* rollback); adapters see it as `StepContext::force`.
    pub force: bool,
    /// `up --force-apply`: every tool runs, even for what its preview finds in place.
    pub force_apply: bool,
    /// `--keep-going` (or `on_failure: continue`): a failure stops only the steps that need
    /// the failed one; independent branches run on.
    pub keep_going: bool,
    /// `recover --reapply-missing`: apply again what the checkpoint records done but the tool's
    /// own state lost (adapters see it as `StepContext::reapply_missing`).
    pub reapply_missing: bool,
    /// Notes every tool this run starts while it runs (under the state dir's `running/`).
    pub processes: rdeploy_adapters::process::ProcessTracker,
    /// The sensitive outputs this process learned, by step: never written anywhere, passed to
    /// their consumers only.
    pub sensitive: SensitiveOutputs,
    /// The holder this run took the lock (or lease) over from, when it died holding it: a fact
    /// the adapters get through `StepContext::started_by` (helm's abandoned `pending-*`).
    pub took_over: Mutex<Option<crate::store::Holder>>,
    /// `up --plan PLANFILE`: the reviewed plan this run applies exactly, or refuses.
    pub from_plan: Option<Arc<crate::planfile::Loaded>>,
}

/// How long a run waits for a tool a dead run left running (terraform finishing the resources
/// in flight after its SIGINT) before it refuses to start beside it.
const SURVIVOR_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

pub use crate::engine::schedule::Outcome;

/// What a command of the driver did: everything the renderers need, nothing printed.
#[derive(Debug)]
pub struct RunReport {
    pub outcome: Outcome,
    /// The deploy as the command left it (folded from its journal); for "nothing to recover",
    /// the last finished one.
    pub deploy: Option<Deploy>,
    /// What changed in the stack since the checkpoint this command continued (`recover`).
    pub diff: Option<StackDiff>,
    pub ended: Ended,
}

/// Which way the command ended.
#[derive(Debug)]
pub enum Ended {
    /// Steps ran (`up`, `recover`, `revert`); `deploy` is where they left it.
    Ran,
    /// `recover` found no unfinished deploy.
    NothingToRecover,
    /// `revert` found neither an unfinished nor a completed deploy of this stack, or (`deploy`
    /// given) one with no step to undo: none that ran declares `revert`. Nothing was recorded.
    NothingToRevert,
    /// `reset` found no unfinished deploy.
    NothingToReset,
    /// `reset` forgot `deploy` (kept in the history).
    Forgot,
    /// `reset` moved aside a journal it could not read at all: why, and where it went.
    ForgotUnreadable { error: String, kept: String },
    /// `recover --dry-run`: what recovery would do, step by step in run order.
    DryRun(Vec<DryRunStep>),
}

impl RunReport {
    fn new(outcome: Outcome, deploy: Option<Deploy>, ended: Ended) -> RunReport {
        RunReport { outcome, deploy, diff: None, ended }
    }
}

/// One step of `recover --dry-run`.
#[derive(Debug)]
pub struct DryRunStep {
    pub name: String,
    pub tool: rdeploy_adapters::Tool,
    /// Its settings changed since the checkpoint.
    pub changed: bool,
    pub plan: DryRunPlan,
}

#[derive(Debug)]
pub enum DryRunPlan {
    /// Done: left as it is.
    LeftAsIs,
    /// Not resumable and left half-done: its revert runs, then the step from the start.
    RevertThenApply { revert: Option<String> },
    /// Runs from the start; `actions` from the tool's inspection (empty when it could not say).
    Apply { why: ApplyWhy, actions: Vec<String> },
    /// Resumes through the tool's recovery path: what the live state says it would do, or why
    /// the live state could not be inspected.
    Recover(Result<Vec<String>, String>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyWhy {
    Reverted,
    NotStarted,
    NotResumable,
}

/// A run in progress: the scheduler's state, the running steps' tasks, and what each running
/// step's outputs were when it started.
struct RunState {
    schedule: Schedule<Action>,
    running: JoinSet<(String, Result<Recovered, Failure>)>,
    /// Each running step's outputs when it started, to tell which changed when it is done.
    outputs_before: HashMap<String, OutputsSeen>,
    /// `up` (not `--force-apply`): each step applies only what its preview finds not in place.
    converging: Option<Converging>,
}

/// `up`'s convergence: the previews made before the run ([`Session::early_previews`]) and
/// whether anything in the run has applied anything since (then a step previews afresh).
struct Converging {
    early: HashMap<String, (rdeploy_adapters::Preview, BTreeMap<String, crate::plan::Resolved<serde_json::Value>>)>,
    applied: Arc<std::sync::atomic::AtomicBool>,
    /// The last finished deploy of the stack (for the outputs of shell steps found in place).
    last: Option<Arc<Deploy>>,
}

/// A step's outputs as known at one moment: the recorded ones and the sensitive ones in memory.
type OutputsSeen = (BTreeMap<String, serde_json::Value>, BTreeMap<String, Secret>);

impl Session {
    fn emit(&self, event: RunEvent) {
        self.reporters.emit(event);
    }

    fn warn(&self, message: impl Into<String>) {
        self.emit(RunEvent::Warning { from_step: None, message: message.into() });
    }

    fn note(&self, message: impl Into<String>) {
        self.emit(RunEvent::Note(message.into()));
    }

    fn step_ended(&self, step: &str, end: StepEnd) {
        self.emit(RunEvent::StepEnded { step: step.to_string(), end });
    }

    pub(crate) fn context(&self, step: &Step, cancel: CancellationToken) -> StepContext {
        StepContext {
            step: step.name.clone(),
            stack: self.stack.name.clone(),
            stack_dir: self.stack.dir.clone(),
            // Absolute: tools run in the stack directory, and a state directory given relative
            // to the caller's (`rdeploy up demo/stack.yaml`) would not be found from there.
            work_dir: std::path::absolute(self.state.step_dir(&step.name))
                .unwrap_or_else(|_| self.state.step_dir(&step.name)),
            env: step.env.clone(),
            timeout: step.timeout,
            cancel,
            processes: self.processes.clone(),
            force: self.force,
            reapply_missing: self.reapply_missing,
            secrets: crate::out::secrets().clone(),
            started_by: Default::default(),
        }
    }

    /// For each sub-change of `step` an earlier run started and that is not done, that run and
    /// whether it is known to be dead: the lock was taken over from it, or its pid on this host
    /// is gone, a zombie, or this very process (a reused pid). A run on another host is never
    /// assumed dead. `current` is this run's id once its run record is in `deploy` (none for a
    /// dry run).
    fn started_by(
        &self,
        deploy: &Deploy,
        step: &str,
        current: Option<&str>,
    ) -> std::collections::BTreeMap<String, StartedBy> {
        let here = crate::store::hostname();
        let took_over = self.took_over.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out = std::collections::BTreeMap::new();
        let Some(state) = deploy.steps.iter().find(|s| s.name == step) else { return out };
        // Started and never finished, or failed since: a refused recover records the pending
        // revision failed, which does not change which run started it (the adapter tells the two
        // apart by `in_flight` and the step's `pending_seen` fact).
        let unfinished = |s: &&crate::checkpoint::SubChangeState| {
            matches!(s.status, rdeploy_adapters::SubStatus::Started | rdeploy_adapters::SubStatus::Failed)
        };
        let pending_seen = state.facts.get("pending_seen").and_then(|v| v.as_u64());
        for sub in state.sub_changes.iter().filter(unfinished) {
            let Some(run_id) = sub.started_by.as_deref().filter(|id| Some(*id) != current) else { continue };
            let Some(run) = deploy.runs.iter().find(|r| r.run_id == run_id) else { continue };
            let dead_here = run.host == here
                && (run.pid == std::process::id() || !rdeploy_adapters::process::process_lives(run.pid as i32));
            let fate = if run.host != here {
                RunFate::OtherHost
            } else if !dead_here {
                RunFate::AliveHere
            } else if took_over.as_ref().is_some_and(|h| h.host == here && h.pid == run.pid) {
                RunFate::LockTakenOver
            } else {
                RunFate::DeadHere
            };
            out.insert(
                sub.id.clone(),
                StartedBy {
                    run_id: run.run_id.clone(),
                    command: run.command.clone(),
                    host: run.host.clone(),
                    pid: run.pid,
                    fate,
                    in_flight: sub.status == rdeploy_adapters::SubStatus::Started,
                    started_at: sub.started_at.map(|t| t.0.unix_timestamp()),
                    pending_seen,
                },
            );
        }
        out
    }

    /// The step as it runs now and its context: the values the stack marks secret read (from
    /// rdeploy's environment, files) into its tool key and `env`, and registered with the run's
    /// secrets, as are the values secret by their name. A secret that cannot be read is a failure
    /// of the step before its tool starts, naming the key and the source.
    pub(crate) fn resolved(&self, step: &Step, cancel: CancellationToken) -> (Step, StepContext, Result<(), Failure>) {
        let mut step = step.clone();
        let mut ctx = self.context(&step, cancel);
        let read = self.read_secrets(&mut step, &mut ctx);
        (step, ctx, read)
    }

    fn read_secrets(&self, step: &mut Step, ctx: &mut StepContext) -> Result<(), Failure> {
        let env = |name: &str| std::env::var(name).ok();
        let failed = |key: String, e: rdeploy_adapters::secrets::SecretError| {
            Failure::new(format!("cannot read the secret `{key}` before starting the tool: {e}")).with_hint(e.hint())
        };
        ctx.secrets.add_strings(rdeploy_adapters::secrets::env_secrets(&step.env));
        let tool_key = step.spec.typed_values_mut().map(|(k, _)| k).unwrap_or("values");
        step.spec
            .resolve_secrets(&self.stack.dir, &env, &ctx.secrets)
            .map_err(|(key, e)| failed(format!("{tool_key}.{key}"), e))?;
        for (name, marked) in &step.env_marked {
            let secret = marked.resolve(&self.stack.dir, &env).map_err(|e| failed(format!("env.{name}"), e))?;
            ctx.secrets.add(&secret);
            let text = match secret.expose() {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            ctx.env.insert(name.clone(), text.clone());
            step.env.insert(name.clone(), text);
        }
        Ok(())
    }

    /// Checks every step's tool before anything changes (exit 2 when one is missing).
    pub async fn preflight(&self, steps: &[&Step]) -> anyhow::Result<HashMap<String, ToolInfo>> {
        self.check_tools(steps, false).await
    }

    /// [`Session::preflight`] for `up` and `recover`: a tool that says its version as its step
    /// runs is not started once more for it (see `Adapter::preflight_for_run`).
    async fn check_tools(&self, steps: &[&Step], for_run: bool) -> anyhow::Result<HashMap<String, ToolInfo>> {
        let mut found = HashMap::new();
        let mut problems = Vec::new();
        for step in steps.iter().filter(|s| !s.resumable && s.revert.is_none()) {
            self.warn(format!(
                "step `{}` is not resumable and declares no `revert`: if it fails part-way it can only be run again from the start",
                step.name
            ));
        }
        for step in steps.iter().filter(|s| !s.resumable && s.retry.is_some()) {
            self.warn(format!(
                "step `{}` declares `retry` but is not resumable: it completes or reverts, and is never retried",
                step.name
            ));
        }
        for step in steps {
            if self.cancel.is_cancelled() {
                break;
            }
            let ctx = self.context(step, self.cancel.clone());
            let checked = if for_run {
                step.spec.preflight_for_run(&ctx).await
            } else {
                step.spec.preflight(&ctx).await.map(Some)
            };
            match checked {
                Ok(Some(info)) => {
                    found.insert(step.name.clone(), info);
                }
                Ok(None) => {}
                Err(e) => {
                    let hint = e.hint().map(|h| format!("\n  hint: {h}")).unwrap_or_default();
                    problems.push(format!("step `{}`: {e}{hint}", step.name));
                }
            }
        }
        // A tool stopped by our Ctrl-C or SIGTERM is no fault of the tool or the stack.
        if self.cancel.is_cancelled() {
            let signal =
                self.signal.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_else(|| "a signal".into());
            return Err(Refusal::new(
                Code::Interrupted,
                format!("{signal} received while checking the tools: stopped before anything ran"),
            )
            .with_hint(format!(
                "nothing changed; run the same command again (`rdeploy status {}` shows the checkpoint)",
                self.stack_arg
            ))
            .into());
        }
        if problems.is_empty() {
            Ok(found)
        } else {
            Err(Refusal::new(Code::BadInput, problems.join("\n")).into())
        }
    }

    fn lock(&self, command: &str) -> anyhow::Result<Box<dyn LockGuard>> {
        match self.store.lock(command) {
            Ok(lock) => {
                if let Some(dead) = lock.took_over_from() {
                    *self.took_over.lock().unwrap_or_else(|e| e.into_inner()) = Some(dead.clone());
                    if dead.host == crate::store::hostname() && !dead.is_alive_here() {
                        self.warn(format!(
                            "took over the lock of a run that died without releasing it: {dead}; its checkpoint is used as it was left"
                        ));
                    } else {
                        self.warn(format!(
                            "took over a lock left by {dead}; if that run is still alive on {}, stop this one now: two runs would interleave",
                            dead.host
                        ));
                    }
                }
                // A clean run forgets each tool it reaped, so a noted group that is still alive
                // belongs to a run that died (a grandchild outlives the pdeathsig): running the
                // same sub-change again now would interleave with it.
                let running = self.state.path.join("running");
                let describe = |alive: &[(i32, String)]| -> Vec<String> {
                    alive.iter().map(|(pgid, cmd)| format!("process group {pgid} (`{cmd}`)")).collect()
                };
                let alive = rdeploy_adapters::process::wait_for_survivors(&running, SURVIVOR_WAIT, |alive| {
                    self.warn(format!(
                        "waiting for a tool started by a run that died to finish (up to {} s): {}",
                        SURVIVOR_WAIT.as_secs(),
                        describe(alive).join(", ")
                    ));
                });
                if !alive.is_empty() {
                    let list = describe(&alive);
                    let kill: Vec<String> = alive.iter().map(|(pgid, _)| format!("kill -TERM -- -{pgid}")).collect();
                    return Err(Refusal::new(
                        Code::Locked,
                        format!(
                            "a tool started by a run that died is still running after {} s: {}",
                            SURVIVOR_WAIT.as_secs(),
                            list.join(", ")
                        ),
                    )
                    .with_hint(format!(
                        "wait for it to finish, or stop it with `{}`, then run this again",
                        kill.join("; ")
                    ))
                    .into());
                }
                // 0700 before process.rs writes its notes there.
                self.state.create_dir(&running)?;
                Ok(lock)
            }
            Err(crate::store::LockError::Held { dir, holder }) => {
                Err(Refusal::new(Code::Locked, format!("another run holds the lock on {dir}: {holder}"))
                    .with_hint("wait for it to finish; `rdeploy status` shows its progress")
                    .into())
            }
            Err(crate::store::LockError::Io(e)) => Err(e),
        }
    }

    /// `rdeploy up`: a new deploy of every step.
    pub async fn up(&self) -> anyhow::Result<RunReport> {
        let _lock = self.lock("up")?;
        self.archive_if_finished()?;
        if let Some(deploy) = self.store.load_unfinished()? {
            let failed: Vec<&str> =
                deploy.steps.iter().filter(|s| s.status != StepStatus::Done).map(|s| s.name.as_str()).collect();
            return Err(Refusal::new(
                Code::BadInput,
                format!(
                    "an unfinished deploy is recorded in {} (deploy {}, steps not done: {}); `up` would re-run completed work",
                    self.store.location(),
                    deploy.deploy_id,
                    failed.join(", ")
                ),
            )
            .with_hint(format!(
                "`rdeploy recover {0}` resumes it; `rdeploy status {0}` shows what is in place; `rdeploy reset {0} --yes` forgets it after manual reconciliation",
                self.stack_arg
            ))
            .into());
        }
        if self.from_plan.is_some() {
            crate::planfile::refuse_fleet_steps(&self.stack, "rdeploy up --plan")?;
        }
        let steps: Vec<&Step> = self.stack.ordered().collect();
        let tools = self.check_tools(&steps, true).await?;
        if let Some(loaded) = &self.from_plan {
            // Before anything runs or is recorded: whatever moved since the plan refuses it.
            self.note(format!(
                "checking the plan {} (sha256:{}) against the stack and the live state",
                loaded.path.display(),
                loaded.short()
            ));
            self.check_plan(loaded).await?;
            if let Err(e) = self.stage_saved_plans(loaded) {
                // A write that failed part-way leaves no earlier step's reviewed plan behind.
                self.unstage_saved_plans();
                return Err(e);
            }
        }
        // What is in place, as `plan` sees it, before anything is recorded (read-only).
        let early =
            if self.force_apply || self.from_plan.is_some() { HashMap::new() } else { self.early_previews().await };
        let ran = async {
            let mut cp = Checkpoint::create(self.store.as_ref())?;
            let run_id = ulid::Ulid::new().to_string();
            cp.record(Checkpoint::run_record(&self.stack, "up", &run_id))?;
            if let Some(loaded) = &self.from_plan {
                cp.record(Record::FromPlan { file: loaded.path.display().to_string(), digest: loaded.digest.clone() })?;
            }
            self.note(format!(
                "deploy {run_id} of stack {} ({})",
                self.stack.name,
                crate::out::count(steps.len(), "step")
            ));
            let actions = self.stack.ordered().map(|s| (s.name.clone(), Action::Apply)).collect();
            let last = self.store.last_finished().ok().flatten().filter(|d| d.stack == self.stack.name).map(Arc::new);
            let converging = (!self.force_apply).then(|| Converging { early, applied: Default::default(), last });
            self.run(cp, actions, tools, converging).await
        }
        .await;
        // A reviewed saved plan no apply consumed (its step never ran) goes, whatever happened.
        self.unstage_saved_plans();
        let (outcome, deploy) = ran?;
        Ok(RunReport::new(outcome, Some(deploy), Ended::Ran))
    }

    /// `rdeploy recover`: resume the unfinished deploy through each tool's recovery path.
    pub async fn recover(&self, dry_run: bool) -> anyhow::Result<RunReport> {
        let _lock = self.lock(if dry_run { "recover --dry-run" } else { "recover" })?;
        if !dry_run {
            self.remove_leftover_saved_plans();
        }
        self.archive_if_finished()?;
        // We hold the lock, so steps recorded as running were left by a dead run.
        let holder_alive = false;
        let Some(deploy) = self.store.load_settled(holder_alive)? else {
            let last = self.store.last_finished()?;
            return Ok(RunReport::new(Outcome::Complete, last, Ended::NothingToRecover));
        };
        self.check_mapping(&deploy)?;
        // What the checkpoint itself says went wrong with it (a journal line set aside, records
        // an OS crash dropped) is said before anything runs: it decides what is uncertain.
        for warning in &deploy.warnings {
            self.ui.warn(warning);
        }
        let diff = StackDiff::between(&self.stack, &deploy);
        let actions = self.recovery_actions(&deploy)?;
        let pending: Vec<&Step> = self.stack.ordered().filter(|s| actions.iter().any(|(n, _)| *n == s.name)).collect();
        let tools = self.check_tools(&pending, !dry_run).await?;
        if dry_run {
            let plan = self.dry_run(&deploy, &diff, &actions).await;
            return Ok(RunReport {
                outcome: Outcome::Complete,
                deploy: Some(deploy),
                diff: Some(diff),
                ended: Ended::DryRun(plan),
            });
        }
        let mut cp = Checkpoint::resume(self.store.as_ref())?;
        let run_id = ulid::Ulid::new().to_string();
        cp.record(Checkpoint::run_record(&self.stack, "recover", &run_id))?;
        for (name, _) in actions.iter().filter(|(name, _)| diff.settings_changed(name)) {
            let message = format!("step `{name}` changed since the checkpoint; recovering with the new settings");
            self.warn(&message);
            cp.record(Record::Warning { step: Some(name.clone()), message })?;
        }
        let done: Vec<&str> =
            deploy.steps.iter().filter(|s| s.status == StepStatus::Done).map(|s| s.name.as_str()).collect();
        self.note(format!(
            "recovering deploy {} of stack {}: {} already done{}",
            deploy.deploy_id,
            self.stack.name,
            crate::out::count(done.len(), "step"),
            if done.is_empty() { String::new() } else { format!(" ({})", done.join(", ")) }
        ));
        let (outcome, deploy) = self.run(cp, actions, tools, None).await?;
        Ok(RunReport { outcome, deploy: Some(deploy), diff: Some(diff), ended: Ended::Ran })
    }

    /// Refuses (exit 2) when the stack no longer matches the checkpoint's steps.
    pub fn check_mapping(&self, deploy: &Deploy) -> anyhow::Result<()> {
        self.check_same_stack(deploy)?;
        let mut problems = Vec::new();
        for old in &deploy.steps {
            match self.stack.step(&old.name) {
                None if old.status != StepStatus::Pending => problems.push(format!(
                    "step `{}` ({}, {}) is recorded in the checkpoint but is no longer in the stack (removed or renamed)",
                    old.name,
                    old.tool,
                    old.status.as_str()
                )),
                Some(new) if new.tool != old.tool => problems.push(format!(
                    "step `{}` was a {} step in the checkpoint and is now a {} step",
                    old.name, old.tool, new.tool
                )),
                _ => {}
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(Refusal::new(
            Code::BadInput,
            format!("the checkpoint cannot be mapped onto the stack:\n  {}", problems.join("\n  ")),
        )
        .with_hint(format!(
            "restore the step in the stack file, or reconcile by hand and `rdeploy reset {} --yes`",
            self.stack_arg
        ))
        .into())
    }

    /// Refuses (exit 2) a checkpoint written for another stack sharing this state directory.
    /// The one same-stack check: `recover`, `revert` and `ci` all go through it.
    pub fn check_same_stack(&self, deploy: &Deploy) -> anyhow::Result<()> {
        if deploy.stack.is_empty() || deploy.stack == self.stack.name {
            return Ok(());
        }
        Err(Refusal::new(
            Code::BadInput,
            format!(
                "the checkpoint in {} belongs to stack `{}`, not `{}`",
                self.store.location(),
                deploy.stack,
                self.stack.name
            ),
        )
        .with_hint(format!("give each stack its own state: `rdeploy --state-dir .rdeploy-{} ...`", self.stack.name))
        .into())
    }

    /// A deploy whose `finished` record is written but which a crash kept from being archived
    /// is archived now, so it neither blocks `up` nor gets "recovered".
    fn archive_if_finished(&self) -> anyhow::Result<()> {
        if let Some(deploy) = self.store.load_unfinished()? {
            if deploy.state != DeployState::Partial {
                Checkpoint::reopen_as_is(self.store.as_ref())?.archive_finished()?;
            }
        }
        Ok(())
    }

    fn recovery_actions(&self, deploy: &Deploy) -> anyhow::Result<Vec<(String, Action)>> {
        let mut actions = Vec::new();
        for step in self.stack.ordered() {
            let recorded = deploy.step(&step.name);
            let action = match recorded {
                Some(s) if s.status == StepStatus::Done => continue,
                // Reverted (by its `revert` or a helm rollback): back where it started, so it
                // runs again from the start.
                Some(s) if s.status == StepStatus::Reverted => Action::Apply,
                Some(s) if s.status == StepStatus::Reverting && (step.resumable || s.done_seq.is_some()) => {
                    return Err(Refusal::new(
                        Code::BadInput,
                        format!(
                            "step `{}` was being reverted when rdeploy stopped ({}); recovering it would build on a half-undone step",
                            step.name,
                            s.revert_failure.as_ref().map(|f| f.summary.as_str()).unwrap_or("revert unfinished")
                        ),
                    )
                    .with_hint(format!(
                        "finish the revert with `rdeploy revert {0}`, or undo it by hand and `rdeploy reset {0} --yes`",
                        self.stack_arg
                    ))
                    .into());
                }
                Some(s)
                    if !step.resumable
                        && step.revert.is_some()
                        && matches!(s.status, StepStatus::Failed | StepStatus::Reverting) =>
                {
                    Action::RevertThenApply
                }
                Some(s) if step.resumable && !s.sub_changes.is_empty() => Action::Recover(s.prior()),
                _ => Action::Apply,
            };
            actions.push((step.name.clone(), action));
        }
        Ok(actions)
    }

    /// What recovery would do, from each tool's live state; changes nothing.
    async fn dry_run(&self, deploy: &Deploy, diff: &StackDiff, actions: &[(String, Action)]) -> Vec<DryRunStep> {
        let mut plan = Vec::new();
        for step in self.stack.ordered() {
            let changed = diff.settings_changed(&step.name);
            let Some((_, action)) = actions.iter().find(|(n, _)| *n == step.name) else {
                plan.push(DryRunStep { name: step.name.clone(), tool: step.tool, changed, plan: DryRunPlan::LeftAsIs });
                continue;
            };
            let (step, mut ctx, read) = self.resolved(step, self.cancel.child_token());
            // The checkpoint's outputs in place of `${{ ... }}`, as recover would run it (a
            // sensitive one is read again, registered as a secret, so it prints redacted).
            let step = match self.resolve_references_from(|f| f(deploy), &step).await {
                Ok(resolved) => resolved,
                Err(_) => step,
            };
            let step = &step;
            ctx.started_by = self.started_by(deploy, &step.name, None);
            let what = match action {
                _ if read.is_err() => {
                    let summary = read.err().map(|f| f.summary).unwrap_or_default();
                    match action {
                        Action::Recover(_) => DryRunPlan::Recover(Err(summary)),
                        _ => DryRunPlan::Apply { why: ApplyWhy::NotStarted, actions: vec![summary] },
                    }
                }
                Action::RevertThenApply => DryRunPlan::RevertThenApply { revert: step.revert.clone() },
                // A fleet step's plan comes from the checkpoint: no cluster is asked.
                Action::Recover(prior) if step.fleet.is_some() => {
                    DryRunPlan::Recover(Ok(crate::rollout::dry_run(prior)))
                }
                Action::Apply if step.fleet.is_some() => DryRunPlan::Apply {
                    why: ApplyWhy::NotStarted,
                    actions: vec!["runs once per cluster in scope, wave by wave".into()],
                },
                Action::Apply => {
                    let why = if deploy.step(&step.name).is_some_and(|s| s.status == StepStatus::Reverted) {
                        ApplyWhy::Reverted
                    } else if step.resumable {
                        ApplyWhy::NotStarted
                    } else {
                        ApplyWhy::NotResumable
                    };
                    let actions = match step.spec.inspect(&ctx, &PriorStep::default()).await {
                        Ok(inspection) => inspection.actions,
                        Err(_) => Vec::new(),
                    };
                    DryRunPlan::Apply { why, actions }
                }
                Action::Recover(prior) => {
                    DryRunPlan::Recover(step.spec.inspect(&ctx, prior).await.map(|i| i.actions).map_err(|f| f.summary))
                }
            };
            plan.push(DryRunStep { name: step.name.clone(), tool: step.tool, changed, plan: what });
        }
        plan
    }

    /// Runs the given steps in DAG order, at most `parallel` at once, and settles the outcome.
    async fn run(
        &self,
        cp: Checkpoint,
        actions: Vec<(String, Action)>,
        tools: HashMap<String, ToolInfo>,
        converging: Option<Converging>,
    ) -> anyhow::Result<(Outcome, Deploy)> {
        let cp = SharedCheckpoint::new(cp);
        let done: HashSet<String> =
            cp.read(|d| d.steps.iter().filter(|s| s.status == StepStatus::Done).map(|s| s.name.clone()).collect());
        let steps = self.stack.steps.iter().map(|s| (s.name.clone(), s.needs.clone()));
        let mut run = RunState {
            schedule: Schedule::new(steps, actions, done, self.parallel, self.keep_going),
            running: JoinSet::new(),
            outputs_before: HashMap::new(),
            converging,
        };
        // A checkpoint that cannot be written stops the run, but never by dropping running
        // tasks: that would SIGKILL their tools mid-apply. Cancel (SIGINT once) and drain.
        let mut fatal: Option<anyhow::Error> = None;
        loop {
            if fatal.is_none() {
                if let Err(e) = self.start_ready(&cp, &mut run, &tools).await {
                    fatal = Some(self.stop_everything(e, &mut run));
                }
            }
            let Some(joined) = run.running.join_next().await else { break };
            let (name, result) = match joined {
                Ok(finished) => finished,
                Err(e) => {
                    fatal.get_or_insert_with(|| {
                        self.stop_everything(anyhow::anyhow!("a step task panicked: {e}"), &mut run)
                    });
                    continue;
                }
            };
            if let Err(e) = self.settle_step(&cp, &mut run, name, result).await {
                if fatal.is_none() {
                    fatal = Some(self.stop_everything(e, &mut run));
                }
            }
        }
        if let Some(e) = fatal {
            cp.snapshot();
            if CheckpointGone::is(&e) {
                // Its message says what completed and what to do; `recover` has nothing to resume.
                return Err(e);
            }
            return Err(e.context("the deploy stopped: running tools were interrupted and waited for; `rdeploy recover` resumes once the cause is fixed"));
        }

        let mut outcome = run.schedule.outcome();
        if let Some(signal) = self.signal.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            cp.record(Record::Interrupted { signal })?;
            outcome = outcome.worst(Outcome::Interrupted);
        }
        let all_done = run.schedule.all_done();
        if outcome == Outcome::Complete && all_done {
            let deploy = cp.into_inner().finish(DeployState::Complete)?;
            return Ok((Outcome::Complete, deploy));
        }
        if !all_done && outcome == Outcome::Complete {
            // Nothing failed yet steps are left (a step whose needs never completed).
            outcome = Outcome::Partial;
        }

        if self.stack.on_failure == OnFailure::Revert
            && matches!(outcome, Outcome::Partial | Outcome::StepReverted | Outcome::Refused)
        {
            self.warn("on_failure: revert: reverting every completed step that declares `revert`, newest first");
            let reverted = self.revert_all(&cp).await?;
            let stranded = self.unrevertable_partial_steps(&cp);
            if reverted == Outcome::StepReverted && stranded.is_empty() {
                let deploy = cp.into_inner().finish(DeployState::Reverted)?;
                return Ok((Outcome::StepReverted, deploy));
            }
            for (step, ids) in &stranded {
                let message = format!(
                    "on_failure: revert could not undo step `{step}`: it declares no `revert` and has sub-changes in place ({}); the checkpoint is kept",
                    ids.join(", ")
                );
                self.warn(&message);
                cp.record(Record::Warning { step: Some(step.clone()), message })?;
            }
            outcome = outcome.worst(Outcome::RevertFailed);
        }

        cp.snapshot();
        let deploy = cp.read(Deploy::clone);
        Ok((outcome, deploy))
    }

    /// Cancels every running step (their tools get SIGINT once) and stops scheduling.
    fn stop_everything(&self, error: anyhow::Error, run: &mut RunState) -> anyhow::Error {
        if CheckpointGone::is(&error) {
            // Said once, in full, when the run ends.
            self.warn("the checkpoint is gone: stopping the running tools");
        } else {
            self.warn(format!("{error:#}: stopping the running tools"));
        }
        run.schedule.stop();
        self.cancel.cancel();
        error
    }

    /// Starts every step whose needs are done, up to the parallelism limit.
    async fn start_ready(
        &self,
        cp: &SharedCheckpoint,
        run: &mut RunState,
        tools: &HashMap<String, ToolInfo>,
    ) -> anyhow::Result<()> {
        loop {
            if self.cancel.is_cancelled() {
                run.schedule.stop();
            }
            let Some((name, action)) = run.schedule.next_ready() else { break };
            tracing::debug!(step = %name, ?action, running = run.running.len(), "starting step");
            let step = self.stack.step(&name).expect("actions name stack steps").clone();
            if let Some(gate) = &step.gate {
                if let Err(reason) = crate::gate::evaluate(gate, &self.stack.dir, &self.state.shared).await {
                    self.step_ended(&name, StepEnd::Refused { reason: reason.clone() });
                    run.schedule.finish(&name, End::Refused);
                    cp.record(Record::StepRefused { step: name.clone(), reason })?;
                    continue;
                }
            }
            let action = match action {
                Action::RevertThenApply => {
                    if self.revert_step(cp, &step).await? == Outcome::RevertFailed {
                        run.schedule
                            .finish(&name, End::Failed { interrupted: false, then: AfterFailure::RevertFailed });
                        break;
                    }
                    Action::Apply
                }
                other => other,
            };
            let (mode, work) = match &action {
                Action::Recover(_) => (StepMode::Recover, Work::Recover(step.tool)),
                _ => (StepMode::Apply, Work::Apply(step.tool)),
            };
            let tool_version = tools.get(&name).map(|t| t.version.clone());
            // Its references take their values before the tool starts: a missing output fails
            // the step here, having run nothing.
            let resolved = self.resolve_references(cp, &step).await.and_then(|resolved| {
                let recorded = |producer: &str, key: &str| {
                    cp.read(|d| d.step(producer).and_then(|s| s.outputs.get(key).cloned()))
                };
                match self.plan_inputs_moved(&step, &recorded) {
                    None => Ok(resolved),
                    Some(why) => Err(Failure::new(format!(
                        "step `{name}` is not as the plan previewed it: {why}; nothing was run"
                    ))
                    .with_hint(format!(
                        "`rdeploy recover {0}` applies it with the new values; to review them first, `rdeploy plan {0}`",
                        self.stack_arg
                    ))),
                }
            });
            let step = match resolved {
                Ok(resolved) => resolved,
                Err(failure) => {
                    cp.record(Record::StepStarted { step: name.clone(), mode, tool_version: tool_version.clone() })?;
                    self.step_ended(&name, StepEnd::Failed { summary: failure.summary.clone() });
                    run.schedule.finish(&name, End::Failed { interrupted: false, then: AfterFailure::Kept });
                    cp.record(Record::StepFailed { step: name.clone(), failure })?;
                    continue;
                }
            };
            // `up --plan`: terraform applies the reviewed saved plan as it is.
            let saved = if matches!(action, Action::Apply) { self.saved_plan_of(&name) } else { None };
            // A step that cannot resume completes or reverts: it is never retried. Nor is a
            // step applying a reviewed saved plan: another attempt would apply a plan nobody
            // reviewed; after its failure `rdeploy recover` (an operator's choice) plans again.
            let retry = step.retry.clone().filter(|_| step.resumable && saved.is_none());
            if let Some(retry) = &retry {
                cp.record(Record::Attempt { step: name.clone(), attempt: 1, of: retry.attempts })?;
            }
            cp.record(Record::StepStarted { step: name.clone(), mode, tool_version: tool_version.clone() })?;
            let attempt = retry.as_ref().map(|r| Attempt { number: 1, of: r.attempts });
            self.emit(RunEvent::StepStarted { step: name.clone(), work, attempt });
            let (mut step, mut ctx, read) = self.resolved(&step, self.cancel.child_token());
            if let Some(saved) = saved {
                step.spec.use_saved_plan(saved);
            }
            if matches!(action, Action::Recover(_)) {
                // Our own run record is the last one: every earlier run has ended or is elsewhere.
                ctx.started_by =
                    cp.read(|deploy| self.started_by(deploy, &name, deploy.runs.last().map(|r| r.run_id.as_str())));
            }
            let converge = match (&action, &mut run.converging) {
                (Action::Apply, Some(converging)) if !step.always => {
                    let current = |producer: &str, key: &str| {
                        cp.read(|d| d.step(producer).and_then(|s| s.outputs.get(key).cloned()))
                    };
                    let applied = converging.applied.load(std::sync::atomic::Ordering::SeqCst);
                    let alone = run.running.is_empty();
                    Some(self.decided_preview(&current, &step, &mut converging.early, applied, alone))
                }
                _ => None,
            };
            let applied = run.converging.as_ref().map(|c| c.applied.clone());
            let journal = StepJournal::new(name.clone(), cp.clone(), ctx.cancel.clone());
            let sink = StepSink::new(journal, self.sensitive.clone(), self.reporters.clone());
            // 0700: the tools' files in it (terraform's saved plan) are nobody else's to read.
            self.state.create_dir(&ctx.work_dir)?;
            let attempts = Attempts {
                retry,
                cp: cp.clone(),
                reporters: self.reporters.clone(),
                tool_version,
                fleet_dir: self.state.shared.clone(),
                last: run.converging.as_ref().and_then(|c| c.last.clone()),
            };
            run.outputs_before.insert(name.clone(), self.outputs_seen(cp, &name));
            run.running.spawn(async move {
                let result = match read {
                    Ok(()) => attempts.run(&step, &ctx, action, &sink, converge).await,
                    Err(failure) => Err(failure),
                };
                // Whatever the step did (unless it found everything in place) may move what a
                // preview made before it saw: later steps preview afresh.
                if let Some(applied) = applied.filter(|_| !matches!(result, Ok((_, Converged::InPlace)))) {
                    applied.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                let result = result.map(|(recovered, _)| recovered);
                (step.name.clone(), result)
            });
        }
        Ok(())
    }

    /// The step with its `${{ steps.NAME.outputs.KEY }}` replaced by the values recorded in the
    /// checkpoint (a sensitive one from this process's memory, else read again from the
    /// producer's own state, and registered with the run's secrets). A reference
    /// without a value is the step's failure, before its tool starts.
    async fn resolve_references(&self, cp: &SharedCheckpoint, step: &Step) -> Result<Step, Failure> {
        self.resolve_references_from(|f| cp.read(f), step).await
    }

    /// [`Session::resolve_references`] from a deploy read by `read` (the live checkpoint, or a
    /// loaded one for `recover --dry-run`).
    async fn resolve_references_from(
        &self,
        read: impl Fn(
            &dyn Fn(&Deploy) -> (Option<serde_json::Value>, bool, Vec<String>),
        ) -> (Option<serde_json::Value>, bool, Vec<String>),
        step: &Step,
    ) -> Result<Step, Failure> {
        let mut values: HashMap<Reference, OutputValue> = HashMap::new();
        for reference in &step.refs {
            let (plain, sensitive, known) = read(&|d: &Deploy| {
                let producer = d.step(&reference.step);
                let plain = producer.and_then(|p| p.outputs.get(&reference.key).cloned());
                let sensitive = producer.is_some_and(|p| p.sensitive_outputs.contains(&reference.key));
                let mut known: Vec<String> = producer.map(|p| p.outputs.keys().cloned().collect()).unwrap_or_default();
                known.extend(producer.map(|p| p.sensitive_outputs.clone()).unwrap_or_default());
                known.sort();
                (plain, sensitive, known)
            });
            if let Some(value) = plain {
                values.insert(reference.clone(), OutputValue::Plain(value));
                continue;
            }
            if let Some(secret) = self.sensitive_value(reference) {
                values.insert(reference.clone(), OutputValue::Sensitive(secret));
                continue;
            }
            if !sensitive {
                let theirs = if known.is_empty() {
                    "it recorded no outputs".to_string()
                } else {
                    format!("its outputs are {}", known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "))
                };
                return Err(Failure::new(format!(
                    "`{reference}`: step `{}` has no output `{}` ({theirs}); nothing was run",
                    reference.step, reference.key
                ))
                .with_hint(format!(
                    "make `{}` produce `{}` or fix the reference, then `rdeploy recover {}`",
                    reference.step, reference.key, self.stack_arg
                )));
            }
            // Sensitive and never recorded: the producer's own state may have it again.
            let producer = self.stack.step(&reference.step).expect("references name stack steps");
            let ctx = self.context(producer, self.cancel.child_token());
            match producer.spec.read_outputs(&ctx).await {
                Ok(Some(outputs)) => {
                    let mut vault = self.sensitive.lock().unwrap_or_else(|e| e.into_inner());
                    let entry = vault.entry(reference.step.clone()).or_default();
                    for (key, value) in outputs {
                        if let OutputValue::Sensitive(secret) = value {
                            crate::out::secrets().add(&secret);
                            entry.insert(key, secret);
                        }
                    }
                }
                Ok(None) => {}
                Err(failure) => {
                    return Err(Failure::new(format!(
                        "`{reference}` is sensitive and was never recorded, and reading it again from {}'s state failed: {}",
                        producer.tool, failure.summary
                    ))
                    .with_hint(failure.hint.unwrap_or_else(|| format!("fix it, then `rdeploy recover {}`", self.stack_arg))))
                }
            }
            match self.sensitive_value(reference) {
                Some(secret) => {
                    values.insert(reference.clone(), OutputValue::Sensitive(secret));
                }
                None => {
                    return Err(Failure::new(format!(
                        "`{reference}` is a sensitive output: only the run that produced it had its value, and {} keeps no state to read it again from; nothing was run",
                        producer.tool
                    ))
                    .with_hint(format!(
                        "run step `{0}` again to produce it (its value is never written down): undo what `{0}` did and `rdeploy reset {1} --yes`, then `rdeploy up {1}`",
                        reference.step, self.stack_arg
                    )))
                }
            }
        }
        // Every sensitive value it is given is one of the run's secrets (registered when it was
        // read; again here, which costs nothing), so what the step reports is redacted of it.
        for value in values.values() {
            if let OutputValue::Sensitive(secret) = value {
                crate::out::secrets().add(secret);
            }
        }
        let text = |r: &Reference| values.get(r).map(|v| rdeploy_adapters::outputs::value_text(v.value()));
        let resolved = step.resolve(&text).map_err(|e| match e {
            crate::stack::ResolveError::Missing(r) => Failure::new(format!("`{r}` has no value; nothing was run")),
            crate::stack::ResolveError::Invalid(why) => Failure::new(format!(
                "the output values make settings step `{}` cannot take: {why}; nothing was run",
                step.name
            ))
            .with_hint("check what the producing steps output (`rdeploy output`) against the keys that use them"),
        });
        // The tool's words about a bad value may quote it.
        resolved.map_err(|f| crate::out::secrets().redact_failure(f))
    }

    fn outputs_seen(&self, cp: &SharedCheckpoint, step: &str) -> OutputsSeen {
        let plain = cp.read(|d| d.step(step).map(|s| s.outputs.clone()).unwrap_or_default());
        let vault = self.sensitive.lock().unwrap_or_else(|e| e.into_inner());
        (plain, vault.get(step).cloned().unwrap_or_default())
    }

    /// A producer ran again and some of its outputs changed: every completed step that used one
    /// of them is no longer done and is applied again in this run, with the new value, so no
    /// step stays applied with an old one.
    fn stale_consumers(
        &self,
        cp: &SharedCheckpoint,
        run: &mut RunState,
        producer: &str,
        before: &OutputsSeen,
    ) -> anyhow::Result<()> {
        let after = self.outputs_seen(cp, producer);
        // A recorded value that differs, went, or became sensitive; a sensitive one known before
        // and after (in this process) that differs.
        let mut changed: Vec<&str> =
            before.0.iter().filter(|(k, v)| after.0.get(*k) != Some(*v)).map(|(k, _)| k.as_str()).collect();
        changed
            .extend(before.1.iter().filter(|(k, v)| after.1.get(*k).is_some_and(|a| a != *v)).map(|(k, _)| k.as_str()));
        changed.sort();
        changed.dedup();
        if changed.is_empty() {
            return Ok(());
        }
        for consumer in self.stack.ordered() {
            let used: Vec<&str> = changed
                .iter()
                .copied()
                .filter(|k| consumer.refs.iter().any(|r| r.step == producer && r.key == *k))
                .collect();
            if used.is_empty() {
                continue;
            }
            let done = cp.read(|d| d.step(&consumer.name).is_some_and(|s| s.status == StepStatus::Done));
            if !done {
                continue;
            }
            let because = format!(
                "{} of step `{producer}` changed",
                match used.as_slice() {
                    [one] => format!("output `{one}`"),
                    many => format!("outputs {}", many.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")),
                }
            );
            self.warn(format!("step `{}` used an old value: {because}; applying it again", consumer.name));
            cp.record(Record::Stale { step: consumer.name.clone(), because })?;
            run.schedule.requeue(&consumer.name, Action::Apply);
        }
        Ok(())
    }

    fn sensitive_value(&self, reference: &Reference) -> Option<Secret> {
        let vault = self.sensitive.lock().unwrap_or_else(|e| e.into_inner());
        vault.get(&reference.step).and_then(|m| m.get(&reference.key)).cloned()
    }

    /// Records how a step ended and applies complete-or-revert to a non-resumable failure.
    async fn settle_step(
        &self,
        cp: &SharedCheckpoint,
        run: &mut RunState,
        name: String,
        result: Result<Recovered, Failure>,
    ) -> anyhow::Result<()> {
        let step = self.stack.step(&name).expect("running steps are stack steps").clone();
        let before = run.outputs_before.remove(&name);
        let failure = match result {
            Ok(Recovered::Complete) => {
                cp.record(Record::StepDone { step: name.clone() })?;
                cp.snapshot();
                self.step_ended(&name, StepEnd::Done);
                if let Some(before) = before {
                    self.stale_consumers(cp, run, &name, &before)?;
                }
                run.schedule.finish(&name, End::Done);
                return Ok(());
            }
            Ok(Recovered::RolledBack { to }) => {
                // Back at its last good state, not the stack's: neither done nor half-done.
                // Steps that need it must not run on top of the old version.
                let how = format!("`recover: rollback` rolled it back to {to}: the stack's version is not in place");
                cp.record(Record::StepReverted { step: name.clone(), how: Some(how) })?;
                cp.snapshot();
                self.step_ended(&name, StepEnd::RolledBack { to: to.to_string() });
                run.schedule.finish(&name, End::RolledBack);
                return Ok(());
            }
            Err(failure) => failure,
        };
        let interrupted = failure.interrupted || self.cancel.is_cancelled();
        let failure = self.name_timeout(cp, &step, failure);
        self.step_ended(&name, StepEnd::Failed { summary: failure.summary.clone() });
        cp.record(Record::StepFailed { step: name.clone(), failure: Failure { interrupted, ..failure } })?;
        let then = if !step.resumable && step.revert.is_some() {
            // Complete or revert, under Ctrl-C too: a step that cannot resume goes back to where
            // it started (uncancellably) before rdeploy exits.
            match self.revert_step(cp, &step).await? {
                // Manual action is needed: nothing more runs on top of a half-reverted step.
                Outcome::RevertFailed => AfterFailure::RevertFailed,
                _ => AfterFailure::Reverted,
            }
        } else {
            AfterFailure::Kept
        };
        run.schedule.finish(&name, End::Failed { interrupted, then });
        Ok(())
    }

    /// Every tool's timeout reads the same: "timed out after D" and what was in flight (the
    /// sub-changes started and not done, else the command), then the tool's own words.
    fn name_timeout(&self, cp: &SharedCheckpoint, step: &Step, mut failure: Failure) -> Failure {
        let (true, Some(limit)) = (failure.timed_out, step.timeout) else { return failure };
        let in_flight: Vec<String> = cp.read(|deploy| {
            deploy
                .step(&step.name)
                .map(|s| {
                    s.sub_changes
                        .iter()
                        .filter(|c| {
                            matches!(
                                c.status,
                                rdeploy_adapters::SubStatus::Started | rdeploy_adapters::SubStatus::Failed
                            )
                        })
                        .map(|c| format!("`{}`", c.id))
                        .collect()
                })
                .unwrap_or_default()
        });
        let what = match (in_flight.is_empty(), &failure.command) {
            (false, Some(command)) => format!("sub-change {} (`{command}`)", in_flight.join(", ")),
            (false, None) => format!("sub-change {}", in_flight.join(", ")),
            (true, Some(command)) => format!("`{command}`"),
            (true, None) => "the tool".to_string(),
        };
        failure.summary = format!(
            "timed out after {} while running {what} (stopped with SIGINT, then SIGTERM and SIGKILL {}s apart): {}",
            humantime::format_duration(limit),
            rdeploy_adapters::process::TIMEOUT_GRACE.as_secs(),
            failure.summary
        );
        if failure.hint.is_none() {
            failure.hint = Some(format!(
                "raise the step's `timeout` or find why it hangs (its log: {}), then `rdeploy recover {}`",
                self.state.log_path(&step.name).display(),
                self.stack_arg
            ));
        }
        failure
    }

    /// Failed steps without `revert` that left sub-changes in place: a whole-deploy revert
    /// cannot undo them, so the deploy must not be reported as reverted.
    fn unrevertable_partial_steps(&self, cp: &SharedCheckpoint) -> Vec<(String, Vec<String>)> {
        cp.read(|deploy| {
            deploy
                .steps
                .iter()
                .filter(|s| s.status == StepStatus::Failed && !s.has_revert)
                .filter_map(|s| {
                    let ids: Vec<String> = s
                        .sub_changes
                        .iter()
                        .filter(|c| {
                            matches!(c.status, rdeploy_adapters::SubStatus::Done | rdeploy_adapters::SubStatus::Started)
                        })
                        .map(|c| c.id.clone())
                        .collect();
                    (!ids.is_empty()).then(|| (s.name.clone(), ids))
                })
                .collect()
        })
    }

    /// Runs one step's `revert`, recording the result.
    async fn revert_step(&self, cp: &SharedCheckpoint, step: &Step) -> anyhow::Result<Outcome> {
        if step.revert.is_none() {
            return Ok(Outcome::StepReverted);
        }
        self.emit(RunEvent::StepStarted { step: step.name.clone(), work: Work::Revert, attempt: None });
        cp.record(Record::StepStarted { step: step.name.clone(), mode: StepMode::Revert, tool_version: None })?;
        // Its `revert` and `env` may use outputs too: the recorded values, as the step had them.
        let step = match self.resolve_references(cp, step).await {
            Ok(resolved) => resolved,
            Err(failure) => {
                self.step_ended(&step.name, StepEnd::RevertFailed { summary: failure.summary.clone() });
                cp.record(Record::StepRevertFailed { step: step.name.clone(), failure })?;
                return Ok(Outcome::RevertFailed);
            }
        };
        let step = &step;
        let Some(script) = &step.revert else { return Ok(Outcome::StepReverted) };
        // A revert must finish even after Ctrl-C or a journal error: a half-reverted step is the third outcome.
        let journal = StepJournal::new(step.name.clone(), cp.clone(), CancellationToken::new());
        let sink = StepSink::new(journal, self.sensitive.clone(), self.reporters.clone());
        let (_, ctx, read) = self.resolved(step, CancellationToken::new());
        let reverted = match read {
            Ok(()) => shell::run_revert(&ctx, script, &sink).await,
            Err(failure) => Err(failure),
        };
        match reverted {
            Ok(()) => {
                cp.record(Record::StepReverted { step: step.name.clone(), how: None })?;
                self.step_ended(&step.name, StepEnd::Reverted);
                Ok(Outcome::StepReverted)
            }
            Err(failure) => {
                let failure = crate::out::secrets().redact_failure(failure);
                self.step_ended(&step.name, StepEnd::RevertFailed { summary: failure.summary.clone() });
                cp.record(Record::StepRevertFailed { step: step.name.clone(), failure })?;
                Ok(Outcome::RevertFailed)
            }
        }
    }

    /// Reverts every step that changed something and declares `revert`, newest first.
    async fn revert_all(&self, cp: &SharedCheckpoint) -> anyhow::Result<Outcome> {
        let mut candidates: Vec<(u64, String)> = cp.read(|deploy| {
            deploy
                .steps
                .iter()
                .filter(|s| {
                    s.has_revert && matches!(s.status, StepStatus::Done | StepStatus::Failed | StepStatus::Reverting)
                })
                .map(|s| (s.done_seq.unwrap_or(u64::MAX), s.name.clone()))
                .collect()
        });
        // Newest first; a failed step (never done) changed things last.
        candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
        let mut outcome = Outcome::StepReverted;
        for (_, name) in candidates {
            let Some(step) = self.stack.step(&name) else { continue };
            if self.revert_step(cp, step).await? == Outcome::RevertFailed {
                outcome = Outcome::RevertFailed;
                break;
            }
        }
        Ok(outcome)
    }

    /// `rdeploy revert`: undo the completed steps that declare `revert`, newest first.
    pub async fn revert(&self) -> anyhow::Result<RunReport> {
        let _lock = self.lock("revert")?;
        self.archive_if_finished()?;
        // A step is undone only by its own `revert`: with none to run, nothing is recorded (a
        // new "reverted" deploy would hide the last one's outputs and end an unfinished one).
        let revertible = |deploy: &Deploy, statuses: &[StepStatus]| {
            deploy
                .steps
                .iter()
                .any(|s| s.has_revert && statuses.contains(&s.status) && self.stack.step(&s.name).is_some())
        };
        let cp = if self.store.has_unfinished()? {
            let deploy = self.store.load_settled(false)?.expect("journal exists");
            self.check_mapping(&deploy)?;
            // A step already reverted (by its `revert`, or helm's rollback) lets `revert` close
            // the deploy as reverted.
            if !revertible(&deploy, &[StepStatus::Done, StepStatus::Failed, StepStatus::Reverting])
                && !deploy.steps.iter().any(|s| s.status == StepStatus::Reverted)
            {
                return Ok(RunReport::new(Outcome::Complete, Some(deploy), Ended::NothingToRevert));
            }
            let mut cp = Checkpoint::resume(self.store.as_ref())?;
            cp.record(Checkpoint::run_record(&self.stack, "revert", &ulid::Ulid::new().to_string()))?;
            cp
        } else {
            let Some(last) =
                self.store.last_finished()?.filter(|d| d.state == DeployState::Complete && d.stack == self.stack.name)
            else {
                return Ok(RunReport::new(Outcome::Complete, None, Ended::NothingToRevert));
            };
            if !revertible(&last, &[StepStatus::Done]) {
                return Ok(RunReport::new(Outcome::Complete, Some(last), Ended::NothingToRevert));
            }
            // Re-open the finished deploy as a new journal so the revert itself is checkpointed.
            let mut cp = Checkpoint::create(self.store.as_ref())?;
            cp.record(Checkpoint::run_record(&self.stack, "revert", &ulid::Ulid::new().to_string()))?;
            let mut done: Vec<_> = last.steps.iter().filter(|s| s.status == StepStatus::Done).collect();
            done.sort_by_key(|s| s.done_seq);
            for s in done {
                cp.record(Record::StepDone { step: s.name.clone() })?;
            }
            cp
        };
        let cp = SharedCheckpoint::new(cp);
        let outcome = self.revert_all(&cp).await?;
        if outcome == Outcome::StepReverted {
            // Reverting is what `revert` was asked to do.
            let deploy = cp.into_inner().finish(DeployState::Reverted)?;
            Ok(RunReport::new(Outcome::Complete, Some(deploy), Ended::Ran))
        } else {
            cp.snapshot();
            let deploy = cp.read(Deploy::clone);
            Ok(RunReport::new(Outcome::RevertFailed, Some(deploy), Ended::Ran))
        }
    }

    /// `rdeploy reset --yes`: forget the unfinished deploy (kept in history).
    pub fn reset(&self) -> anyhow::Result<RunReport> {
        let _lock = self.lock("reset")?;
        self.remove_leftover_saved_plans();
        // `reset --yes` always works: a journal that cannot be read at all is moved aside.
        let archived = self.archive_if_finished();
        if !self.store.has_unfinished()? {
            archived?;
            return Ok(RunReport::new(Outcome::Complete, None, Ended::NothingToReset));
        }
        let mut cp = match Checkpoint::reopen_as_is(self.store.as_ref()) {
            Ok(cp) => cp,
            Err(e) => {
                let kept = self.store.retire_unfinished()?;
                return Ok(RunReport::new(
                    Outcome::Complete,
                    None,
                    Ended::ForgotUnreadable { error: format!("{e:#}"), kept },
                ));
            }
        };
        cp.record(Record::Warning { step: None, message: "reset by the operator after manual reconciliation".into() })?;
        let deploy = cp.finish(DeployState::Partial)?;
        Ok(RunReport::new(Outcome::Complete, Some(deploy), Ended::Forgot))
    }
}

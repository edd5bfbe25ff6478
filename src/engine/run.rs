//! The run loop: starts the ready steps as the scheduler ([`super::schedule`]) allows, settles
//! each as it ends (journal, stale consumers, complete-or-revert) and settles the run's outcome
//! (`on_failure: revert`, interrupts).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rdeploy_adapters::{Converged, Failure, Recovered, ToolInfo};
use tokio::task::JoinSet;

use super::attempt::{Action, Attempts};
use super::event::{StepEnd, Work};
use super::journal::{Checkpoint, CheckpointGone};
use super::journal::{SharedCheckpoint, StepJournal};
use super::references::OutputsSeen;
use super::schedule::{AfterFailure, Outcome, Schedule, StepEnd as End};
use super::session::Session;
use super::sink::StepSink;
use crate::checkpoint::{Deploy, DeployState, Record, StepMode, StepStatus};
use crate::stack::{OnFailure, Step};

/// A run in progress: the scheduler's state, the running steps' tasks, and what each running
/// step's outputs were when it started.
pub(super) struct RunState {
    pub(super) schedule: Schedule<Action>,
    pub(super) running: JoinSet<(String, Ran)>,
    /// Each running step's outputs when it started, to tell which changed when it is done.
    pub(super) outputs_before: HashMap<String, OutputsSeen>,
    /// `up` (not `--force-apply`): each step applies only what its preview finds not in place.
    pub(super) converging: Option<Converging>,
}

/// What a step's task comes back with.
pub(super) enum Ran {
    /// The step started (it was journaled and shown started) and ended so.
    Ended(Result<Recovered, Failure>),
    /// It never started: the run stopped (`error`: its start could not be journaled) while it
    /// waited for an early preview of it to stop. It ran nothing, and is as a step not reached.
    NotStarted { action: Action, error: Option<anyhow::Error> },
}

/// `up`'s convergence: the previews made as the run goes ([`Session::early_previews`]), each
/// taken by its step when it starts, and the count of applies that tells which are still good.
pub(super) struct Converging {
    pub(super) early: super::preview::EarlyPreviews,
    /// The last finished deploy of the stack (for the outputs of shell steps found in place).
    pub(super) last: Option<Arc<Deploy>>,
}

impl Session {
    /// Runs the given steps in DAG order, at most `parallel` at once, and settles the outcome.
    pub(super) async fn run(
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
                // Every step's end comes back here with nothing awaited in between (a fatal error
                // cancels the run, and so every preview, itself): the previews are stopped as
                // soon as nothing new starts.
                if run.schedule.is_stopping() {
                    self.stop_previews(&run);
                }
            }
            let Some(joined) = run.running.join_next().await else { break };
            let (name, result) = match joined {
                Ok((name, Ran::Ended(result))) => (name, result),
                Ok((name, Ran::NotStarted { action, error })) => {
                    run.outputs_before.remove(&name);
                    run.schedule.unpop(&name, action);
                    if let Some(e) = error.filter(|_| fatal.is_none()) {
                        fatal = Some(self.stop_everything(e, &mut run));
                    }
                    continue;
                }
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
        // No step starts any more: an early preview still under way is of no use (and
        // `on_failure: revert` is about to change what it reads).
        self.stop_previews(&run);
        if let Some(e) = fatal {
            cp.snapshot();
            if CheckpointGone::is(&e) {
                // Its message says what completed and what to do; `recover` has nothing to resume.
                return Err(e);
            }
            return Err(e.context("the deploy stopped: running tools were interrupted and waited for; `rdeploy recover` resumes once the cause is fixed"));
        }

        self.settle_run(cp, &run).await
    }

    /// The run's outcome once no step runs: the interrupt recorded, a complete deploy finished,
    /// `on_failure: revert` applied to one that is not.
    async fn settle_run(&self, cp: SharedCheckpoint, run: &RunState) -> anyhow::Result<(Outcome, Deploy)> {
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

    /// No step starts any more: the early previews still under way are of no use, and are
    /// stopped.
    fn stop_previews(&self, run: &RunState) {
        if let Some(converging) = &run.converging {
            converging.early.stop();
        }
    }

    /// `step` ended without being done: the early previews of the steps left that need it (they
    /// will never start) are of no use, and are stopped.
    fn stop_previews_of_dependents(&self, run: &RunState, step: &str) {
        let Some(converging) = &run.converging else { return };
        for dependent in run.schedule.dependents(step) {
            converging.early.stop_one(&dependent);
        }
    }

    /// Cancels every running step (their tools get SIGINT once) and stops scheduling.
    pub(super) fn stop_everything(&self, error: anyhow::Error, run: &mut RunState) -> anyhow::Error {
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
    pub(super) async fn start_ready(
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
            // tests/converge.rs waits for this line (its target and words) to interrupt a step
            // that waits for its preview.
            tracing::debug!(step = %name, ?action, running = run.running.len(), "starting step");
            let step = self.stack.step(&name).expect("actions name stack steps").clone();
            if self.refused_by_gate(cp, run, &step).await? {
                continue;
            }
            let action = match action {
                Action::RevertThenApply => {
                    let reverted = self.revert_step(cp, &step).await;
                    if let Some(converging) = &run.converging {
                        converging.early.applied();
                    }
                    if reverted? == Outcome::RevertFailed {
                        run.schedule
                            .finish(&name, End::Failed { interrupted: false, then: AfterFailure::RevertFailed });
                        break;
                    }
                    Action::Apply
                }
                other => other,
            };
            let tool_version = tools.get(&name).map(|t| t.version.clone());
            let step = match self.with_inputs(cp, &step).await {
                Ok(resolved) => resolved,
                Err(failure) => {
                    let (mode, _) = mode_and_work(&action, step.tool);
                    cp.record(Record::StepStarted { step: name.clone(), mode, tool_version: tool_version.clone() })?;
                    self.step_ended(&name, StepEnd::Failed { summary: failure.summary.clone() });
                    run.schedule.finish(&name, End::Failed { interrupted: false, then: AfterFailure::Kept });
                    self.stop_previews_of_dependents(run, &name);
                    cp.record(Record::StepFailed { step: name.clone(), failure })?;
                    continue;
                }
            };
            self.spawn_step(cp, run, step, action, tool_version).await?;
        }
        Ok(())
    }

    /// A step whose `gate` refuses it ends refused, having run nothing: `true` then.
    async fn refused_by_gate(&self, cp: &SharedCheckpoint, run: &mut RunState, step: &Step) -> anyhow::Result<bool> {
        let Some(gate) = &step.gate else { return Ok(false) };
        let Err(reason) = crate::gate::evaluate(gate, &self.stack.dir, &self.state.shared).await else {
            return Ok(false);
        };
        let name = &step.name;
        self.step_ended(name, StepEnd::Refused { reason: reason.clone() });
        run.schedule.finish(name, End::Refused);
        self.stop_previews_of_dependents(run, name);
        cp.record(Record::StepRefused { step: name.clone(), reason })?;
        Ok(true)
    }

    /// The step with its references' values, taken before the tool starts: a missing output, or
    /// under `up --plan` a value other than the one the plan previewed, fails the step here,
    /// having run nothing.
    async fn with_inputs(&self, cp: &SharedCheckpoint, step: &Step) -> Result<Step, Failure> {
        let name = &step.name;
        let resolved = self.resolve_references(cp, step).await?;
        let recorded =
            |producer: &str, key: &str| cp.read(|d| d.step(producer).and_then(|s| s.outputs.get(key).cloned()));
        match self.plan_inputs_moved(step, &recorded) {
            None => Ok(resolved),
            Some(why) => {
                Err(Failure::new(format!("step `{name}` is not as the plan previewed it: {why}; nothing was run"))
                    .with_hint(format!(
                    "`rdeploy recover {0}` applies it with the new values; to review them first, `rdeploy plan {0}`",
                    self.stack_arg
                )))
            }
        }
    }

    /// Records the step started and runs it (its attempts, as a task of the run) through its
    /// adapter, with its journal and sink, the saved plan `up --plan` reviewed, and `up`'s
    /// decision from the early previews.
    async fn spawn_step(
        &self,
        cp: &SharedCheckpoint,
        run: &mut RunState,
        step: Step,
        action: Action,
        tool_version: Option<String>,
    ) -> anyhow::Result<()> {
        let name = step.name.clone();
        let (mode, work) = mode_and_work(&action, step.tool);
        // `up --plan`: terraform applies the reviewed saved plan as it is.
        let saved = if matches!(action, Action::Apply) { self.saved_plan_of(&name) } else { None };
        // A step that cannot resume completes or reverts: it is never retried. Nor is a
        // step applying a reviewed saved plan: another attempt would apply a plan nobody
        // reviewed; after its failure `rdeploy recover` (an operator's choice) plans again.
        let retry = step.retry.clone().filter(|_| step.resumable && saved.is_none());
        // Its early preview, if it is still good (made while nothing applied, with no other
        // step running): waited for here, while nothing else runs, before the step is recorded
        // and shown started. A step that only waited for it when the run stopped (a Ctrl-C)
        // never started: it is taken back, as a step not reached.
        let (early, stopping) = match (&action, &mut run.converging) {
            (Action::Apply, Some(converging)) if !step.always => {
                converging.early.take(&name, run.running.is_empty()).await
            }
            _ => (None, None),
        };
        // The run's cancel or a child of it: a Ctrl-C cancels it too.
        let stopped = run.converging.as_ref().map_or_else(|| self.cancel.clone(), |c| c.early.stopped());
        if stopped.is_cancelled() {
            run.schedule.unpop(&name, action);
            run.schedule.stop();
            return Ok(());
        }
        let (mut step, mut ctx, read) = self.resolved(&step, self.cancel.child_token());
        if let Some(saved) = saved {
            step.spec.use_saved_plan(saved);
        }
        if matches!(action, Action::Recover(_)) {
            // Our own run record is the last one: every earlier run has ended or is elsewhere.
            ctx.started_by =
                cp.read(|deploy| self.started_by(deploy, &name, deploy.runs.last().map(|r| r.run_id.as_str())));
        }
        let converge = match (&action, &run.converging) {
            (Action::Apply, Some(_)) if !step.always => {
                let current =
                    |producer: &str, key: &str| cp.read(|d| d.step(producer).and_then(|s| s.outputs.get(key).cloned()));
                Some(self.decided_preview(&current, &step, early))
            }
            _ => None,
        };
        let applies = run.converging.as_ref().map(|c| c.early.applies.clone());
        let journal = StepJournal::new(name.clone(), cp.clone(), ctx.cancel.clone());
        let sink = StepSink::new(journal, self.sensitive.clone(), self.reporters.clone(), self.redactor.clone());
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
        // Journaled started before its tools start (a kill -9 before that leaves it pending):
        // here, or in its task once a preview of it being stopped has ended.
        if stopping.is_none() {
            if let Err(e) = attempts.start(&name, mode, work) {
                // As in its task: a step whose start could not be journaled never started.
                run.schedule.unpop(&name, action);
                return Err(e);
            }
        }
        run.outputs_before.insert(name.clone(), self.outputs_seen(cp, &name));
        run.running.spawn(async move {
            // A preview of this step stopped as it started: its tools exit before the step's own
            // start, and if the run stopped meanwhile (nothing new starts) the step never does.
            if let Some(stopping) = stopping {
                stopping.ended().await;
                if stopped.is_cancelled() {
                    return (step.name.clone(), Ran::NotStarted { action, error: None });
                }
                if let Err(e) = attempts.start(&step.name, mode, work) {
                    return (step.name.clone(), Ran::NotStarted { action, error: Some(e) });
                }
            }
            let result = match read {
                Ok(()) => attempts.run(&step, &ctx, action, &sink, converge).await,
                Err(failure) => Err(failure),
            };
            // Whatever the step did (unless it found everything in place) may move what a
            // preview that started before now read: later steps do not take such a preview.
            if let Some(applies) = applies.filter(|_| !matches!(result, Ok((_, Converged::InPlace)))) {
                applies.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            let result = result.map(|(recovered, _)| recovered);
            (step.name.clone(), Ran::Ended(result))
        });
        Ok(())
    }

    /// Records how a step ended and applies complete-or-revert to a non-resumable failure.
    pub(super) async fn settle_step(
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
                    self.stale_consumers(cp, &mut run.schedule, &name, &before)?;
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
                self.stop_previews_of_dependents(run, &name);
                return Ok(());
            }
            Err(failure) => failure,
        };
        let interrupted = failure.interrupted || self.cancel.is_cancelled();
        let failure = self.name_timeout(cp, &step, failure);
        self.step_ended(&name, StepEnd::Failed { summary: failure.summary.clone() });
        cp.record(Record::StepFailed { step: name.clone(), failure: Failure { interrupted, ..failure } })?;
        // Before the revert below changes what they read.
        if run.schedule.failure_stops(interrupted) {
            self.stop_previews(run);
        } else {
            self.stop_previews_of_dependents(run, &name);
        }
        let then = if !step.resumable && step.revert.is_some() {
            // Complete or revert, under Ctrl-C too: a step that cannot resume goes back to where
            // it started (uncancellably) before rdeploy exits.
            let reverted = self.revert_step(cp, &step).await;
            // The revert moved live state too (a preview under way read some of it).
            if let Some(converging) = &run.converging {
                converging.early.applied();
            }
            match reverted? {
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
    pub(super) fn name_timeout(&self, cp: &SharedCheckpoint, step: &Step, mut failure: Failure) -> Failure {
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
}

/// How a step's action is journaled and said: its mode and its work.
fn mode_and_work(action: &Action, tool: rdeploy_adapters::Tool) -> (StepMode, Work) {
    match action {
        Action::Recover(_) => (StepMode::Recover, Work::Recover(tool)),
        _ => (StepMode::Apply, Work::Apply(tool)),
    }
}

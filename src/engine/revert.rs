//! Undoing: a step's `revert` (alone, for complete-or-revert, or every step newest first for
//! `rdeploy revert` and `on_failure: revert`), and `rdeploy reset`, which forgets a deploy.

use rdeploy_adapters::{shell, CancellationToken};

use super::event::{RunEvent, StepEnd, Work};
use super::journal::Checkpoint;
use super::journal::{SharedCheckpoint, StepJournal};
use super::report::{Ended, RunReport};
use super::schedule::Outcome;
use super::session::Session;
use super::sink::StepSink;
use crate::checkpoint::{Deploy, DeployState, Record, StepMode, StepStatus};
use crate::stack::Step;

impl Session {
    /// Failed steps without `revert` that left sub-changes in place: a whole-deploy revert
    /// cannot undo them, so the deploy must not be reported as reverted.
    pub(super) fn unrevertable_partial_steps(&self, cp: &SharedCheckpoint) -> Vec<(String, Vec<String>)> {
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
    pub(super) async fn revert_step(&self, cp: &SharedCheckpoint, step: &Step) -> anyhow::Result<Outcome> {
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
        let sink = StepSink::new(journal, self.sensitive.clone(), self.reporters.clone(), self.redactor.clone());
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
                let failure = self.redactor.redact_failure(failure);
                self.step_ended(&step.name, StepEnd::RevertFailed { summary: failure.summary.clone() });
                cp.record(Record::StepRevertFailed { step: step.name.clone(), failure })?;
                Ok(Outcome::RevertFailed)
            }
        }
    }

    /// Reverts every step that changed something and declares `revert`, newest first.
    pub(super) async fn revert_all(&self, cp: &SharedCheckpoint) -> anyhow::Result<Outcome> {
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
                return Ok(RunReport::new(Outcome::Complete, Ended::NothingToRevert(Some(deploy))));
            }
            let mut cp = Checkpoint::resume(self.store.as_ref(), &self.redactor)?;
            cp.record(Checkpoint::run_record(&self.stack, "revert", &ulid::Ulid::new().to_string()))?;
            cp
        } else {
            let Some(last) =
                self.store.last_finished()?.filter(|d| d.state == DeployState::Complete && d.stack == self.stack.name)
            else {
                return Ok(RunReport::new(Outcome::Complete, Ended::NothingToRevert(None)));
            };
            if !revertible(&last, &[StepStatus::Done]) {
                return Ok(RunReport::new(Outcome::Complete, Ended::NothingToRevert(Some(last))));
            }
            // Re-open the finished deploy as a new journal so the revert itself is checkpointed.
            let mut cp = Checkpoint::create(self.store.as_ref(), &self.redactor)?;
            cp.record(Checkpoint::run_record(&self.stack, "revert", &ulid::Ulid::new().to_string()))?;
            let mut done: Vec<_> = last.steps.iter().filter(|s| s.status == StepStatus::Done).collect();
            done.sort_by_key(|s| s.done_seq);
            for s in done {
                cp.record(Record::StepDone { step: s.name.clone() })?;
            }
            // A `revert` line may use a step's output: the finished deploy's, as recorded (a
            // sensitive one by its key, read again from its producer's state when needed).
            for s in last.steps.iter().filter(|s| !s.outputs.is_empty() || !s.sensitive_outputs.is_empty()) {
                let (values, sensitive) = (s.outputs.clone(), s.sensitive_outputs.clone());
                cp.record(Record::Outputs { step: s.name.clone(), values, sensitive })?;
            }
            cp
        };
        let cp = SharedCheckpoint::new(cp);
        let outcome = self.revert_all(&cp).await?;
        if outcome == Outcome::StepReverted {
            // Reverting is what `revert` was asked to do.
            let deploy = cp.into_inner().finish(DeployState::Reverted)?;
            Ok(RunReport::new(Outcome::Complete, Ended::Ran(deploy)))
        } else {
            cp.snapshot();
            let deploy = cp.read(Deploy::clone);
            Ok(RunReport::new(Outcome::RevertFailed, Ended::Ran(deploy)))
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
            return Ok(RunReport::new(Outcome::Complete, Ended::NothingToReset));
        }
        let mut cp = match Checkpoint::reopen_as_is(self.store.as_ref(), &self.redactor) {
            Ok(cp) => cp,
            Err(e) => {
                let kept = self.store.retire_unfinished()?;
                return Ok(RunReport::new(
                    Outcome::Complete,
                    Ended::ForgotUnreadable { error: format!("{e:#}"), kept },
                ));
            }
        };
        cp.record(Record::Warning { step: None, message: "reset by the operator after manual reconciliation".into() })?;
        let deploy = cp.finish(DeployState::Partial)?;
        Ok(RunReport::new(Outcome::Complete, Ended::Forgot(deploy)))
    }
}

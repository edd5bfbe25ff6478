//! `rdeploy recover`: resume the unfinished deploy through each tool's recovery path, or
//! (`--dry-run`) say what that would do.

use rdeploy_adapters::{Adapter, PriorStep};

use super::attempt::Action;
use super::journal::Checkpoint;
use super::report::{ApplyWhy, DryRunPlan, DryRunStep, Ended, RunReport};
use super::schedule::Outcome;
use super::session::Session;
use crate::adapter::StepAdapter;
use crate::checkpoint::{Deploy, Record, StepStatus};
use crate::diff::StackDiff;
use crate::exit::{Code, Refusal};
use crate::stack::Step;

impl Session {
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
            return Ok(RunReport::new(Outcome::Complete, Ended::NothingToRecover(last)));
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
                diff: Some(diff),
                ended: Ended::DryRun { deploy, plan },
            });
        }
        let mut cp = Checkpoint::resume(self.store.as_ref(), &self.redactor)?;
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
        Ok(RunReport { outcome, diff: Some(diff), ended: Ended::Ran(deploy) })
    }

    pub(super) fn recovery_actions(&self, deploy: &Deploy) -> anyhow::Result<Vec<(String, Action)>> {
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
    pub(super) async fn dry_run(
        &self,
        deploy: &Deploy,
        diff: &StackDiff,
        actions: &[(String, Action)],
    ) -> Vec<DryRunStep> {
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
            let step = self.resolve_references_from(|f| f(deploy), &step).await.unwrap_or(step);
            let step = &step;
            let adapter = StepAdapter::of(step, &self.state.shared);
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
                Action::Apply => {
                    let why = if deploy.step(&step.name).is_some_and(|s| s.status == StepStatus::Reverted) {
                        ApplyWhy::Reverted
                    } else if step.resumable {
                        ApplyWhy::NotStarted
                    } else {
                        ApplyWhy::NotResumable
                    };
                    let actions = match adapter.inspect(&ctx, &PriorStep::default()).await {
                        Ok(inspection) => inspection.actions,
                        Err(_) => Vec::new(),
                    };
                    DryRunPlan::Apply { why, actions }
                }
                Action::Recover(prior) => {
                    DryRunPlan::Recover(adapter.inspect(&ctx, prior).await.map(|i| i.actions).map_err(|f| f.summary))
                }
            };
            plan.push(DryRunStep { name: step.name.clone(), tool: step.tool, changed, plan: what });
        }
        plan
    }
}

//! `rdeploy up`: a new deploy of every step (with `--plan`, exactly the reviewed one).

use std::sync::Arc;

use super::attempt::Action;
use super::journal::Checkpoint;
use super::preview::EarlyPreviews;
use super::report::{Ended, RunReport};
use super::run::Converging;
use super::session::Session;
use crate::checkpoint::{Record, StepStatus};
use crate::exit::{Code, Refusal};
use crate::stack::Step;

impl Session {
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
        // Bad input (a missing or unusable tool) is refused before anything runs: the
        // previews run the user's `check:` commands and read live state, so they wait for it.
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
        // What is in place, as `plan` sees it (read-only): previewed while the run goes, each
        // step taking its own when its turn comes. Those still under way once no step starts any
        // more are stopped (by the run, before `on_failure: revert` changes what they read; here
        // too, for a run that ended early with an error) and waited for.
        let stop_previews = self.cancel.child_token();
        let (early, previews) = if self.force_apply || self.from_plan.is_some() {
            (EarlyPreviews::none(&stop_previews), None)
        } else {
            let (early, previews) = self.early_previews(&stop_previews);
            (early, Some(previews))
        };
        let ran = async {
            let mut cp = Checkpoint::create(self.store.as_ref(), &self.redactor)?;
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
            let converging = (!self.force_apply).then(|| Converging { early, last });
            self.run(cp, actions, tools, converging).await
        };
        let ran = match previews {
            None => ran.await,
            Some(previews) => {
                let mut previews = std::pin::pin!(previews);
                // The previews that need no other's start now, before the first step can take
                // its slot (and so preview for itself).
                if futures::poll!(previews.as_mut()).is_ready() {
                    ran.await
                } else {
                    let ran = async {
                        let ran = ran.await;
                        stop_previews.cancel();
                        ran
                    };
                    tokio::join!(ran, previews).0
                }
            }
        };
        // A reviewed saved plan no apply consumed (its step never ran) goes, whatever happened.
        self.unstage_saved_plans();
        let (outcome, deploy) = ran?;
        Ok(RunReport::new(outcome, Ended::Ran(deploy)))
    }
}

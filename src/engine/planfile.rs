//! `up --plan` through the session: the reviewed PLANFILE checked against the stack and the
//! live state before anything runs, terraform's reviewed saved plans staged for their steps'
//! applies (and removed after), and the output values each step was reviewed with. The
//! PLANFILE's format is `crate::planfile`'s.

use std::io::Write as _;
use std::path::PathBuf;

use rdeploy_adapters::preview::PreviewError;
use rdeploy_adapters::Adapter;

use super::session::Session;
use crate::adapter::StepAdapter;
use crate::exit::{Code, Refusal};
use crate::plan::Resolved;
use crate::planfile::{files_moved, observed_moved, sha256_hex, step_files, Loaded, SavedStep, REVIEWED_TFPLAN};
use crate::stack::Step;

impl Session {
    /// `up --plan`: before anything runs or is recorded, everything the plan saw is read again;
    /// anything that moved refuses the run (exit 2), naming each thing.
    pub async fn check_plan(&self, loaded: &Loaded) -> anyhow::Result<()> {
        let saved = &loaded.plan;
        let again = format!(
            "plan again with `rdeploy plan {} -o {}`, review it, then `rdeploy up {} --plan {}`",
            self.stack_arg,
            loaded.path.display(),
            self.stack_arg,
            loaded.path.display()
        );
        let stale = |moved: Vec<String>| -> anyhow::Error {
            Refusal::new(
                Code::BadInput,
                format!(
                    "the plan {} is stale: nothing was applied and nothing recorded\n  {}",
                    loaded.path.display(),
                    moved.join("\n  ")
                ),
            )
            .with_hint(again.clone())
            .into()
        };
        if saved.stack.name != self.stack.name {
            return Err(stale(vec![format!(
                "the plan is of stack `{}` ({}), not of stack `{}` ({})",
                saved.stack.name, saved.stack.file, self.stack.name, self.stack_file
            )]));
        }
        let bytes = fs_err::read(&self.stack.file)?;
        if sha256_hex(&bytes) != saved.stack.digest {
            return Err(stale(vec![format!("the stack file {} changed since the plan", self.stack_file)]));
        }
        let failed: Vec<&SavedStep> = saved.steps.iter().filter(|s| s.error.is_some()).collect();
        if !failed.is_empty() {
            let what: Vec<String> = failed
                .iter()
                .map(|s| format!("step `{}` could not be planned: {}", s.name, s.error.as_deref().unwrap_or_default()))
                .collect();
            return Err(Refusal::new(
                Code::BadInput,
                format!("the plan {} cannot be applied as reviewed:\n  {}", loaded.path.display(), what.join("\n  ")),
            )
            .with_hint(format!("fix the cause, then {again}"))
            .into());
        }
        let mut moved = Vec::new();
        for step in self.stack.ordered() {
            let Some(saved_step) = saved.steps.iter().find(|s| s.name == step.name) else {
                moved.push(format!("step `{}` is not in the plan", step.name));
                continue;
            };
            moved.extend(files_moved(
                &step.name,
                &saved_step.files,
                &step_files(&self.stack, step, &self.state.shared)?,
            ));
        }
        if !moved.is_empty() {
            return Err(stale(moved));
        }
        moved.extend(self.live_state_moved(loaded).await?);
        if !moved.is_empty() {
            return Err(stale(moved));
        }
        Ok(())
    }

    /// What each tool reads of the live state now that differs from what the plan observed
    /// (concurrently, read-only, as `plan` does), a step's line each.
    async fn live_state_moved(&self, loaded: &Loaded) -> anyhow::Result<Vec<String>> {
        let saved = &loaded.plan;
        let mut moved = Vec::new();
        let mut running = tokio::task::JoinSet::new();
        for step in self.stack.ordered() {
            let saved_step =
                saved.steps.iter().find(|s| s.name == step.name).expect("check_plan found every step in the plan");
            if !saved_step.previewed || saved_step.observed.is_empty() {
                continue;
            }
            let values: std::collections::HashMap<String, String> = saved_step
                .inputs
                .iter()
                .filter_map(|(k, v)| match v {
                    Resolved::Known(v) => Some((k.clone(), rdeploy_adapters::outputs::value_text(v))),
                    Resolved::Pending { .. } => None,
                })
                .collect();
            let step = step
                .resolve(&|r| values.get(&format!("steps.{}.outputs.{}", r.step, r.key)).cloned())
                .map_err(|e| anyhow::anyhow!("step `{}`: {e:?}", step.name))?;
            let (step, ctx, read) = self.resolved(&step, self.cancel.child_token());
            let then = saved_step.observed.clone();
            let records = self.state.shared.clone();
            running.spawn(async move {
                let now = match read {
                    Ok(()) => StepAdapter::of(&step, &records).observe(&ctx).await,
                    Err(failure) => Err(PreviewError::Failed(failure)),
                };
                (step.name.clone(), then, now)
            });
        }
        let mut results = Vec::new();
        while let Some(joined) = running.join_next().await {
            results.push(joined.map_err(|e| anyhow::anyhow!("an observation task panicked: {e}"))?);
        }
        if self.cancel.is_cancelled() {
            return Err(Refusal::new(Code::Interrupted, "interrupted while checking the plan: nothing was changed")
                .with_hint(format!("run `rdeploy up {} --plan {}` again", self.stack_arg, loaded.path.display()))
                .into());
        }
        let order: Vec<String> = self.stack.ordered().map(|s| s.name.clone()).collect();
        results.sort_by_key(|(name, ..)| order.iter().position(|n| n == name));
        for (name, then, now) in results {
            match now {
                Ok(now) => moved.extend(observed_moved(&name, &then, &now)),
                Err(PreviewError::Tool(e)) => {
                    moved.push(format!("step `{name}`: cannot read its live state again: {e}"));
                }
                Err(PreviewError::Failed(f)) => {
                    moved.push(format!(
                        "step `{name}`: cannot read its live state again: {}",
                        self.redactor.redact(&f.summary)
                    ));
                }
            }
        }
        Ok(moved)
    }

    /// Puts each reviewed terraform plan of the PLANFILE in its step's work dir (0700, the
    /// file 0600), where [`Session::saved_plan_of`] finds it for the step's apply.
    pub fn stage_saved_plans(&self, loaded: &Loaded) -> anyhow::Result<()> {
        // Every digest is checked before any file is written: a refusal leaves nothing behind.
        let mut staged = Vec::new();
        for saved in &loaded.plan.steps {
            let Some(tf) = &saved.terraform_plan else { continue };
            let bytes = tf.bytes()?;
            if sha256_hex(&bytes) != tf.digest {
                return Err(Refusal::new(
                    Code::BadInput,
                    format!(
                        "the plan file {}: terraform's saved plan of step `{}` does not match its digest",
                        loaded.path.display(),
                        saved.name
                    ),
                )
                .with_hint(format!("make it again with `rdeploy plan -o {}`", loaded.path.display()))
                .into());
            }
            staged.push((saved, bytes));
        }
        for (saved, bytes) in staged {
            let dir = self.state.step_dir(&saved.name);
            self.state.create_dir(&dir)?;
            let path = dir.join(REVIEWED_TFPLAN);
            let mut file = tempfile::Builder::new().prefix(".reviewed-").tempfile_in(&dir)?;
            file.write_all(&bytes)?;
            file.as_file().sync_all()?;
            file.persist(&path).map_err(|e| e.error)?;
        }
        Ok(())
    }

    /// After `up --plan`: a staged saved plan no apply consumed (its step never ran) holds
    /// variable values; it goes, and `recover` plans on terraform's own path.
    pub fn unstage_saved_plans(&self) {
        let Some(loaded) = &self.from_plan else { return };
        for saved in loaded.plan.steps.iter().filter(|s| s.terraform_plan.is_some()) {
            let _ = std::fs::remove_file(self.state.step_dir(&saved.name).join(REVIEWED_TFPLAN));
        }
    }

    /// `recover` and `reset`: a `reviewed.tfplan` a killed `up --plan` left (it holds
    /// variable values) goes before anything else; neither applies a reviewed plan.
    pub fn remove_leftover_saved_plans(&self) {
        for step in &self.stack.steps {
            let _ = std::fs::remove_file(self.state.step_dir(&step.name).join(REVIEWED_TFPLAN));
        }
    }

    /// The reviewed terraform plan `up --plan` staged for `step`, if any.
    pub fn saved_plan_of(&self, step: &str) -> Option<PathBuf> {
        let loaded = self.from_plan.as_ref()?;
        loaded.step(step)?.terraform_plan.as_ref()?;
        let path = self.state.step_dir(step).join(REVIEWED_TFPLAN);
        Some(std::path::absolute(&path).unwrap_or(path))
    }

    /// `up --plan`: a step previewed with known output values is applied with those only; a
    /// value that differs now (its producer applied and output something else) fails the step
    /// before its tool starts. Values known only after a producer applies were never reviewed
    /// and are taken as they come, as `up` does.
    pub fn plan_inputs_moved(
        &self,
        step: &Step,
        current: &dyn Fn(&str, &str) -> Option<serde_json::Value>,
    ) -> Option<String> {
        let loaded = self.from_plan.as_ref()?;
        let saved = loaded.step(&step.name)?;
        let mut moved = Vec::new();
        for reference in &step.refs {
            let key = format!("steps.{}.outputs.{}", reference.step, reference.key);
            match saved.inputs.get(&key) {
                Some(Resolved::Known(then)) => {
                    let now = current(&reference.step, &reference.key);
                    if now.as_ref() != Some(then) {
                        moved.push(format!(
                            "`{key}` is {} now but the plan previewed the step with {}",
                            now.map_or_else(|| "unset".to_string(), |v| rdeploy_adapters::outputs::value_text(&v)),
                            rdeploy_adapters::outputs::value_text(then)
                        ));
                    }
                }
                Some(Resolved::Pending { .. }) => {}
                None => moved.push(format!("`{key}` is not a reference the plan recorded for this step")),
            }
        }
        (!moved.is_empty()).then(|| self.redactor.redact(&moved.join("; ")))
    }
}

//! Previews through the session: `rdeploy plan`'s (every step at once, as far as their inputs
//! allow) and `up`'s early ones, and the decision each step of `up` takes from them. The plan's
//! model and its renderers are `crate::plan`'s.

use std::collections::{BTreeMap, HashMap};

use rdeploy_adapters::preview::PreviewError;
use rdeploy_adapters::{Adapter, PlanAction, Preview};

use super::session::Session;
use crate::adapter::StepAdapter;
use crate::exit::{Code, Refusal};
use crate::plan::{input_key, known_inputs, redact_preview, Resolved, StackPlan, StepPlan};
use crate::stack::Step;

impl Session {
    /// Every step's preview that `wanted` selects, run at once as far as their inputs allow: in
    /// waves, a step that reads outputs starts once each producer's preview is in and changes
    /// nothing and the recorded deploy has the value; one whose values stay pending is not
    /// previewed (`None`). Returns each step's result and the output values it was previewed
    /// with. `announce`: say each step planned (for `rdeploy plan`).
    pub(crate) async fn run_previews(
        &self,
        steps: &[&Step],
        recorded: Option<&crate::checkpoint::Deploy>,
        announce: bool,
        wanted: &dyn Fn(&Step) -> bool,
        decision: bool,
    ) -> anyhow::Result<(Vec<Option<Result<Preview, PreviewError>>>, Vec<BTreeMap<String, Resolved<serde_json::Value>>>)>
    {
        let mut running = tokio::task::JoinSet::new();
        let mut results: Vec<Option<Result<Preview, PreviewError>>> = steps.iter().map(|_| None).collect();
        let mut inputs: Vec<BTreeMap<String, Resolved<serde_json::Value>>> = vec![BTreeMap::new(); steps.len()];
        let mut started = vec![false; steps.len()];
        // In waves: a step that reads outputs starts once each producer's preview is in and its
        // values are known; one whose values stay pending is not previewed at all.
        loop {
            for (index, step) in steps.iter().enumerate() {
                if started[index] || !wanted(step) {
                    continue;
                }
                let known = known_inputs(step, steps, &results, recorded);
                // A producer not previewed yet, or one that would change: wait (the next wave, or
                // for good).
                let waiting = known.values().any(|v| matches!(v, Resolved::Pending { .. }));
                inputs[index] = known;
                if waiting {
                    continue;
                }
                let values: HashMap<String, String> = inputs[index]
                    .iter()
                    .filter_map(|(k, v)| match v {
                        Resolved::Known(v) => Some((k.clone(), rdeploy_adapters::outputs::value_text(v))),
                        Resolved::Pending { .. } => None,
                    })
                    .collect();
                // A value its key cannot take is for `up` to refuse; the plan leaves it pending.
                let Ok(step) = step.resolve(&|r| values.get(&input_key(r)).cloned()) else { continue };
                started[index] = true;
                // As for `up`: marked secrets are read (and registered for redaction) before the
                // tool starts; one that cannot be read fails this step's preview.
                let (step, ctx, read) = self.resolved(&step, self.cancel.child_token());
                let records = self.state.shared.clone();
                running.spawn(async move {
                    let adapter = StepAdapter::of(&step, &records);
                    let result = match read {
                        // `up` takes the decision alone (the same verdict, maybe fewer reads).
                        Ok(()) if decision => adapter.decision_preview(&ctx).await,
                        Ok(()) => adapter.preview(&ctx).await,
                        Err(failure) => Err(PreviewError::Failed(failure)),
                    };
                    (index, result)
                });
            }
            if running.is_empty() {
                break;
            }
            while let Some(joined) = running.join_next().await {
                let (index, result) = joined.map_err(|e| anyhow::anyhow!("a preview task panicked: {e}"))?;
                if announce {
                    self.ui.info(format!("planned {} ({})", steps[index].name, steps[index].tool));
                }
                results[index] = Some(result);
            }
        }
        Ok((results, inputs))
    }

    /// `up`'s previews made before the run, as `plan` makes them (at once, with the output
    /// values the last deploy recorded; each tool's [`Adapter::decision_preview`], the same
    /// verdict with no more reads than it needs): each step's decision while nothing in the run has
    /// applied anything yet, so a deploy where everything is in place costs about a plan. A
    /// step whose adapter does not converge by its preview ([`Adapter::converges_by_preview`]:
    /// ansible runs anyway, a fleet step previews per cluster), one with `always: true`, or one
    /// whose preview failed gets none: it previews when it starts.
    pub(crate) async fn early_previews(
        &self,
    ) -> HashMap<String, (Preview, BTreeMap<String, Resolved<serde_json::Value>>)> {
        let steps: Vec<&Step> = self.stack.ordered().collect();
        let recorded = self.store.last_finished().ok().flatten().filter(|d| d.stack == self.stack.name);
        let wanted = |step: &Step| StepAdapter::of(step, &self.state.shared).converges_by_preview() && !step.always;
        let Ok((results, inputs)) = self.run_previews(&steps, recorded.as_ref(), false, &wanted, true).await else {
            return HashMap::new();
        };
        steps
            .iter()
            .zip(results)
            .zip(inputs)
            .filter_map(|((step, result), inputs)| match result {
                Some(Ok(preview)) => Some((step.name.clone(), (preview, inputs))),
                _ => None,
            })
            .collect()
    }

    /// The decision a step of `up` takes ([`Adapter::converge_step`]):
    /// under `up --plan`, the reviewed plan's items (exactly what it said would change); else
    /// the preview `up` made before the run, as long as nothing in the run applied anything
    /// since, no other step is running (`alone`), and the output values the step gets now are
    /// those it was previewed with; otherwise `None`: the step previews when it starts.
    pub(crate) fn decided_preview(
        &self,
        current: &dyn Fn(&str, &str) -> Option<serde_json::Value>,
        step: &Step,
        early: &mut HashMap<String, (Preview, BTreeMap<String, Resolved<serde_json::Value>>)>,
        applied: bool,
        alone: bool,
    ) -> Option<Preview> {
        if let Some(loaded) = &self.from_plan {
            return loaded.step(&step.name).and_then(crate::planfile::SavedStep::decided);
        }
        let (preview, inputs) = early.remove(&step.name)?;
        if applied || !alone {
            return None;
        }
        let same = step.refs.iter().all(|r| match inputs.get(&input_key(r)) {
            Some(Resolved::Known(then)) => current(&r.step, &r.key).as_ref() == Some(then),
            _ => false,
        });
        same.then_some(preview)
    }

    /// `rdeploy plan`: every step's preview, shown in run order; changes nothing. The previews
    /// only read, so they run at once (a plan costs about its slowest tool, not their sum); a
    /// tool that is missing is bad input (exit 2), as preflight says for `up`.
    pub async fn plan(&self) -> anyhow::Result<StackPlan> {
        let steps: Vec<&Step> = self.stack.ordered().collect();
        let mut plan = StackPlan { stack: self.stack.name.clone(), changes: 0, steps: Vec::new(), notes: Vec::new() };
        if let Ok(Some(deploy)) = self.store.load_unfinished() {
            plan.notes.push(format!(
                "deploy {} is unfinished: `rdeploy up` refuses until `rdeploy recover {}` (or `rdeploy reset`) settles it",
                deploy.deploy_id, self.stack_arg
            ));
        }
        // What the unfinished deploy (else the last one of this stack) journaled, for the values
        // of producers that would not change.
        let recorded = match self.store.load_unfinished() {
            Ok(Some(deploy)) => Some(deploy),
            _ => self.store.last_finished().ok().flatten().filter(|d| d.stack == self.stack.name),
        };
        let (results, inputs) = self.run_previews(&steps, recorded.as_ref(), true, &|_| true, false).await?;
        let missing: Vec<String> = steps
            .iter()
            .zip(&results)
            .filter_map(|(step, result)| match result {
                Some(Err(PreviewError::Tool(e))) => {
                    let hint = e.hint().map(|h| format!("\n  hint: {h}")).unwrap_or_default();
                    Some(format!("step `{}`: {e}{hint}", step.name))
                }
                _ => None,
            })
            .collect();
        if !missing.is_empty() {
            return Err(Refusal::new(Code::BadInput, missing.join("\n")).into());
        }
        for ((step, result), inputs) in steps.iter().zip(results).zip(inputs) {
            let step_plan = self.step_plan(step, result, inputs)?;
            plan.changes += step_plan.changes;
            plan.steps.push(step_plan);
        }
        Ok(plan)
    }

    /// What the plan says of one step from its preview's result (`None`: not previewed, its
    /// inputs pending), redacted; an interrupted preview refuses the whole plan.
    fn step_plan(
        &self,
        step: &Step,
        result: Option<Result<Preview, PreviewError>>,
        inputs: BTreeMap<String, Resolved<serde_json::Value>>,
    ) -> anyhow::Result<StepPlan> {
        // The run's registry holds every secret of the stack (registered when it loaded,
        // and the marked ones read for this step's preview).
        let redact = |text: &str| self.redactor.redact(text);
        let mut step_plan = StepPlan {
            name: step.name.clone(),
            tool: step.tool,
            changes: 0,
            summary: None,
            items: Vec::new(),
            notes: Vec::new(),
            unknown_until: Vec::new(),
            inputs,
            error: None,
            observed: Vec::new(),
            saved_plan: None,
        };
        match result {
            None => {
                for value in step_plan.inputs.values() {
                    if let Resolved::Pending { step } = value {
                        if !step_plan.unknown_until.contains(step) {
                            step_plan.unknown_until.push(step.clone());
                        }
                    }
                }
                let after: Vec<String> = step_plan
                    .unknown_until
                    .iter()
                    .map(|s| Resolved::<String>::Pending { step: s.clone() }.to_string())
                    .collect();
                step_plan.summary = Some(format!("not previewed: it reads outputs {}", after.join(", ")));
                // Counted as a change: the plan cannot claim it would change nothing.
                step_plan.changes = 1;
            }
            Some(Ok(mut preview)) => {
                if step.always {
                    // What `up` decides: the tool runs, in place or not.
                    preview.items.push(
                        rdeploy_adapters::PlanItem::new(step.name.clone(), PlanAction::Run)
                            .because("`always: true`: the tool runs on every `up`, whatever is in place"),
                    );
                }
                redact_preview(&mut preview, redact);
                step_plan.changes = preview.changes();
                step_plan.summary = preview.summary;
                step_plan.items = preview.items;
                step_plan.notes = preview.notes;
                step_plan.observed = preview.observed;
                step_plan.saved_plan = preview.saved_plan;
            }
            Some(Err(PreviewError::Failed(failure))) if failure.interrupted || self.cancel.is_cancelled() => {
                return Err(Refusal::new(
                    Code::Interrupted,
                    format!("interrupted while planning step `{}`: nothing was changed", step.name),
                )
                .with_hint(format!("run `rdeploy plan {}` again", self.stack_arg))
                .into());
            }
            Some(Err(PreviewError::Failed(failure))) => {
                let mut error = redact(&failure.summary);
                if let Some(hint) = &failure.hint {
                    error.push_str(&format!(" (hint: {})", redact(hint)));
                }
                step_plan.error = Some(error);
                step_plan.changes = 1;
            }
            Some(Err(PreviewError::Tool(_))) => unreachable!("`plan` refuses a missing tool before any step plan"),
        }
        Ok(step_plan)
    }
}

//! `rdeploy plan`: what `up` would change, step by step in run order, from each tool's own
//! read-only preview ([`rdeploy_adapters::Preview`]); nothing is changed anywhere (the state
//! directory holds the tools' scratch files only). The driver's session runs the previews and
//! returns a [`StackPlan`]; `render_*` turn it into the human report, markdown for a pull request
//! and the JSON of SPEC.md.
//!
//! Step outputs (`${{ steps.NAME.outputs.KEY }}`): a value is [`Resolved::Known`] when its
//! producer's preview changes nothing and the unfinished (else the last) deploy of the stack
//! journaled it: the step is previewed with it, as `up` would run it. Any other value (its
//! producer would change, or was not previewed, or the value is sensitive and so never journaled)
//! is not known until the producer applies, a [`Resolved::Pending`]: a step that reads one is not
//! previewed with a guess, it is shown "known after NAME applies" ([`StepPlan::unknown_until`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use rdeploy_adapters::preview::PreviewError;
use rdeploy_adapters::{Adapter, PlanAction, Preview, Tool};
use serde::Serialize;

use crate::engine::Session;
use crate::exit::{Code, Refusal};
use crate::stack::Step;

/// A value a step reads: known when the plan is made, or only once an upstream step applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "value")]
pub enum Resolved<T> {
    /// Journaled by a producer whose preview changes nothing: `up` would hand the step this.
    Known(T),
    /// Known after `step` applies: shown as such, never guessed.
    Pending { step: String },
}

impl<T: std::fmt::Display> std::fmt::Display for Resolved<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resolved::Known(value) => value.fmt(f),
            Resolved::Pending { step } => write!(f, "known after {step} applies"),
        }
    }
}

/// The plan of a whole stack.
#[derive(Clone, Debug, Serialize)]
pub struct StackPlan {
    pub stack: String,
    /// Items that would change, over every step (an item that could not be checked counts).
    pub changes: usize,
    pub steps: Vec<StepPlan>,
    /// Anything about the stack as a whole (an unfinished deploy `up` would refuse).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One step's part of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct StepPlan {
    pub name: String,
    pub tool: Tool,
    pub changes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    pub items: Vec<rdeploy_adapters::PlanItem>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The upstream steps whose outputs this step reads: it cannot be previewed before they apply.
    pub unknown_until: Vec<String>,
    /// Each output it reads (`steps.NAME.outputs.KEY`), known or pending.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, Resolved<serde_json::Value>>,
    /// Why the preview could not be made (the tool failed): the step counts as a change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the preview read, for a saved plan (not in the JSON: see `-o PLANFILE`).
    #[serde(skip)]
    pub observed: Vec<rdeploy_adapters::preview::Observed>,
    /// The tool's own saved plan (terraform's `plan -out`), for `-o PLANFILE` only.
    #[serde(skip)]
    pub saved_plan: Option<Vec<u8>>,
}

impl StackPlan {
    /// Whether `up` would change anything (`--detailed-exitcode`: 7, else 0).
    pub fn has_changes(&self) -> bool {
        self.changes > 0
    }
}

/// Each output `step` reads: known when its producer's preview is in and changes nothing and the
/// recorded deploy journaled the value (a sensitive one never is), else pending on the producer.
fn known_inputs(
    step: &Step,
    steps: &[&Step],
    results: &[Option<Result<Preview, PreviewError>>],
    recorded: Option<&crate::checkpoint::Deploy>,
) -> BTreeMap<String, Resolved<serde_json::Value>> {
    let mut out = BTreeMap::new();
    for reference in &step.refs {
        let producer = steps.iter().position(|s| s.name == reference.step);
        // A value the producer makes anew on every apply (helm's `revision`) is never known.
        let volatile = producer.is_some_and(|i| steps[i].spec.volatile_outputs().contains(&reference.key.as_str()));
        let unchanged = !volatile
            && producer
                .and_then(|i| results[i].as_ref())
                .is_some_and(|r| matches!(r, Ok(preview) if preview.changes() == 0));
        let value = recorded.and_then(|d| d.step(&reference.step)).and_then(|s| s.outputs.get(&reference.key));
        let resolved = match value {
            Some(value) if unchanged => Resolved::Known(value.clone()),
            _ => Resolved::Pending { step: reference.step.clone() },
        };
        out.insert(input_key(reference), resolved);
    }
    out
}

/// How a reference is named in [`StepPlan::inputs`]: `steps.NAME.outputs.KEY`.
fn input_key(reference: &crate::reference::Reference) -> String {
    format!("steps.{}.outputs.{}", reference.step, reference.key)
}

fn redact_preview(preview: &mut Preview, r: impl Fn(&str) -> String) {
    preview.summary = preview.summary.as_deref().map(&r);
    preview.notes = preview.notes.iter().map(|n| r(n)).collect();
    // Ids (addresses, objects, hosts) are the checkpoint's keys and never redacted, as in the
    // report: a short secret replaced inside `terraform_data.a1` would name nothing.
    for item in &mut preview.items {
        item.reason = item.reason.as_deref().map(&r);
        item.details = item.details.iter().map(|d| r(d)).collect();
        item.diff = item.diff.as_deref().map(&r);
    }
}

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
                running.spawn(async move {
                    let result = match read {
                        // `up` takes the decision alone (the same verdict, maybe fewer reads).
                        Ok(()) if decision => step.spec.decision_preview(&ctx).await,
                        Ok(()) => step.spec.preview(&ctx).await,
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
    /// step its preview is not for (ansible runs anyway, a fleet step previews per cluster,
    /// `always: true`) or whose preview failed gets none: it previews when it starts.
    pub(crate) async fn early_previews(
        &self,
    ) -> HashMap<String, (Preview, BTreeMap<String, Resolved<serde_json::Value>>)> {
        let steps: Vec<&Step> = self.stack.ordered().collect();
        let recorded = self.store.last_finished().ok().flatten().filter(|d| d.stack == self.stack.name);
        let wanted = |step: &Step| step.tool != Tool::Ansible && step.fleet.is_none() && !step.always;
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

    /// The decision a step of `up` takes ([`rdeploy_adapters::ToolSpec::converge_step`]):
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
            // The run's registry holds every secret of the stack (registered when it loaded,
            // and the marked ones read for this step's preview).
            let redact = |text: &str| crate::out::secrets().redact(text);
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
                Some(Err(PreviewError::Tool(_))) => unreachable!("missing tools were refused above"),
            }
            plan.changes += step_plan.changes;
            plan.steps.push(step_plan);
        }
        Ok(plan)
    }
}

fn action_word(action: PlanAction) -> &'static str {
    match action {
        PlanAction::Create => "+ create",
        PlanAction::Update => "~ update",
        PlanAction::Replace => "± replace",
        PlanAction::Delete => "- delete",
        PlanAction::Run => "> run",
        PlanAction::Unchanged => "= unchanged",
        PlanAction::Unknown => "? unknown",
    }
}

fn step_headline(step: &StepPlan) -> String {
    let what = match (&step.error, &step.summary, step.changes) {
        (Some(_), _, _) => "could not be planned".to_string(),
        (None, Some(summary), _) => summary.clone(),
        (None, None, 0) => "no changes".to_string(),
        (None, None, n) => format!("{n} to change"),
    };
    format!("{} ({}): {what}", step.name, step.tool)
}

fn totals_line(plan: &StackPlan) -> String {
    let changing = plan.steps.iter().filter(|s| s.changes > 0).count();
    if plan.changes == 0 {
        format!("stack {}: no changes; `rdeploy up` would change nothing", plan.stack)
    } else {
        format!(
            "stack {}: {} change{} in {changing} of {}",
            plan.stack,
            plan.changes,
            if plan.changes == 1 { "" } else { "s" },
            crate::out::count(plan.steps.len(), "step")
        )
    }
}

/// The human report: per step its summary, each item with its action, and the diffs indented.
pub fn render_text(plan: &StackPlan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", totals_line(plan));
    for note in &plan.notes {
        let _ = writeln!(out, "note: {note}");
    }
    for step in &plan.steps {
        let _ = writeln!(out, "\n{}", step_headline(step));
        if let Some(error) = &step.error {
            let _ = writeln!(out, "  error: {error}");
        }
        for item in &step.items {
            let reason = item.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
            let _ = writeln!(out, "  {} {}{reason}", action_word(item.action), item.id);
            for detail in &item.details {
                let _ = writeln!(out, "      {detail}");
            }
            if let Some(diff) = &item.diff {
                for line in diff.lines() {
                    let _ = writeln!(out, "      {line}");
                }
            }
        }
        for note in &step.notes {
            let _ = writeln!(out, "  note: {note}");
        }
    }
    out
}

/// Markdown for a pull-request comment or the CI step summary: a table of steps, then each
/// step's items with the diffs folded in `<details>`.
pub fn render_markdown(plan: &StackPlan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## rdeploy plan: stack `{}`\n", plan.stack);
    let _ = writeln!(out, "{}\n", totals_line(plan));
    for note in &plan.notes {
        let _ = writeln!(out, "> **note:** {note}\n");
    }
    let _ = writeln!(out, "| step | tool | changes | summary |\n| --- | --- | --- | --- |");
    for step in &plan.steps {
        let summary = match (&step.error, &step.summary) {
            (Some(error), _) => format!("could not be planned: {error}"),
            (None, Some(summary)) => summary.clone(),
            (None, None) => String::new(),
        };
        let _ = writeln!(out, "| {} | {} | {} | {} |", step.name, step.tool, step.changes, summary.replace('|', "\\|"));
    }
    for step in plan.steps.iter().filter(|s| !s.items.is_empty() || s.error.is_some() || !s.notes.is_empty()) {
        let _ = writeln!(out, "\n### {}\n", step_headline(step).replace('`', ""));
        for item in &step.items {
            let reason = item.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
            let _ = writeln!(out, "- `{}` **{}**{reason}", item.id, item.action.as_str());
            for detail in &item.details {
                let _ = writeln!(out, "  - {detail}");
            }
            if let Some(diff) = &item.diff {
                let fence = if diff.contains("```") { "~~~~" } else { "```" };
                let _ = writeln!(out, "\n  <details><summary>diff</summary>\n\n  {fence}diff");
                for line in diff.lines() {
                    let _ = writeln!(out, "  {line}");
                }
                let _ = writeln!(out, "  {fence}\n\n  </details>\n");
            }
        }
        for note in &step.notes {
            let _ = writeln!(out, "\n> {note}");
        }
    }
    out
}

/// The JSON of SPEC.md (`plan --json`).
pub fn render_json(plan: &StackPlan) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(plan)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdeploy_adapters::PlanItem;

    fn plan() -> StackPlan {
        let mut updated = PlanItem::new("ConfigMap/shop/web", PlanAction::Update).because("differs");
        updated.diff = Some("--- live/x\n+++ wanted/x\n@@ -1 +1 @@\n-a\n+b\n".into());
        StackPlan {
            stack: "shop".into(),
            changes: 3,
            notes: vec![],
            steps: vec![
                StepPlan {
                    name: "network".into(),
                    tool: Tool::Terraform,
                    changes: 1,
                    summary: Some("1 to add, 0 to change, 0 to destroy".into()),
                    items: vec![PlanItem::new("terraform_data.vpc", PlanAction::Create)],
                    notes: vec![],
                    unknown_until: vec![],
                    inputs: BTreeMap::new(),
                    error: None,
                    observed: vec![],
                    saved_plan: None,
                },
                StepPlan {
                    name: "extras".into(),
                    tool: Tool::Kubectl,
                    changes: 1,
                    summary: None,
                    items: vec![updated, PlanItem::new("ConfigMap/shop/same", PlanAction::Unchanged)],
                    notes: vec![],
                    unknown_until: vec![],
                    inputs: BTreeMap::new(),
                    error: None,
                    observed: vec![],
                    saved_plan: None,
                },
                StepPlan {
                    name: "app".into(),
                    tool: Tool::Helm,
                    changes: 1,
                    summary: Some("not previewed: it reads outputs known after network applies".into()),
                    items: vec![],
                    notes: vec![],
                    unknown_until: vec!["network".into()],
                    inputs: BTreeMap::new(),
                    error: None,
                    observed: vec![],
                    saved_plan: None,
                },
            ],
        }
    }

    #[test]
    fn json_has_the_fields_scripts_rely_on() {
        let json: serde_json::Value = serde_json::from_str(&render_json(&plan()).unwrap()).unwrap();
        assert_eq!(json["stack"], "shop");
        assert_eq!(json["changes"], 3);
        assert_eq!(json["steps"][0]["items"][0]["id"], "terraform_data.vpc");
        assert_eq!(json["steps"][0]["items"][0]["action"], "create");
        assert_eq!(json["steps"][1]["items"][0]["action"], "update");
        assert_eq!(json["steps"][2]["unknown_until"][0], "network");
    }

    #[test]
    fn text_and_markdown_show_every_item_and_its_diff() {
        let text = render_text(&plan());
        assert!(text.starts_with("stack shop: 3 changes in 3 of 3 steps\n"), "{text}");
        assert!(
            text.contains("network (terraform): 1 to add, 0 to change, 0 to destroy\n  + create terraform_data.vpc\n")
        );
        assert!(text.contains("  ~ update ConfigMap/shop/web (differs)\n      --- live/x\n"), "{text}");
        assert!(text.contains("known after network applies"), "{text}");
        let md = render_markdown(&plan());
        assert!(md.contains("| extras | kubectl | 1 |"), "{md}");
        assert!(md.contains("<details><summary>diff</summary>"), "{md}");
        assert!(md.contains("  -a\n  +b\n"), "{md}");
    }

    #[test]
    fn a_pending_value_says_when_it_is_known() {
        assert_eq!(Resolved::<String>::Pending { step: "infra".into() }.to_string(), "known after infra applies");
        assert_eq!(Resolved::Known("10.0.0.1".to_string()).to_string(), "10.0.0.1");
    }

    #[test]
    fn finds_the_steps_whose_outputs_a_step_reads() {
        let stack = crate::stack::parse(
            std::path::Path::new("stack.yaml"),
            "name: s\nsteps:\n  - name: infra\n    tool: shell\n    run: echo\n  - name: app\n    tool: shell\n    needs: [infra]\n    run: echo ${{ steps.infra.outputs.ip }} ${{steps.infra.outputs.port}}\n",
        )
        .unwrap();
        let steps: Vec<&Step> = stack.ordered().collect();
        let pending = Resolved::Pending { step: "infra".to_string() };
        // Nothing previewed and nothing recorded: both values wait for `infra`.
        let inputs = known_inputs(stack.step("app").unwrap(), &steps, &[None, None], None);
        assert_eq!(
            inputs,
            BTreeMap::from([
                ("steps.infra.outputs.ip".to_string(), pending.clone()),
                ("steps.infra.outputs.port".to_string(), pending)
            ])
        );
        assert!(known_inputs(stack.step("infra").unwrap(), &steps, &[None, None], None).is_empty());
    }
}

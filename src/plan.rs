//! `rdeploy plan`: what `up` would change, step by step in run order, from each tool's own
//! read-only preview ([`rdeploy_adapters::Preview`]); nothing is changed anywhere (the state
//! directory holds the tools' scratch files only). The engine's session runs the previews
//! (`engine::preview`) and returns a [`StackPlan`]; `render_*` turn it into the human report, markdown for a pull request
//! and the JSON of SPEC.md.
//!
//! Step outputs (`${{ steps.NAME.outputs.KEY }}`): a value is [`Resolved::Known`] when its
//! producer's preview changes nothing and the unfinished (else the last) deploy of the stack
//! journaled it: the step is previewed with it, as `up` would run it. Any other value (its
//! producer would change, or was not previewed, or the value is sensitive and so never journaled)
//! is not known until the producer applies, a [`Resolved::Pending`]: a step that reads one is not
//! previewed with a guess, it is shown "known after NAME applies" ([`StepPlan::unknown_until`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rdeploy_adapters::preview::PreviewError;
use rdeploy_adapters::{Adapter, PlanAction, Preview, Tool};
use serde::Serialize;

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
pub(crate) fn known_inputs(
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
pub(crate) fn input_key(reference: &crate::reference::Reference) -> String {
    format!("steps.{}.outputs.{}", reference.step, reference.key)
}

pub(crate) fn redact_preview(preview: &mut Preview, r: impl Fn(&str) -> String) {
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

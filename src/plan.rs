//! `rdeploy plan`: what `up` would change, step by step in run order, from each tool's own
//! read-only preview ([`rdeploy_adapters::Preview`]); nothing is changed anywhere (the state
//! directory holds the tools' scratch files only). The driver's session runs the previews and
//! returns a [`StackPlan`]; `render_*` turn it into the human report, markdown for a pull request
//! and the JSON of SPEC.md.
//!
//! Step outputs (`${{ steps.NAME.outputs.KEY }}`): a value that is not known until an upstream
//! step applies is a [`Resolved::Pending`]; a step that reads one is not previewed with a guess,
//! it is shown "known after NAME applies" ([`StepPlan::unknown_until`]).

use std::fmt::Write as _;

use rdeploy_adapters::preview::PreviewError;
use rdeploy_adapters::{secrets, Adapter, PlanAction, Preview, Tool};
use serde::Serialize;

use crate::driver::Session;
use crate::exit::{Code, Refusal};
use crate::stack::Step;

/// A value a step reads: known when the plan is made, or only once an upstream step applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "value")]
pub enum Resolved<T> {
    // Built from the journaled outputs of a step that would not change, once step outputs land
    // (issue 15); until then every referenced output is pending.
    #[allow(dead_code)]
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
    /// Why the preview could not be made (the tool failed): the step counts as a change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the preview read, for a saved plan (not in the JSON: see `-o PLANFILE`).
    #[serde(skip)]
    pub observed: Vec<rdeploy_adapters::preview::Observed>,
}

impl StackPlan {
    /// Whether `up` would change anything (`--detailed-exitcode`: 7, else 0).
    pub fn has_changes(&self) -> bool {
        self.changes > 0
    }
}

/// The steps whose outputs `step` references (`${{ steps.NAME.outputs.KEY }}` in any of its
/// string values).
// The seam for step outputs: once the stack model keeps each step's references, read them here.
pub fn output_references(step: &Step) -> Vec<String> {
    static REFERENCE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\$\{\{\s*steps\.([A-Za-z0-9_-]+)\.outputs\.[A-Za-z0-9_-]+\s*\}\}").expect("valid regex")
    });
    let text = format!("{:?} {:?}", step.spec, step.env);
    let mut names: Vec<String> = Vec::new();
    for capture in REFERENCE.captures_iter(&text) {
        let name = capture[1].to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The secrets a step's preview could print: its secret-named values and its env secrets.
fn step_secrets(step: &Step) -> Vec<String> {
    let mut spec = step.spec.clone();
    let marked = step.spec.marked().clone();
    let mut found = secrets::env_secrets(&step.env);
    if let Some((_, values)) = spec.typed_values_mut() {
        found.extend(secrets::secret_strings(values, &marked));
    }
    secrets::normalize(found)
}

fn redact(text: &str, secrets: &[String]) -> String {
    if secrets.is_empty() {
        return text.to_string();
    }
    text.split_inclusive('\n').map(|l| rdeploy_adapters::process::redact_line(l, secrets)).collect()
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
        let mut running = tokio::task::JoinSet::new();
        let mut registries: Vec<Option<secrets::Registry>> = steps.iter().map(|_| None).collect();
        for (index, step) in steps.iter().enumerate() {
            // Until step outputs are journaled, every output a step reads is pending: its tool
            // would be handed the reference itself, so it is not previewed.
            if !output_references(step).is_empty() {
                continue;
            }
            // As for `up`: marked secrets are read (and registered for redaction) before the
            // tool starts; one that cannot be read fails this step's preview.
            let (step, ctx, read) = self.resolved(step, self.cancel.child_token());
            registries[index] = Some(ctx.secrets.clone());
            running.spawn(async move {
                let result = match read {
                    Ok(()) => step.spec.preview(&ctx).await,
                    Err(failure) => Err(PreviewError::Failed(failure)),
                };
                (index, result)
            });
        }
        let mut results: Vec<Option<Result<Preview, PreviewError>>> = steps.iter().map(|_| None).collect();
        while let Some(joined) = running.join_next().await {
            let (index, result) = joined.map_err(|e| anyhow::anyhow!("a preview task panicked: {e}"))?;
            self.ui.info(format!("planned {} ({})", steps[index].name, steps[index].tool));
            results[index] = Some(result);
        }
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
        for ((step, result), registry) in steps.iter().zip(results).zip(registries) {
            let secrets = step_secrets(step);
            let registry = registry.unwrap_or_default();
            let redact = |text: &str, secrets: &[String]| registry.redact(&redact(text, secrets));
            let mut step_plan = StepPlan {
                name: step.name.clone(),
                tool: step.tool,
                changes: 0,
                summary: None,
                items: Vec::new(),
                notes: Vec::new(),
                unknown_until: Vec::new(),
                error: None,
                observed: Vec::new(),
            };
            match result {
                None => {
                    step_plan.unknown_until = output_references(step);
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
                    redact_preview(&mut preview, |s| redact(s, &secrets));
                    step_plan.changes = preview.changes();
                    step_plan.summary = preview.summary;
                    step_plan.items = preview.items;
                    step_plan.notes = preview.notes;
                    step_plan.observed = preview.observed;
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
                    let mut error = redact(&failure.summary, &secrets);
                    if let Some(hint) = &failure.hint {
                        error.push_str(&format!(" (hint: {})", redact(hint, &secrets)));
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
            "stack {}: {} change{} in {changing} of {} steps",
            plan.stack,
            plan.changes,
            if plan.changes == 1 { "" } else { "s" },
            plan.steps.len()
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
                    error: None,
                    observed: vec![],
                },
                StepPlan {
                    name: "extras".into(),
                    tool: Tool::Kubectl,
                    changes: 1,
                    summary: None,
                    items: vec![updated, PlanItem::new("ConfigMap/shop/same", PlanAction::Unchanged)],
                    notes: vec![],
                    unknown_until: vec![],
                    error: None,
                    observed: vec![],
                },
                StepPlan {
                    name: "app".into(),
                    tool: Tool::Helm,
                    changes: 1,
                    summary: Some("not previewed: it reads outputs known after network applies".into()),
                    items: vec![],
                    notes: vec![],
                    unknown_until: vec!["network".into()],
                    error: None,
                    observed: vec![],
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
        assert_eq!(output_references(stack.step("app").unwrap()), ["infra"]);
        assert!(output_references(stack.step("infra").unwrap()).is_empty());
    }
}

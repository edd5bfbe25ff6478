//! The partial-state report: what is in place, what is missing, what failed and why, and the
//! one command that leads to the next good state; as text, markdown and `status --json`.

use std::fmt::Write as _;

use rdeploy_adapters::SubStatus;
use serde::Serialize;

use crate::checkpoint::{Deploy, DeployState, StepState, StepStatus};
use crate::lock::Holder;
use crate::stack::Stack;
use crate::store::local::StateDir;
use crate::store::Store;
use crate::ui::Paint;

/// `status --json`: the fields docs/status-json.md documents.
#[derive(Debug, Serialize)]
pub struct Status {
    pub stack: String,
    pub state: DeployState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deploy_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
    /// The stack file changed since the checkpoint was written.
    pub stack_changed: bool,
    pub steps: Vec<StepReport>,
    pub next: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<Holder>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct StepReport {
    pub name: String,
    pub tool: String,
    /// done | failed | pending | skipped | reverted
    pub status: &'static str,
    pub resumable: bool,
    pub sub_changes: Vec<SubReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stderr_tail: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revert_error: Option<String>,
    /// How the step was reverted when not by its own `revert` (a helm rollback).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reverted_how: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub changed_since_checkpoint: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked_by: Vec<String>,
    /// Why a `skipped` step did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped_because: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub facts: serde_json::Map<String, serde_json::Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct SubReport {
    pub id: String,
    /// done | failed | pending
    pub status: &'static str,
    /// Started but never confirmed: a crash left it uncertain; recovery lets the tool decide.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub uncertain: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn sub_status(s: SubStatus) -> &'static str {
    match s {
        SubStatus::Done => "done",
        SubStatus::Failed => "failed",
        SubStatus::Pending | SubStatus::Started => "pending",
    }
}

fn step_status(s: StepStatus) -> &'static str {
    match s {
        StepStatus::Done => "done",
        StepStatus::Failed => "failed",
        StepStatus::Reverting => "failed",
        StepStatus::Reverted => "reverted",
        StepStatus::Pending | StepStatus::Running | StepStatus::Refused => "pending",
    }
}

/// The command that continues from `state`, as the operator should type it.
pub fn next_command(state: DeployState, deploy: Option<&Deploy>, stack_file: &str) -> Option<String> {
    match state {
        DeployState::None => Some(format!("rdeploy up {stack_file}")),
        DeployState::Complete | DeployState::Reverted => None,
        DeployState::Partial => {
            // A completed step stuck half-reverted is finished by `revert`; a failed
            // non-resumable one is reverted and run again by `recover`.
            let undoing_done_step = deploy
                .is_some_and(|d| d.steps.iter().any(|s| s.status == StepStatus::Reverting && s.done_seq.is_some()));
            Some(if undoing_done_step {
                format!("rdeploy revert {stack_file}   # once the cause of the failed revert (above) is fixed")
            } else {
                format!("rdeploy recover {stack_file}")
            })
        }
    }
}

/// Builds the status of a stack from its checkpoint.
pub fn build(stack: &Stack, store: &dyn Store, state_dir: &StateDir, stack_file: &str) -> anyhow::Result<Status> {
    let holder = store.holder();
    let alive = holder.is_some();
    if let Some(deploy) = store.load_settled(alive)? {
        return Ok(from_deploy(stack, state_dir, &deploy, stack_file, holder));
    }
    let last = store.last_finished()?;
    let state = match last.as_ref().map(|d| d.state) {
        Some(DeployState::Complete) => DeployState::Complete,
        Some(DeployState::Reverted) => DeployState::Reverted,
        _ => DeployState::None,
    };
    let mut status = match (&last, state) {
        (Some(d), DeployState::Complete | DeployState::Reverted) => {
            from_deploy(stack, state_dir, d, stack_file, holder)
        }
        _ => Status {
            stack: stack.name.clone(),
            state,
            deploy_id: None,
            started: None,
            updated: None,
            stack_changed: false,
            steps: stack.ordered().map(|s| pending_step(s.name.clone(), s.tool.to_string(), s.resumable)).collect(),
            next: None,
            interrupted: None,
            lock: holder,
            warnings: Vec::new(),
        },
    };
    status.state = state;
    status.next = next_command(state, None, stack_file);
    Ok(status)
}

fn pending_step(name: String, tool: String, resumable: bool) -> StepReport {
    StepReport {
        name,
        tool,
        status: "pending",
        resumable,
        sub_changes: Vec::new(),
        error: None,
        command: None,
        exit_code: None,
        stderr_tail: Vec::new(),
        hint: None,
        revert_error: None,
        reverted_how: None,
        refused: None,
        interrupted: false,
        changed_since_checkpoint: false,
        blocked_by: Vec::new(),
        skipped_because: None,
        log: None,
        facts: Default::default(),
        warnings: Vec::new(),
    }
}

pub fn from_deploy(
    stack: &Stack,
    state_dir: &StateDir,
    deploy: &Deploy,
    stack_file: &str,
    lock: Option<Holder>,
) -> Status {
    let state = deploy.state;
    let mut steps = Vec::new();
    for s in &deploy.steps {
        let current = stack.step(&s.name);
        let mut r = pending_step(s.name.clone(), s.tool.to_string(), s.resumable);
        r.status = step_status(s.status);
        r.sub_changes = s
            .sub_changes
            .iter()
            .map(|c| SubReport {
                id: c.id.clone(),
                status: sub_status(c.status),
                uncertain: c.status == SubStatus::Started,
                error: c.error.clone(),
                note: c.note.clone(),
            })
            .collect();
        if let Some(f) = &s.failure {
            r.error = Some(f.summary.clone());
            r.command = f.command.clone();
            r.exit_code = f.exit_code;
            r.stderr_tail = f.stderr_tail.clone();
            r.hint = f.hint.clone();
            r.interrupted = f.interrupted;
        }
        r.revert_error = s.revert_failure.as_ref().map(|f| f.summary.clone());
        r.reverted_how = s.reverted_how.clone();
        r.refused = s.refused.clone();
        if let Some(reason) = &s.refused {
            r.error.get_or_insert_with(|| format!("gate refused: {reason}"));
        }
        r.changed_since_checkpoint = current.is_some_and(|c| c.digest != s.digest) || current.is_none();
        if s.status == StepStatus::Pending {
            if let Some(c) = current {
                r.blocked_by = c
                    .needs
                    .iter()
                    .filter(|n| deploy.step(n).is_none_or(|d| d.status != StepStatus::Done))
                    .cloned()
                    .collect();
            }
        }
        let log = state_dir.log_path(&s.name);
        if log.exists() && state != DeployState::Complete {
            r.log = Some(log.display().to_string());
        }
        r.facts = s.facts.clone().into_iter().collect();
        r.warnings = s.warnings.clone();
        steps.push(r);
    }
    mark_skipped(stack, &mut steps);
    Status {
        stack: deploy.stack.clone(),
        state,
        deploy_id: Some(deploy.deploy_id.clone()),
        started: Some(deploy.started.clone()),
        updated: Some(deploy.updated.clone()),
        stack_changed: deploy.stack_digest != stack.digest,
        steps,
        next: next_command(state, Some(deploy), stack_file),
        interrupted: deploy.interrupted.clone(),
        lock,
        warnings: deploy.warnings.clone(),
    }
}

/// A step that never ran because a step it needs failed, was refused or reverted (or was itself
/// skipped) is `skipped`; one that merely has not been reached yet stays `pending`.
fn mark_skipped(stack: &Stack, steps: &mut [StepReport]) {
    for current in stack.ordered() {
        let Some(i) = steps.iter().position(|r| r.name == current.name) else { continue };
        if steps[i].status != "pending" || steps[i].refused.is_some() {
            continue;
        }
        let why = current.needs.iter().find_map(|need| {
            let r = steps.iter().find(|r| &r.name == need)?;
            let what = match r.status {
                _ if r.refused.is_some() => "was refused by its gate",
                "failed" if r.interrupted => "was interrupted",
                "failed" => "failed",
                "reverted" => "was reverted",
                "skipped" => "was skipped",
                _ => return None,
            };
            Some(format!("needs `{need}`, which {what}"))
        });
        if let Some(why) = why {
            steps[i].status = "skipped";
            steps[i].skipped_because = Some(why);
        }
    }
}

fn sub_list(step: &StepReport, status: &str) -> Vec<String> {
    step.sub_changes.iter().filter(|c| c.status == status).map(|c| c.id.clone()).collect()
}

fn ellipsize(ids: &[String], max: usize) -> String {
    if ids.len() <= max {
        ids.join(", ")
    } else {
        format!("{}, and {} more", ids[..max].join(", "), ids.len() - max)
    }
}

/// The report as the operator reads it in a terminal.
pub fn render_text(status: &Status, paint: Paint) -> String {
    let mut out = String::new();
    let headline = match status.state {
        DeployState::None => format!("stack {}: nothing deployed by rdeploy yet", status.stack),
        DeployState::Complete => format!("stack {}: {}", status.stack, paint.good("deploy complete")),
        DeployState::Reverted => format!("stack {}: {}", status.stack, paint.warn("deploy reverted")),
        DeployState::Partial => format!("stack {}: {}", status.stack, paint.bad("deploy stopped part-way")),
    };
    let _ = writeln!(out, "{}", paint.strong(&headline));
    if let (Some(id), Some(updated)) = (&status.deploy_id, &status.updated) {
        let _ = writeln!(out, "{}", paint.dim(&format!("deploy {id}, last recorded {updated}")));
    }
    if let Some(signal) = &status.interrupted {
        let _ = writeln!(out, "interrupted by {signal}; the checkpoint is consistent");
    }
    if let Some(holder) = &status.lock {
        let _ = writeln!(out, "{}", paint.warn(&format!("in progress: {holder}")));
    }
    if status.stack_changed && status.state == DeployState::Partial {
        let changed: Vec<&str> =
            status.steps.iter().filter(|s| s.changed_since_checkpoint).map(|s| s.name.as_str()).collect();
        let which =
            if changed.is_empty() { String::new() } else { format!(" (steps changed: {})", changed.join(", ")) };
        let _ = writeln!(out, "the stack file changed since the checkpoint{which}; recover uses the new settings");
    }
    if status.state == DeployState::None {
        if let Some(next) = &status.next {
            let _ = writeln!(out, "\nnext: {next}");
        }
        return out;
    }

    let in_place: Vec<&StepReport> = status.steps.iter().filter(|s| s.status == "done").collect();
    let failed: Vec<&StepReport> =
        status.steps.iter().filter(|s| s.status == "failed" || s.refused.is_some()).collect();
    let missing: Vec<&StepReport> =
        status.steps.iter().filter(|s| matches!(s.status, "pending" | "skipped") && s.refused.is_none()).collect();
    let reverted: Vec<&StepReport> = status.steps.iter().filter(|s| s.status == "reverted").collect();

    if !in_place.is_empty() {
        let _ = writeln!(out, "\n{}", paint.strong("in place:"));
        for s in &in_place {
            let done = sub_list(s, "done");
            let detail = if done.is_empty() { String::new() } else { format!(": {}", ellipsize(&done, 8)) };
            let _ = writeln!(out, "  {} {} ({}){detail}", paint.good("✓"), s.name, s.tool);
        }
    }
    if !failed.is_empty() {
        let _ = writeln!(out, "\n{}", paint.strong("failed:"));
    }
    for s in &failed {
        let _ = writeln!(out, "  {} {} ({})", paint.bad("✗"), s.name, s.tool);
        let done = sub_list(s, "done");
        if !done.is_empty() {
            let _ = writeln!(out, "      in place: {}", ellipsize(&done, 8));
        }
        for c in s.sub_changes.iter().filter(|c| c.status == "failed") {
            let _ = writeln!(out, "      failed:   {}: {}", c.id, c.error.as_deref().unwrap_or("failed"));
        }
        let uncertain: Vec<String> = s.sub_changes.iter().filter(|c| c.uncertain).map(|c| c.id.clone()).collect();
        if !uncertain.is_empty() {
            let _ = writeln!(
                out,
                "      uncertain: {} (started, never confirmed; recovery asks the tool)",
                ellipsize(&uncertain, 8)
            );
        }
        let pending: Vec<String> =
            s.sub_changes.iter().filter(|c| c.status == "pending" && !c.uncertain).map(|c| c.id.clone()).collect();
        if !pending.is_empty() {
            let _ = writeln!(out, "      missing:  {}", ellipsize(&pending, 8));
        }
        let said = s.sub_changes.iter().any(|c| c.error.is_some() && c.error == s.error);
        if let Some(e) = s.error.as_ref().filter(|_| !said) {
            let _ = writeln!(out, "      why:      {e}");
        }
        if let (Some(cmd), Some(code)) = (&s.command, s.exit_code) {
            let _ = writeln!(out, "      command:  `{cmd}` (exit {code})");
        }
        if !s.stderr_tail.is_empty() {
            let _ = writeln!(out, "      stderr (last lines):");
            for line in s.stderr_tail.iter().rev().take(6).collect::<Vec<_>>().into_iter().rev() {
                let _ = writeln!(out, "        {line}");
            }
        }
        if let Some(r) = &s.revert_error {
            let _ = writeln!(out, "      {} {r}", paint.bad("revert failed:"));
        }
        if !s.resumable {
            let _ = writeln!(out, "      not resumable: recover runs it again from the start");
        }
        if let Some(h) = &s.hint {
            let _ = writeln!(out, "      hint:     {h}");
        }
        if let Some(log) = &s.log {
            let _ = writeln!(out, "      log:      {log}");
        }
    }
    if !missing.is_empty() {
        let _ = writeln!(out, "\n{}", paint.strong("missing:"));
        for s in &missing {
            let why = match (&s.skipped_because, s.blocked_by.is_empty()) {
                (Some(because), _) => format!("skipped: {because}"),
                (None, true) => "not run yet".to_string(),
                (None, false) => format!("not run yet, waits for {}", s.blocked_by.join(", ")),
            };
            let _ = writeln!(out, "  · {} ({}): {why}", s.name, s.tool);
        }
    }
    if !reverted.is_empty() {
        let _ = writeln!(out, "\n{}", paint.strong("reverted:"));
        for s in &reverted {
            let why = s.error.as_deref().map(|e| format!(" after: {e}")).unwrap_or_default();
            let _ = writeln!(out, "  ↺ {} ({}){why}", s.name, s.tool);
            if let Some(how) = &s.reverted_how {
                let _ = writeln!(out, "      how:      {how}");
            }
            if status.next.as_deref().is_some_and(|n| n.starts_with("rdeploy recover")) {
                let _ = writeln!(out, "      recover runs it again from the start once the cause is fixed");
            }
        }
    }
    for w in &status.warnings {
        let _ = writeln!(out, "{} {w}", paint.warn("warning:"));
    }
    if let Some(next) = &status.next {
        let _ = writeln!(out, "\n{} {next}", paint.strong("next:"));
    }
    out
}

/// The same report as markdown, kept in the state directory for the next operator.
pub fn render_markdown(status: &Status) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Deploy report: {}\n", status.stack);
    let _ = writeln!(
        out,
        "- state: **{}**",
        serde_json::to_value(status.state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    );
    if let Some(id) = &status.deploy_id {
        let _ = writeln!(out, "- deploy: `{id}`");
    }
    if let Some(updated) = &status.updated {
        let _ = writeln!(out, "- last recorded: {updated}");
    }
    if let Some(signal) = &status.interrupted {
        let _ = writeln!(out, "- interrupted by {signal}");
    }
    if let Some(next) = &status.next {
        let _ = writeln!(out, "- next: `{next}`");
    }
    let _ = writeln!(out, "\n| step | tool | status | done | failed | pending | resumable |");
    let _ = writeln!(out, "| --- | --- | --- | --- | --- | --- | --- |");
    for s in &status.steps {
        let count = |st: &str| s.sub_changes.iter().filter(|c| c.status == st).count();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            s.tool,
            s.status,
            count("done"),
            count("failed"),
            count("pending"),
            if s.resumable { "yes" } else { "no" }
        );
    }
    for s in status.steps.iter().filter(|s| s.status == "failed" || s.refused.is_some() || s.revert_error.is_some()) {
        let _ = writeln!(out, "\n## {} ({})\n", s.name, s.tool);
        if let Some(e) = &s.error {
            let _ = writeln!(out, "{e}\n");
        }
        let failed: Vec<&SubReport> = s.sub_changes.iter().filter(|c| c.status == "failed").collect();
        if !failed.is_empty() {
            let _ = writeln!(out, "| sub-change | error |\n| --- | --- |");
            for c in failed {
                let _ = writeln!(out, "| `{}` | {} |", c.id, c.error.as_deref().unwrap_or("").replace('|', "\\|"));
            }
            let _ = writeln!(out);
        }
        let missing = sub_list(s, "pending");
        if !missing.is_empty() {
            let _ =
                writeln!(out, "Missing: {}\n", missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "));
        }
        if !s.stderr_tail.is_empty() {
            let _ = writeln!(out, "```text\n{}\n```\n", s.stderr_tail.join("\n"));
        }
        if let Some(r) = &s.revert_error {
            let _ = writeln!(out, "**Revert failed:** {r}\n");
        }
        if let Some(h) = &s.hint {
            let _ = writeln!(out, "Hint: {h}\n");
        }
    }
    for s in status.steps.iter().filter(|s| s.status == "reverted") {
        if let Some(how) = &s.reverted_how {
            let _ = writeln!(out, "\n## {} ({}): reverted\n\n{how}\n", s.name, s.tool);
        }
    }
    out
}

/// One line per step for logs and CI summaries: `name: status (done/total)`.
pub fn summarize_step(s: &StepState) -> String {
    let total = s.sub_changes.len();
    let done = s.count(SubStatus::Done);
    format!("{}: {} ({done}/{total} {})", s.name, s.status.as_str(), s.tool.sub_change_plural())
}

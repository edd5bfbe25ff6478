//! The partial-state report: what is in place, what is missing, what failed and why, and the
//! one command that leads to the next good state; as text, markdown and `status --json`.

use std::fmt::Write as _;

use rdeploy_adapters::SubStatus;
use serde::Serialize;

use crate::checkpoint::{Deploy, DeployState, StepState, StepStatus, Timestamp};
use crate::diff::StackDiff;
use crate::stack::Stack;
use crate::store::local::StateDir;
use crate::store::Holder;
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
    pub started: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated: Option<Timestamp>,
    /// The stack file changed since the checkpoint was written.
    pub stack_changed: bool,
    pub steps: Vec<StepReport>,
    pub next: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<Holder>,
    pub warnings: Vec<String>,
    /// The reviewed plan the deploy was applied from (`up --plan`): `FILE (sha256:DIGEST)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_plan: Option<String>,
}

impl Status {
    /// `status --detailed-exitcode`: the recorded deploy's state as the exit code a run that
    /// left it there would have had (docs/exit-codes.md).
    pub fn exit_code(&self) -> crate::exit::Code {
        use crate::exit::Code;
        if self.steps.iter().any(|s| s.revert_error.is_some()) {
            return Code::RevertFailed;
        }
        match self.state {
            DeployState::None | DeployState::Complete => Code::Ok,
            DeployState::Partial => Code::Partial,
            DeployState::Reverted => Code::Reverted,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct StepReport {
    pub name: String,
    pub tool: String,
    /// done | failed | pending | skipped | reverted in the JSON; the variant keeps the truth.
    pub status: StepView,
    pub resumable: bool,
    /// `up` found everything of the step in place: its tool applied nothing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub in_place: bool,
    pub sub_changes: Vec<SubReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stderr_tail: Vec<String>,
    /// The operator's file (and line) the tool's error points at: `{ "file": "k8s/app.yaml",
    /// "line": 12 }`, relative to the stack file's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<rdeploy_adapters::Location>,
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
    /// Under `retry:`, once retried: the attempt it succeeded or stopped on, and of how many.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The errors of the earlier attempts, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attempt_errors: Vec<String>,
    /// The outputs it produced for later steps (`${{ steps.NAME.outputs.KEY }}`).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub outputs: serde_json::Map<String, serde_json::Value>,
    /// Its sensitive outputs, by name only: their values are never recorded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sensitive_outputs: Vec<String>,
    /// Why it was (or is to be) applied again after it was done: an output it used changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reapplied_because: Option<String>,
    /// A fleet step's rollout: waves, completion, stragglers and the SLO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::report::RolloutReport>,
}

impl StepReport {
    /// "succeeded on attempt 2 of 3" / "failed on attempt 3 of 3", once the step was retried.
    pub fn attempt_words(&self) -> Option<String> {
        let (n, of) = (self.attempts?, self.max_attempts?);
        let how = match self.status {
            StepView::Done => "succeeded",
            StepView::Failed => "failed",
            _ => "stopped",
        };
        Some(format!("{how} on attempt {n} of {of}"))
    }
}

impl StepReport {
    /// The step's `why`, unless a failed sub-change already says it: the same text is not
    /// printed twice, and when the step's error only wraps a sub-change's (`` `helm upgrade
    /// --install web` failed: `` + the revision's error), the wrapper names that sub-change
    /// instead of repeating its long text.
    pub fn why(&self) -> Option<String> {
        let error = self.error.as_deref()?;
        let mut why = error.to_string();
        for c in self.sub_changes.iter().filter(|c| c.status == SubStatus::Failed) {
            let Some(sub) = c.error.as_deref().filter(|e| !e.trim().is_empty()) else { continue };
            if sub == error {
                return None;
            }
            // Short errors (`exit 3`) read fine twice; a long one is named, not repeated.
            if sub.chars().count() >= 40 {
                // Where the step quotes it for this sub-change (`edge-1 (ERROR)`: two clusters
                // may fail alike), else where it says it first.
                let quoted = format!("{} ({sub})", c.id);
                let found = why.find(&quoted).map(|at| at + c.id.len() + 2).or_else(|| why.find(sub));
                if let Some(at) = found {
                    let named = format!("the error of `{}`", c.id);
                    let (before, after) = (&why[..at], &why[at + sub.len()..]);
                    // Quoted in parentheses (a rollout's `edge-1 (ERROR); ...`): named in its place.
                    if before.trim_end().ends_with('(') && after.trim_start().starts_with(')') {
                        why = format!("{}{named}{}", before.trim_end(), after.trim_start());
                        continue;
                    }
                    let before = before.trim_end().trim_end_matches(':').trim_end();
                    let after = after.trim_start();
                    let mut short = format!("{before}: {named}");
                    if before.is_empty() {
                        short = named;
                    }
                    if !after.is_empty() {
                        short = format!("{short}; {after}");
                    }
                    why = short;
                }
            }
        }
        Some(why)
    }

    /// The stderr tail worth printing: the lines that do not only quote an error printed above
    /// (helm's `Error: UPGRADE FAILED: ...` and its `level=WARN ... error="..."` say again
    /// what the revision's error says); the step's log keeps them all.
    pub fn stderr_news(&self, said: &[&str]) -> Vec<&String> {
        // The end of each error: tools prefix it differently (`UPGRADE FAILED: `, `Error: `),
        // and quote it with escapes in structured lines.
        let tails: Vec<String> = said
            .iter()
            .map(|s| s.trim())
            .filter(|s| s.chars().count() >= 20)
            .map(|s| {
                let skip = s.chars().count().saturating_sub(60);
                s.chars().skip(skip).collect()
            })
            .collect();
        self.stderr_tail
            .iter()
            .filter(|line| {
                let plain = line.replace("\\\"", "\"");
                let bare = plain.trim().trim_start_matches("Error: ").trim_start_matches("error: ");
                !(bare.is_empty()
                    || said.iter().any(|s| s.contains(bare))
                    || tails.iter().any(|t| plain.contains(t.as_str())))
            })
            .collect()
    }

    /// The errors the report prints before the stderr tail: the failed sub-changes' and the step's.
    pub fn said(&self) -> Vec<&str> {
        let mut said: Vec<&str> = self
            .sub_changes
            .iter()
            .filter(|c| c.status == SubStatus::Failed)
            .filter_map(|c| c.error.as_deref())
            .collect();
        said.extend(self.error.as_deref());
        said
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct SubReport {
    pub id: String,
    /// done | failed | pending in the JSON (`started` shows as `pending` with `uncertain`).
    #[serde(serialize_with = "serialize_sub_word")]
    pub status: SubStatus,
    /// Started but never confirmed: a crash left it uncertain; recovery lets the tool decide.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub uncertain: bool,
    /// Done because the step's preview found it already in place: not applied again.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub in_place: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A fleet step's cluster: the wave it belongs to (1 for the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wave: Option<u64>,
    /// A fleet step's absent straggler: when the cluster was last seen (`null`: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub absent_since: Option<Option<String>>,
    /// ... and why it counts as absent (no answer within the inventory timeout, no context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub absent_why: Option<String>,
}

impl crate::rollout::report::ClusterRow for SubReport {
    fn id(&self) -> &str {
        &self.id
    }

    fn status(&self) -> SubStatus {
        self.status
    }

    fn set_wave(&mut self, wave: Option<u64>) {
        self.wave = wave;
    }

    fn set_absent(&mut self, since: Option<String>, why: String) {
        self.absent_since = Some(since);
        self.absent_why = Some(why);
    }
}

/// A step's status as the report shows it. Several variants share a word in `status --json`
/// (the five of docs/status-json.md), but renderers match on the variant, so nothing is rebuilt from flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepView {
    Pending,
    /// Recorded as running: by a live run (the lock says so), or by one that died.
    #[serde(rename = "pending")]
    Running,
    /// Its gate refused it; it did not run.
    #[serde(rename = "pending")]
    Refused,
    Done,
    Failed,
    /// Its `revert` started and did not finish: neither in place nor undone.
    #[serde(rename = "failed")]
    Reverting,
    Reverted,
    /// Never ran because a step it needs failed, was refused or reverted.
    Skipped,
}

impl StepView {
    /// The word `status --json` prints for this status.
    pub fn word(self) -> &'static str {
        match self {
            StepView::Pending | StepView::Running | StepView::Refused => "pending",
            StepView::Done => "done",
            StepView::Failed | StepView::Reverting => "failed",
            StepView::Reverted => "reverted",
            StepView::Skipped => "skipped",
        }
    }

    /// Failed, or stuck half-reverted: the report's "failed" section.
    pub fn is_failed(self) -> bool {
        matches!(self, StepView::Failed | StepView::Reverting)
    }

    /// Not run (yet): pending, recorded running, or skipped; a refusal is reported as a failure.
    pub fn is_missing(self) -> bool {
        matches!(self, StepView::Pending | StepView::Running | StepView::Skipped)
    }
}

impl From<StepStatus> for StepView {
    fn from(s: StepStatus) -> StepView {
        match s {
            StepStatus::Pending => StepView::Pending,
            StepStatus::Running => StepView::Running,
            StepStatus::Refused => StepView::Refused,
            StepStatus::Done => StepView::Done,
            StepStatus::Failed => StepView::Failed,
            StepStatus::Reverting => StepView::Reverting,
            StepStatus::Reverted => StepView::Reverted,
        }
    }
}

/// The word `status --json` prints for a sub-change: a started one is `pending` (and `uncertain`).
pub fn sub_word(s: SubStatus) -> &'static str {
    match s {
        SubStatus::Done => "done",
        SubStatus::Failed => "failed",
        SubStatus::Pending | SubStatus::Started => "pending",
    }
}

fn serialize_sub_word<S: serde::Serializer>(s: &SubStatus, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(sub_word(*s))
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
            from_plan: None,
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
        status: StepView::Pending,
        resumable,
        in_place: false,
        sub_changes: Vec::new(),
        error: None,
        command: None,
        exit_code: None,
        stderr_tail: Vec::new(),
        location: None,
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
        attempts: None,
        max_attempts: None,
        attempt_errors: Vec::new(),
        outputs: Default::default(),
        sensitive_outputs: Vec::new(),
        reapplied_because: None,
        rollout: None,
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
    let diff = StackDiff::between(stack, deploy);
    let mut steps = Vec::new();
    for s in &deploy.steps {
        let current = stack.step(&s.name);
        let mut r = pending_step(s.name.clone(), s.tool.to_string(), s.resumable);
        r.status = s.status.into();
        r.sub_changes = s
            .sub_changes
            .iter()
            .map(|c| SubReport {
                id: c.id.clone(),
                status: c.status,
                uncertain: c.status == SubStatus::Started,
                in_place: c.status == SubStatus::Done && c.in_place,
                error: c.error.as_deref().map(one_line),
                note: c.note.clone(),
                wave: None,
                absent_since: None,
                absent_why: None,
            })
            .collect();
        r.rollout = crate::rollout::report::of_step(s, &mut r.sub_changes);
        r.in_place = s.all_in_place();
        if let Some(f) = &s.failure {
            r.error = Some(one_line(&f.summary));
            r.command = f.command.clone();
            r.exit_code = f.exit_code;
            r.stderr_tail = f.stderr_tail.clone();
            r.location = f.location.as_deref().cloned();
            r.hint = f.hint.clone();
            r.interrupted = f.interrupted;
            if f.interrupted {
                // Stopped by the operator (or the CI's cancel), not by a fault: say so, and that
                // `recover` resumes, instead of the tool's own guess at a cause.
                let signal = deploy.interrupted.as_deref().unwrap_or("a signal");
                r.error = Some(format!("interrupted by the user ({signal}); the tool was stopped cleanly"));
                r.hint = Some(format!("`rdeploy recover {stack_file}` resumes from the checkpoint"));
            }
        }
        if let Some((n, of)) = s.attempt.filter(|(n, _)| *n > 1) {
            r.attempts = Some(n);
            r.max_attempts = Some(of);
            r.attempt_errors = s.attempt_errors.clone();
        }
        r.revert_error = s.revert_failure.as_ref().map(|f| one_line(&f.summary));
        r.reverted_how = s.reverted_how.clone();
        r.refused = s.refused.clone();
        if let Some(reason) = &s.refused {
            r.error.get_or_insert_with(|| format!("gate refused: {reason}"));
        }
        r.changed_since_checkpoint = diff.recorded_step_changed(&s.name);
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
        r.outputs = s.outputs.clone().into_iter().collect();
        r.sensitive_outputs = s.sensitive_outputs.clone();
        r.reapplied_because = s.stale.clone();
        r.warnings = s.warnings.clone();
        steps.push(r);
    }
    mark_skipped(stack, &mut steps);
    Status {
        stack: deploy.stack.clone(),
        state,
        deploy_id: Some(deploy.deploy_id.clone()),
        started: Some(deploy.started),
        updated: Some(deploy.updated),
        stack_changed: diff.file_changed,
        steps,
        next: next_command(state, Some(deploy), stack_file),
        interrupted: deploy.interrupted.clone(),
        lock,
        warnings: deploy.warnings.clone(),
        from_plan: deploy.runs.iter().find_map(|r| r.plan.clone()),
    }
}

/// A step that never ran because a step it needs failed, was refused or reverted (or was itself
/// skipped) is `skipped`; one that merely has not been reached yet stays `pending`.
fn mark_skipped(stack: &Stack, steps: &mut [StepReport]) {
    for current in stack.ordered() {
        let Some(i) = steps.iter().position(|r| r.name == current.name) else { continue };
        if !matches!(steps[i].status, StepView::Pending | StepView::Running) {
            continue;
        }
        let why = current.needs.iter().find_map(|need| {
            let r = steps.iter().find(|r| &r.name == need)?;
            let what = match r.status {
                StepView::Refused => "was refused by its gate",
                StepView::Failed | StepView::Reverting if r.interrupted => "was interrupted",
                StepView::Failed | StepView::Reverting => "failed",
                StepView::Reverted => "was reverted",
                StepView::Skipped => "was skipped",
                StepView::Pending | StepView::Running | StepView::Done => return None,
            };
            Some(format!("needs `{need}`, which {what}"))
        });
        if let Some(why) = why {
            steps[i].status = StepView::Skipped;
            steps[i].skipped_because = Some(why);
        }
    }
}

fn sub_list(step: &StepReport, status: SubStatus) -> Vec<String> {
    step.sub_changes.iter().filter(|c| c.status == status).map(|c| c.id.clone()).collect()
}

fn ellipsize(ids: &[String], max: usize) -> String {
    if ids.len() <= max {
        ids.join(", ")
    } else {
        format!("{}, and {} more", ids[..max].join(", "), ids.len() - max)
    }
}

/// A step's outputs in one line: `key=value` (long values cut), sensitive ones by name.
fn outputs_line(s: &StepReport) -> Option<String> {
    outputs_words(s.outputs.iter(), &s.sensitive_outputs)
}

/// The lines shown under a done step of a complete deploy: its outputs and why it was applied
/// again, if it was.
pub fn done_step_details(s: &StepState) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(outputs) = outputs_words(s.outputs.iter(), &s.sensitive_outputs) {
        lines.push(format!("outputs: {outputs}"));
    }
    if let Some(because) = &s.stale {
        lines.push(format!("applied again: {because}"));
    }
    if let Some(why) = never_in_place(&s.facts) {
        lines.push(format!("never in place: {why}"));
    }
    lines
}

/// Why the step can never be found in place (a chart that renders differently every time), as
/// its adapter recorded it once.
fn never_in_place<'a>(facts: impl IntoIterator<Item = (&'a String, &'a serde_json::Value)>) -> Option<&'a str> {
    facts.into_iter().find(|(k, _)| k.as_str() == rdeploy_adapters::NEVER_IN_PLACE_FACT).and_then(|(_, v)| v.as_str())
}

fn outputs_words<'a>(
    outputs: impl Iterator<Item = (&'a String, &'a serde_json::Value)>,
    sensitive: &[String],
) -> Option<String> {
    let mut parts: Vec<String> = outputs
        .map(|(k, v)| {
            let text = rdeploy_adapters::outputs::value_text(v).replace('\n', "\\n");
            let text = if text.chars().count() > 60 {
                format!("{}…", text.chars().take(60).collect::<String>())
            } else {
                text
            };
            format!("{k}={text}")
        })
        .collect();
    parts.extend(sensitive.iter().map(|k| format!("{k} (sensitive)")));
    (!parts.is_empty()).then(|| parts.join(", "))
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
    if let Some(plan) = &status.from_plan {
        let _ = writeln!(out, "applied from the reviewed plan {plan}");
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

    let in_place: Vec<&StepReport> = status.steps.iter().filter(|s| s.status == StepView::Done).collect();
    let failed: Vec<&StepReport> =
        status.steps.iter().filter(|s| s.status.is_failed() || s.status == StepView::Refused).collect();
    let missing: Vec<&StepReport> = status.steps.iter().filter(|s| s.status.is_missing()).collect();
    let reverted: Vec<&StepReport> = status.steps.iter().filter(|s| s.status == StepView::Reverted).collect();

    if !in_place.is_empty() {
        let _ = writeln!(out, "\n{}", paint.strong("in place:"));
        for s in &in_place {
            let done = sub_list(s, SubStatus::Done);
            let found = s.sub_changes.iter().filter(|c| c.in_place).count();
            let detail = if s.in_place {
                ": in place, nothing to do".to_string()
            } else if done.is_empty() {
                String::new()
            } else if found > 0 {
                format!(": {} ({found} found in place, not applied again)", ellipsize(&done, 8))
            } else {
                format!(": {}", ellipsize(&done, 8))
            };
            let attempts = s.attempt_words().map(|w| format!(" ({w})")).unwrap_or_default();
            let _ = writeln!(out, "  {} {} ({}){detail}{attempts}", paint.good("✓"), s.name, s.tool);
            if let Some(outputs) = outputs_line(s) {
                let _ = writeln!(out, "      outputs: {outputs}");
            }
            if let Some(because) = &s.reapplied_because {
                let _ = writeln!(out, "      applied again: {because}");
            }
            if let Some(why) = never_in_place(&s.facts) {
                let _ = writeln!(out, "      never in place: {why}");
            }
            for line in s.rollout.iter().flat_map(|r| r.lines()) {
                let _ = writeln!(out, "      {line}");
            }
        }
    }
    if !failed.is_empty() {
        let _ = writeln!(out, "\n{}", paint.strong("failed:"));
    }
    for s in &failed {
        let _ = writeln!(out, "  {} {} ({})", paint.bad("✗"), s.name, s.tool);
        let done = sub_list(s, SubStatus::Done);
        if !done.is_empty() {
            let _ = writeln!(out, "      in place: {}", ellipsize(&done, 8));
        }
        for c in s.sub_changes.iter().filter(|c| c.status == SubStatus::Failed) {
            let _ = writeln!(out, "      failed:   {}: {}", c.id, c.error.as_deref().unwrap_or("failed"));
        }
        let uncertain: Vec<String> =
            s.sub_changes.iter().filter(|c| c.status == SubStatus::Started).map(|c| c.id.clone()).collect();
        if !uncertain.is_empty() {
            let _ = writeln!(
                out,
                "      uncertain: {} (started, never confirmed; recovery asks the tool)",
                ellipsize(&uncertain, 8)
            );
        }
        let pending: Vec<String> =
            s.sub_changes.iter().filter(|c| c.status == SubStatus::Pending).map(|c| c.id.clone()).collect();
        if !pending.is_empty() {
            let _ = writeln!(out, "      missing:  {}", ellipsize(&pending, 8));
        }
        if let Some(e) = s.why() {
            let _ = writeln!(out, "      why:      {e}");
        }
        for line in s.rollout.iter().flat_map(|r| r.lines()) {
            let _ = writeln!(out, "      {line}");
        }
        if let Some(words) = s.attempt_words() {
            let _ = writeln!(out, "      attempts: {words}");
            for (i, e) in s.attempt_errors.iter().enumerate() {
                let _ = writeln!(out, "        attempt {}: {}", i + 1, hang(e, 10));
            }
        }
        if let (Some(cmd), Some(code)) = (&s.command, s.exit_code) {
            let _ = writeln!(out, "      command:  `{}` (exit {code})", hang(cmd, 16));
        }
        let stderr = s.stderr_news(&s.said());
        if !stderr.is_empty() {
            let _ = writeln!(out, "      stderr (last lines):");
            for line in stderr.iter().rev().take(6).collect::<Vec<_>>().into_iter().rev() {
                let _ = writeln!(out, "        {line}");
            }
        }
        if let Some(r) = &s.revert_error {
            let _ = writeln!(out, "      {} {}", paint.bad("revert failed:"), hang(r, 10));
        }
        if !s.resumable {
            let _ = writeln!(out, "      not resumable: recover runs it again from the start");
        }
        if let Some(h) = &s.hint {
            let _ = writeln!(out, "      hint:     {}", hang(h, 16));
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
                let _ = writeln!(out, "      how:      {}", hang(how, 16));
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
    if let Some(plan) = &status.from_plan {
        let _ = writeln!(out, "- applied from the reviewed plan: `{plan}`");
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
        let count = |wanted: &[SubStatus]| s.sub_changes.iter().filter(|c| wanted.contains(&c.status)).count();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            s.tool,
            s.status.word(),
            count(&[SubStatus::Done]),
            count(&[SubStatus::Failed]),
            count(&[SubStatus::Pending, SubStatus::Started]),
            if s.resumable { "yes" } else { "no" }
        );
    }
    for s in status
        .steps
        .iter()
        .filter(|s| s.status.is_failed() || s.status == StepView::Refused || s.revert_error.is_some())
    {
        let _ = writeln!(out, "\n## {} ({})\n", s.name, s.tool);
        if let Some(e) = s.why() {
            let _ = writeln!(out, "{e}\n");
        }
        let failed: Vec<&SubReport> = s.sub_changes.iter().filter(|c| c.status == SubStatus::Failed).collect();
        if !failed.is_empty() {
            let _ = writeln!(out, "| sub-change | error |\n| --- | --- |");
            for c in failed {
                let _ = writeln!(out, "| `{}` | {} |", c.id, c.error.as_deref().unwrap_or("").replace('|', "\\|"));
            }
            let _ = writeln!(out);
        }
        // A started sub-change is missing too until the tool confirms it.
        let missing: Vec<String> = s
            .sub_changes
            .iter()
            .filter(|c| matches!(c.status, SubStatus::Pending | SubStatus::Started))
            .map(|c| c.id.clone())
            .collect();
        if !missing.is_empty() {
            let _ =
                writeln!(out, "Missing: {}\n", missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "));
        }
        let stderr = s.stderr_news(&s.said());
        if !stderr.is_empty() {
            let lines: Vec<&str> = stderr.iter().map(|l| l.as_str()).collect();
            let _ = writeln!(out, "```text\n{}\n```\n", lines.join("\n"));
        }
        if let Some(r) = &s.revert_error {
            let _ = writeln!(out, "**Revert failed:** {r}\n");
        }
        if let Some(h) = &s.hint {
            let _ = writeln!(out, "Hint: {h}\n");
        }
    }
    for s in status.steps.iter().filter(|s| s.status == StepView::Reverted) {
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
    let attempts = match s.attempt {
        Some((n, of)) if n > 1 && s.status == StepStatus::Done => format!(", succeeded on attempt {n} of {of}"),
        _ => String::new(),
    };
    // A done step's sub-change that never will be (a helm revision a dead run abandoned, then
    // rolled back) says what became of it.
    let settled: String = s
        .sub_changes
        .iter()
        .filter(|c| s.status == StepStatus::Done && c.status != SubStatus::Done)
        .map(|c| match &c.note {
            Some(note) => format!("; {}: {note}", c.id),
            None => format!("; {}: {}, not applied", c.id, sub_word(c.status)),
        })
        .collect();
    if s.all_in_place() {
        return format!("{}: {} (in place, nothing to do)", s.name, s.status.as_str());
    }
    let in_place = match s.count_in_place() {
        0 => String::new(),
        n => format!(", {n} in place"),
    };
    // `done (2 objects)`, `done (1 release revision)`; `done (0/0 ...)` says nothing.
    let counted = match (done, total) {
        (_, 0) => "nothing to apply".to_string(),
        (done, total) if done == total || s.status == StepStatus::Done => s.tool.count_of(done),
        (done, total) => format!("{done} of {}", s.tool.count_of(total)),
    };
    format!("{}: {} ({counted}{in_place}){attempts}{settled}", s.name, s.status.as_str())
}

/// A tool's multi-line message under a list item: every line after the first indented by
/// `indent` spaces, blank ones dropped, so the next item still starts at the list's margin.
pub fn hang(text: &str, indent: usize) -> String {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let mut out = lines.next().unwrap_or_default().trim_end().to_string();
    for line in lines {
        out.push('\n');
        out.push_str(&" ".repeat(indent));
        out.push_str(line.trim_end());
    }
    out
}

/// An error as the one line `status --json` documents: a tool's multi-line message (a panic, a
/// schema error) joined with spaces; its full text stays in the step's log and stderr tail.
fn one_line(text: &str) -> String {
    if !text.contains(['\n', '\r']) {
        return text.to_string();
    }
    text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long error of a sub-change is named, not said twice; one quoted in parentheses (a
    /// rollout's failed cluster) is named in its place.
    #[test]
    fn a_long_sub_change_error_is_named_where_the_step_quotes_it() {
        let long = "unable to read certificate-authority /x/clusters/edge-1/kube/certs/ca.crt";
        let step = |error: String| StepReport {
            error: Some(error),
            sub_changes: vec![SubReport {
                id: "edge-1".into(),
                status: SubStatus::Failed,
                uncertain: false,
                in_place: false,
                error: Some(long.into()),
                note: None,
                wave: Some(1),
                absent_since: None,
                absent_why: None,
            }],
            ..pending_step("agents".into(), "kubectl".into(), true)
        };
        assert_eq!(
            step(format!("wave 1 of 1 failed: edge-1 ({long}); it was the last wave")).why().unwrap(),
            "wave 1 of 1 failed: edge-1 (the error of `edge-1`); it was the last wave"
        );
        assert_eq!(
            step(format!("`kubectl apply` failed: {long}")).why().unwrap(),
            "`kubectl apply` failed: the error of `edge-1`"
        );
        // Two clusters failed alike: each is named where it is quoted.
        let mut two = step(format!("wave 1 of 1 failed: edge-3 ({long}), edge-1 ({long}); it was the last wave"));
        let mut other = two.sub_changes[0].clone();
        other.id = "edge-3".into();
        two.sub_changes.push(other);
        assert_eq!(
            two.why().unwrap(),
            "wave 1 of 1 failed: edge-3 (the error of `edge-3`), edge-1 (the error of `edge-1`); it was the last wave"
        );
    }

    #[test]
    fn errors_are_one_line() {
        assert_eq!(one_line("a plain error"), "a plain error");
        assert_eq!(
            one_line("Error: values don't meet the specifications of the schema(s):\nshop:\n- at '/replicaCount': got string, want integer\n"),
            "Error: values don't meet the specifications of the schema(s): shop: - at '/replicaCount': got string, want integer"
        );
    }

    #[test]
    fn typed_statuses_keep_the_json_words() {
        let words: Vec<String> = [
            StepView::Pending,
            StepView::Running,
            StepView::Refused,
            StepView::Done,
            StepView::Failed,
            StepView::Reverting,
            StepView::Reverted,
            StepView::Skipped,
        ]
        .iter()
        .map(|v| {
            let json = serde_json::to_value(v).unwrap();
            assert_eq!(json.as_str(), Some(v.word()), "{v:?}");
            v.word().to_string()
        })
        .collect();
        assert_eq!(words, ["pending", "pending", "pending", "done", "failed", "failed", "reverted", "skipped"]);
        let sub = |status| {
            let r = SubReport {
                id: "a".into(),
                status,
                uncertain: status == SubStatus::Started,
                in_place: false,
                error: None,
                note: None,
                wave: None,
                absent_since: None,
                absent_why: None,
            };
            serde_json::to_string(&r).unwrap()
        };
        assert_eq!(sub(SubStatus::Started), r#"{"id":"a","status":"pending","uncertain":true}"#);
        assert_eq!(sub(SubStatus::Done), r#"{"id":"a","status":"done"}"#);
    }
}

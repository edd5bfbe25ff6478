//! Terraform's `-json` UI stream, one line at a time: [`parse_line`] reads a line, and
//! [`ApplyTracker`] turns the apply hooks into sub-change events keyed by resource address.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;

use crate::Event;

/// One message of terraform's machine-readable UI (`@module: terraform.ui`).
#[derive(Clone, Debug, PartialEq)]
pub struct UiLine {
    /// The human text terraform would have printed (`@message`), possibly several lines.
    pub message: String,
    pub body: UiMessage,
}

/// The message types the adapter acts on; everything else is [`UiMessage::Other`].
#[derive(Clone, Debug, PartialEq)]
pub enum UiMessage {
    Version {
        terraform: String,
    },
    PlannedChange(PlannedChange),
    ChangeSummary(ChangeSummary),
    ApplyStart {
        addr: String,
        action: String,
    },
    ApplyComplete {
        addr: String,
        action: String,
    },
    ApplyErrored {
        addr: String,
        action: String,
    },
    Diagnostic(Diagnostic),
    /// The root module's outputs at the end of a successful apply, as `output -json` gives them
    /// except that a sensitive output has no `value`.
    Outputs(serde_json::Map<String, serde_json::Value>),
    /// `log`, `refresh_*`, `provision_*`, `apply_progress` and types added later.
    Other {
        kind: String,
    },
}

/// A resource instance terraform plans to touch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedChange {
    /// The instance address exactly as terraform prints it: `module.m["a"].terraform_data.x[0]`.
    pub addr: String,
    /// `create`, `update`, `replace`, `delete`, `read`, `noop`, `move`, `remove`, `import`.
    pub action: String,
    /// Why, when terraform says: `tainted`, `requested`, `cannot_update`, ...
    pub reason: Option<String>,
    /// The address the instance had before a `moved` block renamed it (`previous_resource`):
    /// terraform carries its state over, whatever else the plan does to it.
    pub previous: Option<String>,
}

impl PlannedChange {
    /// Whether applying the plan does something to this resource: reads and no-ops do not.
    pub fn changes_something(&self) -> bool {
        !matches!(self.action.as_str(), "noop" | "read")
    }

    /// How many `apply_complete` hooks finish this resource: a replace is a delete and a create.
    fn hooks_to_finish(&self) -> usize {
        if self.action == "replace" {
            2
        } else {
            1
        }
    }

    /// "replace terraform_data.a5 (tainted)", for reports.
    pub fn describe(&self) -> String {
        let mut why: Vec<String> = self.reason.iter().map(|r| r.replace('_', " ")).collect();
        if let Some(previous) = &self.previous {
            why.push(format!("moved from {previous}"));
        }
        match (self.action.as_str(), why.is_empty()) {
            ("move", _) => format!("move {} to {}", self.previous.as_deref().unwrap_or("?"), self.addr),
            (_, true) => format!("{} {}", self.action, self.addr),
            (_, false) => format!("{} {} ({})", self.action, self.addr, why.join(", ")),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ChangeSummary {
    #[serde(default)]
    pub add: u64,
    #[serde(default)]
    pub change: u64,
    #[serde(default)]
    pub import: u64,
    #[serde(default)]
    pub remove: u64,
    #[serde(default)]
    pub operation: Operation,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    #[default]
    Plan,
    Apply,
    Destroy,
}

impl ChangeSummary {
    /// "2 to add, 0 to change, 1 to destroy", terraform's own wording.
    pub fn describe(&self) -> String {
        let mut text = format!("{} to add, {} to change, {} to destroy", self.add, self.change, self.remove);
        if self.import > 0 {
            text = format!("{} to import, {text}", self.import);
        }
        text
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Diagnostic {
    pub severity: String,
    pub summary: String,
    #[serde(default)]
    pub detail: String,
    /// The resource instance the diagnostic is about, when it is about one.
    #[serde(default)]
    pub address: Option<String>,
    /// Where in the configuration terraform points (`on main.tf line 6`).
    #[serde(default)]
    pub range: Option<DiagnosticRange>,
}

/// A diagnostic's place in the configuration: the file, relative to the root module's
/// directory (`main.tf`, `modules/net/main.tf`), and its first line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct DiagnosticRange {
    pub filename: String,
    pub start: DiagnosticPos,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct DiagnosticPos {
    pub line: u32,
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == "error"
    }

    /// Summary and detail on one line, in terraform's words, short enough for a report.
    pub fn one_line(&self) -> String {
        let detail = self.detail.split_whitespace().collect::<Vec<_>>().join(" ");
        let text = if detail.is_empty() { self.summary.clone() } else { format!("{}: {detail}", self.summary) };
        // terraform's own pointer into the configuration, kept whole after a cut detail.
        match self.location() {
            Some(at) => format!("{} ({at})", truncate(&text, 400)),
            None => truncate(&text, 400),
        }
    }

    /// `on main.tf line 6`, as terraform's human output says it.
    pub fn location(&self) -> Option<String> {
        let range = self.range.as_ref().filter(|r| !r.filename.is_empty())?;
        Some(format!("on {} line {}", range.filename, range.start.line))
    }

    /// Terraform says the working directory must be (re)initialized before this can run.
    pub fn wants_init(&self) -> bool {
        self.is_error()
            && (self.detail.contains("terraform init")
                || self.detail.contains("tofu init")
                || matches!(
                    self.summary.as_str(),
                    "Module not installed"
                        | "Backend initialization required"
                        | "Inconsistent dependency lock file"
                        | "Missing required provider"
                        | "Required plugins are not installed"
                ))
    }
}

/// Terraform's first error in its human output (`init`, `workspace`, anything run without
/// `-json`), whole: `Error: SUMMARY`, then the first sentence of the detail, its wrapped lines
/// joined. The source excerpt (`on main.tf line 1:` and the quoted lines) is skipped. Works with
/// and without `-no-color` (the `│ ` frame).
pub fn first_human_error<S: AsRef<str>>(lines: &[S]) -> Option<String> {
    let text: Vec<&str> = lines.iter().map(|l| l.as_ref().trim_start_matches(['│', '╷', '╵']).trim_end()).collect();
    let start = text.iter().position(|l| l.trim_start().starts_with("Error: "))?;
    let summary = text[start].trim_start().trim_start_matches("Error: ").trim().to_string();
    let mut detail: Vec<&str> = Vec::new();
    let mut in_excerpt = false;
    let mut location: Option<String> = None;
    for line in &text[start + 1..] {
        let trimmed = line.trim();
        if trimmed.starts_with("Error: ") || trimmed.starts_with("Warning: ") {
            break;
        }
        if trimmed.is_empty() {
            in_excerpt = false;
            if !detail.is_empty() {
                break;
            }
            continue;
        }
        // The excerpt: `  on main.tf line 3, in resource ...:` then indented source lines.
        if trimmed.starts_with("on ") && trimmed.contains(" line ") && trimmed.ends_with(':') {
            in_excerpt = true;
            if location.is_none() {
                // `on main.tf line 3, in resource "x" "y":` -> `on main.tf line 3`.
                let at = trimmed.trim_end_matches(':');
                location = Some(at.split_once(", in ").map(|(a, _)| a).unwrap_or(at).to_string());
            }
            continue;
        }
        if in_excerpt {
            continue;
        }
        detail.push(trimmed);
    }
    let detail = detail.join(" ");
    let sentence = match detail.find(". ") {
        Some(end) => &detail[..=end],
        None => detail.as_str(),
    };
    let text = if sentence.is_empty() { summary } else { truncate(&format!("{summary}: {sentence}"), 400) };
    Some(match location {
        Some(at) => format!("{text} ({at})"),
        None => text,
    })
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[derive(Deserialize)]
struct RawLine {
    #[serde(rename = "@message", default)]
    message: String,
    #[serde(rename = "type")]
    kind: String,
    terraform: Option<String>,
    change: Option<RawChange>,
    hook: Option<RawHook>,
    changes: Option<ChangeSummary>,
    diagnostic: Option<Diagnostic>,
    outputs: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Deserialize)]
struct RawResource {
    addr: String,
}

#[derive(Deserialize)]
struct RawChange {
    resource: RawResource,
    previous_resource: Option<RawResource>,
    action: String,
    reason: Option<String>,
}

#[derive(Deserialize)]
struct RawHook {
    resource: Option<RawResource>,
    #[serde(default)]
    action: String,
}

/// Parses one line of `plan -json` / `apply -json` output. Anything that is not a terraform UI
/// message (stderr noise, a provider's stray print, a truncated line) is `None` and stays text.
pub fn parse_line(line: &str) -> Option<UiLine> {
    let line = line.trim();
    if !line.starts_with('{') {
        return None;
    }
    let raw: RawLine = serde_json::from_str(line).ok()?;
    let hook_addr = |hook: Option<RawHook>| hook.and_then(|h| Some((h.resource?.addr, h.action)));
    let body = match raw.kind.as_str() {
        "version" => UiMessage::Version { terraform: raw.terraform.unwrap_or_default() },
        "planned_change" => match raw.change {
            Some(c) => UiMessage::PlannedChange(PlannedChange {
                previous: c.previous_resource.map(|r| r.addr).filter(|p| *p != c.resource.addr),
                addr: c.resource.addr,
                action: c.action,
                reason: c.reason,
            }),
            None => UiMessage::Other { kind: raw.kind },
        },
        "change_summary" => match raw.changes {
            Some(changes) => UiMessage::ChangeSummary(changes),
            None => UiMessage::Other { kind: raw.kind },
        },
        "apply_start" | "apply_complete" | "apply_errored" => match hook_addr(raw.hook) {
            Some((addr, action)) => match raw.kind.as_str() {
                "apply_start" => UiMessage::ApplyStart { addr, action },
                "apply_complete" => UiMessage::ApplyComplete { addr, action },
                _ => UiMessage::ApplyErrored { addr, action },
            },
            None => UiMessage::Other { kind: raw.kind },
        },
        "diagnostic" => match raw.diagnostic {
            Some(d) => UiMessage::Diagnostic(d),
            None => UiMessage::Other { kind: raw.kind },
        },
        "outputs" => match raw.outputs {
            Some(outputs) => UiMessage::Outputs(outputs),
            None => UiMessage::Other { kind: raw.kind },
        },
        _ => UiMessage::Other { kind: raw.kind },
    };
    Some(UiLine { message: raw.message, body })
}

/// What a `plan -json` run said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanReport {
    /// Every resource instance the plan touches (reads and no-ops left out), in terraform's order.
    pub changes: Vec<PlannedChange>,
    pub summary: Option<ChangeSummary>,
    pub diagnostics: Vec<Diagnostic>,
    pub version: Option<String>,
    /// Root outputs the plan would change (`create`, `update`, `delete`): an apply is needed
    /// for them even when no resource changes, as `plan -detailed-exitcode` says.
    pub output_changes: Vec<(String, String)>,
    seen: HashSet<String>,
}

impl PlanReport {
    pub fn observe(&mut self, body: &UiMessage) {
        match body {
            // Terraform prints one planned_change per instance; a repeat would double-count.
            UiMessage::PlannedChange(change) if change.changes_something() && self.seen.insert(change.addr.clone()) => {
                self.changes.push(change.clone());
            }
            UiMessage::ChangeSummary(summary) if summary.operation == Operation::Plan => self.summary = Some(*summary),
            UiMessage::Diagnostic(d) => self.diagnostics.push(d.clone()),
            UiMessage::Version { terraform } => self.version = Some(terraform.clone()),
            UiMessage::Outputs(outputs) => {
                for (name, output) in outputs {
                    let action = output.get("action").and_then(serde_json::Value::as_str);
                    if let Some(action) = action.filter(|a| *a != "noop") {
                        self.output_changes.push((name.clone(), action.to_string()));
                    }
                }
            }
            _ => {}
        }
    }

    /// A report of a saved plan's changes read back (`show -json`), for applying it as it is.
    pub fn of_saved(changes: Vec<PlannedChange>) -> PlanReport {
        PlanReport { changes, ..PlanReport::default() }
    }

    pub fn ids(&self) -> Vec<String> {
        self.changes.iter().map(|c| c.addr.clone()).collect()
    }

    /// "2 to add, 0 to change, 1 to destroy" (from terraform's summary, else counted).
    pub fn describe(&self) -> String {
        match self.summary {
            Some(summary) => summary.describe(),
            None => format!("{} resource changes", self.changes.len()),
        }
    }
}

/// Where one planned resource stands in the apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    NotStarted,
    /// `apply_start` seen; `finished` counts the `apply_complete` hooks so far.
    Started {
        finished: usize,
    },
    Done,
    /// `apply_errored` seen, the diagnostic not yet: `message` is the hook's own line.
    Errored {
        message: String,
    },
    Failed,
}

/// Turns apply hooks into [`Event`]s the moment terraform reports them.
///
/// `apply_errored` carries no reason; terraform prints the diagnostic that names the resource
/// later (for parallel applies, only when the whole walk ends). The failure is emitted when its
/// diagnostic arrives, so the checkpoint holds terraform's own words; [`ApplyTracker::finish`]
/// emits the ones that never got a diagnostic.
#[derive(Debug)]
pub struct ApplyTracker {
    planned: Vec<PlannedChange>,
    progress: HashMap<String, Progress>,
    /// Error diagnostics in the order they came.
    pub errors: Vec<Diagnostic>,
    pub warnings: Vec<Diagnostic>,
    pub summary: Option<ChangeSummary>,
}

impl ApplyTracker {
    pub fn new(planned: &[PlannedChange]) -> ApplyTracker {
        ApplyTracker {
            planned: planned.to_vec(),
            progress: planned.iter().map(|c| (c.addr.clone(), Progress::NotStarted)).collect(),
            errors: Vec::new(),
            warnings: Vec::new(),
            summary: None,
        }
    }

    pub fn observe(&mut self, body: &UiMessage, message: &str, emit: &mut dyn FnMut(Event)) {
        match body {
            UiMessage::ApplyStart { addr, .. } => {
                let progress = self.progress.entry(addr.clone()).or_insert(Progress::NotStarted);
                if *progress == Progress::NotStarted {
                    *progress = Progress::Started { finished: 0 };
                    emit(Event::Started { id: addr.clone() });
                }
            }
            UiMessage::ApplyComplete { addr, .. } => {
                let needed = self.planned.iter().find(|c| &c.addr == addr).map_or(1, PlannedChange::hooks_to_finish);
                let progress = self.progress.entry(addr.clone()).or_insert(Progress::Started { finished: 0 });
                if let Progress::Started { finished } = progress {
                    *finished += 1;
                    if *finished >= needed {
                        *progress = Progress::Done;
                        emit(Event::Done { id: addr.clone(), note: None });
                    }
                }
            }
            UiMessage::ApplyErrored { addr, .. } => {
                let progress = self.progress.entry(addr.clone()).or_insert(Progress::NotStarted);
                if !matches!(progress, Progress::Failed | Progress::Errored { .. }) {
                    *progress = Progress::Errored { message: message.to_string() };
                }
            }
            UiMessage::Diagnostic(d) if d.is_error() => {
                if let Some(addr) = &d.address {
                    if let Some(progress) = self.progress.get_mut(addr) {
                        if matches!(progress, Progress::Errored { .. }) {
                            *progress = Progress::Failed;
                            emit(Event::Failed { id: addr.clone(), error: d.one_line() });
                        }
                    }
                }
                self.errors.push(d.clone());
            }
            UiMessage::Diagnostic(d) => self.warnings.push(d.clone()),
            UiMessage::ChangeSummary(summary) if summary.operation != Operation::Plan => self.summary = Some(*summary),
            _ => {}
        }
    }

    /// Emits the failures whose diagnostic never came, with the hook's own line.
    pub fn finish(&mut self, emit: &mut dyn FnMut(Event)) {
        for change in &self.planned {
            if let Some(progress) = self.progress.get_mut(&change.addr) {
                if let Progress::Errored { message } = progress {
                    emit(Event::Failed { id: change.addr.clone(), error: message.clone() });
                    *progress = Progress::Failed;
                }
            }
        }
    }

    pub fn progress_of(&self, addr: &str) -> &Progress {
        self.progress.get(addr).unwrap_or(&Progress::NotStarted)
    }

    pub fn planned(&self) -> &[PlannedChange] {
        &self.planned
    }

    /// Addresses that failed, in plan order, each with terraform's diagnostic when there is one.
    pub fn failed(&self) -> Vec<(String, Option<&Diagnostic>)> {
        self.planned
            .iter()
            .filter(|c| matches!(self.progress_of(&c.addr), Progress::Failed | Progress::Errored { .. }))
            .map(|c| (c.addr.clone(), self.errors.iter().find(|d| d.address.as_deref() == Some(c.addr.as_str()))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(name: &str) -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/terraform/captured/");
        std::fs::read_to_string(format!("{path}{name}")).unwrap_or_else(|e| panic!("reading {name}: {e}"))
    }

    fn plan_of(name: &str) -> PlanReport {
        let mut report = PlanReport::default();
        for line in captured(name).lines() {
            if let Some(ui) = parse_line(line) {
                report.observe(&ui.body);
            }
        }
        report
    }

    /// Feeds a captured apply through a tracker built from the given plan.
    fn replay(plan: &PlanReport, apply: &str) -> (ApplyTracker, Vec<Event>) {
        let mut tracker = ApplyTracker::new(&plan.changes);
        let mut events = Vec::new();
        for line in captured(apply).lines() {
            if let Some(ui) = parse_line(line) {
                tracker.observe(&ui.body, &ui.message, &mut |e| events.push(e));
            }
        }
        tracker.finish(&mut |e| events.push(e));
        (tracker, events)
    }

    fn ids(events: &[Event], pick: fn(&Event) -> Option<&str>) -> Vec<String> {
        events.iter().filter_map(pick).map(str::to_string).collect()
    }

    fn started(e: &Event) -> Option<&str> {
        match e {
            Event::Started { id } => Some(id),
            _ => None,
        }
    }

    fn done(e: &Event) -> Option<&str> {
        match e {
            Event::Done { id, .. } => Some(id),
            _ => None,
        }
    }

    fn failed(e: &Event) -> Option<&str> {
        match e {
            Event::Failed { id, .. } => Some(id),
            _ => None,
        }
    }

    #[test]
    fn reads_a_plan_in_order_with_its_summary() {
        let plan = plan_of("chain-plan.jsonl");
        assert_eq!(plan.ids(), (1..=6).map(|i| format!("terraform_data.a{i}")).collect::<Vec<_>>());
        assert_eq!(plan.describe(), "6 to add, 0 to change, 0 to destroy");
        assert_eq!(plan.version.as_deref(), Some("1.11.4"));
        assert!(plan.diagnostics.is_empty());
    }

    #[test]
    fn a_chain_failing_at_a5_reports_a1_to_a4_done_and_a5_failed_with_the_diagnostic() {
        let plan = plan_of("chain-plan.jsonl");
        let (tracker, events) = replay(&plan, "chain-apply-fail-a5.jsonl");
        assert_eq!(ids(&events, done), (1..=4).map(|i| format!("terraform_data.a{i}")).collect::<Vec<_>>());
        assert_eq!(ids(&events, failed), vec!["terraform_data.a5"]);
        assert_eq!(*tracker.progress_of("terraform_data.a6"), Progress::NotStarted);
        let error = events.iter().find_map(|e| match e {
            Event::Failed { error, .. } => Some(error.clone()),
            _ => None,
        });
        assert_eq!(
            error.as_deref(),
            Some("local-exec provisioner error: Error running command 'sh ./prov.sh a5': exit status 1. Output: fail-a5 is present (on main.tf line 31)")
        );
        // Started is journaled before Done for every resource.
        for id in ids(&events, done) {
            let s = events.iter().position(|e| started(e) == Some(&id)).unwrap();
            let d = events.iter().position(|e| done(e) == Some(&id)).unwrap();
            assert!(s < d, "{id}");
        }
    }

    #[test]
    fn a_replace_is_done_only_after_both_its_delete_and_create() {
        let plan = plan_of("chain-recover-plan.jsonl");
        assert_eq!(plan.changes[0].describe(), "replace terraform_data.a5 (tainted)");
        assert_eq!(plan.describe(), "2 to add, 0 to change, 1 to destroy");
        let mut tracker = ApplyTracker::new(&plan.changes);
        let mut events = Vec::new();
        let lines = captured("chain-recover-apply.jsonl");
        let mut after_delete = None;
        for line in lines.lines() {
            let Some(ui) = parse_line(line) else { continue };
            tracker.observe(&ui.body, &ui.message, &mut |e| events.push(e));
            if matches!(&ui.body, UiMessage::ApplyComplete { action, .. } if action == "delete") {
                after_delete = Some(events.len());
            }
        }
        assert_eq!(ids(&events[..after_delete.unwrap()], done), Vec::<String>::new());
        assert_eq!(ids(&events, started), vec!["terraform_data.a5", "terraform_data.a6"]);
        assert_eq!(ids(&events, done), vec!["terraform_data.a5", "terraform_data.a6"]);
        assert_eq!(tracker.summary.map(|s| s.operation), Some(Operation::Apply));
    }

    #[test]
    fn parallel_failures_wait_for_their_diagnostics_at_the_end() {
        let plan = plan_of("independent-apply-two-fail.jsonl");
        let (tracker, events) = replay(&plan, "independent-apply-two-fail.jsonl");
        let mut done_ids = ids(&events, done);
        done_ids.sort();
        assert_eq!(
            done_ids,
            vec![r#"terraform_data.svc["b"]"#, r#"terraform_data.svc["d"]"#, r#"terraform_data.svc["e"]"#]
        );
        let mut failed_ids = ids(&events, failed);
        failed_ids.sort();
        assert_eq!(failed_ids, vec![r#"terraform_data.svc["a"]"#, r#"terraform_data.svc["c"]"#]);
        assert!(events.iter().all(|e| match e {
            Event::Failed { error, .. } => error.starts_with("local-exec provisioner error: "),
            _ => true,
        }));
        assert_eq!(tracker.failed().len(), 2);
        assert!(tracker.failed().iter().all(|(_, d)| d.is_some()));
    }

    #[test]
    fn the_first_human_error_is_kept_whole_with_its_wrapped_sentence() {
        let stderr = captured("init-module-missing.stderr");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(
            first_human_error(&lines).as_deref(),
            Some("Unreadable module directory: Unable to evaluate directory symlink: lstat modules: no such file or directory")
        );
        // The framed form, with a source excerpt and a detail of two sentences.
        let framed = [
            "╷",
            "│ Error: Unsupported argument",
            "│",
            "│   on main.tf line 3, in resource \"terraform_data\" \"a\":",
            "│    3:   nope = 1",
            "│",
            "│ An argument named \"nope\" is not expected here. Did you mean",
            "│ \"input\"?",
            "╵",
        ];
        assert_eq!(
            first_human_error(&framed).as_deref(),
            Some("Unsupported argument: An argument named \"nope\" is not expected here. (on main.tf line 3)")
        );
        assert_eq!(first_human_error(&["nothing to see"]), None);
    }

    /// terraform's `-json` diagnostic keeps its pointer into the configuration in the one line
    /// the report prints, as its human output does (`on main.tf line 6`).
    #[test]
    fn a_json_diagnostic_keeps_its_file_and_line() {
        let line = r#"{"@level":"error","@message":"Error: Reference to undeclared input variable","type":"diagnostic","diagnostic":{"severity":"error","summary":"Reference to undeclared input variable","detail":"An input variable with the name \"nope\" has not been declared.","range":{"filename":"main.tf","start":{"line":6,"column":11,"byte":60},"end":{"line":6,"column":19,"byte":68}}}}"#;
        let Some(UiMessage::Diagnostic(d)) = parse_line(line).map(|l| l.body) else { panic!("not a diagnostic") };
        assert_eq!(
            d.one_line(),
            "Reference to undeclared input variable: An input variable with the name \"nope\" has not been declared. (on main.tf line 6)"
        );
    }

    #[test]
    fn a_moved_address_carries_its_previous_one() {
        let plan = plan_of("chain-moved-plan.jsonl");
        let moved: Vec<(&str, &str, Option<&str>)> =
            plan.changes.iter().map(|c| (c.addr.as_str(), c.action.as_str(), c.previous.as_deref())).collect();
        assert_eq!(
            moved,
            [
                ("terraform_data.b2", "move", Some("terraform_data.a2")),
                ("terraform_data.b5", "replace", Some("terraform_data.a5")),
                ("terraform_data.a6", "create", None),
            ]
        );
        assert_eq!(plan.changes[0].describe(), "move terraform_data.a2 to terraform_data.b2");
        assert_eq!(plan.changes[1].describe(), "replace terraform_data.b5 (tainted, moved from terraform_data.a5)");
    }

    #[test]
    fn module_addresses_with_string_keys_and_counts_are_kept_verbatim() {
        let plan = plan_of("modules-apply-fail.jsonl");
        assert_eq!(plan.changes.len(), 6);
        assert!(plan.ids().contains(&r#"module.svc["web"].module.db.terraform_data.db"#.to_string()));
        let (_, events) = replay(&plan, "modules-apply-fail.jsonl");
        assert_eq!(ids(&events, failed), vec![r#"module.svc["api"].terraform_data.node[1]"#]);
        assert!(ids(&events, done).contains(&r#"module.svc["web"].terraform_data.node[0]"#.to_string()));
    }

    #[test]
    fn an_interrupted_apply_fails_the_in_flight_resource() {
        let plan = plan_of("chain-plan.jsonl");
        let (tracker, events) = replay(&plan, "interrupt-apply.jsonl");
        assert_eq!(ids(&events, done), vec!["terraform_data.a1", "terraform_data.a2"]);
        assert_eq!(ids(&events, failed), vec!["terraform_data.a3"]);
        assert!(tracker.errors.iter().any(|d| d.summary == "execution halted"));
        let (_, diag) = &tracker.failed()[0];
        assert!(diag.unwrap().detail.contains("signal: killed"));
    }

    #[test]
    fn warnings_and_errors_are_told_apart() {
        let plan = plan_of("sensitive-plan-warning.jsonl");
        assert_eq!(plan.diagnostics.len(), 1);
        assert!(!plan.diagnostics[0].is_error());
        assert_eq!(plan.diagnostics[0].summary, "Value for undeclared variable");
    }

    #[test]
    fn a_missing_module_asks_for_init() {
        let plan = plan_of("modules-plan-not-initialized.jsonl");
        assert_eq!(plan.diagnostics.len(), 1);
        assert!(plan.diagnostics[0].wants_init());
        let lock = plan_of("lock-held-plan.jsonl");
        assert!(!lock.diagnostics[0].wants_init());
    }

    #[test]
    fn non_json_lines_are_left_as_text() {
        let text = captured("independent-apply-stdout-and-stderr.txt");
        let (json, other): (Vec<&str>, Vec<&str>) = text.lines().partition(|l| parse_line(l).is_some());
        assert!(other.contains(&"There are some problems with the CLI configuration:"));
        assert!(other.iter().all(|l| !l.starts_with("{\"@level\"")));
        assert!(json.len() > 20);
        assert_eq!(parse_line("{not json"), None);
        assert_eq!(parse_line(r#"{"type":"#), None);
        assert_eq!(parse_line(""), None);
        // A type this parser does not know is kept as Other, not dropped.
        let unknown = parse_line(r#"{"@message":"x","type":"resource_drift"}"#).unwrap();
        assert_eq!(unknown.body, UiMessage::Other { kind: "resource_drift".into() });
    }

    /// An apply's closing `outputs` message holds `output -json`'s document, a sensitive
    /// output without its value.
    #[test]
    fn the_outputs_message_is_read_with_its_values() {
        let line = r#"{"@level":"info","@message":"Outputs: 2","@module":"terraform.ui","outputs":{"plain":{"sensitive":false,"type":"string","value":"hello"},"secret":{"sensitive":true,"type":"string"}},"type":"outputs"}"#;
        let UiMessage::Outputs(outputs) = parse_line(line).unwrap().body else { panic!("not outputs") };
        assert_eq!(outputs["plain"]["value"], "hello");
        assert_eq!(outputs["secret"]["sensitive"], true);
        assert!(outputs["secret"].get("value").is_none());
    }

    #[test]
    fn stderr_noise_is_not_json() {
        assert!(captured("stderr-cli-config-warning.txt").lines().all(|l| parse_line(l).is_none()));
    }
}

//! Tool adapters: each module turns one tool's run into sub-change events and knows that tool's
//! native recovery path. Adapters never print and never touch the checkpoint; the driver owns both.
//!
//! The contract between the driver and an adapter:
//! - the driver gives a [`StepContext`] (paths, environment, cancellation) and an [`EventSink`];
//! - the adapter reports every sub-change as [`Event::Started`], [`Event::Done`] or
//!   [`Event::Failed`] the moment the tool tells it, and returns `Ok(())` or a [`Failure`];
//! - on `recover` it receives what the checkpoint knows ([`PriorStep`]) and resumes through the
//!   tool's own recovery path, never re-running a sub-change recorded as done.

// Adapters never print: what they learn reaches the operator through events and errors.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod ansible;
pub mod helm;
pub mod kubectl;
pub mod process;
pub mod shell;
pub mod terraform;
pub mod testing;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use tokio_util::sync::CancellationToken;

/// The tools rdeploy drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Terraform,
    Ansible,
    Helm,
    Kubectl,
    Shell,
}

impl Tool {
    pub const ALL: [Tool; 5] = [Tool::Terraform, Tool::Ansible, Tool::Helm, Tool::Kubectl, Tool::Shell];

    pub fn as_str(self) -> &'static str {
        match self {
            Tool::Terraform => "terraform",
            Tool::Ansible => "ansible",
            Tool::Helm => "helm",
            Tool::Kubectl => "kubectl",
            Tool::Shell => "shell",
        }
    }

    pub fn parse(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// What one checkpointed sub-change is for this tool, in words for reports and runbooks.
    pub fn sub_change_noun(self) -> &'static str {
        match self {
            Tool::Terraform => "resource address",
            Tool::Ansible => "host",
            Tool::Helm => "release revision",
            Tool::Kubectl => "object (kind/namespace/name)",
            Tool::Shell => "declared sub-change",
        }
    }
}

impl Tool {
    /// The plural of [`Tool::sub_change_noun`], for counts.
    pub fn sub_change_plural(self) -> &'static str {
        match self {
            Tool::Terraform => "resource addresses",
            Tool::Ansible => "hosts",
            Tool::Helm => "release revisions",
            Tool::Kubectl => "objects",
            Tool::Shell => "declared sub-changes",
        }
    }
}

impl std::fmt::Display for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A step's tool-specific settings, deserialized from the stack file.
#[derive(Clone, Debug)]
pub enum ToolSpec {
    Terraform(terraform::TerraformSpec),
    Ansible(ansible::AnsibleSpec),
    Helm(helm::HelmSpec),
    Kubectl(kubectl::KubectlSpec),
    Shell(shell::ShellSpec),
}

/// Calls the same method on whichever tool's spec this is.
macro_rules! dispatch {
    ($self:expr, $spec:ident => $call:expr) => {
        match $self {
            ToolSpec::Terraform($spec) => $call,
            ToolSpec::Ansible($spec) => $call,
            ToolSpec::Helm($spec) => $call,
            ToolSpec::Kubectl($spec) => $call,
            ToolSpec::Shell($spec) => $call,
        }
    };
}

impl ToolSpec {
    /// Deserializes the tool-specific keys of a step. The stack module hands over a
    /// deserializer for just those keys, so `deny_unknown_fields` names the offending key.
    pub fn tool(&self) -> Tool {
        match self {
            ToolSpec::Terraform(_) => Tool::Terraform,
            ToolSpec::Ansible(_) => Tool::Ansible,
            ToolSpec::Helm(_) => Tool::Helm,
            ToolSpec::Kubectl(_) => Tool::Kubectl,
            ToolSpec::Shell(_) => Tool::Shell,
        }
    }

    /// The keys this tool accepts on a step (besides the common ones), for suggestions.
    pub fn keys(tool: Tool) -> &'static [&'static str] {
        match tool {
            Tool::Terraform => terraform::TerraformSpec::KEYS,
            Tool::Ansible => ansible::AnsibleSpec::KEYS,
            Tool::Helm => helm::HelmSpec::KEYS,
            Tool::Kubectl => kubectl::KubectlSpec::KEYS,
            Tool::Shell => shell::ShellSpec::KEYS,
        }
    }

    /// Whether this step can resume from a checkpoint when the stack does not say.
    pub fn default_resumable(&self) -> bool {
        match self {
            ToolSpec::Shell(s) => s.sub_changes.is_some(),
            _ => true,
        }
    }

    /// The step's key whose values reach the tool with their YAML types (helm `set`, ansible
    /// `extra_vars`, terraform `vars`), and those values. serde reads every YAML scalar as a
    /// string, so the stack module, which sees the YAML nodes, writes the typed values here.
    pub fn typed_values_mut(&mut self) -> Option<(&'static str, &mut BTreeMap<String, serde_json::Value>)> {
        match self {
            ToolSpec::Terraform(s) => Some(("vars", &mut s.vars)),
            ToolSpec::Ansible(s) => Some(("extra_vars", &mut s.extra_vars)),
            ToolSpec::Helm(s) => Some(("set", &mut s.set)),
            ToolSpec::Kubectl(_) | ToolSpec::Shell(_) => None,
        }
    }

    /// Problems a stack file can have that serde cannot see (exclusive keys, empty lists).
    pub fn problems(&self) -> Vec<SpecProblem> {
        dispatch!(self, s => s.problems())
    }

    /// Files and directories the step needs, relative to the stack file, with the key naming them.
    pub fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        dispatch!(self, s => s.referenced_paths())
    }

    /// Checks that the tool is installed and usable; returns what was found.
    pub async fn preflight(&self, ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        dispatch!(self, s => s.preflight(ctx).await)
    }

    /// Runs the step from the start, reporting every sub-change.
    pub async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        dispatch!(self, s => s.apply(ctx, sink).await)
    }

    /// Resumes a stopped step through the tool's native recovery path.
    pub async fn recover(
        &self,
        ctx: &StepContext,
        prior: &PriorStep,
        sink: &dyn EventSink,
    ) -> Result<Recovered, Failure> {
        match self {
            ToolSpec::Helm(s) => s.recover(ctx, prior, sink).await,
            ToolSpec::Terraform(s) => s.recover(ctx, prior, sink).await.map(|()| Recovered::Complete),
            ToolSpec::Ansible(s) => s.recover(ctx, prior, sink).await.map(|()| Recovered::Complete),
            ToolSpec::Kubectl(s) => s.recover(ctx, prior, sink).await.map(|()| Recovered::Complete),
            ToolSpec::Shell(s) => s.recover(ctx, prior, sink).await.map(|()| Recovered::Complete),
        }
    }

    /// Read-only: what `recover` would do now, from the tool's live state.
    pub async fn inspect(&self, ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        match self {
            ToolSpec::Shell(s) => Ok(s.inspect(prior)),
            ToolSpec::Terraform(s) => s.inspect(ctx, prior).await,
            ToolSpec::Ansible(s) => s.inspect(ctx, prior).await,
            ToolSpec::Helm(s) => s.inspect(ctx, prior).await,
            ToolSpec::Kubectl(s) => s.inspect(ctx, prior).await,
        }
    }

    /// The runbook section for this step: exact commands an operator would type.
    pub fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        dispatch!(self, s => s.describe_recovery(ctx, prior))
    }
}

/// How a successful `recover` left the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovered {
    /// What the stack asks for is in place.
    Complete,
    /// The tool's own recovery took the step back to its last good state instead (helm's
    /// `recover: rollback`): nothing is half-done, but the stack's change is not in place
    /// either. The driver marks the step reverted; the next `recover` applies it again.
    RolledBack { to: String },
}

/// One segment of a path into a step's mapping, so the stack module can point at a line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathSegment {
    Key(&'static str),
    Index(usize),
}

pub type FieldPath = Vec<PathSegment>;

/// A problem in a step's settings, located by its path inside the step.
#[derive(Clone, Debug)]
pub struct SpecProblem {
    pub at: FieldPath,
    pub message: String,
    pub hint: Option<String>,
}

/// What preflight found.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ToolInfo {
    pub binary: PathBuf,
    pub version: String,
}

/// Everything an adapter needs to run one step.
#[derive(Clone, Debug)]
pub struct StepContext {
    /// The step's name in the stack file.
    pub step: String,
    /// The stack's name.
    pub stack: String,
    /// The directory holding the stack file; relative paths in a step resolve against it.
    pub stack_dir: PathBuf,
    /// A scratch directory for this step inside the state directory (plan files, callback
    /// output); it survives a crash so recovery can read it.
    pub work_dir: PathBuf,
    /// Extra environment for the tool (`env:` on the step).
    pub env: BTreeMap<String, String>,
    /// The step's time limit, if any.
    pub timeout: Option<Duration>,
    /// Cancelled on SIGINT/SIGTERM or when the checkpoint cannot be written; adapters forward it
    /// to their child once and wait for it.
    pub cancel: CancellationToken,
}

impl StepContext {
    pub fn resolve(&self, path: &Path) -> PathBuf {
        self.stack_dir.join(path)
    }
}

/// What `describe_recovery` needs: names and paths as the operator will type them.
#[derive(Clone, Debug)]
pub struct DescribeContext<'a> {
    pub step: &'a str,
    /// The stack file as the operator refers to it (relative when possible).
    pub stack_file: &'a str,
    /// The stack directory as the operator refers to it.
    pub stack_dir: &'a str,
    pub resumable: bool,
}

/// The state of a sub-change as the checkpoint records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubStatus {
    /// Planned, never started.
    Pending,
    /// Started, never finished: a crash or kill left it uncertain.
    Started,
    Done,
    Failed,
}

impl SubStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SubStatus::Pending => "pending",
            SubStatus::Started => "started",
            SubStatus::Done => "done",
            SubStatus::Failed => "failed",
        }
    }
}

/// One sub-change as the checkpoint recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorSubChange {
    pub id: String,
    pub status: SubStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the checkpoint knows about a step when `recover` starts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PriorStep {
    pub sub_changes: Vec<PriorSubChange>,
    /// Adapter facts recorded during earlier runs (a helm revision, a terraform lock ID).
    pub facts: BTreeMap<String, serde_json::Value>,
}

impl PriorStep {
    pub fn status_of(&self, id: &str) -> Option<SubStatus> {
        self.sub_changes.iter().find(|s| s.id == id).map(|s| s.status)
    }

    pub fn ids_with(&self, status: SubStatus) -> impl Iterator<Item = &str> {
        self.sub_changes.iter().filter(move |s| s.status == status).map(|s| s.id.as_str())
    }
}

/// Which output stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What an adapter reports while it runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The sub-changes this run intends to touch, in order (for progress and "pending").
    Planned { ids: Vec<String> },
    /// A sub-change is about to run (shell) or the tool said it started (terraform).
    Started { id: String },
    /// A sub-change is in place. `note` says how we know when it is not obvious.
    Done { id: String, note: Option<String> },
    /// A sub-change failed; `error` is one line in the tool's own words.
    Failed { id: String, error: String },
    /// A sub-change the tool will not reach in this run (the play aborted, the apply stopped).
    Pending { id: String, reason: String },
    /// A fact worth keeping for recovery and reports (never a secret).
    Fact { key: String, value: serde_json::Value },
    /// A line of the tool's human output (already redacted).
    Output { stream: Stream, line: String },
    /// Something the operator should read in the report.
    Warning { message: String },
}

/// Receives an adapter's events. The driver's implementation journals sub-change events
/// durably before `emit` returns, so a sub-change is recorded as started before it runs.
/// If the journal cannot be written, the driver cancels the step's token; adapters check it
/// before starting the next sub-change.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: Event);
}

/// A line handler that hands a child's output to the sink as [`Event::Output`].
pub fn forward_output(sink: &dyn EventSink) -> impl FnMut(Stream, &str) + Send + '_ {
    move |stream, line| sink.emit(Event::Output { stream, line: line.to_string() })
}

/// Why a step stopped. `summary` is one line; the rest feeds the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub summary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr_tail: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    #[serde(default)]
    pub interrupted: bool,
}

impl Failure {
    pub fn new(summary: impl Into<String>) -> Failure {
        Failure { summary: summary.into(), ..Failure::default() }
    }

    /// A failure built from a finished child process; the summary names the command.
    pub fn from_process(command: &str, outcome: &process::Outcome) -> Failure {
        Failure::from_process_named(&format!("`{command}`"), command, outcome)
    }

    /// Like [`Failure::from_process`], naming the failed thing `what` (a sub-change) in the summary.
    pub fn from_process_named(what: &str, command: &str, outcome: &process::Outcome) -> Failure {
        let last = outcome.last_error_line();
        let summary = if outcome.interrupted {
            format!("{what} was interrupted")
        } else if outcome.timed_out {
            format!("{what} timed out")
        } else {
            match (outcome.describe_status(), last) {
                (status, Some(line)) => format!("{what} {status}: {line}"),
                (status, None) => format!("{what} {status}"),
            }
        };
        Failure {
            summary,
            command: Some(command.to_string()),
            exit_code: outcome.code,
            stderr_tail: outcome.stderr_tail.iter().cloned().collect(),
            hint: None,
            interrupted: outcome.interrupted,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }
}

/// Read-only view of what recovery would do, for `recover --dry-run`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Inspection {
    /// Lines in plain words ("would run orders", "terraform plan: 2 to add").
    pub actions: Vec<String>,
    /// Sub-changes recovery would touch.
    pub remaining: Vec<String>,
}

/// A runbook section for one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RecoveryDoc {
    /// Read-only commands that show the live state.
    pub inspect: Vec<String>,
    /// Commands that lead to the next good state, in order.
    pub recover: Vec<String>,
    /// How to check the step is in place.
    pub verify: Vec<String>,
    /// Anything an operator must know (stuck locks, manual steps).
    pub notes: Vec<String>,
}

/// Errors that stop a step before it touches anything (tool missing, unusable version).
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("`{tool}` was not found on PATH")]
    ToolMissing { tool: String, hint: String },
    #[error("`{command}` failed: {detail}")]
    ToolUnusable { command: String, detail: String },
    #[error("could not start `{command}`: {source}")]
    Spawn { command: String, source: std::io::Error },
}

impl AdapterError {
    pub fn hint(&self) -> Option<&str> {
        match self {
            AdapterError::ToolMissing { hint, .. } => Some(hint),
            _ => None,
        }
    }
}

/// Finds a step's tool: a name with a slash is a path relative to the stack file; a bare name
/// is looked up on the step's PATH (its `env:` may prepend a virtualenv or a pinned version),
/// then rdeploy's own.
pub fn resolve_binary(ctx: &StepContext, name: &str, install_hint: &str) -> Result<PathBuf, AdapterError> {
    let missing = |tool: String| AdapterError::ToolMissing { tool, hint: install_hint.to_string() };
    if name.contains('/') {
        let path = ctx.resolve(Path::new(name));
        return if path.is_file() { Ok(path) } else { Err(missing(path.display().to_string())) };
    }
    let path = ctx.env.get("PATH").cloned().or_else(|| std::env::var("PATH").ok()).unwrap_or_default();
    which::which_in(name, Some(path), &ctx.stack_dir).map_err(|_| missing(name.to_string()))
}

impl From<AdapterError> for Failure {
    /// A tool that went missing between preflight and use still fails with its install hint.
    fn from(e: AdapterError) -> Failure {
        let failure = Failure::new(e.to_string());
        match e.hint() {
            Some(hint) => failure.with_hint(hint.to_string()),
            None => failure,
        }
    }
}

/// Quotes a word for a POSIX shell when it needs it, so runbook commands paste cleanly.
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Joins a command line for display, quoting each word as needed.
pub fn display_command<S: AsRef<str>>(words: &[S]) -> String {
    words.iter().map(|w| shell_quote(w.as_ref())).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_when_needed() {
        assert_eq!(shell_quote("web-1"), "web-1");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(display_command(&["terraform", "apply", "tf plan"]), "terraform apply 'tf plan'");
    }

    #[test]
    fn tool_names_round_trip() {
        for tool in Tool::ALL {
            assert_eq!(Tool::parse(tool.as_str()), Some(tool));
        }
        assert_eq!(Tool::parse("pulumi"), None);
    }
}

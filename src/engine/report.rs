//! What a command of the engine returns: a [`RunReport`] with everything the renderers need,
//! nothing printed.

use crate::checkpoint::Deploy;
use crate::diff::StackDiff;

pub use super::schedule::Outcome;

/// What a command of the driver did: everything the renderers need, nothing printed.
#[derive(Debug)]
pub struct RunReport {
    pub outcome: Outcome,
    /// The deploy as the command left it (folded from its journal); for "nothing to recover",
    /// the last finished one.
    pub deploy: Option<Deploy>,
    /// What changed in the stack since the checkpoint this command continued (`recover`).
    pub diff: Option<StackDiff>,
    pub ended: Ended,
}

/// Which way the command ended.
#[derive(Debug)]
pub enum Ended {
    /// Steps ran (`up`, `recover`, `revert`); `deploy` is where they left it.
    Ran,
    /// `recover` found no unfinished deploy.
    NothingToRecover,
    /// `revert` found neither an unfinished nor a completed deploy of this stack, or (`deploy`
    /// given) one with no step to undo: none that ran declares `revert`. Nothing was recorded.
    NothingToRevert,
    /// `reset` found no unfinished deploy.
    NothingToReset,
    /// `reset` forgot `deploy` (kept in the history).
    Forgot,
    /// `reset` moved aside a journal it could not read at all: why, and where it went.
    ForgotUnreadable { error: String, kept: String },
    /// `recover --dry-run`: what recovery would do, step by step in run order.
    DryRun(Vec<DryRunStep>),
}

impl RunReport {
    pub(crate) fn new(outcome: Outcome, deploy: Option<Deploy>, ended: Ended) -> RunReport {
        RunReport { outcome, deploy, diff: None, ended }
    }
}

/// One step of `recover --dry-run`.
#[derive(Debug)]
pub struct DryRunStep {
    pub name: String,
    pub tool: rdeploy_adapters::Tool,
    /// Its settings changed since the checkpoint.
    pub changed: bool,
    pub plan: DryRunPlan,
}

#[derive(Debug)]
pub enum DryRunPlan {
    /// Done: left as it is.
    LeftAsIs,
    /// Not resumable and left half-done: its revert runs, then the step from the start.
    RevertThenApply { revert: Option<String> },
    /// Runs from the start; `actions` from the tool's inspection (empty when it could not say).
    Apply { why: ApplyWhy, actions: Vec<String> },
    /// Resumes through the tool's recovery path: what the live state says it would do, or why
    /// the live state could not be inspected.
    Recover(Result<Vec<String>, String>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyWhy {
    Reverted,
    NotStarted,
    NotResumable,
}

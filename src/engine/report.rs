//! What a command of the engine returns: a [`RunReport`] with everything the renderers need,
//! nothing printed.

use crate::checkpoint::Deploy;
use crate::diff::StackDiff;

pub use super::schedule::Outcome;

/// What a command of the engine did: everything the renderers need, nothing printed. The
/// deploy it left is part of how it ended ([`Ended`]), so a report cannot say steps ran (or a
/// deploy was forgot) without the deploy.
#[derive(Debug)]
pub struct RunReport {
    pub outcome: Outcome,
    /// What changed in the stack since the checkpoint this command continued (`recover`).
    pub diff: Option<StackDiff>,
    pub ended: Ended,
}

/// Which way the command ended.
#[derive(Debug)]
pub enum Ended {
    /// Steps ran (`up`, `recover`, `revert`): the deploy where they left it (folded from its
    /// journal).
    Ran(Deploy),
    /// `recover` found no unfinished deploy: the last finished one, if any.
    NothingToRecover(Option<Deploy>),
    /// `revert` found neither an unfinished nor a completed deploy of this stack (`None`), or
    /// one with no step to undo: none that ran declares `revert`. Nothing was recorded.
    NothingToRevert(Option<Deploy>),
    /// `reset` found no unfinished deploy.
    NothingToReset,
    /// `reset` forgot this deploy (kept in the history).
    Forgot(Deploy),
    /// `reset` moved aside a journal it could not read at all: why, and where it went.
    ForgotUnreadable { error: String, kept: String },
    /// `recover --dry-run`: the unfinished deploy, and what recovery would do with it, step by
    /// step in run order.
    DryRun { deploy: Deploy, plan: Vec<DryRunStep> },
}

impl RunReport {
    pub(crate) fn new(outcome: Outcome, ended: Ended) -> RunReport {
        RunReport { outcome, diff: None, ended }
    }

    /// The deploy as the command left it; for "nothing to recover", the last finished one.
    pub fn deploy(&self) -> Option<&Deploy> {
        match &self.ended {
            Ended::Ran(deploy) | Ended::Forgot(deploy) | Ended::DryRun { deploy, .. } => Some(deploy),
            Ended::NothingToRecover(deploy) | Ended::NothingToRevert(deploy) => deploy.as_ref(),
            Ended::NothingToReset | Ended::ForgotUnreadable { .. } => None,
        }
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

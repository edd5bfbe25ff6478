//! What happens while a run goes, as typed events: the engine says what happened and the
//! reporters (`crate::reporter`) decide what it looks like. No text here is coloured or laid
//! out for a terminal; a message in an event is a sentence, never a rendered line.

use std::time::Duration;

use rdeploy_adapters::transient::TransientClass;
use rdeploy_adapters::{Stream, Tool};

/// One thing that happened in a run, in the order it happened.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEvent {
    /// A sentence about the run as a whole: which deploy starts, what recovery found.
    Note(String),
    /// Something the operator should know. `from_step` names the step whose tool said it (the
    /// message is the tool's); rdeploy's own warnings name their step in the sentence.
    Warning { from_step: Option<String>, message: String },
    /// A step's tool starts: its first attempt, a retry (`attempt` says which), or its revert.
    StepStarted { step: String, work: Work, attempt: Option<Attempt> },
    /// The step's tool said how many sub-changes it will make.
    Planned { step: String, total: usize },
    /// One sub-change moved.
    SubChange { step: String, id: String, change: SubChange },
    /// A line the step's tool printed (already redacted).
    Output { step: String, stream: Stream, line: String },
    /// An attempt failed and another follows after `delay`.
    AttemptFailed { step: String, attempt: Attempt, why: RetryWhy, summary: String, delay: Duration },
    /// A retried step succeeded (on `attempt`, after earlier ones failed).
    AttemptSucceeded { step: String, attempt: Attempt },
    /// A step ended, one way or another.
    StepEnded { step: String, end: StepEnd },
}

/// What a started step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    Apply(Tool),
    Recover(Tool),
    /// Its `revert` command.
    Revert,
}

/// Which attempt of a step with `retry:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub number: u32,
    pub of: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubChange {
    Started,
    Done,
    Failed(String),
}

/// Why a failed attempt is tried again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryWhy {
    /// One of the step's `retry.matching` patterns matched (the pattern).
    Matches(String),
    /// A failure the tool is known to have transiently.
    Transient(TransientClass),
}

/// How a step ended, as the operator is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepEnd {
    Done,
    /// `recover: rollback` took it back to its last good revision.
    RolledBack {
        to: String,
    },
    Failed {
        summary: String,
    },
    /// Its gate refused it; nothing ran.
    Refused {
        reason: String,
    },
    /// Its `revert` ran to the end.
    Reverted,
    RevertFailed {
        summary: String,
    },
}

/// Something that presents a run as it goes (the binary's reporters: the terminal's progress in
/// `crate::ui`, the step logs in `crate::reporter`): handed every event, in order.
pub trait Reporter: Send + Sync {
    fn event(&self, event: &RunEvent);
}

/// The run's reporters, each given every event in the order they were added.
#[derive(Clone, Default)]
pub struct Reporters(Vec<std::sync::Arc<dyn Reporter>>);

impl Reporters {
    pub fn new(reporters: Vec<std::sync::Arc<dyn Reporter>>) -> Reporters {
        Reporters(reporters)
    }

    pub fn emit(&self, event: RunEvent) {
        for reporter in &self.0 {
            reporter.event(&event);
        }
    }
}

//! The reporters: each is handed the same [`RunEvent`](crate::engine::event::RunEvent)s, in
//! order, and draws, logs or writes them in its own terms (the terminal's progress in
//! `crate::ui`, the step logs in [`step_log`]). The engine emits; it never knows who listens.
//! Once a deploy command's report is printed, the reporters of its end ([`Finish`]: `ci`'s
//! annotations, step summary and JUnit) are handed the same [`Finished`]: the engine's
//! [`RunReport`], the report of the deploy it left (built once, for everyone) and the exit code.

pub mod step_log;

use crate::engine::{RunReport, Session};
use crate::exit::Code;
use crate::report::Status;

/// How a deploy command ended, as every reporter of its end sees it.
pub struct Finished<'a> {
    pub run: &'a RunReport,
    /// The report of the deploy the command left (`None` when it left none).
    pub status: Option<&'a Status>,
    pub code: Code,
}

/// A reporter of a deploy command's end, called in order after its report is printed.
pub trait Finish {
    fn finished(&self, session: &Session, end: &Finished<'_>);
}

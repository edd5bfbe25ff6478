//! One step's attempts: the first as the scheduler chose it, then under `retry:` each further
//! one through the adapter's recover path, ending in a `Recovered` or a `Failure`. Every attempt
//! is journaled before it starts, and the reporters are told of each.

use rdeploy_adapters::{Adapter, Failure, PriorStep, Recovered, StepContext};

use super::event::{Attempt, Reporters, RetryWhy, RunEvent, Work};
use super::journal::{JournalError, SharedCheckpoint};
use super::sink::StepSink;
use crate::checkpoint::{Record, StepMode};
use crate::stack::{Retry, Step};

/// What to do with a step in this run.
#[derive(Clone, Debug)]
pub enum Action {
    Apply,
    Recover(PriorStep),
    /// A non-resumable step left half-done (a crash, or a revert that did not finish): undo it
    /// with its `revert`, then run it from the start. Complete or revert, never a third outcome.
    RevertThenApply,
}

/// One step's attempts: the first as the scheduler chose it, then under `retry:` each further
/// one through the adapter's recover path, so completed sub-changes never run again. Every
/// attempt is journaled (its failure, then `Attempt` and `StepStarted`) before it starts.
pub struct Attempts {
    pub retry: Option<Retry>,
    pub cp: SharedCheckpoint,
    pub reporters: Reporters,
    pub tool_version: Option<String>,
    /// The local state directory (a fleet step keeps last-seen times and rollout starts there).
    pub state_dir: std::path::PathBuf,
}

impl Attempts {
    pub async fn run(
        &self,
        step: &Step,
        ctx: &StepContext,
        mut action: Action,
        sink: &StepSink,
    ) -> Result<Recovered, Failure> {
        let mut attempt = 1;
        loop {
            let result = match (&step.fleet, &action) {
                (Some(fleet), action) => {
                    let fresh = PriorStep::default();
                    let prior = match action {
                        Action::Recover(prior) => prior,
                        _ => &fresh,
                    };
                    let run = crate::rollout::FleetRun { step, fleet, ctx, prior, state_dir: &self.state_dir };
                    crate::rollout::run(run, sink).await
                }
                (None, Action::Recover(prior)) => step.spec.recover(ctx, prior, sink).await,
                (None, _) => step.spec.apply(ctx, sink).await.map(|()| Recovered::Complete),
            };
            let failure = match (result, sink.journal_error()) {
                (_, Some(e)) => return Err(journal_failure(e)),
                (Ok(done), None) => {
                    if let Some(retry) = self.retry.as_ref().filter(|_| attempt > 1) {
                        let attempt = Attempt { number: attempt, of: retry.attempts };
                        self.reporters.emit(RunEvent::AttemptSucceeded { step: step.name.clone(), attempt });
                    }
                    return Ok(done);
                }
                (Err(failure), None) => failure,
            };
            let Some(retry) = &self.retry else { return Err(failure) };
            // Never retried: an interrupt, the last attempt, a failure nobody called transient.
            if failure.interrupted || ctx.cancel.is_cancelled() || attempt >= retry.attempts {
                return Err(failure);
            }
            let Some(why) = retry_reason(retry, step.tool, &failure) else { return Err(failure) };
            let delay = retry.delay_before(attempt + 1);
            let summary = failure.summary.clone();
            if let Err(e) = self.cp.record(Record::StepFailed { step: step.name.clone(), failure }) {
                return Err(journal_failure(JournalError::of(&e)));
            }
            self.reporters.emit(RunEvent::AttemptFailed {
                step: step.name.clone(),
                attempt: Attempt { number: attempt, of: retry.attempts },
                why,
                summary,
                delay,
            });
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = ctx.cancel.cancelled() => {
                    return Err(Failure { interrupted: true, ..Failure::new(format!("stopped before attempt {} of {}", attempt + 1, retry.attempts)) });
                }
            }
            attempt += 1;
            let prior = self.cp.read(|d| d.step(&step.name).map(|s| s.prior()).unwrap_or_default());
            let records = [
                Record::Attempt { step: step.name.clone(), attempt, of: retry.attempts },
                Record::StepStarted {
                    step: step.name.clone(),
                    mode: StepMode::Recover,
                    tool_version: self.tool_version.clone(),
                },
            ];
            for record in records {
                if let Err(e) = self.cp.record(record) {
                    return Err(journal_failure(JournalError::of(&e)));
                }
            }
            self.reporters.emit(RunEvent::StepStarted {
                step: step.name.clone(),
                work: Work::Recover(step.tool),
                attempt: Some(Attempt { number: attempt, of: retry.attempts }),
            });
            action = Action::Recover(prior);
        }
    }
}

/// Why a failure is worth another attempt, or `None`: one of `matching` matched its message or
/// the tool's stderr tail, or it is one of the tool's known transient errors (unless
/// `transient: false`).
fn retry_reason(retry: &Retry, tool: rdeploy_adapters::Tool, failure: &Failure) -> Option<RetryWhy> {
    let lines = || std::iter::once(failure.summary.as_str()).chain(failure.stderr_tail.iter().map(String::as_str));
    if let Some(re) = retry.matching.iter().find(|re| lines().any(|l| re.is_match(l))) {
        return Some(RetryWhy::Matches(re.as_str().to_string()));
    }
    if retry.transient {
        return rdeploy_adapters::transient::classify(tool, failure).map(RetryWhy::Transient);
    }
    None
}

fn journal_failure(error: JournalError) -> Failure {
    match error {
        // The run's final error says it all, once.
        JournalError::Gone => Failure::new("the checkpoint was deleted while this step ran (said below)"),
        JournalError::Other(error) => Failure::new(format!("the checkpoint could not be written: {error}"))
            .with_hint("free disk space or fix permissions on the state directory, then `rdeploy recover`"),
    }
}

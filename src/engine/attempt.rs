//! One step's attempts: the first as the scheduler chose it, then under `retry:` each further
//! one through the adapter's recover path, ending in a `Recovered` or a `Failure`. Every attempt
//! is journaled before it starts, and the reporters are told of each.

use std::sync::Arc;

use rdeploy_adapters::outputs::OutputValue;
use rdeploy_adapters::{
    Adapter, Converged, Event, EventSink, Failure, Preview, PriorStep, Recovered, StepContext, IN_PLACE_FACT,
};

use super::event::{Attempt, Reporters, RetryWhy, RunEvent, Work};
use super::journal::{JournalError, SharedCheckpoint};
use super::sink::StepSink;
use crate::adapter::StepAdapter;
use crate::checkpoint::{Deploy, Record, StepMode, StepStatus};
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
    /// The directory of the fleet's records (last-seen times and rollout starts), shared by the
    /// stacks beside one another, where `rdeploy inventory` and gates read them.
    pub fleet_dir: std::path::PathBuf,
    /// `up`: the last finished deploy of the stack, whose shell outputs an in-place step hands on.
    pub last: Option<Arc<Deploy>>,
}

impl Attempts {
    /// The first attempt starts: journaled (`Attempt` under `retry:`, then `StepStarted`) before
    /// the step's tools start, then shown started.
    pub fn start(&self, step: &str, mode: StepMode, work: Work) -> anyhow::Result<()> {
        if let Some(retry) = &self.retry {
            self.cp.record(Record::Attempt { step: step.to_string(), attempt: 1, of: retry.attempts })?;
        }
        self.cp.record(Record::StepStarted {
            step: step.to_string(),
            mode,
            tool_version: self.tool_version.clone(),
        })?;
        let attempt = self.retry.as_ref().map(|r| Attempt { number: 1, of: r.attempts });
        self.reporters.emit(RunEvent::StepStarted { step: step.to_string(), work, attempt });
        Ok(())
    }

    pub async fn run(
        &self,
        step: &Step,
        ctx: &StepContext,
        mut action: Action,
        sink: &StepSink,
        mut converge: Option<Option<Preview>>,
    ) -> Result<(Recovered, Converged), Failure> {
        let mut attempt = 1;
        let mut converged = Converged::Applied;
        loop {
            let result = self.once(step, ctx, &action, sink, &mut converge, &mut converged).await;
            let failure = match (result, sink.journal_error()) {
                (_, Some(e)) => return Err(journal_failure(e)),
                (Ok(done), None) => {
                    if let Some(retry) = self.retry.as_ref().filter(|_| attempt > 1) {
                        let attempt = Attempt { number: attempt, of: retry.attempts };
                        self.reporters.emit(RunEvent::AttemptSucceeded { step: step.name.clone(), attempt });
                    }
                    return Ok((done, converged));
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

impl Attempts {
    /// One attempt of the step through its adapter ([`StepAdapter`]: a fleet step's runs the
    /// rollout); `converge` is `up`'s decision, taken by the first attempt only, and
    /// `converged` says whether it found everything in place.
    async fn once(
        &self,
        step: &Step,
        ctx: &StepContext,
        action: &Action,
        sink: &StepSink,
        converge: &mut Option<Option<Preview>>,
        converged: &mut Converged,
    ) -> Result<Recovered, Failure> {
        let adapter = StepAdapter::of(step, &self.fleet_dir);
        let carry = CarryOutputs::new(self, step, &adapter, sink);
        // Done means every pod is updated and ready: the readiness check holds the step's Done
        // events until it has read the workloads the tool touched.
        let held = crate::readiness::Held::new(step, ctx, &carry);
        let result = match action {
            Action::Recover(prior) => adapter.recover(ctx, prior, &held).await,
            // `up`: what the step's preview finds in place is not applied again.
            _ => match converge.take() {
                Some(decided) => adapter.converge_step(ctx, decided, &held).await.map(|c| {
                    *converged = c;
                    if c == Converged::InPlace {
                        sink.emit(Event::Fact { key: IN_PLACE_FACT.into(), value: true.into() });
                    }
                    Recovered::Complete
                }),
                None => adapter.apply(ctx, &held).await.map(|()| Recovered::Complete),
            },
        };
        held.settle(result).await
    }
}

/// A sub-change found in place that writes no outputs (a shell one does not run, so it writes no
/// `$RDEPLOY_OUTPUT`: [`Adapter::in_place_keeps_last_outputs`]): the outputs the last finished
/// deploy recorded for the step are handed on, as `plan` showed them.
/// They are journaled as the step's first sub-change in place is (before it), not when the step
/// ends: a sub-change after it that fails, then runs again under `retry:` or `rdeploy recover`,
/// finds them in the checkpoint like any other output. A key the run made before then is kept,
/// one a later sub-change writes replaces the carried value. A sensitive output was never
/// recorded: a consumer of one fails as before until the producer runs (`--force-apply`).
struct CarryOutputs<'a> {
    inner: &'a StepSink,
    step: &'a str,
    cp: &'a SharedCheckpoint,
    /// The last deploy's outputs of a shell step, until the first sub-change in place takes them.
    last: std::sync::Mutex<Option<std::collections::BTreeMap<String, serde_json::Value>>>,
}

impl<'a> CarryOutputs<'a> {
    fn new(attempts: &'a Attempts, step: &'a Step, adapter: &StepAdapter<'_>, inner: &'a StepSink) -> CarryOutputs<'a> {
        let last = adapter
            .in_place_keeps_last_outputs()
            .then(|| {
                // Only a step the last deploy left done: a reverted one's outputs were undone.
                let done =
                    attempts.last.as_ref().and_then(|d| d.step(&step.name)).filter(|s| s.status == StepStatus::Done);
                done.map(|s| s.outputs.clone())
            })
            .flatten()
            .filter(|outputs| !outputs.is_empty());
        CarryOutputs { inner, step: &step.name, cp: &attempts.cp, last: std::sync::Mutex::new(last) }
    }
}

impl EventSink for CarryOutputs<'_> {
    fn emit(&self, event: Event) {
        if matches!(event, Event::InPlace { .. }) {
            let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(last) = last {
                // Plain or sensitive, what this run made already stands.
                let have: std::collections::BTreeSet<String> = self.cp.read(|d| {
                    d.step(self.step)
                        .map(|s| s.outputs.keys().chain(&s.sensitive_outputs).cloned().collect())
                        .unwrap_or_default()
                });
                let values: rdeploy_adapters::outputs::Outputs = last
                    .into_iter()
                    .filter(|(key, _)| !have.contains(key))
                    .map(|(key, value)| (key, OutputValue::Plain(value)))
                    .collect();
                if !values.is_empty() {
                    self.inner.emit(Event::Outputs { values });
                }
            }
        }
        self.inner.emit(event);
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

//! A running step's [`EventSink`]: each event from its adapter is redacted with the run's
//! secrets, then journaled ([`StepJournal`]), its sensitive outputs kept ([`outputs`]), and what
//! the operator sees handed to the reporters as a [`RunEvent`]: three sinks, one each.

use rdeploy_adapters::outputs::OutputValue;
use rdeploy_adapters::{Event, EventSink};

use super::event::{Reporters, RunEvent, SubChange};
use super::journal::{JournalError, StepJournal};
use super::outputs::{self, SensitiveOutputs};

pub struct StepSink {
    journal: StepJournal,
    sensitive: SensitiveOutputs,
    reporters: Reporters,
}

impl StepSink {
    pub fn new(journal: StepJournal, sensitive: SensitiveOutputs, reporters: Reporters) -> StepSink {
        StepSink { journal, sensitive, reporters }
    }

    pub fn journal_error(&self) -> Option<JournalError> {
        self.journal.error()
    }
}

/// What the operator is told of an adapter's event, if anything.
fn run_event(step: &str, event: Event) -> Option<RunEvent> {
    let step = step.to_string();
    let sub = |id: String, change: SubChange| Some(RunEvent::SubChange { step: step.clone(), id, change });
    match event {
        Event::Planned { ids } => Some(RunEvent::Planned { step, total: ids.len() }),
        Event::Started { id } => sub(id, SubChange::Started),
        Event::Done { id, .. } => sub(id, SubChange::Done),
        Event::Failed { id, error } => sub(id, SubChange::Failed(error)),
        Event::Warning { message } => Some(RunEvent::Warning { from_step: Some(step), message }),
        Event::Output { stream, line } => Some(RunEvent::Output { step, stream, line }),
        Event::Outputs { .. } | Event::Pending { .. } | Event::Moved { .. } | Event::Fact { .. } => None,
    }
}

impl EventSink for StepSink {
    fn emit(&self, event: Event) {
        // A sensitive output joins the run's secrets first, so the central redaction covers it
        // (in this event's plain values too, and in whatever the consumers report).
        if let Event::Outputs { values } = &event {
            for value in values.values() {
                if let OutputValue::Sensitive(secret) = value {
                    crate::out::secrets().add(secret);
                }
            }
            outputs::keep(&self.sensitive, self.journal.step(), values);
        }
        // Redacted once more with the run's secrets before the journal, the log and the terminal.
        let event = rdeploy_adapters::secrets::redact_event(event, &crate::out::secrets().values());
        self.journal.event(&event);
        if let Some(run_event) = run_event(self.journal.step(), event) {
            self.reporters.emit(run_event);
        }
    }
}

//! A running step's [`EventSink`]: each event from its adapter is redacted with the run's
//! secrets, then journaled ([`StepJournal`]), its sensitive outputs kept ([`outputs`]), and what
//! the operator sees handed to the reporters as a [`RunEvent`]: three sinks, one each.

use rdeploy_adapters::outputs::OutputValue;
use rdeploy_adapters::{Event, EventSink};

use super::event::{Reporters, RunEvent, SubChange};
use super::journal::{JournalError, StepJournal};
use super::outputs::{self, SensitiveOutputs};
use crate::redact::Redactor;

pub struct StepSink {
    journal: StepJournal,
    sensitive: SensitiveOutputs,
    reporters: Reporters,
    redactor: Redactor,
}

impl StepSink {
    pub fn new(
        journal: StepJournal,
        sensitive: SensitiveOutputs,
        reporters: Reporters,
        redactor: Redactor,
    ) -> StepSink {
        StepSink { journal, sensitive, reporters, redactor }
    }

    pub fn journal_error(&self) -> Option<JournalError> {
        self.journal.error()
    }
}

impl StepSink {
    /// Registers a step's sensitive outputs with the run's secrets. Redaction then makes
    /// sensitive the plain outputs whose value holds one of them
    /// (`url=postgres://app:$DB_PASSWORD@db/app`): recorded redacted, such a value would reach its
    /// consumers on `recover` as `***` as if it were the value, so it is sensitive instead: never
    /// recorded (its key is), kept in memory for its consumers in this run, and read again from
    /// the tool's state, or refused, in a later one, as any sensitive output is.
    fn register_sensitive(&self, values: &rdeploy_adapters::outputs::Outputs) {
        for value in values.values() {
            if let OutputValue::Sensitive(secret) = value {
                self.redactor.add(secret);
            }
        }
    }
}

/// What the operator is told of an adapter's event, if anything.
fn run_event(step: &str, event: Event) -> Option<RunEvent> {
    let step = step.to_string();
    let sub = |id: String, change: SubChange| Some(RunEvent::SubChange { step: step.clone(), id, change });
    match event {
        Event::Planned { ids } => Some(RunEvent::Planned { step, total: ids.len() }),
        Event::Started { id } => sub(id, SubChange::Started),
        Event::Done { id, .. } | Event::InPlace { id, .. } => sub(id, SubChange::Done),
        Event::Failed { id, error } => sub(id, SubChange::Failed(error)),
        Event::Warning { message } => Some(RunEvent::Warning { from_step: Some(step), message }),
        Event::Output { stream, line } => Some(RunEvent::Output { step, stream, line }),
        Event::Outputs { .. } | Event::Pending { .. } | Event::Moved { .. } | Event::Fact { .. } => None,
    }
}

impl EventSink for StepSink {
    fn emit(&self, event: Event) {
        // A sensitive output joins the run's secrets first, so the redaction below covers it (in
        // this event's plain values too, and in whatever the consumers report).
        if let Event::Outputs { values } = &event {
            self.register_sensitive(values);
        }
        // Redacted once more with the run's secrets before the journal, the log and the terminal.
        // A plain output whose value holds one of them comes out sensitive (see below); it is
        // not registered itself: the secret in it is, which redacts it wherever it shows.
        let event = self.redactor.redact_event(event);
        if let Event::Outputs { values } = &event {
            outputs::keep(&self.sensitive, self.journal.step(), values);
        }
        self.journal.event(&event);
        if let Some(run_event) = run_event(self.journal.step(), event) {
            self.reporters.emit(run_event);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use rdeploy_adapters::secrets::Secret;
    use rdeploy_adapters::{CancellationToken, Stream, Tool};

    use super::*;
    use crate::checkpoint::{Record, StepHeader, StepMode};
    use crate::engine::event::Reporter;
    use crate::engine::journal::Checkpoint;
    use crate::engine::journal::SharedCheckpoint;
    use crate::store::local::LocalStore;

    #[derive(Default)]
    struct Seen(Mutex<Vec<RunEvent>>);

    impl Reporter for Seen {
        fn event(&self, event: &RunEvent) {
            self.0.lock().unwrap().push(event.clone());
        }
    }

    /// One adapter event goes three ways: the journal records it, the vault keeps a sensitive
    /// value (the journal only its key), the reporters are told; a tool's line of output is the
    /// reporters' only.
    #[test]
    fn each_event_is_journaled_kept_and_reported_by_its_own_sink() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalStore::at_path(tmp.path().join(".rdeploy"));
        let mut cp = Checkpoint::create(&store, &Default::default()).unwrap();
        let header =
            StepHeader { name: "s".into(), tool: Tool::Shell, resumable: true, digest: "d".into(), has_revert: false };
        cp.record(Record::Run {
            run_id: "r1".into(),
            command: "up".into(),
            stack: "st".into(),
            stack_file: "stack.yaml".into(),
            stack_digest: "x".into(),
            steps: vec![header],
            host: "h".into(),
            pid: 1,
            rdeploy_version: "0".into(),
        })
        .unwrap();
        cp.record(Record::StepStarted { step: "s".into(), mode: StepMode::Apply, tool_version: None }).unwrap();
        let cp = SharedCheckpoint::new(cp);
        let seen = Arc::new(Seen::default());
        let vault = SensitiveOutputs::default();
        let journal = StepJournal::new("s".into(), cp.clone(), CancellationToken::new());
        let redactor = Redactor::default();
        let sink = StepSink::new(journal, vault.clone(), Reporters::new(vec![seen.clone()]), redactor.clone());

        sink.emit(Event::Started { id: "a".into() });
        sink.emit(Event::Output { stream: Stream::Stdout, line: "hello".into() });
        let secret = Secret::new(serde_json::json!("sink-test-password-4711"));
        let values = BTreeMap::from([
            ("url".to_string(), OutputValue::Plain(serde_json::json!("https://x"))),
            ("password".to_string(), OutputValue::Sensitive(secret.clone())),
        ]);
        sink.emit(Event::Outputs { values });
        sink.emit(Event::Done { id: "a".into(), note: None });

        assert!(sink.journal_error().is_none());
        let step = cp.read(|d| d.step("s").cloned()).unwrap();
        assert_eq!(step.sub_changes.len(), 1);
        assert_eq!(step.outputs.get("url"), Some(&serde_json::json!("https://x")));
        assert!(!step.outputs.contains_key("password"));
        assert_eq!(step.sensitive_outputs, ["password"]);
        assert_eq!(vault.lock().unwrap()["s"]["password"], secret);
        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                RunEvent::SubChange { step: "s".into(), id: "a".into(), change: SubChange::Started },
                RunEvent::Output { step: "s".into(), stream: Stream::Stdout, line: "hello".into() },
                RunEvent::SubChange { step: "s".into(), id: "a".into(), change: SubChange::Done },
            ]
        );
    }

    /// A plain output whose value holds one of the run's secrets is kept as a sensitive one:
    /// in memory for its consumers, its key only in the journal, never `***` as its value.
    #[test]
    fn a_plain_output_holding_a_secret_is_kept_as_sensitive() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalStore::at_path(tmp.path().join(".rdeploy"));
        let redactor = Redactor::default();
        redactor.add_strings(["db-pw-93f1c7".to_string()]);
        let mut cp = Checkpoint::create(&store, &redactor).unwrap();
        let header =
            StepHeader { name: "s".into(), tool: Tool::Shell, resumable: true, digest: "d".into(), has_revert: false };
        cp.record(Record::Run {
            run_id: "r1".into(),
            command: "up".into(),
            stack: "st".into(),
            stack_file: "stack.yaml".into(),
            stack_digest: "x".into(),
            steps: vec![header],
            host: "h".into(),
            pid: 1,
            rdeploy_version: "0".into(),
        })
        .unwrap();
        cp.record(Record::StepStarted { step: "s".into(), mode: StepMode::Apply, tool_version: None }).unwrap();
        let cp = SharedCheckpoint::new(cp);
        let vault = SensitiveOutputs::default();
        let journal = StepJournal::new("s".into(), cp.clone(), CancellationToken::new());
        let sink = StepSink::new(journal, vault.clone(), Reporters::new(vec![]), redactor.clone());

        let url = serde_json::json!("postgres://app:db-pw-93f1c7@db/app");
        let values = BTreeMap::from([
            ("url".to_string(), OutputValue::Plain(url.clone())),
            ("host".to_string(), OutputValue::Plain(serde_json::json!("db"))),
        ]);
        sink.emit(Event::Outputs { values });

        let step = cp.read(|d| d.step("s").cloned()).unwrap();
        assert_eq!(step.outputs, BTreeMap::from([("host".to_string(), serde_json::json!("db"))]));
        assert_eq!(step.sensitive_outputs, ["url"]);
        assert_eq!(vault.lock().unwrap()["s"]["url"], Secret::new(url));
        // Wherever else it shows, the secret in it is redacted (not its harmless parts).
        assert_eq!(
            redactor.redact("connect to postgres://app:db-pw-93f1c7@db/app"),
            "connect to postgres://app:***@db/app"
        );
    }
}

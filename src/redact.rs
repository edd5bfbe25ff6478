//! The run's [`Redactor`]: the values one run of rdeploy must never write, and the redaction
//! everything that writes applies with them. It is a value, not a process-wide registry: `main`
//! makes one for the command it runs (one invocation, one run), the stack parser fills it with
//! what the stack marks secret, the [`crate::engine::Session`] holds it and hands it to the
//! adapters (`StepContext::secrets`), the journal, the step sink and the reporters, and the
//! [`crate::ui::Ui`] writes stderr and stdout (through [`crate::out::Out`]) with it.

use rdeploy_adapters::secrets::{Registry, Secret};
use rdeploy_adapters::{Event, Failure};
use serde_json::Value;

/// The values a run must never write, a growing set shared by its clones: whatever learns a
/// secret value adds it (the stack parser, a step reading a marked value, a sensitive output),
/// whatever writes redacts with it. Two runs' redactors share nothing.
#[derive(Clone, Debug, Default)]
pub struct Redactor(Registry);

impl Redactor {
    /// Registers a secret value (strings of one character or more; see
    /// [`rdeploy_adapters::secrets::redactable`]).
    pub fn add(&self, secret: &Secret) {
        self.0.add(secret);
    }

    /// Registers strings as they are (empty ones are ignored).
    pub fn add_strings<I: IntoIterator<Item = String>>(&self, strings: I) {
        self.0.add_strings(strings);
    }

    /// The set the adapters add to and redact with (`StepContext::secrets`): the same set.
    pub fn registry(&self) -> &Registry {
        &self.0
    }

    /// `text` with every registered value replaced by `***`.
    pub fn redact(&self, text: &str) -> String {
        self.0.redact(text)
    }

    /// A whole rendered document (a report, a terminal line, a file) redacted as the last line
    /// of defence (see [`Registry::redact_document`]: values under four characters are left).
    pub fn redact_document(&self, text: &str) -> String {
        self.0.redact_document(text)
    }

    /// A JSON document's string values redacted as [`Redactor::redact_document`] does.
    pub fn redact_json_document(&self, value: Value) -> Value {
        self.0.redact_json_document(value)
    }

    /// Every string in `value` (map keys too) redacted; booleans and numbers as they are.
    pub fn redact_json(&self, value: Value) -> Value {
        self.0.redact_json(value)
    }

    /// A failure with every text in it redacted.
    pub fn redact_failure(&self, failure: Failure) -> Failure {
        self.0.redact_failure(failure)
    }

    /// An adapter's event with every text in it redacted (sub-change ids are names, kept); a
    /// plain output whose value holds a secret comes out sensitive (see
    /// [`rdeploy_adapters::secrets::redact_event`]).
    pub fn redact_event(&self, event: Event) -> Event {
        if self.0.is_empty() {
            return event;
        }
        rdeploy_adapters::secrets::redact_event(event, &self.0.values())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two runs in one process (two commands, two tests) each redact with their own secrets
    /// only: what one learned is neither hidden by nor visible to the other, as a process-wide
    /// registry could not do.
    #[test]
    fn two_runs_do_not_share_secrets() {
        let first = Redactor::default();
        let second = Redactor::default();
        first.add(&Secret::new(serde_json::json!("first-run-password")));
        second.add_strings(["second-run-token".to_string()]);
        let text = "first-run-password and second-run-token";
        assert_eq!(first.redact(text), "*** and second-run-token");
        assert_eq!(second.redact(text), "first-run-password and ***");
        assert_eq!(first.redact_document(text), "*** and second-run-token");
        // A clone is the same run: a secret its step learned later is redacted by the original.
        first.clone().add_strings(["learned-later".to_string()]);
        assert_eq!(first.redact("learned-later"), "***");
        assert_eq!(second.redact("learned-later"), "learned-later");
    }
}

//! A step's references to other steps' outputs: their values taken before the tool starts
//! (recorded ones, sensitive ones from memory or the producer's own state), and the consumers
//! a producer's changed outputs leave stale.

use std::collections::{BTreeMap, HashMap};

use rdeploy_adapters::outputs::OutputValue;
use rdeploy_adapters::secrets::Secret;
use rdeploy_adapters::{Adapter, Failure};

use super::attempt::Action;
use super::journal::SharedCheckpoint;
use super::schedule::Schedule;
use super::session::Session;
use crate::checkpoint::{Record, StepStatus};
use crate::reference::Reference;
use crate::stack::Step;

/// A step's outputs as known at one moment: the recorded ones and the sensitive ones in memory.
pub(super) type OutputsSeen = (BTreeMap<String, serde_json::Value>, BTreeMap<String, Secret>);

/// What the checkpoint recorded of one referenced output: its value, whether it is sensitive,
/// and the producer's output keys.
pub(super) type Recorded = (Option<serde_json::Value>, bool, Vec<String>);

impl Session {
    /// The step with its `${{ steps.NAME.outputs.KEY }}` replaced by the values recorded in the
    /// checkpoint (a sensitive one from this process's memory, else read again from the
    /// producer's own state, and registered with the run's secrets). A reference
    /// without a value is the step's failure, before its tool starts.
    pub(super) async fn resolve_references(&self, cp: &SharedCheckpoint, step: &Step) -> Result<Step, Failure> {
        self.resolve_references_from(|f| cp.read(f), step).await
    }

    /// [`Session::resolve_references`] from a deploy read by `read` (the live checkpoint, or a
    /// loaded one for `recover --dry-run`).
    pub(super) async fn resolve_references_from(
        &self,
        read: impl Fn(&dyn Fn(&crate::checkpoint::Deploy) -> Recorded) -> Recorded,
        step: &Step,
    ) -> Result<Step, Failure> {
        let mut values: HashMap<Reference, OutputValue> = HashMap::new();
        for reference in &step.refs {
            let (plain, sensitive, known) = read(&|d: &crate::checkpoint::Deploy| {
                let producer = d.step(&reference.step);
                let plain = producer.and_then(|p| p.outputs.get(&reference.key).cloned());
                let sensitive = producer.is_some_and(|p| p.sensitive_outputs.contains(&reference.key));
                let mut known: Vec<String> = producer.map(|p| p.outputs.keys().cloned().collect()).unwrap_or_default();
                known.extend(producer.map(|p| p.sensitive_outputs.clone()).unwrap_or_default());
                known.sort();
                (plain, sensitive, known)
            });
            if let Some(value) = plain {
                values.insert(reference.clone(), OutputValue::Plain(value));
                continue;
            }
            if let Some(secret) = self.sensitive_value(reference) {
                values.insert(reference.clone(), OutputValue::Sensitive(secret));
                continue;
            }
            if !sensitive {
                let theirs = if known.is_empty() {
                    "it recorded no outputs".to_string()
                } else {
                    format!("its outputs are {}", known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "))
                };
                return Err(Failure::new(format!(
                    "`{reference}`: step `{}` has no output `{}` ({theirs}); nothing was run",
                    reference.step, reference.key
                ))
                .with_hint(format!(
                    "make `{}` produce `{}` or fix the reference, then `rdeploy recover {}`",
                    reference.step, reference.key, self.stack_arg
                )));
            }
            let secret = self.read_sensitive_again(reference).await?;
            values.insert(reference.clone(), OutputValue::Sensitive(secret));
        }
        // Every sensitive value it is given is one of the run's secrets (registered when it was
        // read; again here, which costs nothing), so what the step reports is redacted of it.
        for value in values.values() {
            if let OutputValue::Sensitive(secret) = value {
                self.redactor.add(secret);
            }
        }
        let text = |r: &Reference| values.get(r).map(|v| rdeploy_adapters::outputs::value_text(v.value()));
        let resolved = step.resolve(&text).map_err(|e| match e {
            crate::stack::ResolveError::Missing(r) => Failure::new(format!("`{r}` has no value; nothing was run")),
            crate::stack::ResolveError::Invalid(why) => Failure::new(format!(
                "the output values make settings step `{}` cannot take: {why}; nothing was run",
                step.name
            ))
            .with_hint("check what the producing steps output (`rdeploy output`) against the keys that use them"),
        });
        // The tool's words about a bad value may quote it.
        resolved.map_err(|f| self.redactor.redact_failure(f))
    }

    /// A sensitive output never recorded, read again from its producer's own state (and
    /// registered with the run's secrets and kept in memory), or the step's failure saying why
    /// it cannot be.
    async fn read_sensitive_again(&self, reference: &Reference) -> Result<Secret, Failure> {
        // Sensitive and never recorded: the producer's own state may have it again.
        let producer = self.stack.step(&reference.step).expect("references name stack steps");
        let ctx = self.context(producer, self.cancel.child_token());
        match producer.spec.read_outputs(&ctx).await {
            Ok(Some(outputs)) => {
                let mut vault = self.sensitive.lock().unwrap_or_else(|e| e.into_inner());
                let entry = vault.entry(reference.step.clone()).or_default();
                for (key, value) in outputs {
                    let secret = match value {
                        OutputValue::Sensitive(secret) => secret,
                        // Recorded as sensitive because its value held one of the run's secrets:
                        // the tool calls it plain, and the value is a secret all the same.
                        OutputValue::Plain(value) if key == reference.key => Secret::new(value),
                        OutputValue::Plain(_) => continue,
                    };
                    self.redactor.add(&secret);
                    entry.insert(key, secret);
                }
            }
            Ok(None) => {}
            Err(failure) => {
                return Err(Failure::new(format!(
                "`{reference}` is sensitive and was never recorded, and reading it again from {}'s state failed: {}",
                producer.tool, failure.summary
            ))
                .with_hint(
                    failure.hint.unwrap_or_else(|| format!("fix it, then `rdeploy recover {}`", self.stack_arg)),
                ))
            }
        }
        match self.sensitive_value(reference) {
            Some(secret) => Ok(secret),
            None => {
                Err(Failure::new(format!(
                    "`{reference}` is a sensitive output: only the run that produced it had its value, and {} keeps no state to read it again from; nothing was run",
                    producer.tool
                ))
                .with_hint(format!(
                    "run step `{0}` again to produce it (its value is never written down): undo what `{0}` did and `rdeploy reset {1} --yes`, then `rdeploy up {1}`",
                    reference.step, self.stack_arg
                )))
            }
        }
    }

    pub(super) fn outputs_seen(&self, cp: &SharedCheckpoint, step: &str) -> OutputsSeen {
        let plain = cp.read(|d| d.step(step).map(|s| s.outputs.clone()).unwrap_or_default());
        let vault = self.sensitive.lock().unwrap_or_else(|e| e.into_inner());
        (plain, vault.get(step).cloned().unwrap_or_default())
    }

    /// A producer ran again and some of its outputs changed: every completed step that used one
    /// of them is no longer done and is applied again in this run, with the new value, so no
    /// step stays applied with an old one.
    pub(super) fn stale_consumers(
        &self,
        cp: &SharedCheckpoint,
        schedule: &mut Schedule<Action>,
        producer: &str,
        before: &OutputsSeen,
    ) -> anyhow::Result<()> {
        let after = self.outputs_seen(cp, producer);
        // A recorded value that differs, went, or became sensitive; a sensitive one known before
        // and after (in this process) that differs.
        let mut changed: Vec<&str> =
            before.0.iter().filter(|(k, v)| after.0.get(*k) != Some(*v)).map(|(k, _)| k.as_str()).collect();
        changed
            .extend(before.1.iter().filter(|(k, v)| after.1.get(*k).is_some_and(|a| a != *v)).map(|(k, _)| k.as_str()));
        changed.sort();
        changed.dedup();
        if changed.is_empty() {
            return Ok(());
        }
        for consumer in self.stack.ordered() {
            let used: Vec<&str> = changed
                .iter()
                .copied()
                .filter(|k| consumer.refs.iter().any(|r| r.step == producer && r.key == *k))
                .collect();
            if used.is_empty() {
                continue;
            }
            let done = cp.read(|d| d.step(&consumer.name).is_some_and(|s| s.status == StepStatus::Done));
            if !done {
                continue;
            }
            let because = format!(
                "{} of step `{producer}` changed",
                match used.as_slice() {
                    [one] => format!("output `{one}`"),
                    many => format!("outputs {}", many.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")),
                }
            );
            self.warn(format!("step `{}` used an old value: {because}; applying it again", consumer.name));
            cp.record(Record::Stale { step: consumer.name.clone(), because })?;
            schedule.requeue(&consumer.name, Action::Apply);
        }
        Ok(())
    }

    pub(super) fn sensitive_value(&self, reference: &Reference) -> Option<Secret> {
        let vault = self.sensitive.lock().unwrap_or_else(|e| e.into_inner());
        vault.get(&reference.step).and_then(|m| m.get(&reference.key)).cloned()
    }
}

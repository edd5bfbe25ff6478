//! The journal: the open checkpoint shared by the scheduler and the running steps, and each
//! step's journal, which turns its adapter's [`Event`]s into [`Record`]s durably before the
//! adapter goes on. It owns the checkpoint and nothing else: what the operator sees goes to the
//! reporters, sensitive values to `outputs`, both beside it in [`super::sink`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rdeploy_adapters::outputs::OutputValue;
use rdeploy_adapters::{CancellationToken, Event};

use crate::checkpoint::{Checkpoint, CheckpointGone, Deploy, Record};

/// The open checkpoint, shared by the scheduler and the running steps' sinks. A poisoned lock is
/// used as it is: the checkpoint is whole after every record.
#[derive(Clone)]
pub struct SharedCheckpoint(Arc<Mutex<Checkpoint>>);

impl SharedCheckpoint {
    pub fn new(cp: Checkpoint) -> SharedCheckpoint {
        SharedCheckpoint(Arc::new(Mutex::new(cp)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Checkpoint> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record(&self, record: Record) -> anyhow::Result<()> {
        self.lock().record(record)
    }

    /// Saves a snapshot; the snapshot is a cache of the journal, so failing to write it loses nothing.
    pub fn snapshot(&self) {
        let _ = self.lock().snapshot();
    }

    /// Reads the deploy as folded so far.
    pub fn read<T>(&self, f: impl FnOnce(&Deploy) -> T) -> T {
        f(self.lock().deploy())
    }

    /// The checkpoint back, once every step task (and its sink) has finished.
    pub fn into_inner(self) -> Checkpoint {
        match Arc::try_unwrap(self.0) {
            Ok(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
            Err(_) => unreachable!("every step task has finished"),
        }
    }
}

/// Why a step's sink could not record an event.
#[derive(Clone, Debug)]
pub enum JournalError {
    /// The checkpoint was deleted under the run (the run's final error says what to do).
    Gone,
    Other(String),
}

impl JournalError {
    pub fn of(e: &anyhow::Error) -> JournalError {
        if CheckpointGone::is(e) {
            JournalError::Gone
        } else {
            JournalError::Other(format!("{e:#}"))
        }
    }
}

/// One step's journal: every event that changes the checkpoint becomes its record.
pub struct StepJournal {
    step: String,
    cp: SharedCheckpoint,
    error: Mutex<Option<JournalError>>,
    /// Cancelled on the first journal error, so the step starts nothing it cannot record (a
    /// full disk, or a shared store whose lease another run took over).
    stop: CancellationToken,
}

impl StepJournal {
    pub fn new(step: String, cp: SharedCheckpoint, stop: CancellationToken) -> StepJournal {
        StepJournal { step, cp, error: Mutex::new(None), stop }
    }

    pub fn step(&self) -> &str {
        &self.step
    }

    /// The first record that could not be written, if any.
    pub fn error(&self) -> Option<JournalError> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn record(&self, record: Record) {
        if let Err(e) = self.cp.record(record) {
            self.error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(JournalError::of(&e));
            self.stop.cancel();
        }
    }

    /// Records what `event` says about the step (a line of output changes nothing recorded); a
    /// sensitive output is recorded by its key only.
    pub fn event(&self, event: &Event) {
        let step = self.step.clone();
        match event.clone() {
            Event::Outputs { values } => {
                let mut plain = BTreeMap::new();
                let mut sensitive = Vec::new();
                for (key, value) in values {
                    match value {
                        OutputValue::Plain(v) => {
                            plain.insert(key, v);
                        }
                        OutputValue::Sensitive(_) => sensitive.push(key),
                    }
                }
                self.record(Record::Outputs { step, values: plain, sensitive });
            }
            Event::Planned { ids } => self.record(Record::Planned { step, ids }),
            Event::Started { id } => self.record(Record::SubStarted { step, id }),
            Event::Done { id, note } => self.record(Record::SubDone { step, id, note }),
            Event::InPlace { id, note } => self.record(Record::SubInPlace { step, id, note }),
            Event::Failed { id, error } => self.record(Record::SubFailed { step, id, error }),
            Event::Pending { id, reason } => self.record(Record::SubPending { step, id, reason }),
            Event::Moved { from, to } => self.record(Record::SubMoved { step, from, to }),
            Event::Fact { key, value } => self.record(Record::Fact { step, key, value }),
            Event::Warning { message } => self.record(Record::Warning { step: Some(step), message }),
            Event::Output { .. } => {}
        }
    }
}

//! The journal: the open checkpoint shared by the scheduler and the running steps, and each
//! step's journal, which turns its adapter's [`Event`]s into [`Record`]s durably before the
//! adapter goes on. It owns the checkpoint and nothing else: what the operator sees goes to the
//! reporters, sensitive values to `outputs`, both beside it in [`super::sink`]. The
//! [`Checkpoint`] itself appends records through a [`Store`] (a local directory or PostgreSQL)
//! and decides which must be durable before the caller goes on; the records and their fold are
//! `crate::checkpoint`'s.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rdeploy_adapters::outputs::OutputValue;
use rdeploy_adapters::{CancellationToken, Event};

use rdeploy_adapters::SubStatus;

use crate::checkpoint::{now, Deploy, DeployState, Entry, Record, StepHeader, StepStatus};
use crate::exit::{Code, Refusal};
use crate::redact::Redactor;
use crate::stack::Stack;
use crate::store::local::JournalGone;
use crate::store::{JournalWriter, Store};

/// The checkpoint was deleted or replaced under the running deploy. Its message says it all
/// (what completed, that nothing can be resumed, what to do), so it is printed once, as is.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CheckpointGone(pub String);

impl CheckpointGone {
    /// Whether `e` is (or was caused by) a vanished checkpoint.
    pub fn is(e: &anyhow::Error) -> bool {
        e.chain().any(|c| c.is::<CheckpointGone>())
    }
}

/// An open checkpoint that records one deploy. Owned by the process holding the lock.
pub struct Checkpoint {
    journal: Box<dyn JournalWriter>,
    deploy: Deploy,
    /// Records written but not yet durable (see [`Record::needs_sync`]).
    unsynced: bool,
    /// Sub-changes that finished after the checkpoint was deleted (step, id).
    unrecorded: Vec<(String, String)>,
    /// The run's secrets, redacted from every record before it is written.
    redactor: Redactor,
}

impl Checkpoint {
    /// Starts a new deploy's journal (the caller holds the lock and checked there is none);
    /// every record is redacted with the run's `redactor`.
    pub fn create(store: &dyn Store, redactor: &Redactor) -> anyhow::Result<Checkpoint> {
        Ok(Checkpoint {
            journal: store.create_journal()?,
            deploy: Deploy::empty(),
            unsynced: false,
            unrecorded: Vec::new(),
            redactor: redactor.clone(),
        })
    }

    /// Opens the unfinished deploy to go on with it (`recover`, `revert`). The caller holds the
    /// lock, so steps recorded as running were left by a dead run and are settled as failed.
    /// A journal that lost records is refused: what they said is unknown, and going on could
    /// apply completed work again.
    pub fn resume(store: &dyn Store, redactor: &Redactor) -> anyhow::Result<Checkpoint> {
        let cp = Checkpoint::reopen_as_is(store, redactor)?;
        if let Some(lost) = cp.journal.lost() {
            return Err(Refusal::new(Code::BadInput, format!("{lost}; nothing was run"))
                .with_hint(
                    "check what each tool's own state holds (`rdeploy status` shows what the journal still says), then `rdeploy reset --yes` to forget this deploy, or restore the state directory from a backup",
                )
                .into());
        }
        Ok(cp)
    }

    /// Opens the unfinished deploy to close it (`reset`, archiving a finished deploy), even when
    /// its journal is damaged: these only add a record and move it to history.
    pub fn reopen_as_is(store: &dyn Store, redactor: &Redactor) -> anyhow::Result<Checkpoint> {
        let (journal, mut deploy) = store.open_journal()?;
        deploy.settle_after_load(false);
        Ok(Checkpoint { journal, deploy, unsynced: false, unrecorded: Vec::new(), redactor: redactor.clone() })
    }

    pub fn deploy(&self) -> &Deploy {
        &self.deploy
    }

    /// Appends a record (durable before returning when [`Record::needs_sync`]), then folds it
    /// into the state.
    pub fn record(&mut self, record: Record) -> anyhow::Result<()> {
        // The one place records are written: whatever an adapter or the engine forgot to
        // redact, the run's secrets never reach the journal (nor the snapshot folded from it).
        let record = record.redacted(&self.redactor);
        let entry = Entry { seq: self.deploy.seq + 1, ts: now(), record };
        tracing::trace!(seq = entry.seq, record = ?entry.record, "journal");
        let synced = entry.record.needs_sync();
        let written = if synced { self.journal.append_synced(&entry) } else { self.journal.append(&entry) };
        if let Err(e) = written {
            return Err(self.explain(e, &entry.record));
        }
        self.unsynced = !synced;
        self.deploy.apply(entry.seq, &entry.ts, &entry.record);
        Ok(())
    }

    /// Says what a failure to record means for the operator (`failed` is the record that could
    /// not be written).
    fn explain(&mut self, e: anyhow::Error, failed: &Record) -> anyhow::Error {
        if self.deploy.seq == 0 {
            // The first record: nothing ran, and no half-made journal is left behind.
            let _ = self.journal.discard_empty();
            return Refusal::new(
                Code::BadInput,
                format!("could not write the first checkpoint record ({e:#}); nothing ran, no checkpoint was started"),
            )
            .with_hint("make the state directory writable (free space, a writable mount) or pass another `--state-dir`, then run this again")
            .into();
        }
        if e.downcast_ref::<JournalGone>().is_none() {
            return e;
        }
        // A sub-change whose end could not be recorded did finish: its tool said so.
        if let Record::SubDone { step, id, .. } | Record::SubInPlace { step, id, .. } = failed {
            self.unrecorded.push((step.clone(), id.clone()));
        }
        let mut done = Vec::new();
        for s in &self.deploy.steps {
            let subs: Vec<&str> =
                s.sub_changes.iter().filter(|c| c.status == SubStatus::Done).map(|c| c.id.as_str()).collect();
            let unrecorded: Vec<&str> =
                self.unrecorded.iter().filter(|(step, _)| *step == s.name).map(|(_, id)| id.as_str()).collect();
            let started: Vec<&str> = s
                .sub_changes
                .iter()
                .filter(|c| c.status == SubStatus::Started && !unrecorded.contains(&c.id.as_str()))
                .map(|c| c.id.as_str())
                .collect();
            let mut said = match s.status {
                StepStatus::Done => format!("step `{}` done", s.name),
                StepStatus::Pending if subs.is_empty() && started.is_empty() => continue,
                other => format!("step `{}` {}", s.name, other.as_str()),
            };
            if !subs.is_empty() && s.status != StepStatus::Done {
                said.push_str(&format!(" (sub-changes done: {})", subs.join(", ")));
            }
            if !unrecorded.is_empty() {
                said.push_str(&format!(" (done, too late to record: {})", unrecorded.join(", ")));
            }
            if !started.is_empty() {
                said.push_str(&format!(" (started, outcome unknown: {})", started.join(", ")));
            }
            done.push(said);
        }
        let done = if done.is_empty() { "nothing had completed".to_string() } else { done.join("; ") };
        CheckpointGone(format!(
            "{e}; rdeploy stopped the running tools rather than record into a deleted file. What this deploy had done: {done}. The checkpoint is gone, so `rdeploy recover` has nothing to resume, `rdeploy status` shows nothing deployed and `rdeploy up` would run everything again\n  hint: restore the state directory from a backup and run `rdeploy recover`; without one, check each tool's own state (the list above) before `rdeploy up`; keep cleanup jobs away from the state directory while rdeploy runs"
        ))
        .into()
    }

    /// Makes every record written so far durable.
    pub fn sync(&mut self) -> anyhow::Result<()> {
        self.journal.sync()?;
        self.unsynced = false;
        Ok(())
    }

    /// Saves a compact snapshot so loading does not replay the whole journal.
    pub fn snapshot(&mut self) -> anyhow::Result<()> {
        if self.unsynced {
            self.sync()?;
        }
        self.journal.snapshot(&self.deploy)
    }

    /// The run header for a command on this stack.
    pub fn run_record(stack: &Stack, command: &str, run_id: &str) -> Record {
        Record::Run {
            run_id: run_id.to_string(),
            command: command.to_string(),
            stack: stack.name.clone(),
            stack_file: stack.file.display().to_string(),
            stack_digest: stack.digest.clone(),
            steps: stack
                .steps
                .iter()
                .map(|s| StepHeader {
                    name: s.name.clone(),
                    tool: s.tool,
                    resumable: s.resumable,
                    digest: s.digest.clone(),
                    has_revert: s.revert.is_some(),
                })
                .collect(),
            host: crate::store::hostname(),
            pid: std::process::id(),
            rdeploy_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// Archives a deploy whose `finished` record was written before a crash kept it from
    /// being archived.
    pub fn archive_finished(mut self) -> anyhow::Result<()> {
        self.journal.archive(&self.deploy)?;
        self.unsynced = false;
        Ok(())
    }

    /// Ends the deploy: its final state goes to history and the journal is removed.
    pub fn finish(mut self, state: DeployState) -> anyhow::Result<Deploy> {
        self.record(Record::Finished { state })?;
        self.journal.archive(&self.deploy)?;
        self.unsynced = false;
        Ok(self.deploy.clone())
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        if self.unsynced {
            let _ = self.journal.sync();
        }
    }
}

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

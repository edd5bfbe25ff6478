//! The checkpoint: the records a deploy's journal holds, and the [`Deploy`] state they fold
//! into (a pure fold: no store, no I/O). Writing them through a store is
//! `engine::journal::Checkpoint`'s.

use std::collections::{BTreeMap, HashMap};

use rdeploy_adapters::fold::{fold_sub_change, SubChangeEvent, SubChangeFields};
use rdeploy_adapters::{Failure, PriorStep, PriorSubChange, SubStatus, Tool};
use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

pub const FORMAT: &str = "rdeploy-checkpoint";
pub const VERSION: u32 = 1;

/// A moment the checkpoint records: UTC, written (in JSON and messages) as RFC 3339, e.g.
/// `2026-12-01T08:00:55.123456789Z`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(#[serde(with = "time::serde::rfc3339")] pub OffsetDateTime);

impl Timestamp {
    /// Parses an RFC 3339 timestamp (as a store that keeps them as text hands them back).
    pub fn parse(text: &str) -> anyhow::Result<Timestamp> {
        OffsetDateTime::parse(text, &Rfc3339)
            .map(Timestamp)
            .map_err(|e| anyhow::anyhow!("`{text}` is not an RFC 3339 timestamp: {e}"))
    }

    /// Seconds from `earlier` to this moment.
    pub fn seconds_since(self, earlier: Timestamp) -> f64 {
        (self.0 - earlier.0).as_seconds_f64()
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.format(&Rfc3339).map_err(|_| std::fmt::Error)?)
    }
}

/// Now, in UTC.
pub fn now() -> Timestamp {
    Timestamp(OffsetDateTime::now_utc())
}

/// What one journal line records.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// A command started working on this deploy (`up` creates it, `recover` continues it).
    Run {
        run_id: String,
        command: String,
        stack: String,
        stack_file: String,
        stack_digest: String,
        steps: Vec<StepHeader>,
        host: String,
        pid: u32,
        rdeploy_version: String,
    },
    /// The run applies a reviewed plan (`up --plan PLANFILE`): the file as given and the
    /// sha256 of its bytes, so `status` and the report say which plan the deploy ran from.
    FromPlan {
        file: String,
        digest: String,
    },
    StepStarted {
        step: String,
        mode: StepMode,
        tool_version: Option<String>,
    },
    Planned {
        step: String,
        ids: Vec<String>,
    },
    SubStarted {
        step: String,
        id: String,
    },
    SubDone {
        step: String,
        id: String,
        note: Option<String>,
    },
    /// Found in place by the step's preview: done without being applied again.
    SubInPlace {
        step: String,
        id: String,
        note: Option<String>,
    },
    SubFailed {
        step: String,
        id: String,
        error: String,
    },
    SubPending {
        step: String,
        id: String,
        reason: String,
    },
    /// The tool renamed sub-change `from` to `to` (terraform `moved`): one sub-change.
    SubMoved {
        step: String,
        from: String,
        to: String,
    },
    Fact {
        step: String,
        key: String,
        value: serde_json::Value,
    },
    Warning {
        step: Option<String>,
        message: String,
    },
    /// Outputs the step produced for later steps; a key recorded again replaces its value.
    /// Sensitive outputs are named only: their values are never journaled.
    Outputs {
        step: String,
        values: BTreeMap<String, serde_json::Value>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        sensitive: Vec<String>,
    },
    /// A completed step is no longer done: an output it consumed changed (`because` says which),
    /// so it must be applied again with the new value.
    Stale {
        step: String,
        because: String,
    },
    StepDone {
        step: String,
    },
    /// The step's next start is attempt `attempt` of `of` (`retry:`); the failure recorded
    /// before it is an earlier attempt's.
    Attempt {
        step: String,
        attempt: u32,
        of: u32,
    },
    StepFailed {
        step: String,
        failure: Failure,
    },
    /// A gate refused the step; it did not run.
    StepRefused {
        step: String,
        reason: String,
    },
    StepReverted {
        step: String,
        /// How, when not by the step's own `revert` (a helm rollback).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        how: Option<String>,
    },
    StepRevertFailed {
        step: String,
        failure: Failure,
    },
    Interrupted {
        signal: String,
    },
    /// The deploy is over: complete, or reverted.
    Finished {
        state: DeployState,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepHeader {
    pub name: String,
    pub tool: Tool,
    pub resumable: bool,
    pub digest: String,
    pub has_revert: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepMode {
    Apply,
    Recover,
    Revert,
}

/// One journal record with its sequence number and time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub ts: Timestamp,
    #[serde(flatten)]
    pub record: Record,
}

/// The state of a deploy as a whole, as `status --json` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeployState {
    None,
    Partial,
    Complete,
    Reverted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    Pending,
    Running,
    Done,
    Failed,
    /// Its `revert` started and has not finished (or failed): neither in place nor undone.
    Reverting,
    Reverted,
    Refused,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Running => "running",
            StepStatus::Done => "done",
            StepStatus::Failed => "failed",
            StepStatus::Reverting => "reverting",
            StepStatus::Reverted => "reverted",
            StepStatus::Refused => "refused",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubChangeState {
    pub id: String,
    pub status: SubStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Done because the step's preview found it in place (not applied again by this deploy).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_place: bool,
    pub updated: Timestamp,
    /// The run (its `run_id`) whose record started this sub-change last: with the run's pid and
    /// host, what tells `recover` that the run which started a tool's change is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<String>,
    /// When that run's record started it: helm's abandoned-revision evidence needs the pending
    /// revision to be younger than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
}

impl SubChangeState {
    /// The one sub-change fold, shared with the adapters' test `Recorder`.
    fn fold(&mut self, event: SubChangeEvent<'_>) {
        fold_sub_change(
            SubChangeFields {
                status: &mut self.status,
                error: &mut self.error,
                note: &mut self.note,
                in_place: &mut self.in_place,
            },
            event,
        );
    }
}

/// A step's sub-changes in the order first recorded, indexed by id so that folding a record
/// costs the same however large the deploy grows. The list is the value (equality, JSON, and
/// reading through `Deref`); the index is a function of it, kept in step by the only two
/// mutators and rebuilt when a snapshot is loaded.
#[derive(Clone, Debug, Default)]
pub struct SubChanges {
    list: Vec<SubChangeState>,
    index: HashMap<String, usize>,
}

impl SubChanges {
    /// The sub-change `id`, recorded as pending at `ts` if it is new; its `updated` becomes `ts`.
    fn entry(&mut self, id: &str, ts: &Timestamp) -> &mut SubChangeState {
        let pos = match self.index.get(id) {
            Some(&pos) => pos,
            None => {
                self.index.insert(id.to_string(), self.list.len());
                self.list.push(SubChangeState {
                    id: id.to_string(),
                    status: SubStatus::Pending,
                    error: None,
                    note: None,
                    in_place: false,
                    updated: *ts,
                    started_by: None,
                    started_at: None,
                });
                self.list.len() - 1
            }
        };
        let sub = &mut self.list[pos];
        sub.updated = *ts;
        sub
    }

    fn clear(&mut self) {
        self.list.clear();
        self.index.clear();
    }

    /// `from` takes the id `to`, keeping its place and status; when `to` is already recorded,
    /// `from` goes (the newer record of the address wins). Nothing happens if `from` is unknown.
    fn rename(&mut self, from: &str, to: &str, ts: &Timestamp) {
        let Some(pos) = self.index.remove(from) else { return };
        if self.index.contains_key(to) {
            self.list.remove(pos);
            self.index = self.list.iter().enumerate().map(|(i, s)| (s.id.clone(), i)).collect();
            return;
        }
        let sub = &mut self.list[pos];
        sub.id = to.to_string();
        sub.updated = *ts;
        self.index.insert(to.to_string(), pos);
    }
}

impl From<Vec<SubChangeState>> for SubChanges {
    fn from(list: Vec<SubChangeState>) -> SubChanges {
        let index = list.iter().enumerate().map(|(i, s)| (s.id.clone(), i)).collect();
        SubChanges { list, index }
    }
}

impl std::ops::Deref for SubChanges {
    type Target = [SubChangeState];
    fn deref(&self) -> &[SubChangeState] {
        &self.list
    }
}

impl PartialEq for SubChanges {
    fn eq(&self, other: &SubChanges) -> bool {
        // The index is derived from the list, so equal lists have equal indexes.
        self.list == other.list
    }
}

impl Serialize for SubChanges {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.list.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SubChanges {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<SubChanges, D::Error> {
        Vec::<SubChangeState>::deserialize(deserializer).map(SubChanges::from)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepState {
    pub name: String,
    pub tool: Tool,
    pub resumable: bool,
    pub has_revert: bool,
    pub digest: String,
    pub status: StepStatus,
    pub sub_changes: SubChanges,
    pub facts: BTreeMap<String, serde_json::Value>,
    pub failure: Option<Failure>,
    pub revert_failure: Option<Failure>,
    /// How the step was reverted, when not by its own `revert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted_how: Option<String>,
    pub refused: Option<String>,
    pub warnings: Vec<String>,
    pub tool_version: Option<String>,
    pub started: Option<Timestamp>,
    pub finished: Option<Timestamp>,
    /// Order in which steps finished, for reverting newest first.
    pub done_seq: Option<u64>,
    /// Set when the step was interrupted by a signal.
    pub interrupted: bool,
    /// Under `retry:`, the attempt the step is on (or ended on), and of how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<(u32, u32)>,
    /// The failures of the earlier attempts, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_errors: Vec<String>,
    /// The outputs it produced for later steps (sensitive ones are in `sensitive_outputs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, serde_json::Value>,
    /// The names of its sensitive outputs; their values are never recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sensitive_outputs: Vec<String>,
    /// Why it was made not done after it was done (an output it consumed changed); kept once it
    /// is done again, so the report says why it was applied again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<String>,
}

impl StepState {
    fn new(h: &StepHeader) -> StepState {
        StepState {
            name: h.name.clone(),
            tool: h.tool,
            resumable: h.resumable,
            has_revert: h.has_revert,
            digest: h.digest.clone(),
            status: StepStatus::Pending,
            sub_changes: SubChanges::default(),
            facts: BTreeMap::new(),
            failure: None,
            revert_failure: None,
            reverted_how: None,
            refused: None,
            warnings: Vec::new(),
            tool_version: None,
            started: None,
            finished: None,
            done_seq: None,
            interrupted: false,
            attempt: None,
            attempt_errors: Vec::new(),
            outputs: BTreeMap::new(),
            sensitive_outputs: Vec::new(),
            stale: None,
        }
    }

    fn sub_mut(&mut self, id: &str, ts: &Timestamp) -> &mut SubChangeState {
        self.sub_changes.entry(id, ts)
    }

    /// What recovery is told about this step.
    pub fn prior(&self) -> PriorStep {
        PriorStep {
            sub_changes: self
                .sub_changes
                .iter()
                .map(|s| PriorSubChange { id: s.id.clone(), status: s.status, error: s.error.clone() })
                .collect(),
            facts: self.facts.clone(),
        }
    }

    /// Whether `up` found the whole step in place, so its tool applied nothing: its preview
    /// said so (the `in_place` fact), or every sub-change is done in place (a fleet step whose
    /// clusters were all on the release).
    pub fn all_in_place(&self) -> bool {
        self.status == StepStatus::Done
            && (self.facts.get(rdeploy_adapters::IN_PLACE_FACT) == Some(&serde_json::Value::Bool(true))
                || (!self.sub_changes.is_empty() && self.sub_changes.iter().all(|c| c.in_place)))
    }

    /// How many sub-changes were done by being found in place.
    pub fn count_in_place(&self) -> usize {
        self.sub_changes.iter().filter(|c| c.status == SubStatus::Done && c.in_place).count()
    }

    pub fn count(&self, status: SubStatus) -> usize {
        self.sub_changes.iter().filter(|s| s.status == status).count()
    }
}

/// One attempt (`up`, `recover`, `revert`) on this deploy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub run_id: String,
    pub command: String,
    pub started: Timestamp,
    pub host: String,
    pub pid: u32,
    pub stack_digest: String,
    /// The reviewed plan this run applied (`up --plan`): `FILE (sha256:DIGEST)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

/// Everything the checkpoint knows about one deploy, rebuilt from the journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Deploy {
    pub format: String,
    pub version: u32,
    /// The id of the deploy: the first run's id.
    pub deploy_id: String,
    pub stack: String,
    pub stack_file: String,
    pub stack_digest: String,
    pub runs: Vec<RunInfo>,
    pub steps: Vec<StepState>,
    pub warnings: Vec<String>,
    pub interrupted: Option<String>,
    pub state: DeployState,
    pub started: Timestamp,
    pub updated: Timestamp,
    /// The last journal record folded into this state.
    pub seq: u64,
}

impl Deploy {
    pub(crate) fn empty() -> Deploy {
        Deploy {
            format: FORMAT.into(),
            version: VERSION,
            deploy_id: String::new(),
            stack: String::new(),
            stack_file: String::new(),
            stack_digest: String::new(),
            runs: Vec::new(),
            steps: Vec::new(),
            warnings: Vec::new(),
            interrupted: None,
            state: DeployState::Partial,
            // Set by the first `run` record, which every journal starts with.
            started: Timestamp(OffsetDateTime::UNIX_EPOCH),
            updated: Timestamp(OffsetDateTime::UNIX_EPOCH),
            seq: 0,
        }
    }

    pub fn step(&self, name: &str) -> Option<&StepState> {
        self.steps.iter().find(|s| s.name == name)
    }

    fn step_mut(&mut self, name: &str) -> &mut StepState {
        let pos = self.steps.iter().position(|s| s.name == name);
        match pos {
            Some(pos) => &mut self.steps[pos],
            None => {
                // A record for a step the run header did not list: keep it rather than lose it.
                self.steps.push(StepState::new(&StepHeader {
                    name: name.to_string(),
                    tool: Tool::Shell,
                    resumable: false,
                    digest: String::new(),
                    has_revert: false,
                }));
                self.steps.last_mut().expect("just pushed")
            }
        }
    }

    /// Folds one record into the state. Pure, so replay equals live. Longer than most: one arm
    /// per kind of [`Record`], so what each record does to the state is read in one place.
    pub(crate) fn apply(&mut self, seq: u64, ts: &Timestamp, record: &Record) {
        self.seq = seq;
        self.updated = *ts;
        match record {
            Record::Run { run_id, command, stack, stack_file, stack_digest, steps, host, pid, .. } => {
                if self.deploy_id.is_empty() {
                    self.deploy_id = run_id.clone();
                    self.started = *ts;
                }
                self.stack = stack.clone();
                self.stack_file = stack_file.clone();
                self.stack_digest = stack_digest.clone();
                self.interrupted = None;
                self.runs.push(RunInfo {
                    run_id: run_id.clone(),
                    command: command.clone(),
                    started: *ts,
                    host: host.clone(),
                    pid: *pid,
                    stack_digest: stack_digest.clone(),
                    plan: None,
                });
                // Keep what is known of each step; take the new settings; order as the stack.
                let mut old = std::mem::take(&mut self.steps);
                for h in steps {
                    let mut state = match old.iter().position(|s| s.name == h.name) {
                        Some(pos) => old.remove(pos),
                        None => StepState::new(h),
                    };
                    state.resumable = h.resumable;
                    state.has_revert = h.has_revert;
                    state.digest = h.digest.clone();
                    state.tool = h.tool;
                    self.steps.push(state);
                }
            }
            Record::FromPlan { file, digest } => {
                if let Some(run) = self.runs.last_mut() {
                    run.plan = Some(format!("{file} (sha256:{digest})"));
                }
            }
            Record::StepStarted { step, tool_version, mode } => {
                let s = self.step_mut(step);
                if *mode == StepMode::Revert {
                    s.status = StepStatus::Reverting;
                } else {
                    s.status = StepStatus::Running;
                    s.failure = None;
                    s.reverted_how = None;
                    s.refused = None;
                    s.interrupted = false;
                }
                s.started = Some(*ts);
                s.finished = None;
                if tool_version.is_some() {
                    s.tool_version = tool_version.clone();
                }
                if *mode == StepMode::Apply && !s.resumable {
                    // A non-resumable step starts over: its earlier sub-changes no longer count.
                    s.sub_changes.clear();
                }
            }
            Record::Planned { step, ids } => {
                let s = self.step_mut(step);
                for id in ids {
                    s.sub_mut(id, ts).fold(SubChangeEvent::Planned);
                }
            }
            Record::SubStarted { step, id } => {
                let run = self.runs.last().map(|r| r.run_id.clone());
                let sub = self.step_mut(step).sub_mut(id, ts);
                sub.fold(SubChangeEvent::Started);
                sub.started_by = run;
                sub.started_at = Some(*ts);
            }
            Record::SubDone { step, id, note } => {
                self.step_mut(step).sub_mut(id, ts).fold(SubChangeEvent::Done { note: note.as_deref() })
            }
            Record::SubInPlace { step, id, note } => {
                self.step_mut(step).sub_mut(id, ts).fold(SubChangeEvent::InPlace { note: note.as_deref() })
            }
            Record::SubFailed { step, id, error } => {
                self.step_mut(step).sub_mut(id, ts).fold(SubChangeEvent::Failed { error })
            }
            Record::SubPending { step, id, reason } => {
                self.step_mut(step).sub_mut(id, ts).fold(SubChangeEvent::Pending { reason })
            }
            Record::SubMoved { step, from, to } => self.step_mut(step).sub_changes.rename(from, to, ts),
            // The version a tool said as its step ran (terraform's `-json` stream), when the
            // preflight did not ask for it: the step's `tool_version`, as `StepStarted` gives it.
            Record::Fact { step, key, value } if key == rdeploy_adapters::TOOL_VERSION_FACT => {
                if let Some(version) = value.as_str() {
                    self.step_mut(step).tool_version = Some(version.to_string());
                }
            }
            Record::Fact { step, key, value } => {
                self.step_mut(step).facts.insert(key.clone(), value.clone());
            }
            Record::Warning { step: Some(step), message } => self.step_mut(step).warnings.push(message.clone()),
            Record::Warning { step: None, message } => self.warnings.push(message.clone()),
            Record::Outputs { step, values, sensitive } => {
                let s = self.step_mut(step);
                for (key, value) in values {
                    s.sensitive_outputs.retain(|k| k != key);
                    s.outputs.insert(key.clone(), value.clone());
                }
                for key in sensitive {
                    s.outputs.remove(key);
                    if !s.sensitive_outputs.contains(key) {
                        s.sensitive_outputs.push(key.clone());
                    }
                }
            }
            Record::Stale { step, because } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Pending;
                s.done_seq = None;
                s.stale = Some(because.clone());
                s.warnings.push(format!("applied again: {because}"));
            }
            Record::StepDone { step } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Done;
                s.failure = None;
                s.finished = Some(*ts);
                s.done_seq = Some(seq);
            }
            Record::Attempt { step, attempt, of } => {
                let s = self.step_mut(step);
                if *attempt <= 1 {
                    s.attempt_errors.clear();
                } else if let Some(failure) = &s.failure {
                    s.attempt_errors.push(failure.summary.clone());
                }
                s.attempt = Some((*attempt, *of));
            }
            Record::StepFailed { step, failure } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Failed;
                s.interrupted = failure.interrupted;
                s.failure = Some(failure.clone());
                s.finished = Some(*ts);
            }
            Record::StepRefused { step, reason } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Refused;
                s.refused = Some(reason.clone());
                s.finished = Some(*ts);
            }
            Record::StepReverted { step, how } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Reverted;
                s.reverted_how = how.clone();
                s.revert_failure = None;
                s.sub_changes.clear();
                s.done_seq = None;
                s.finished = Some(*ts);
            }
            Record::StepRevertFailed { step, failure } => {
                let s = self.step_mut(step);
                // Stays `Reverting`: half undone is neither in place nor reverted.
                s.revert_failure = Some(failure.clone());
                s.finished = Some(*ts);
            }
            Record::Interrupted { signal } => self.interrupted = Some(signal.clone()),
            Record::Finished { state } => self.state = *state,
        }
    }

    /// A step that was running when the process died is failed-by-crash, not running.
    pub(crate) fn settle_after_load(&mut self, holder_alive: bool) {
        if holder_alive {
            return;
        }
        for s in &mut self.steps {
            if s.status == StepStatus::Running {
                s.status = StepStatus::Failed;
                s.failure.get_or_insert_with(|| {
                    Failure::new("the rdeploy process stopped while this step ran (crash or kill -9)")
                        .with_hint("`rdeploy recover` lets the tool's own state decide what is left")
                });
            }
            if s.status == StepStatus::Reverting && s.revert_failure.is_none() {
                s.revert_failure = Some(
                    Failure::new("the rdeploy process stopped while this step's revert ran (crash or kill -9)")
                        .with_hint("`rdeploy revert` runs the revert again"),
                );
            }
        }
    }
}
impl Record {
    /// The record with the run's secrets redacted from every text in it: errors, notes,
    /// reasons, warnings, failures and facts' values. Names are left as they are (steps,
    /// sub-change ids, the stack's header, enum words): they are the checkpoint's keys, and a
    /// short secret replaced inside `terraform_data.a1` would make recovery lose track of it.
    pub fn redacted(self, secrets: &crate::redact::Redactor) -> Record {
        if secrets.is_empty() {
            return self;
        }
        let r = |s: String| secrets.redact(&s);
        match self {
            Record::SubDone { step, id, note } => Record::SubDone { step, id, note: note.map(r) },
            Record::SubInPlace { step, id, note } => Record::SubInPlace { step, id, note: note.map(r) },
            Record::SubFailed { step, id, error } => Record::SubFailed { step, id, error: r(error) },
            Record::SubPending { step, id, reason } => Record::SubPending { step, id, reason: r(reason) },
            // Facts are machine values recovery reads back (terraform's lock id for `force-unlock`):
            // a short secret replaced inside one would corrupt it, so only document-length ones.
            Record::Fact { step, key, value } => Record::Fact { step, key, value: secrets.redact_json_document(value) },
            Record::Warning { step, message } => Record::Warning { step, message: r(message) },
            // Output keys are names. A plain value holding a secret was made sensitive before
            // it got here (`rdeploy_adapters::secrets::redact_event`); this is the last line.
            Record::Outputs { step, values, sensitive } => Record::Outputs {
                step,
                values: values.into_iter().map(|(k, v)| (k, secrets.redact_json(v))).collect(),
                sensitive,
            },
            Record::Stale { step, because } => Record::Stale { step, because: r(because) },
            Record::StepFailed { step, failure } => {
                Record::StepFailed { step, failure: secrets.redact_failure(failure) }
            }
            Record::StepRefused { step, reason } => Record::StepRefused { step, reason: r(reason) },
            Record::StepReverted { step, how } => Record::StepReverted { step, how: how.map(r) },
            Record::StepRevertFailed { step, failure } => {
                Record::StepRevertFailed { step, failure: secrets.redact_failure(failure) }
            }
            Record::StepStarted { step, mode, tool_version } => {
                Record::StepStarted { step, mode, tool_version: tool_version.map(r) }
            }
            // Names only (the run header, plans, starts, ends, attempts, signals, states).
            other @ (Record::Run { .. }
            | Record::FromPlan { .. }
            | Record::Planned { .. }
            | Record::SubStarted { .. }
            | Record::SubMoved { .. }
            | Record::StepDone { .. }
            | Record::Attempt { .. }
            | Record::Interrupted { .. }
            | Record::Finished { .. }) => other,
        }
    }

    /// Whether the record must be durable before the caller goes on.
    ///
    /// A sub-change's start must be durable before it runs: after a crash it is "uncertain"
    /// and its `check` (or the tool's state) decides. Its end only has to be durable before the
    /// next thing is believed, so it rides on the next synced record (group commit): one fsync
    /// per sub-change instead of two. The write itself happens at once, so a killed rdeploy
    /// loses nothing; only an OS crash in that window can make a finished sub-change look
    /// uncertain, which recovery already handles.
    pub(crate) fn needs_sync(&self) -> bool {
        !matches!(
            self,
            Record::SubDone { .. }
                | Record::SubInPlace { .. }
                | Record::SubFailed { .. }
                | Record::SubPending { .. }
                | Record::Planned { .. }
                | Record::Fact { .. }
                | Record::Warning { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::journal::Checkpoint;
    use crate::store::Store;

    fn header(name: &str) -> StepHeader {
        StepHeader { name: name.into(), tool: Tool::Shell, resumable: true, digest: "d".into(), has_revert: false }
    }

    fn run(steps: &[&str]) -> Record {
        Record::Run {
            run_id: "r1".into(),
            command: "up".into(),
            stack: "s".into(),
            stack_file: "stack.yaml".into(),
            stack_digest: "x".into(),
            steps: steps.iter().map(|s| header(s)).collect(),
            host: "h".into(),
            pid: 1,
            rdeploy_version: "0".into(),
        }
    }

    use std::fs::OpenOptions;
    use std::io::Write;

    #[test]
    fn timestamps_are_typed_and_written_as_the_rfc3339_text_they_were_read_from() {
        for text in ["2026-12-01T08:00:55Z", "2026-12-01T08:00:55.5Z", "2026-12-01T08:00:55.123456789Z"] {
            let ts = Timestamp::parse(text).unwrap();
            assert_eq!(ts.to_string(), text);
            assert_eq!(serde_json::to_string(&ts).unwrap(), format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<Timestamp>(&format!("\"{text}\"")).unwrap(), ts);
        }
        // `now()` reads as the string the checkpoint used to store.
        let now = now();
        assert_eq!(now.to_string(), now.0.format(&Rfc3339).unwrap());
        let later = Timestamp::parse("2026-12-01T08:00:56.5Z").unwrap();
        assert_eq!(later.seconds_since(Timestamp::parse("2026-12-01T08:00:55Z").unwrap()), 1.5);
        assert!(Timestamp::parse("not-a-date").is_err());
    }

    #[test]
    fn sub_changes_compare_and_serialize_as_their_list_and_index_after_loading() {
        let t = |text: &str| Timestamp::parse(text).unwrap();
        let (t1, t2) = (t("2026-12-01T08:00:00Z"), t("2026-12-01T08:00:01.5Z"));
        let mut subs = SubChanges::default();
        subs.entry("a", &t1).status = SubStatus::Done;
        subs.entry("b", &t1);
        let json = serde_json::to_value(&subs).unwrap();
        assert_eq!(json, serde_json::to_value(&subs.list).unwrap(), "the JSON is the plain list");
        let mut loaded: SubChanges = serde_json::from_value(json).unwrap();
        assert_eq!(loaded, subs);
        // The loaded list is indexed: an id it holds is found, not appended again.
        loaded.entry("a", &t2).status = SubStatus::Failed;
        assert_eq!(loaded.len(), 2);
        assert_eq!((loaded[0].status, loaded[0].updated), (SubStatus::Failed, t2));
        assert_ne!(loaded, subs, "a different list is a different value");
        loaded.clear();
        loaded.entry("c", &t2);
        assert_eq!(loaded.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["c"]);
    }

    #[test]
    fn a_started_sub_change_names_the_run_that_started_it() {
        let t = now();
        let mut deploy = Deploy::empty();
        deploy.apply(1, &t, &run(&["app"]));
        deploy.apply(2, &t, &Record::SubStarted { step: "app".into(), id: "web@2".into() });
        let second = Record::Run {
            run_id: "r2".into(),
            command: "recover".into(),
            stack: "s".into(),
            stack_file: "stack.yaml".into(),
            stack_digest: "x".into(),
            steps: vec![header("app")],
            host: "h".into(),
            pid: 2,
            rdeploy_version: "0".into(),
        };
        deploy.apply(3, &t, &second);
        deploy.apply(4, &t, &Record::SubStarted { step: "app".into(), id: "web@3".into() });
        let subs = &deploy.step("app").unwrap().sub_changes;
        assert_eq!(subs[0].started_by.as_deref(), Some("r1"), "kept across the next run's header");
        assert_eq!(subs[1].started_by.as_deref(), Some("r2"));
        // The start record's time is kept when a later record (a refused recover's failure)
        // moves `updated` on.
        let later = Timestamp(t.0 + time::Duration::seconds(5));
        deploy.apply(5, &later, &Record::SubFailed { step: "app".into(), id: "web@2".into(), error: "x".into() });
        let subs = &deploy.step("app").unwrap().sub_changes;
        assert_eq!((subs[0].started_at, subs[0].updated), (Some(t), later));
        assert_eq!(subs[0].started_by.as_deref(), Some("r1"));
        // It survives the snapshot's JSON, and an older snapshot without it reads as unknown.
        let json = serde_json::to_value(&deploy).unwrap();
        assert_eq!(serde_json::from_value::<Deploy>(json).unwrap(), deploy);
        let mut old = serde_json::to_value(&subs[0]).unwrap();
        old.as_object_mut().unwrap().remove("started_by");
        assert_eq!(serde_json::from_value::<SubChangeState>(old).unwrap().started_by, None);
    }

    use crate::store::local::LocalStore;

    #[test]
    fn journal_replays_to_the_live_state_and_survives_a_torn_line() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LocalStore::at_path(tmp.path().join(".rdeploy"));
        let mut cp = Checkpoint::create(&dir, &Default::default()).unwrap();
        cp.record(run(&["seed"])).unwrap();
        cp.record(Record::StepStarted { step: "seed".into(), mode: StepMode::Apply, tool_version: None }).unwrap();
        cp.record(Record::Planned { step: "seed".into(), ids: vec!["a".into(), "b".into()] }).unwrap();
        cp.record(Record::SubStarted { step: "seed".into(), id: "a".into() }).unwrap();
        cp.record(Record::SubDone { step: "seed".into(), id: "a".into(), note: None }).unwrap();
        cp.snapshot().unwrap();
        cp.record(Record::SubStarted { step: "seed".into(), id: "b".into() }).unwrap();
        let live = cp.deploy().clone();
        drop(cp);

        // A crash mid-append leaves half a line.
        let mut f = OpenOptions::new().append(true).open(dir.dir().journal_path()).unwrap();
        f.write_all(b"{\"seq\":7,\"ts\":\"x\",\"type\":\"sub_do").unwrap();
        drop(f);

        let loaded = dir.load_unfinished().unwrap().unwrap();
        assert_eq!(loaded, live);
        let seed = loaded.step("seed").unwrap();
        assert_eq!(seed.sub_changes[0].status, SubStatus::Done);
        assert_eq!(seed.sub_changes[1].status, SubStatus::Started);

        // Reopening for writing drops the torn line and goes on from the right sequence.
        let mut cp = Checkpoint::resume(&dir, &Default::default()).unwrap();
        assert_eq!(cp.deploy().step("seed").unwrap().status, StepStatus::Failed, "a dead run's step is failed");
        cp.record(Record::SubDone { step: "seed".into(), id: "b".into(), note: None }).unwrap();
        let text = fs_err::read_to_string(dir.dir().journal_path()).unwrap();
        assert!(text.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
        assert_eq!(dir.load_unfinished().unwrap().unwrap().seq, 7);
    }

    #[test]
    fn the_adapters_test_recorder_folds_events_as_the_journal_does() {
        use rdeploy_adapters::testing::Recorder;
        use rdeploy_adapters::{Event, EventSink};
        let events = vec![
            Event::Planned { ids: vec!["a".into(), "b".into(), "c".into()] },
            Event::Started { id: "a".into() },
            Event::Done { id: "a".into(), note: Some("made".into()) },
            Event::Started { id: "b".into() },
            Event::Failed { id: "b".into(), error: "boom".into() },
            // A failed sub-change put back to pending keeps its error, in both.
            Event::Pending { id: "b".into(), reason: "retry later".into() },
            Event::Fact { key: "k".into(), value: serde_json::json!(1) },
            Event::Started { id: "d".into() },
            // terraform `moved`: b becomes e (status kept, place kept); c onto d drops c.
            Event::Moved { from: "b".into(), to: "e".into() },
            Event::Moved { from: "c".into(), to: "d".into() },
            Event::Moved { from: "nowhere".into(), to: "f".into() },
        ];
        let recorder = Recorder::default();
        let t = Timestamp::parse("2026-12-01T08:00:00Z").unwrap();
        let mut deploy = Deploy::empty();
        deploy.apply(1, &t, &run(&["seed"]));
        for (i, event) in events.into_iter().enumerate() {
            let step = "seed".to_string();
            let record = match event.clone() {
                Event::Planned { ids } => Record::Planned { step, ids },
                Event::Started { id } => Record::SubStarted { step, id },
                Event::Done { id, note } => Record::SubDone { step, id, note },
                Event::InPlace { id, note } => Record::SubInPlace { step, id, note },
                Event::Failed { id, error } => Record::SubFailed { step, id, error },
                Event::Pending { id, reason } => Record::SubPending { step, id, reason },
                Event::Fact { key, value } => Record::Fact { step, key, value },
                Event::Moved { from, to } => Record::SubMoved { step, from, to },
                _ => unreachable!(),
            };
            deploy.apply(i as u64 + 2, &t, &record);
            recorder.emit(event);
        }
        assert_eq!(recorder.prior(), deploy.step("seed").unwrap().prior());
        let prior = deploy.step("seed").unwrap().prior();
        let ids: Vec<&str> = prior.sub_changes.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["a", "e", "d"]);
        assert_eq!(prior.sub_changes[1].error.as_deref(), Some("boom"), "the moved sub-change kept its record");
    }

    #[test]
    fn finish_archives_and_clears() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LocalStore::at_path(tmp.path().join(".rdeploy"));
        let mut cp = Checkpoint::create(&dir, &Default::default()).unwrap();
        cp.record(run(&["a"])).unwrap();
        cp.record(Record::StepDone { step: "a".into() }).unwrap();
        let deploy = cp.finish(DeployState::Complete).unwrap();
        assert!(!dir.has_unfinished().unwrap());
        assert_eq!(dir.last_finished().unwrap().unwrap(), deploy);
        assert_eq!(deploy.state, DeployState::Complete);
    }

    #[test]
    fn a_newer_format_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LocalStore::at_path(tmp.path());
        fs_err::write(
            dir.dir().journal_path(),
            "{\"format\":\"rdeploy-checkpoint\",\"version\":99,\"created\":\"x\"}\n",
        )
        .unwrap();
        let err = dir.load_unfinished().unwrap_err().to_string();
        assert!(err.contains("version 99 is not supported"), "{err}");
    }
}

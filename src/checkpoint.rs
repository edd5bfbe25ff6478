//! The checkpoint: an append-only, fsynced journal of what each step and sub-change did, a
//! snapshot rewritten atomically at step boundaries, and the history of finished deploys.
//!
//! Layout of the state directory:
//! - `journal.jsonl`: one JSON record per line, the first a header with the format version.
//!   A record is durable (fdatasync) before `record` returns, so a sub-change is known as
//!   started before it runs and as done before the next one starts.
//! - `snapshot.json`: the [`Deploy`] state up to a sequence number, so loading does not replay
//!   a long journal; records after it are replayed on top.
//! - `history/<run-id>.json`: the final state of each finished deploy (complete or reverted).
//! - `steps/<step>/`: adapters' scratch files; `logs/<step>.log`: the tools' output.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rdeploy_adapters::{Failure, PriorStep, PriorSubChange, SubStatus, Tool};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::stack::Stack;

pub const FORMAT: &str = "rdeploy-checkpoint";
pub const VERSION: u32 = 1;
const JOURNAL: &str = "journal.jsonl";
const SNAPSHOT: &str = "snapshot.json";
const HISTORY: &str = "history";

/// Now, as an RFC 3339 UTC timestamp.
pub fn now() -> String {
    OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
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
    StepStarted { step: String, mode: StepMode, tool_version: Option<String> },
    Planned { step: String, ids: Vec<String> },
    SubStarted { step: String, id: String },
    SubDone { step: String, id: String, note: Option<String> },
    SubFailed { step: String, id: String, error: String },
    SubPending { step: String, id: String, reason: String },
    Fact { step: String, key: String, value: serde_json::Value },
    Warning { step: Option<String>, message: String },
    StepDone { step: String },
    StepFailed { step: String, failure: Failure },
    /// A gate refused the step; it did not run.
    StepRefused { step: String, reason: String },
    StepReverted { step: String },
    StepRevertFailed { step: String, failure: Failure },
    Interrupted { signal: String },
    /// The deploy is over: complete, or reverted.
    Finished { state: DeployState },
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Entry {
    seq: u64,
    ts: String,
    #[serde(flatten)]
    record: Record,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    created: String,
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
    Skipped,
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
            StepStatus::Skipped => "skipped",
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
    pub updated: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepState {
    pub name: String,
    pub tool: Tool,
    pub resumable: bool,
    pub has_revert: bool,
    pub digest: String,
    pub status: StepStatus,
    pub sub_changes: Vec<SubChangeState>,
    pub facts: BTreeMap<String, serde_json::Value>,
    pub failure: Option<Failure>,
    pub revert_failure: Option<Failure>,
    pub refused: Option<String>,
    pub warnings: Vec<String>,
    pub tool_version: Option<String>,
    pub started: Option<String>,
    pub finished: Option<String>,
    /// Order in which steps finished, for reverting newest first.
    pub done_seq: Option<u64>,
    /// Set when the step was interrupted by a signal.
    pub interrupted: bool,
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
            sub_changes: Vec::new(),
            facts: BTreeMap::new(),
            failure: None,
            revert_failure: None,
            refused: None,
            warnings: Vec::new(),
            tool_version: None,
            started: None,
            finished: None,
            done_seq: None,
            interrupted: false,
        }
    }

    fn sub_mut(&mut self, id: &str, ts: &str) -> &mut SubChangeState {
        let pos = match self.sub_changes.iter().position(|s| s.id == id) {
            Some(pos) => pos,
            None => {
                self.sub_changes.push(SubChangeState {
                    id: id.to_string(),
                    status: SubStatus::Pending,
                    error: None,
                    note: None,
                    updated: ts.to_string(),
                });
                self.sub_changes.len() - 1
            }
        };
        let sub = &mut self.sub_changes[pos];
        sub.updated = ts.to_string();
        sub
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

    pub fn count(&self, status: SubStatus) -> usize {
        self.sub_changes.iter().filter(|s| s.status == status).count()
    }
}

/// One attempt (`up`, `recover`, `revert`) on this deploy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub run_id: String,
    pub command: String,
    pub started: String,
    pub host: String,
    pub pid: u32,
    pub stack_digest: String,
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
    pub started: String,
    pub updated: String,
    /// The last journal record folded into this state.
    pub seq: u64,
}

impl Deploy {
    fn empty() -> Deploy {
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
            started: String::new(),
            updated: String::new(),
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

    /// Folds one record into the state. Pure, so replay equals live.
    fn apply(&mut self, seq: u64, ts: &str, record: &Record) {
        self.seq = seq;
        self.updated = ts.to_string();
        match record {
            Record::Run { run_id, command, stack, stack_file, stack_digest, steps, host, pid, .. } => {
                if self.deploy_id.is_empty() {
                    self.deploy_id = run_id.clone();
                    self.started = ts.to_string();
                }
                self.stack = stack.clone();
                self.stack_file = stack_file.clone();
                self.stack_digest = stack_digest.clone();
                self.interrupted = None;
                self.runs.push(RunInfo {
                    run_id: run_id.clone(),
                    command: command.clone(),
                    started: ts.to_string(),
                    host: host.clone(),
                    pid: *pid,
                    stack_digest: stack_digest.clone(),
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
            Record::StepStarted { step, tool_version, mode } => {
                let s = self.step_mut(step);
                if *mode != StepMode::Revert {
                    s.status = StepStatus::Running;
                    s.failure = None;
                    s.refused = None;
                    s.interrupted = false;
                }
                s.started = Some(ts.to_string());
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
                    s.sub_mut(id, ts);
                }
            }
            Record::SubStarted { step, id } => {
                let sub = self.step_mut(step).sub_mut(id, ts);
                sub.status = SubStatus::Started;
                sub.error = None;
            }
            Record::SubDone { step, id, note } => {
                let sub = self.step_mut(step).sub_mut(id, ts);
                sub.status = SubStatus::Done;
                sub.error = None;
                sub.note = note.clone();
            }
            Record::SubFailed { step, id, error } => {
                let sub = self.step_mut(step).sub_mut(id, ts);
                sub.status = SubStatus::Failed;
                sub.error = Some(error.clone());
            }
            Record::SubPending { step, id, reason } => {
                let sub = self.step_mut(step).sub_mut(id, ts);
                sub.status = SubStatus::Pending;
                sub.note = Some(reason.clone());
            }
            Record::Fact { step, key, value } => {
                self.step_mut(step).facts.insert(key.clone(), value.clone());
            }
            Record::Warning { step: Some(step), message } => self.step_mut(step).warnings.push(message.clone()),
            Record::Warning { step: None, message } => self.warnings.push(message.clone()),
            Record::StepDone { step } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Done;
                s.failure = None;
                s.finished = Some(ts.to_string());
                s.done_seq = Some(seq);
            }
            Record::StepFailed { step, failure } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Failed;
                s.interrupted = failure.interrupted;
                s.failure = Some(failure.clone());
                s.finished = Some(ts.to_string());
            }
            Record::StepRefused { step, reason } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Refused;
                s.refused = Some(reason.clone());
                s.finished = Some(ts.to_string());
            }
            Record::StepReverted { step } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Reverted;
                s.revert_failure = None;
                s.sub_changes.clear();
                s.done_seq = None;
                s.finished = Some(ts.to_string());
            }
            Record::StepRevertFailed { step, failure } => {
                let s = self.step_mut(step);
                s.revert_failure = Some(failure.clone());
                s.finished = Some(ts.to_string());
            }
            Record::Interrupted { signal } => self.interrupted = Some(signal.clone()),
            Record::Finished { state } => self.state = *state,
        }
    }

    /// A step that was running when the process died is failed-by-crash, not running.
    fn settle_after_load(&mut self, holder_alive: bool) {
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
        }
    }
}

/// Where the checkpoint of a stack lives and how to read it.
#[derive(Clone, Debug)]
pub struct StateDir {
    pub path: PathBuf,
}

impl StateDir {
    pub fn new(path: impl Into<PathBuf>) -> StateDir {
        StateDir { path: path.into() }
    }

    pub fn journal_path(&self) -> PathBuf {
        self.path.join(JOURNAL)
    }

    pub fn snapshot_path(&self) -> PathBuf {
        self.path.join(SNAPSHOT)
    }

    pub fn report_path(&self) -> PathBuf {
        self.path.join("report.md")
    }

    pub fn step_dir(&self, step: &str) -> PathBuf {
        self.path.join("steps").join(step)
    }

    pub fn log_path(&self, step: &str) -> PathBuf {
        self.path.join("logs").join(format!("{step}.log"))
    }

    pub fn history_dir(&self) -> PathBuf {
        self.path.join(HISTORY)
    }

    /// Whether an unfinished deploy is recorded.
    pub fn has_unfinished(&self) -> bool {
        self.journal_path().exists()
    }

    /// Reads the unfinished deploy, if there is one (read-only: never truncates or locks).
    pub fn load_unfinished(&self) -> anyhow::Result<Option<Deploy>> {
        if !self.has_unfinished() {
            return Ok(None);
        }
        let (deploy, _) = read_journal(&self.journal_path(), self.read_snapshot()?)?;
        Ok(Some(deploy))
    }

    /// Like `load_unfinished`, then marks steps a dead process left running as failed.
    pub fn load_settled(&self, holder_alive: bool) -> anyhow::Result<Option<Deploy>> {
        Ok(self.load_unfinished()?.map(|mut d| {
            d.settle_after_load(holder_alive);
            d
        }))
    }

    /// The most recent finished deploy, from history.
    pub fn last_finished(&self) -> anyhow::Result<Option<Deploy>> {
        let dir = self.history_dir();
        if !dir.exists() {
            return Ok(None);
        }
        let mut newest: Option<(String, PathBuf)> = None;
        for entry in fs_err::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json") {
                let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
                if newest.as_ref().is_none_or(|(n, _)| name > *n) {
                    newest = Some((name, path));
                }
            }
        }
        match newest {
            Some((_, path)) => {
                let text = fs_err::read_to_string(&path)?;
                Ok(Some(serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?))
            }
            None => Ok(None),
        }
    }

    fn read_snapshot(&self) -> anyhow::Result<Option<Deploy>> {
        let path = self.snapshot_path();
        if !path.exists() {
            return Ok(None);
        }
        let text = fs_err::read_to_string(&path)?;
        match serde_json::from_str::<Deploy>(&text) {
            Ok(d) if d.version == VERSION => Ok(Some(d)),
            // A snapshot is only a cache of the journal: when it is unreadable, replay all.
            _ => Ok(None),
        }
    }

    /// Forgets the unfinished deploy, keeping its final state in history.
    pub fn archive(&self, deploy: &Deploy) -> anyhow::Result<()> {
        let history = self.history_dir();
        fs_err::create_dir_all(&history)?;
        let stamp = deploy.updated.replace([':', '-'], "");
        let name = format!("{stamp}-{}.json", deploy.deploy_id);
        write_atomic(&history.join(name), serde_json::to_string_pretty(deploy)?.as_bytes())?;
        for path in [self.journal_path(), self.snapshot_path()] {
            if path.exists() {
                fs_err::remove_file(&path)?;
            }
        }
        let steps = self.path.join("steps");
        if steps.exists() {
            fs_err::remove_dir_all(&steps)?;
        }
        sync_dir(&self.path)?;
        Ok(())
    }
}

/// Replays the journal on top of a snapshot. Returns the state and the byte length of the
/// complete records (a torn last line from a crash mid-write is ignored).
fn read_journal(path: &Path, snapshot: Option<Deploy>) -> anyhow::Result<(Deploy, u64)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = BufReader::new(file);
    let mut line = String::new();
    let mut good_len = 0u64;
    let mut deploy = snapshot.unwrap_or_else(Deploy::empty);
    let from_seq = deploy.seq;
    let mut first = true;
    let mut line_no = 0;
    loop {
        line.clear();
        let n = reader.read_line(&mut line).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if !line.ends_with('\n') {
            // Torn write: the process died mid-append. The record was never acknowledged.
            break;
        }
        if first {
            first = false;
            let header: Header = serde_json::from_str(&line)
                .with_context(|| format!("{}:1: not an rdeploy journal header", path.display()))?;
            if header.format != FORMAT || header.version != VERSION {
                anyhow::bail!(
                    "{}: journal format {} version {} is not supported by this rdeploy (wants {FORMAT} {VERSION})",
                    path.display(),
                    header.format,
                    header.version
                );
            }
            good_len += n as u64;
            continue;
        }
        let entry: Entry = match serde_json::from_str(&line) {
            Ok(entry) => entry,
            Err(e) => anyhow::bail!("{}:{line_no}: unreadable journal record: {e}", path.display()),
        };
        good_len += n as u64;
        if entry.seq > from_seq {
            deploy.apply(entry.seq, &entry.ts, &entry.record);
        }
    }
    Ok((deploy, good_len))
}

/// An open checkpoint that records one deploy. Owned by the process holding the lock.
pub struct Checkpoint {
    dir: StateDir,
    journal: File,
    deploy: Deploy,
    /// Records written but not yet fsynced (see [`Record::needs_sync`]).
    unsynced: bool,
}

impl Record {
    /// Whether the record must be on disk before the caller goes on.
    ///
    /// A sub-change's start must be durable before it runs: after a crash it is "uncertain"
    /// and its `check` (or the tool's state) decides. Its end only has to be durable before the
    /// next thing is believed, so it rides on the next synced record (group commit): one fsync
    /// per sub-change instead of two. The write itself happens at once, so a killed rdeploy
    /// loses nothing; only an OS crash in that window can make a finished sub-change look
    /// uncertain, which recovery already handles.
    fn needs_sync(&self) -> bool {
        !matches!(
            self,
            Record::SubDone { .. }
                | Record::SubFailed { .. }
                | Record::SubPending { .. }
                | Record::Planned { .. }
                | Record::Fact { .. }
                | Record::Warning { .. }
        )
    }
}

impl Checkpoint {
    /// Starts a new deploy's journal (the caller checked there is no unfinished one).
    pub fn create(dir: &StateDir) -> anyhow::Result<Checkpoint> {
        fs_err::create_dir_all(&dir.path)?;
        let path = dir.journal_path();
        let mut journal = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let header = Header { format: FORMAT.into(), version: VERSION, created: now() };
        writeln!(journal, "{}", serde_json::to_string(&header)?)?;
        journal.sync_all()?;
        sync_dir(&dir.path)?;
        // A stale snapshot of an archived deploy must not be read with the new journal.
        let _ = fs_err::remove_file(dir.snapshot_path());
        Ok(Checkpoint { dir: dir.clone(), journal, deploy: Deploy::empty(), unsynced: false })
    }

    /// Opens the unfinished deploy for more records; drops a torn last line.
    pub fn open(dir: &StateDir, holder_alive: bool) -> anyhow::Result<Checkpoint> {
        let path = dir.journal_path();
        let (mut deploy, good_len) = read_journal(&path, dir.read_snapshot()?)?;
        deploy.settle_after_load(holder_alive);
        let mut journal = OpenOptions::new().append(true).open(&path).with_context(|| format!("opening {}", path.display()))?;
        if journal.metadata()?.len() != good_len {
            journal.set_len(good_len)?;
            journal.seek(SeekFrom::End(0))?;
            journal.sync_all()?;
        }
        Ok(Checkpoint { dir: dir.clone(), journal, deploy, unsynced: false })
    }

    pub fn deploy(&self) -> &Deploy {
        &self.deploy
    }

    pub fn dir(&self) -> &StateDir {
        &self.dir
    }

    /// Appends a record and makes it durable before returning; then folds it into the state.
    pub fn record(&mut self, record: Record) -> anyhow::Result<()> {
        let seq = self.deploy.seq + 1;
        let ts = now();
        let entry = Entry { seq, ts, record };
        let mut line = serde_json::to_vec(&entry)?;
        line.push(b'\n');
        // One write call per record: a crash leaves a whole line or a torn last line.
        self.journal.write_all(&line).context("writing the checkpoint journal")?;
        if entry.record.needs_sync() {
            self.sync()?;
        } else {
            self.unsynced = true;
        }
        self.deploy.apply(entry.seq, &entry.ts, &entry.record);
        Ok(())
    }

    /// Makes every record written so far durable.
    pub fn sync(&mut self) -> anyhow::Result<()> {
        self.journal.sync_data().context("syncing the checkpoint journal")?;
        self.unsynced = false;
        Ok(())
    }

    /// Rewrites the snapshot atomically (temp file, fsync, rename, fsync the directory).
    pub fn snapshot(&mut self) -> anyhow::Result<()> {
        if self.unsynced {
            self.sync()?;
        }
        write_atomic(&self.dir.snapshot_path(), serde_json::to_string(&self.deploy)?.as_bytes())
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
            host: crate::lock::hostname(),
            pid: std::process::id(),
            rdeploy_version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// Ends the deploy: its state goes to history and the journal is removed.
    pub fn finish(mut self, state: DeployState) -> anyhow::Result<Deploy> {
        self.record(Record::Finished { state })?;
        self.dir.archive(&self.deploy)?;
        Ok(self.deploy.clone())
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        if self.unsynced {
            let _ = self.journal.sync_data();
        }
    }
}

/// Writes a file so that readers see the old or the new content, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.tmp", path.file_name().unwrap_or_default().to_string_lossy()));
    {
        let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs_err::rename(&tmp, path)?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing directory {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn journal_replays_to_the_live_state_and_survives_a_torn_line() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path().join(".rdeploy"));
        let mut cp = Checkpoint::create(&dir).unwrap();
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
        let mut f = OpenOptions::new().append(true).open(dir.journal_path()).unwrap();
        f.write_all(b"{\"seq\":7,\"ts\":\"x\",\"type\":\"sub_do").unwrap();
        drop(f);

        let loaded = dir.load_unfinished().unwrap().unwrap();
        assert_eq!(loaded, live);
        let seed = loaded.step("seed").unwrap();
        assert_eq!(seed.sub_changes[0].status, SubStatus::Done);
        assert_eq!(seed.sub_changes[1].status, SubStatus::Started);

        // Reopening for writing drops the torn line and goes on from the right sequence.
        let mut cp = Checkpoint::open(&dir, false).unwrap();
        assert_eq!(cp.deploy().step("seed").unwrap().status, StepStatus::Failed, "a dead run's step is failed");
        cp.record(Record::SubDone { step: "seed".into(), id: "b".into(), note: None }).unwrap();
        let text = fs_err::read_to_string(dir.journal_path()).unwrap();
        assert!(text.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
        assert_eq!(dir.load_unfinished().unwrap().unwrap().seq, 7);
    }

    #[test]
    fn finish_archives_and_clears() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path().join(".rdeploy"));
        let mut cp = Checkpoint::create(&dir).unwrap();
        cp.record(run(&["a"])).unwrap();
        cp.record(Record::StepDone { step: "a".into() }).unwrap();
        let deploy = cp.finish(DeployState::Complete).unwrap();
        assert!(!dir.has_unfinished());
        assert_eq!(dir.last_finished().unwrap().unwrap(), deploy);
        assert_eq!(deploy.state, DeployState::Complete);
    }

    #[test]
    fn a_newer_format_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::new(tmp.path());
        fs_err::write(dir.journal_path(), "{\"format\":\"rdeploy-checkpoint\",\"version\":99,\"created\":\"x\"}\n").unwrap();
        let err = dir.load_unfinished().unwrap_err().to_string();
        assert!(err.contains("version 99 is not supported"), "{err}");
    }
}

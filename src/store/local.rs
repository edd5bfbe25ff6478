//! The local store: a deploy's checkpoint in the state directory beside the stack.
//!
//! Layout:
//! - `journal.jsonl`: one JSON record per line, the first a header with the format version.
//!   Each record is one `write` (a kill leaves whole lines, or a torn last line that is
//!   ignored and trimmed); `sync` is fdatasync.
//! - `snapshot.json`: the [`Deploy`] state up to a sequence number, rewritten atomically at
//!   step boundaries, so loading does not replay a long journal; later records replay on top.
//! - `history/<time>-<deploy>.json`: the final state of each finished deploy.
//! - `lock`: flock'ed by the running process, naming it.
//! - `steps/<step>/`: adapters' scratch files; `logs/<step>.log`: the tools' output;
//!   `report.md`: the last partial-state report.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::{JournalWriter, LockGuard, Store};
use crate::checkpoint::{now, Deploy, Entry, Record, FORMAT, VERSION};
use crate::lock::{Holder, Lock, LockError};

const JOURNAL: &str = "journal.jsonl";
const SNAPSHOT: &str = "snapshot.json";
const HISTORY: &str = "history";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    created: String,
}

/// The state directory of a stack: its local checkpoint store, and the scratch files every
/// store needs on the machine that runs the tools (logs, adapters' work dirs, the report).
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
    fn journal_exists(&self) -> bool {
        self.journal_path().exists()
    }

    /// Reads the unfinished deploy, if there is one (read-only: never truncates or locks).
    fn read_unfinished(&self) -> anyhow::Result<Option<Deploy>> {
        if !self.journal_exists() {
            return Ok(None);
        }
        let (deploy, _) = read_journal(&self.journal_path(), self.read_snapshot()?)?;
        Ok(Some(deploy))
    }

    /// The most recent finished deploy, from history.
    fn read_last_finished(&self) -> anyhow::Result<Option<Deploy>> {
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
    fn archive(&self, deploy: &Deploy) -> anyhow::Result<()> {
        let history = self.history_dir();
        fs_err::create_dir_all(&history)?;
        let stamp = deploy.updated.to_string().replace([':', '-'], "");
        let name = format!("{stamp}-{}.json", deploy.deploy_id);
        write_atomic(&history.join(name), serde_json::to_string_pretty(deploy)?.as_bytes())?;
        // The snapshot goes first: a snapshot must never outlive its journal (see read_journal).
        for path in [self.snapshot_path(), self.journal_path()] {
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
    let mut from_seq = deploy.seq;
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
        if let (1, Record::Run { run_id, .. }) = (entry.seq, &entry.record) {
            if from_seq > 0 && deploy.deploy_id != *run_id {
                // The snapshot belongs to another deploy (a crash between archiving one deploy
                // and starting the next): it is only a cache, so replay this journal from scratch.
                deploy = Deploy::empty();
                from_seq = 0;
            }
        }
        if entry.seq > from_seq {
            deploy.apply(entry.seq, &entry.ts, &entry.record);
        }
    }
    Ok((deploy, good_len))
}

impl Store for StateDir {
    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn lock(&self, command: &str) -> Result<Box<dyn LockGuard>, LockError> {
        Ok(Box::new(Lock::acquire(&self.path, command)?))
    }

    fn holder(&self) -> Option<Holder> {
        Lock::current_holder(&self.path)
    }

    fn load_unfinished(&self) -> anyhow::Result<Option<Deploy>> {
        self.read_unfinished()
    }

    fn last_finished(&self) -> anyhow::Result<Option<Deploy>> {
        self.read_last_finished()
    }

    fn has_unfinished(&self) -> anyhow::Result<bool> {
        Ok(self.journal_exists())
    }

    fn create_journal(&self) -> anyhow::Result<Box<dyn JournalWriter>> {
        fs_err::create_dir_all(&self.path)?;
        // A snapshot left by an earlier deploy must not be read with the new journal.
        match fs_err::remove_file(self.snapshot_path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let path = self.journal_path();
        let mut file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let header = Header { format: FORMAT.into(), version: VERSION, created: now().to_string() };
        writeln!(file, "{}", serde_json::to_string(&header)?)?;
        file.sync_all()?;
        sync_dir(&self.path)?;
        Ok(Box::new(LocalJournal { dir: self.clone(), file }))
    }

    fn open_journal(&self) -> anyhow::Result<(Box<dyn JournalWriter>, Deploy)> {
        let path = self.journal_path();
        let (deploy, good_len) = read_journal(&path, self.read_snapshot()?)?;
        let mut file =
            OpenOptions::new().append(true).open(&path).with_context(|| format!("opening {}", path.display()))?;
        if file.metadata()?.len() != good_len {
            // Drop the torn last line a crash left, so the next record starts on its own line.
            file.set_len(good_len)?;
            file.seek(SeekFrom::End(0))?;
            file.sync_all()?;
        }
        Ok((Box::new(LocalJournal { dir: self.clone(), file }), deploy))
    }
}

impl LockGuard for Lock {
    fn took_over_from(&self) -> Option<&Holder> {
        self.took_over_from.as_ref()
    }
}

/// The journal file of the unfinished deploy, open for appending.
struct LocalJournal {
    dir: StateDir,
    file: File,
}

impl JournalWriter for LocalJournal {
    fn append(&mut self, entry: &Entry) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(entry)?;
        line.push(b'\n');
        // One write per record: a crash leaves a whole line or a torn last line.
        self.file.write_all(&line).context("writing the checkpoint journal")
    }

    fn sync(&mut self) -> anyhow::Result<()> {
        self.file.sync_data().context("syncing the checkpoint journal")
    }

    fn snapshot(&mut self, deploy: &Deploy) -> anyhow::Result<()> {
        write_atomic(&self.dir.snapshot_path(), serde_json::to_string(deploy)?.as_bytes())
    }

    fn archive(&mut self, deploy: &Deploy) -> anyhow::Result<()> {
        self.file.sync_data()?;
        self.dir.archive(deploy)
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

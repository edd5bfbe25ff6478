//! The local store: a deploy's checkpoint in the state directory beside the stack.
//!
//! Layout (every directory 0700, every file 0600, see [`StateDir`]):
//! - `journal.jsonl`: one JSON record per line, the first a header with the format version.
//!   Each record is one `write` (a kill leaves whole lines, or a torn last line that is
//!   ignored and trimmed); `sync` is fdatasync. Before each record the journal open for
//!   writing is checked to still be the file at its path (device and inode), so a state
//!   directory deleted under a running deploy stops it instead of recording into the void.
//!   An unreadable line in the middle (garbage, NUL padding, a flipped bit) is reported with
//!   its line number and, when the journal is next opened for writing, moved to
//!   `journal.jsonl.quarantine` with a warning record saying what it leaves uncertain.
//! - `journal.seq`: how many records were written and synced, rewritten in place after each
//!   record; with the snapshot's sequence it tells a journal that lost records (shorter than
//!   the synced count: cut short, truncated; refused) from one that ended with a crash (a kill
//!   leaves every written record; an OS crash may drop the tail between the synced and the
//!   written count, which is only ends of sub-changes, so they become uncertain and recovery
//!   goes on, saying so in a warning record).
//! - `snapshot.json`: the [`Deploy`] state up to a sequence number, rewritten atomically at
//!   step boundaries, so loading does not replay a long journal; later records replay on top.
//!   A header line holds the sha256 of the JSON body and the length and sha256 of the journal
//!   it folded. The journal is the truth and the snapshot never overrides it: loading always
//!   folds every journal record (parsing each line is the cost, which a snapshot did not save),
//!   so a snapshot rewritten with its checksum recomputed changes nothing; one whose journal
//!   bytes do not match the journal's is said in a warning. What it is still for: evidence of
//!   records written (with `journal.seq`, a journal cut short is refused) and of a deploy whose
//!   journal was deleted (see `orphans`).
//! - `history/<time>-<deploy>.json`: the final state of each finished deploy.
//! - `lock`: flock'ed by the running process, naming it (see [`lock`]).
//! - `steps/<step>/`: adapters' scratch files; `logs/<step>.log`: the tools' output;
//!   `report.md`: the last partial-state report.

pub mod lock;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::state_dir::{open_private, sync_dir};
pub use super::state_dir::{write_atomic, StateDir};
use super::{Holder, JournalWriter, LockError, LockGuard, Store};
use crate::checkpoint::{now, Deploy, Entry, Record, FORMAT, VERSION};
use crate::exit::{Code, Refusal};
use lock::Lock;

const MARK: &str = "journal.seq";
const QUARANTINE: &str = "journal.jsonl.quarantine";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    created: String,
}

/// The journal open for writing is no longer the file at its path: the state directory (or
/// the journal) was deleted or replaced while this run used it.
#[derive(Debug, thiserror::Error)]
#[error("the checkpoint journal {path} was deleted or replaced while this run was using it (a cleanup job or a cache eviction?)")]
pub struct JournalGone {
    pub path: String,
}

/// A stack's checkpoint in its state directory.
#[derive(Clone, Debug)]
pub struct LocalStore {
    dir: StateDir,
}

/// What `journal.seq` says: records written and records synced, by sequence number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Mark {
    written: u64,
    synced: u64,
}

/// A line of the journal that could not be read.
struct BadLine {
    line_no: usize,
    bytes: Vec<u8>,
    /// The sequence of the last good record before it, and of the first after it.
    after: u64,
    before: Option<u64>,
    error: String,
}

/// The journal read back.
struct Replay {
    deploy: Deploy,
    entries: Vec<Entry>,
    /// Byte length of the lines up to the last complete one (a torn last line is dropped).
    good_len: u64,
    /// The last record read, by sequence.
    last_seq: u64,
    bad: Vec<BadLine>,
    /// Records known to have been synced that the journal no longer holds.
    lost: Option<(u64, u64)>,
    /// Records written but never synced that the journal does not hold: an OS crash (power
    /// loss) dropped them from the page cache. Only unsynced records can be in that tail: a
    /// sub-change's start is synced before it runs, so what they said is at worst a finished
    /// sub-change that now looks started, which recovery settles like any uncertain one.
    unsynced_tail: Option<(u64, u64)>,
    /// A snapshot was there but does not fold this journal: it was ignored.
    snapshot_ignored: bool,
}

impl LocalStore {
    pub fn new(dir: StateDir) -> LocalStore {
        LocalStore { dir }
    }

    pub fn dir(&self) -> &StateDir {
        &self.dir
    }

    fn mark_path(&self) -> PathBuf {
        self.dir.path.join(MARK)
    }

    fn read_mark(&self) -> Option<Mark> {
        let bytes = std::fs::read(self.mark_path()).ok()?;
        serde_json::from_slice(bytes.trim_ascii()).ok()
    }

    /// Whether an unfinished deploy is recorded.
    fn journal_exists(&self) -> bool {
        self.dir.journal_path().exists()
    }

    /// Whether files of a recorded deploy remain beside a missing journal (the snapshot,
    /// `journal.seq`): archiving removes both before the journal, so only a journal deleted or
    /// lost from under them leaves them.
    fn orphans(&self) -> bool {
        !self.journal_exists() && (self.dir.snapshot_path().exists() || self.mark_path().exists())
    }

    /// The refusal for a journal that is gone while its snapshot or `journal.seq` remain: a
    /// deploy was recorded here, and what it did after the snapshot is unknown.
    fn journal_missing(&self) -> anyhow::Error {
        let journal = self.dir.journal_path();
        let mut evidence = Vec::new();
        if let Some(mark) = self.read_mark() {
            evidence.push(format!("{} says {} records were written", self.mark_path().display(), mark.written));
        } else if self.mark_path().exists() {
            evidence.push(format!("{} remains (unreadable)", self.mark_path().display()));
        }
        let snapshot = self.dir.snapshot_path();
        match self.read_snapshot() {
            Some(snap) => evidence.push(format!(
                "{} (up to record {}, deploy {}) shows: {}",
                snapshot.display(),
                snap.deploy.seq,
                snap.deploy.deploy_id,
                describe_steps(&snap.deploy)
            )),
            None if snapshot.exists() => {
                evidence.push(format!("{} remains, but does not read back", snapshot.display()))
            }
            None => {}
        }
        Refusal::new(
            Code::BadInput,
            format!(
                "the checkpoint journal {} is missing, but a deploy was recorded here: {}; the journal was deleted or lost, so what the deploy did after that is unknown, and running would apply completed work again; nothing was run",
                journal.display(),
                evidence.join("; "),
            ),
        )
        .with_hint(
            "restore the state directory from a backup and run `rdeploy recover`; without one, check what each tool's own state holds against the above, then `rdeploy reset --yes` forgets this deploy (the snapshot is kept aside)",
        )
        .into()
    }

    fn replay(&self) -> anyhow::Result<Replay> {
        if self.orphans() {
            return Err(self.journal_missing());
        }
        let snapshot = self.read_snapshot();
        let snap_seq = snapshot.as_ref().map_or(0, |s| s.deploy.seq);
        let mut replay = read_journal(&self.dir.journal_path(), snapshot)?;
        // Records that were written (so acknowledged to the caller) but are gone now. The
        // mark is never synced itself, but its `synced` is only raised after the journal's
        // fdatasync returned, so it never claims more than the disk holds.
        let mark = self.read_mark().unwrap_or_default();
        let written = mark.written.max(snap_seq);
        let synced = mark.synced.min(written);
        let known = replay.known();
        if synced > known {
            replay.lost = Some((known + 1, written));
        } else if written > known {
            replay.unsynced_tail = Some((known + 1, written));
        }
        let mut warnings = self.bad_line_warnings(&replay.bad);
        if let Some((from, to)) = replay.lost {
            warnings.push(lost_message(&self.dir.journal_path(), &self.mark_path(), from, to));
        }
        if let Some((from, to)) = replay.unsynced_tail {
            warnings.push(unsynced_tail_message(&self.dir.journal_path(), &self.mark_path(), from, to));
        }
        if replay.snapshot_ignored {
            warnings.push(format!(
                "{} was not folded from the journal {} holds (one of them was edited): the journal is the record of this deploy, and its records were replayed",
                self.dir.snapshot_path().display(),
                self.dir.journal_path().display(),
            ));
        }
        replay.deploy.warnings.extend(warnings);
        Ok(replay)
    }

    /// What each unreadable line means, in words (written as warning records when the journal
    /// is quarantined).
    fn bad_line_warnings(&self, bad: &[BadLine]) -> Vec<String> {
        let journal = self.dir.journal_path();
        let mut said = Vec::new();
        for bad in bad {
            if bad.line_no == 1 {
                said.push(format!(
                    "{}:1: the journal's header line was unreadable ({}); it was set aside in {} and written anew: it holds no record, so nothing is uncertain",
                    journal.display(),
                    bad.error,
                    self.dir.path.join(QUARANTINE).display(),
                ));
                continue;
            }
            let next = bad.before.map(|b| format!(" and record {b}")).unwrap_or_default();
            said.push(format!(
                "{}:{}: an unreadable journal line ({}) was set aside in {}: the record between record {}{next} is lost, so what it said (a sub-change started or finished, a step's end) is uncertain; `rdeploy recover` lets each tool's own state and each sub-change's `check` decide",
                journal.display(),
                bad.line_no,
                bad.error,
                self.dir.path.join(QUARANTINE).display(),
                bad.after,
            ));
        }
        said
    }

    /// Reads the unfinished deploy, if there is one (read-only: never truncates or locks).
    fn read_unfinished(&self) -> anyhow::Result<Option<Deploy>> {
        if !self.journal_exists() && !self.orphans() {
            return Ok(None);
        }
        Ok(Some(self.replay()?.deploy))
    }

    fn history_files(&self) -> anyhow::Result<Vec<PathBuf>> {
        let dir = self.dir.history_dir();
        if !dir.exists() {
            return Ok(Vec::new());
        }
        let mut files: Vec<PathBuf> = fs_err::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        Ok(files)
    }

    fn read_history_file(path: &Path) -> anyhow::Result<Deploy> {
        let bytes = fs_err::read(path)?;
        serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))
    }

    /// A snapshot is only a cache of the journal: when it is unreadable, or its body does not
    /// match its checksum (a flipped bit that is still valid JSON), replay all.
    fn read_snapshot(&self) -> Option<Snapshot> {
        let bytes = std::fs::read(self.dir.snapshot_path()).ok()?;
        let (body, folded) = snapshot_body(&bytes)?;
        match serde_json::from_slice::<Deploy>(body) {
            Ok(deploy) if deploy.version == VERSION => Some(Snapshot { deploy, folded }),
            _ => None,
        }
    }

    fn write_history(&self, deploy: &Deploy) -> anyhow::Result<()> {
        let history = self.dir.history_dir();
        self.dir.create_dir(&history)?;
        let stamp = deploy.updated.to_string().replace([':', '-'], "");
        let name = format!("{stamp}-{}.json", deploy.deploy_id);
        write_atomic(&history.join(name), serde_json::to_string_pretty(deploy)?.as_bytes())
    }

    /// Forgets the unfinished deploy, keeping its final state in history.
    fn archive(&self, deploy: &Deploy) -> anyhow::Result<()> {
        self.write_history(deploy)?;
        // The snapshot goes first: a snapshot must never outlive its journal (see read_journal);
        // and `journal.seq` before the journal: either left without the journal is the evidence
        // of a journal lost from under them (see `orphans`).
        for path in [self.dir.snapshot_path(), self.mark_path(), self.dir.journal_path()] {
            if path.exists() {
                fs_err::remove_file(&path)?;
            }
        }
        let steps = self.dir.path.join("steps");
        if steps.exists() {
            fs_err::remove_dir_all(&steps)?;
        }
        sync_dir(&self.dir.path)?;
        Ok(())
    }

    /// Opens the journal for appending, remembering which file it is.
    fn open_writer(&self, file: File, mark: Mark) -> anyhow::Result<LocalJournal> {
        let meta = file.metadata()?;
        let mark_file = open_private(&self.mark_path(), OpenOptions::new().read(true).write(true).create(true))?;
        let mut journal = LocalJournal {
            store: self.clone(),
            path: self.dir.journal_path(),
            file,
            id: (meta.dev(), meta.ino()),
            mark_file,
            mark,
            lost: None,
        };
        journal.write_mark()?;
        Ok(journal)
    }

    /// Moves unreadable lines out of the journal (into the quarantine file) and rewrites it
    /// without them, so the next record starts clean and the damage is said once, durably. A
    /// damaged header is replaced by a fresh one (the journal must still read as a journal), and
    /// a torn last line (the first `good_len` bytes are whole lines) is a crash's, not garbage:
    /// it is dropped, never kept for the next record to be glued onto.
    fn quarantine(&self, bad: &[BadLine], good_len: u64) -> anyhow::Result<()> {
        let path = self.dir.journal_path();
        let mut q = self.dir.create_file(&self.dir.path.join(QUARANTINE))?;
        for b in bad {
            writeln!(q, "# {}:{} ({}), set aside at {}", path.display(), b.line_no, b.error, now())?;
            q.write_all(&b.bytes)?;
            if !b.bytes.ends_with(b"\n") {
                q.write_all(b"\n")?;
            }
        }
        q.sync_all()?;
        let mut text = fs_err::read(&path)?;
        text.truncate(good_len as usize);
        // The journal is rewritten: a snapshot of the old one no longer folds it.
        match fs_err::remove_file(self.dir.snapshot_path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let skip: Vec<usize> = bad.iter().map(|b| b.line_no).collect();
        let mut kept = Vec::with_capacity(text.len());
        if skip.contains(&1) {
            let header = Header { format: FORMAT.into(), version: VERSION, created: now().to_string() };
            kept.extend_from_slice(serde_json::to_string(&header)?.as_bytes());
            kept.push(b'\n');
        }
        for (i, line) in text.split_inclusive(|&b| b == b'\n').enumerate() {
            if !skip.contains(&(i + 1)) {
                kept.extend_from_slice(line);
            }
        }
        write_atomic(&path, &kept)
    }
}

/// The first line of `snapshot.json`; the body follows on the next line.
const SNAPSHOT_HEADER: &str = "rdeploy-snapshot sha256=";

/// What a snapshot says of the journal it folded: its first `len` bytes, with this sha256.
#[derive(Clone, Debug, PartialEq)]
struct Folded {
    len: u64,
    sha256: Vec<u8>,
}

/// A snapshot read back: the state, and the journal it claims to fold (`None` from a snapshot
/// that does not say, which is never trusted).
struct Snapshot {
    deploy: Deploy,
    folded: Option<Folded>,
}

/// `snapshot.json`'s bytes: a header line with the sha256 of the body and the length and
/// sha256 of the journal it folds, then the body (the [`Deploy`] as JSON).
fn snapshot_file(deploy: &Deploy, folded: &Folded) -> anyhow::Result<Vec<u8>> {
    use sha2::Digest as _;
    let body = serde_json::to_vec(deploy)?;
    let mut file = format!(
        "{SNAPSHOT_HEADER}{} journal-bytes={} journal-sha256={}\n",
        hex::encode(sha2::Sha256::digest(&body)),
        folded.len,
        hex::encode(&folded.sha256)
    )
    .into_bytes();
    file.extend_from_slice(&body);
    Ok(file)
}

/// The body of a snapshot file whose checksum matches, and the journal it says it folds; None
/// when the checksum does not match.
fn snapshot_body(file: &[u8]) -> Option<(&[u8], Option<Folded>)> {
    use sha2::Digest as _;
    let rest = file.strip_prefix(SNAPSHOT_HEADER.as_bytes())?;
    let newline = rest.iter().position(|&b| b == b'\n')?;
    let (header, body) = (std::str::from_utf8(&rest[..newline]).ok()?, &rest[newline + 1..]);
    let mut words = header.split(' ');
    let sum = words.next()?;
    if hex::decode(sum).ok()? != sha2::Sha256::digest(body).as_slice() {
        return None;
    }
    let (mut len, mut sha256) = (None, None);
    for word in words {
        match word.split_once('=') {
            Some(("journal-bytes", n)) => len = n.parse().ok(),
            Some(("journal-sha256", h)) => sha256 = hex::decode(h).ok(),
            _ => {}
        }
    }
    Some((body, len.zip(sha256).map(|(len, sha256)| Folded { len, sha256 })))
}

/// The length and sha256 of the journal file as it is now.
fn fold_of(path: &Path) -> anyhow::Result<Folded> {
    use sha2::Digest as _;
    use std::io::Read as _;
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut len = 0u64;
    loop {
        let n = file.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
    Ok(Folded { len, sha256: hasher.finalize().to_vec() })
}

/// Each step of a deploy and how far it got, in words (for a journal lost from under its
/// snapshot).
fn describe_steps(deploy: &Deploy) -> String {
    use rdeploy_adapters::SubStatus;
    let said: Vec<String> = deploy
        .steps
        .iter()
        .map(|s| {
            let done: Vec<&str> =
                s.sub_changes.iter().filter(|c| c.status == SubStatus::Done).map(|c| c.id.as_str()).collect();
            let mut line = format!("step `{}` {}", s.name, s.status.as_str());
            if !done.is_empty() && s.status != crate::checkpoint::StepStatus::Done {
                let shown: Vec<&str> = done.iter().copied().take(10).collect();
                let more = if done.len() > shown.len() {
                    format!(" and {} more", done.len() - shown.len())
                } else {
                    String::new()
                };
                line.push_str(&format!(" (sub-changes done: {}{more})", shown.join(", ")));
            }
            line
        })
        .collect();
    if said.is_empty() {
        "no step recorded".to_string()
    } else {
        said.join(", ")
    }
}

/// The journal ends between the synced and the written record count: an OS crash.
fn unsynced_tail_message(journal: &Path, mark: &Path, from: u64, to: u64) -> String {
    let which = if from == to { format!("record {from}") } else { format!("records {from} to {to}") };
    format!(
        "{} ends before record {from}, but {} says {to} were written and only {} synced: an OS crash (power loss) dropped the unsynced {which}; what they said (a sub-change finished, a step's end) is uncertain, so `rdeploy recover` lets each tool's own state and each sub-change's `check` decide",
        journal.display(),
        mark.display(),
        from - 1,
    )
}

fn lost_message(journal: &Path, mark: &Path, from: u64, to: u64) -> String {
    let which = if from == to { format!("record {from}") } else { format!("records {from} to {to}") };
    format!(
        "{} lost records: {} ends before record {from}, but {} says {to} were written; what {which} said is unknown, so `recover` could apply completed sub-changes again",
        journal.display(),
        journal.file_name().unwrap_or_default().to_string_lossy(),
        mark.display(),
    )
}

/// Replays the journal: every record, from the first. The journal is the truth; a snapshot is
/// never the source of the state (one rewritten with its checksum recomputed would otherwise
/// override what the journal recorded), only checked: one whose journal bytes do not match the
/// journal's is said in a warning. A torn last line (a crash mid-write) is ignored; an
/// unreadable line elsewhere is skipped and reported.
fn read_journal(path: &Path, snapshot: Option<Snapshot>) -> anyhow::Result<Replay> {
    use sha2::Digest as _;
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    let mut good_len = 0u64;
    let folded = snapshot.as_ref().and_then(|s| s.folded.clone());
    // Whether the journal's first bytes are the ones the snapshot says it folded.
    let mut matched = false;
    let mut hasher = sha2::Sha256::new();
    let mut line_no = 0;
    let mut last_seq = 0;
    let mut entries = Vec::new();
    let mut bad: Vec<BadLine> = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if !line.ends_with(b"\n") {
            // Torn write: the process died mid-append. The record was never acknowledged.
            break;
        }
        good_len += n as u64;
        hasher.update(&line);
        if let Some(f) = folded.as_ref().filter(|f| f.len == good_len) {
            matched = hasher.clone().finalize().as_slice() == f.sha256.as_slice();
        }
        if line_no == 1 {
            match serde_json::from_slice::<Header>(&line) {
                Ok(header) if header.format != FORMAT || header.version != VERSION => anyhow::bail!(
                    "{}: journal format {} version {} is not supported by this rdeploy (wants {FORMAT} {VERSION})",
                    path.display(),
                    header.format,
                    header.version
                ),
                Ok(_) => continue,
                // A damaged header: the records after it may still be readable.
                Err(_) if serde_json::from_slice::<Entry>(&line).is_err() => {
                    bad.push(BadLine {
                        line_no,
                        bytes: line.clone(),
                        after: 0,
                        before: None,
                        error: "not an rdeploy journal header".into(),
                    });
                    continue;
                }
                Err(_) => anyhow::bail!("{}:1: not an rdeploy journal header", path.display()),
            }
        }
        let entry: Entry = match serde_json::from_slice(&line) {
            Ok(entry) => entry,
            Err(e) => {
                let error = if line.iter().all(|&b| b == 0 || b == b'\n') {
                    "NUL bytes".to_string()
                } else if std::str::from_utf8(&line).is_err() {
                    "not UTF-8".to_string()
                } else {
                    format!("not a journal record: {e}")
                };
                bad.push(BadLine { line_no, bytes: line.clone(), after: last_seq, before: None, error });
                continue;
            }
        };
        for b in bad.iter_mut().filter(|b| b.before.is_none() && b.line_no > 1) {
            b.before = Some(entry.seq);
        }
        last_seq = entry.seq;
        entries.push(entry);
    }
    let mut deploy = Deploy::empty();
    for entry in &entries {
        deploy.apply(entry.seq, &entry.ts, &entry.record);
    }
    // A snapshot of a journal whose first bytes are not these: the journal was edited under it
    // (or the snapshot's header was). The journal's fold is the state either way.
    let snapshot_ignored = folded.is_some() && !matched;
    Ok(Replay { deploy, entries, good_len, last_seq, bad, lost: None, unsynced_tail: None, snapshot_ignored })
}

impl Replay {
    /// The last sequence the journal (or the snapshot) accounts for. An unreadable line after
    /// the last good record is a record too (reported as such).
    fn known(&self) -> u64 {
        let trailing = self.bad.iter().filter(|b| b.before.is_none() && b.line_no > 1).count() as u64;
        self.last_seq.max(self.deploy.seq) + trailing
    }
}

impl Store for LocalStore {
    fn location(&self) -> String {
        self.dir.path.display().to_string()
    }

    fn lock(&self, command: &str) -> Result<Box<dyn LockGuard>, LockError> {
        Ok(Box::new(Lock::acquire(&self.dir, command)?))
    }

    fn holder(&self) -> Option<Holder> {
        Lock::current_holder(&self.dir)
    }

    fn load_unfinished(&self) -> anyhow::Result<Option<Deploy>> {
        self.read_unfinished()
    }

    fn last_finished(&self) -> anyhow::Result<Option<Deploy>> {
        match self.history_files()?.last() {
            Some(path) => Ok(Some(Self::read_history_file(path)?)),
            None => Ok(None),
        }
    }

    fn has_unfinished(&self) -> anyhow::Result<bool> {
        Ok(self.journal_exists() || self.orphans())
    }

    fn create_journal(&self) -> anyhow::Result<Box<dyn JournalWriter>> {
        let dir = &self.dir;
        dir.ensure()?;
        let path = dir.journal_path();
        let start = || -> anyhow::Result<LocalJournal> {
            // A snapshot left by an earlier deploy must not be read with the new journal.
            match fs_err::remove_file(dir.snapshot_path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
            let mut file = open_private(&path, OpenOptions::new().create_new(true).append(true))?;
            let header = Header { format: FORMAT.into(), version: VERSION, created: now().to_string() };
            writeln!(file, "{}", serde_json::to_string(&header)?)?;
            file.sync_all()?;
            let journal = self.open_writer(file, Mark::default())?;
            sync_dir(&dir.path)?;
            Ok(journal)
        };
        match start() {
            Ok(journal) => Ok(Box::new(journal)),
            Err(e) => {
                // Nothing is recorded: leave no half-made journal that would look unfinished
                // (nor a `journal.seq`, which without its journal reads as one lost).
                let _ = std::fs::remove_file(self.mark_path());
                let _ = std::fs::remove_file(&path);
                if e.downcast_ref::<Refusal>().is_some() {
                    return Err(e);
                }
                Err(dir.unwritable(&path, &format!("{e:#}")))
            }
        }
    }

    fn open_journal(&self) -> anyhow::Result<(Box<dyn JournalWriter>, Deploy)> {
        let path = self.dir.journal_path();
        let replay = self.replay()?;
        // A journal that lost records is left as it is, so every later look says so too (only
        // `reset` goes on, and archives it).
        if (!replay.bad.is_empty() || replay.unsynced_tail.is_some()) && replay.lost.is_none() {
            let mut said = self.bad_line_warnings(&replay.bad);
            if let Some((from, to)) = replay.unsynced_tail {
                said.push(unsynced_tail_message(&path, &self.mark_path(), from, to));
            }
            let known = replay.known();
            if !replay.bad.is_empty() {
                // Rewritten (and synced) without the bad lines and without a torn tail.
                self.quarantine(&replay.bad, replay.good_len)?;
            }
            let mut file = open_private(&path, OpenOptions::new().append(true))?;
            if file.metadata()?.len() != replay.good_len && replay.bad.is_empty() {
                // The torn last line a crash left (see below).
                file.set_len(replay.good_len)?;
                file.seek(SeekFrom::End(0))?;
                file.sync_all()?;
            }
            // The set-aside lines and the tail an OS crash dropped are accounted for (said in
            // the warnings): they are not records the journal lost, and the next records take
            // their sequence numbers. What the file holds now is synced (rewritten or cut and
            // synced above), so the mark may say so.
            let mut journal = self.open_writer(file, Mark { written: known, synced: known })?;
            // Said once, durably, as warning records.
            for (seq, message) in (known + 1..).zip(said) {
                let entry = Entry { seq, ts: now(), record: Record::Warning { step: None, message } };
                journal.append(&entry)?;
            }
            journal.sync()?;
            // Read back only now: the set-aside lines counted as records until the warnings
            // took the sequence past them, so an earlier read would see the journal end before
            // the mark and call that lost records.
            let replay = self.replay()?;
            return Ok((Box::new(journal), replay.deploy));
        }
        let mut file = open_private(&path, OpenOptions::new().append(true))?;
        if file.metadata()?.len() != replay.good_len {
            // Drop the torn last line a crash left, so the next record starts on its own line.
            file.set_len(replay.good_len)?;
            file.seek(SeekFrom::End(0))?;
            file.sync_all()?;
        }
        // A killed run's last records (ends of sub-changes, written but not yet synced) are in
        // the page cache, not on the disk: they stay unsynced until this run's first sync, so an
        // OS crash before it reads as the unsynced tail it is, not as records lost.
        let mark = self.read_mark().unwrap_or_default();
        let written = mark.written.max(replay.deploy.seq);
        let synced = mark.synced.min(written);
        let mut journal = self.open_writer(file, Mark { written, synced })?;
        journal.lost = replay.lost.map(|(a, b)| lost_message(&path, &self.mark_path(), a, b));
        Ok((Box::new(journal), replay.deploy))
    }

    fn entries(&self) -> anyhow::Result<Option<Vec<Entry>>> {
        if !self.journal_exists() {
            return Ok(None);
        }
        let replay = self.replay()?;
        if let Some((from, to)) = replay.lost {
            anyhow::bail!(lost_message(&self.dir.journal_path(), &self.mark_path(), from, to));
        }
        Ok(Some(replay.entries))
    }

    fn history(&self) -> anyhow::Result<Vec<Deploy>> {
        self.history_files()?.iter().map(|p| Self::read_history_file(p)).collect()
    }

    fn import_history(&self, deploys: &[Deploy]) -> anyhow::Result<()> {
        // The local store's own naming, so its newest-first order holds.
        deploys.iter().try_for_each(|d| self.write_history(d))
    }

    fn retire_unfinished(&self) -> anyhow::Result<String> {
        // Kept under another name rather than deleted: the operator may want to look.
        let stamp = now().to_string().replace([':', '-'], "");
        if self.orphans() {
            // The journal is gone already: the snapshot is what is left to look at.
            let mut kept = Vec::new();
            if self.dir.snapshot_path().exists() {
                let moved = self.dir.path.join(format!("snapshot.json.moved-{stamp}"));
                fs_err::rename(self.dir.snapshot_path(), &moved)?;
                kept.push(format!("the snapshot is kept as {}", moved.display()));
            }
            let _ = fs_err::remove_file(self.mark_path());
            sync_dir(&self.dir.path)?;
            kept.push("`journal.seq` is removed".to_string());
            return Ok(kept.join("; "));
        }
        // The evidence of a journal goes first, then the journal: a reset killed in between
        // leaves a journal without its snapshot (read as usual), never a snapshot without its
        // journal (refused as a lost journal).
        let _ = fs_err::remove_file(self.dir.snapshot_path());
        let _ = fs_err::remove_file(self.mark_path());
        sync_dir(&self.dir.path)?;
        let moved = self.dir.path.join(format!("journal.jsonl.moved-{stamp}"));
        fs_err::rename(self.dir.journal_path(), &moved)?;
        Ok(format!("the journal is kept as {}", moved.display()))
    }
}

impl LockGuard for Lock {
    fn took_over_from(&self) -> Option<&Holder> {
        self.took_over_from.as_ref()
    }
}

/// The journal file of the unfinished deploy, open for appending.
struct LocalJournal {
    store: LocalStore,
    path: PathBuf,
    file: File,
    /// Device and inode of the journal when it was opened.
    id: (u64, u64),
    /// `journal.seq`, rewritten in place after each record.
    mark_file: File,
    mark: Mark,
    /// Records the journal lost before it was opened, in words.
    lost: Option<String>,
}

impl LocalJournal {
    /// Fails when the journal at the path is no longer the file this run writes (one stat).
    fn check_still_there(&self) -> anyhow::Result<()> {
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.id => Ok(()),
            _ => Err(JournalGone { path: self.path.display().to_string() }.into()),
        }
    }

    fn write_mark(&mut self) -> anyhow::Result<()> {
        // Fixed width, written in place: one pwrite, never a torn or shorter file.
        let mut text = format!("{{\"written\":{},\"synced\":{}}}", self.mark.written, self.mark.synced).into_bytes();
        text.resize(63, b' ');
        text.push(b'\n');
        self.mark_file.write_all_at(&text, 0).context("writing the checkpoint's record count")
    }
}

impl LocalJournal {
    /// Writes the record's line, and counts it as written (`journal.seq` is not rewritten here).
    fn write_line(&mut self, entry: &Entry) -> anyhow::Result<()> {
        self.check_still_there()?;
        let mut line = serde_json::to_vec(entry)?;
        line.push(b'\n');
        // One write per record: a crash leaves a whole line or a torn last line.
        self.file.write_all(&line).context("writing the checkpoint journal")?;
        self.mark.written = self.mark.written.max(entry.seq);
        Ok(())
    }
}

impl JournalWriter for LocalJournal {
    fn append(&mut self, entry: &Entry) -> anyhow::Result<()> {
        self.write_line(entry)?;
        self.write_mark()
    }

    fn sync(&mut self) -> anyhow::Result<()> {
        self.file.sync_data().context("syncing the checkpoint journal")?;
        self.mark.synced = self.mark.written;
        self.write_mark()
    }

    /// One rewrite of `journal.seq`, after the fdatasync, says the record both written and
    /// synced: the rewrite between the write and the sync (saying it written, not synced) is
    /// left out. It told an OS crash's dropped tail from lost records only for the moments
    /// the fdatasync takes; a kill in them leaves the record in the page cache and the journal
    /// ahead of the mark, which reads as a journal that ended with a crash, as it is, and an
    /// OS crash in them leaves the journal without the record, which was never acknowledged:
    /// what it started never ran.
    fn append_synced(&mut self, entry: &Entry) -> anyhow::Result<()> {
        self.write_line(entry)?;
        self.sync()
    }

    fn snapshot(&mut self, deploy: &Deploy) -> anyhow::Result<()> {
        self.check_still_there()?;
        // What it folds: the journal as it is now (every record up to `deploy.seq`, appended by
        // this process). Read back from the file, so it is the bytes a later load will check.
        let folded = fold_of(&self.path)?;
        write_atomic(&self.store.dir.snapshot_path(), &snapshot_file(deploy, &folded)?)
    }

    fn archive(&mut self, deploy: &Deploy) -> anyhow::Result<()> {
        self.check_still_there()?;
        self.file.sync_data()?;
        self.store.archive(deploy)
    }

    fn discard_empty(&mut self) -> anyhow::Result<()> {
        if self.mark.written == 0 && self.check_still_there().is_ok() {
            // `journal.seq` first: left alone, it would read as a journal lost from under it.
            let _ = fs_err::remove_file(self.store.mark_path());
            fs_err::remove_file(&self.path)?;
        }
        Ok(())
    }

    fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }
}

impl LocalStore {
    /// The local store in the state directory at `path`.
    pub fn at_path(path: impl Into<PathBuf>) -> LocalStore {
        LocalStore::new(StateDir::new(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract;

    /// A local store holding the contract's six records (synced), with its journal's lines.
    fn store_with_records() -> (tempfile::TempDir, LocalStore, Vec<Vec<u8>>) {
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalStore::at_path(tmp.path().join(".rdeploy"));
        let mut journal = store.create_journal().unwrap();
        for entry in contract::entries("r1") {
            journal.append(&entry).unwrap();
        }
        journal.sync().unwrap();
        drop(journal);
        let lines = read_lines(&store);
        assert_eq!(lines.len(), 7, "a header and six records");
        (tmp, store, lines)
    }

    fn read_lines(store: &LocalStore) -> Vec<Vec<u8>> {
        let bytes = std::fs::read(store.dir.journal_path()).unwrap();
        bytes.split_inclusive(|&b| b == b'\n').map(<[u8]>::to_vec).collect()
    }

    fn write_lines(store: &LocalStore, lines: &[Vec<u8>]) {
        std::fs::write(store.dir.journal_path(), lines.concat()).unwrap();
    }

    fn warnings(deploy: &Deploy) -> String {
        deploy.warnings.join("\n")
    }

    /// Every line of the journal on disk reads as a record (or is the header).
    fn assert_clean(store: &LocalStore) {
        let replay = read_journal(&store.dir.journal_path(), None).unwrap();
        assert!(
            replay.bad.is_empty(),
            "unreadable lines left: {:?}",
            replay.bad.iter().map(|b| &b.error).collect::<Vec<_>>()
        );
        assert_eq!(replay.good_len, std::fs::metadata(store.dir.journal_path()).unwrap().len(), "no torn tail left");
    }

    /// A damaged header is set aside and written anew: the journal stays readable, by this
    /// open and every later one, and no record is called uncertain for it.
    #[test]
    fn a_damaged_header_is_replaced_not_quarantined_into_an_unreadable_journal() {
        let (_tmp, store, mut lines) = store_with_records();
        lines[0] = b"{\"format\":\"rdeploy-chec\xffpoint\n".to_vec();
        write_lines(&store, &lines);
        let (mut journal, deploy) = store.open_journal().unwrap();
        assert!(
            warnings(&deploy).contains("journal.jsonl:1: the journal's header line was unreadable"),
            "{}",
            warnings(&deploy)
        );
        assert!(!warnings(&deploy).contains("uncertain;"), "{}", warnings(&deploy));
        assert_eq!(deploy.seq, 7, "six records and the warning");
        journal
            .append(&Entry {
                seq: 8,
                ts: now(),
                record: Record::SubDone { step: "seed".into(), id: "b".into(), note: None },
            })
            .unwrap();
        drop(journal);
        assert_clean(&store);
        let (_journal, again) = store.open_journal().expect("the quarantined journal reads again");
        assert_eq!(again.seq, 8);
        assert_eq!(again.warnings.len(), 1, "said once: {}", warnings(&again));
        assert!(
            std::fs::read(store.dir.path.join(QUARANTINE)).unwrap().windows(4).any(|w| w == b"chec"),
            "the bad header is kept aside"
        );
    }

    /// A torn last line is a crash's, not garbage: when another line is quarantined, the tail
    /// is dropped (not kept, not quarantined) and the warning record starts on a line of its own.
    #[test]
    fn a_torn_last_line_is_dropped_when_quarantining_and_the_warning_is_not_glued_to_it() {
        let (_tmp, store, mut lines) = store_with_records();
        let torn = lines[6][..lines[6].len() / 2].to_vec();
        lines[3] = b"\xde\xad\xbe\xef\n".to_vec();
        lines[6] = torn;
        write_lines(&store, &lines);
        std::fs::write(store.mark_path(), "{\"written\":5,\"synced\":5}\n").unwrap();
        let (journal, deploy) = store.open_journal().unwrap();
        drop(journal);
        assert_clean(&store);
        let said = warnings(&deploy);
        assert!(said.contains("journal.jsonl:4: an unreadable journal line"), "{said}");
        assert_eq!(deploy.warnings.len(), 1, "one line was bad, the torn tail is no damage: {said}");
        let quarantined =
            String::from_utf8_lossy(&std::fs::read(store.dir.path.join(QUARANTINE)).unwrap()).into_owned();
        assert_eq!(quarantined.matches("set aside at").count(), 1, "the torn tail is not quarantined: {quarantined}");
        let (_journal, again) = store.open_journal().unwrap();
        assert_eq!(again.warnings, deploy.warnings, "read back the same, the warning intact");
    }

    /// Unreadable lines at the end of the journal count as the records they were; setting
    /// them aside is no loss of records, so no "lost records" warning follows.
    #[test]
    fn quarantined_trailing_lines_give_no_lost_records_warning() {
        let (_tmp, store, mut lines) = store_with_records();
        lines[5] = vec![0u8; 30].into_iter().chain([b'\n']).collect();
        lines[6] = b"garbage\n".to_vec();
        write_lines(&store, &lines);
        let (journal, deploy) = store.open_journal().unwrap();
        drop(journal);
        let said = warnings(&deploy);
        assert!(!said.contains("lost records"), "{said}");
        assert_eq!(deploy.warnings.len(), 2, "{said}");
        assert_clean(&store);
        let again = store.load_unfinished().unwrap().unwrap();
        assert!(!warnings(&again).contains("lost records"), "{}", warnings(&again));
        assert_eq!(again.warnings.len(), 2);
    }

    /// A killed run's unsynced tail is still unsynced when the next run opens the journal: the
    /// mark does not claim it synced until an fdatasync covered it.
    #[test]
    fn opening_does_not_mark_an_unsynced_tail_as_synced() {
        let (_tmp, store, _lines) = store_with_records();
        std::fs::write(store.mark_path(), "{\"written\":6,\"synced\":4}\n").unwrap();
        let (mut journal, deploy) = store.open_journal().unwrap();
        assert!(deploy.warnings.is_empty(), "{}", warnings(&deploy));
        assert_eq!(store.read_mark(), Some(Mark { written: 6, synced: 4 }), "nothing was synced yet");
        journal.sync().unwrap();
        assert_eq!(store.read_mark(), Some(Mark { written: 6, synced: 6 }));
    }
}

//! Where checkpoints live. [`Store`] is the one interface the engine, reports, runbooks and
//! `state migrate` use; [`local::LocalStore`] keeps them in the state directory beside the
//! stack (the default); [`postgres::PostgresStore`] keeps many stacks' checkpoints in one shared
//! database (`--state postgres://`). Each store keeps a deploy's journal, its snapshot, the
//! history of finished deploys and the lock that lets one run at a time write.
//!
//! [`StateDir`] is the scratch directory every store uses on the machine that runs the tools
//! (logs, adapters' work dirs, the report); the local store also keeps its files there.
//! Every backend passes the same contract suite (`contract::full`).

#[cfg(test)]
mod contract;
pub mod layout;
pub mod local;
pub mod pg_tls;
pub mod postgres;
pub mod state_dir;

pub use state_dir::StateDir;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{Deploy, Entry};

/// A place that holds one stack's checkpoint.
pub trait Store: Send + Sync {
    /// Where it is, for messages (`.rdeploy`, `postgres://db/rdeploy stack shop`).
    fn location(&self) -> String;
    /// Takes the lock for a command or says who holds it. Never waits.
    fn lock(&self, command: &str) -> Result<Box<dyn LockGuard>, LockError>;
    /// Who holds the lock now, without taking it.
    fn holder(&self) -> Option<Holder>;
    /// The unfinished deploy, if any (read-only).
    fn load_unfinished(&self) -> anyhow::Result<Option<Deploy>>;
    /// The most recently finished deploy (complete, reverted or reset).
    fn last_finished(&self) -> anyhow::Result<Option<Deploy>>;
    /// Starts an empty journal for a new deploy.
    fn create_journal(&self) -> anyhow::Result<Box<dyn JournalWriter>>;
    /// Opens the unfinished deploy's journal for appending, with its state so far.
    fn open_journal(&self) -> anyhow::Result<(Box<dyn JournalWriter>, Deploy)>;
    /// Every record of the unfinished deploy, in order (`None` when there is none).
    fn entries(&self) -> anyhow::Result<Option<Vec<Entry>>>;
    /// Every finished deploy, oldest first.
    fn history(&self) -> anyhow::Result<Vec<Deploy>>;
    /// Adds finished deploys to the history (needs the lock).
    fn import_history(&self, deploys: &[Deploy]) -> anyhow::Result<()>;
    /// Retires the unfinished journal once it lives in another store, so the deploy cannot be
    /// resumed twice (needs the lock). Returns what became of it, in words.
    fn retire_unfinished(&self) -> anyhow::Result<String>;

    fn has_unfinished(&self) -> anyhow::Result<bool> {
        Ok(self.load_unfinished()?.is_some())
    }

    /// Like `load_unfinished`, with steps a dead run left running marked failed.
    fn load_settled(&self, holder_alive: bool) -> anyhow::Result<Option<Deploy>> {
        Ok(self.load_unfinished()?.map(|mut d| {
            d.settle_after_load(holder_alive);
            d
        }))
    }
}

/// Appends one deploy's records.
pub trait JournalWriter: Send {
    /// Writes a record; it survives the process dying once this returns.
    fn append(&mut self, entry: &Entry) -> anyhow::Result<()>;
    /// Makes everything appended so far survive an OS crash.
    fn sync(&mut self) -> anyhow::Result<()>;
    /// Writes a record and makes it (with everything before it) survive an OS crash before
    /// returning: [`JournalWriter::append`] then [`JournalWriter::sync`], which a store may do
    /// in fewer writes (the local store counts the record once, after the sync).
    fn append_synced(&mut self, entry: &Entry) -> anyhow::Result<()> {
        self.append(entry)?;
        self.sync()
    }
    /// Saves the state folded so far, so loading need not replay the whole journal.
    fn snapshot(&mut self, deploy: &Deploy) -> anyhow::Result<()>;
    /// Moves the finished deploy to history and removes the journal.
    fn archive(&mut self, deploy: &Deploy) -> anyhow::Result<()>;
    /// Removes a journal that holds no record yet (its first record could not be written), so
    /// a failed start leaves no "unfinished deploy" behind.
    fn discard_empty(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// When the journal was opened: the records it lost (known written, now missing), in words.
    fn lost(&self) -> Option<&str> {
        None
    }
}

/// A held lock; released on drop.
pub trait LockGuard: Send + Sync {
    /// A holder that died holding the lock, if this run took it over.
    fn took_over_from(&self) -> Option<&Holder>;
}

/// Who holds (or held) the lock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub host: String,
    pub started: String,
    pub command: String,
    /// A shared store's lock is a lease the holder keeps renewing: when it runs out, in RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires: Option<String>,
    /// Seconds since the holder last renewed its lease (its heartbeat); large means stuck or gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_age: Option<f64>,
    /// Seconds left before the lease runs out and another run may take over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_in: Option<f64>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`rdeploy {}` (pid {} on {}, since {}", self.command, self.pid, self.host, self.started)?;
        match (self.lease_age, self.lease_expires_in) {
            (Some(age), Some(left)) if left >= 0.0 => {
                write!(f, "; lease renewed {age:.1}s ago, expires in {left:.1}s")?
            }
            (Some(age), Some(left)) => write!(f, "; lease renewed {age:.1}s ago, expired {:.1}s ago", -left)?,
            _ => {}
        }
        write!(f, ")")
    }
}

impl Holder {
    /// Whether this holder is a live process on this host (a zombie is not: PID 1 may reap a
    /// killed rdeploy seconds late).
    pub fn is_alive_here(&self) -> bool {
        self.host == hostname() && rdeploy_adapters::process::process_lives(self.pid as i32)
    }
}

pub fn hostname() -> String {
    // nix's `gethostname(2)`; a name it cannot read is empty, as a host it cannot match.
    nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another run holds the lock on {dir}: {holder}")]
    Held { dir: String, holder: String },
    #[error(transparent)]
    Io(#[from] anyhow::Error),
}

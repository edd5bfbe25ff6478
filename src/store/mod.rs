//! Where checkpoints live. [`Store`] is the one interface the driver, reports and runbooks use;
//! [`local::StateDir`] keeps them in a state directory beside the stack (the default).
//! [`postgres::PostgresStore`] keeps many stacks' checkpoints in one shared database (`--state postgres://`).
//! Each store keeps a deploy's journal, its snapshot, the history of finished deploys and the
//! lock that lets one run at a time write.

pub mod local;
pub mod pg_tls;
pub mod postgres;

use crate::checkpoint::{Deploy, Entry};
use crate::lock::{Holder, LockError};

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
    /// Saves the state folded so far, so loading need not replay the whole journal.
    fn snapshot(&mut self, deploy: &Deploy) -> anyhow::Result<()>;
    /// Moves the finished deploy to history and removes the journal.
    fn archive(&mut self, deploy: &Deploy) -> anyhow::Result<()>;
}

/// A held lock; released on drop.
pub trait LockGuard: Send + Sync {
    /// A holder that died holding the lock, if this run took it over.
    fn took_over_from(&self) -> Option<&Holder>;
}

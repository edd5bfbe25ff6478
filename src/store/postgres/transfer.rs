//! `rdeploy state migrate`: moves a stack's checkpoint (the unfinished deploy's journal, record
//! by record, and the history of finished deploys) between a local state directory and
//! PostgreSQL, either way. Both sides are locked meanwhile; the copy is checked by folding it
//! back; then the source's unfinished journal is retired so the deploy cannot be resumed twice.

use std::path::Path;

use anyhow::Context as _;

use super::{is_url, PostgresStore};
use crate::checkpoint::{Deploy, Entry, Timestamp};
use crate::exit::{Code, Refusal};
use crate::store::local::{write_atomic, StateDir};
use crate::store::{LockGuard, Store};

/// One side of a migration.
enum Side {
    Local(StateDir),
    Postgres(PostgresStore),
}

impl Side {
    fn store(&self) -> &dyn Store {
        match self {
            Side::Local(dir) => dir,
            Side::Postgres(pg) => pg,
        }
    }

    fn entries(&self) -> anyhow::Result<Option<Vec<Entry>>> {
        match self {
            Side::Local(dir) => local_entries(dir),
            Side::Postgres(pg) => pg.entries(),
        }
    }

    fn history(&self) -> anyhow::Result<Vec<Deploy>> {
        match self {
            Side::Local(dir) => local_history(dir),
            Side::Postgres(pg) => pg.history(),
        }
    }

    fn add_history(&self, deploys: &[Deploy]) -> anyhow::Result<()> {
        match self {
            Side::Local(dir) => {
                let history = dir.history_dir();
                fs_err::create_dir_all(&history)?;
                for d in deploys {
                    // The local store's own naming, so its newest-first order holds.
                    let name = format!("{}-{}.json", d.updated.to_string().replace([':', '-'], ""), d.deploy_id);
                    write_atomic(&history.join(name), serde_json::to_string_pretty(d)?.as_bytes())?;
                }
                Ok(())
            }
            Side::Postgres(pg) => pg.import_history(deploys),
        }
    }

    /// Retires the unfinished journal once it lives elsewhere.
    fn retire_unfinished(&self) -> anyhow::Result<String> {
        match self {
            Side::Local(dir) => {
                // Kept under another name rather than deleted: the operator may want to look.
                let moved = dir.path.join(format!(
                    "journal.jsonl.moved-{}",
                    crate::checkpoint::now().to_string().replace([':', '-'], "")
                ));
                fs_err::rename(dir.journal_path(), &moved)?;
                let _ = fs_err::remove_file(dir.snapshot_path());
                Ok(format!("the source journal is kept as {}", moved.display()))
            }
            Side::Postgres(pg) => {
                pg.remove_unfinished()?;
                Ok("the source journal was removed from the database".into())
            }
        }
    }

    fn lock(&self) -> anyhow::Result<Box<dyn LockGuard>> {
        self.store().lock("state migrate").map_err(|e| match e {
            crate::lock::LockError::Held { dir, holder } => {
                Refusal::new(Code::Locked, format!("another run holds the lock on {dir}: {holder}"))
                    .with_hint("wait for it to finish, then migrate")
                    .into()
            }
            crate::lock::LockError::Io(e) => e,
        })
    }
}

/// Reads every record of a local journal (a torn last line from a crash is ignored, as the
/// local store does).
fn local_entries(dir: &StateDir) -> anyhow::Result<Option<Vec<Entry>>> {
    let path = dir.journal_path();
    if !path.exists() {
        return Ok(None);
    }
    let text = fs_err::read_to_string(&path)?;
    let mut entries = Vec::new();
    for (i, line) in text.split_inclusive('\n').enumerate().skip(1) {
        if !line.ends_with('\n') {
            break;
        }
        let entry: Entry = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: unreadable journal record", path.display(), i + 1))?;
        entries.push(entry);
    }
    // The header and its version check are the local store's: loading through it validates.
    dir.load_unfinished()?;
    Ok(Some(entries))
}

fn local_history(dir: &StateDir) -> anyhow::Result<Vec<Deploy>> {
    let history = dir.history_dir();
    if !history.exists() {
        return Ok(Vec::new());
    }
    let mut files: Vec<_> = fs_err::read_dir(&history)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| serde_json::from_str(&fs_err::read_to_string(p)?).with_context(|| format!("reading {}", p.display())))
        .collect()
}

/// Folds records as loading does.
fn fold(entries: &[Entry]) -> Deploy {
    let mut deploy = Deploy::empty();
    for e in entries {
        deploy.apply(e.seq, &e.ts, &e.record);
    }
    deploy
}

/// The stack a local directory's checkpoint belongs to, from its records.
fn local_stack_name(dir: &StateDir) -> anyhow::Result<Option<String>> {
    if let Some(d) = dir.load_unfinished()? {
        return Ok(Some(d.stack));
    }
    Ok(dir.last_finished()?.map(|d| d.stack).filter(|s| !s.is_empty()))
}

/// `rdeploy state migrate --from A --to B [--stack NAME]`; returns what was done, in words.
pub fn migrate(from: &str, to: &str, stack: Option<&str>) -> anyhow::Result<String> {
    let bad = |message: String, hint: &str| -> anyhow::Error {
        Refusal::new(Code::BadInput, message).with_hint(hint.to_string()).into()
    };
    if from == to {
        return Err(bad("`--from` and `--to` are the same store".into(), "name the other store in `--to`"));
    }
    let name = match (stack, is_url(from)) {
        (Some(name), _) => {
            if !is_url(from) {
                if let Some(recorded) = local_stack_name(&StateDir::new(from))? {
                    if recorded != name {
                        return Err(bad(
                            format!("{from} holds the checkpoint of stack `{recorded}`, not `{name}`"),
                            "pass the right `--stack`, or leave it out",
                        ));
                    }
                }
            }
            name.to_string()
        }
        (None, false) => local_stack_name(&StateDir::new(from))?.ok_or_else(|| {
            bad(
                format!("no checkpoint is recorded in {from}"),
                "name the state directory of a stack that has run (`.rdeploy/` beside its stack file)",
            )
        })?,
        (None, true) => {
            return Err(bad(
                "a database holds many stacks: say which one".into(),
                "add `--stack NAME` (the `name:` of the stack file)",
            ))
        }
    };
    let side = |s: &str| -> anyhow::Result<Side> {
        Ok(if is_url(s) {
            Side::Postgres(PostgresStore::open(s, &name, None)?)
        } else {
            if !Path::new(s).exists() && s == from {
                return Err(bad(
                    format!("no state directory at {s}"),
                    "pass the state directory (`.rdeploy/` beside the stack file)",
                ));
            }
            Side::Local(StateDir::new(s))
        })
    };
    let (source, dest) = (side(from)?, side(to)?);
    let _source_lock = source.lock()?;
    let _dest_lock = dest.lock()?;

    let entries = source.entries()?;
    let history = source.history()?;
    if entries.is_none() && history.is_empty() {
        return Ok(format!("nothing to migrate: no checkpoint of stack `{name}` in {}", source.store().location()));
    }
    if entries.is_some() && dest.store().has_unfinished()? {
        return Err(bad(
            format!("{} already records an unfinished deploy of stack `{name}`", dest.store().location()),
            "recover or reset it there first, or migrate into another store",
        ));
    }

    // History: skip what the destination already has, so moving back and forth adds nothing.
    let known: Vec<(String, Timestamp)> = dest.history()?.into_iter().map(|d| (d.deploy_id, d.updated)).collect();
    let new_history: Vec<Deploy> =
        history.into_iter().filter(|d| !known.contains(&(d.deploy_id.clone(), d.updated))).collect();
    dest.add_history(&new_history)?;

    let mut said = vec![format!("{} finished deploy(s) copied to the history", new_history.len())];
    if let Some(entries) = entries {
        let expected = fold(&entries);
        let mut journal = dest.store().create_journal()?;
        for entry in &entries {
            journal.append(entry)?;
        }
        journal.sync()?;
        journal.snapshot(&expected)?;
        drop(journal);
        let copied = dest.store().load_unfinished()?;
        if copied.as_ref() != Some(&expected) {
            anyhow::bail!(
                "the copy in {} does not read back as the original; the source is left as it was",
                dest.store().location()
            );
        }
        said.push(format!("unfinished deploy {} moved ({} records)", expected.deploy_id, entries.len()));
        said.push(source.retire_unfinished()?);
    }
    Ok(format!(
        "migrated stack `{name}` from {} to {}: {}",
        source.store().location(),
        dest.store().location(),
        said.join("; ")
    ))
}

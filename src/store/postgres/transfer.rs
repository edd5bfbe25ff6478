//! `rdeploy state migrate`: moves a stack's checkpoint (the unfinished deploy's journal, record
//! by record, and the history of finished deploys) between a local state directory and
//! PostgreSQL, either way. Both sides are locked meanwhile; the copy is checked by folding it
//! back; then the source's unfinished journal is retired so the deploy cannot be resumed twice.

use std::path::Path;

use super::{is_url, PostgresStore};
use crate::checkpoint::{Deploy, Entry, Timestamp};
use crate::exit::{Code, Refusal};
use crate::store::local::LocalStore;
use crate::store::{LockError, LockGuard, Store};

/// One side of a migration: any store, through the [`Store`] contract.
struct Side(Box<dyn Store>);

impl Side {
    fn store(&self) -> &dyn Store {
        self.0.as_ref()
    }

    fn lock(&self) -> anyhow::Result<Box<dyn LockGuard>> {
        self.store().lock("state migrate").map_err(|e| match e {
            LockError::Held { dir, holder } => {
                Refusal::new(Code::Locked, format!("another run holds the lock on {dir}: {holder}"))
                    .with_hint("wait for it to finish, then migrate")
                    .into()
            }
            LockError::Io(e) => e,
        })
    }
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
fn local_stack_name(dir: &LocalStore) -> anyhow::Result<Option<String>> {
    if let Some(d) = dir.load_unfinished()? {
        return Ok(Some(d.stack));
    }
    Ok(dir.last_finished()?.map(|d| d.stack).filter(|s| !s.is_empty()))
}

/// The local directory to migrate from: `dir` itself when it holds a checkpoint (or is not a
/// shared root), else its stack directory `dir/NAME` (per-stack layout): the one `stack`
/// names, or the only one that holds a checkpoint.
fn stack_dir_in(dir: &str, stack: Option<&str>) -> anyhow::Result<String> {
    let root = Path::new(dir);
    if local_stack_name(&LocalStore::at_path(dir))?.is_some() || !root.is_dir() {
        return Ok(dir.to_string());
    }
    if let Some(name) = stack {
        let own = root.join(name);
        return Ok(if own.is_dir() { own.to_string_lossy().into_owned() } else { dir.to_string() });
    }
    let mut found = Vec::new();
    for entry in fs_err::read_dir(root)? {
        let path = entry?.path();
        if path.is_dir() && local_stack_name(&LocalStore::at_path(&path))?.is_some() {
            found.push(path.to_string_lossy().into_owned());
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Ok(dir.to_string()),
        _ => {
            Err(Refusal::new(Code::BadInput, format!("{dir} holds the state of {} stacks: say which one", found.len()))
                .with_hint("add `--stack NAME` (the `name:` of the stack file)".to_string())
                .into())
        }
    }
}

/// `rdeploy state migrate --from A --to B [--stack NAME]`; returns what was done, in words.
pub fn migrate(from: &str, to: &str, stack: Option<&str>) -> anyhow::Result<String> {
    let bad = |message: String, hint: &str| -> anyhow::Error {
        Refusal::new(Code::BadInput, message).with_hint(hint.to_string()).into()
    };
    if from == to {
        return Err(bad("`--from` and `--to` are the same store".into(), "name the other store in `--to`"));
    }
    // `.rdeploy/` beside stack files keeps one directory per stack: `--from .rdeploy` means the
    // stack's own (the one `--stack` names, else the only one that holds a checkpoint).
    let from_dir;
    let from = if is_url(from) {
        from
    } else {
        from_dir = stack_dir_in(from, stack)?;
        from_dir.as_str()
    };
    let name = match (stack, is_url(from)) {
        (Some(name), _) => {
            if !is_url(from) {
                if let Some(recorded) = local_stack_name(&LocalStore::at_path(from))? {
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
        (None, false) => local_stack_name(&LocalStore::at_path(from))?.ok_or_else(|| {
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
            Side(Box::new(PostgresStore::open(s, &name, None)?))
        } else {
            if !Path::new(s).exists() && s == from {
                return Err(bad(
                    format!("no state directory at {s}"),
                    "pass the state directory (`.rdeploy/` beside the stack file)",
                ));
            }
            Side(Box::new(LocalStore::at_path(s)))
        })
    };
    let (source, dest) = (side(from)?, side(to)?);
    let _source_lock = source.lock()?;
    let _dest_lock = dest.lock()?;

    let entries = source.store().entries()?;
    let history = source.store().history()?;
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
    let known: Vec<(String, Timestamp)> =
        dest.store().history()?.into_iter().map(|d| (d.deploy_id, d.updated)).collect();
    let new_history: Vec<Deploy> =
        history.into_iter().filter(|d| !known.contains(&(d.deploy_id.clone(), d.updated))).collect();
    dest.store().import_history(&new_history)?;

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
        said.push(source.store().retire_unfinished()?);
    }
    Ok(format!(
        "migrated stack `{name}` from {} to {}: {}",
        source.store().location(),
        dest.store().location(),
        said.join("; ")
    ))
}

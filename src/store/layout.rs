//! Where a stack's state directory is by default, and the move of a state directory written
//! before stacks had one each.
//!
//! Every stack file of a directory shares `.rdeploy/` beside it, and each stack keeps its state
//! in `.rdeploy/<name>/` (its `name:`), so `prod.yaml` and `dev.yaml` side by side never read
//! each other's checkpoint. A directory given with `--state-dir` is that stack's state itself
//! (nothing is keyed under it). rdeploy before this layout kept one stack's files directly in
//! `.rdeploy/`; the first run that meets such a directory moves them into `.rdeploy/<name>/`,
//! under the old directory's lock, before anything reads them.
//!
//! The move is made crash-safe by going through a hidden directory: every old file is renamed
//! into `.rdeploy/.moving-<name>/` (each rename atomic), then that directory is renamed to
//! `.rdeploy/<name>/` (atomic too). Until that last rename nothing is read from the new place; a
//! run killed part-way leaves the hidden directory, and the next run finishes the move.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::exit::{Code, Refusal};
use crate::store::local::{lock::Lock, LocalStore};
use crate::store::state_dir::{sync_dir, StateDir};
use crate::store::{LockError, Store as _};

/// What an old single-stack state directory held at its top: the journal and its files, the
/// snapshot, the report, the steps' work and log directories, the history, the running notes.
/// Only these move; anything else (the fleet's shared records in `fleet/`, another stack's
/// directory) stays where it is.
const OLD_ENTRIES: &[&str] = &[
    "journal.jsonl",
    "journal.seq",
    "journal.jsonl.quarantine",
    "snapshot.json",
    "report.md",
    "steps",
    "logs",
    "history",
    "running",
];

/// What the shared `.rdeploy/` holds beside the stacks' directories, by name: a stack named so
/// would have its state mixed with it (a stack `fleet` writing into the fleet's records). The old
/// layout's entries (`history`, `logs`, ...) are not reserved: a stack's directory holds a `lock`
/// and theirs does not, so the move tells them apart. `None` for a name free to use. Names are
/// compared ignoring case, as the file systems of macOS and Windows compare them.
pub fn reserved(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    match name.as_str() {
        "fleet" => Some("the fleet's records (`.rdeploy/fleet/`), shared by every stack beside it"),
        "lock" => Some("the lock of the shared `.rdeploy/` itself"),
        _ => None,
    }
}

/// The prefix of the hidden directory a move goes through.
const MOVING: &str = ".moving-";

/// The state directory of the stack `name` whose stack file is in `stack_dir`: `.rdeploy/<name>/`
/// there, after moving an old single-stack `.rdeploy/` into it (or into the directory of the
/// stack it recorded). Returns the directory and, when something moved, what, in words.
pub fn default_state_dir(stack_dir: &Path, name: &str) -> anyhow::Result<(StateDir, Option<String>)> {
    let root = stack_dir.join(".rdeploy");
    let state = StateDir::keyed(&root, name);
    if !holds_old_layout(&root) {
        return Ok((state, None));
    }
    let moved = move_old_layout(&root, name)?;
    Ok((state, moved))
}

/// Whether `root` holds files of the single-stack layout, or a move that was cut short.
fn holds_old_layout(root: &Path) -> bool {
    // `lstat`: a file of the old layout is a regular file; a stack named `history` is a
    // directory holding a `lock` of its own, where the old `history/` holds deploy records only.
    let is_file = |name: &str| fs_err::symlink_metadata(root.join(name)).is_ok_and(|m| m.is_file());
    ["journal.jsonl", "snapshot.json", "journal.seq", "report.md"].iter().any(|f| is_file(f))
        || (root.join("history").is_dir() && !root.join("history/lock").exists())
        || moving_dir(root).is_some()
}

/// A hidden directory a cut-short move left, and the stack it was moving for.
fn moving_dir(root: &Path) -> Option<(PathBuf, String)> {
    let entries = std::fs::read_dir(root).ok()?;
    entries.flatten().find_map(|e| {
        let name = e.file_name().to_str()?.strip_prefix(MOVING)?.to_string();
        Some((e.path(), name))
    })
}

/// Moves the old layout's files into `root/<recorded stack>/` (the stack the records name, else
/// `name`), under the old directory's lock. Returns what moved, in words.
fn move_old_layout(root: &Path, name: &str) -> anyhow::Result<Option<String>> {
    let old = StateDir::new(root);
    let _lock = Lock::acquire(&old, "up (moving the state directory to the per-stack layout)").map_err(|e| match e {
        LockError::Held { dir, holder } => anyhow::Error::from(
            Refusal::new(
                Code::Locked,
                format!("{dir} is in use by {holder}; its files are to move into a directory per stack first"),
            )
            .with_hint("wait for that run to end (an rdeploy older than this one keeps its files there), then run this again"),
        ),
        LockError::Io(e) => e,
    })?;
    // Another run may have finished the move while this one waited for nothing (the lock never
    // waits, but the check above ran before it was taken).
    if !holds_old_layout(root) {
        return Ok(None);
    }
    let (tmp, owner) = match moving_dir(root) {
        Some(found) => found,
        None => {
            let recorded = recorded_stack(root)?.unwrap_or_else(|| name.to_string());
            (root.join(format!("{MOVING}{recorded}")), recorded)
        }
    };
    let target = root.join(&owner);
    if fs_err::symlink_metadata(&target).is_ok() {
        return Err(Refusal::new(
            Code::BadInput,
            format!(
                "{} holds the state of stack `{owner}` in the layout of an older rdeploy, and {} exists too; not moving one onto the other",
                root.display(),
                target.display()
            ),
        )
        .with_hint(format!(
            "keep the one to use: move the other away (`mv {} {}.old`), then run this again",
            target.display(),
            target.display()
        ))
        .into());
    }
    old.create_dir(&tmp)?;
    let mut moved = Vec::new();
    for entry in OLD_ENTRIES {
        let from = root.join(entry);
        if fs_err::symlink_metadata(&from).is_err() {
            continue;
        }
        // A stack named like an old entry (`logs`, `steps`) keeps its own state directory
        // here in the new layout (it holds a lock file): never moved into another stack's.
        if from.join("lock").exists() {
            continue;
        }
        fs_err::rename(&from, tmp.join(entry))?;
        moved.push(*entry);
    }
    sync_dir(&tmp)?;
    fs_err::rename(&tmp, &target).with_context(|| format!("moving the state of stack `{owner}` into place"))?;
    sync_dir(root)?;
    Ok(Some(format!(
        "moved the state of stack `{owner}` from {} into {} (one directory per stack now)",
        root.display(),
        target.display()
    )))
}

/// The stack the old layout's records name (the unfinished deploy, else the last finished one).
fn recorded_stack(root: &Path) -> anyhow::Result<Option<String>> {
    let store = LocalStore::at_path(root);
    if let Some(d) = store.load_unfinished()? {
        if !d.stack.is_empty() {
            return Ok(Some(d.stack));
        }
    }
    Ok(store.last_finished()?.map(|d| d.stack).filter(|s| !s.is_empty()))
}

/// Refuses (exit 2), on every command, a directory given with `--state-dir` that holds the
/// checkpoint of another stack: that directory is one stack's state, never shared.
pub fn refuse_another_stack(store: &LocalStore, name: &str) -> anyhow::Result<()> {
    let recorded = match store.load_unfinished()? {
        Some(d) if !d.stack.is_empty() => Some(d.stack),
        _ => store.last_finished()?.map(|d| d.stack).filter(|s| !s.is_empty()),
    };
    match recorded {
        Some(other) if other != name => Err(Refusal::new(
            Code::BadInput,
            format!("the state directory {} belongs to stack `{other}`, not `{name}`", store.location()),
        )
        .with_hint(format!(
            "give each stack its own: `--state-dir {}`, or leave `--state-dir` out (each stack keeps `.rdeploy/<name>/` beside its file)",
            store.dir().path.with_file_name(format!(
                "{}-{name}",
                store.dir().path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| ".rdeploy".into())
            )).display()
        ))
        .into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_the_shared_directory_holds_are_reserved() {
        for name in ["fleet", "lock", "Fleet", "LOCK"] {
            assert!(reserved(name).is_some(), "{name}");
        }
        // The old layout's entries are told apart from a stack's directory by the lock inside
        // it, so a stack may keep a name such as `history` it had before.
        for name in ["shop", "fleet-app", "locks", "app_history", "history", "logs", "steps", "running"] {
            assert_eq!(reserved(name), None, "{name}");
        }
    }

    #[test]
    fn a_cut_short_move_is_finished_by_the_next_run() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join(".rdeploy");
        rdeploy_adapters::private::create_dir_all(&root.join(".moving-shop/logs")).unwrap();
        std::fs::write(root.join(".moving-shop/logs/a.log"), "a").unwrap();
        std::fs::write(root.join("report.md"), "r").unwrap();
        let (state, moved) = default_state_dir(tmp.path(), "other").unwrap();
        assert_eq!(state.path, root.join("other"));
        assert!(moved.unwrap().contains("stack `shop`"));
        assert_eq!(std::fs::read_to_string(root.join("shop/logs/a.log")).unwrap(), "a");
        assert_eq!(std::fs::read_to_string(root.join("shop/report.md")).unwrap(), "r");
        assert!(moving_dir(&root).is_none());
        assert!(!holds_old_layout(&root));
    }

    #[test]
    fn a_stack_named_like_an_old_file_is_not_taken_for_the_old_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join(".rdeploy");
        rdeploy_adapters::private::create_dir_all(&root.join("history/history")).unwrap();
        std::fs::write(root.join("history/lock"), "").unwrap();
        assert!(!holds_old_layout(&root));
    }
}

//! The store contract, as one generic suite every backend must pass (in the manner of
//! OpenTofu's `statemgr.TestFull`): [`full`] drives a fresh, empty store through locking,
//! a deploy's journal, snapshot, reopening, archiving, history import and retirement, and
//! checks each answer against the records folded by [`Deploy::apply`] itself.

use rdeploy_adapters::{SubStatus, Tool};

use super::{LockError, Store};
use crate::checkpoint::{Deploy, DeployState, Entry, Record, StepHeader, StepMode, Timestamp};

fn run_record(run_id: &str) -> Record {
    Record::Run {
        run_id: run_id.into(),
        command: "up".into(),
        stack: "contract".into(),
        stack_file: "stack.yaml".into(),
        stack_digest: "digest".into(),
        steps: ["seed", "after"]
            .iter()
            .map(|n| StepHeader {
                name: n.to_string(),
                tool: Tool::Shell,
                resumable: true,
                digest: "d".into(),
                has_revert: false,
            })
            .collect(),
        host: "h".into(),
        pid: 1,
        rdeploy_version: "0".into(),
    }
}

pub(super) fn entries(run_id: &str) -> Vec<Entry> {
    let records = vec![
        run_record(run_id),
        Record::StepStarted { step: "seed".into(), mode: StepMode::Apply, tool_version: None },
        Record::Planned { step: "seed".into(), ids: vec!["a".into(), "b".into()] },
        Record::SubStarted { step: "seed".into(), id: "a".into() },
        Record::SubDone { step: "seed".into(), id: "a".into(), note: Some("ok".into()) },
        Record::SubStarted { step: "seed".into(), id: "b".into() },
    ];
    records
        .into_iter()
        .enumerate()
        .map(|(i, record)| Entry { seq: i as u64 + 1, ts: ts(&format!("2026-01-01T00:00:{i:02}Z")), record })
        .collect()
}

fn ts(text: &str) -> Timestamp {
    Timestamp::parse(text).expect("a test timestamp")
}

fn fold(entries: &[Entry]) -> Deploy {
    let mut d = Deploy::empty();
    for e in entries {
        d.apply(e.seq, &e.ts, &e.record);
    }
    d
}

/// Every store must pass this, starting empty. `reopen` gives a second handle on the same
/// store (another process, as far as the store can tell).
pub fn full(store: &dyn Store, reopen: &dyn Fn() -> Box<dyn Store>) {
    // Empty.
    assert!(!store.has_unfinished().unwrap());
    assert!(store.load_unfinished().unwrap().is_none());
    assert!(store.last_finished().unwrap().is_none());
    assert!(store.entries().unwrap().is_none());
    assert!(store.history().unwrap().is_empty());

    // One holder at a time, and the second is told who.
    let lock = store.lock("up").unwrap();
    assert!(lock.took_over_from().is_none());
    let other = reopen();
    match other.lock("recover") {
        Err(LockError::Held { holder, .. }) => assert!(holder.contains("`rdeploy up`"), "{holder}"),
        Err(e) => panic!("a second lock must be refused as held, not fail: {e}"),
        Ok(_) => panic!("a second lock must be refused"),
    }
    assert_eq!(other.holder().expect("the holder is visible").command, "up");

    // A journal reads back as the records folded, from this handle and another.
    let all = entries("r1");
    let mut journal = store.create_journal().unwrap();
    for e in &all[..4] {
        journal.append(e).unwrap();
    }
    journal.sync().unwrap();
    journal.snapshot(&fold(&all[..4])).unwrap();
    for e in &all[4..] {
        journal.append(e).unwrap();
    }
    journal.sync().unwrap();
    drop(journal);
    let expected = fold(&all);
    assert!(store.has_unfinished().unwrap());
    assert_eq!(store.load_unfinished().unwrap().as_ref(), Some(&expected));
    assert_eq!(other.load_unfinished().unwrap().as_ref(), Some(&expected));
    assert_eq!(store.entries().unwrap().as_deref(), Some(&all[..]));
    let settled = store.load_settled(false).unwrap().unwrap();
    assert_eq!(settled.step("seed").unwrap().status, crate::checkpoint::StepStatus::Failed, "a dead run's step");

    // Reopened, it goes on from the right sequence.
    let (mut journal, deploy) = store.open_journal().unwrap();
    assert_eq!(deploy, expected);
    assert!(journal.lost().is_none());
    let next = Entry {
        seq: 7,
        ts: ts("2026-01-01T00:00:07Z"),
        record: Record::SubDone { step: "seed".into(), id: "b".into(), note: None },
    };
    journal.append(&next).unwrap();
    let finished =
        Entry { seq: 8, ts: ts("2026-01-01T00:00:08Z"), record: Record::Finished { state: DeployState::Complete } };
    journal.append(&finished).unwrap();
    journal.sync().unwrap();
    let mut all = all;
    all.extend([next, finished]);
    let done = fold(&all);
    assert_eq!(done.step("seed").unwrap().count(SubStatus::Done), 2);
    assert_eq!(store.load_unfinished().unwrap().as_ref(), Some(&done));

    // Archived: no unfinished deploy, and it is the last finished one.
    journal.archive(&done).unwrap();
    drop(journal);
    assert!(!store.has_unfinished().unwrap());
    assert!(store.entries().unwrap().is_none());
    assert_eq!(store.last_finished().unwrap().as_ref(), Some(&done));
    assert_eq!(store.history().unwrap(), vec![done.clone()]);

    // Imported history comes after, oldest first.
    let mut later = fold(&entries("r2"));
    later.state = DeployState::Reverted;
    later.updated = ts("2026-01-02T00:00:00Z");
    store.import_history(std::slice::from_ref(&later)).unwrap();
    assert_eq!(store.history().unwrap(), vec![done, later.clone()]);
    assert_eq!(store.last_finished().unwrap().as_ref(), Some(&later));

    // A retired journal is no longer unfinished here.
    let mut journal = store.create_journal().unwrap();
    for e in entries("r3") {
        journal.append(&e).unwrap();
    }
    journal.sync().unwrap();
    drop(journal);
    assert!(store.has_unfinished().unwrap());
    let said = store.retire_unfinished().unwrap();
    assert!(!said.is_empty());
    assert!(!store.has_unfinished().unwrap());
    assert!(store.load_unfinished().unwrap().is_none());

    // Released on drop: the next run takes it without a takeover.
    drop(lock);
    let again = other.lock("up").unwrap();
    assert!(again.took_over_from().is_none(), "a clean release leaves no holder behind");
}

mod tests {
    use super::full;
    use crate::store::local::LocalStore;
    use crate::store::postgres::test_server as pg;
    use crate::store::postgres::PostgresStore;
    use crate::store::Store;

    #[test]
    fn the_local_store_keeps_the_contract() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".rdeploy");
        let store = LocalStore::at_path(&path);
        full(&store, &|| Box::new(LocalStore::at_path(&path)));
    }

    #[test]
    fn the_postgres_store_keeps_the_contract() {
        let server = pg::PgServer::start();
        let url = server.url();
        let store = PostgresStore::open(&url, "contract", None).unwrap();
        full(&store, &|| -> Box<dyn Store> { Box::new(PostgresStore::open(&url, "contract", None).unwrap()) });
    }
}

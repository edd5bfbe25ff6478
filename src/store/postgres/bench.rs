//! `rdeploy state bench` (hidden): the cost of a journal record in a store, measured through
//! the real [`Checkpoint`] path (a sub-change's start is synced, its end group-committed), so
//! `benches/store.sh` can compare PostgreSQL with the local directory.

use std::time::Instant;

use rdeploy_adapters::Tool;

use super::{is_url, PostgresStore};
use crate::checkpoint::{DeployState, Record, StepHeader, StepMode};
use crate::engine::journal::Checkpoint;
use crate::store::local::LocalStore;
use crate::store::Store;

/// Records `sub_changes` sub-changes (two records each) in a fresh deploy; returns one JSON line.
pub fn run(to: &str, sub_changes: usize) -> anyhow::Result<String> {
    let run_id = ulid::Ulid::new().to_string();
    let stack = format!("rdeploy-bench-{run_id}");
    let store: Box<dyn Store> = if is_url(to) {
        Box::new(PostgresStore::open(to, &stack, None)?)
    } else {
        Box::new(LocalStore::at_path(std::path::Path::new(to).join(&stack)))
    };
    let lock = store.lock("state bench").map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut cp = Checkpoint::create(store.as_ref(), &Default::default())?;
    cp.record(Record::Run {
        run_id,
        command: "state bench".into(),
        stack: stack.clone(),
        stack_file: "bench.yaml".into(),
        stack_digest: String::new(),
        steps: vec![StepHeader {
            name: "seed".into(),
            tool: Tool::Shell,
            resumable: true,
            digest: String::new(),
            has_revert: false,
        }],
        host: crate::store::hostname(),
        pid: std::process::id(),
        rdeploy_version: env!("CARGO_PKG_VERSION").into(),
    })?;
    cp.record(Record::StepStarted { step: "seed".into(), mode: StepMode::Apply, tool_version: None })?;
    let start = Instant::now();
    for i in 0..sub_changes {
        let id = format!("sub-{i}");
        cp.record(Record::SubStarted { step: "seed".into(), id: id.clone() })?;
        cp.record(Record::SubDone { step: "seed".into(), id, note: None })?;
    }
    cp.sync()?;
    let elapsed = start.elapsed();
    cp.record(Record::StepDone { step: "seed".into() })?;
    cp.finish(DeployState::Complete)?;
    drop(lock);
    let records = sub_changes * 2;
    Ok(serde_json::json!({
        "store": store.location(),
        "records": records,
        "seconds": elapsed.as_secs_f64(),
        "us_per_record": elapsed.as_secs_f64() * 1e6 / records.max(1) as f64,
    })
    .to_string())
}

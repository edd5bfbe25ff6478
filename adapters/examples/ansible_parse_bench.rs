//! Benchmark (not a test) for the ansible adapter: parse and turn into events the callback
//! records of a generated 5,000-host run (3 tasks per host, 1% failed, 0.5% unreachable, final
//! stats), read through the same file tail the adapter uses, then select recover's hosts.
//! Run: `cargo run --release -p rdeploy-adapters --example ansible_parse_bench [HOSTS]`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use rdeploy_adapters::ansible::callback::{parse_line, HostTracker, Tail};
use rdeploy_adapters::ansible::select_targets;
use rdeploy_adapters::{Event, PriorStep, PriorSubChange, SubStatus};

fn generate(hosts: &[String]) -> String {
    let mut out = String::new();
    out.push_str("{\"event\":\"playbook_start\",\"playbook\":\"site.yml\",\"v\":1}\n");
    out.push_str("{\"event\":\"play_start\",\"play\":\"fleet\",\"play_uuid\":\"p-1\",\"v\":1}\n");
    let mut stats = HashMap::new();
    for (t, task) in ["record start", "check for injected failure", "record finish"].iter().enumerate() {
        for (i, host) in hosts.iter().enumerate() {
            let unreachable = i % 200 == 7;
            let failed = i % 100 == 3;
            let entry = stats.entry(host.clone()).or_insert((0u32, 0u32, 0u32));
            if entry.1 > 0 || entry.2 > 0 {
                continue; // a failed or unreachable host gets no more tasks
            }
            let status = if unreachable && t == 0 {
                entry.2 += 1;
                "unreachable"
            } else if failed && t == 1 {
                entry.1 += 1;
                "failed"
            } else {
                entry.0 += 1;
                "changed"
            };
            let _ = writeln!(
                out,
                "{{\"event\":\"result\",\"status\":\"{status}\",\"host\":\"{host}\",\"task\":\"{task}\",\"task_uuid\":\"t-{t}\",\"play\":\"fleet\",\"msg\":\"{}\",\"rescuable\":false,\"v\":1}}",
                if status == "changed" { "" } else { "injected failure or connection refused" }
            );
        }
    }
    let hosts_json: Vec<String> = hosts
        .iter()
        .map(|h| {
            let (ok, failed, unreachable) = stats[h];
            format!("\"{h}\":{{\"ok\":{ok},\"failures\":{failed},\"unreachable\":{unreachable},\"changed\":{ok},\"skipped\":0,\"rescued\":0,\"ignored\":0}}")
        })
        .collect();
    let _ = writeln!(
        out,
        "{{\"event\":\"stats\",\"hosts\":{{{}}},\"failed_hosts\":[],\"unreachable_hosts\":[],\"aborted\":false,\"v\":1}}",
        hosts_json.join(",")
    );
    out
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5_000);
    let hosts: Vec<String> = (1..=n).map(|i| format!("host{i:05}.example.internal")).collect();
    let stream = generate(&hosts);
    let dir = std::env::temp_dir().join(format!("rdeploy-ansible-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("events.jsonl");
    std::fs::write(&path, &stream).unwrap();

    let mut best = f64::MAX;
    let mut summary = (0, 0, 0, 0);
    for _ in 0..5 {
        let started = Instant::now();
        let mut tail = Tail::new(std::fs::File::open(&path).unwrap());
        let mut tracker = HostTracker::new(hosts.clone());
        // Stand-in for the driver's journal: every sub-change event serialized to a line.
        let mut journal: Vec<String> = Vec::with_capacity(3 * n);
        let mut events = Vec::new();
        for line in tail.read_lines().unwrap() {
            if let Some(record) = parse_line(&line).unwrap() {
                tracker.observe(record, &mut events);
            }
        }
        tracker.finish(Some(2), &mut events);
        let (mut done, mut failed, mut started_n) = (0, 0, 0);
        for event in &events {
            match event {
                Event::Done { .. } => done += 1,
                Event::Failed { .. } => failed += 1,
                Event::Started { .. } => started_n += 1,
                _ => {}
            }
            journal.push(format!("{event:?}"));
        }
        best = best.min(started.elapsed().as_secs_f64());
        summary = (stream.lines().count(), started_n, done, failed);
    }

    let prior = PriorStep {
        sub_changes: hosts
            .iter()
            .enumerate()
            .map(|(i, h)| PriorSubChange {
                id: h.clone(),
                status: if i % 100 == 3 { SubStatus::Failed } else { SubStatus::Done },
                error: None,
            })
            .collect(),
        facts: Default::default(),
    };
    let started = Instant::now();
    let selection = select_targets(&hosts, &prior);
    let select = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);

    let (lines, started_n, done, failed) = summary;
    println!(
        "{n} hosts: {lines} records ({} KiB) -> {started_n} started, {done} done, {failed} failed in {:.1} ms (best of 5); recover selection of {} hosts in {:.2} ms",
        stream.len() / 1024,
        best * 1000.0,
        selection.targets.len(),
        select * 1000.0
    );
}

//! Parses the JSON lines written by rdeploy's callback plugin (`rdeploy_events.py`) and turns
//! them into per-host sub-change events: failed the moment a task fails, done only once the
//! play recap confirms it, pending when the play aborted before the host finished.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use serde::Deserialize;

use super::recap::RecapLine;
use crate::Event;

/// The record format the plugin writes (`FORMAT` in the plugin); newer formats are refused.
pub const FORMAT: u32 = 1;

/// Errors reading the callback's output.
#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    #[error("a callback record is not valid json ({source}): {line}")]
    Json { line: String, source: serde_json::Error },
    #[error("callback record format {found} is newer than this rdeploy understands ({FORMAT})")]
    Format { found: u32 },
}

/// One line of the plugin's output.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Record {
    PlaybookStart {
        playbook: Option<String>,
    },
    PlayStart {
        play: Option<String>,
    },
    NoHostsRemaining {
        play: Option<String>,
    },
    /// Hosts the run targets, written before any task runs on them: at the playbook's start
    /// those of every play whose `hosts` has no template, and at each play's start that play's
    /// own (as ansible selected them, `--limit` applied).
    Hosts {
        hosts: Vec<String>,
    },
    Result(TaskResult),
    Stats(Stats),
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct TaskResult {
    pub status: ResultStatus,
    pub host: String,
    pub task: String,
    #[serde(default)]
    pub task_uuid: Option<String>,
    #[serde(default)]
    pub play: Option<String>,
    #[serde(default)]
    pub msg: String,
    /// The task sits in a block with `rescue`: ansible may still rescue the host.
    #[serde(default)]
    pub rescuable: bool,
    /// What `--diff` showed for the task (check mode previews read it).
    #[serde(default)]
    pub diff: Vec<TaskDiff>,
    /// After this result the host had nothing left in the play (no task, no notified
    /// handler), as ansible's own play iterator says; `None` when the plugin could not tell.
    #[serde(default)]
    pub finished: Option<bool>,
}

/// One item of a task's `--diff` output: the texts before and after, or a diff the module
/// prepared itself.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct TaskDiff {
    #[serde(default)]
    pub before: Option<String>,
    #[serde(default)]
    pub after: Option<String>,
    #[serde(default)]
    pub before_header: Option<String>,
    #[serde(default)]
    pub after_header: Option<String>,
    #[serde(default)]
    pub prepared: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultStatus {
    Ok,
    Changed,
    Skipped,
    Failed,
    Ignored,
    Unreachable,
}

/// The final per-host counts, and what ansible knew about aborted plays.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Stats {
    pub hosts: HashMap<String, HostStats>,
    /// Hosts ansible marked failed, including those any_errors_fatal or max_fail_percentage
    /// stopped without counting a failure. `None` when the plugin could not see them.
    #[serde(default)]
    pub failed_hosts: Option<Vec<String>>,
    #[serde(default)]
    pub unreachable_hosts: Option<Vec<String>>,
    /// `None` when unknown (recap-only fallback).
    #[serde(default)]
    pub aborted: Option<bool>,
    #[serde(default)]
    pub abort: Option<Abort>,
    /// The play's aggregate `set_stats` data: the step's outputs.
    #[serde(default)]
    pub custom: serde_json::Map<String, serde_json::Value>,
}

/// Where ansible broke out of the play loop.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Abort {
    #[serde(default)]
    pub play: Option<String>,
    /// Whether the aborted play was the playbook's last: if not, later plays never ran.
    pub last_play: bool,
    /// The serial batch that was running when the play aborted.
    pub batch: Vec<String>,
    /// Every host the aborted play targets, over all its batches.
    pub play_hosts: Vec<String>,
}

/// `summarize(host)` from ansible's AggregateStats (`failures` where the recap says `failed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct HostStats {
    #[serde(default)]
    pub ok: u64,
    #[serde(default)]
    pub changed: u64,
    #[serde(default)]
    pub unreachable: u64,
    #[serde(default)]
    pub failures: u64,
    #[serde(default)]
    pub skipped: u64,
    #[serde(default)]
    pub rescued: u64,
    #[serde(default)]
    pub ignored: u64,
}

impl From<&RecapLine> for HostStats {
    fn from(r: &RecapLine) -> HostStats {
        HostStats {
            ok: r.ok,
            changed: r.changed,
            unreachable: r.unreachable,
            failures: r.failed,
            skipped: r.skipped,
            rescued: r.rescued,
            ignored: r.ignored,
        }
    }
}

#[derive(Deserialize)]
struct Version {
    #[serde(default)]
    v: u32,
}

/// Parses one line of the plugin's output. Blank lines are `Ok(None)`.
pub fn parse_line(line: &str) -> Result<Option<Record>, CallbackError> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    let json = |source| CallbackError::Json { line: line.chars().take(200).collect(), source };
    let version: Version = serde_json::from_str(line).map_err(json)?;
    if version.v > FORMAT {
        return Err(CallbackError::Format { found: version.v });
    }
    // Events added by a later plugin of the same format are skipped, not fatal.
    match serde_json::from_str::<Record>(line) {
        Ok(record) => Ok(Some(record)),
        Err(e) if e.is_data() && !line.contains("\"event\":\"result\"") && !line.contains("\"event\":\"stats\"") => {
            Ok(None)
        }
        Err(source) => Err(json(source)),
    }
}

/// How a host ended, as far as this run can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostOutcome {
    Done,
    Failed(String),
    Unreachable(String),
    Pending(String),
}

#[derive(Default)]
struct HostState {
    started: bool,
    /// A failure has been reported (failed or unreachable); nothing more is emitted.
    reported: Option<HostOutcome>,
    /// A failure inside a block with `rescue`: reported only if the recap still counts it.
    deferred_failure: Option<String>,
    /// The host's last result of the current play left it nothing to run: a play aborted by
    /// another host's failure (max_fail_percentage, any_errors_fatal) did not cut it short.
    finished_play: bool,
}

/// Follows one ansible-playbook run: feed it records as they arrive, then `finish`.
pub struct HostTracker {
    planned: Vec<String>,
    hosts: HashMap<String, HostState>,
    /// Hosts seen in records but not planned (add_host), in order of appearance.
    extra: Vec<String>,
    stats: Option<Stats>,
    no_hosts_remaining: bool,
    records: usize,
}

impl HostTracker {
    pub fn new(planned: Vec<String>) -> HostTracker {
        let hosts = planned.iter().map(|h| (h.clone(), HostState::default())).collect();
        HostTracker { planned, hosts, extra: Vec::new(), stats: None, no_hosts_remaining: false, records: 0 }
    }

    /// How many records were seen (none at all tells a parse error from an unreachable host).
    pub fn records(&self) -> usize {
        self.records
    }

    pub fn has_stats(&self) -> bool {
        self.stats.is_some()
    }

    /// The aggregate `set_stats` data the run reported (empty when none).
    pub fn custom_stats(&self) -> serde_json::Map<String, serde_json::Value> {
        self.stats.as_ref().map(|s| s.custom.clone()).unwrap_or_default()
    }

    /// Takes one record; returns the events it settles right away.
    pub fn observe(&mut self, record: Record, events: &mut Vec<Event>) {
        self.records += 1;
        match record {
            Record::Result(result) => self.observe_result(result, events),
            Record::Stats(stats) => self.stats = Some(stats),
            Record::NoHostsRemaining { .. } => self.no_hosts_remaining = true,
            Record::PlayStart { .. } => self.hosts.values_mut().for_each(|h| h.finished_play = false),
            Record::PlaybookStart { .. } => {}
            Record::Hosts { hosts } => {
                if self.plan(hosts) {
                    events.push(Event::Planned { ids: self.planned.clone() });
                }
            }
        }
    }

    /// The hosts planned so far, in natural order (web2 before web10).
    pub fn planned(&self) -> &[String] {
        &self.planned
    }

    /// Adds hosts the run targets to the plan; `true` when one was new. A host already seen
    /// in a result (added to the inventory by an earlier play's `add_host`) joins the plan too.
    fn plan(&mut self, hosts: Vec<String>) -> bool {
        let known: HashSet<&str> = self.planned.iter().map(String::as_str).collect();
        let mut new: Vec<String> = hosts.into_iter().filter(|h| !known.contains(h.as_str())).collect();
        new.sort();
        new.dedup();
        if new.is_empty() {
            return false;
        }
        self.extra.retain(|h| new.binary_search(h).is_err());
        for host in &new {
            self.hosts.entry(host.clone()).or_default();
        }
        self.planned.extend(new);
        self.planned.sort_by(|a, b| super::recap::natural_cmp(a, b));
        true
    }

    /// Uses the play recap from the human output when the plugin wrote no stats (it did not
    /// load, or a user's config broke it): done/failed/unreachable still come out right; an
    /// aborted play shows as `NO MORE HOSTS LEFT`.
    pub fn use_recap(&mut self, recap: &[RecapLine], no_more_hosts: bool) {
        if self.stats.is_some() || recap.is_empty() {
            return;
        }
        self.no_hosts_remaining |= no_more_hosts;
        self.stats = Some(Stats {
            hosts: recap.iter().map(|r| (r.host.clone(), HostStats::from(r))).collect(),
            ..Stats::default()
        });
    }

    fn state(&mut self, host: &str) -> &mut HostState {
        if !self.hosts.contains_key(host) {
            self.extra.push(host.to_string());
        }
        self.hosts.entry(host.to_string()).or_default()
    }

    fn observe_result(&mut self, result: TaskResult, events: &mut Vec<Event>) {
        let state = self.state(&result.host);
        if !state.started {
            state.started = true;
            events.push(Event::Started { id: result.host.clone() });
        }
        if state.reported.is_some() {
            return;
        }
        state.finished_play = result.finished == Some(true);
        match result.status {
            ResultStatus::Failed if result.rescuable => {
                state.deferred_failure.get_or_insert_with(|| failed_message(&result.task, &result.msg));
            }
            ResultStatus::Failed => {
                let error = failed_message(&result.task, &result.msg);
                state.reported = Some(HostOutcome::Failed(error.clone()));
                events.push(Event::Failed { id: result.host, error });
            }
            ResultStatus::Unreachable => {
                let error = unreachable_message(&result.task, &result.msg);
                state.reported = Some(HostOutcome::Unreachable(error.clone()));
                events.push(Event::Failed { id: result.host, error });
            }
            ResultStatus::Ok | ResultStatus::Changed | ResultStatus::Skipped | ResultStatus::Ignored => {}
        }
    }

    /// Settles every host once the run is over. `exit_code` is ansible-playbook's status.
    pub fn finish(&mut self, exit_code: Option<i32>, events: &mut Vec<Event>) -> Vec<(String, HostOutcome)> {
        let stats = self.stats.take();
        let mut order: Vec<String> = self.planned.iter().chain(self.extra.iter()).cloned().collect();
        // Hosts only the play recap names (the plugin did not load, so nothing planned them).
        let listed: HashSet<&str> = order.iter().map(String::as_str).collect();
        let mut recapped: Vec<String> = stats
            .as_ref()
            .map(|s| s.hosts.keys().filter(|h| !listed.contains(h.as_str())).cloned().collect())
            .unwrap_or_default();
        recapped.sort_by(|a, b| super::recap::natural_cmp(a, b));
        order.extend(recapped);
        let failed_marked: HashSet<&str> = stats
            .as_ref()
            .and_then(|s| s.failed_hosts.as_ref())
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let abort = stats.as_ref().and_then(|s| s.abort.as_ref());
        let abort_batch: HashSet<&str> =
            abort.map(|a| a.batch.iter().map(String::as_str).collect()).unwrap_or_default();
        let abort_play: HashSet<&str> =
            abort.map(|a| a.play_hosts.iter().map(String::as_str).collect()).unwrap_or_default();
        // Without the plugin's view of the executor (recap fallback) an any_errors_fatal abort
        // looks like a clean finish, so after a failed run no host is taken as done.
        let recap_only = stats.as_ref().is_some_and(|s| s.aborted.is_none());
        let aborted = match stats.as_ref().and_then(|s| s.aborted) {
            Some(aborted) => aborted,
            None => self.no_hosts_remaining || exit_code != Some(0),
        };

        let mut outcomes = Vec::with_capacity(order.len());
        for host in order {
            let state = self.hosts.remove(&host).unwrap_or_default();
            if let Some(outcome) = state.reported {
                outcomes.push((host, outcome));
                continue;
            }
            // Marked failed by another host's failure after it had run everything: done.
            let finished_anyway = state.finished_play && abort.is_none_or(|a| a.last_play);
            let outcome = match stats.as_ref() {
                None => HostOutcome::Pending(match exit_code {
                    Some(code) => format!("ansible-playbook stopped (exit {code}) before the play recap; the host may have run part of the play"),
                    None => "ansible-playbook was stopped before the play recap; the host may have run part of the play".to_string(),
                }),
                Some(stats) => match stats.hosts.get(&host) {
                    Some(s) if s.unreachable > 0 => HostOutcome::Unreachable("unreachable: the play recap counts the host unreachable".into()),
                    Some(s) if s.failures > 0 => HostOutcome::Failed(
                        state.deferred_failure.clone().unwrap_or_else(|| format!("the play recap counts {} failed task(s)", s.failures)),
                    ),
                    Some(_) if finished_anyway => HostOutcome::Done,
                    Some(_) if failed_marked.contains(host.as_str()) => {
                        HostOutcome::Pending("the play aborted (any_errors_fatal or max_fail_percentage) before the host finished".into())
                    }
                    Some(_) if aborted && recap_only => HostOutcome::Pending(
                        "the run failed and the play recap alone cannot show whether an aborted play cut this host short".into(),
                    ),
                    Some(_) if aborted && abort.is_none() => {
                        HostOutcome::Pending("the play aborted (no more hosts left) before the host finished".into())
                    }
                    Some(_) if aborted && abort_batch.contains(host.as_str()) => {
                        HostOutcome::Pending("the play aborted before the host finished".into())
                    }
                    Some(_) if aborted && abort.is_some_and(|a| !a.last_play) => {
                        HostOutcome::Pending("a play aborted, so the later plays never ran on the host".into())
                    }
                    Some(_) => HostOutcome::Done,
                    None if aborted && abort_play.contains(host.as_str()) => {
                        HostOutcome::Pending("never ran: the play aborted before the host's serial batch".into())
                    }
                    None if aborted => HostOutcome::Pending("never ran: the play aborted first".into()),
                    None if exit_code == Some(0) => HostOutcome::Done,
                    None => HostOutcome::Pending(format!("never ran (ansible-playbook exited with status {})", exit_code.unwrap_or(-1))),
                },
            };
            match &outcome {
                HostOutcome::Done => {
                    // A host where no task changed anything was found in place by the run.
                    match stats.as_ref().and_then(|s| s.hosts.get(&host)) {
                        Some(s) if s.changed > 0 => events.push(Event::Done {
                            id: host.clone(),
                            note: Some(format!("play recap: ok={} changed={} failed=0 unreachable=0", s.ok, s.changed)),
                        }),
                        Some(s) => events.push(Event::InPlace {
                            id: host.clone(),
                            note: Some(format!("play recap: ok={} changed=0: nothing to change", s.ok)),
                        }),
                        None => events.push(Event::InPlace {
                            id: host.clone(),
                            note: Some("no task targeted this host".to_string()),
                        }),
                    }
                }
                HostOutcome::Failed(error) | HostOutcome::Unreachable(error) => {
                    events.push(Event::Failed { id: host.clone(), error: error.clone() })
                }
                HostOutcome::Pending(reason) => {
                    events.push(Event::Pending { id: host.clone(), reason: reason.clone() })
                }
            }
            outcomes.push((host, outcome));
        }
        outcomes
    }
}

fn failed_message(task: &str, msg: &str) -> String {
    if msg.is_empty() {
        format!("task `{task}` failed")
    } else {
        format!("task `{task}` failed: {msg}")
    }
}

/// Unreachable errors start with `unreachable:` so reports and recovery tell them from failures.
fn unreachable_message(task: &str, msg: &str) -> String {
    if msg.is_empty() {
        format!("unreachable: task `{task}`")
    } else {
        format!("unreachable: task `{task}`: {msg}")
    }
}

/// Reads complete lines appended to a file since the last call: the plugin flushes one record
/// per line while ansible runs, so tailing the file checkpoints hosts as they finish. A plain
/// file (not a fifo) never blocks ansible and survives a crash for a later look.
pub struct Tail {
    file: File,
    pos: u64,
    partial: Vec<u8>,
}

impl Tail {
    /// Reads `file` (rdeploy's own descriptor of the file the callback appends to) from its start.
    pub fn new(file: File) -> Tail {
        Tail { file, pos: 0, partial: Vec::new() }
    }

    /// New complete lines; a line still being written waits for the next call.
    pub fn read_lines(&mut self) -> std::io::Result<Vec<String>> {
        let file = &mut self.file;
        file.seek(SeekFrom::Start(self.pos))?;
        let mut buf = Vec::new();
        let read = file.read_to_end(&mut buf)?;
        self.pos += read as u64;
        self.partial.extend_from_slice(&buf);
        let Some(last_newline) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Ok(Vec::new());
        };
        let rest = self.partial.split_off(last_newline + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        Ok(String::from_utf8_lossy(&complete).lines().map(str::to_string).collect())
    }

    /// Whatever is left without a final newline (the plugin was killed mid-write).
    pub fn remainder(&self) -> Option<String> {
        let text = String::from_utf8_lossy(&self.partial).trim().to_string();
        (!text.is_empty()).then_some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/ansible/captured").join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|h| h.to_string()).collect()
    }

    /// Replays a captured run; returns the live events, the final events and the outcomes.
    fn replay(name: &str, planned: &[&str], exit: i32) -> (Vec<Event>, Vec<Event>, Vec<(String, HostOutcome)>) {
        let mut tracker = HostTracker::new(hosts(planned));
        let mut live = Vec::new();
        for line in captured(&format!("{name}.jsonl")).lines() {
            if let Some(record) = parse_line(line).unwrap() {
                tracker.observe(record, &mut live);
            }
        }
        let mut end = Vec::new();
        let outcomes = tracker.finish(Some(exit), &mut end);
        (live, end, outcomes)
    }

    fn outcome<'a>(outcomes: &'a [(String, HostOutcome)], host: &str) -> &'a HostOutcome {
        &outcomes.iter().find(|(h, _)| h == host).unwrap().1
    }

    const WEB: [&str; 5] = ["web1", "web2", "web3", "web4", "web5"];

    #[test]
    fn parses_every_record_kind() {
        let records: Vec<Record> =
            captured("site-web3-fails.jsonl").lines().filter_map(|l| parse_line(l).unwrap()).collect();
        assert_eq!(records[0], Record::PlaybookStart { playbook: Some("site.yml".into()) });
        assert_eq!(records[1], Record::PlayStart { play: Some("configure web hosts".into()) });
        let failed = records.iter().find_map(|r| match r {
            Record::Result(t) if t.status == ResultStatus::Failed => Some(t),
            _ => None,
        });
        let failed = failed.unwrap();
        assert_eq!(failed.host, "web3");
        assert_eq!(failed.task, "check for injected failure");
        assert_eq!(failed.msg, "injected failure on web3");
        assert!(failed.task_uuid.is_some());
        let Some(Record::Stats(stats)) = records.last() else { panic!("no stats") };
        assert_eq!(stats.hosts["web3"], HostStats { ok: 1, changed: 1, failures: 1, ..HostStats::default() });
        assert_eq!(stats.failed_hosts.as_deref(), Some(&["web3".to_string()][..]));
        assert_eq!(stats.aborted, Some(false));
    }

    #[test]
    fn one_failed_host_fails_at_once_and_the_others_are_done_after_the_recap() {
        let (live, end, outcomes) = replay("site-web3-fails", &WEB, 2);
        assert!(live.contains(&Event::Failed {
            id: "web3".into(),
            error: "task `check for injected failure` failed: injected failure on web3".into()
        }));
        assert!(!live.iter().any(|e| matches!(e, Event::Done { .. })), "done only after the recap");
        assert_eq!(live.iter().filter(|e| matches!(e, Event::Started { .. })).count(), 5);
        for host in ["web1", "web2", "web4", "web5"] {
            assert_eq!(outcome(&outcomes, host), &HostOutcome::Done);
            assert!(end.iter().any(|e| matches!(e, Event::Done { id, .. } if id == host)));
        }
        assert!(matches!(outcome(&outcomes, "web3"), HostOutcome::Failed(_)));
        assert!(!end.iter().any(|e| matches!(e, Event::Failed { .. })), "the failure is not reported twice");
    }

    #[test]
    fn a_clean_run_is_all_done() {
        let (_, _, outcomes) = replay("site-ok", &WEB, 0);
        assert!(outcomes.iter().all(|(_, o)| *o == HostOutcome::Done));
    }

    #[test]
    fn unreachable_is_told_apart_from_failed() {
        let (live, _, outcomes) = replay("unreachable-and-failed", &["web1", "web2", "web3", "web4", "db1"], 4);
        let error = live
            .iter()
            .find_map(|e| match e {
                Event::Failed { id, error } if id == "db1" => Some(error.clone()),
                _ => None,
            })
            .unwrap();
        assert!(error.starts_with("unreachable: task `record start`: "), "{error}");
        assert!(error.contains("Connection refused"), "{error}");
        assert!(matches!(outcome(&outcomes, "db1"), HostOutcome::Unreachable(_)));
        assert!(matches!(outcome(&outcomes, "web2"), HostOutcome::Failed(e) if !e.starts_with("unreachable:")));
        assert_eq!(outcome(&outcomes, "web1"), &HostOutcome::Done);
    }

    #[test]
    fn any_errors_fatal_leaves_the_other_hosts_pending() {
        let (_, end, outcomes) = replay("fatal-web3-fails", &WEB, 2);
        assert!(matches!(outcome(&outcomes, "web3"), HostOutcome::Failed(_)));
        for host in ["web1", "web2", "web4", "web5"] {
            assert!(
                matches!(outcome(&outcomes, host), HostOutcome::Pending(_)),
                "{host}: {:?}",
                outcome(&outcomes, host)
            );
        }
        assert!(!end.iter().any(|e| matches!(e, Event::Done { .. })));
    }

    #[test]
    fn a_failed_serial_batch_leaves_later_batches_pending() {
        let (_, _, outcomes) = replay("serial-first-batch-fails", &WEB, 2);
        assert!(matches!(outcome(&outcomes, "web1"), HostOutcome::Failed(_)));
        assert!(matches!(outcome(&outcomes, "web2"), HostOutcome::Failed(_)));
        for host in ["web3", "web4", "web5"] {
            assert!(matches!(outcome(&outcomes, host), HostOutcome::Pending(r) if r.starts_with("never ran")));
        }
    }

    #[test]
    fn a_failure_in_a_later_serial_batch_does_not_stop_the_others() {
        let (_, _, outcomes) = replay("serial-one-fails", &WEB, 2);
        assert!(matches!(outcome(&outcomes, "web3"), HostOutcome::Failed(_)));
        for host in ["web1", "web2", "web4", "web5"] {
            assert_eq!(outcome(&outcomes, host), &HostOutcome::Done, "{host}");
        }
    }

    #[test]
    fn max_fail_percentage_keeps_hosts_of_the_failing_batch_that_finished_everything_done() {
        // web3 fails its last task (health check); web4, in the same batch, had passed it, and
        // its restart handler ran: ansible marks it failed to stop the play, but it is done.
        let (_, _, outcomes) = replay("rolling-web3-unhealthy", &WEB, 2);
        assert!(matches!(outcome(&outcomes, "web3"), HostOutcome::Failed(e) if e.contains("health check")));
        for host in ["web1", "web2", "web4"] {
            assert_eq!(outcome(&outcomes, host), &HostOutcome::Done, "{host}");
        }
        assert!(matches!(outcome(&outcomes, "web5"), HostOutcome::Pending(r) if r.starts_with("never ran")));
    }

    #[test]
    fn max_fail_percentage_leaves_a_host_cut_short_before_its_handler_pending() {
        // web3 fails before the restart: web4's restart handler was notified and never ran.
        let (_, _, outcomes) = replay("rolling-web3-fails", &WEB, 2);
        assert!(matches!(outcome(&outcomes, "web3"), HostOutcome::Failed(_)));
        assert!(matches!(outcome(&outcomes, "web4"), HostOutcome::Pending(_)), "{:?}", outcome(&outcomes, "web4"));
        assert!(matches!(outcome(&outcomes, "web5"), HostOutcome::Pending(_)));
        for host in ["web1", "web2"] {
            assert_eq!(outcome(&outcomes, host), &HostOutcome::Done, "{host}");
        }
    }

    #[test]
    fn rescued_and_ignored_failures_are_done() {
        let (live, _, outcomes) = replay("rescue-web2", &WEB, 0);
        assert!(!live.iter().any(|e| matches!(e, Event::Failed { .. })));
        assert!(outcomes.iter().all(|(_, o)| *o == HostOutcome::Done), "{outcomes:?}");
    }

    #[test]
    fn a_run_killed_before_the_recap_leaves_everyone_unfinished_pending() {
        let lines: Vec<String> = captured("site-web3-fails.jsonl").lines().map(str::to_string).collect();
        let mut tracker = HostTracker::new(hosts(&WEB));
        let mut events = Vec::new();
        for line in &lines[..lines.len() - 3] {
            tracker.observe(parse_line(line).unwrap().unwrap(), &mut events);
        }
        let outcomes = tracker.finish(Some(99), &mut events);
        assert!(matches!(outcome(&outcomes, "web3"), HostOutcome::Failed(_)));
        assert!(matches!(outcome(&outcomes, "web1"), HostOutcome::Pending(_)));
    }

    #[test]
    fn the_recap_stands_in_when_the_plugin_wrote_nothing() {
        let recap = super::super::recap::parse_recap(&captured("site-web3-fails.stdout"));
        let mut tracker = HostTracker::new(hosts(&WEB));
        tracker.use_recap(&recap, false);
        let mut events = Vec::new();
        let outcomes = tracker.finish(Some(2), &mut events);
        assert!(matches!(outcome(&outcomes, "web3"), HostOutcome::Failed(e) if e.contains("1 failed task")));
        // The recap of an any_errors_fatal abort looks like this one: no host is taken as done.
        assert!(matches!(outcome(&outcomes, "web1"), HostOutcome::Pending(_)));

        let recap = super::super::recap::parse_recap(&captured("site-ok.stdout"));
        let mut tracker = HostTracker::new(hosts(&WEB));
        tracker.use_recap(&recap, false);
        let outcomes = tracker.finish(Some(0), &mut Vec::new());
        assert!(outcomes.iter().all(|(_, o)| *o == HostOutcome::Done));
    }

    #[test]
    fn hosts_records_plan_the_run_in_natural_order_once_each() {
        let mut tracker = HostTracker::new(Vec::new());
        let mut events = Vec::new();
        let record = |line: &str| parse_line(line).unwrap().unwrap();
        tracker.observe(record(r#"{"v":1,"event":"hosts","hosts":["web10","web2","web1","web2"]}"#), &mut events);
        assert_eq!(events, vec![Event::Planned { ids: hosts(&["web1", "web2", "web10"]) }]);
        events.clear();
        tracker.observe(record(r#"{"v":1,"event":"hosts","hosts":["web2"]}"#), &mut events);
        assert!(events.is_empty(), "nothing new: {events:?}");
        tracker.observe(
            record(r#"{"v":1,"event":"result","status":"ok","host":"added","task":"t","msg":""}"#),
            &mut events,
        );
        events.clear();
        // A host an earlier play added (add_host) that a later play targets joins the plan.
        tracker.observe(record(r#"{"v":1,"event":"hosts","hosts":["web3","added"]}"#), &mut events);
        assert_eq!(events, vec![Event::Planned { ids: hosts(&["added", "web1", "web2", "web3", "web10"]) }]);
        let outcomes = tracker.finish(Some(0), &mut Vec::new());
        assert_eq!(outcomes.len(), 5, "{outcomes:?}");
    }

    #[test]
    fn the_recap_alone_settles_every_host_it_names_when_nothing_planned_them() {
        let recap = super::super::recap::parse_recap(&captured("site-ok.stdout"));
        let mut tracker = HostTracker::new(Vec::new());
        tracker.use_recap(&recap, false);
        let outcomes = tracker.finish(Some(0), &mut Vec::new());
        assert_eq!(outcomes.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(), WEB);
        assert!(outcomes.iter().all(|(_, o)| *o == HostOutcome::Done), "{outcomes:?}");
    }

    #[test]
    fn bad_lines_and_newer_formats_are_errors_unknown_events_are_skipped() {
        assert!(matches!(parse_line("{not json"), Err(CallbackError::Json { .. })));
        assert!(matches!(parse_line(r#"{"event":"stats","hosts":{},"v":9}"#), Err(CallbackError::Format { found: 9 })));
        assert_eq!(parse_line(r#"{"event":"handler_start","v":1}"#).unwrap(), None);
        assert_eq!(parse_line("   ").unwrap(), None);
    }

    #[test]
    fn tail_returns_only_complete_lines() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut file = std::fs::File::create(&path).unwrap();
        let mut tail = Tail::new(std::fs::File::open(&path).unwrap());
        assert!(tail.read_lines().unwrap().is_empty(), "nothing written yet");
        write!(file, "one\ntw").unwrap();
        assert_eq!(tail.read_lines().unwrap(), vec!["one".to_string()]);
        write!(file, "o\nthree").unwrap();
        assert_eq!(tail.read_lines().unwrap(), vec!["two".to_string()]);
        assert_eq!(tail.remainder().as_deref(), Some("three"));
    }
}

//! What the report says of a fleet step, from its journaled facts alone: the waves and how far
//! each got, every cluster's state, the stragglers with why and when they were last seen, and
//! the completion against the step's `slo:` measured from the rollout's journaled start.

use rdeploy_adapters::SubStatus;
use serde::Serialize;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::cluster_fact;
use crate::checkpoint::StepState;

/// `status --json`'s `rollout` object of a fleet step (docs/status-json.md).
#[derive(Clone, Debug, Serialize)]
pub struct RolloutReport {
    /// When the rollout started (RFC 3339): the start the SLO is measured from.
    pub started: Option<String>,
    pub waves: Vec<WaveReport>,
    pub done: usize,
    pub in_scope: usize,
    /// `done / in_scope`, in percent.
    pub percent: f64,
    pub stragglers: Vec<Straggler>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slo: Vec<ObjectiveState>,
}

#[derive(Clone, Debug, Serialize)]
pub struct WaveReport {
    pub wave: usize,
    pub clusters: Vec<String>,
    pub done: usize,
    /// `done` (applied, healthy, baked), `passed` (gone through, stragglers left), `baking`,
    /// `applied` (bake not passed), `running` (some clusters done or started) or `not started`.
    pub state: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct Straggler {
    pub id: String,
    /// When it last answered (`null`: never seen by rdeploy).
    pub absent_since: Option<String>,
    pub why: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ObjectiveState {
    pub objective: String,
    /// `met`, `pending` (not reached, not due) or `breached` (not reached, due).
    pub state: &'static str,
    pub due_at: String,
}

/// A row of the report for one sub-change of a fleet step (a cluster), which [`of_step`] places
/// in its wave and marks absent when it is a straggler. The report's own row type implements it,
/// so this module needs nothing of the report's.
pub trait ClusterRow {
    fn id(&self) -> &str;
    fn status(&self) -> SubStatus;
    /// The wave the cluster belongs to (1 for the first).
    fn set_wave(&mut self, wave: Option<u64>);
    /// An absent straggler: when it was last seen (`None`: never) and why it counts as absent.
    fn set_absent(&mut self, since: Option<String>, why: String);
}

/// The rollout report of a fleet step (`None` for any other step); fills each cluster's
/// `wave` and `absent_since` in `subs`.
pub fn of_step(step: &StepState, subs: &mut [impl ClusterRow]) -> Option<RolloutReport> {
    let rollout = step.facts.get("rollout")?;
    let waves: Vec<Vec<String>> = serde_json::from_value(rollout.get("waves")?.clone()).ok()?;
    let started = rollout.get("started").and_then(Value::as_str).map(str::to_string);
    let baked = step.facts.get("waves_baked").and_then(Value::as_u64).unwrap_or(0) as usize;
    let baking =
        step.facts.get("bake").filter(|b| b.get("ended").is_none()).and_then(|b| b.get("wave")).and_then(Value::as_u64);
    let status = |id: &str| subs.iter().find(|s| s.id() == id).map(|s| s.status());
    let mut report_waves = Vec::new();
    for (i, clusters) in waves.iter().enumerate() {
        let done = clusters.iter().filter(|c| status(c) == Some(SubStatus::Done)).count();
        let touched = clusters
            .iter()
            .any(|c| matches!(status(c), Some(SubStatus::Done | SubStatus::Started | SubStatus::Failed)));
        let state = if done == clusters.len() && i < baked {
            "done"
        } else if i < baked {
            // Its bake passed (or it was the last wave); the clusters left are stragglers.
            "passed"
        } else if baking == Some(i as u64 + 1) {
            "baking"
        } else if done == clusters.len() {
            "applied"
        } else if touched || i < baked {
            "running"
        } else {
            "not started"
        };
        report_waves.push(WaveReport { wave: i + 1, clusters: clusters.clone(), done, state });
    }
    let mut stragglers = Vec::new();
    for sub in subs.iter_mut() {
        let Some(fact) = step.facts.get(&cluster_fact(sub.id())) else { continue };
        sub.set_wave(waves.iter().position(|w| w.iter().any(|c| c == sub.id())).map(|w| w as u64 + 1));
        if let (SubStatus::Pending, Some(why)) = (sub.status(), fact.get("absent_why").and_then(Value::as_str)) {
            let since = fact.get("absent_since").and_then(Value::as_str).map(str::to_string);
            sub.set_absent(since.clone(), why.to_string());
            stragglers.push(Straggler { id: sub.id().to_string(), absent_since: since, why: why.to_string() });
        }
    }
    let in_scope = waves.iter().map(Vec::len).sum::<usize>();
    let done = subs.iter().filter(|s| s.status() == SubStatus::Done).count();
    let percent = if in_scope == 0 { 0.0 } else { (done as f64 * 1000.0 / in_scope as f64).round() / 10.0 };
    let slo = match (rollout.get("slo").and_then(Value::as_str), started.as_deref()) {
        (Some(text), Some(started)) => objectives(text, started, percent, OffsetDateTime::now_utc()),
        _ => Vec::new(),
    };
    Some(RolloutReport { started, waves: report_waves, done, in_scope, percent, stragglers, slo })
}

/// Each objective of `slo` judged at `now` for a rollout started at `started` and `percent` done.
fn objectives(slo: &str, started: &str, percent: f64, now: OffsetDateTime) -> Vec<ObjectiveState> {
    let (Ok(objectives), Ok(start)) = (crate::fleet::slo::parse(slo), OffsetDateTime::parse(started, &Rfc3339)) else {
        return Vec::new();
    };
    objectives
        .into_iter()
        .map(|o| {
            let due = start + o.within;
            let state = if percent >= o.percent {
                "met"
            } else if now >= due {
                "breached"
            } else {
                "pending"
            };
            ObjectiveState { objective: o.text, state, due_at: crate::fleet::analysis::rfc3339(due) }
        })
        .collect()
}

impl RolloutReport {
    /// The report's lines under the step: waves, stragglers, completion and the SLO.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let waves: Vec<String> = self
            .waves
            .iter()
            .map(|w| {
                let left = self.stragglers.iter().filter(|s| w.clusters.contains(&s.id)).count();
                let stragglers = match left {
                    0 => String::new(),
                    1 => " (1 straggler)".to_string(),
                    n => format!(" ({n} stragglers)"),
                };
                format!("{}: {}/{} {}{stragglers}", w.wave, w.done, w.clusters.len(), w.state)
            })
            .collect();
        lines.push(format!("waves:    {}", waves.join(", ")));
        for s in &self.stragglers {
            let since = match &s.absent_since {
                Some(t) => format!("last seen {t}"),
                None => "never seen by rdeploy".to_string(),
            };
            lines.push(format!("straggler: {} ({since}): {}", s.id, s.why));
        }
        let started = self.started.as_deref().map(|t| format!(" since the rollout started at {t}")).unwrap_or_default();
        let slo = if self.slo.is_empty() {
            String::new()
        } else {
            let parts: Vec<String> =
                self.slo.iter().map(|o| format!("{} {} (due {})", o.objective, o.state, o.due_at)).collect();
            format!("; slo: {}", parts.join(", "))
        };
        lines.push(format!("complete: {}% ({}/{} clusters){started}{slo}", self.percent, self.done, self.in_scope));
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objectives_are_met_pending_or_breached_from_the_rollout_start() {
        let now = time::macros::datetime!(2026-01-03 10:00 UTC);
        let states = |percent| {
            objectives("95%@48h,100%@7d", "2026-01-01T09:00:00Z", percent, now)
                .into_iter()
                .map(|o| o.state)
                .collect::<Vec<_>>()
        };
        assert_eq!(states(90.0), ["breached", "pending"]);
        assert_eq!(states(96.0), ["met", "pending"]);
        assert_eq!(states(100.0), ["met", "met"]);
    }
}

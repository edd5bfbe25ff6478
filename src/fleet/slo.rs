//! The rollout-completion SLO, `95%@48h,100%@7d`: a share of the fleet must run a component's
//! newest version within a time of the rollout's start (recorded in `rollouts.json`, or given
//! with `--since`). Pure functions over a judged snapshot and a clock, so tests pick the time.

use std::time::Duration;

use serde::Serialize;
use time::OffsetDateTime;

use super::analysis::{rfc3339, ClusterStanding, Standing};

#[derive(Clone, Debug, PartialEq)]
pub struct Objective {
    pub percent: f64,
    pub within: Duration,
    pub text: String,
}

/// Parses `95%@48h,100%@7d`.
pub fn parse(text: &str) -> Result<Vec<Objective>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (pct, within) = part
            .split_once('@')
            .ok_or_else(|| format!("`{part}`: an objective is `PERCENT%@DURATION`, like `95%@48h`"))?;
        let percent: f64 =
            pct.trim().trim_end_matches('%').parse().map_err(|_| format!("`{part}`: `{pct}` is not a percentage"))?;
        if !(0.0..=100.0).contains(&percent) {
            return Err(format!("`{part}`: the percentage must be between 0 and 100"));
        }
        let within = humantime::parse_duration(within.trim())
            .map_err(|e| format!("`{part}`: `{within}` is not a duration ({e})"))?;
        out.push(Objective { percent, within, text: part.to_string() });
    }
    if out.is_empty() {
        return Err("no objective given: use `--slo \"95%@48h,100%@7d\"`".into());
    }
    Ok(out)
}

#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum ObjectiveState {
    /// The share is reached (early or on time).
    Met,
    /// Not reached, not due yet.
    Pending,
    /// Not reached, and due.
    Breached,
    /// No rollout start is known.
    Unknown,
}

#[derive(Clone, Debug, Serialize)]
pub struct ObjectiveReport {
    pub objective: String,
    pub state: ObjectiveState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_at: Option<String>,
    /// Clusters that still have to finish to meet it.
    pub clusters_short: usize,
    /// Percentage points below the objective.
    pub points_short: f64,
    /// Seconds past due (breached) or until due (pending).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SloReport {
    pub component: String,
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_by: Option<String>,
    pub done: usize,
    pub in_scope: usize,
    pub percent: f64,
    pub objectives: Vec<ObjectiveReport>,
    pub breached: bool,
    /// Clusters not done while an objective is breached (stragglers and absent clusters).
    pub breaching: Vec<String>,
}

/// Evaluates the objectives for one component version.
pub fn evaluate(
    component: &str,
    version: &str,
    standings: &[ClusterStanding],
    start: Option<(OffsetDateTime, String)>,
    objectives: &[Objective],
    now: OffsetDateTime,
) -> SloReport {
    let scope: Vec<&ClusterStanding> = standings.iter().filter(|s| s.standing != Standing::Missing).collect();
    let done = scope.iter().filter(|s| s.standing == Standing::Done).count();
    let in_scope = scope.len();
    let percent = if in_scope == 0 { 100.0 } else { done as f64 * 100.0 / in_scope as f64 };
    let reports: Vec<ObjectiveReport> = objectives
        .iter()
        .map(|o| {
            let needed = (o.percent * in_scope as f64 / 100.0 - 1e-9).ceil().max(0.0) as usize;
            let clusters_short = needed.saturating_sub(done);
            let points_short = ((o.percent - percent).max(0.0) * 10.0).round() / 10.0;
            let Some((started, _)) = &start else {
                let state = if clusters_short == 0 { ObjectiveState::Met } else { ObjectiveState::Unknown };
                return ObjectiveReport {
                    objective: o.text.clone(),
                    state,
                    due_at: None,
                    clusters_short,
                    points_short,
                    seconds: None,
                };
            };
            let due = *started + o.within;
            let (state, seconds) = if clusters_short == 0 {
                (ObjectiveState::Met, None)
            } else if now >= due {
                (ObjectiveState::Breached, Some((now - due).whole_seconds()))
            } else {
                (ObjectiveState::Pending, Some((due - now).whole_seconds()))
            };
            ObjectiveReport {
                objective: o.text.clone(),
                state,
                due_at: Some(rfc3339(due)),
                clusters_short,
                points_short,
                seconds,
            }
        })
        .collect();
    let breached = reports.iter().any(|r| r.state == ObjectiveState::Breached);
    let breaching = if breached {
        scope.iter().filter(|s| s.standing != Standing::Done).map(|s| s.cluster.clone()).collect()
    } else {
        Vec::new()
    };
    SloReport {
        component: component.to_string(),
        version: version.to_string(),
        started: start.as_ref().map(|(t, _)| rfc3339(*t)),
        started_by: start.map(|(_, by)| by),
        done,
        in_scope,
        percent: (percent * 10.0).round() / 10.0,
        objectives: reports,
        breached,
        breaching,
    }
}

/// `3h 20m`, for seconds in reports.
pub fn human(seconds: i64) -> String {
    let d = Duration::from_secs((seconds.unsigned_abs() + 30) / 60 * 60);
    if d.is_zero() {
        return "under a minute".into();
    }
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn standing(name: &str, done: bool) -> ClusterStanding {
        let standing = if done {
            Standing::Done
        } else {
            Standing::Behind { versions: vec!["1".into()], reasons: vec!["old".into()] }
        };
        ClusterStanding { cluster: name.into(), labels: Default::default(), standing }
    }

    #[test]
    fn objectives_parse() {
        let o = parse("95%@48h, 100%@7d").unwrap();
        assert_eq!((o[0].percent, o[0].within), (95.0, Duration::from_secs(48 * 3600)));
        assert_eq!(o[1].within, Duration::from_secs(7 * 86400));
        assert!(parse("95@").is_err());
        assert!(parse("120%@1h").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn met_pending_and_breached_on_recorded_times() {
        // 19 of 20 done = 95%: the 95% objective is met, 100% within 7d is pending then breached.
        let mut s: Vec<ClusterStanding> = (0..19).map(|i| standing(&format!("c{i}"), true)).collect();
        s.push(standing("late", false));
        let start = Some((datetime!(2026-03-01 00:00 UTC), "test".to_string()));
        let o = parse("95%@48h,100%@7d").unwrap();
        let r = evaluate("app", "2", &s, start.clone(), &o, datetime!(2026-03-03 00:00 UTC));
        assert_eq!(
            (r.objectives[0].state.clone(), r.objectives[1].state.clone()),
            (ObjectiveState::Met, ObjectiveState::Pending)
        );
        assert_eq!(r.objectives[1].seconds, Some(5 * 86400));
        assert!(!r.breached && r.breaching.is_empty());
        let r = evaluate("app", "2", &s, start.clone(), &o, datetime!(2026-03-09 00:00 UTC));
        assert_eq!(r.objectives[1].state, ObjectiveState::Breached);
        assert_eq!(
            (r.objectives[1].clusters_short, r.objectives[1].points_short, r.objectives[1].seconds),
            (1, 5.0, Some(86400))
        );
        assert_eq!(r.breaching, ["late"]);
        // Two behind: 90% < 95% after 48h.
        s[0] = standing("c0", false);
        let r = evaluate("app", "2", &s, start, &o, datetime!(2026-03-03 00:00 UTC));
        assert_eq!(r.objectives[0].state, ObjectiveState::Breached);
        assert_eq!(r.objectives[0].clusters_short, 1);
        let r = evaluate("app", "2", &s, None, &o, datetime!(2026-03-03 00:00 UTC));
        assert_eq!(r.objectives[0].state, ObjectiveState::Unknown);
        assert!(!r.breached);
    }
}

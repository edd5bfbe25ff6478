//! Gates: preconditions evaluated right before a step runs. `gate.inventory` asks the fleet
//! whether every cluster in scope runs the wanted version; any straggler or absent cluster
//! refuses the step, unless an unexpired exception with a reason covers that cluster.

use std::path::Path;
use std::time::Duration;

use time::{Date, OffsetDateTime};

use crate::fleet::analysis::Standing;
use crate::fleet::{standings_for_gate, GateQuery};
use crate::stack::{Gate, GateException};

/// The per-cluster budget when the gate does not set `timeout`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// `Ok` when the step may run; `Err` with the reason it may not, naming every straggler.
pub async fn evaluate(gate: &Gate, stack_dir: &Path, state_dir: &Path) -> Result<(), String> {
    let inv = &gate.inventory;
    let wanted = format!("{}:{}", inv.image, inv.version);
    // `kinds`, `timeout` and the exceptions' dates were parsed when the stack loaded.
    let kinds = inv.kinds.clone();
    let timeout = inv.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let query = GateQuery {
        contexts: &inv.contexts,
        kubeconfig: inv.kubeconfig.as_ref().map(|k| stack_dir.join(k)),
        namespace: inv.namespace.clone(),
        selector: inv.selector.as_deref(),
        kinds,
        image: &inv.image,
        version: &inv.version,
        timeout,
    };
    let standings = standings_for_gate(&query, state_dir)
        .await
        .map_err(|e| format!("cannot confirm that the fleet runs {wanted}: {e}"))?;
    if standings.is_empty() {
        return Err(format!("cannot confirm that the fleet runs {wanted}: no cluster in scope"));
    }
    let today = OffsetDateTime::now_utc().date();
    let mut blocking = Vec::new();
    let mut excused = Vec::new();
    for s in standings.iter().filter(|s| s.standing != Standing::Done) {
        let why = s.why(&inv.image);
        match exception_for(&inv.exceptions, &s.cluster, today) {
            Some(Ok(e)) => excused.push(format!("{} ({}; excepted until {}: {})", s.cluster, why, e.expires, e.reason)),
            Some(Err(problem)) => blocking.push(format!("{}: {why} ({problem})", s.cluster)),
            None => blocking.push(format!("{}: {why}", s.cluster)),
        }
    }
    if !excused.is_empty() {
        tracing::warn!("gate on {wanted}: passing with exceptions: {}", excused.join("; "));
    }
    if blocking.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} of {} clusters in scope do not run {wanted}: {}",
        blocking.len(),
        standings.len(),
        blocking.join(" | ")
    ))
}

/// The exception covering `cluster` (a name or a glob): `Ok` when it applies today, `Err`
/// saying why it does not (expired, no reason).
fn exception_for<'a>(
    exceptions: &'a [GateException],
    cluster: &str,
    today: Date,
) -> Option<Result<&'a GateException, String>> {
    let e = exceptions
        .iter()
        .find(|e| e.cluster == cluster || glob::Pattern::new(&e.cluster).is_ok_and(|p| p.matches(cluster)))?;
    if e.reason.trim().is_empty() {
        return Some(Err("its exception has no reason, so it does not apply".into()));
    }
    // The exception holds through the day before `expires`.
    Some(if today < e.expires { Ok(e) } else { Err(format!("its exception expired on {}", e.expires)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::date;

    fn exception(cluster: &str, reason: &str, expires: Date) -> GateException {
        GateException { cluster: cluster.into(), reason: reason.into(), expires }
    }

    #[test]
    fn exceptions_apply_until_they_expire() {
        let list = vec![
            exception("edge-3", "site offline for works", date!(2026 - 06 - 10)),
            exception("lab-*", "", date!(2030 - 01 - 01)),
        ];
        assert!(matches!(exception_for(&list, "edge-3", date!(2026 - 06 - 09)), Some(Ok(_))));
        assert_eq!(
            exception_for(&list, "edge-3", date!(2026 - 06 - 10)).unwrap().unwrap_err(),
            "its exception expired on 2026-06-10"
        );
        assert!(exception_for(&list, "lab-1", date!(2026 - 01 - 01)).unwrap().unwrap_err().contains("no reason"));
        assert!(exception_for(&list, "edge-1", date!(2026 - 01 - 01)).is_none());
    }
}

//! Helm's own state as the adapter reads it: `helm history -o json` and `helm status -o json`
//! (parsed from captured helm 3 and helm 4 output in `fixtures/helm/captured/`), the major
//! version from `helm version --short`, the values a stack asks for, and live helm processes.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

/// A release revision's status as helm prints it (`helm/pkg/release/common/status.go`); a
/// status a newer helm adds is kept as [`Status::Other`] with helm's own word.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "String")]
pub enum Status {
    Unknown,
    Deployed,
    Uninstalled,
    Superseded,
    Failed,
    Uninstalling,
    PendingInstall,
    PendingUpgrade,
    PendingRollback,
    Other(String),
}

impl Status {
    pub fn as_str(&self) -> &str {
        match self {
            Status::Unknown => "unknown",
            Status::Deployed => "deployed",
            Status::Uninstalled => "uninstalled",
            Status::Superseded => "superseded",
            Status::Failed => "failed",
            Status::Uninstalling => "uninstalling",
            Status::PendingInstall => "pending-install",
            Status::PendingUpgrade => "pending-upgrade",
            Status::PendingRollback => "pending-rollback",
            Status::Other(word) => word,
        }
    }

    /// `pending-install`, `pending-upgrade`, `pending-rollback` (or a newer helm's `pending-*`):
    /// a helm operation that has not finished (or never will: the helm running it was killed).
    pub fn is_pending(&self) -> bool {
        match self {
            Status::PendingInstall | Status::PendingUpgrade | Status::PendingRollback => true,
            Status::Other(word) => word.starts_with("pending-"),
            _ => false,
        }
    }
}

impl From<String> for Status {
    fn from(word: String) -> Status {
        match word.as_str() {
            "unknown" => Status::Unknown,
            "deployed" => Status::Deployed,
            "uninstalled" => Status::Uninstalled,
            "superseded" => Status::Superseded,
            "failed" => Status::Failed,
            "uninstalling" => Status::Uninstalling,
            "pending-install" => Status::PendingInstall,
            "pending-upgrade" => Status::PendingUpgrade,
            "pending-rollback" => Status::PendingRollback,
            _ => Status::Other(word),
        }
    }
}

impl From<&str> for Status {
    fn from(word: &str) -> Status {
        Status::from(word.to_string())
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of `helm history R -o json`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Revision {
    pub revision: u64,
    #[serde(default)]
    pub updated: String,
    pub status: Status,
    /// `name-version`, e.g. `webapp-0.1.0`.
    #[serde(default)]
    pub chart: String,
    /// The chart's `appVersion` ("" when it has none).
    #[serde(default)]
    pub app_version: String,
    #[serde(default)]
    pub description: String,
}

impl Revision {
    pub fn is_pending(&self) -> bool {
        self.status.is_pending()
    }
}

/// The fields of `helm status R -o json` the adapter uses (helm 3 and 4 agree on these).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ReleaseStatus {
    pub name: String,
    /// The current revision.
    pub version: u64,
    #[serde(default)]
    pub namespace: String,
    /// The user-supplied values of the current revision (`null` when none).
    #[serde(default)]
    pub config: Value,
    pub info: StatusInfo,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct StatusInfo {
    pub status: Status,
    #[serde(default)]
    pub description: String,
}

pub fn parse_history(json: &str) -> Result<Vec<Revision>, String> {
    let mut revs: Vec<Revision> =
        serde_json::from_str(json).map_err(|e| format!("`helm history` printed unexpected JSON: {e}"))?;
    revs.sort_by_key(|r| r.revision);
    Ok(revs)
}

pub fn parse_status(json: &str) -> Result<ReleaseStatus, String> {
    serde_json::from_str(json).map_err(|e| format!("`helm status` printed unexpected JSON: {e}"))
}

/// helm's answer when the release does not exist (status, history, rollback alike).
pub fn is_not_found(stderr: &[String]) -> bool {
    stderr.iter().any(|l| l.contains("release: not found"))
}

/// The newest revision whose status is `deployed`: what a rollback returns to.
pub fn last_deployed(history: &[Revision]) -> Option<&Revision> {
    history.iter().rev().find(|r| r.status == Status::Deployed)
}

/// `v3.17.3+ge4da497` -> 3.
pub fn parse_major(version: &str) -> Option<u32> {
    version.trim().strip_prefix('v')?.split('.').next()?.parse().ok()
}

/// The user-supplied values helm will record for this stack: the values files merged in order
/// (maps deeply, later files win), then each `set` entry at its dotted path. `None` when a key
/// uses list indexes or escapes, which this does not model (the caller then upgrades again).
pub fn wanted_values(files: &[Value], set: &std::collections::BTreeMap<String, Value>) -> Option<Value> {
    let mut merged = Value::Object(Map::new());
    for file in files {
        merge(&mut merged, file);
    }
    for (key, value) in set {
        if key.contains('[') || key.contains('\\') {
            return None;
        }
        let mut node = &mut merged;
        let parts: Vec<&str> = key.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            let map = node.as_object_mut()?;
            if i + 1 == parts.len() {
                map.insert(part.to_string(), value.clone());
                break;
            }
            let next = map.entry(part.to_string()).or_insert_with(|| Value::Object(Map::new()));
            if !next.is_object() {
                *next = Value::Object(Map::new());
            }
            node = next;
        }
    }
    Some(merged)
}

fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (into, from) => *into = from.clone(),
    }
}

/// Whether the recorded user values equal the wanted ones (`null` and `{}` are the same).
pub fn same_values(recorded: &Value, wanted: &Value) -> bool {
    let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(Map::is_empty);
    (empty(recorded) && empty(wanted)) || recorded == wanted
}

/// Seconds since the epoch of an RFC 3339 time as helm writes it
/// (`2026-11-30T03:50:34.134248252Z` or with a `+01:00` offset).
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let (date, rest) = text.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time_end = rest.find(['Z', '+', '-']).unwrap_or(rest.len());
    let (time, zone) = rest.split_at(time_end);
    let mut t = time.split(':');
    let (h, min) = (t.next()?.parse::<i64>().ok()?, t.next()?.parse::<i64>().ok()?);
    let sec = t.next()?.split('.').next()?.parse::<i64>().ok()?;
    let offset = match zone.chars().next() {
        Some(sign @ ('+' | '-')) => {
            let (oh, om) = zone[1..].split_once(':')?;
            let secs = oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60;
            if sign == '+' {
                secs
            } else {
                -secs
            }
        }
        _ => 0,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + min * 60 + sec - offset)
}

/// `2h5m`, `3m10s`, `42s`: an age for a report.
pub fn human_age(secs: i64) -> String {
    let secs = secs.max(0);
    match (secs / 3600, (secs % 3600) / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, _) if h < 48 => format!("{h}h{m}m"),
        (h, _, _) => format!("{}d{}h", h / 24, h % 24),
    }
}

/// A running helm process whose arguments name the release: `(pid, command line)`.
/// Looks at every `/proc/<pid>/cmdline` for an argv[0] (or a script's argv[1]) named `helm`;
/// a zombie (state `Z` or `X` in `/proc/<pid>/stat`) has exited and is not counted.
pub fn live_helm_for(release: &str, proc_root: &Path) -> Option<(u32, String)> {
    let me = std::process::id();
    let entries = std::fs::read_dir(proc_root).ok()?;
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        // A zombie has exited (its cmdline reads empty, but say so rather than rely on it).
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
            })
            .is_some_and(|state| state == "Z" || state == "X");
        if zombie {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> =
            raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let is_helm = |a: &String| Path::new(a).file_name().is_some_and(|n| n == "helm");
        let helm_at = args.iter().take(2).position(is_helm);
        if let Some(at) = helm_at {
            if args[at + 1..].iter().any(|a| a == release) {
                return Some((pid, args.join(" ")));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/helm/captured").join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn history_and_status_of_a_failed_upgrade_in_helm_3_and_4() {
        for major in [3, 4] {
            let history = parse_history(&captured(&format!("helm{major}-history-failed.json"))).unwrap();
            let statuses: Vec<&str> = history.iter().map(|r| r.status.as_str()).collect();
            assert_eq!(statuses, ["deployed", "failed"], "helm {major}");
            assert_eq!(history[1].chart, "webapp-0.1.0");
            assert!(
                history[1].description.starts_with(&format!("Upgrade \"r{major}\" failed:")),
                "{}",
                history[1].description
            );
            assert_eq!(last_deployed(&history).map(|r| r.revision), Some(1));
            let status = parse_status(&captured(&format!("helm{major}-status-failed.json"))).unwrap();
            assert_eq!((status.version, status.info.status.as_str()), (2, "failed"));
            assert_eq!(status.config, serde_json::json!({"tier": "not valid!"}));
        }
    }

    #[test]
    fn pending_history_from_a_killed_upgrade() {
        let history = parse_history(&captured("helm4-history-pending.json")).unwrap();
        let last = history.last().unwrap();
        assert!(last.is_pending(), "{last:?}");
        assert_eq!(last.status, Status::PendingUpgrade);
        assert!(parse_rfc3339(&last.updated).is_some());
    }

    #[test]
    fn statuses_keep_helms_words() {
        for word in ["deployed", "failed", "superseded", "pending-install", "pending-upgrade", "pending-rollback"] {
            let status = Status::from(word);
            assert!(!matches!(status, Status::Other(_)), "{word}");
            assert_eq!(status.as_str(), word);
        }
        // A status this rdeploy does not know stays helm's word; a `pending-*` one is pending.
        let history = parse_history(r#"[{"revision":1,"status":"pending-frobnicate","chart":"c-1"}]"#).unwrap();
        assert_eq!(history[0].status, Status::Other("pending-frobnicate".into()));
        assert_eq!(history[0].status.to_string(), "pending-frobnicate");
        assert!(history[0].is_pending());
        assert!(!Status::from("archived").is_pending());
    }

    #[test]
    fn versions() {
        assert_eq!(parse_major(&captured("helm3-version.txt")), Some(3));
        assert_eq!(parse_major(&captured("helm4-version.txt")), Some(4));
        assert_eq!(parse_major("garbage"), None);
    }

    #[test]
    fn wanted_values_merge_files_then_set() {
        let files = [
            serde_json::json!({"image": {"repo": "nginx", "tag": "1"}, "color": "blue"}),
            serde_json::json!({"image": {"tag": "2"}}),
        ];
        let set = std::collections::BTreeMap::from([
            ("image.tag".to_string(), serde_json::json!("3")),
            ("replicas".to_string(), serde_json::json!(2)),
        ]);
        assert_eq!(
            wanted_values(&files, &set).unwrap(),
            serde_json::json!({"image": {"repo": "nginx", "tag": "3"}, "color": "blue", "replicas": 2})
        );
        let indexed = std::collections::BTreeMap::from([("a[0]".to_string(), serde_json::json!(1))]);
        assert_eq!(wanted_values(&[], &indexed), None);
        assert!(same_values(&Value::Null, &serde_json::json!({})));
    }

    #[test]
    fn times_and_ages() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:01.5Z"), Some(951_868_801));
        assert_eq!(parse_rfc3339("2000-03-01T01:00:01+01:00"), Some(951_868_801));
        assert_eq!(human_age(42), "42s");
        assert_eq!(human_age(190), "3m10s");
        assert_eq!(human_age(7500), "2h5m");
    }

    #[test]
    fn finds_a_live_helm_by_release_name() {
        let root = tempfile::tempdir().unwrap();
        let add = |pid: &str, args: &[&str]| {
            std::fs::create_dir_all(root.path().join(pid)).unwrap();
            std::fs::write(root.path().join(pid).join("cmdline"), args.join("\0") + "\0").unwrap();
        };
        add("10", &["/usr/bin/vim", "web"]);
        add("11", &["/opt/helm4/helm", "upgrade", "web", "./chart"]);
        add("12", &["/bin/sh", "/tmp/x/helm", "upgrade", "api"]);
        assert_eq!(live_helm_for("web", root.path()).map(|p| p.0), Some(11));
        assert_eq!(live_helm_for("api", root.path()).map(|p| p.0), Some(12));
        assert_eq!(live_helm_for("db", root.path()), None);
    }
}

//! Terraform's "Error acquiring the state lock" diagnostic, read into who holds the lock.

use super::events::Diagnostic;

pub const LOCK_SUMMARY: &str = "Error acquiring the state lock";

/// The holder of a state lock, as terraform describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockInfo {
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub who: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub created: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operation: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
}

impl LockInfo {
    /// "lock ID 263a…, held by root@vm since 2026-11-30 03:21:33 UTC (apply)".
    pub fn describe(&self) -> String {
        let mut text = format!("lock ID {}", self.id);
        if !self.who.is_empty() {
            text.push_str(&format!(", held by {}", self.who));
        }
        if !self.created.is_empty() {
            text.push_str(&format!(" since {}", self.created));
        }
        if let Some(op) = self.operation.strip_prefix("OperationType") {
            text.push_str(&format!(" ({})", op.to_lowercase()));
        }
        text
    }
}

/// Reads the lock holder from the diagnostic, or `None` when it is about something else.
///
/// Most backends print the holder in the `Lock Info:` block. The http backend prints the
/// holder's ID as `already locked: ID=<id>` and a `Lock Info` block describing the attempt that
/// just failed, so that ID wins when present.
pub fn parse_lock_diagnostic(diag: &Diagnostic) -> Option<LockInfo> {
    if diag.summary != LOCK_SUMMARY {
        return None;
    }
    let mut info = LockInfo::default();
    let mut in_block = false;
    for line in diag.detail.lines() {
        if let Some(at) = line.find("locked: ID=") {
            let id = line[at + "locked: ID=".len()..].split_whitespace().next().unwrap_or_default();
            info.id = id.to_string();
            continue;
        }
        if line.trim() == "Lock Info:" {
            in_block = true;
            continue;
        }
        if !in_block {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            if line.trim().is_empty() {
                in_block = false;
            }
            continue;
        };
        let value = value.trim().to_string();
        match key.trim() {
            "ID" if info.id.is_empty() => info.id = value,
            "Who" => info.who = value,
            "Created" => info.created = tidy_time(&value),
            "Operation" => info.operation = value,
            "Path" => info.path = value,
            _ => {}
        }
    }
    (!info.id.is_empty()).then_some(info)
}

/// `2026-11-30 03:21:33.776026425 +0000 UTC` -> `2026-11-30 03:21:33 UTC`: Go's time format
/// with nanoseconds is noise in a report.
fn tidy_time(value: &str) -> String {
    let mut words = value.split_whitespace();
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some(date), Some(time), Some(_offset), Some(zone)) => {
            format!("{date} {} {zone}", time.split('.').next().unwrap_or(time))
        }
        _ => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::terraform::events::{parse_line, UiMessage};

    #[test]
    fn reads_the_holder_from_a_captured_lock_error() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/terraform/captured/lock-held-plan.jsonl"
        ))
        .unwrap();
        let diag = text
            .lines()
            .filter_map(parse_line)
            .find_map(|l| match l.body {
                UiMessage::Diagnostic(d) => Some(d),
                _ => None,
            })
            .unwrap();
        let info = parse_lock_diagnostic(&diag).unwrap();
        assert_eq!(info.id, "263a3355-9e76-abbc-5aa0-b2f23159f3c6");
        assert_eq!(info.who, "root@vm");
        assert_eq!(info.created, "2026-11-30 03:21:33 UTC");
        assert_eq!(info.path, "terraform.tfstate");
        assert_eq!(
            info.describe(),
            "lock ID 263a3355-9e76-abbc-5aa0-b2f23159f3c6, held by root@vm since 2026-11-30 03:21:33 UTC (apply)"
        );
    }

    #[test]
    fn the_http_backend_names_the_holder_on_its_own_line() {
        let diag = Diagnostic {
            severity: "error".into(),
            summary: LOCK_SUMMARY.into(),
            detail: "Error message: HTTP remote state already locked: ID=holder-1\nLock Info:\n  ID:        attempt-2\n  Who:       me@here\n".into(),
            address: None,
            range: None,
        };
        assert_eq!(parse_lock_diagnostic(&diag).unwrap().id, "holder-1");
        let other = Diagnostic { summary: "Module not installed".into(), ..diag };
        assert_eq!(parse_lock_diagnostic(&other), None);
    }
}

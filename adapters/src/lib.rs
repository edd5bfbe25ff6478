//! Tool adapters: each module turns one tool's run into sub-change events and knows that tool's
//! native recovery path. Adapters never print and never touch the checkpoint; the driver owns both.
//!
//! The contract ([`contract`]): every tool's spec implements [`Adapter`], dispatched by [`ToolSpec`];
//! - the driver gives a [`StepContext`] (paths, environment, cancellation, `force`) and an [`EventSink`];
//! - the adapter reports every sub-change as [`Event::Started`], [`Event::Done`] or
//!   [`Event::Failed`] the moment the tool tells it, and returns `Ok` or a [`Failure`];
//! - on `recover` it receives what the checkpoint knows ([`PriorStep`]) and resumes through the
//!   tool's own recovery path, never re-running a sub-change recorded as done.

// Adapters never print: what they learn reaches the operator through events and errors.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod ansible;
pub mod binary;
pub mod contract;
pub mod fold;
pub mod helm;
pub mod inputs;
pub mod kubeconfig;
pub mod kubectl;
pub mod outputs;
pub mod preview;
pub mod private;
pub mod process;
pub mod redact;
pub mod registry;
pub mod secrets;
pub mod shell;
pub mod terraform;
pub mod testing;
pub mod transient;
pub mod yaml;

pub use binary::resolve_binary;
pub use contract::*;
pub use preview::{PlanAction, PlanItem, Preview};
pub use registry::{Tool, ToolSpec};
pub use tokio_util::sync::CancellationToken;

/// The nearest valid word, if one is close enough to be a likely typo.
pub fn suggest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    // Edit distance catches transpositions in short keys (`rnu`), Jaro-Winkler catches
    // longer prefixes (`var_file`); a candidate must pass one of them to be offered.
    candidates
        .iter()
        .filter_map(|c| {
            let edits = strsim::damerau_levenshtein(word, c);
            let close = edits <= (c.len() / 3).max(1) || strsim::jaro_winkler(word, c) > 0.85;
            close.then_some((edits, *c))
        })
        .min_by_key(|(edits, _)| *edits)
        .map(|(_, c)| c)
}

/// `now + after`, or `None` when the clock cannot hold that instant (a bound decades away):
/// such a deadline never comes, and adding it must not panic (`Instant + Duration` does on
/// overflow, and a checkpoint's stack with a huge `timeout` would panic every `recover`).
pub fn deadline_after(after: std::time::Duration) -> Option<std::time::Instant> {
    std::time::Instant::now().checked_add(after)
}

/// [`deadline_after`] where a deadline is needed: one that cannot be held is a century away.
pub fn saturating_deadline(after: std::time::Duration) -> std::time::Instant {
    const CENTURY: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    let now = std::time::Instant::now();
    now.checked_add(after).or_else(|| now.checked_add(CENTURY)).unwrap_or(now)
}

/// Quotes a word for a POSIX shell when it needs it, so runbook commands paste cleanly.
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Joins a command line for display, quoting each word as needed.
pub fn display_command<S: AsRef<str>>(words: &[S]) -> String {
    words.iter().map(|w| shell_quote(w.as_ref())).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_when_needed() {
        assert_eq!(shell_quote("web-1"), "web-1");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(display_command(&["terraform", "apply", "tf plan"]), "terraform apply 'tf plan'");
    }

    #[test]
    fn a_count_of_sub_changes_is_singular_for_one() {
        assert_eq!(Tool::Kubectl.count_of(1), "1 object");
        assert_eq!(Tool::Kubectl.count_of(2), "2 objects");
        assert_eq!(Tool::Helm.count_of(1), "1 release revision");
        assert_eq!(Tool::Terraform.count_of(0), "0 resource addresses");
    }

    #[test]
    fn tool_names_round_trip() {
        for tool in Tool::ALL {
            assert_eq!(Tool::parse(tool.as_str()), Some(tool));
        }
        assert_eq!(Tool::parse("pulumi"), None);
    }
}

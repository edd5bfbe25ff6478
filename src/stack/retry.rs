//! `retry:`: how often and when a failed step is tried again without a human.

use std::time::Duration;

use rdeploy_adapters::yaml::Spanned;
use serde::Deserialize;

use super::base::{parse_duration_at, Checker, RETRY_DELAY_BOUNDS};

/// `retry:` as written, with positions for the checks in [`check_retry`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RetryKeys {
    attempts: Option<Spanned<String>>,
    delay: Option<Spanned<String>>,
    backoff: Option<Spanned<String>>,
    max_delay: Option<Spanned<String>>,
    #[serde(default)]
    matching: Vec<Spanned<String>>,
    transient: Option<bool>,
}

/// A step's `retry:`: how often and when a failed step is resumed again without a human.
#[derive(Clone, Debug)]
pub struct Retry {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    /// Before the second attempt.
    pub delay: Duration,
    /// Each further delay is the previous one times this (at least 1).
    pub backoff: f64,
    pub max_delay: Option<Duration>,
    /// A failure is retried when one of these matches its message or the tool's stderr tail.
    pub matching: Vec<regex::Regex>,
    /// Also retry the tool's known transient errors (default true).
    pub transient: bool,
}

impl Retry {
    /// How long to wait before attempt `next` (2 for the first retry).
    pub fn delay_before(&self, next: u32) -> Duration {
        let factor = self.backoff.powi(next.saturating_sub(2) as i32);
        // Saturated, never a panic: `mul_f64` panics on a product a `Duration` cannot hold.
        let delay = Duration::try_from_secs_f64(self.delay.as_secs_f64() * factor.min(1e6)).unwrap_or(Duration::MAX);
        match self.max_delay {
            Some(max) => delay.min(max),
            None => delay,
        }
    }
}

/// A step's `retry:`, each value checked; `None` when one is a located problem.
pub(super) fn check_retry(checker: &mut Checker<'_>, keys: &RetryKeys) -> Option<Retry> {
    let before = checker.problems.len();
    let attempts = match &keys.attempts {
        None => 3,
        Some(a) => match a.as_str().parse::<u32>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => {
                checker.at(
                    a.span(),
                    format!("`retry.attempts` is a whole number from 1 to 100, not `{}`", a.as_str()),
                    Some("count the first attempt too: `attempts: 3` retries twice".into()),
                );
                1
            }
        },
    };
    let delay = keys
        .delay
        .as_ref()
        .and_then(|d| parse_duration_at(checker, "retry.delay", d, RETRY_DELAY_BOUNDS))
        .unwrap_or(Duration::from_secs(5));
    let max_delay =
        keys.max_delay.as_ref().and_then(|d| parse_duration_at(checker, "retry.max_delay", d, RETRY_DELAY_BOUNDS));
    let backoff = match &keys.backoff {
        None => 2.0,
        Some(b) => match b.as_str().parse::<f64>() {
            Ok(f) if f.is_finite() && (1.0..=10.0).contains(&f) => f,
            _ => {
                checker.at(
                    b.span(),
                    format!("`retry.backoff` is a factor from 1 to 10, not `{}`", b.as_str()),
                    Some("`backoff: 2` doubles the delay after each attempt; `1` keeps it".into()),
                );
                1.0
            }
        },
    };
    let mut matching = Vec::new();
    for pattern in &keys.matching {
        match regex::Regex::new(pattern.as_str()) {
            Ok(re) => matching.push(re),
            Err(e) => {
                let text = e.to_string();
                let last = text.lines().last().unwrap_or("invalid").trim();
                let why = last.strip_prefix("error: ").unwrap_or(last).to_string();
                checker.at(
                    pattern.span(),
                    format!("`retry.matching` entry `{}` is not a regular expression: {}", pattern.as_str(), why),
                    Some("the syntax is Rust's `regex` crate; escape `(`, `[`, `.` with `\\`".into()),
                );
            }
        }
    }
    (checker.problems.len() == before).then(|| Retry {
        attempts,
        delay,
        backoff,
        max_delay,
        matching,
        transient: keys.transient.unwrap_or(true),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Retry;
    use crate::stack::base::RETRY_DELAY_BOUNDS;

    /// A retry's growing delay saturates instead of panicking (`Duration::mul_f64` panics on a
    /// product it cannot hold).
    #[test]
    fn a_retry_delay_saturates_rather_than_panics() {
        let retry = Retry {
            attempts: 100,
            delay: Duration::MAX,
            backoff: 10.0,
            max_delay: None,
            matching: Vec::new(),
            transient: true,
        };
        assert_eq!(retry.delay_before(100), Duration::MAX);
        let bounded = Retry { delay: RETRY_DELAY_BOUNDS.max, max_delay: Some(Duration::from_secs(60)), ..retry };
        assert_eq!(bounded.delay_before(100), Duration::from_secs(60));
    }
}

//! What every part of the stack check shares: the [`Checker`] that collects located
//! [`Problem`]s, the keys a step and the file's top level accept, and how a duration value is
//! read within its bounds. It imports no other part of `stack`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdeploy_adapters::yaml::{Location, Span, Spanned};
use rdeploy_adapters::Tool;

/// Keys every step accepts, whatever its tool.
pub const COMMON_KEYS: &[&str] =
    &["name", "tool", "needs", "resumable", "revert", "gate", "timeout", "env", "phase", "retry", "always"];
/// Keys a helm or kubectl step accepts to run once per cluster (a fleet step, `src/rollout`).
pub const FLEET_KEYS: &[&str] = &["contexts", "fleet", "selector", "rollout", "slo"];
/// Keys of the stack file's top level.
pub const TOP_KEYS: &[&str] = &["name", "steps", "on_failure", "state", "timeout"];

/// One problem found in a stack file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
    pub hint: Option<String>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file.display(), self.line, self.column, self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// Every problem found in a stack file; nothing runs while there is one.
#[derive(Debug, thiserror::Error)]
pub struct StackError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        writeln!(f, "the stack file has {n} problem{}:", if n == 1 { "" } else { "s" })?;
        for problem in &self.problems {
            writeln!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Collects problems with their positions while the stack is checked.
pub(super) struct Checker<'a> {
    pub(super) file: &'a Path,
    pub(super) problems: Vec<Problem>,
}

impl<'a> Checker<'a> {
    /// A checker of the stack file `file`, with nothing found yet.
    pub(super) fn new(file: &'a Path) -> Checker<'a> {
        Checker { file, problems: Vec::new() }
    }

    pub(super) fn at(&mut self, span: &Span, message: impl Into<String>, hint: Option<String>) {
        let (line, column) = span.start().map(|m| (m.line(), m.column())).unwrap_or((1, 1));
        self.problems.push(Problem { file: self.file.to_path_buf(), line, column, message: message.into(), hint });
    }

    pub(super) fn at_location(&mut self, at: Option<Location>, message: impl Into<String>, hint: Option<String>) {
        let Location { line, column } = at.unwrap_or(Location { line: 1, column: 1 });
        self.problems.push(Problem { file: self.file.to_path_buf(), line, column, message: message.into(), hint });
    }

    /// Every problem found, in the order of the file (those at one place in the order found).
    pub(super) fn finish(mut self) -> StackError {
        self.problems.sort_by_key(|p| (p.line, p.column));
        StackError { problems: self.problems }
    }
}

/// `keys` in backticks, joined by commas: `` `a`, `b` ``.
pub(super) fn quoted(keys: &[&str]) -> String {
    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
}

/// Every tool's name, [`quoted`].
pub(super) fn tool_list() -> String {
    quoted(&Tool::ALL.map(|t| t.as_str()))
}

/// The range a duration key accepts. Outside it a value is a mistake rather than a wish (a
/// timeout of `0s` or `1ns` fails every step at once; one of `18446744073709551615s` is no
/// timeout and overflows the clock), and it is bad input at `validate`, never a panic later.
#[derive(Clone, Copy, Debug)]
pub struct DurationBounds {
    pub min: Duration,
    pub max: Duration,
    /// How the bounds read in a message: `from 1s to 7d`.
    pub words: &'static str,
}

/// `timeout` (a step's and the stack's), `rollout.inventory_timeout`, `gate.inventory.timeout`.
pub const TIMEOUT_BOUNDS: DurationBounds =
    DurationBounds { min: Duration::from_secs(1), max: Duration::from_secs(7 * 24 * 3600), words: "from 1s to 7d" };
/// `retry.delay` and `retry.max_delay`: `0s` retries at once.
pub const RETRY_DELAY_BOUNDS: DurationBounds =
    DurationBounds { min: Duration::ZERO, max: Duration::from_secs(24 * 3600), words: "from 0s to 24h" };
/// `rollout.bake`: `0s` (the default) moves on to the next wave at once.
pub const BAKE_BOUNDS: DurationBounds =
    DurationBounds { min: Duration::ZERO, max: Duration::from_secs(30 * 24 * 3600), words: "from 0s to 30d" };

/// A duration key's value within `bounds`, else a located problem naming the bounds.
pub(super) fn parse_duration_at(
    checker: &mut Checker<'_>,
    key: &str,
    value: &Spanned<String>,
    bounds: DurationBounds,
) -> Option<Duration> {
    match humantime::parse_duration(value.as_str()) {
        Ok(d) if (bounds.min..=bounds.max).contains(&d) => Some(d),
        Ok(d) => {
            let (what, example) = if d < bounds.min { ("too short", "`30s`") } else { ("too long", "`2h`") };
            checker.at(
                value.span(),
                format!("`{key}: {}` is {what}: it is a duration {}", value.as_str(), bounds.words),
                Some(format!("write a duration {} like {example}", bounds.words)),
            );
            None
        }
        Err(e) => {
            checker.at(
                value.span(),
                format!("`{key}: {}` is not a duration: {e}", value.as_str()),
                Some(format!("write it like `90s`, `10m` or `1h30m` ({})", bounds.words)),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::stack::problems;

    /// Problems come in the order of the file, whichever check found them.
    #[test]
    fn problems_are_sorted_by_line() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    needs: [zz]\n    run: x\n  - name: b\n    tool: shell\n    run: ${{ steps.yy.outputs.k }}\n    timeout: soon\n");
        let lines: Vec<usize> = p.iter().map(|p| p.line).collect();
        assert_eq!(lines, [5, 9, 10], "{p:?}");
    }
}

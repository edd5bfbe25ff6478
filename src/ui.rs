//! What the operator sees while a deploy runs, on stderr: progress bars on a terminal, plain
//! timestamped lines otherwise (CI, `--no-progress`). The `Ui` also holds the run's
//! [`Redactor`], which every line it writes goes through, and the run's stdout ([`Out`], for
//! reports and JSON, rendered elsewhere): the one value every command is handed.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use owo_colors::OwoColorize;
use rdeploy_adapters::Stream;

use crate::engine::event::Reporter;
use crate::engine::event::{RetryWhy, RunEvent, StepEnd, SubChange, Work};
use crate::out::Out;
use crate::redact::Redactor;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether to color a stream, honouring `NO_COLOR` in `auto`.
    pub fn enabled(self, is_terminal: bool) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }
}

/// Colors for report text, off unless asked for.
#[derive(Clone, Copy, Debug)]
pub struct Paint {
    pub enabled: bool,
}

impl Paint {
    pub fn good(&self, s: &str) -> String {
        if self.enabled {
            s.green().to_string()
        } else {
            s.to_string()
        }
    }
    pub fn bad(&self, s: &str) -> String {
        if self.enabled {
            s.red().bold().to_string()
        } else {
            s.to_string()
        }
    }
    pub fn warn(&self, s: &str) -> String {
        if self.enabled {
            s.yellow().to_string()
        } else {
            s.to_string()
        }
    }
    pub fn strong(&self, s: &str) -> String {
        if self.enabled {
            s.bold().to_string()
        } else {
            s.to_string()
        }
    }
    pub fn dim(&self, s: &str) -> String {
        if self.enabled {
            s.dimmed().to_string()
        } else {
            s.to_string()
        }
    }
}

pub struct Ui {
    progress: Option<MultiProgress>,
    bars: Mutex<HashMap<String, ProgressBar>>,
    verbose: u8,
    quiet: bool,
    /// Colors on stderr.
    pub paint: Paint,
    /// The run's secrets: redacted from every line written here and through [`Ui::out`].
    redactor: Redactor,
    out: Out,
}

impl Ui {
    pub fn new(no_progress: bool, verbose: u8, quiet: bool, color: ColorChoice, redactor: Redactor) -> Ui {
        let tty = std::io::stderr().is_terminal();
        let progress = (tty && !no_progress && !quiet && std::env::var_os("CI").is_none())
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Ui {
            progress,
            bars: Mutex::new(HashMap::new()),
            verbose,
            quiet,
            paint: Paint { enabled: color.enabled(tty) },
            out: Out::new(redactor.clone()),
            redactor,
        }
    }

    /// The run's secrets (the stack parser fills it; the session hands it on).
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// The run's stdout, redacted with the run's secrets.
    pub fn out(&self) -> &Out {
        &self.out
    }

    /// A plain line: timestamped when not drawing bars.
    fn line(&self, text: String) {
        // The run's secrets never reach stderr, whatever printed them.
        let text = self.redactor.redact_document(&text);
        match &self.progress {
            Some(mp) => {
                let _ = mp.println(text);
            }
            None => {
                let ts = line_time(crate::checkpoint::now().0);
                let _ = writeln!(std::io::stderr().lock(), "{} {text}", self.paint.dim(&ts));
            }
        }
    }

    pub fn info(&self, text: impl AsRef<str>) {
        if !self.quiet {
            self.line(text.as_ref().to_string());
        }
    }

    pub fn warn(&self, text: impl AsRef<str>) {
        self.line(format!("{}: {}", self.paint.warn("warning"), text.as_ref()));
    }

    pub fn step_started(&self, step: &str, what: &str) {
        if let Some(mp) = &self.progress {
            let bar = mp.add(ProgressBar::new(0));
            bar.set_style(progress_style());
            bar.set_prefix(step.to_string());
            bar.set_message(what.to_string());
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            self.bars.lock().unwrap_or_else(|e| e.into_inner()).insert(step.to_string(), bar);
        }
        self.info(format!("{step}: {what}"));
    }

    pub fn planned(&self, step: &str, total: usize) {
        if let Some(bar) = self.bars.lock().unwrap_or_else(|e| e.into_inner()).get(step) {
            bar.set_length(total as u64);
        }
    }

    pub fn sub_change(&self, step: &str, id: &str, what: &str, finished: bool) {
        match self.bars.lock().unwrap_or_else(|e| e.into_inner()).get(step) {
            Some(bar) => {
                if finished {
                    bar.inc(1);
                }
                bar.set_message(format!("{id} {what}"));
            }
            None if self.verbose > 0 || finished => self.info(format!("{step}: {id} {what}")),
            None => {}
        }
    }

    pub fn output(&self, step: &str, stream: Stream, text: &str) {
        if self.verbose == 0 {
            return;
        }
        let marker = match stream {
            Stream::Stdout => "|",
            Stream::Stderr => "!",
        };
        self.line(format!("{} {text}", self.paint.dim(&format!("{step} {marker}"))));
    }

    pub fn step_finished(&self, step: &str, text: &str) {
        if let Some(bar) = self.bars.lock().unwrap_or_else(|e| e.into_inner()).remove(step) {
            bar.finish_and_clear();
            if let Some(mp) = &self.progress {
                mp.remove(&bar);
            }
        }
        self.info(format!("{step}: {text}"));
    }
}

/// A plain line's timestamp: UTC to the millisecond (`2026-12-02T03:31:39.814Z`), as log
/// lines are read; the journal keeps the full precision.
fn line_time(at: time::OffsetDateTime) -> String {
    const FORMAT: &[time::format_description::FormatItem<'static>] =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    at.to_offset(time::UtcOffset::UTC).format(FORMAT).unwrap_or_else(|_| at.to_string())
}

/// A running step's bar: what it does and, ticking, how long it has run (`[20s elapsed]`, as
/// terraform's `Still creating... [20s elapsed]`), so a long wait does not look stuck.
fn progress_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {prefix:.bold} [{bar:25}] {pos}/{len} [{elapsed_s} elapsed] {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("elapsed_s", |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = w.write_str(&elapsed(state.elapsed()));
        })
        .progress_chars("=> ")
}

/// `7s`, `1m05s`, `1h02m`: a step's running time, whole seconds.
fn elapsed(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The terminal's view of a run: each event as the line (or progress bar) the operator reads.
impl Reporter for Ui {
    fn event(&self, event: &RunEvent) {
        match event {
            RunEvent::Note(text) => self.info(text),
            RunEvent::Warning { from_step: Some(step), message } => self.warn(format!("{step}: {message}")),
            RunEvent::Warning { from_step: None, message } => self.warn(message),
            RunEvent::StepStarted { step, work, attempt } => {
                let what = match (work, attempt) {
                    (Work::Revert, _) => "revert".to_string(),
                    (Work::Apply(tool), _) => format!("{tool} apply"),
                    (Work::Recover(tool), Some(a)) if a.number > 1 => {
                        format!("{tool} recover (attempt {}/{})", a.number, a.of)
                    }
                    (Work::Recover(tool), _) => format!("{tool} recover"),
                };
                self.step_started(step, &what);
            }
            RunEvent::Planned { step, total } => self.planned(step, *total),
            RunEvent::SubChange { step, id, change } => match change {
                SubChange::Started => self.sub_change(step, id, "started", false),
                SubChange::Done => self.sub_change(step, id, "done", true),
                SubChange::Failed(error) => self.sub_change(step, id, &format!("failed: {error}"), true),
            },
            RunEvent::Output { step, stream, line } => self.output(step, *stream, line),
            RunEvent::AttemptFailed { step, attempt, why, summary, delay } => {
                let why = match why {
                    RetryWhy::Matches(pattern) => format!("matches `{pattern}`"),
                    RetryWhy::Transient(class) => format!("transient: {}", class.describe()),
                };
                self.step_finished(
                    step,
                    &format!(
                        "{} ({why}): {summary}; attempt {}/{} in {}",
                        self.paint.warn(&format!("attempt {}/{} failed", attempt.number, attempt.of)),
                        attempt.number + 1,
                        attempt.of,
                        humantime::format_duration(*delay)
                    ),
                );
            }
            RunEvent::AttemptSucceeded { step, attempt } => {
                self.info(format!("{step}: succeeded on attempt {} of {}", attempt.number, attempt.of))
            }
            RunEvent::StepEnded { step, end } => {
                let text = match end {
                    StepEnd::Done => self.paint.good("done"),
                    StepEnd::RolledBack { to } => self.paint.warn(&format!("rolled back to {to}")),
                    StepEnd::Failed { summary } => format!("{}: {summary}", self.paint.bad("failed")),
                    StepEnd::Refused { reason } => format!("refused by its gate: {reason}"),
                    StepEnd::Reverted => self.paint.warn("reverted"),
                    StepEnd::RevertFailed { summary } => format!("{}: {summary}", self.paint.bad("revert failed")),
                };
                self.step_finished(step, &text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_are_stamped_to_the_millisecond() {
        let at = time::macros::datetime!(2026-12-02 03:31:39.814896857 UTC);
        assert_eq!(line_time(at), "2026-12-02T03:31:39.814Z");
        assert_eq!(line_time(time::macros::datetime!(2026-12-02 03:31:39 UTC)), "2026-12-02T03:31:39.000Z");
    }

    #[test]
    fn elapsed_reads_like_terraform() {
        use std::time::Duration;
        assert_eq!(elapsed(Duration::from_millis(20_400)), "20s");
        assert_eq!(elapsed(Duration::from_secs(65)), "1m05s");
        assert_eq!(elapsed(Duration::from_secs(3720)), "1h02m");
    }
}

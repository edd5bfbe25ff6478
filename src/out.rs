//! The binary's stdout: reports and `--json` go through an [`Out`], so a reader that closes the
//! pipe early ends the output quietly (as ripgrep and cargo do) rather than panicking
//! mid-report. Everything written is redacted with the run's [`Redactor`], which the `Out`
//! carries: a command writes through the one its [`crate::ui::Ui`] holds (`outln!(ui.out(), ..)`).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::redact::Redactor;

/// Set once stdout is closed: later writes are dropped without trying again. Process-wide, as
/// the descriptor is.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// The run's stdout: writes redacted with its [`Redactor`].
#[derive(Clone, Debug)]
pub struct Out {
    redactor: Redactor,
}

impl Out {
    pub fn new(redactor: Redactor) -> Out {
        Out { redactor }
    }

    /// Writes `args` and a newline to stdout.
    pub fn line(&self, args: std::fmt::Arguments<'_>) {
        let text = self.redactor.redact_document(&args.to_string());
        write(|out| {
            out.write_all(text.as_bytes())?;
            out.write_all(b"\n")
        });
    }

    /// Writes `args` to stdout.
    pub fn text(&self, args: std::fmt::Arguments<'_>) {
        let text = self.redactor.redact_document(&args.to_string());
        write(|out| out.write_all(text.as_bytes()));
    }

    /// Writes `text` to stdout as it is, not redacted: only for what the operator asked to see
    /// in clear (`rdeploy output --show-sensitive`), built from values that were redacted
    /// already on their way to the checkpoint and the sensitive ones read again for it.
    pub fn reveal(&self, text: &str) {
        write(|out| out.write_all(text.as_bytes()));
    }

    /// Writes a value as pretty JSON and a newline, its string values redacted (not the text: a
    /// secret replaced in the text could change a key or break an escape).
    pub fn json<T: serde::Serialize>(&self, value: &T) -> anyhow::Result<()> {
        let value = self.redactor.redact_json_document(serde_json::to_value(value)?);
        let text = serde_json::to_string_pretty(&value)?;
        write(|out| {
            out.write_all(text.as_bytes())?;
            out.write_all(b"\n")
        });
        Ok(())
    }
}

/// `1 step`, `2 steps`, `0 steps`: a count and its noun, in the singular only for one.
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn write(f: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = f(&mut out).and_then(|()| out.flush()) {
        CLOSED.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("warning: could not write to stdout: {e}");
        }
    }
}

//! The binary's stdout: reports and `--json` go through here, so a reader that closes the pipe
//! early ends the output quietly (as ripgrep and cargo do) rather than panicking mid-report.
//! Everything written here is redacted with the process's [`secrets`] registry.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once stdout is closed: later writes are dropped without trying again.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// The values this process must never write: the run's secrets (the stack's marked values once
/// read, values secret by their name, terraform's sensitive ones). Steps get a clone in
/// `StepContext::secrets`; the journal, the logs, stdout, stderr and the files `ci` writes are
/// redacted with it.
pub fn secrets() -> &'static rdeploy_adapters::secrets::Registry {
    static SECRETS: std::sync::OnceLock<rdeploy_adapters::secrets::Registry> = std::sync::OnceLock::new();
    SECRETS.get_or_init(Default::default)
}

/// Writes `args` and a newline to stdout.
pub fn line(args: std::fmt::Arguments<'_>) {
    let text = secrets().redact_document(&args.to_string());
    write(|out| {
        out.write_all(text.as_bytes())?;
        out.write_all(b"\n")
    });
}

/// Writes `args` to stdout.
pub fn text(args: std::fmt::Arguments<'_>) {
    let text = secrets().redact_document(&args.to_string());
    write(|out| out.write_all(text.as_bytes()));
}

/// Writes a value as pretty JSON and a newline, its string values redacted (not the text: a
/// secret replaced in the text could change a key or break an escape).
/// `1 step`, `2 steps`, `0 steps`: a count and its noun, in the singular only for one.
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

pub fn json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let value = secrets().redact_json_document(serde_json::to_value(value)?);
    let text = serde_json::to_string_pretty(&value)?;
    write(|out| {
        out.write_all(text.as_bytes())?;
        out.write_all(b"\n")
    });
    Ok(())
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

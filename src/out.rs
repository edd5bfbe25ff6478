//! The binary's stdout: reports and `--json` go through here, so a reader that closes the pipe
//! early ends the output quietly (as ripgrep and cargo do) rather than panicking mid-report.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once stdout is closed: later writes are dropped without trying again.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `args` and a newline to stdout.
pub fn line(args: std::fmt::Arguments<'_>) {
    write(|out| {
        out.write_fmt(args)?;
        out.write_all(b"\n")
    });
}

/// Writes `args` to stdout.
pub fn text(args: std::fmt::Arguments<'_>) {
    write(|out| out.write_fmt(args));
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

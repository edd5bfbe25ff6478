//! The run's signals: a SIGINT/SIGTERM that comes before the runtime is noted (the handlers
//! `main` installs first thing), and from the session on the first one cancels the run.

use std::sync::{Arc, Mutex};

use rdeploy_adapters::CancellationToken;

use crate::exit::Code;
use crate::ui::Ui;

/// A SIGINT/SIGTERM that came before the run's own handlers were installed (0: none; -1: the
/// handlers of `watch_signals` have taken over).
static EARLY_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn note_early_signal(signal: libc::c_int) {
    // Only an atomic store: async-signal-safe. Once `watch_signals` owns the signals this is a
    // no-op (tokio's handler chains to this one).
    let _ = EARLY_SIGNAL.compare_exchange(
        0,
        signal,
        std::sync::atomic::Ordering::SeqCst,
        std::sync::atomic::Ordering::SeqCst,
    );
}

/// Before Rust's runtime starts: a Ctrl-C or SIGTERM before the runtime and the run's handlers
/// exist is noted instead of killing rdeploy by the default action; `watch_signals` acts on it.
pub fn note_signals_until_handled() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only does an atomic compare-exchange, which is async-signal-safe;
        // the sigaction struct is zeroed and then filled as sigaction(2) requires.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = note_early_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The signal noted before the run's handlers took over, if any; from now on they do.
pub fn take_early_signal() -> Option<&'static str> {
    match EARLY_SIGNAL.swap(-1, std::sync::atomic::Ordering::SeqCst) {
        libc::SIGINT => Some("SIGINT"),
        libc::SIGTERM => Some("SIGTERM"),
        _ => None,
    }
}

/// The first SIGINT/SIGTERM cancels the run: running tools get SIGINT once and are waited for.
/// A third signal exits at once; the journal is still consistent (records are whole lines).
pub fn watch_signals(cancel: CancellationToken, signal: Arc<Mutex<Option<String>>>, ui: Arc<Ui>) {
    use tokio::signal::unix::{signal as unix_signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (unix_signal(SignalKind::interrupt()), unix_signal(SignalKind::terminate()))
    else {
        ui.warn("could not install signal handlers; Ctrl-C will stop rdeploy without waiting for the tools");
        return;
    };
    let early = take_early_signal();
    tokio::spawn(async move {
        let mut count = 0;
        let mut early = early;
        loop {
            let name = match early.take() {
                Some(name) => name,
                None => tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                },
            };
            count += 1;
            match count {
                1 => {
                    *signal.lock().unwrap_or_else(|e| e.into_inner()) = Some(name.to_string());
                    ui.warn(format!("{name} received: stopping the running tools (forwarded once) and waiting for them to finish cleanly"));
                    cancel.cancel();
                }
                2 => ui.warn(
                    "still waiting for the tools to stop; one more signal exits now (the checkpoint stays consistent)",
                ),
                _ => std::process::exit(Code::Interrupted as i32),
            }
        }
    });
}

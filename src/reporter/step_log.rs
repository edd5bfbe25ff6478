//! The step logs: every line a step's tool printed, in `logs/STEP.log` under the state
//! directory, for the operator who reads what happened after the fact.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::engine::event::Reporter;
use crate::engine::event::RunEvent;
use crate::store::local::StateDir;
use crate::ui::Ui;

/// Writes each step's tool output to its log: a log starts afresh when the step starts (a retry
/// appends to its first attempt's) and when its `revert` starts.
pub struct StepLog {
    state: StateDir,
    /// Where a log that cannot be written is said (the step runs on; its output still reaches
    /// the terminal).
    ui: Arc<Ui>,
    open: Mutex<HashMap<String, Option<File>>>,
}

impl StepLog {
    pub fn new(state: StateDir, ui: Arc<Ui>) -> StepLog {
        StepLog { state, ui, open: Mutex::new(HashMap::new()) }
    }
}

impl Reporter for StepLog {
    fn event(&self, event: &RunEvent) {
        match event {
            RunEvent::StepStarted { step, attempt, .. } if attempt.is_none_or(|a| a.number <= 1) => {
                // 0600, never through a symlink planted at its name.
                let file = match self.state.create_file(&self.state.log_path(step)) {
                    Ok(file) => Some(file),
                    Err(e) => {
                        self.ui.warn(format!("{step}: not writing the step's log: {e:#}"));
                        None
                    }
                };
                self.open.lock().unwrap_or_else(|e| e.into_inner()).insert(step.clone(), file);
            }
            RunEvent::Output { step, line, .. } => {
                if let Some(Some(log)) = self.open.lock().unwrap_or_else(|e| e.into_inner()).get_mut(step) {
                    let _ = writeln!(log, "{line}");
                }
            }
            _ => {}
        }
    }
}

//! Exit codes as docs/exit-codes.md documents them, and the error that carries one to `main`.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Everything done, or nothing left to do.
    Ok = 0,
    /// Stopped part-way; checkpoint kept; `rdeploy recover` resumes.
    Partial = 1,
    /// Bad input; nothing was changed.
    BadInput = 2,
    /// A step that cannot be resumed failed and its `revert` ran.
    Reverted = 3,
    /// A gate refused a step.
    Refused = 4,
    /// Another run holds the lock.
    Locked = 5,
    /// A revert failed; manual action needed.
    RevertFailed = 6,
    /// `plan --detailed-exitcode` only: the plan has changes (0 there means none).
    Changes = 7,
    /// Interrupted by a signal; the checkpoint is consistent.
    Interrupted = 130,
}

impl From<Code> for std::process::ExitCode {
    fn from(code: Code) -> Self {
        std::process::ExitCode::from(code as u8)
    }
}

/// An error that ends the command with a specific exit code, a message and a hint.
#[derive(Debug)]
pub struct Refusal {
    pub code: Code,
    pub message: String,
    pub hint: Option<String>,
}

impl Refusal {
    pub fn new(code: Code, message: impl Into<String>) -> Refusal {
        Refusal { code, message: message.into(), hint: None }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Refusal {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

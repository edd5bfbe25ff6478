//! The reporters: each is handed the same [`RunEvent`](crate::engine::event::RunEvent)s, in
//! order, and draws, logs or writes them in its own terms (the terminal's progress in
//! `crate::ui`, the step logs in [`step_log`]). The engine emits; it never knows who listens.

pub mod step_log;

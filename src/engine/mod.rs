//! The engine: runs a stack's steps and says what happens as typed events ([`event`]); it
//! prints nothing (`main.rs` denies `print!`/`eprint!` in this module and everything under it).
//! [`schedule`] decides which step starts when, without processes; [`run`] is the loop that
//! starts and settles the steps; [`session`] is what every command shares, and each command
//! ([`up`], [`recover`], [`revert`] and `reset`) returns a [`RunReport`].

pub mod attempt;
pub mod event;
pub mod journal;
pub mod outputs;
pub mod planfile;
pub mod preview;
pub mod recover;
pub mod references;
pub mod report;
pub mod revert;
pub mod run;
pub mod schedule;
pub mod session;
pub mod sink;
pub mod up;

pub use report::{ApplyWhy, DryRunPlan, DryRunStep, Ended, Outcome, RunReport};
pub use session::Session;

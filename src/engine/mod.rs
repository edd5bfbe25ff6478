//! The engine: runs a stack's steps and says what happens as typed events ([`event`]); it
//! prints nothing (`main.rs` denies `print!`/`eprint!` in this module and everything under it).
//! [`schedule`] decides which step starts when, without processes.

pub mod attempt;
pub mod event;
pub mod journal;
pub mod outputs;
pub mod schedule;
pub mod sink;

//! The engine: runs a stack's steps and says what happens as typed events ([`event`]); it
//! prints nothing (`main.rs` denies `print!`/`eprint!` in this module and everything under it).

pub mod event;

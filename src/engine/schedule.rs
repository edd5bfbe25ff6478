//! The scheduler: which step may start now, and what a step's end does to the rest of the run.
//! Pure state, no processes and no I/O: the run loop (`run.rs`) asks [`Schedule::next_ready`],
//! runs the step, and tells [`Schedule::finish`] how it ended (as cargo's job queue decides in
//! one loop from the messages its workers send).
//!
//! The rules: a step starts once every step it `needs` is done, in stack order, at most
//! `parallel` at once. A failure stops every new start, or with `keep_going` only the steps that
//! need the failed one (they are never ready; the report names them skipped). An interrupt or a
//! revert that failed stops everything whatever `keep_going` says. A done step whose inputs went
//! stale is queued again ([`Schedule::requeue`]).

use std::collections::{HashMap, HashSet};

/// How a command ended, in the terms of the exit codes (docs/exit-codes.md; `cmd::exit_code` maps
/// them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The command did all it was asked (or there was nothing to do).
    Complete,
    Partial,
    StepReverted,
    Refused,
    RevertFailed,
    Interrupted,
}

impl Outcome {
    /// Keeps the most serious outcome when several steps end differently.
    pub fn worst(self, other: Outcome) -> Outcome {
        // Exit 3 promises "no partial state", so any partial step outranks a clean revert.
        let rank = |o: Outcome| match o {
            Outcome::Complete => 0,
            Outcome::StepReverted => 1,
            Outcome::Partial => 2,
            Outcome::Refused => 3,
            Outcome::Interrupted => 4,
            Outcome::RevertFailed => 5,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// How a step ended, as the scheduler needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepEnd {
    Done,
    /// `recover: rollback` took it back to its last good revision: not done, not half-done.
    RolledBack,
    /// Its gate refused it; nothing ran.
    Refused,
    /// It failed (`interrupted`: by the run's signal), and then was left as it was, reverted by
    /// its `revert`, or its `revert` failed too.
    Failed {
        interrupted: bool,
        then: AfterFailure,
    },
}

/// What followed a step's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Left part-way, for `recover`.
    Kept,
    /// Complete-or-revert: its `revert` took it back to where it started.
    Reverted,
    /// Its `revert` failed: manual action is needed, and nothing more runs on top of it.
    RevertFailed,
}

/// The run's steps: what is left to start (with what to do, `A`), what runs, what is done.
#[derive(Debug)]
pub struct Schedule<A> {
    /// Each step's `needs`, for every step of the stack.
    needs: HashMap<String, Vec<String>>,
    /// Not started yet, in stack order.
    todo: Vec<(String, A)>,
    /// Each step's place in the `todo` the run was given, to put a step taken back where it was.
    rank: HashMap<String, usize>,
    running: HashSet<String>,
    done: HashSet<String>,
    parallel: usize,
    keep_going: bool,
    stopping: bool,
    outcome: Outcome,
}

impl<A> Schedule<A> {
    /// `steps`: every step of the stack with its `needs`; `todo`: the steps this run does, in
    /// stack order; `done`: the steps done before it started.
    pub fn new(
        steps: impl IntoIterator<Item = (String, Vec<String>)>,
        todo: Vec<(String, A)>,
        done: HashSet<String>,
        parallel: usize,
        keep_going: bool,
    ) -> Schedule<A> {
        Schedule {
            needs: steps.into_iter().collect(),
            rank: todo.iter().enumerate().map(|(i, (name, _))| (name.clone(), i)).collect(),
            todo,
            running: HashSet::new(),
            done,
            parallel: parallel.max(1),
            keep_going,
            stopping: false,
            outcome: Outcome::Complete,
        }
    }

    /// The next step to start, taken off the list and counted as running: the first in stack
    /// order whose needs are all done, while the run is not stopping and fewer than `parallel`
    /// steps run.
    pub fn next_ready(&mut self) -> Option<(String, A)> {
        if self.stopping || self.running.len() >= self.parallel {
            return None;
        }
        let done = &self.done;
        let needs = &self.needs;
        let pos = self
            .todo
            .iter()
            .position(|(name, _)| needs.get(name).is_some_and(|needs| needs.iter().all(|n| done.contains(n))))?;
        let (name, action) = self.todo.remove(pos);
        self.running.insert(name.clone());
        Some((name, action))
    }

    /// A step [`next_ready`](Self::next_ready) gave ended.
    pub fn finish(&mut self, step: &str, end: StepEnd) {
        self.running.remove(step);
        match end {
            StepEnd::Done => {
                self.done.insert(step.to_string());
            }
            StepEnd::RolledBack => {
                self.branch_failed(true);
                self.worsen(Outcome::StepReverted);
            }
            StepEnd::Refused => {
                self.branch_failed(true);
                self.worsen(Outcome::Refused);
            }
            StepEnd::Failed { interrupted, then } => {
                self.branch_failed(!interrupted);
                self.worsen(match then {
                    AfterFailure::Kept => Outcome::Partial,
                    AfterFailure::Reverted => Outcome::StepReverted,
                    AfterFailure::RevertFailed => Outcome::RevertFailed,
                });
                if then == AfterFailure::RevertFailed {
                    self.stopping = true;
                }
                if interrupted {
                    self.worsen(Outcome::Interrupted);
                }
            }
        }
    }

    /// A step [`next_ready`](Self::next_ready) gave that never started (the run stopped while it
    /// waited for its early preview, or its start could not be journaled): it is taken back as
    /// it was, not running, at its place in stack order.
    pub fn unpop(&mut self, step: &str, action: A) {
        self.running.remove(step);
        let rank = |name: &str| self.rank.get(name).copied().unwrap_or(usize::MAX);
        let at = self.todo.iter().position(|(name, _)| rank(name) > rank(step)).unwrap_or(self.todo.len());
        self.todo.insert(at, (step.to_string(), action));
    }

    /// Whether a failure (`interrupted`: by the run's signal) stops every new start, as
    /// [`finish`](Self::finish) will once the failed step is settled.
    pub fn failure_stops(&self, interrupted: bool) -> bool {
        !self.keep_going || interrupted
    }

    /// The steps left to start that need `step`, directly or through one another: those that
    /// never start once it failed.
    pub fn dependents(&self, step: &str) -> Vec<String> {
        let mut found: Vec<String> = Vec::new();
        loop {
            let more: Vec<String> = self
                .todo
                .iter()
                .map(|(name, _)| name)
                .filter(|name| !found.contains(name))
                .filter(|name| {
                    self.needs.get(*name).is_some_and(|needs| needs.iter().any(|n| n == step || found.contains(n)))
                })
                .cloned()
                .collect();
            if more.is_empty() {
                return found;
            }
            found.extend(more);
        }
    }

    /// Nothing new starts.
    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// A done step used an output that changed since: it is no longer done, and runs again
    /// (with `action`) once what it needs is done.
    pub fn requeue(&mut self, step: &str, action: A) {
        self.done.remove(step);
        self.todo.retain(|(n, _)| n != step);
        self.todo.push((step.to_string(), action));
    }

    /// Nothing new starts (a signal, a checkpoint that cannot be written); running steps end.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    #[cfg(test)]
    fn is_done(&self, step: &str) -> bool {
        self.done.contains(step)
    }

    /// Every step of the stack is done.
    pub fn all_done(&self) -> bool {
        self.needs.keys().all(|s| self.done.contains(s))
    }

    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Folds in an outcome decided outside a step's end (the run was interrupted).
    pub fn worsen(&mut self, outcome: Outcome) {
        self.outcome = self.outcome.worst(outcome);
    }

    /// A step failed, was refused or rolled back: with `keep_going` (and `may_go_on`) only its
    /// dependents wait; otherwise nothing new starts.
    fn branch_failed(&mut self, may_go_on: bool) {
        if self.failure_stops(!may_go_on) {
            self.stopping = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// a -> b -> c, and d on its own; every step applied.
    fn diamond(parallel: usize, keep_going: bool) -> Schedule<()> {
        let steps = [("a", vec![]), ("b", vec!["a"]), ("c", vec!["b"]), ("d", vec![])]
            .map(|(n, needs)| (n.to_string(), needs.into_iter().map(String::from).collect()));
        let todo = ["a", "b", "c", "d"].map(|n| (n.to_string(), ())).to_vec();
        Schedule::new(steps, todo, HashSet::new(), parallel, keep_going)
    }

    fn ready(s: &mut Schedule<()>) -> Vec<String> {
        std::iter::from_fn(|| s.next_ready().map(|(n, ())| n)).collect()
    }

    const FAILED: StepEnd = StepEnd::Failed { interrupted: false, then: AfterFailure::Kept };

    #[test]
    fn starts_in_stack_order_once_needs_are_done_up_to_parallel() {
        let mut s = diamond(4, false);
        assert_eq!(ready(&mut s), ["a", "d"], "b needs a");
        s.finish("a", StepEnd::Done);
        assert_eq!(ready(&mut s), ["b"]);
        s.finish("b", StepEnd::Done);
        s.finish("d", StepEnd::Done);
        assert_eq!(ready(&mut s), ["c"]);
        s.finish("c", StepEnd::Done);
        assert!(ready(&mut s).is_empty());
        assert!(s.all_done());
        assert_eq!(s.outcome(), Outcome::Complete);
    }

    #[test]
    fn parallel_limits_what_runs_at_once() {
        let mut s = diamond(1, false);
        assert_eq!(ready(&mut s), ["a"]);
        s.finish("a", StepEnd::Done);
        assert_eq!(ready(&mut s), ["b"], "the first ready in stack order");
        s.finish("b", StepEnd::Done);
        assert_eq!(ready(&mut s), ["c"]);
    }

    #[test]
    fn a_failure_stops_every_new_start_without_keep_going() {
        let mut s = diamond(1, false);
        assert_eq!(ready(&mut s), ["a"]);
        s.finish("a", FAILED);
        assert!(ready(&mut s).is_empty(), "d is independent but the run stops");
        assert_eq!(s.outcome(), Outcome::Partial);
        assert!(!s.all_done());
    }

    #[test]
    fn keep_going_stops_only_the_dependents_of_a_failure() {
        let mut s = diamond(1, true);
        assert_eq!(ready(&mut s), ["a"]);
        s.finish("a", FAILED);
        assert_eq!(ready(&mut s), ["d"], "b and c need a; d runs on");
        s.finish("d", StepEnd::Done);
        assert!(ready(&mut s).is_empty());
        assert_eq!(s.outcome(), Outcome::Partial);
    }

    #[test]
    fn keep_going_also_holds_after_a_refusal_or_a_rollback() {
        for (end, outcome) in [(StepEnd::Refused, Outcome::Refused), (StepEnd::RolledBack, Outcome::StepReverted)] {
            let mut s = diamond(1, true);
            assert_eq!(ready(&mut s), ["a"]);
            s.finish("a", end);
            assert_eq!(ready(&mut s), ["d"], "{end:?}");
            assert_eq!(s.outcome(), outcome);
        }
    }

    #[test]
    fn an_interrupt_or_a_failed_revert_stops_everything_even_with_keep_going() {
        let interrupted = StepEnd::Failed { interrupted: true, then: AfterFailure::Kept };
        let revert_failed = StepEnd::Failed { interrupted: false, then: AfterFailure::RevertFailed };
        for (end, outcome) in [(interrupted, Outcome::Interrupted), (revert_failed, Outcome::RevertFailed)] {
            let mut s = diamond(1, true);
            assert_eq!(ready(&mut s), ["a"]);
            s.finish("a", end);
            assert!(ready(&mut s).is_empty(), "{end:?}");
            assert_eq!(s.outcome(), outcome);
        }
    }

    #[test]
    fn a_reverted_failure_is_step_reverted_unless_something_is_left_partial() {
        let mut s = diamond(2, true);
        assert_eq!(ready(&mut s), ["a", "d"]);
        s.finish("a", StepEnd::Failed { interrupted: false, then: AfterFailure::Reverted });
        assert_eq!(s.outcome(), Outcome::StepReverted);
        s.finish("d", FAILED);
        assert_eq!(s.outcome(), Outcome::Partial, "partial state outranks a clean revert");
    }

    #[test]
    fn a_stale_consumer_runs_again_after_its_producer() {
        let steps = [("p", vec![]), ("c", vec!["p"])]
            .map(|(n, needs)| (n.to_string(), needs.into_iter().map(String::from).collect::<Vec<_>>()));
        let done: HashSet<String> = ["c".to_string()].into();
        let mut s = Schedule::new(steps, vec![("p".to_string(), ())], done, 2, false);
        assert_eq!(ready(&mut s), ["p"]);
        s.requeue("c", ());
        assert!(!s.is_done("c"));
        assert!(ready(&mut s).is_empty(), "c waits for p, which runs");
        s.finish("p", StepEnd::Done);
        assert_eq!(ready(&mut s), ["c"]);
        s.finish("c", StepEnd::Done);
        assert!(s.all_done());
    }

    #[test]
    fn a_step_taken_back_is_not_running_and_starts_again_at_its_place_in_stack_order() {
        let mut s = diamond(2, false);
        assert_eq!(ready(&mut s), ["a", "d"]);
        s.unpop("d", ());
        assert_eq!(ready(&mut s), ["d"], "not running: it starts again");
        s.unpop("d", ());
        s.finish("a", StepEnd::Done);
        assert_eq!(ready(&mut s), ["b", "d"], "after b, which comes first in stack order");
        s.unpop("b", ());
        s.unpop("d", ());
        s.stop();
        assert!(ready(&mut s).is_empty());
        assert!(!s.all_done());
        assert_eq!(s.outcome(), Outcome::Complete, "a step that never started changes no outcome");
    }

    #[test]
    fn the_dependents_of_a_step_are_those_left_that_need_it_through_one_another() {
        let mut s = diamond(1, true);
        assert_eq!(s.dependents("a"), ["b", "c"]);
        assert_eq!(s.dependents("b"), ["c"]);
        assert!(s.dependents("d").is_empty());
        assert_eq!(ready(&mut s), ["a"]);
        s.finish("a", StepEnd::Done);
        assert_eq!(ready(&mut s), ["b"]);
        assert_eq!(s.dependents("b"), ["c"]);
        assert!(s.dependents("a").is_empty(), "only through steps left to start: b runs");
    }

    #[test]
    fn failure_stops_says_beforehand_whether_the_failure_will_stop_every_new_start() {
        for keep_going in [false, true] {
            for interrupted in [false, true] {
                let mut s = diamond(1, keep_going);
                assert_eq!(ready(&mut s), ["a"]);
                let said = s.failure_stops(interrupted);
                s.finish("a", StepEnd::Failed { interrupted, then: AfterFailure::Kept });
                assert_eq!(ready(&mut s).is_empty(), said, "keep_going {keep_going}, interrupted {interrupted}");
            }
        }
    }

    #[test]
    fn stop_starts_nothing_more() {
        let mut s = diamond(4, true);
        s.stop();
        assert!(ready(&mut s).is_empty());
    }

    #[test]
    fn worst_ranks_outcomes() {
        use Outcome::*;
        assert_eq!(Complete.worst(StepReverted), StepReverted);
        assert_eq!(StepReverted.worst(Partial), Partial);
        assert_eq!(Partial.worst(StepReverted), Partial);
        assert_eq!(Refused.worst(Interrupted), Interrupted);
        assert_eq!(RevertFailed.worst(Interrupted), RevertFailed);
    }
}

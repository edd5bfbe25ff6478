//! What changed in the stack since a checkpoint was written. [`StackDiff::between`] is the one
//! comparison of a stack with a recorded deploy; `recover` (its warnings), `recover --dry-run`,
//! the partial-state report and `ci` all read its answer instead of comparing digests themselves.

use crate::checkpoint::{Deploy, StepStatus};
use crate::stack::Stack;

/// How a stack differs from a recorded deploy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackDiff {
    /// The stack file is not the one the checkpoint recorded (any byte of it).
    pub file_changed: bool,
    /// The steps that differ: in the stack's order, then the steps removed from it.
    pub steps: Vec<StepDiff>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepDiff {
    pub name: String,
    pub change: Change,
}

/// How one step differs from what the checkpoint recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Its settings changed. `done`: it had completed (recover does not run it again);
    /// `tool_changed`: it is now a step of another tool (recover refuses that).
    Changed { done: bool, tool_changed: bool },
    /// In the stack, not in the checkpoint.
    Added,
    /// In the checkpoint, no longer in the stack. `ran`: it had started (recover refuses that).
    Removed { ran: bool },
}

impl StackDiff {
    /// Compares the stack with the deploy's recorded steps.
    pub fn between(stack: &Stack, deploy: &Deploy) -> StackDiff {
        let mut steps = Vec::new();
        for step in stack.ordered() {
            let change = match deploy.step(&step.name) {
                None => Change::Added,
                Some(old) if old.digest != step.digest || old.tool != step.tool => {
                    Change::Changed { done: old.status == StepStatus::Done, tool_changed: old.tool != step.tool }
                }
                Some(_) => continue,
            };
            steps.push(StepDiff { name: step.name.clone(), change });
        }
        for old in deploy.steps.iter().filter(|old| stack.step(&old.name).is_none()) {
            steps.push(StepDiff {
                name: old.name.clone(),
                change: Change::Removed { ran: old.status != StepStatus::Pending },
            });
        }
        StackDiff { file_changed: deploy.stack_digest != stack.digest, steps }
    }

    /// How the step changed, if it did.
    pub fn change(&self, step: &str) -> Option<Change> {
        self.steps.iter().find(|s| s.name == step).map(|s| s.change)
    }

    /// The recorded step is not what the stack asks now: its settings changed, or it was removed.
    pub fn recorded_step_changed(&self, step: &str) -> bool {
        matches!(self.change(step), Some(Change::Changed { .. } | Change::Removed { .. }))
    }

    /// The step's settings changed (it is in both the stack and the checkpoint).
    pub fn settings_changed(&self, step: &str) -> bool {
        matches!(self.change(step), Some(Change::Changed { .. }))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::checkpoint::Record;
    use crate::engine::journal::Checkpoint;
    use crate::stack::parse;

    fn stack(text: &str) -> Stack {
        parse(Path::new("stack.yaml"), text).unwrap()
    }

    #[test]
    fn names_changed_added_and_removed_steps_in_stack_order() {
        let old = stack(
            "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo a\n  - name: b\n    tool: shell\n    run: echo b\n  - name: gone\n    tool: shell\n    run: echo g\n  - name: ran\n    tool: shell\n    run: echo r\n",
        );
        let tmp = tempfile::tempdir().unwrap();
        let dir = crate::store::local::LocalStore::at_path(tmp.path().join(".rdeploy"));
        let mut cp = Checkpoint::create(&dir, &Default::default()).unwrap();
        cp.record(Checkpoint::run_record(&old, "up", "r1")).unwrap();
        cp.record(Record::StepDone { step: "a".into() }).unwrap();
        cp.record(Record::StepDone { step: "ran".into() }).unwrap();
        let deploy = cp.deploy().clone();
        assert_eq!(StackDiff::between(&old, &deploy), StackDiff::default(), "the same stack differs in nothing");

        let new = stack(
            "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo A\n  - name: b\n    tool: shell\n    run: echo B\n  - name: c\n    tool: shell\n    run: echo c\n",
        );
        let diff = StackDiff::between(&new, &deploy);
        assert!(diff.file_changed);
        let got: Vec<(&str, Change)> = diff.steps.iter().map(|s| (s.name.as_str(), s.change)).collect();
        assert_eq!(
            got,
            [
                ("a", Change::Changed { done: true, tool_changed: false }),
                ("b", Change::Changed { done: false, tool_changed: false }),
                ("c", Change::Added),
                ("gone", Change::Removed { ran: false }),
                ("ran", Change::Removed { ran: true }),
            ]
        );
        assert!(diff.settings_changed("a") && !diff.settings_changed("gone") && !diff.settings_changed("c"));
        assert!(diff.recorded_step_changed("gone") && !diff.recorded_step_changed("c"));
    }
}

//! The stack file: parsing `stack.yaml` into a validated plan, with every error located at
//! file:line:column and a suggestion. The YAML itself is read by `rdeploy_adapters::yaml`.
//!
//! [`parse`] reads the file's top level (`top`), its steps (`steps`, their values in `values`,
//! serde's errors located by `decode`), then checks what lies between steps: `needs` and the
//! order (`graph`), references (`references`). A step's own concerns have a module each
//! (`gates`, `fleet`, `retry`); `base` holds what they all share.

mod base;
mod decode;
mod fleet;
mod gates;
mod graph;
mod references;
mod retry;
mod step;
mod steps;
mod top;
mod values;

use std::path::{Path, PathBuf};

use rdeploy_adapters::yaml;
use rdeploy_adapters::Adapter;

use crate::redact::Redactor;
use sha2::{Digest, Sha256};

pub use base::StackError;
pub use fleet::{AbsentPolicy, FleetStep, MaxFailures, WaveSize};
pub use gates::{Gate, GateException};
pub use rdeploy_adapters::suggest;
pub use references::ResolveError;
pub use retry::Retry;
pub use step::Step;
pub use top::OnFailure;

use base::Checker;
use graph::{check_needs, check_phases, report_cycle, run_order};
use references::{add_implicit_needs, check_references};
use steps::{read_steps, Read};
use top::{check_characters, check_sizes, read_top, Top};

/// A validated stack, ready to run.
#[derive(Clone, Debug)]
pub struct Stack {
    pub name: String,
    /// The stack file as the user named it (used in commands we print).
    pub file: PathBuf,
    /// The directory relative paths resolve against.
    pub dir: PathBuf,
    pub on_failure: OnFailure,
    /// Steps in file order.
    pub steps: Vec<Step>,
    /// Indexes into `steps` in the order they run (DAG order, file order between equals).
    pub order: Vec<usize>,
    /// Digest of the whole file, to tell a changed stack.
    pub digest: String,
    /// `state:`: where the checkpoint and the lock live (a `postgres://` URL); `None` is the
    /// local state directory.
    pub state: Option<String>,
}

/// Reads and validates a stack file, and hands the run's `redactor` the secrets it found.
/// Errors name file, line and column.
pub fn load(file: &Path, redactor: &Redactor) -> anyhow::Result<Stack> {
    let text = yaml::decode_utf8(fs_err::read(file)?).map_err(|e| {
        let mut checker = Checker::new(file);
        checker.at_location(e.at, e.message, Some("save the stack file as UTF-8".into()));
        checker.finish()
    })?;
    let stack = parse(file, &text)?;
    // The stack's own secrets (inline ones, `env` values secret by their name, tool values
    // secret by their name) are redacted from whatever the run writes, whatever command it is.
    for step in &stack.steps {
        redactor.add_strings(rdeploy_adapters::secrets::env_secrets(&step.env));
        for marked in step.spec.marked().values().chain(step.env_marked.values()) {
            if let Some(value) = &marked.value {
                redactor.add(value);
            } else if let Ok(value) = marked.resolve(&stack.dir, &|name: &str| std::env::var(name).ok()) {
                // `from_env`/`from_file` too, from the start: every tool inherits rdeploy's
                // environment, so an earlier step (`set -x`, `env`, a debug log) could print a
                // value a later step reads. One that cannot be read yet fails its own step then.
                redactor.add(&value);
            }
        }
        let mut spec = step.spec.clone();
        if let Some((_, values)) = spec.typed_values_mut() {
            redactor.add_strings(rdeploy_adapters::secrets::secret_strings(values, &Default::default()));
        }
    }
    Ok(stack)
}

/// Parses stack text; `file` is used in messages and to resolve relative paths.
pub fn parse(file: &Path, text: &str) -> Result<Stack, StackError> {
    let mut checker = Checker::new(file);
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let digest = hex::encode(Sha256::digest(text.as_bytes()));

    if !check_characters(&mut checker, text) {
        return Err(checker.finish());
    }
    let root = match yaml::parse_located_all(text) {
        Ok((node, duplicates)) => {
            // Reported, and the rest read on: the last value written for a key is the one read.
            for e in duplicates {
                checker.at_location(e.at, e.message, Some("remove one of the two: only the last one is read".into()));
            }
            node
        }
        Err(e) => {
            let hint = (e.message == yaml::NOT_A_MAPPING).then(|| "start with `name:` and `steps:`".to_string());
            checker.at_location(e.at, e.message, hint);
            return Err(checker.finish());
        }
    };
    check_sizes(&mut checker, &root);
    let Some(top) = root.as_mapping() else {
        checker.at(root.span(), "the stack file must be a mapping", Some("start with `name:` and `steps:`".into()));
        return Err(checker.finish());
    };

    let Top { name, on_failure, default_timeout, state } = read_top(&mut checker, file, top);
    let Some(step_nodes) = top.get_sequence("steps") else {
        let span = top.get_node("steps").map(|n| *n.span()).unwrap_or(*top.span());
        checker.at(&span, "the stack needs a `steps:` list", Some("add `steps:` with at least one step".into()));
        return Err(checker.finish());
    };

    // Every name written, also those of steps with problems of their own: a `needs` or a
    // reference naming such a step is not reported as naming nothing (its own problem is).
    let mut written: Vec<&str> =
        step_nodes.iter().filter_map(|n| n.as_mapping()?.get_scalar("name")).map(|n| n.as_str()).collect();
    written.sort_unstable();
    written.dedup();

    let Read { mut steps, name_spans, first_by_name, needs_spans, phase_spans, ref_spans } =
        read_steps(&mut checker, &dir, step_nodes, default_timeout);
    if step_nodes.is_empty() {
        checker.at(step_nodes.span(), "`steps` is empty", Some("add at least one step".into()));
    }
    // The order can be judged only when every step and every edge between steps is known.
    let mut graph_known = steps.len() == step_nodes.len();
    graph_known &= check_needs(&mut checker, &steps, &needs_spans, &written);
    let (implicit, references_known) = check_references(&mut checker, &steps, &ref_spans, &first_by_name, &written);
    graph_known &= references_known;
    add_implicit_needs(&mut steps, ref_spans, &first_by_name);

    let order = match run_order(&steps) {
        Ok(order) => Some(order),
        Err(cycle) => {
            report_cycle(&mut checker, &steps, cycle, &implicit, &needs_spans, &name_spans);
            None
        }
    };
    check_phases(&mut checker, &steps, order.as_deref().filter(|_| graph_known), &phase_spans);
    let Some(order) = order.filter(|_| checker.problems.is_empty()) else {
        return Err(checker.finish());
    };
    Ok(Stack { name, file: file.to_path_buf(), dir, on_failure, steps, order, digest, state })
}

impl Stack {
    pub fn step(&self, name: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// Steps in the order they run.
    pub fn ordered(&self) -> impl Iterator<Item = &Step> {
        self.order.iter().map(|&i| &self.steps[i])
    }
}

/// The problems of a stack text that does not parse, for the tests of every part.
#[cfg(test)]
fn problems(text: &str) -> Vec<base::Problem> {
    parse(Path::new("stack.yaml"), text).unwrap_err().problems
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{load, parse, problems, StackError};
    use crate::redact::Redactor;

    #[test]
    fn a_valid_stack_runs_in_needs_order() {
        let text = "name: shop\nsteps:\n  - name: b\n    tool: shell\n    needs: [a]\n    run: echo b\n  - name: a\n    tool: shell\n    sub_changes:\n      - { name: one, run: echo 1 }\n";
        let stack = parse(Path::new("stack.yaml"), text).unwrap();
        let order: Vec<&str> = stack.ordered().map(|s| s.name.as_str()).collect();
        assert_eq!(order, ["a", "b"]);
        assert!(stack.step("a").unwrap().resumable);
        assert!(!stack.step("b").unwrap().resumable);
        assert_eq!(stack.step("a").unwrap().line, 7);
    }

    #[test]
    fn invalid_yaml_is_located() {
        let p = problems("name: s\nsteps:\n  - name: a\n   tool: shell\n");
        assert_eq!(p.len(), 1);
        assert!(p[0].message.starts_with("invalid YAML"), "{}", p[0].message);
    }

    #[test]
    fn a_duplicate_key_is_an_error_naming_both_lines() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n    run: y\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (6, 5));
        assert_eq!(p[0].message, "key `run` appears twice in the same mapping (first on line 5)");
    }

    /// A duplicate key is reported at its line and the rest is checked, in file order, instead
    /// of ending the check with a hint about the file's shape.
    #[test]
    fn a_duplicate_key_does_not_end_the_check() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n    run: y\n    phase: later\n  - name: b\n    tool: shel\n");
        let found: Vec<(usize, &str)> = p.iter().map(|p| (p.line, p.message.as_str())).collect();
        assert_eq!(
            found,
            [
                (6, "key `run` appears twice in the same mapping (first on line 5)"),
                (7, "`phase` is `expand`, `migrate` or `contract`, not `later`"),
                (9, "unknown tool `shel`"),
            ],
            "{p:?}"
        );
        assert_eq!(p[0].hint.as_deref(), Some("remove one of the two: only the last one is read"));
    }

    #[test]
    fn a_second_document_is_an_error_naming_its_line() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n---\nname: t\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].line, 6);
        assert!(p[0].message.contains("second YAML document"), "{}", p[0].message);
    }

    #[test]
    fn a_byte_order_mark_is_accepted() {
        let stack =
            parse(Path::new("s.yaml"), "\u{feff}name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n").unwrap();
        assert_eq!(stack.name, "s");
    }

    #[test]
    fn invalid_utf8_is_located() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("stack.yaml");
        std::fs::write(&file, b"name: s\nsteps:\n  - name: a\xff\n    tool: shell\n    run: x\n").unwrap();
        let err = load(&file, &Redactor::default()).unwrap_err().downcast::<StackError>().unwrap();
        assert_eq!((err.problems[0].line, err.problems[0].column), (3, 12));
        assert!(err.problems[0].message.contains("not valid UTF-8"), "{}", err.problems[0].message);
    }
}

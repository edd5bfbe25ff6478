//! The stack file: parsing `stack.yaml` into a validated plan, with every error located at
//! file:line:column and a suggestion. The YAML itself is read by `rdeploy_adapters::yaml`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdeploy_adapters::secrets::Marked;
use rdeploy_adapters::yaml::{self, Location, Node, ScalarNode, Span, Spanned};

use crate::fleet::model::Kind;
use crate::reference::{self, Located, Reference};
use rdeploy_adapters::{Adapter, FieldPath, PathSegment, Tool, ToolSpec};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

mod fleet;
mod gates;
mod order;
mod step;
mod timing;
mod values;

pub use self::fleet::*;
pub use self::gates::*;
use self::order::*;
pub use self::step::*;
pub use self::timing::*;
use self::values::*;

/// Keys every step accepts, whatever its tool.
pub const COMMON_KEYS: &[&str] =
    &["name", "tool", "needs", "resumable", "revert", "gate", "timeout", "env", "phase", "retry", "always"];
/// Keys a helm or kubectl step accepts to run once per cluster (a fleet step, `src/rollout`).
pub const FLEET_KEYS: &[&str] = &["contexts", "fleet", "selector", "rollout", "slo"];
/// Keys of the stack file's top level.
pub const TOP_KEYS: &[&str] = &["name", "steps", "on_failure", "state", "timeout"];

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

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    #[default]
    Stop,
    /// `--keep-going` by default: independent branches run past a failure.
    Continue,
    Revert,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Expand,
    Migrate,
    Contract,
}

/// One problem found in a stack file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
    pub hint: Option<String>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file.display(), self.line, self.column, self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// Every problem found in a stack file; nothing runs while there is one.
#[derive(Debug, thiserror::Error)]
pub struct StackError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        writeln!(f, "the stack file has {n} problem{}:", if n == 1 { "" } else { "s" })?;
        for problem in &self.problems {
            writeln!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Collects problems with their positions while the stack is checked.
struct Checker<'a> {
    file: &'a Path,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    fn at(&mut self, span: &Span, message: impl Into<String>, hint: Option<String>) {
        let (line, column) = span.start().map(|m| (m.line(), m.column())).unwrap_or((1, 1));
        self.problems.push(Problem { file: self.file.to_path_buf(), line, column, message: message.into(), hint });
    }

    fn at_location(&mut self, at: Option<Location>, message: impl Into<String>, hint: Option<String>) {
        let Location { line, column } = at.unwrap_or(Location { line: 1, column: 1 });
        self.problems.push(Problem { file: self.file.to_path_buf(), line, column, message: message.into(), hint });
    }

    /// Every problem found, in the order of the file (those at one place in the order found).
    fn finish(mut self) -> StackError {
        self.problems.sort_by_key(|p| (p.line, p.column));
        StackError { problems: self.problems }
    }
}

/// Reads and validates a stack file. Errors name file, line and column.
pub fn load(file: &Path) -> anyhow::Result<Stack> {
    let text = yaml::decode_utf8(fs_err::read(file)?).map_err(|e| {
        let mut checker = Checker { file, problems: Vec::new() };
        checker.at_location(e.at, e.message, Some("save the stack file as UTF-8".into()));
        checker.finish()
    })?;
    let stack = parse(file, &text)?;
    // The stack's own secrets (inline ones, `env` values secret by their name, tool values
    // secret by their name) are redacted from whatever this process writes, whatever command it is.
    let secrets = crate::out::secrets();
    for step in &stack.steps {
        secrets.add_strings(rdeploy_adapters::secrets::env_secrets(&step.env));
        for marked in step.spec.marked().values().chain(step.env_marked.values()) {
            if let Some(value) = &marked.value {
                secrets.add(value);
            } else if let Ok(value) = marked.resolve(&stack.dir, &|name: &str| std::env::var(name).ok()) {
                // `from_env`/`from_file` too, from the start: every tool inherits rdeploy's
                // environment, so an earlier step (`set -x`, `env`, a debug log) could print a
                // value a later step reads. One that cannot be read yet fails its own step then.
                secrets.add(&value);
            }
        }
        let mut spec = step.spec.clone();
        if let Some((_, values)) = spec.typed_values_mut() {
            secrets.add_strings(rdeploy_adapters::secrets::secret_strings(values, &Default::default()));
        }
    }
    Ok(stack)
}

/// The longest value a stack file may hold, in bytes: below the kernel's 128 KiB for one
/// argument or environment variable (`MAX_ARG_STRLEN`), with room for a flag or a name.
pub const MAX_VALUE_BYTES: usize = 100 * 1024;
/// The most bytes one step's values may hold in all: half the usual 2 MiB the kernel leaves
/// for a command line and environment together, the other half for rdeploy's own environment.
pub const MAX_STEP_BYTES: usize = 1024 * 1024;
/// Control characters reported one by one before the rest are counted.
const MAX_REPORTED_CHARACTERS: usize = 10;

/// Parses stack text; `file` is used in messages and to resolve relative paths.
pub fn parse(file: &Path, text: &str) -> Result<Stack, StackError> {
    let mut checker = Checker { file, problems: Vec::new() };
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
    for (i, located) in ref_spans.into_iter().enumerate() {
        let step = &mut steps[i];
        for Located { reference, .. } in located {
            if reference.step == step.name || !first_by_name.contains_key(&reference.step) {
                continue;
            }
            if !step.refs.contains(&reference) {
                step.refs.push(reference.clone());
            }
            if !step.needs.contains(&reference.step) {
                step.needs.push(reference.step);
            }
        }
    }

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

/// Whether the text is free of the control characters YAML forbids; each one found is a
/// problem at its place.
fn check_characters(checker: &mut Checker<'_>, text: &str) -> bool {
    // Quoted scalars are marked, so values handed to a tool keep their YAML type
    // ([`yaml::typed_json`]); serde deserializes from [`yaml::coercible`] copies, as before.
    // A NUL (or another control character YAML forbids) would end the parse early, or fail it
    // far from the character: each is reported where it is, and nothing else is read.
    let forbidden = yaml::forbidden_characters(text);
    if forbidden.is_empty() {
        return true;
    }
    {
        for (at, c) in forbidden.iter().take(MAX_REPORTED_CHARACTERS) {
            let name = if *c == '\0' {
                "a NUL byte".to_string()
            } else {
                format!("the control character U+{:04X}", *c as u32)
            };
            checker.at_location(
                Some(*at),
                format!("the stack file holds {name} here; YAML allows no control characters but tab and line breaks"),
                Some("remove it (`cat -A` shows it as `^@` or `M-`): a stack file is text".into()),
            );
        }
        if forbidden.len() > MAX_REPORTED_CHARACTERS {
            checker.at_location(
                Some(forbidden[MAX_REPORTED_CHARACTERS].0),
                format!("and {} more control characters", forbidden.len() - MAX_REPORTED_CHARACTERS),
                None,
            );
        }
    }
    false
}

/// Values too long for a tool's command line or environment, alone or a step's in all.
fn check_sizes(checker: &mut Checker<'_>, root: &Node) {
    // Every value may reach a tool's command line or environment, where the kernel takes at
    // most 128 KiB per word and about 2 MiB for all of them (`Argument list too long`).
    let long = yaml::long_scalars(root, MAX_VALUE_BYTES);
    for (span, len) in &long {
        let (span, len) = (*span, *len);
        checker.at(
            &span,
            format!(
                "this value is {} KiB; a value in a stack file is at most {} KiB (a tool's command line or environment takes no more)",
                len.div_ceil(1024),
                MAX_VALUE_BYTES / 1024
            ),
            Some("put large content in a file beside the stack and name the file (`var_files`, `values`, a script `run` calls)".into()),
        );
    }
    // The sum is named only when no value alone was too long (that one is the thing to move).
    if let Some(steps) = root.as_mapping().and_then(|top| top.get_sequence("steps")).filter(|_| long.is_empty()) {
        for step in steps.iter() {
            let bytes = yaml::scalar_bytes(step);
            if bytes > MAX_STEP_BYTES {
                // At the step's first key (a mapping's own span starts after it).
                let at = step.as_mapping().and_then(|m| m.keys().next().map(|k| *k.span())).unwrap_or(*step.span());
                checker.at(
                    &at,
                    format!(
                        "this step's values add up to {} KiB; a step's values are at most {} KiB in all (the command line and environment of its tool)",
                        bytes.div_ceil(1024),
                        MAX_STEP_BYTES / 1024
                    ),
                    Some("move large values into files the step names".into()),
                );
            }
        }
    }
}

/// The stack's settings at the top level, besides its steps.
struct Top {
    name: String,
    on_failure: OnFailure,
    default_timeout: Option<Duration>,
    state: Option<String>,
}

/// Reads the top level's keys; an unknown key or a bad value is a located problem (and its
/// default is read in its place).
fn read_top(checker: &mut Checker<'_>, file: &Path, top: &yaml::MappingNode) -> Top {
    for key in top.keys() {
        if !TOP_KEYS.contains(&key.as_str()) {
            let hint = suggest(key.as_str(), TOP_KEYS).map(|s| format!("did you mean `{s}`?"));
            checker.at(key.span(), format!("unknown top-level key `{}`", key.as_str()), hint);
        }
    }
    // A top-level setting written as a list or mapping must not silently fall back to its
    // default (`on_failure: [revert]` would quietly mean `stop`).
    for key in ["name", "on_failure", "state", "timeout"] {
        if let Some(node) = top.get_node(key).filter(|n| n.as_scalar().is_none()) {
            checker.at(node.span(), format!("`{key}` must be a single value"), None);
        }
    }
    let name = match top.get_scalar("name") {
        Some(n) => {
            check_stack_name(checker, n.as_str(), Some(n.span()));
            n.as_str().to_string()
        }
        None => {
            let name = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "stack".into());
            check_stack_name(checker, &name, None);
            name
        }
    };
    let on_failure = match top.get_scalar("on_failure") {
        None => OnFailure::Stop,
        Some(v) => match v.as_str() {
            "stop" => OnFailure::Stop,
            "continue" => OnFailure::Continue,
            "revert" => OnFailure::Revert,
            other => {
                let hint = suggest(other, &["stop", "continue", "revert"]).map(|s| format!("did you mean `{s}`?"));
                checker.at(v.span(), format!("`on_failure` is `stop`, `continue` or `revert`, not `{other}`"), hint);
                OnFailure::Stop
            }
        },
    };
    let default_timeout = top.get_scalar("timeout").and_then(|t| {
        let spanned = Spanned::new(*t.span(), t.as_str().to_string());
        parse_duration_at(checker, "timeout", &spanned, TIMEOUT_BOUNDS)
    });
    let state = match top.get_scalar("state") {
        None => None,
        Some(v) if v.as_str().starts_with("postgres://") || v.as_str().starts_with("postgresql://") => {
            Some(v.as_str().to_string())
        }
        Some(v) => {
            checker.at(
                v.span(),
                "`state` is a `postgres://` URL",
                Some("leave `state` out to keep the checkpoint in the local state directory (`--state-dir`)".into()),
            );
            None
        }
    };
    Top { name, on_failure, default_timeout, state }
}

/// The steps read, with where their names, `needs`, phases and references are written, for
/// the checks between steps.
struct Read {
    steps: Vec<Step>,
    name_spans: Vec<(String, Span)>,
    /// Each name's first step, so that checking names and `needs` stays linear in the steps
    /// (a 100,000-step stack was quadratic here).
    first_by_name: HashMap<String, usize>,
    needs_spans: Vec<Vec<Spanned<String>>>,
    phase_spans: Vec<Option<Span>>,
    ref_spans: Vec<Vec<reference::Located>>,
}

/// Reads every step that can be read (each one's problems reported), and names used twice.
fn read_steps(
    checker: &mut Checker<'_>,
    dir: &Path,
    step_nodes: &yaml::SequenceNode,
    default_timeout: Option<Duration>,
) -> Read {
    let mut steps = Vec::new();
    let mut name_spans: Vec<(String, Span)> = Vec::new();
    // Each name's first step, so that checking names and `needs` stays linear in the steps
    // (a 100,000-step stack was quadratic here).
    let mut first_by_name: HashMap<String, usize> = HashMap::new();
    let mut needs_spans: Vec<Vec<Spanned<String>>> = Vec::new();
    let mut phase_spans: Vec<Option<Span>> = Vec::new();
    let mut ref_spans: Vec<Vec<reference::Located>> = Vec::new();
    for node in step_nodes.iter() {
        if let Some((mut step, name_span, needs, phase_span, located)) = parse_step(checker, dir, node) {
            step.timeout = step.timeout.or(default_timeout);
            if let Some(&first) = first_by_name.get(&step.name) {
                let first_line = name_spans[first].1.start().map(|m| m.line()).unwrap_or(0);
                checker.at(
                    &name_span,
                    format!("step name `{}` is used twice (first on line {first_line})", step.name),
                    Some("step names are checkpoint keys: give each step a unique name".into()),
                );
            }
            first_by_name.entry(step.name.clone()).or_insert(name_spans.len());
            name_spans.push((step.name.clone(), name_span));
            needs_spans.push(needs);
            phase_spans.push(phase_span);
            ref_spans.push(located);
            steps.push(step);
        }
    }
    Read { steps, name_spans, first_by_name, needs_spans, phase_spans, ref_spans }
}

/// The longest stack name: it names a directory (`.rdeploy/NAME/`, and `.rdeploy/.moving-NAME/`
/// while an old layout moves), well below the 255 bytes a file name may take.
pub const MAX_STACK_NAME: usize = 100;

/// A stack's name names its state directory, `.rdeploy/NAME/`, beside what the shared
/// `.rdeploy/` holds itself. `span` is the `name:` value; `None` when the name is the stack
/// file's (no `name:`), which only has to make a directory of its own.
fn check_stack_name(checker: &mut Checker<'_>, name: &str, span: Option<&Span>) {
    let shown = name.escape_debug();
    let problem = if let Some(what) = crate::store::layout::reserved(name) {
        Some(format!("stack name `{shown}` is reserved: `.rdeploy/{}` is {what}", name.to_ascii_lowercase()))
    } else if name.len() > MAX_STACK_NAME {
        Some(format!("the stack name is {} bytes; at most {MAX_STACK_NAME} (it names the state directory)", name.len()))
    } else if span.is_some()
        && (name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    {
        Some(format!("stack name `{shown}` may only use letters, digits, `-` and `_`"))
    } else if span.is_none() && (name.is_empty() || name == "." || name == ".." || name.chars().any(char::is_control)) {
        Some(format!("`{shown}` cannot name a directory"))
    } else {
        None
    };
    let Some(problem) = problem else { return };
    match span {
        Some(span) => checker.at(
            span,
            problem,
            Some("the name keys the state directory (`.rdeploy/NAME/`), the checkpoint and its history: pick another, such as `shop`".into()),
        ),
        None => checker.at_location(
            None,
            format!("this stack has no `name:`, so the file's name stands for it: {problem}"),
            Some("add `name:` with letters, digits, `-` and `_`, such as `name: shop`".into()),
        ),
    }
}

pub use rdeploy_adapters::suggest;

fn quoted(keys: &[&str]) -> String {
    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
}

fn tool_list() -> String {
    quoted(&Tool::ALL.map(|t| t.as_str()))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<Problem> {
        parse(Path::new("stack.yaml"), text).unwrap_err().problems
    }

    /// A retry's growing delay saturates instead of panicking (`Duration::mul_f64` panics on a
    /// product it cannot hold).
    #[test]
    fn a_retry_delay_saturates_rather_than_panics() {
        let retry = Retry {
            attempts: 100,
            delay: Duration::MAX,
            backoff: 10.0,
            max_delay: None,
            matching: Vec::new(),
            transient: true,
        };
        assert_eq!(retry.delay_before(100), Duration::MAX);
        let bounded = Retry { delay: RETRY_DELAY_BOUNDS.max, max_delay: Some(Duration::from_secs(60)), ..retry };
        assert_eq!(bounded.delay_before(100), Duration::from_secs(60));
    }

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

    const FLEET: &str = "name: s\nsteps:\n  - name: agent\n    tool: helm\n    release: agent\n    chart: repo/agent\n    contexts: [\"edge-*\", core-1]\n    slo: \"95%@48h\"\n    rollout: { waves: [1, \"10%\", \"100%\"], parallel: 20, bake: 10m, max_failures: \"5%\", absent: wait }\n";

    #[test]
    fn a_fleet_step_reads_its_scope_and_rollout() {
        let stack = parse(Path::new("stack.yaml"), FLEET).unwrap();
        let fleet = stack.step("agent").unwrap().fleet.clone().expect("a fleet step");
        assert_eq!(fleet.contexts, ["edge-*", "core-1"]);
        assert_eq!(fleet.slo.as_deref(), Some("95%@48h"));
        let r = fleet.rollout;
        assert_eq!(r.waves, [WaveSize::Count(1), WaveSize::Percent(10.0), WaveSize::Percent(100.0)]);
        assert_eq!((r.parallel, r.bake, r.absent), (20, Duration::from_secs(600), AbsentPolicy::Wait));
        assert_eq!(r.max_failures, MaxFailures::Percent(5.0));
        // Without `rollout:`: one wave of every cluster, one at a time, nothing tolerated.
        let plain = FLEET.replace("    rollout: { waves: [1, \"10%\", \"100%\"], parallel: 20, bake: 10m, max_failures: \"5%\", absent: wait }\n", "");
        let stack = parse(Path::new("stack.yaml"), &plain).unwrap();
        assert_eq!(stack.step("agent").unwrap().fleet.as_ref().unwrap().rollout, Rollout::default());
    }

    #[test]
    fn fleet_keys_are_checked_where_they_are_written() {
        let p = problems(&FLEET.replace("absent: wait", "absent: wiat").replace("bake: 10m", "bake: soon"));
        let messages: Vec<&str> = p.iter().map(|p| p.message.as_str()).collect();
        assert!(messages.iter().any(|m| m.contains("`rollout.bake: soon` is not a duration")), "{messages:?}");
        let absent = p.iter().find(|p| p.message.contains("`rollout.absent`")).expect("absent is checked");
        assert_eq!(absent.hint.as_deref(), Some("did you mean `wait`?"));
        let p = problems(&FLEET.replace("waves: [1,", "waves: [first,"));
        assert!(p[0].message.contains("`first` is neither a cluster count nor a percentage"), "{p:?}");
        let p = problems(&FLEET.replace("    contexts:", "    context: c1\n    contexts:"));
        assert!(p[0].message.contains("both `context` and `contexts`"), "{p:?}");
        let p = problems(&FLEET.replace("    contexts: [\"edge-*\", core-1]\n", "    selector: tier=edge\n"));
        assert!(p.iter().any(|p| p.message.contains("`selector` belongs to a fleet step")), "{p:?}");
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo\n    contexts: [edge-1]\n");
        assert_eq!(p[0].hint.as_deref(), Some("`contexts` is a key of fleet steps, which are helm or kubectl steps"));
    }

    #[test]
    fn a_typo_inside_a_gate_is_matched_against_the_gate_keys() {
        let p = problems(
            "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo\n    gate:\n      inventory:\n        contexts: [c]\n        namespce: x\n        selector: app=a\n        image: r/a\n        version: \"2\"\n",
        );
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (9, 9));
        assert!(p[0].message.contains("unknown field `namespce`"), "{}", p[0].message);
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `namespace`?"));
    }

    #[test]
    fn unknown_step_key_is_located_with_a_suggestion() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    rnu: echo\n");
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].line, p[0].column), (5, 5));
        assert_eq!(p[0].message, "unknown key `rnu` in a shell step");
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `run`?"));
    }

    #[test]
    fn a_key_of_another_tool_is_named_as_such() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n    playbook: site.yml\n");
        assert!(p[0].hint.as_deref().unwrap().starts_with("`playbook` is a key of ansible steps"));
    }

    #[test]
    fn unknown_tool_and_top_key() {
        let p = problems("name: s\nstpes: []\nsteps:\n  - name: a\n    tool: terraform2\n");
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].line, p[0].column), (2, 1));
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `steps`?"));
        assert_eq!(p[1].line, 5);
        assert_eq!(p[1].hint.as_deref(), Some("did you mean `terraform`?"));
    }

    #[test]
    fn duplicate_names_bad_needs_and_cycles() {
        let p = problems(
            "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n  - name: a\n    tool: shell\n    run: y\n",
        );
        assert_eq!(p[0].line, 6);
        assert!(p[0].message.contains("used twice (first on line 3)"));

        let p = problems("name: s\nsteps:\n  - name: net\n    tool: shell\n    run: x\n  - name: b\n    tool: shell\n    needs: [nett]\n    run: y\n");
        assert_eq!((p[0].line, p[0].column), (8, 13));
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `net`?"));

        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    needs: [b]\n    run: x\n  - name: b\n    tool: shell\n    needs: [a]\n    run: y\n");
        assert_eq!(p.len(), 1);
        assert!(p[0].message.contains("cycle"), "{}", p[0].message);
        assert!(p[0].message.contains("a -> b -> a") || p[0].message.contains("b -> a -> b"));
    }

    #[test]
    fn resolving_references_keeps_the_marked_secrets() {
        let text = "name: s\nsteps:\n  - name: app\n    tool: helm\n    release: web\n    chart: repo/web\n    set:\n      replicas: ${{ steps.db.outputs.n }}\n      password: { from_env: DB_PW }\n      token: { value: tok-1, secret: true }\n    env: { URL: \"${{ steps.db.outputs.n }}\", KEY: { from_env: API_KEY } }\n  - name: db\n    tool: shell\n    sub_changes:\n      - { name: a, run: x }\n";
        let stack = parse(Path::new("stack.yaml"), text).unwrap();
        let app = stack.step("app").unwrap();
        let resolved = app.resolve(&|_| Some("3".to_string())).unwrap();
        let ToolSpec::Helm(helm) = &resolved.spec else { panic!("helm") };
        // The marked entries stay marked (read when the step runs), never values as written.
        assert_eq!(serde_json::to_value(&helm.set).unwrap(), serde_json::json!({ "replicas": 3, "token": "tok-1" }));
        assert_eq!(resolved.spec.marked().keys().collect::<Vec<_>>(), ["password", "token"]);
        assert_eq!(resolved.spec.marked(), app.spec.marked());
        assert_eq!(resolved.env_marked.keys().collect::<Vec<_>>(), ["KEY"]);
        assert_eq!(resolved.env["URL"], "3");
    }

    #[test]
    fn a_reference_is_an_implicit_need_and_resolves_with_the_yaml_type() {
        let text = "name: s\nsteps:\n  - name: app\n    tool: helm\n    release: web\n    chart: repo/web\n    set:\n      replicas: ${{ steps.db.outputs.n }}\n      host: \"${{ steps.db.outputs.host }}:5432\"\n    env: { URL: \"${{ steps.db.outputs.host }}\" }\n  - name: db\n    tool: shell\n    sub_changes:\n      - { name: a, run: x }\n";
        let stack = parse(Path::new("stack.yaml"), text).unwrap();
        let order: Vec<&str> = stack.ordered().map(|s| s.name.as_str()).collect();
        assert_eq!(order, ["db", "app"], "the reference orders `db` first");
        let app = stack.step("app").unwrap();
        assert_eq!(app.needs, ["db"]);
        assert_eq!(app.refs.len(), 2);
        let value = |r: &Reference| match r.key.as_str() {
            "n" => Some("3".to_string()),
            "host" => Some("db.internal".to_string()),
            _ => None,
        };
        let resolved = app.resolve(&value).unwrap();
        let ToolSpec::Helm(helm) = &resolved.spec else { panic!("helm") };
        assert_eq!(
            serde_json::to_value(&helm.set).unwrap(),
            serde_json::json!({ "replicas": 3, "host": "db.internal:5432" })
        );
        assert_eq!(resolved.env["URL"], "db.internal");
        let Err(ResolveError::Missing(missing)) = app.resolve(&|_| None) else { panic!("missing") };
        assert_eq!(missing.step, "db");
    }

    #[test]
    fn wrong_value_types_are_located() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    resumable: maybe\n    run: x\n");
        assert_eq!(p[0].line, 5);
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    timeout: soon\n    run: x\n");
        assert_eq!((p[0].line, p[0].column), (5, 14));
    }

    #[test]
    fn a_helm_recover_mode_is_one_of_its_modes() {
        let text = "name: s\nsteps:\n  - name: app\n    tool: helm\n    release: web\n    chart: repo/web\n    recover: retry\n";
        let problems = problems(text);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].line, 7);
        assert!(
            problems[0].message.contains("unknown variant `retry`, expected `upgrade` or `rollback`"),
            "{problems:?}"
        );
        assert!(problems[0].message.contains("`recover`"), "names the key: {problems:?}");
        let ok = parse(Path::new("stack.yaml"), &text.replace("retry", "rollback")).unwrap();
        let ToolSpec::Helm(helm) = &ok.steps[0].spec else { panic!("helm") };
        assert_eq!(helm.recover, Some(rdeploy_adapters::helm::RecoverMode::Rollback));
    }

    #[test]
    fn values_for_the_tool_keep_their_yaml_type() {
        let text = r#"
name: s
steps:
  - name: chart
    tool: helm
    release: web
    chart: repo/web
    set: { service.enabled: false, replicaCount: 2, ratio: 0.5, tag: "1.10", quoted: "false", none: ~, empty: ,
           list: [1, "2", true], map: { a: null, b: 'x' }, word: yes, big: 18446744073709551615, neg: -3 }
  - name: play
    tool: ansible
    playbook: site.yml
    inventory: hosts.ini
    extra_vars: { flag: false, name: "false", n: 07 }
"#;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("site.yml"), "").unwrap();
        std::fs::write(dir.path().join("hosts.ini"), "").unwrap();
        let stack = parse(&dir.path().join("stack.yaml"), text).unwrap();
        let ToolSpec::Helm(helm) = &stack.steps[0].spec else { panic!("helm") };
        let set = serde_json::to_value(&helm.set).unwrap();
        assert_eq!(
            set,
            serde_json::json!({
                "service.enabled": false, "replicaCount": 2, "ratio": 0.5, "tag": "1.10", "quoted": "false",
                "none": null, "empty": null, "list": [1, "2", true], "map": { "a": null, "b": "x" },
                "word": "yes", "big": 18446744073709551615u64, "neg": -3
            })
        );
        let ToolSpec::Ansible(play) = &stack.steps[1].spec else { panic!("ansible") };
        assert_eq!(
            serde_json::to_value(&play.extra_vars).unwrap(),
            serde_json::json!({ "flag": false, "name": "false", "n": 7 })
        );
    }

    #[test]
    fn invalid_yaml_is_located() {
        let p = problems("name: s\nsteps:\n  - name: a\n   tool: shell\n");
        assert_eq!(p.len(), 1);
        assert!(p[0].message.starts_with("invalid YAML"), "{}", p[0].message);
    }

    #[test]
    fn missing_dir_and_exclusive_keys() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    dir: nowhere\n    run: x\n  - name: b\n    tool: shell\n");
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].line, p[0].column), (5, 10));
        assert!(p[0].message.contains("`nowhere` does not exist"));
        assert_eq!(p[1].line, 7);
        assert!(p[1].message.contains("needs `run` or `sub_changes`"));
    }

    #[test]
    fn contract_steps_need_a_gate_and_come_after_expand() {
        let p = problems("name: s\nsteps:\n  - name: drop\n    tool: shell\n    phase: contract\n    run: x\n  - name: add\n    tool: shell\n    phase: expand\n    run: y\n");
        assert_eq!(p.len(), 2);
        assert!(p[0].message.contains("has no `gate`"));
        assert!(p[1].message.contains("runs before expand step `add`"));
    }

    #[test]
    fn step_digests_change_with_settings_only() {
        let a = parse(Path::new("s.yaml"), "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n").unwrap();
        let b = parse(Path::new("s.yaml"), "# comment\nname: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n")
            .unwrap();
        let c = parse(Path::new("s.yaml"), "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: y\n").unwrap();
        assert_eq!(a.steps[0].digest, b.steps[0].digest);
        assert_ne!(a.steps[0].digest, c.steps[0].digest);
    }

    const GATED: &str = "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo\n    gate:\n      inventory:\n        contexts: [c]\n        image: r/a\n        version: \"2\"\n";

    #[test]
    fn gate_values_are_parsed_at_load() {
        let stack = parse(Path::new("stack.yaml"), &format!("{GATED}        kinds: [Deployment, daemonsets]\n        timeout: 2s\n        exceptions:\n          - {{ cluster: edge-3, reason: works, expires: 2026-06-10 }}\n")).unwrap();
        let inv = &stack.steps[0].gate.as_ref().unwrap().inventory;
        assert_eq!(inv.kinds, [Kind::Deployment, Kind::DaemonSet]);
        assert_eq!(inv.timeout, Some(Duration::from_secs(2)));
        assert_eq!(inv.exceptions[0].expires, time::macros::date!(2026 - 06 - 10));

        let p = problems(&format!("{GATED}        kinds: [Deploymnt]\n"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (11, 17));
        assert_eq!(p[0].message, "unknown workload kind `Deploymnt` in `gate.inventory.kinds`");
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `Deployment`?"));

        let p = problems(&format!("{GATED}        timeout: soon\n"));
        assert_eq!((p[0].line, p[0].column), (11, 18));
        assert!(p[0].message.starts_with("`gate.inventory.timeout: soon` is not a duration"), "{}", p[0].message);

        let p = problems(&format!(
            "{GATED}        exceptions:\n          - cluster: edge-9\n            reason: x\n            expires: not-a-date\n"
        ));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (14, 22));
        assert_eq!(p[0].message, "the exception for `edge-9`: `expires: not-a-date` is not a date");
    }

    #[test]
    fn a_misspelt_common_key_is_named_with_a_suggestion() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tol: shell\n    run: x\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (4, 5));
        assert_eq!(p[0].message, "unknown key `tol`");
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `tool`?"));
        // With no key close to a common one, the missing `tool` is what is reported.
        let p = problems("name: s\nsteps:\n  - name: a\n    run: x\n");
        assert_eq!(p[0].message, "this step has no `tool`");
    }

    #[test]
    fn secret_references_are_marked_and_other_mappings_stay_data() {
        use rdeploy_adapters::secrets::SecretSource;
        let stack = parse(
            Path::new("stack.yaml"),
            r#"
name: s
steps:
  - name: app
    tool: helm
    release: web
    chart: repo/web
    env: { API_LOGIN: { from_env: CI_LOGIN }, PLAIN: { value: 3, secret: false }, REGION: eu }
    set:
      db.password: { from_env: DB_PASSWORD }
      tls.key: { from_file: secrets/tls.key }
      pin: { value: 1234, secret: true }
      tier: { value: gold, secret: false }
      labels: { team: web, value: x }
      tls: { secret: my-tls-secret }
      replicas: 2
"#,
        )
        .unwrap();
        let step = &stack.steps[0];
        let ToolSpec::Helm(helm) = &step.spec else { panic!() };
        let sources: Vec<(&str, &SecretSource)> = helm.marked.iter().map(|(k, m)| (k.as_str(), &m.source)).collect();
        assert_eq!(
            sources,
            vec![
                ("db.password", &SecretSource::Env("DB_PASSWORD".into())),
                ("pin", &SecretSource::Inline),
                ("tls.key", &SecretSource::File("secrets/tls.key".into())),
            ]
        );
        // An inline secret keeps its YAML type and is in `set` at once; read ones come at run time.
        assert_eq!(helm.set.get("pin"), Some(&serde_json::json!(1234)));
        assert!(!helm.set.contains_key("db.password") && !helm.set.contains_key("tls.key"));
        // `secret: false` is a plain value; other mappings (even with a `value` or a `secret`
        // key holding no boolean) are data.
        assert_eq!(helm.set.get("tier"), Some(&serde_json::json!("gold")));
        assert_eq!(helm.set.get("labels"), Some(&serde_json::json!({"team": "web", "value": "x"})));
        assert_eq!(helm.set.get("tls"), Some(&serde_json::json!({"secret": "my-tls-secret"})));
        assert_eq!(helm.set.get("replicas"), Some(&serde_json::json!(2)));
        assert_eq!(step.env_marked.get("API_LOGIN").map(|m| &m.source), Some(&SecretSource::Env("CI_LOGIN".into())));
        assert_eq!(step.env.get("PLAIN").map(String::as_str), Some("3"));
        assert_eq!(step.env.get("REGION").map(String::as_str), Some("eu"));
        assert!(!step.env.contains_key("API_LOGIN"));
    }

    #[test]
    fn misused_secret_references_are_located_with_a_suggestion() {
        let step = |key: &str, value: &str| {
            let text = format!(
                "name: s\nsteps:\n  - name: a\n    tool: ansible\n    playbook: p.yml\n    inventory: i.ini\n    {key}:\n      v: {value}\n"
            );
            let p = problems(&text);
            // `p.yml` and `i.ini` do not exist: only the value's own problem is looked at.
            p.into_iter().find(|p| p.line == 8).unwrap_or_else(|| panic!("no problem on line 8 for {value}"))
        };
        let p = step("extra_vars", "{ from_evn: DB_PASSWORD }");
        assert_eq!((p.line, p.column), (8, 12));
        assert_eq!(p.message, "`extra_vars.v`: unknown key `from_evn` in a secret reference");
        assert_eq!(p.hint.as_deref(), Some("did you mean `from_env`?"));
        let p = step("extra_vars", "{ from_fille: x }");
        assert_eq!(p.hint.as_deref(), Some("did you mean `from_file`?"));
        let p = step("extra_vars", "{ value: x, secert: true }");
        assert_eq!((p.line, p.column), (8, 22));
        assert_eq!(p.message, "`extra_vars.v`: unknown key `secert` in a secret value");
        assert_eq!(p.hint.as_deref(), Some("did you mean `secret`?"));
        let p = step("extra_vars", "{ from_env: X, secret: true }");
        assert!(p.message.contains("`from_env` stands alone in its mapping"), "{}", p.message);
        let p = step("extra_vars", "{ from_env: }");
        assert!(p.message.contains("`from_env` names an environment variable"), "{}", p.message);
        let p = step("extra_vars", "{ value: x, secret: maybe }");
        assert_eq!(p.message, "`extra_vars.v`: `secret` is `true` or `false`");
        let p = step("extra_vars", "{ secret: true }");
        assert!(p.message.contains("`secret: true` marks a `value:` beside it"), "{}", p.message);
        let p = step("extra_vars", "{ value: x, secret: true, note: y }");
        assert!(p.message.contains("`secret: true` marks a `value:` beside it"), "{}", p.message);
        let p = step("extra_vars", "{ db: { password: { from_env: X } } }");
        assert_eq!(
            p.message,
            "`extra_vars.v`: a secret reference must be a whole entry of `extra_vars`, not inside a value"
        );
        let p = step("env", "{ a: b }");
        assert_eq!(p.message, "`env.v` must be a string or a secret reference");
        let p = step("env", "{ from_env: }");
        assert!(p.message.contains("`env.v`: `from_env` names an environment variable"), "{}", p.message);
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

    /// Problems come in the order of the file, whichever check found them.
    #[test]
    fn problems_are_sorted_by_line() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    needs: [zz]\n    run: x\n  - name: b\n    tool: shell\n    run: ${{ steps.yy.outputs.k }}\n    timeout: soon\n");
        let lines: Vec<usize> = p.iter().map(|p| p.line).collect();
        assert_eq!(lines, [5, 9, 10], "{p:?}");
    }

    /// A step with a bad value still counts as a step: `needs: [base]` is not reported, the
    /// misspelt `needs: [bsae]` gets a did-you-mean, and `wait` says which values it takes.
    #[test]
    fn a_step_with_a_bad_value_still_counts_as_a_step() {
        let p = problems("name: s\nsteps:\n  - name: base\n    tool: helm\n    release: base\n    chart: repo/web\n    wait: yes please\n  - name: web\n    tool: shell\n    needs: [base, bsae]\n    run: ${{ steps.bas.outputs.host }}\n");
        assert_eq!(p.len(), 3, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (7, 11));
        assert_eq!(p[0].message, "step `base`: `wait`: value was not a boolean");
        assert_eq!(
            p[0].hint.as_deref(),
            Some("write `true` or `false` (`yes`, `no`, `on` and `off` are strings in YAML 1.2)")
        );
        assert_eq!(p[1].message, "step `web` needs `bsae`, which is not a step of this stack");
        assert_eq!(p[1].hint.as_deref(), Some("did you mean `base`?"));
        assert!(p[2].message.contains("`bas` is not a step of this stack"), "{}", p[2].message);
        assert_eq!(p[2].hint.as_deref(), Some("did you mean `base`?"));
    }

    /// Every key whose value does not fit is reported, not the first only, and a required key
    /// that does not fit is not reported missing too.
    #[test]
    fn every_bad_value_of_a_step_is_reported() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: helm\n    release: [x]\n    chart: repo/web\n    wait: maybe\n    atomic: 3\n    resumable: often\n");
        let found: Vec<(usize, &str)> = p.iter().map(|p| (p.line, p.message.as_str())).collect();
        assert_eq!(found.len(), 4, "{p:?}");
        assert_eq!(found.iter().map(|f| f.0).collect::<Vec<_>>(), [5, 7, 8, 9], "{p:?}");
        assert!(!p.iter().any(|p| p.message.contains("missing field")), "{p:?}");
    }

    /// A misspelt key is read as the key it was meant to be: its absence is not a second problem.
    #[test]
    fn a_misspelt_key_is_not_also_reported_missing() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: helm\n    relase: web\n    chart: repo/web\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].message, "unknown key `relase` in a helm step");
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `release`?"));
        // Nor is its value, which may not fit the key guessed.
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n    retri: 3\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `retry`?"));
    }

    /// A helm chart path with a typo, beside the chart directory it meant, is caught when the
    /// stack loads (helm would say `repo charts not found` at `up`); the right path, an explicit
    /// path and a repository chart with no such directory pass.
    #[test]
    fn a_local_chart_path_that_does_not_exist_is_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("deploy-charts/web")).unwrap();
        std::fs::write(dir.path().join("deploy-charts/web/Chart.yaml"), "apiVersion: v2\nname: web\nversion: 0.1.0\n")
            .unwrap();
        let file = dir.path().join("stack.yaml");
        let stack =
            |chart: &str| format!("name: s\nsteps:\n  - name: a\n    tool: helm\n    release: a\n    chart: {chart}\n");
        for fine in ["deploy-charts/web", "./deploy-charts/web", "repo/web", "oci://r.example/web"] {
            assert!(parse(&file, &stack(fine)).is_ok(), "{fine}");
        }
        let p = parse(&file, &stack("deploy-charts/webb")).unwrap_err().problems;
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].line, p[0].column), (6, 12));
        assert!(
            p[0].message.starts_with("step `a`: chart `deploy-charts/webb` is no directory beside the stack file"),
            "{}",
            p[0].message
        );
        assert_eq!(p[0].hint.as_deref(), Some("did you mean `deploy-charts/web`?"));
        let p = parse(&file, &stack("./deploy-charts/webb")).unwrap_err().problems;
        assert!(p[0].message.contains("`./deploy-charts/webb` does not exist"), "{p:?}");
        let p = parse(&file, &stack("webchart")).unwrap_err().problems;
        assert!(p[0].message.contains("chart `webchart` is no directory"), "{p:?}");
    }

    /// A stack's name names its directory in the shared `.rdeploy/`: what that directory holds
    /// itself (`fleet/`, `lock`, the old layout's files) and what cannot be a directory name are
    /// refused at the name, and without `name:`, at the top for the file's name.
    #[test]
    fn a_stack_name_that_would_collide_in_the_state_layout_is_refused() {
        let steps = "steps:\n  - name: a\n    tool: shell\n    run: x\n";
        for name in ["fleet", "lock", "Fleet", "history", "logs"] {
            let p = problems(&format!("name: {name}\n{steps}"));
            assert_eq!(p.len(), 1, "{name}: {p:?}");
            assert_eq!((p[0].line, p[0].column), (1, 7), "{name}");
            assert!(
                p[0].message.starts_with(&format!("stack name `{name}` is reserved: `.rdeploy/")),
                "{}",
                p[0].message
            );
            assert!(p[0].hint.as_deref().unwrap().contains("pick another"), "{p:?}");
        }
        for name in ["\"a/b\"", "\"..\"", "\"\"", "\"a\\tb\""] {
            let p = problems(&format!("name: {name}\n{steps}"));
            assert_eq!(p.len(), 1, "{name}: {p:?}");
            assert!(p[0].message.contains("may only use letters, digits"), "{}", p[0].message);
        }
        let p = problems(&format!("name: {}\n{steps}", "a".repeat(MAX_STACK_NAME + 1)));
        assert!(p[0].message.contains("at most 100"), "{p:?}");
        assert!(parse(Path::new("fleet-app.yaml"), &format!("name: fleet-app\n{steps}")).is_ok());

        // Without `name:`, the file's name is checked as a directory name.
        let p = parse(Path::new("deploy/fleet.yaml"), steps).unwrap_err().problems;
        assert_eq!((p[0].line, p[0].column), (1, 1));
        assert!(
            p[0].message.starts_with(
                "this stack has no `name:`, so the file's name stands for it: stack name `fleet` is reserved"
            ),
            "{p:?}"
        );
        assert_eq!(parse(Path::new("deploy/my.stack.yaml"), steps).unwrap().name, "my.stack");
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
        let err = load(&file).unwrap_err().downcast::<StackError>().unwrap();
        assert_eq!((err.problems[0].line, err.problems[0].column), (3, 12));
        assert!(err.problems[0].message.contains("not valid UTF-8"), "{}", err.problems[0].message);
    }

    fn chain(n: usize, cycle: bool) -> String {
        let mut text = String::from("name: s\nsteps:\n");
        for i in 0..n {
            let need = if i > 0 {
                format!("s{}", i - 1)
            } else if cycle {
                format!("s{}", n - 1)
            } else {
                String::new()
            };
            text += &format!("  - name: s{i}\n    tool: shell\n    run: x\n    revert: y\n    needs: [{need}]\n");
        }
        text
    }

    #[test]
    fn a_long_chain_is_ordered_and_a_long_cycle_named() {
        // The name, `needs` and cycle checks look names up in maps, not in lists (linear, not
        // quadratic, in the steps): 20,000 steps in a chain, then 5,000 closed into a cycle.
        let stack = parse(Path::new("s.yaml"), &chain(20_000, false)).unwrap();
        assert_eq!(stack.order, (0..20_000).collect::<Vec<_>>());
        let p = problems(&chain(5_000, true));
        assert_eq!(p.len(), 1, "{:?}", &p[..p.len().min(3)]);
        assert!(
            p[0].message.starts_with("the steps' `needs` form a cycle: s0 -> s1 -> s2 ->"),
            "{}",
            &p[0].message[..80]
        );
        assert!(p[0].message.ends_with("s4998 -> s4999 -> s0"));
    }
}

//! The stack file: parsing `stack.yaml` into a validated plan, with every error located at
//! file:line:column and a suggestion. The YAML itself is read by `rdeploy_adapters::yaml`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdeploy_adapters::secrets::Marked;
use rdeploy_adapters::yaml::{self, Location, Node, ScalarNode, Span, Spanned};

use crate::fleet::model::Kind;
use crate::redact::Redactor;
use crate::reference::{self, Located, Reference};
use rdeploy_adapters::{Adapter, FieldPath, PathSegment, Tool, ToolSpec};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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

/// Reads and validates a stack file, and hands the run's `redactor` the secrets it found.
/// Errors name file, line and column.
pub fn load(file: &Path, redactor: &Redactor) -> anyhow::Result<Stack> {
    let text = yaml::decode_utf8(fs_err::read(file)?).map_err(|e| {
        let mut checker = Checker { file, problems: Vec::new() };
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

#[derive(Clone, Debug)]
pub struct Step {
    pub name: String,
    pub tool: Tool,
    pub needs: Vec<String>,
    pub resumable: bool,
    pub revert: Option<String>,
    pub gate: Option<Gate>,
    /// The step's `timeout`, else the stack's top-level one.
    pub timeout: Option<Duration>,
    /// `retry:`; `None` retries nothing.
    pub retry: Option<Retry>,
    pub env: BTreeMap<String, String>,
    /// `env` entries the stack marks secret (`{ from_env: NAME }`, ...), read when the step runs
    /// into the tool's environment; not in `env` until then.
    pub env_marked: BTreeMap<String, Marked>,
    pub phase: Option<Phase>,
    /// `always: true`: `up` runs the tool even for what its preview finds in place.
    pub always: bool,
    /// `contexts:` / `fleet:` on a helm or kubectl step: it runs once per cluster, in waves.
    pub fleet: Option<FleetStep>,
    pub spec: ToolSpec,
    /// Line of the step in the stack file, for messages.
    pub line: usize,
    /// Digest of the step's settings, to say which steps changed since a checkpoint.
    pub digest: String,
    /// The `${{ steps.NAME.outputs.KEY }}` it consumes, each once, in the order written.
    pub refs: Vec<Reference>,
    /// Its tool keys as written, from which `spec` is built again once references resolve.
    own: Node,
}

impl Step {
    /// The step with every reference replaced by its value: the settings its tool will get.
    /// The first reference without a value is the error, as is a value its key cannot take
    /// (`wait: ${{ ... }}` that is not a boolean).
    pub fn resolve(&self, value: &dyn Fn(&Reference) -> Option<String>) -> Result<Step, ResolveError> {
        self.resolve_with(value, true)
    }

    /// [`Step::resolve`] for a reader (the runbook): every value written into the text where
    /// its reference stands, shell lines too. Never for a command that runs.
    pub fn resolve_for_reading(&self, value: &dyn Fn(&Reference) -> Option<String>) -> Result<Step, ResolveError> {
        self.resolve_with(value, false)
    }

    fn resolve_with(&self, value: &dyn Fn(&Reference) -> Option<String>, to_run: bool) -> Result<Step, ResolveError> {
        if self.refs.is_empty() {
            return Ok(self.clone());
        }
        // A shell line (a shell step's `run` and `check`, any step's `revert`) gets each value
        // through its environment, never in its text: a recorded output is data, and the shell
        // must not parse it (`7$(touch PWNED)` in a checkpoint must not run anything).
        let has_value = |r: &Reference| value(r).is_some();
        let var = |r: &Reference| shell_var(&self.refs, r);
        let shell = |text: &str| {
            if to_run {
                reference::substitute_shell(text, &has_value, &var).map_err(ResolveError::Missing)
            } else {
                reference::substitute(text, value).map_err(ResolveError::Missing)
            }
        };
        let own = match (self.tool, &self.own) {
            (Tool::Shell, Node::Mapping(map)) if to_run => {
                let mut map = map.clone();
                for (key, item) in map.iter_mut() {
                    *item = match (key.as_str(), &*item) {
                        ("run" | "check", Node::Scalar(line)) => shell_scalar(line, &shell)?,
                        ("sub_changes", Node::Sequence(subs)) => {
                            let mut subs = subs.clone();
                            for sub in subs.iter_mut() {
                                if let Node::Mapping(sub_map) = sub {
                                    let mut sub_map = sub_map.clone();
                                    for (k, v) in sub_map.iter_mut() {
                                        *v = match (k.as_str(), &*v) {
                                            ("run" | "check", Node::Scalar(line)) => shell_scalar(line, &shell)?,
                                            _ => reference::substitute_node(v, value).map_err(ResolveError::Missing)?,
                                        };
                                    }
                                    *sub = Node::Mapping(sub_map);
                                } else {
                                    *sub = reference::substitute_node(sub, value).map_err(ResolveError::Missing)?;
                                }
                            }
                            Node::Sequence(subs)
                        }
                        _ => reference::substitute_node(item, value).map_err(ResolveError::Missing)?,
                    };
                }
                Node::Mapping(map)
            }
            (_, own) => reference::substitute_node(own, value).map_err(ResolveError::Missing)?,
        };
        let spec = build_spec(self.tool, &own).map_err(|e| {
            let at = e.path.as_deref().map(|p| format!(" (at `{p}`)")).unwrap_or_default();
            ResolveError::Invalid(format!("{}{at}", e.message))
        })?;
        let mut env = BTreeMap::new();
        for (k, v) in &self.env {
            env.insert(k.clone(), reference::substitute(v, value).map_err(ResolveError::Missing)?);
        }
        let revert = match &self.revert {
            Some(r) => Some(shell(r)?),
            None => None,
        };
        if to_run && (self.tool == Tool::Shell || self.revert.is_some()) {
            for r in &self.refs {
                if let Some(v) = value(r) {
                    env.insert(shell_var(&self.refs, r), v);
                }
            }
        }
        let mut spec = spec;
        keep_marked(&self.spec, &mut spec);
        Ok(Step { spec, env, revert, own, ..self.clone() })
    }
}

/// The environment variable that carries `r`'s value to the step's shell lines:
/// `RDEPLOY_REF_<n>_<step>_<key>` (`n` its place among the step's references, so names that
/// differ only by `-` and `_` stay apart).
fn shell_var(refs: &[Reference], r: &Reference) -> String {
    let n = refs.iter().position(|x| x == r).unwrap_or(refs.len());
    let clean = |s: &str| s.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    format!("RDEPLOY_REF_{n}_{}_{}", clean(&r.step), clean(&r.key))
}

/// A shell line's scalar with its references made expansions of their variables.
fn shell_scalar(line: &ScalarNode, shell: &dyn Fn(&str) -> Result<String, ResolveError>) -> Result<Node, ResolveError> {
    if !line.as_str().contains("${{") {
        return Ok(Node::Scalar(line.clone()));
    }
    let mut new = ScalarNode::new(*line.span(), shell(line.as_str())?);
    new.set_coerce(line.may_coerce());
    Ok(Node::Scalar(new))
}

/// The marked entries (`{ from_env: NAME }`, ...) of `from` carried over to `spec`, built again
/// from the tool keys as written: `build_spec` reads such an entry as a plain mapping, so it is
/// taken out again and, once its secret is read, holds the secret as at load.
fn keep_marked(from: &ToolSpec, spec: &mut ToolSpec) {
    let marked = from.marked().clone();
    if marked.is_empty() {
        return;
    }
    if let Some((_, values)) = spec.typed_values_mut() {
        for (k, m) in &marked {
            match &m.value {
                Some(secret) => values.insert(k.clone(), secret.expose().clone()),
                None => values.remove(k),
            };
        }
    }
    if let Some(m) = spec.marked_mut() {
        *m = marked;
    }
}

/// Why a step's references could not be resolved.
#[derive(Debug)]
pub enum ResolveError {
    /// A reference without a value.
    Missing(Reference),
    /// The values made settings the tool's keys do not accept.
    Invalid(String),
}

/// A tool's spec from its keys: serde reads the coercible copy, and the values handed to the
/// tool keep their YAML type.
fn build_spec(tool: Tool, own_node: &Node) -> Result<ToolSpec, yaml::DecodeError> {
    let own_coercible = yaml::coercible(own_node.clone());
    let mut spec = match tool {
        Tool::Terraform => yaml::from_node(&own_coercible).map(ToolSpec::Terraform),
        Tool::Ansible => yaml::from_node(&own_coercible).map(ToolSpec::Ansible),
        Tool::Helm => yaml::from_node(&own_coercible).map(ToolSpec::Helm),
        Tool::Kubectl => yaml::from_node(&own_coercible).map(ToolSpec::Kubectl),
        Tool::Shell => yaml::from_node(&own_coercible).map(ToolSpec::Shell),
    }?;
    // serde sees every YAML scalar as a string; values handed to the tool keep their YAML type.
    if let Some((key, values)) = spec.typed_values_mut() {
        if let Some(node) = own_node.as_mapping().and_then(|m| m.get_mapping(key)) {
            for (k, v) in node.iter() {
                values.insert(k.as_str().to_string(), yaml::typed_json(v));
            }
        }
    }
    Ok(spec)
}

/// The common keys of a step, deserialized with their positions.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommonKeys {
    name: Spanned<String>,
    #[allow(dead_code)]
    tool: Spanned<String>,
    #[serde(default)]
    needs: Vec<Spanned<String>>,
    resumable: Option<bool>,
    revert: Option<String>,
    gate: Option<RawGate>,
    timeout: Option<Spanned<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    phase: Option<Spanned<String>>,
    retry: Option<RetryKeys>,
    #[serde(default)]
    always: bool,
    contexts: Option<Vec<String>>,
    fleet: Option<Spanned<String>>,
    selector: Option<Spanned<String>>,
    rollout: Option<RolloutKeys>,
    slo: Option<Spanned<String>>,
}

/// The step's `tool`, else a located problem: no `tool` (or a misspelt common key, named as
/// such), or a tool rdeploy does not know.
fn step_tool(checker: &mut Checker<'_>, map: &yaml::MappingNode) -> Option<Tool> {
    let Some(tool_node) = map.get_scalar("tool") else {
        // A misspelt common key (`tol: shell`) is named as such: "no `tool`" alone would
        // leave the reader looking for what is missing rather than what is wrong.
        let mut misspelt = false;
        if map.get_node("tool").is_none() {
            for key in map.keys() {
                let k = key.as_str();
                let known = COMMON_KEYS.contains(&k) || Tool::ALL.iter().any(|t| ToolSpec::keys(*t).contains(&k));
                if let Some(s) = suggest(k, COMMON_KEYS).filter(|_| !known) {
                    checker.at(key.span(), format!("unknown key `{k}`"), Some(format!("did you mean `{s}`?")));
                    misspelt = true;
                }
            }
        }
        if misspelt {
            return None;
        }
        let span = map.get_node("tool").map(|n| *n.span()).unwrap_or(*map.span());
        checker.at(&span, "this step has no `tool`", Some(format!("add `tool:` with one of {}", tool_list())));
        return None;
    };
    let tool = Tool::parse(tool_node.as_str());
    if tool.is_none() {
        let names: Vec<&str> = Tool::ALL.iter().map(|t| t.as_str()).collect();
        let hint = suggest(tool_node.as_str(), &names)
            .map(|s| format!("did you mean `{s}`?"))
            .unwrap_or_else(|| format!("use one of {}", tool_list()));
        checker.at(tool_node.span(), format!("unknown tool `{}`", tool_node.as_str()), Some(hint));
        return None;
    }
    tool
}

/// A step's keys, split into the common ones and the tool's own, so that each half is
/// deserialized strictly; a misspelt key is in the half of the key it was likely meant to be.
struct Split {
    common: yaml::MappingNode,
    own: yaml::MappingNode,
    /// Keys read in place of a misspelt one (see [`Place::guessed`]).
    guessed: Vec<&'static str>,
}

/// Splits a step's keys; an unknown key is reported (with a did-you-mean, or the tool it
/// belongs to) and left out, and the step's other keys are checked all the same.
fn split_keys(checker: &mut Checker<'_>, map: &yaml::MappingNode, tool: Tool) -> Split {
    // Split the step's keys into the common ones and the tool's own, so each half is
    // deserialized strictly and unknown keys are reported at the key with a suggestion.
    let tool_keys = ToolSpec::keys(tool);
    // Each value is copied once, into its half (a step of 100,000 sub-changes is a large node).
    let mut common = yaml::MappingNode::new_empty(*map.span());
    let mut own = yaml::MappingNode::new_empty(*map.span());
    // An unknown key is reported and left out; the step's other keys are checked all the same.
    let mut guessed: Vec<&'static str> = Vec::new();
    for (key, value) in map.iter() {
        let k = key.as_str();
        let fleet_tool = matches!(tool, Tool::Helm | Tool::Kubectl);
        if COMMON_KEYS.contains(&k) || (fleet_tool && FLEET_KEYS.contains(&k)) {
            common.insert(key.clone(), value.clone());
        } else if FLEET_KEYS.contains(&k) {
            checker.at(
                key.span(),
                format!("unknown key `{k}` in a {tool} step"),
                Some(format!("`{k}` is a key of fleet steps, which are helm or kubectl steps")),
            );
        } else if tool_keys.contains(&k) {
            own.insert(key.clone(), value.clone());
        } else {
            let valid: Vec<&str> = COMMON_KEYS.iter().chain(tool_keys).copied().collect();
            let other_tool = Tool::ALL.into_iter().find(|t| *t != tool && ToolSpec::keys(*t).contains(&k));
            let meant = suggest(k, &valid);
            // Read as the key it was most likely meant to be, so that its absence (`needs
            // `run``, `missing field `release``) is not reported too.
            if let Some(s) = meant.filter(|s| map.get_node(s).is_none()) {
                let half = if COMMON_KEYS.contains(&s) { &mut common } else { &mut own };
                half.insert(ScalarNode::new(*key.span(), s), value.clone());
                guessed.push(s);
            }
            let hint = match (meant, other_tool) {
                (Some(s), _) => Some(format!("did you mean `{s}`?")),
                (None, Some(t)) => {
                    Some(format!("`{k}` is a key of {t} steps; a {tool} step takes {}", quoted(tool_keys)))
                }
                (None, None) => Some(format!(
                    "a {tool} step takes {} and the common keys {}",
                    quoted(tool_keys),
                    quoted(COMMON_KEYS)
                )),
            };
            checker.at(key.span(), format!("unknown key `{k}` in a {tool} step"), hint);
        }
    }
    Split { common, own, guessed }
}

/// The `env` entries that are secret references, taken out of `common` and read here (serde
/// wants strings), and the other mappings read as plain text: (secret, plain) entries.
fn read_env(
    checker: &mut Checker<'_>,
    common: &mut yaml::MappingNode,
) -> (BTreeMap<String, Marked>, Vec<(String, String)>) {
    // `env` entries that are secret references are read here, not by serde (which wants strings).
    let mut env_marked = BTreeMap::new();
    let mut env_plain = Vec::new();
    if let Some(env_key) = common.keys().find(|k| k.as_str() == "env").cloned() {
        if let Some(Node::Mapping(env)) = common.get_mut(&env_key) {
            let written: Vec<_> =
                env.iter().filter(|(_, v)| v.as_mapping().is_some()).map(|(k, v)| (k.clone(), v.clone())).collect();
            for (k, v) in written {
                env.remove(&k);
                match read_value(checker, "env", k.as_str(), &v) {
                    Some(Written::Secret(marked)) => {
                        env_marked.insert(k.as_str().to_string(), marked);
                    }
                    Some(Written::Plain(serde_json::Value::String(text))) => env_plain.push((k.as_str().to_string(), text)),
                    Some(Written::Plain(serde_json::Value::Object(_))) => checker.at(
                        v.span(),
                        format!("`env.{}` must be a string or a secret reference", k.as_str()),
                        Some("write `NAME: value`, `NAME: { from_env: VAR }`, `NAME: { from_file: PATH }` or `NAME: { value: V, secret: true }`".into()),
                    ),
                    Some(Written::Plain(other)) => env_plain.push((k.as_str().to_string(), other.to_string())),
                    None => {}
                }
            }
        }
    }
    (env_marked, env_plain)
}

/// The values of the tool's typed key (helm `set`, ...) as written, each plain or a secret
/// reference (see [`read_value`]): serde saw every YAML scalar as a string.
fn read_typed_values(checker: &mut Checker<'_>, spec: &mut ToolSpec, own_node: &Node) {
    // serde sees every YAML scalar as a string; values handed to the tool keep their YAML type.
    // An entry may be a secret reference (see `read_value`): it is marked, and read at run time.
    let mut marked = BTreeMap::new();
    if let Some((key, values)) = spec.typed_values_mut() {
        if let Some(node) = own_node.as_mapping().and_then(|m| m.get_mapping(key)) {
            values.clear();
            for (k, v) in node.iter() {
                match read_value(checker, key, k.as_str(), v) {
                    Some(Written::Plain(value)) => {
                        values.insert(k.as_str().to_string(), value);
                    }
                    Some(Written::Secret(m)) => {
                        if let Some(secret) = &m.value {
                            values.insert(k.as_str().to_string(), secret.expose().clone());
                        }
                        marked.insert(k.as_str().to_string(), m);
                    }
                    None => {}
                }
            }
        }
    }
    if let Some(m) = spec.marked_mut() {
        *m = marked;
    }
}

/// The references `${{ steps.NAME.outputs.KEY }}` in the tool's keys, `env` and `revert`; a
/// malformed one is a located problem.
fn step_references(checker: &mut Checker<'_>, map: &yaml::MappingNode, own_node: &Node) -> Vec<Located> {
    // `${{ steps.NAME.outputs.KEY }}` in the tool's keys, `env` and `revert`.
    let mut located = Vec::new();
    let mut bad = Vec::new();
    reference::collect(own_node, &mut located, &mut bad);
    for key in ["env", "revert"] {
        if let Some(node) = map.get_node(key) {
            reference::collect(node, &mut located, &mut bad);
        }
    }
    for (span, message) in bad {
        checker.at(&span, message, Some("a reference reads `${{ steps.NAME.outputs.KEY }}`".into()));
    }

    located
}

/// What the tool's spec says is wrong, and the files it names that are not there.
fn check_spec(
    checker: &mut Checker<'_>,
    dir: &Path,
    name: &str,
    spec: &ToolSpec,
    env: &BTreeMap<String, String>,
    own_node: &Node,
    step_span: &Span,
) {
    for problem in spec.problems() {
        let span = locate(own_node, &problem.at).unwrap_or(*step_span);
        checker.at(&span, format!("step `{name}`: {}", problem.message), problem.hint);
    }
    for (at, path) in spec.referenced_paths() {
        let full = beside(dir, &path);
        // A path made from another step's output exists only once that step ran.
        if !full.exists() && !path.to_string_lossy().contains("${{") {
            let span = locate(own_node, &at).unwrap_or(*step_span);
            checker.at(
                &span,
                format!("step `{name}`: `{}` does not exist (looked for {})", path.display(), full.display()),
                Some("paths are relative to the stack file's directory".into()),
            );
        }
    }
    for problem in spec.problems_beside(dir, env) {
        let span = locate(own_node, &problem.at).unwrap_or(*step_span);
        checker.at(&span, format!("step `{name}`: {}", problem.message), problem.hint);
    }
}

/// `path` beside the stack file in `dir`, without the `./` a path written `./x` would double
/// (`./` + `./x`).
fn beside(dir: &Path, path: &Path) -> PathBuf {
    dir.join(path.components().filter(|c| *c != std::path::Component::CurDir).collect::<PathBuf>())
}

/// A fleet step runs once per cluster of `contexts`: no `context` of its own, and resumable.
fn check_fleet_step(
    checker: &mut Checker<'_>,
    name: &str,
    fleet: Option<&FleetStep>,
    spec: &ToolSpec,
    own_node: &Node,
    resumable: bool,
    step_span: &Span,
) {
    if fleet.is_none() {
        return;
    }
    {
        let own_context = match &spec {
            ToolSpec::Helm(h) => h.context.is_some(),
            ToolSpec::Kubectl(k) => k.context.is_some(),
            _ => false,
        };
        if own_context {
            let span =
                own_node.as_mapping().and_then(|m| m.get_node("context")).map(|n| *n.span()).unwrap_or(*step_span);
            checker.at(
                &span,
                format!("step `{name}` has both `context` and `contexts`"),
                Some("a fleet step runs once per cluster of `contexts`: remove `context`".into()),
            );
        }
        if !resumable {
            checker.at(
                step_span,
                format!("fleet step `{name}` cannot be `resumable: false`"),
                Some("each cluster is a checkpointed sub-change".into()),
            );
        }
    }
}

type ParsedStep = (Step, Span, Vec<Spanned<String>>, Option<Span>, Vec<reference::Located>);

fn parse_step(checker: &mut Checker<'_>, dir: &Path, node: &Node) -> Option<ParsedStep> {
    let Some(map) = node.as_mapping() else {
        checker.at(
            node.span(),
            "a step must be a mapping",
            Some("write `- name: ...` then `tool: ...` on the next lines".into()),
        );
        return None;
    };
    let tool = step_tool(checker, map)?;

    let Split { common, own, guessed } = split_keys(checker, map, tool);
    let mut common = common;
    let (env_marked, env_plain) = read_env(checker, &mut common);
    let common_node = yaml::coercible(Node::Mapping(common));
    let own_node = Node::Mapping(own);
    // The name as written, for messages about keys read before it.
    let written_name = map.get_scalar("name").map(|n| n.as_str());
    let at = Place { fallback: map.span(), keys: COMMON_KEYS, step: written_name, guessed: &guessed };
    let mut keys = decode_each(checker, common_node, &at, yaml::from_node::<CommonKeys>)?;
    let at = Place { keys: ToolSpec::keys(tool), ..at };
    let mut spec = decode_each(checker, own_node.clone(), &at, |n| build_spec(tool, n))?;
    read_typed_values(checker, &mut spec, &own_node);
    let located = step_references(checker, map, &own_node);

    let name = keys.name.as_str().to_string();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        checker.at(
            keys.name.span(),
            format!("step name `{name}` may only use letters, digits, `-` and `_`"),
            Some("the name is used in file names and commands".into()),
        );
    }
    let env = {
        let mut env = std::mem::take(&mut keys.env);
        env.extend(env_plain);
        env
    };
    check_spec(checker, dir, &name, &spec, &env, &own_node, map.span());
    let timeout = keys.timeout.as_ref().and_then(|t| parse_duration_at(checker, "timeout", t, TIMEOUT_BOUNDS));
    let retry = keys.retry.as_ref().and_then(|r| check_retry(checker, r));
    let phase = keys.phase.as_ref().and_then(|p| match p.as_str() {
        "expand" => Some(Phase::Expand),
        "migrate" => Some(Phase::Migrate),
        "contract" => Some(Phase::Contract),
        other => {
            let hint = suggest(other, &["expand", "migrate", "contract"]).map(|s| format!("did you mean `{s}`?"));
            checker.at(p.span(), format!("`phase` is `expand`, `migrate` or `contract`, not `{other}`"), hint);
            None
        }
    });
    let resumable = keys.resumable.unwrap_or_else(|| spec.default_resumable());
    if resumable && !spec.default_resumable() {
        // Only a shell step with a bare `run` defaults to not resumable: it has no sub-changes
        // to resume from, so `recover` could only run the whole script again.
        let span = map.get_node("resumable").map(|n| *n.span()).unwrap_or(*map.span());
        checker.at(
            &span,
            format!("step `{name}`: a bare `run` cannot be resumable"),
            Some("declare `sub_changes` (each checkpointed, with an optional `check`), or give it a `revert`".into()),
        );
    }
    let fleet = check_fleet(checker, dir, &mut keys, map.span());
    check_fleet_step(checker, &name, fleet.as_ref(), &spec, &own_node, resumable, map.span());
    let digest = hex::encode(Sha256::digest(yaml::node_to_json(node).to_string().as_bytes()));
    let line = map.span().start().map(|m| m.line()).unwrap_or(0);
    let step = Step {
        name,
        tool,
        needs: keys.needs.iter().map(|n| n.as_str().to_string()).collect(),
        resumable,
        revert: keys.revert,
        gate: keys.gate.map(|g| check_gate(checker, g)),
        timeout,
        retry,
        env,
        env_marked,
        phase,
        always: keys.always,
        fleet,
        spec,
        line,
        digest,
        refs: Vec::new(),
        own: own_node,
    };
    Some((step, *keys.name.span(), keys.needs, keys.phase.map(|p| *p.span()), located))
}

/// Deserializes a step's keys, reporting every key whose value does not fit, not the first
/// only: a key that fails is reported and left out, and the rest is read again. `None` when
/// what is left makes no `T` (a required key was left out: it is reported already, and "missing
/// field" would be a problem that another caused).
fn decode_each<T>(
    checker: &mut Checker<'_>,
    mut node: Node,
    at: &Place<'_>,
    decode: impl Fn(&Node) -> Result<T, yaml::DecodeError>,
) -> Option<T> {
    let mut left_out: Vec<String> = Vec::new();
    // Each round leaves a key out, so this ends.
    loop {
        let e = match decode(&node) {
            Ok(value) => return Some(value),
            Err(e) => e,
        };
        if left_out.iter().any(|k| e.message == format!("missing field `{k}`")) {
            return None;
        }
        // The step's key the error is under: the path's first segment.
        let key = e.path.as_deref().and_then(|p| p.split(['.', '[']).next()).map(str::to_string);
        if !key.as_deref().is_some_and(|k| at.guessed.contains(&k)) {
            report_serde_error(checker, at, e);
        }
        let Node::Mapping(map) = &mut node else { return None };
        let written = key.and_then(|key| map.keys().find(|k| k.as_str() == key).cloned())?;
        map.remove(&written);
        left_out.push(written.as_str().to_string());
    }
}

/// Where a deserialize error is: the step's span (when the error has no place of its own), the
/// keys valid there, and the step's name as written.
#[derive(Clone, Copy)]
struct Place<'a> {
    fallback: &'a Span,
    keys: &'a [&'a str],
    step: Option<&'a str>,
    /// Keys read in place of a misspelt one: a value that does not fit the key guessed is not
    /// reported (the misspelling is), only left out.
    guessed: &'a [&'a str],
}

/// Turns a deserialize error into a located problem.
fn report_serde_error(checker: &mut Checker<'_>, at: &Place<'_>, e: yaml::DecodeError) {
    let hint = e.unknown_field.as_deref().and_then(|(field, expected)| {
        // Inside a nested mapping (`gate.inventory.namespce`) the candidates are that
        // mapping's own fields, not the step's keys.
        let nested = e.path.as_deref().is_some_and(|p| p.contains('.'));
        suggest(field, if nested { expected } else { at.keys }).map(|s| format!("did you mean `{s}`?"))
    });
    let hint = hint.or(e.hint.map(str::to_string));
    let message = match &e.path {
        Some(path) => format!("`{path}`: {}", e.message),
        None => e.message,
    };
    let message = match at.step {
        Some(step) => format!("step `{step}`: {message}"),
        None => message,
    };
    match e.at {
        Some(place) => checker.at_location(Some(place), message, hint),
        None => checker.at(at.fallback, message, hint),
    }
}

/// Finds the span of a value inside a step's node by its field path.
fn locate(node: &Node, at: &FieldPath) -> Option<Span> {
    let mut current = node;
    for segment in at {
        current = match segment {
            PathSegment::Key(k) => current.as_mapping()?.get_node(k)?,
            PathSegment::Index(i) => current.as_sequence()?.get_node(*i)?,
        };
    }
    Some(*current.span())
}

/// A value in a tool key or `env`, as written.
enum Written {
    Plain(serde_json::Value),
    Secret(Marked),
}

/// The keys of the three secret forms.
const SECRET_FORM_KEYS: &[&str] = &["from_env", "from_file", "value", "secret"];

/// Reads one entry `key: node` of the tool key `tool_key` (`set`, `extra_vars`, `vars`, `env`).
///
/// A mapping is a secret reference only when its keys are exactly one of the forms
/// `{ from_env: NAME }`, `{ from_file: PATH }` or `{ value: V, secret: BOOL }`; any other mapping is
/// data (a helm `set` of a map) and reaches the tool as it is. A mapping that looks like a
/// misspelt form (`{ from_evn: X }`, `{ value: V, secert: true }`), a form with extra keys, or a
/// form nested inside data is a located problem (`None`).
///
/// Longer than most functions here on purpose: it is one decision table over the three forms
/// and their near misses, tried top to bottom, and the order of the cases is the rule.
fn read_value(checker: &mut Checker<'_>, tool_key: &str, key: &str, node: &Node) -> Option<Written> {
    let Some(map) = node.as_mapping() else { return Some(Written::Plain(yaml::typed_json(node))) };
    let keys: Vec<&str> = map.keys().map(|k| k.as_str()).collect();
    let key_span = |name: &str| map.keys().find(|k| k.as_str() == name).map(|k| *k.span()).unwrap_or(*map.span());
    let forms = "`{ from_env: NAME }`, `{ from_file: PATH }` or `{ value: V, secret: true }`";
    let scalar_text = |name: &str| map.get_scalar(name).map(|v| v.as_str().to_string()).filter(|t| !t.is_empty());
    let bool_word = |node: Option<&Node>| match node.and_then(Node::as_scalar).map(|s| s.as_str()) {
        Some("true" | "True" | "TRUE") => Some(true),
        Some("false" | "False" | "FALSE") => Some(false),
        _ => None,
    };
    match keys.as_slice() {
        ["from_env"] => {
            return match scalar_text("from_env") {
                Some(name) => Some(Written::Secret(Marked::from_env(name))),
                None => {
                    checker.at(
                        map.get_node("from_env").map(Node::span).unwrap_or(map.span()),
                        format!("`{tool_key}.{key}`: `from_env` names an environment variable"),
                        Some("write `{ from_env: DB_PASSWORD }`".into()),
                    );
                    None
                }
            }
        }
        ["from_file"] => {
            return match scalar_text("from_file") {
                Some(path) => Some(Written::Secret(Marked::from_file(path))),
                None => {
                    checker.at(
                        map.get_node("from_file").map(Node::span).unwrap_or(map.span()),
                        format!("`{tool_key}.{key}`: `from_file` names a file (relative to the stack file)"),
                        Some("write `{ from_file: secrets/db-password }`".into()),
                    );
                    None
                }
            }
        }
        _ => {}
    }
    let has = |name: &str| keys.contains(&name);
    if keys.len() == 2 && has("value") && has("secret") {
        let value = map.get_node("value").map(yaml::typed_json).unwrap_or_default();
        return match bool_word(map.get_node("secret")) {
            Some(true) => Some(Written::Secret(Marked::inline(value))),
            Some(false) => Some(Written::Plain(value)),
            None => {
                checker.at(
                    map.get_node("secret").map(Node::span).unwrap_or(map.span()),
                    format!("`{tool_key}.{key}`: `secret` is `true` or `false`"),
                    Some("write `{ value: V, secret: true }`".into()),
                );
                None
            }
        };
    }
    // A form with company: `from_env` and `from_file` stand alone.
    if let Some(source) = ["from_env", "from_file"].into_iter().find(|k| has(k)) {
        let other = keys.iter().find(|k| **k != source).copied().unwrap_or_default();
        checker.at(
            &key_span(other),
            format!("`{tool_key}.{key}`: `{source}` stands alone in its mapping, so `{other}` does not belong here"),
            Some(format!("a secret is {forms}")),
        );
        return None;
    }
    // A misspelt form: one key close to `from_env`/`from_file` with a scalar value, or `value`
    // beside a key close to `secret` holding a boolean, or `secret` without `value`.
    let misspelt =
        |k: &str, candidates: &[&'static str]| suggest(k, candidates).filter(|_| !SECRET_FORM_KEYS.contains(&k));
    if let [only] = keys.as_slice() {
        if let Some(s) = misspelt(only, &["from_env", "from_file"]).filter(|_| map.get_scalar(only).is_some()) {
            checker.at(
                &key_span(only),
                format!("`{tool_key}.{key}`: unknown key `{only}` in a secret reference"),
                Some(format!("did you mean `{s}`?")),
            );
            return None;
        }
    }
    if has("value") && keys.len() == 2 {
        let other = keys.iter().find(|k| **k != "value").copied().unwrap_or_default();
        if let Some(s) = misspelt(other, &["secret"]).filter(|_| bool_word(map.get_node(other)).is_some()) {
            checker.at(
                &key_span(other),
                format!("`{tool_key}.{key}`: unknown key `{other}` in a secret value"),
                Some(format!("did you mean `{s}`?")),
            );
            return None;
        }
    }
    if has("secret") && bool_word(map.get_node("secret")).is_some() {
        let hint = if has("value") {
            format!("a secret value has exactly the keys `value` and `secret`: {forms}")
        } else {
            "write `{ value: V, secret: true }`".to_string()
        };
        checker.at(
            &key_span("secret"),
            format!("`{tool_key}.{key}`: `secret: true` marks a `value:` beside it, alone"),
            Some(hint),
        );
        return None;
    }
    // Data. A reference inside it would reach the tool as a mapping: say so.
    if let Some(span) = nested_reference(node, true) {
        checker.at(
            &span,
            format!("`{tool_key}.{key}`: a secret reference must be a whole entry of `{tool_key}`, not inside a value"),
            Some(format!("give the secret its own entry (helm `set` takes dotted paths: `{key}.password: {{ from_env: DB_PASSWORD }}`)")),
        );
        return None;
    }
    Some(Written::Plain(yaml::typed_json(node)))
}

/// Where a mapping shaped exactly like a secret form sits inside `node` (not `node` itself).
fn nested_reference(node: &Node, top: bool) -> Option<Span> {
    match node {
        Node::Scalar(_) => None,
        Node::Sequence(seq) => seq.iter().find_map(|n| nested_reference(n, false)),
        Node::Mapping(map) => {
            let keys: Vec<&str> = map.keys().map(|k| k.as_str()).collect();
            let is_form = matches!(keys.as_slice(), ["from_env"] | ["from_file"])
                || (keys.len() == 2 && keys.contains(&"value") && keys.contains(&"secret"));
            if is_form && !top {
                return Some(*map.span());
            }
            map.values().find_map(|n| nested_reference(n, false))
        }
    }
}

/// A precondition evaluated right before a step runs. Its values are parsed when the stack
/// loads, so a bad kind, timeout or date is bad input at `validate`, not a refusal mid-deploy.
#[derive(Clone, Debug, PartialEq)]
pub struct Gate {
    pub inventory: InventoryGate,
}

/// Refuse the step unless every cluster in scope runs the wanted version.
#[derive(Clone, Debug, PartialEq)]
pub struct InventoryGate {
    pub contexts: Vec<String>,
    pub namespace: Option<String>,
    pub selector: Option<String>,
    pub image: String,
    pub version: String,
    pub kubeconfig: Option<PathBuf>,
    pub exceptions: Vec<GateException>,
    /// Only these workload kinds; all when empty.
    pub kinds: Vec<Kind>,
    /// Per-cluster time to answer before it counts as absent (`None`: the gate's default).
    pub timeout: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GateException {
    pub cluster: String,
    pub reason: String,
    /// The exception applies through the day before this date.
    pub expires: time::Date,
}

/// `gate:` as written, with the positions of the values parsed at load.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGate {
    inventory: RawInventoryGate,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInventoryGate {
    contexts: Vec<String>,
    namespace: Option<String>,
    selector: Option<String>,
    image: String,
    version: String,
    kubeconfig: Option<PathBuf>,
    #[serde(default)]
    exceptions: Vec<RawGateException>,
    #[serde(default)]
    kinds: Vec<Spanned<String>>,
    timeout: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGateException {
    cluster: String,
    reason: String,
    expires: Spanned<String>,
}

/// The gate with its values parsed; a value that does not parse is a located problem.
fn check_gate(checker: &mut Checker<'_>, raw: RawGate) -> Gate {
    let inv = raw.inventory;
    let mut kinds = Vec::new();
    for k in &inv.kinds {
        match Kind::parse(k.as_str()) {
            Some(kind) => kinds.push(kind),
            None => {
                let names = Kind::ALL.map(Kind::name);
                let hint = suggest(k.as_str(), &names)
                    .map(|s| format!("did you mean `{s}`?"))
                    .unwrap_or_else(|| format!("use one of {}", quoted(&names)));
                checker.at(
                    k.span(),
                    format!("unknown workload kind `{}` in `gate.inventory.kinds`", k.as_str()),
                    Some(hint),
                );
            }
        }
    }
    let timeout = inv.timeout.and_then(|t| parse_duration_at(checker, "gate.inventory.timeout", &t, TIMEOUT_BOUNDS));
    let format = time::macros::format_description!("[year]-[month]-[day]");
    let exceptions = inv
        .exceptions
        .into_iter()
        .filter_map(|e| match time::Date::parse(e.expires.as_str().trim(), &format) {
            Ok(expires) => Some(GateException { cluster: e.cluster, reason: e.reason, expires }),
            Err(_) => {
                checker.at(
                    e.expires.span(),
                    format!("the exception for `{}`: `expires: {}` is not a date", e.cluster, e.expires.as_str()),
                    Some("write the date like `2026-12-31` (the exception holds until the day before)".into()),
                );
                None
            }
        })
        .collect();
    let inventory = InventoryGate {
        contexts: inv.contexts,
        namespace: inv.namespace,
        selector: inv.selector,
        image: inv.image,
        version: inv.version,
        kubeconfig: inv.kubeconfig,
        exceptions,
        kinds,
        timeout,
    };
    Gate { inventory }
}

/// `rollout:` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RolloutKeys {
    #[serde(default)]
    waves: Vec<Spanned<String>>,
    parallel: Option<Spanned<String>>,
    bake: Option<Spanned<String>>,
    max_failures: Option<Spanned<String>>,
    absent: Option<Spanned<String>>,
    inventory_timeout: Option<Spanned<String>>,
}

/// A fleet step's scope and rollout, parsed when the stack loads.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetStep {
    /// Context names and globs (`edge-*`); empty with a fleet file: every cluster in it.
    pub contexts: Vec<String>,
    /// A fleet file (clusters with labels), resolved against the stack directory.
    pub fleet_file: Option<PathBuf>,
    /// A label selector over the fleet file's cluster labels (`tier=edge,site!=lab`).
    pub selector: Option<String>,
    pub rollout: Rollout,
    /// `slo: "95%@48h,100%@7d"`: completion objectives measured from the rollout's start.
    pub slo: Option<String>,
}

/// `rollout:`: cumulative waves, how many clusters at once, the bake, the stop rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rollout {
    pub waves: Vec<WaveSize>,
    pub parallel: usize,
    pub bake: Duration,
    pub max_failures: MaxFailures,
    pub absent: AbsentPolicy,
    /// How long a cluster has to answer a read before it counts as absent.
    pub inventory_timeout: Duration,
}

impl Default for Rollout {
    fn default() -> Rollout {
        Rollout {
            waves: vec![WaveSize::Percent(100.0)],
            parallel: 1,
            bake: Duration::ZERO,
            max_failures: MaxFailures::Count(0),
            absent: AbsentPolicy::Skip,
            inventory_timeout: Duration::from_secs(5),
        }
    }
}

/// One entry of `waves:`: a cumulative number of clusters, or a share of those in scope.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WaveSize {
    Count(usize),
    Percent(f64),
}

/// `max_failures:`: failed clusters tolerated before the rollout stops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MaxFailures {
    Count(usize),
    Percent(f64),
}

impl MaxFailures {
    /// The number of failures tolerated out of `total` clusters (a share rounds down).
    pub fn of(self, total: usize) -> usize {
        match self {
            MaxFailures::Count(n) => n,
            MaxFailures::Percent(p) => ((p / 100.0) * total as f64).floor() as usize,
        }
    }
}

/// `absent:`: what a wave does with a cluster that does not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AbsentPolicy {
    /// Leave it as a straggler and go on; the deploy ends partial.
    Skip,
    /// Wait for it, up to the step's `timeout`.
    Wait,
}

fn parse_percent(text: &str) -> Option<f64> {
    let p: f64 = text.trim().strip_suffix('%')?.trim().parse().ok()?;
    (p > 0.0 && p <= 100.0).then_some(p)
}

/// A fleet step's `rollout:`, each value parsed; one that does not parse is a located problem
/// and its default is kept.
fn check_rollout(checker: &mut Checker<'_>, r: &RolloutKeys) -> Rollout {
    let mut out = Rollout::default();
    if !r.waves.is_empty() {
        let mut waves = Vec::new();
        for w in &r.waves {
            let text = w.as_str().trim();
            if let Some(p) = parse_percent(text) {
                waves.push(WaveSize::Percent(p));
            } else if let Some(n) = text.parse::<usize>().ok().filter(|n| *n > 0) {
                waves.push(WaveSize::Count(n));
            } else {
                checker.at(
                    w.span(),
                    format!("`rollout.waves` entry `{text}` is neither a cluster count nor a percentage"),
                    Some("waves are cumulative: `waves: [1, \"10%\", \"50%\", \"100%\"]`".into()),
                );
            }
        }
        out.waves = waves;
    }
    if let Some(p) = &r.parallel {
        match p.as_str().trim().parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => out.parallel = n,
            _ => checker.at(
                p.span(),
                format!("`rollout.parallel` is a whole number from 1 to 1000, not `{}`", p.as_str()),
                Some("it is how many clusters of a wave are applied at once".into()),
            ),
        }
    }
    if let Some(b) = &r.bake {
        if let Some(d) = parse_duration_at(checker, "rollout.bake", b, BAKE_BOUNDS) {
            out.bake = d;
        }
    }
    if let Some(t) = &r.inventory_timeout {
        if let Some(d) = parse_duration_at(checker, "rollout.inventory_timeout", t, TIMEOUT_BOUNDS) {
            out.inventory_timeout = d;
        }
    }
    if let Some(m) = &r.max_failures {
        let text = m.as_str().trim();
        if let Some(p) =
            text.strip_suffix('%').and_then(|p| p.trim().parse::<f64>().ok()).filter(|p| (0.0..=100.0).contains(p))
        {
            out.max_failures = MaxFailures::Percent(p);
        } else if let Ok(n) = text.parse::<usize>() {
            out.max_failures = MaxFailures::Count(n);
        } else {
            checker.at(
                m.span(),
                format!("`rollout.max_failures` is a number of clusters or a percentage, not `{text}`"),
                Some("`max_failures: 0` stops at the first failed cluster; `\"5%\"` tolerates one in twenty".into()),
            );
        }
    }
    if let Some(a) = &r.absent {
        match a.as_str() {
            "skip" => out.absent = AbsentPolicy::Skip,
            "wait" => out.absent = AbsentPolicy::Wait,
            other => {
                let hint = suggest(other, &["skip", "wait"]).map(|s| format!("did you mean `{s}`?"));
                checker.at(a.span(), format!("`rollout.absent` is `skip` or `wait`, not `{other}`"), hint);
            }
        }
    }
    out
}

/// A helm or kubectl step's fleet keys: `None` for a step that runs once (its fleet-only keys
/// are problems then) or when a fleet key does not parse (a located problem).
fn check_fleet(checker: &mut Checker<'_>, dir: &Path, keys: &mut CommonKeys, step_span: &Span) -> Option<FleetStep> {
    let contexts = keys.contexts.take();
    let fleet = keys.fleet.take();
    let selector = keys.selector.take();
    let rollout = keys.rollout.take();
    let slo = keys.slo.take();
    if contexts.is_none() && fleet.is_none() {
        for (key, span) in [
            ("selector", selector.as_ref().map(|s| *s.span())),
            ("rollout", rollout.as_ref().map(|_| *step_span)),
            ("slo", slo.as_ref().map(|s| *s.span())),
        ] {
            if let Some(span) = span {
                checker.at(
                    &span,
                    format!("`{key}` belongs to a fleet step, and this step has no `contexts` or `fleet`"),
                    Some("add `contexts: [edge-*]` (or `fleet: FILE`) so the step runs once per cluster".into()),
                );
            }
        }
        return None;
    }
    let before = checker.problems.len();
    let contexts = contexts.unwrap_or_default();
    if contexts.is_empty() && fleet.is_none() {
        checker.at(step_span, "`contexts` is empty", Some("name the kube contexts, or globs like `edge-*`".into()));
    }
    for c in &contexts {
        if crate::fleet::scope::is_glob(c) && glob::Pattern::new(c).is_err() {
            checker.at(step_span, format!("`contexts` entry `{c}` is not a valid glob"), None);
        }
    }
    let fleet_file = fleet.map(|f| {
        let path = dir.join(f.as_str());
        if !path.is_file() {
            checker.at(
                f.span(),
                format!("the fleet file `{}` does not exist (looked for {})", f.as_str(), path.display()),
                Some("paths are relative to the stack file's directory".into()),
            );
        }
        path
    });
    if let Some(sel) = &selector {
        if fleet_file.is_none() {
            checker.at(
                sel.span(),
                "`selector` picks clusters by their labels in a fleet file, and this step has no `fleet`",
                Some("add `fleet: fleet.yaml` (`clusters: {edge-1: {tier: edge}}`)".into()),
            );
        } else if let Err(e) = crate::fleet::analysis::Selector::parse(sel.as_str()) {
            checker.at(sel.span(), format!("`selector: {}`: {e}", sel.as_str()), None);
        }
    }
    if let Some(s) = &slo {
        if let Err(e) = crate::fleet::slo::parse(s.as_str()) {
            checker.at(s.span(), format!("`slo`: {e}"), Some("write it like `slo: \"95%@48h,100%@7d\"`".into()));
        }
    }
    let out = rollout.map(|r| check_rollout(checker, &r)).unwrap_or_default();
    (checker.problems.len() == before).then(|| FleetStep {
        contexts,
        fleet_file,
        selector: selector.map(|s| s.as_str().to_string()),
        rollout: out,
        slo: slo.map(|s| s.as_str().to_string()),
    })
}

/// `retry:` as written, with positions for the checks in [`Retry::check`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryKeys {
    attempts: Option<Spanned<String>>,
    delay: Option<Spanned<String>>,
    backoff: Option<Spanned<String>>,
    max_delay: Option<Spanned<String>>,
    #[serde(default)]
    matching: Vec<Spanned<String>>,
    transient: Option<bool>,
}

/// A step's `retry:`: how often and when a failed step is resumed again without a human.
#[derive(Clone, Debug)]
pub struct Retry {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    /// Before the second attempt.
    pub delay: Duration,
    /// Each further delay is the previous one times this (at least 1).
    pub backoff: f64,
    pub max_delay: Option<Duration>,
    /// A failure is retried when one of these matches its message or the tool's stderr tail.
    pub matching: Vec<regex::Regex>,
    /// Also retry the tool's known transient errors (default true).
    pub transient: bool,
}

impl Retry {
    /// How long to wait before attempt `next` (2 for the first retry).
    pub fn delay_before(&self, next: u32) -> Duration {
        let factor = self.backoff.powi(next.saturating_sub(2) as i32);
        // Saturated, never a panic: `mul_f64` panics on a product a `Duration` cannot hold.
        let delay = Duration::try_from_secs_f64(self.delay.as_secs_f64() * factor.min(1e6)).unwrap_or(Duration::MAX);
        match self.max_delay {
            Some(max) => delay.min(max),
            None => delay,
        }
    }
}

/// The range a duration key accepts. Outside it a value is a mistake rather than a wish (a
/// timeout of `0s` or `1ns` fails every step at once; one of `18446744073709551615s` is no
/// timeout and overflows the clock), and it is bad input at `validate`, never a panic later.
#[derive(Clone, Copy, Debug)]
pub struct DurationBounds {
    pub min: Duration,
    pub max: Duration,
    /// How the bounds read in a message: `from 1s to 7d`.
    pub words: &'static str,
}

/// `timeout` (a step's and the stack's), `rollout.inventory_timeout`, `gate.inventory.timeout`.
pub const TIMEOUT_BOUNDS: DurationBounds =
    DurationBounds { min: Duration::from_secs(1), max: Duration::from_secs(7 * 24 * 3600), words: "from 1s to 7d" };
/// `retry.delay` and `retry.max_delay`: `0s` retries at once.
pub const RETRY_DELAY_BOUNDS: DurationBounds =
    DurationBounds { min: Duration::ZERO, max: Duration::from_secs(24 * 3600), words: "from 0s to 24h" };
/// `rollout.bake`: `0s` (the default) moves on to the next wave at once.
pub const BAKE_BOUNDS: DurationBounds =
    DurationBounds { min: Duration::ZERO, max: Duration::from_secs(30 * 24 * 3600), words: "from 0s to 30d" };

fn parse_duration_at(
    checker: &mut Checker<'_>,
    key: &str,
    value: &Spanned<String>,
    bounds: DurationBounds,
) -> Option<Duration> {
    match humantime::parse_duration(value.as_str()) {
        Ok(d) if (bounds.min..=bounds.max).contains(&d) => Some(d),
        Ok(d) => {
            let (what, example) = if d < bounds.min { ("too short", "`30s`") } else { ("too long", "`2h`") };
            checker.at(
                value.span(),
                format!("`{key}: {}` is {what}: it is a duration {}", value.as_str(), bounds.words),
                Some(format!("write a duration {} like {example}", bounds.words)),
            );
            None
        }
        Err(e) => {
            checker.at(
                value.span(),
                format!("`{key}: {}` is not a duration: {e}", value.as_str()),
                Some(format!("write it like `90s`, `10m` or `1h30m` ({})", bounds.words)),
            );
            None
        }
    }
}

fn check_retry(checker: &mut Checker<'_>, keys: &RetryKeys) -> Option<Retry> {
    let before = checker.problems.len();
    let attempts = match &keys.attempts {
        None => 3,
        Some(a) => match a.as_str().parse::<u32>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => {
                checker.at(
                    a.span(),
                    format!("`retry.attempts` is a whole number from 1 to 100, not `{}`", a.as_str()),
                    Some("count the first attempt too: `attempts: 3` retries twice".into()),
                );
                1
            }
        },
    };
    let delay = keys
        .delay
        .as_ref()
        .and_then(|d| parse_duration_at(checker, "retry.delay", d, RETRY_DELAY_BOUNDS))
        .unwrap_or(Duration::from_secs(5));
    let max_delay =
        keys.max_delay.as_ref().and_then(|d| parse_duration_at(checker, "retry.max_delay", d, RETRY_DELAY_BOUNDS));
    let backoff = match &keys.backoff {
        None => 2.0,
        Some(b) => match b.as_str().parse::<f64>() {
            Ok(f) if f.is_finite() && (1.0..=10.0).contains(&f) => f,
            _ => {
                checker.at(
                    b.span(),
                    format!("`retry.backoff` is a factor from 1 to 10, not `{}`", b.as_str()),
                    Some("`backoff: 2` doubles the delay after each attempt; `1` keeps it".into()),
                );
                1.0
            }
        },
    };
    let mut matching = Vec::new();
    for pattern in &keys.matching {
        match regex::Regex::new(pattern.as_str()) {
            Ok(re) => matching.push(re),
            Err(e) => {
                let text = e.to_string();
                let last = text.lines().last().unwrap_or("invalid").trim();
                let why = last.strip_prefix("error: ").unwrap_or(last).to_string();
                checker.at(
                    pattern.span(),
                    format!("`retry.matching` entry `{}` is not a regular expression: {}", pattern.as_str(), why),
                    Some("the syntax is Rust's `regex` crate; escape `(`, `[`, `.` with `\\`".into()),
                );
            }
        }
    }
    (checker.problems.len() == before).then(|| Retry {
        attempts,
        delay,
        backoff,
        max_delay,
        matching,
        transient: keys.transient.unwrap_or(true),
    })
}

/// `needs` must name steps of the stack, other than the step itself; `written` holds every
/// step name written (sorted), also of steps with problems. Whether every `needs` was fine.
fn check_needs(
    checker: &mut Checker<'_>,
    steps: &[Step],
    needs_spans: &[Vec<Spanned<String>>],
    written: &[&str],
) -> bool {
    let mut fine = true;
    for (step, needs) in steps.iter().zip(needs_spans) {
        for need in needs {
            if need.as_str() == step.name {
                fine = false;
                checker.at(
                    need.span(),
                    format!("step `{}` needs itself", step.name),
                    Some("remove it from `needs`".into()),
                );
            } else if written.binary_search(&need.as_str()).is_err() {
                fine = false;
                let hint = suggest(need.as_str(), written).map(|s| format!("did you mean `{s}`?"));
                checker.at(
                    need.span(),
                    format!("step `{}` needs `{}`, which is not a step of this stack", step.name, need.as_str()),
                    hint,
                );
            }
        }
    }
    fine
}

/// An edge that a reference made, by (consumer, producer), at the reference.
type ImplicitNeeds = HashMap<(usize, usize), Span>;

/// Each reference names another step (of those `written`) and is an implicit `needs` on it:
/// those edges between parsed steps, and whether every reference was fine.
fn check_references(
    checker: &mut Checker<'_>,
    steps: &[Step],
    ref_spans: &[Vec<Located>],
    first_by_name: &HashMap<String, usize>,
    written: &[&str],
) -> (ImplicitNeeds, bool) {
    let mut implicit = HashMap::new();
    let mut fine = true;
    for (i, located) in ref_spans.iter().enumerate() {
        for Located { reference, span } in located {
            if reference.step == steps[i].name {
                fine = false;
                checker.at(
                    span,
                    format!("step `{}` refers to its own output `{}`", steps[i].name, reference.key),
                    Some("a step's outputs exist once it is done: only later steps can use them".into()),
                );
            } else if let Some(&j) = first_by_name.get(&reference.step) {
                implicit.entry((i, j)).or_insert(*span);
            } else if written.binary_search(&reference.step.as_str()).is_err() {
                fine = false;
                let hint = suggest(&reference.step, written).map(|s| format!("did you mean `{s}`?"));
                checker.at(
                    span,
                    format!(
                        "step `{}` refers to `{reference}`, but `{}` is not a step of this stack",
                        steps[i].name, reference.step
                    ),
                    hint,
                );
            } else {
                // A step with problems of its own: the edge is not known.
                fine = false;
            }
        }
    }
    (implicit, fine)
}

/// Names a cycle from the step that comes first in the file, at the reference that made one
/// of its edges if `needs` did not.
fn report_cycle(
    checker: &mut Checker<'_>,
    steps: &[Step],
    mut cycle: Vec<usize>,
    implicit: &ImplicitNeeds,
    needs_spans: &[Vec<Spanned<String>>],
    name_spans: &[(String, Span)],
) {
    let min = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
    cycle.rotate_left(min);
    let first = cycle[0];
    let path: Vec<&str> = cycle.iter().chain(std::iter::once(&first)).map(|&i| steps[i].name.as_str()).collect();
    // `cycle[k]` needs `cycle[k + 1]`...: an edge that only a reference made is named.
    let by_reference = (0..cycle.len()).find_map(|k| {
        let (a, b) = (cycle[k], cycle[(k + 1) % cycle.len()]);
        let pair = [(a, b), (b, a)].into_iter().find(|p| implicit.contains_key(p))?;
        let explicit = needs_spans[pair.0].iter().any(|n| n.as_str() == steps[pair.1].name);
        (!explicit).then(|| implicit[&pair])
    });
    match by_reference {
        Some(span) => checker.at(
            &span,
            format!("this output reference makes a cycle between steps: {}", path.join(" -> ")),
            Some(
                "a step can only use the outputs of steps that run before it; remove the reference or a `needs`".into(),
            ),
        ),
        None => checker.at(
            &name_spans[first].1,
            format!("the steps' `needs` form a cycle: {}", path.join(" -> ")),
            Some("remove one of these `needs` so the steps can run in order".into()),
        ),
    }
}

/// The order steps run in: `needs` first, file order otherwise. `Err` holds a cycle.
fn run_order(steps: &[Step]) -> Result<Vec<usize>, Vec<usize>> {
    let index: HashMap<&str, usize> = steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let mut indegree = vec![0usize; steps.len()];
    let mut dependents = vec![Vec::new(); steps.len()];
    for (i, step) in steps.iter().enumerate() {
        // A `needs` naming no parsed step is reported apart; the order is of the rest.
        for &j in step.needs.iter().filter_map(|n| index.get(n.as_str())) {
            indegree[i] += 1;
            dependents[j].push(i);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> = (0..steps.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(steps.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &d in &dependents[i] {
            indegree[d] -= 1;
            if indegree[d] == 0 {
                ready.insert(d);
            }
        }
    }
    if order.len() == steps.len() {
        return Ok(order);
    }
    // Walk `needs` from a step left over until a step repeats: that is the cycle.
    let start = (0..steps.len()).find(|&i| indegree[i] > 0).expect("a step is left over");
    let mut path = vec![start];
    // Where each step sits on the path, so finding the repeat is not a scan of the path.
    let mut on_path = vec![usize::MAX; steps.len()];
    on_path[start] = 0;
    let mut current = start;
    loop {
        let next = steps[current]
            .needs
            .iter()
            .filter_map(|n| index.get(n.as_str()).copied())
            .find(|&j| indegree[j] > 0)
            .expect("a left-over step needs another left-over step");
        if on_path[next] != usize::MAX {
            let mut cycle = path.split_off(on_path[next]);
            cycle.reverse();
            return Err(cycle);
        }
        on_path[next] = path.len();
        path.push(next);
        current = next;
    }
}

/// Expand/migrate/contract: a contract step needs a gate and must run after every expand step.
/// The order is `None` when it is not known (a cycle, a `needs` naming no step): then only the
/// gates are checked, so that no problem is reported that another one caused.
fn check_phases(checker: &mut Checker<'_>, steps: &[Step], order: Option<&[usize]>, phase_spans: &[Option<Span>]) {
    let position: Option<Vec<usize>> = order.map(|order| {
        let mut pos = vec![0; steps.len()];
        for (p, &i) in order.iter().enumerate() {
            pos[i] = p;
        }
        pos
    });
    let expand: Vec<usize> = (0..steps.len()).filter(|&j| steps[j].phase == Some(Phase::Expand)).collect();
    for (i, step) in steps.iter().enumerate() {
        if step.phase != Some(Phase::Contract) {
            continue;
        }
        let span = phase_spans[i].unwrap_or_else(Span::new_blank);
        if step.gate.is_none() {
            checker.at(
                &span,
                format!("contract step `{}` has no `gate`", step.name),
                Some("a contract step assumes every cluster upgraded: add `gate: { inventory: ... }` so rdeploy can check".into()),
            );
        }
        let Some(position) = &position else { continue };
        for &j in &expand {
            let other = &steps[j];
            if position[j] > position[i] {
                checker.at(
                    &span,
                    format!("contract step `{}` runs before expand step `{}`", step.name, other.name),
                    Some(format!("add `needs: [{}]` to `{}`", other.name, step.name)),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<Problem> {
        parse(Path::new("stack.yaml"), text).unwrap_err().problems
    }

    /// A missing `./x` is reported at the path looked for, without a doubled `./`.
    #[test]
    fn a_missing_dot_slash_path_is_reported_once_dotted() {
        let text =
            "name: s\nsteps:\n  - name: web\n    tool: helm\n    release: web\n    chart: ./no-such-chart-dir/nginx\n";
        let messages: Vec<String> = problems(text).into_iter().map(|p| p.message).collect();
        let missing = messages.iter().find(|m| m.contains("does not exist")).expect("a missing path");
        assert!(missing.contains("(looked for ./no-such-chart-dir/nginx)"), "{missing}");
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
        assert!(p[0].message.contains("chart `webchart` is neither a chart directory nor a packaged chart"), "{p:?}");
    }

    /// A stack's name names its directory in the shared `.rdeploy/`: what that directory holds
    /// itself (`fleet/`, `lock`, the old layout's files) and what cannot be a directory name are
    /// refused at the name, and without `name:`, at the top for the file's name.
    #[test]
    fn a_stack_name_that_would_collide_in_the_state_layout_is_refused() {
        let steps = "steps:\n  - name: a\n    tool: shell\n    run: x\n";
        for name in ["fleet", "lock", "Fleet", "LOCK"] {
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
        // A name the old single-stack layout used for a file is a stack's name as before.
        assert!(parse(Path::new("h.yaml"), &format!("name: history\n{steps}")).is_ok());

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
        let err = load(&file, &Redactor::default()).unwrap_err().downcast::<StackError>().unwrap();
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

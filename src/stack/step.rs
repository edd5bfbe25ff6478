//! One step of the stack file: its keys split into the common ones and its tool's, each read
//! strictly, and the [`Step`] they make; resolving its output references before it runs.

use super::*;

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
pub(super) fn shell_var(refs: &[Reference], r: &Reference) -> String {
    let n = refs.iter().position(|x| x == r).unwrap_or(refs.len());
    let clean = |s: &str| s.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    format!("RDEPLOY_REF_{n}_{}_{}", clean(&r.step), clean(&r.key))
}

/// A shell line's scalar with its references made expansions of their variables.
pub(super) fn shell_scalar(
    line: &ScalarNode,
    shell: &dyn Fn(&str) -> Result<String, ResolveError>,
) -> Result<Node, ResolveError> {
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
pub(super) fn keep_marked(from: &ToolSpec, spec: &mut ToolSpec) {
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
pub(super) fn build_spec(tool: Tool, own_node: &Node) -> Result<ToolSpec, yaml::DecodeError> {
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
pub(super) struct CommonKeys {
    pub(super) name: Spanned<String>,
    #[allow(dead_code)]
    pub(super) tool: Spanned<String>,
    #[serde(default)]
    pub(super) needs: Vec<Spanned<String>>,
    pub(super) resumable: Option<bool>,
    pub(super) revert: Option<String>,
    pub(super) gate: Option<RawGate>,
    pub(super) timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) env: BTreeMap<String, String>,
    pub(super) phase: Option<Spanned<String>>,
    pub(super) retry: Option<RetryKeys>,
    #[serde(default)]
    pub(super) always: bool,
    pub(super) contexts: Option<Vec<String>>,
    pub(super) fleet: Option<Spanned<String>>,
    pub(super) selector: Option<Spanned<String>>,
    pub(super) rollout: Option<RolloutKeys>,
    pub(super) slo: Option<Spanned<String>>,
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
fn check_spec(checker: &mut Checker<'_>, dir: &Path, name: &str, spec: &ToolSpec, own_node: &Node, step_span: &Span) {
    for problem in spec.problems() {
        let span = locate(own_node, &problem.at).unwrap_or(*step_span);
        checker.at(&span, format!("step `{name}`: {}", problem.message), problem.hint);
    }
    for (at, path) in spec.referenced_paths() {
        let full = dir.join(&path);
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
    for problem in spec.problems_beside(dir) {
        let span = locate(own_node, &problem.at).unwrap_or(*step_span);
        checker.at(&span, format!("step `{name}`: {}", problem.message), problem.hint);
    }
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

pub(super) type ParsedStep = (Step, Span, Vec<Spanned<String>>, Option<Span>, Vec<reference::Located>);

pub(super) fn parse_step(checker: &mut Checker<'_>, dir: &Path, node: &Node) -> Option<ParsedStep> {
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
    check_spec(checker, dir, &name, &spec, &own_node, map.span());
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
        env: {
            let mut env = keys.env;
            env.extend(env_plain);
            env
        },
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
pub(super) fn decode_each<T>(
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
pub(super) struct Place<'a> {
    fallback: &'a Span,
    keys: &'a [&'a str],
    step: Option<&'a str>,
    /// Keys read in place of a misspelt one: a value that does not fit the key guessed is not
    /// reported (the misspelling is), only left out.
    guessed: &'a [&'a str],
}

/// Turns a deserialize error into a located problem.
pub(super) fn report_serde_error(checker: &mut Checker<'_>, at: &Place<'_>, e: yaml::DecodeError) {
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
pub(super) fn locate(node: &Node, at: &FieldPath) -> Option<Span> {
    let mut current = node;
    for segment in at {
        current = match segment {
            PathSegment::Key(k) => current.as_mapping()?.get_node(k)?,
            PathSegment::Index(i) => current.as_sequence()?.get_node(*i)?,
        };
    }
    Some(*current.span())
}

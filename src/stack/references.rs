//! References between steps, `${{ steps.NAME.outputs.KEY }}`: where a step's keys hold them
//! (found when the stack loads, each an implicit `needs`), whether each names another step, and
//! a step's settings once their values are known ([`Step::resolve`]).

use std::collections::{BTreeMap, HashMap};

use rdeploy_adapters::suggest;
use rdeploy_adapters::yaml::{self, Node, ScalarNode, Span};
use rdeploy_adapters::{Adapter, ToolSpec};

use super::base::Checker;
use super::step::{build_spec, Step};
use crate::reference::{self, Located, Reference};

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
        let lines = if to_run { self.spec.shell_line_keys() } else { &[] };
        let own = resolve_node(&self.own, lines, value, &shell)?;
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
        if to_run && (!lines.is_empty() || self.revert.is_some()) {
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

/// `node` with every reference replaced by its value, but a scalar at one of `lines` (paths
/// of keys below `node`, `*` for any entry of a list) is a shell line: its references become
/// expansions of their variables ([`shell_scalar`]).
fn resolve_node(
    node: &Node,
    lines: &[&[&str]],
    value: &dyn Fn(&Reference) -> Option<String>,
    shell: &dyn Fn(&str) -> Result<String, ResolveError>,
) -> Result<Node, ResolveError> {
    // The paths one level down: those whose first key is `key`, without it.
    fn below<'a>(lines: &[&'a [&'a str]], key: &str) -> Vec<&'a [&'a str]> {
        lines.iter().filter_map(|p| p.split_first().filter(|(first, _)| **first == key).map(|(_, rest)| rest)).collect()
    }
    match node {
        Node::Scalar(line) if lines.iter().any(|p| p.is_empty()) => shell_scalar(line, shell),
        Node::Mapping(map) if lines.iter().any(|p| p.first().is_some_and(|k| *k != "*")) => {
            let mut map = map.clone();
            for (key, item) in map.iter_mut() {
                *item = resolve_node(item, &below(lines, key.as_str()), value, shell)?;
            }
            Ok(Node::Mapping(map))
        }
        Node::Sequence(seq) if lines.iter().any(|p| p.first() == Some(&"*")) => {
            let mut seq = seq.clone();
            let each = below(lines, "*");
            for item in seq.iter_mut() {
                *item = resolve_node(item, &each, value, shell)?;
            }
            Ok(Node::Sequence(seq))
        }
        _ => reference::substitute_node(node, value).map_err(ResolveError::Missing),
    }
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

/// The references `${{ steps.NAME.outputs.KEY }}` in the tool's keys, `env` and `revert`; a
/// malformed one is a located problem.
pub(super) fn step_references(checker: &mut Checker<'_>, map: &yaml::MappingNode, own_node: &Node) -> Vec<Located> {
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

/// An edge that a reference made, by (consumer, producer), at the reference.
pub(super) type ImplicitNeeds = HashMap<(usize, usize), Span>;

/// Each reference names another step (of those `written`) and is an implicit `needs` on it:
/// those edges between parsed steps, and whether every reference was fine.
pub(super) fn check_references(
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

/// Each step's references to other steps taken into its `refs` (each once) and its `needs`: a
/// reference is an implicit `needs`. One to the step itself or to no parsed step is left out
/// (reported by [`check_references`]).
pub(super) fn add_implicit_needs(
    steps: &mut [Step],
    ref_spans: Vec<Vec<Located>>,
    first_by_name: &HashMap<String, usize>,
) {
    for (step, located) in steps.iter_mut().zip(ref_spans) {
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
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rdeploy_adapters::ToolSpec;

    use super::ResolveError;
    use crate::reference::Reference;
    use crate::stack::parse;

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

    /// A shell step's lines (its `run` and `check`, and those of each sub-change) get a
    /// reference's value through the environment, never in their text; its other keys, and a
    /// reader's copy of its lines, get the value itself.
    #[test]
    fn shell_lines_take_references_through_the_environment() {
        let text = "name: s\nsteps:\n  - name: db\n    tool: shell\n    sub_changes:\n      - { name: a, run: x }\n  - name: app\n    tool: shell\n    dir: \"${{ steps.db.outputs.n }}\"\n    sub_changes:\n      - name: m\n        run: echo ${{ steps.db.outputs.n }}\n        check: test -f '${{ steps.db.outputs.n }}'\n";
        let stack = parse(Path::new("stack.yaml"), text).unwrap();
        let app = stack.step("app").unwrap();
        let value = |_: &Reference| Some("7$(touch PWNED)".to_string());
        let resolved = app.resolve(&value).unwrap();
        let ToolSpec::Shell(shell) = &resolved.spec else { panic!("shell") };
        let sub = &shell.sub_changes.as_ref().unwrap()[0];
        assert_eq!(sub.run, "echo \"${RDEPLOY_REF_0_db_n}\"");
        assert_eq!(sub.check.as_deref(), Some("test -f ''\"${RDEPLOY_REF_0_db_n}\"''"));
        assert_eq!(shell.dir.as_deref(), Some(Path::new("7$(touch PWNED)")));
        assert_eq!(resolved.env["RDEPLOY_REF_0_db_n"], "7$(touch PWNED)");

        let read = app.resolve_for_reading(&value).unwrap();
        let ToolSpec::Shell(shell) = &read.spec else { panic!("shell") };
        assert_eq!(shell.sub_changes.as_ref().unwrap()[0].run, "echo 7$(touch PWNED)");
        assert!(!read.env.contains_key("RDEPLOY_REF_0_db_n"));
    }
}

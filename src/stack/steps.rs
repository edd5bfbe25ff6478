//! The steps: each one's tool, its keys split into the common ones and the tool's own and
//! decoded with every problem located, and the checks of one step's own values. The checks
//! between steps are in `graph` and `references`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdeploy_adapters::yaml::{self, Node, ScalarNode, Span, Spanned};
use rdeploy_adapters::{suggest, Adapter, Tool, ToolSpec};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::base::{parse_duration_at, quoted, tool_list, Checker, COMMON_KEYS, FLEET_KEYS, TIMEOUT_BOUNDS};
use super::decode::{decode_each, locate, Place};
use super::fleet::{check_fleet, check_fleet_step, FleetKeys, RolloutKeys};
use super::gates::{check_gate, RawGate};
use super::references::step_references;
use super::retry::{check_retry, RetryKeys};
use super::step::{build_spec, Phase, Step};
use super::values::{read_env, read_typed_values};
use crate::reference::Located;

/// The steps read, with where their names, `needs`, phases and references are written, for
/// the checks between steps.
pub(super) struct Read {
    pub(super) steps: Vec<Step>,
    pub(super) name_spans: Vec<(String, Span)>,
    /// Each name's first step, so that checking names and `needs` stays linear in the steps
    /// (a 100,000-step stack was quadratic here).
    pub(super) first_by_name: HashMap<String, usize>,
    pub(super) needs_spans: Vec<Vec<Spanned<String>>>,
    pub(super) phase_spans: Vec<Option<Span>>,
    pub(super) ref_spans: Vec<Vec<Located>>,
}

/// Reads every step that can be read (each one's problems reported), and names used twice.
pub(super) fn read_steps(
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
    let mut ref_spans: Vec<Vec<Located>> = Vec::new();
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
        if COMMON_KEYS.contains(&k) || (tool.runs_per_cluster() && FLEET_KEYS.contains(&k)) {
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

/// A step read, with where its name, `needs`, phase and references are written.
type ParsedStep = (Step, Span, Vec<Spanned<String>>, Option<Span>, Vec<Located>);

/// Reads one step: its tool, its keys split and decoded (every value that does not fit
/// reported), and the checks of its own values. `None` when no step can be made of it (its
/// problems are reported).
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

    let Split { mut common, own, guessed } = split_keys(checker, map, tool);
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
    check_step_name(checker, &keys.name);
    let env = {
        let mut env = std::mem::take(&mut keys.env);
        env.extend(env_plain);
        env
    };
    check_spec(checker, dir, &name, &spec, &env, &own_node, map.span());
    let timeout = keys.timeout.as_ref().and_then(|t| parse_duration_at(checker, "timeout", t, TIMEOUT_BOUNDS));
    let retry = keys.retry.as_ref().and_then(|r| check_retry(checker, r));
    let phase = keys.phase.as_ref().and_then(|p| read_phase(checker, p));
    let resumable = read_resumable(checker, &name, keys.resumable, &spec, map);
    let fleet_keys = FleetKeys {
        contexts: keys.contexts.take(),
        fleet: keys.fleet.take(),
        selector: keys.selector.take(),
        rollout: keys.rollout.take(),
        slo: keys.slo.take(),
    };
    let fleet = check_fleet(checker, dir, fleet_keys, map.span());
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

/// A step's name is a checkpoint key and part of file names: letters, digits, `-` and `_`.
fn check_step_name(checker: &mut Checker<'_>, name: &Spanned<String>) {
    let text = name.as_str();
    if text.is_empty() || !text.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        checker.at(
            name.span(),
            format!("step name `{text}` may only use letters, digits, `-` and `_`"),
            Some("the name is used in file names and commands".into()),
        );
    }
}

/// `phase:`, else a located problem.
fn read_phase(checker: &mut Checker<'_>, phase: &Spanned<String>) -> Option<Phase> {
    match phase.as_str() {
        "expand" => Some(Phase::Expand),
        "migrate" => Some(Phase::Migrate),
        "contract" => Some(Phase::Contract),
        other => {
            let hint = suggest(other, &["expand", "migrate", "contract"]).map(|s| format!("did you mean `{s}`?"));
            checker.at(phase.span(), format!("`phase` is `expand`, `migrate` or `contract`, not `{other}`"), hint);
            None
        }
    }
}

/// `resumable:`, else what the tool's spec says; a step its tool cannot resume is a located
/// problem when the stack says it is resumable.
fn read_resumable(
    checker: &mut Checker<'_>,
    name: &str,
    written: Option<bool>,
    spec: &ToolSpec,
    map: &yaml::MappingNode,
) -> bool {
    let resumable = written.unwrap_or_else(|| spec.default_resumable());
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
    resumable
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::stack::{parse, problems};

    /// A missing `./x` is reported at the path looked for, without a doubled `./`.
    #[test]
    fn a_missing_dot_slash_path_is_reported_once_dotted() {
        let text =
            "name: s\nsteps:\n  - name: web\n    tool: helm\n    release: web\n    chart: ./no-such-chart-dir/nginx\n";
        let messages: Vec<String> = problems(text).into_iter().map(|p| p.message).collect();
        let missing = messages.iter().find(|m| m.contains("does not exist")).expect("a missing path");
        assert!(missing.contains("(looked for ./no-such-chart-dir/nginx)"), "{missing}");
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
    fn missing_dir_and_exclusive_keys() {
        let p = problems("name: s\nsteps:\n  - name: a\n    tool: shell\n    dir: nowhere\n    run: x\n  - name: b\n    tool: shell\n");
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].line, p[0].column), (5, 10));
        assert!(p[0].message.contains("`nowhere` does not exist"));
        assert_eq!(p[1].line, 7);
        assert!(p[1].message.contains("needs `run` or `sub_changes`"));
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

    /// A packaged chart written as a path (`./web-0.1.0.tgz`) may be made by an earlier step
    /// (`helm package`), as a bare `web-0.1.0.tgz` may: the stack loads without it. A chart
    /// directory written as a path must be there.
    #[test]
    fn a_packaged_chart_path_an_earlier_step_makes_is_no_problem() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("stack.yaml");
        let stack = |chart: &str| {
            format!("name: s\nsteps:\n  - name: pack\n    tool: shell\n    run: helm package ./web\n  - name: web\n    tool: helm\n    needs: [pack]\n    release: web\n    chart: {chart}\n")
        };
        for chart in ["web-0.1.0.tgz", "./web-0.1.0.tgz", "./dist/web-0.1.0.tgz"] {
            assert!(parse(&file, &stack(chart)).is_ok(), "{chart}");
        }
        let p = parse(&file, &stack("./web")).unwrap_err().problems;
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].message.starts_with("step `web`: `./web` does not exist"), "{p:?}");
    }
}

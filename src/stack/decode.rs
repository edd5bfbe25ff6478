//! serde's errors made located problems: a step's keys decoded one key at a time, so that
//! every value that does not fit is reported, at its line, with a did-you-mean.

use rdeploy_adapters::suggest;
use rdeploy_adapters::yaml::{self, Node, Span};
use rdeploy_adapters::{FieldPath, PathSegment};

use super::base::Checker;

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
    pub(super) fallback: &'a Span,
    pub(super) keys: &'a [&'a str],
    pub(super) step: Option<&'a str>,
    /// Keys read in place of a misspelt one: a value that does not fit the key guessed is not
    /// reported (the misspelling is), only left out.
    pub(super) guessed: &'a [&'a str],
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rdeploy_adapters::ToolSpec;

    use crate::stack::{parse, problems};

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
}

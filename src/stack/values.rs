//! A value in a tool key or `env` as written: plain data, or one of the three secret forms.

use super::*;

/// A value in a tool key or `env`, as written.
pub(super) enum Written {
    Plain(serde_json::Value),
    Secret(Marked),
}

/// The keys of the three secret forms.
pub(super) const SECRET_FORM_KEYS: &[&str] = &["from_env", "from_file", "value", "secret"];

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
pub(super) fn read_value(checker: &mut Checker<'_>, tool_key: &str, key: &str, node: &Node) -> Option<Written> {
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
pub(super) fn nested_reference(node: &Node, top: bool) -> Option<Span> {
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

//! Values as a step writes them in `env` and in its tool's typed key (helm `set`, ansible
//! `extra_vars`, terraform `vars`): plain, keeping their YAML type, or marked secret by one of
//! the three forms (`{ from_env: NAME }`, `{ from_file: PATH }`, `{ value: V, secret: true }`).

use std::collections::BTreeMap;

use rdeploy_adapters::secrets::Marked;
use rdeploy_adapters::yaml::{self, Node, Span};
use rdeploy_adapters::{suggest, Adapter, ToolSpec};

use super::base::Checker;

/// The `env` entries that are secret references, taken out of `common` and read here (serde
/// wants strings), and the other mappings read as plain text: (secret, plain) entries.
pub(super) fn read_env(
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
pub(super) fn read_typed_values(checker: &mut Checker<'_>, spec: &mut ToolSpec, own_node: &Node) {
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rdeploy_adapters::ToolSpec;

    use crate::stack::{parse, problems};

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
}

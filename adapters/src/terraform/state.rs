//! `terraform show -json` read into what recovery needs: which resource instances are in state
//! and which are tainted, and the values of sensitive variables in a saved plan.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One resource instance in state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InState {
    pub tainted: bool,
}

#[derive(Deserialize)]
struct Show {
    values: Option<Values>,
}

#[derive(Deserialize)]
struct Values {
    root_module: Option<Module>,
}

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    resources: Vec<Resource>,
    #[serde(default)]
    child_modules: Vec<Module>,
}

#[derive(Deserialize)]
struct Resource {
    address: String,
    #[serde(default)]
    tainted: bool,
}

/// Every resource instance in a `show -json` state document, by address. An empty state
/// (`{"format_version":"1.0"}`) has no `values` at all and yields an empty map.
pub fn parse_state(json: &str) -> Result<BTreeMap<String, InState>, serde_json::Error> {
    let show: Show = serde_json::from_str(json)?;
    let mut out = BTreeMap::new();
    fn walk(module: &Module, out: &mut BTreeMap<String, InState>) {
        for r in &module.resources {
            out.insert(r.address.clone(), InState { tainted: r.tainted });
        }
        for child in &module.child_modules {
            walk(child, out);
        }
    }
    if let Some(root) = show.values.and_then(|v| v.root_module) {
        walk(&root, &mut out);
    }
    Ok(out)
}

/// The string values of root variables declared `sensitive` in a `show -json <plan>` document,
/// whatever set them (`-var`, a var file, `TF_VAR_*`), so they can be redacted from output.
pub fn sensitive_values(plan_json: &str) -> Result<Vec<String>, serde_json::Error> {
    let doc: serde_json::Value = serde_json::from_str(plan_json)?;
    let declared = &doc["configuration"]["root_module"]["variables"];
    let mut out = Vec::new();
    if let Some(declared) = declared.as_object() {
        for (name, decl) in declared {
            if decl["sensitive"].as_bool() == Some(true) {
                collect_strings(&doc["variables"][name]["value"], &mut out);
            }
        }
    }
    Ok(out)
}

fn collect_strings(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        serde_json::Value::Object(map) => map.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(name: &str) -> String {
        std::fs::read_to_string(format!("{}/../fixtures/terraform/captured/{name}", env!("CARGO_MANIFEST_DIR")))
            .unwrap()
    }

    #[test]
    fn finds_tainted_instances_with_for_each_keys() {
        let state = parse_state(&captured("independent-show-state.json")).unwrap();
        assert_eq!(state.len(), 5);
        assert!(state[r#"terraform_data.svc["a"]"#].tainted);
        assert!(state[r#"terraform_data.svc["c"]"#].tainted);
        assert!(!state[r#"terraform_data.svc["b"]"#].tainted);
    }

    #[test]
    fn walks_nested_child_modules() {
        let state = parse_state(&captured("modules-show-state.json")).unwrap();
        assert!(state[r#"module.svc["api"].terraform_data.node[1]"#].tainted);
        assert!(!state[r#"module.svc["web"].terraform_data.node[0]"#].tainted);
        assert!(state.keys().all(|a| a.starts_with("module.svc[")));
    }

    #[test]
    fn an_empty_state_has_no_resources() {
        assert!(parse_state(r#"{"format_version":"1.0"}"#).unwrap().is_empty());
    }

    #[test]
    fn only_sensitive_variables_are_collected() {
        let plan = r#"{"variables":{"token":{"value":"s3cr3t"},"region":{"value":"eu"},"keys":{"value":["k1",{"x":"k2"}]}},
            "configuration":{"root_module":{"variables":{"token":{"sensitive":true},"region":{},"keys":{"sensitive":true}}}}}"#;
        let mut values = sensitive_values(plan).unwrap();
        values.sort();
        assert_eq!(values, vec!["k1", "k2", "s3cr3t"]);
        let captured = sensitive_values(&captured("chain-recover-show-plan.json")).unwrap();
        assert!(captured.is_empty());
    }
}

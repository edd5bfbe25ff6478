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

/// The resource instances a saved plan changes, from `show -json <plan>`'s `resource_changes`,
/// in the words of the streamed plan (`create`, `update`, `replace`, `delete`, `move`,
/// `import`, `remove`); reads and no-ops are left out, as [`super::events::PlanReport`] does.
pub fn planned_changes(plan_json: &str) -> Result<Vec<super::events::PlannedChange>, serde_json::Error> {
    let doc: serde_json::Value = serde_json::from_str(plan_json)?;
    let mut out = Vec::new();
    for change in doc["resource_changes"].as_array().into_iter().flatten() {
        let Some(addr) = change["address"].as_str() else { continue };
        let previous = change["previous_address"].as_str().map(str::to_string);
        let actions: Vec<&str> =
            change["change"]["actions"].as_array().into_iter().flatten().filter_map(|a| a.as_str()).collect();
        let action = match actions.as_slice() {
            ["create"] => "create",
            ["update"] => "update",
            ["delete"] => "delete",
            ["delete", "create"] | ["create", "delete"] => "replace",
            ["forget"] => "remove",
            ["no-op"] if previous.is_some() => "move",
            ["no-op"] if !change["change"]["importing"].is_null() => "import",
            _ => continue,
        };
        let reason = change["action_reason"].as_str().map(|r| {
            let r = r.strip_prefix("replace_because_").unwrap_or(r);
            if r == "replace_by_request" {
                "requested".to_string()
            } else {
                r.to_string()
            }
        });
        out.push(super::events::PlannedChange { addr: addr.to_string(), action: action.to_string(), reason, previous });
    }
    Ok(out)
}

/// The serial and lineage of a state document (`terraform state pull`), as one value a saved
/// plan can compare: `serial 4, lineage 5c1e...`; `absent` for no state yet.
pub fn state_identity(pulled: &str) -> Result<String, serde_json::Error> {
    if pulled.trim().is_empty() {
        return Ok("absent".into());
    }
    let doc: serde_json::Value = serde_json::from_str(pulled)?;
    Ok(format!(
        "serial {}, lineage {}",
        doc["serial"].as_u64().map_or_else(|| "?".to_string(), |s| s.to_string()),
        doc["lineage"].as_str().unwrap_or("?")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(name: &str) -> String {
        std::fs::read_to_string(format!("{}/../fixtures/terraform/captured/{name}", env!("CARGO_MANIFEST_DIR")))
            .unwrap()
    }

    #[test]
    fn reads_a_saved_plans_changes_and_a_states_identity() {
        let doc = r#"{"resource_changes":[
            {"address":"terraform_data.a","change":{"actions":["create"]}},
            {"address":"terraform_data.b","change":{"actions":["delete","create"]},"action_reason":"replace_because_tainted"},
            {"address":"terraform_data.c","change":{"actions":["no-op"]}},
            {"address":"terraform_data.d","previous_address":"terraform_data.old","change":{"actions":["no-op"]}},
            {"address":"data.x.y","change":{"actions":["read"]}}]}"#;
        let changes = planned_changes(doc).unwrap();
        let words: Vec<(&str, &str)> = changes.iter().map(|c| (c.addr.as_str(), c.action.as_str())).collect();
        assert_eq!(
            words,
            [("terraform_data.a", "create"), ("terraform_data.b", "replace"), ("terraform_data.d", "move")]
        );
        assert_eq!(changes[1].reason.as_deref(), Some("tainted"));
        assert_eq!(state_identity("").unwrap(), "absent");
        assert_eq!(state_identity(r#"{"serial":4,"lineage":"abc"}"#).unwrap(), "serial 4, lineage abc");
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

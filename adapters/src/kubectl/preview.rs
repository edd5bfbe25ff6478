//! `rdeploy plan` for a kubectl step: `kubectl diff` (server-side when the step applies
//! server-side) over every object of the manifests, split per object into missing, differs or
//! unchanged, each with its diff; then the resourceVersion of every object the diff read, so a
//! saved plan knows when one was edited in the cluster.

use std::collections::HashMap;

use super::manifest::KubeObject;
use super::output::{clean_error, is_error_line};
use super::{stage, KubectlSpec, QUICK};
use crate::preview::{PlanAction, PlanItem, Preview, PreviewError};
use crate::process::{capture, Captured, StdoutLog};
use crate::{Failure, StepContext};

/// The namespace of kubectl's `Error from server (NotFound): namespaces "shop" not found`.
pub fn missing_namespace(line: &str) -> Option<String> {
    let rest = line.split("namespaces \"").nth(1)?;
    let (name, tail) = rest.split_once('"')?;
    tail.trim_start().starts_with("not found").then(|| name.to_string())
}

/// One object's part of a `kubectl diff` output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectDiff {
    /// The file name kubectl gives the object: `v1.ConfigMap.shop.settings` ([`KubeObject::diff_name`]).
    pub name: String,
    /// The live side is empty: the object does not exist.
    pub missing: bool,
    /// The unified diff, its `---`/`+++` headers naming `live` and `wanted` instead of
    /// kubectl's temporary files.
    pub text: String,
}

/// Splits `kubectl diff` output (`diff -u -N LIVE/x MERGED/x` sections) per object.
pub fn split_diff(lines: &[String]) -> Vec<ObjectDiff> {
    let mut diffs: Vec<ObjectDiff> = Vec::new();
    let mut awaiting_hunk = false;
    for line in lines {
        if let Some(rest) = line.strip_prefix("diff ") {
            let path = rest.split_whitespace().last().unwrap_or(rest);
            let name = path.rsplit('/').next().unwrap_or(path).to_string();
            diffs.push(ObjectDiff { name, missing: false, text: String::new() });
            awaiting_hunk = true;
            continue;
        }
        let Some(current) = diffs.last_mut() else { continue };
        if awaiting_hunk && line.starts_with("--- ") {
            current.text.push_str(&format!("--- live/{}\n", current.name));
        } else if awaiting_hunk && line.starts_with("+++ ") {
            current.text.push_str(&format!("+++ wanted/{}\n", current.name));
        } else {
            if awaiting_hunk && line.starts_with("@@") {
                current.missing = line.starts_with("@@ -0,0 ");
                awaiting_hunk = false;
            }
            current.text.push_str(line);
            current.text.push('\n');
        }
    }
    diffs
}

impl KubectlSpec {
    pub(super) async fn preview_objects(&self, ctx: &StepContext) -> Result<Preview, PreviewError> {
        let binary = self.resolve_binary(ctx)?;
        let objects = self.objects(ctx, &binary).await?;
        let mut preview = Preview::default();
        // An object whose namespace does not exist yet (an earlier step creates it) is missing;
        // kubectl stops the whole diff at the first one, so those leave and the rest is diffed.
        let mut absent_namespaces: Vec<String> = Vec::new();
        let diffs = loop {
            let selected: Vec<usize> = (0..objects.len())
                .filter(|&i| objects[i].namespace.as_ref().is_none_or(|ns| !absent_namespaces.contains(ns)))
                .collect();
            if selected.is_empty() {
                break Some(Vec::new());
            }
            let dir = stage(ctx, "plan", &objects, &selected)?;
            let mut cmd = self.command(ctx, &binary).arg("diff");
            if self.server_side() {
                cmd = cmd.arg("--server-side");
            }
            let cmd = cmd.arg("-f").arg(&dir);
            let Captured { outcome, stdout, stderr } =
                capture(&cmd, ctx, Some(ctx.timeout.unwrap_or(QUICK)), None, StdoutLog::Lines)
                    .await
                    .map_err(Failure::from)?;
            if outcome.interrupted {
                return Err(Failure::from_process(&cmd.display(), &outcome).into());
            }
            // kubectl diff: 0 no differences, 1 differences, anything else an error.
            match outcome.code {
                Some(0) if !outcome.timed_out => break Some(Vec::new()),
                Some(1) if !outcome.timed_out => break Some(split_diff(&stdout)),
                _ => {}
            }
            let missing: Vec<String> = stderr.iter().filter_map(|l| missing_namespace(l)).collect();
            if !missing.is_empty() && missing.iter().all(|ns| !absent_namespaces.contains(ns)) {
                absent_namespaces.extend(missing);
                continue;
            }
            let error = stderr
                .iter()
                .rev()
                .find(|l| is_error_line(l))
                .map(|l| clean_error(l))
                .unwrap_or_else(|| format!("`kubectl diff` {}", outcome.describe_status()));
            preview.notes.push(format!("`{}` failed: {error}", cmd.display()));
            break None;
        };
        let Some(diffs) = diffs else {
            for object in &objects {
                preview.items.push(PlanItem::new(object.id(), PlanAction::Unknown).because("`kubectl diff` failed"));
            }
            return Ok(preview);
        };
        let by_name: HashMap<&str, &ObjectDiff> = diffs.iter().map(|d| (d.name.as_str(), d)).collect();
        for object in &objects {
            let namespace_absent = object.namespace.as_ref().filter(|ns| absent_namespaces.contains(ns));
            let item = match (namespace_absent, by_name.get(object.diff_name().as_str())) {
                (Some(ns), _) => PlanItem::new(object.id(), PlanAction::Create)
                    .because(format!("missing: namespace {ns} does not exist yet")),
                (None, Some(d)) if d.missing => {
                    PlanItem { diff: Some(d.text.clone()), ..PlanItem::new(object.id(), PlanAction::Create) }
                        .because("missing")
                }
                (None, Some(d)) => {
                    PlanItem { diff: Some(d.text.clone()), ..PlanItem::new(object.id(), PlanAction::Update) }
                        .because("differs")
                }
                (None, None) => PlanItem::new(object.id(), PlanAction::Unchanged),
            };
            preview.items.push(item);
        }
        let all: Vec<usize> = (0..objects.len()).collect();
        let dir = stage(ctx, "plan", &objects, &all)?;
        let count = |action| preview.items.iter().filter(|i| i.action == action).count();
        preview.summary = Some(format!(
            "{} missing, {} differ, {} unchanged",
            count(PlanAction::Create),
            count(PlanAction::Update),
            count(PlanAction::Unchanged)
        ));
        self.observe_versions(ctx, &binary, &objects, &dir, &mut preview).await;
        Ok(preview)
    }

    /// The resourceVersion of every object, read with `kubectl get` (absent ones as `absent`).
    async fn observe_versions(
        &self,
        ctx: &StepContext,
        binary: &std::path::Path,
        objects: &[KubeObject],
        dir: &std::path::Path,
        preview: &mut Preview,
    ) {
        let cmd = self.command(ctx, binary).args(["get", "--ignore-not-found", "-o", "json", "-f"]).arg(dir);
        let versions = match capture(&cmd, ctx, Some(QUICK), None, StdoutLog::UnlessJson).await {
            Ok(Captured { outcome, stdout, .. }) if outcome.success() => resource_versions(&stdout.join("\n")),
            Ok(Captured { outcome, stderr, .. }) => {
                let why = stderr.last().cloned().unwrap_or_else(|| outcome.describe_status());
                preview
                    .notes
                    .push(format!("could not read the objects' resourceVersions (`{}`: {why})", cmd.display()));
                return;
            }
            Err(e) => {
                preview.notes.push(format!("could not read the objects' resourceVersions: {e}"));
                return;
            }
        };
        for object in objects {
            let key = (object.kind.clone(), object.namespace.clone(), object.name.clone());
            let value = versions.get(&key).cloned().unwrap_or_else(|| "absent".into());
            preview.observe(format!("resourceVersion of {}", object.id()), value);
        }
    }
}

pub type ObjectKey = (String, Option<String>, String);

/// `(kind, namespace, name) -> object` from `kubectl get -o json` (an object or a List).
pub fn objects_by_key(json: &str) -> HashMap<ObjectKey, serde_json::Value> {
    let mut found = HashMap::new();
    // `--ignore-not-found` with nothing found prints nothing at all.
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else { return found };
    let items = match value.get("items").and_then(|i| i.as_array()) {
        Some(items) => items.clone(),
        None => vec![value],
    };
    for item in items {
        let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_string);
        let meta = item.get("metadata");
        let (Some(kind), Some(name)) = (text(item.get("kind")), text(meta.and_then(|m| m.get("name")))) else {
            continue;
        };
        let namespace = text(meta.and_then(|m| m.get("namespace")));
        found.insert((kind, namespace, name), item);
    }
    found
}

/// `(kind, namespace, name) -> resourceVersion` from `kubectl get -o json`.
pub fn resource_versions(json: &str) -> HashMap<ObjectKey, String> {
    objects_by_key(json)
        .into_iter()
        .filter_map(|(key, object)| {
            object.pointer("/metadata/resourceVersion").and_then(|v| v.as_str()).map(|v| (key, v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(name: &str) -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/kubectl/captured").join(name);
        std::fs::read_to_string(&path).unwrap().lines().map(str::to_string).collect()
    }

    #[test]
    fn splits_a_captured_diff_per_object_with_stable_headers() {
        let diffs = split_diff(&captured("diff-drift-and-missing.stdout"));
        let names: Vec<(&str, bool)> = diffs.iter().map(|d| (d.name.as_str(), d.missing)).collect();
        assert_eq!(names, [("v1.ConfigMap.shop-extra.extra", true), ("v1.ConfigMap.shop.settings", false)]);
        let settings = &diffs[1].text;
        assert!(
            settings.starts_with("--- live/v1.ConfigMap.shop.settings\n+++ wanted/v1.ConfigMap.shop.settings\n@@ "),
            "{settings}"
        );
        assert!(settings.contains("-  color: red\n+  color: blue\n"), "{settings}");
        assert!(!settings.contains("/tmp/"), "kubectl's temporary paths are not shown: {settings}");
        assert!(!diffs[0].text.contains("color"), "each object keeps only its own section");
    }

    #[test]
    fn names_the_namespace_a_captured_diff_did_not_find() {
        let stderr = captured("diff-error.stderr");
        assert_eq!(stderr.iter().filter_map(|l| missing_namespace(l)).collect::<Vec<_>>(), ["shop-extra"]);
        assert_eq!(missing_namespace("Error from server (NotFound): configmaps \"a\" not found"), None);
    }

    #[test]
    fn reads_resource_versions_from_a_list_and_a_single_object() {
        let list = r#"{"kind":"List","items":[
            {"kind":"ConfigMap","metadata":{"name":"a","namespace":"shop","resourceVersion":"12"}},
            {"kind":"Namespace","metadata":{"name":"shop","resourceVersion":"3"}}]}"#;
        let found = resource_versions(list);
        assert_eq!(found.get(&("ConfigMap".into(), Some("shop".into()), "a".into())).map(String::as_str), Some("12"));
        assert_eq!(found.get(&("Namespace".into(), None, "shop".into())).map(String::as_str), Some("3"));
        let one = r#"{"kind":"ConfigMap","metadata":{"name":"b","namespace":"x","resourceVersion":"7"}}"#;
        assert_eq!(resource_versions(one).len(), 1);
        assert!(resource_versions("").is_empty(), "nothing found prints nothing");
    }
}

//! Parsers for kubectl's text output, pinned to captured real output in
//! `fixtures/kubectl/captured/`: apply's per-object result lines, its per-object errors on
//! stderr, `kubectl diff`'s file headers, and rollout status.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;

use super::manifest::KubeObject;

/// What `kubectl apply` said about one object on stdout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyResult {
    /// `deployment.apps/web`
    pub printed: String,
    /// `created`, `configured`, `unchanged` or `serverside-applied`
    pub verb: String,
}

static APPLY_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(\S+/\S+) (created|configured|unchanged|serverside-applied)(?: \((?:server )?dry run\))?$")
        .expect("valid regex")
});

/// `deployment.apps/web configured` -> the result; anything else -> `None`.
pub fn parse_apply_line(line: &str) -> Option<ApplyResult> {
    let caps = APPLY_LINE.captures(line.trim_end())?;
    Some(ApplyResult { printed: caps[1].to_string(), verb: caps[2].to_string() })
}

/// Matches result lines to objects, in order: kubectl applies objects in the order it reads
/// them, and its lines carry no namespace, so two `configmap/a` in different namespaces are
/// told apart by order. Returns the index of each object that succeeded, with its verb.
pub fn match_results(objects: &[&KubeObject], results: &[ApplyResult]) -> HashMap<usize, String> {
    let mut matched = HashMap::new();
    for result in results {
        if let Some(i) =
            (0..objects.len()).find(|i| !matched.contains_key(i) && objects[*i].printed_name() == result.printed)
        {
            matched.insert(i, result.verb.clone());
        }
    }
    matched
}

/// Whether a stderr line is one of kubectl's error lines (not a warning or klog chatter).
pub fn is_error_line(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("Error from server")
        || line.starts_with("error:")
        || line.starts_with("Error:")
        || line.starts_with("error when")
}

/// Gives each failed object the error line that names it. kubectl names the file in
/// client-side errors (`error when creating "…/0004.json": …`), the object in validation
/// errors (`ConfigMap "a2" is invalid`), and only the namespace when it is missing. What is
/// left over goes to the one failed object left, or is shared.
pub fn attribute_errors(failed: &[(&KubeObject, String)], error_lines: &[String]) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = HashMap::new();
    let mut unused: Vec<&String> = Vec::new();
    for line in error_lines {
        let by_file: Vec<&KubeObject> = failed
            .iter()
            .filter(|(_, file)| line.contains(&format!("/{file}\"")) || line.contains(&format!("\"{file}\"")))
            .map(|(o, _)| *o)
            .collect();
        let by_name: Vec<&KubeObject> = if by_file.is_empty() {
            failed
                .iter()
                .filter(|(o, _)| line.contains(&format!("{} \"{}\"", o.kind, o.name)))
                .map(|(o, _)| *o)
                .collect()
        } else {
            by_file
        };
        let targets: Vec<&KubeObject> = if by_name.is_empty() {
            match missing_namespace(line) {
                Some(ns) => {
                    failed.iter().filter(|(o, _)| o.namespace.as_deref() == Some(ns)).map(|(o, _)| *o).collect()
                }
                None => Vec::new(),
            }
        } else {
            by_name
        };
        if targets.is_empty() {
            unused.push(line);
        }
        for o in targets {
            out.entry(o.id()).or_insert_with(|| clean_error(line));
        }
    }
    let left: Vec<&KubeObject> = failed.iter().map(|(o, _)| *o).filter(|o| !out.contains_key(&o.id())).collect();
    if left.len() == 1 && unused.len() == 1 {
        out.insert(left[0].id(), clean_error(unused[0]));
    } else {
        let shared = match unused.first() {
            Some(line) => format!("not applied; kubectl said: {}", clean_error(line)),
            None => "not applied: kubectl printed no result for it".to_string(),
        };
        for o in left {
            out.insert(o.id(), shared.clone());
        }
    }
    out
}

/// `namespaces "x" not found` -> `x`.
fn missing_namespace(line: &str) -> Option<&str> {
    let rest = line.split("namespaces \"").nth(1)?;
    let (ns, tail) = rest.split_once('"')?;
    tail.trim_start().starts_with("not found").then_some(ns)
}

/// Drops the file path kubectl adds (`error when creating "/state/…/0004.json": `): it is
/// rdeploy's scratch copy, not the operator's manifest.
pub fn clean_error(line: &str) -> String {
    static SOURCE: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r#"error when (\w[\w -]*?) "[^"]*": "#).expect("valid regex"));
    SOURCE.replace(line.trim(), "error when $1: ").into_owned()
}

/// One object `kubectl diff` printed, by its diff file name (see [`KubeObject::diff_name`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiffEntry {
    pub name: String,
    /// The live side was empty: the object does not exist.
    pub missing: bool,
}

/// The objects in a `kubectl diff` unified diff: `diff -u -N LIVE/x MERGED/x` headers, and
/// whether the first hunk starts from nothing (`@@ -0,0 …`).
pub fn parse_diff(lines: &[String]) -> Vec<DiffEntry> {
    let mut entries: Vec<DiffEntry> = Vec::new();
    let mut awaiting_hunk = false;
    for line in lines {
        if let Some(rest) = line.strip_prefix("diff ") {
            let Some(path) = rest.split_whitespace().last() else { continue };
            let name = path.rsplit('/').next().unwrap_or(path).to_string();
            entries.push(DiffEntry { name, missing: false });
            awaiting_hunk = true;
        } else if awaiting_hunk && line.starts_with("@@") {
            if let Some(last) = entries.last_mut() {
                last.missing = line.starts_with("@@ -0,0 ");
            }
            awaiting_hunk = false;
        }
    }
    entries
}

/// The line of `rollout status` output that shows how far a rollout got.
pub fn rollout_progress(stdout: &[String]) -> Option<&str> {
    stdout.iter().rev().map(|l| l.trim()).find(|l| l.starts_with("Waiting for") || l.contains("rolled out"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::kubectl::manifest::{objects_from_documents, parse_documents, CrdScopes};

    fn captured(name: &str) -> Vec<String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/kubectl/captured").join(name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn app() -> Vec<KubeObject> {
        let text = include_str!("../../../fixtures/kubectl/app/app.yaml");
        objects_from_documents(parse_documents(text).unwrap(), Path::new("app.yaml"), "default", &CrdScopes::default())
            .unwrap()
    }

    #[test]
    fn apply_lines_of_a_partial_apply() {
        let results: Vec<ApplyResult> =
            captured("apply-missing-namespace.stdout").iter().filter_map(|l| parse_apply_line(l)).collect();
        assert_eq!(results.len(), 4);
        assert_eq!(results[2], ApplyResult { printed: "deployment.apps/web".into(), verb: "created".into() });
        let objs = app();
        let refs: Vec<&KubeObject> = objs.iter().collect();
        let matched = match_results(&refs, &results);
        assert_eq!(matched.len(), 4);
        assert!(!matched.contains_key(&4));

        let errors: Vec<String> =
            captured("apply-missing-namespace.stderr").into_iter().filter(|l| is_error_line(l)).collect();
        let failed = vec![(&objs[4], "0005.json".to_string())];
        let attributed = attribute_errors(&failed, &errors);
        assert_eq!(
            attributed["ConfigMap/shop-extra/extra"],
            r#"Error from server (NotFound): error when creating: namespaces "shop-extra" not found"#
        );
    }

    #[test]
    fn server_side_lines_and_errors_without_a_file() {
        let results: Vec<ApplyResult> =
            captured("apply-server-side-missing-namespace.stdout").iter().filter_map(|l| parse_apply_line(l)).collect();
        assert!(results.iter().all(|r| r.verb == "serverside-applied"), "{results:?}");
        let objs = app();
        let errors: Vec<String> =
            captured("apply-server-side-missing-namespace.stderr").into_iter().filter(|l| is_error_line(l)).collect();
        let attributed = attribute_errors(&[(&objs[4], "0005.json".to_string())], &errors);
        assert_eq!(
            attributed["ConfigMap/shop-extra/extra"],
            r#"Error from server (NotFound): namespaces "shop-extra" not found"#
        );
    }

    #[test]
    fn invalid_objects_are_named_by_kind_and_name() {
        let errors: Vec<String> = captured("apply-invalid.stderr").into_iter().filter(|l| is_error_line(l)).collect();
        let docs = parse_documents("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: Bad_Name}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: nope}\n").unwrap();
        let objs = objects_from_documents(docs, Path::new("x.yaml"), "default", &CrdScopes::default()).unwrap();
        // Server-side errors name no file: the object is found by `Kind "name"` or its namespace.
        let failed = vec![(&objs[0], "0001.json".to_string()), (&objs[1], "0002.json".to_string())];
        let attributed = attribute_errors(&failed, &errors);
        assert!(
            attributed["ConfigMap/default/Bad_Name"].contains(r#"ConfigMap "Bad_Name" is invalid"#),
            "{attributed:?}"
        );
        assert!(attributed["ConfigMap/nope/x"].contains(r#"namespaces "nope" not found"#), "{attributed:?}");
    }

    #[test]
    fn unattributable_errors_are_shared() {
        let objs = app();
        let failed = vec![(&objs[1], "0002.json".to_string()), (&objs[2], "0003.json".to_string())];
        let attributed = attribute_errors(&failed, &["error: the server has gone away".to_string()]);
        assert_eq!(attributed["ConfigMap/shop/settings"], "not applied; kubectl said: error: the server has gone away");
        assert_eq!(attributed.len(), 2);
    }

    #[test]
    fn diff_names_missing_and_changed_objects() {
        let entries = parse_diff(&captured("diff-drift-and-missing.stdout"));
        assert_eq!(
            entries,
            vec![
                DiffEntry { name: "v1.ConfigMap.shop-extra.extra".into(), missing: true },
                DiffEntry { name: "v1.ConfigMap.shop.settings".into(), missing: false },
            ]
        );
    }

    #[test]
    fn rollout_progress_line() {
        let out = captured("rollout-broken.stdout");
        assert!(
            rollout_progress(&out).unwrap().starts_with("Waiting for deployment \"canary\" rollout to finish"),
            "{out:?}"
        );
        assert!(captured("rollout-broken.stderr").iter().any(|l| l.contains("timed out waiting for the condition")));
    }

    #[test]
    fn other_lines_are_not_results() {
        assert_eq!(parse_apply_line("Warning: resource configmaps/x is missing the annotation"), None);
        assert_eq!(
            parse_apply_line("configmap/a configured (server dry run)"),
            Some(ApplyResult { printed: "configmap/a".into(), verb: "configured".into() })
        );
        assert!(!is_error_line("W1130 03:47:01.205714   26481 diff.go:723] Object keeps changing"));
    }
}

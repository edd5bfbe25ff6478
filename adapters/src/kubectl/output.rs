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

/// How each of kubectl's error messages begins (cmd/util/helpers.go `checkErr`, cli-runtime's
/// visitor and mapper, apply's `AddSourceToErr`); after an optional `error: ` and, for an
/// aggregate of several, `[`.
const ERROR_START: &str = concat!(
    r#"(?:Error from server|error when |error validating "|error parsing |resource mapping not found for name: "#,
    r#"|unable to recognize "|unable to decode "|The \S+ "[^"]*" is invalid|The request is invalid"#,
    r#"|Unable to connect to the server|The connection to the server |the server doesn't have a resource type "#,
    r#"|error: |Error: )"#
);

static RECORD_START: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!(r"^(?:error: )?\[?{ERROR_START}")).expect("valid regex"));
/// `, ` between two errors of an aggregate (`[e1, e2]`).
static AGGREGATE_SEP: LazyLock<Regex> = LazyLock::new(|| Regex::new(&format!(", {ERROR_START}")).expect("valid regex"));
/// klog's own lines (`W1130 03:47:01.205714   26481 diff.go:723] ...`).
static KLOG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\]").expect("valid regex"));

/// Whether a stderr line begins one of kubectl's error messages (not a warning or klog chatter).
pub fn is_error_line(line: &str) -> bool {
    RECORD_START.is_match(line.trim_start())
}

/// kubectl's error messages on stderr, each whole: a message may span lines (`ensure CRDs are
/// installed first` under a mapping error, `applying patch:` with the patch and `for: "FILE":`
/// under it, the `* field: message` causes of an Invalid error), and several may share one line
/// as an aggregate (`[error validating "a": ..., resource mapping not found ...]`, printed when
/// both reading the files and applying failed). Warnings and klog lines are left out.
pub fn error_records(stderr: &[String]) -> Vec<String> {
    let mut records: Vec<String> = Vec::new();
    let mut open = false;
    for line in stderr {
        let line = line.trim_end();
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with("Warning: ") || KLOG.is_match(trimmed) {
            open = false;
            continue;
        }
        if RECORD_START.is_match(trimmed) {
            records.push(trimmed.to_string());
            open = true;
        } else if open {
            let last = records.last_mut().expect("an open record");
            last.push('\n');
            last.push_str(trimmed);
        }
    }
    records.into_iter().flat_map(split_aggregate).collect()
}

/// `[e1, e2]` (perhaps after `error: `) into `e1` and `e2`; anything else unchanged.
fn split_aggregate(record: String) -> Vec<String> {
    let inner = record.strip_prefix("error: ").unwrap_or(&record);
    let Some(inner) = inner.strip_prefix('[').and_then(|r| r.strip_suffix(']')) else { return vec![record] };
    let mut parts = Vec::new();
    let mut from = 0;
    for m in AGGREGATE_SEP.find_iter(inner) {
        parts.push(inner[from..m.start()].to_string());
        from = m.start() + 2;
    }
    parts.push(inner[from..].to_string());
    parts
}

/// The staged file a message names (`"…/0004.json"`), if any: the first quoted one, so a file
/// name inside a quoted patch (escaped quotes) does not count.
fn staged_file(record: &str) -> Option<&str> {
    static FILE: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r#""(?:[^"\\\n]*/)?(\d{4,}\.json)""#).expect("valid regex"));
    FILE.captures(record).map(|c| c.get(1).expect("group 1").as_str())
}

/// Where an object came from in the operator's words: `m/c.yaml`, or `m/c.yaml, document 3`
/// when that file holds several documents.
pub fn user_place(objects: &[KubeObject], object: &KubeObject) -> String {
    let documents: std::collections::BTreeSet<usize> =
        objects.iter().filter(|o| o.source == object.source).map(|o| o.document).collect();
    if documents.len() > 1 {
        format!("{}, document {}", object.source.display(), object.document)
    } else {
        object.source.display().to_string()
    }
}

/// A line of kubectl's with each staged file it names (`"/…/objects/apply-1/0004.json"`,
/// rdeploy's copy of one object) replaced by the operator's file and document
/// (`"m/c.yaml" (document 3)`), so a message points at what they wrote.
pub fn name_user_files(line: &str, objects: &[KubeObject]) -> String {
    static STAGED: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r#""(?:[^"\n]*/)?objects/[^"/\n]+/(\d{4,})\.json""#).expect("valid regex"));
    STAGED
        .replace_all(line, |c: &regex::Captures<'_>| {
            let object = c[1].parse::<usize>().ok().and_then(|n| n.checked_sub(1)).and_then(|i| objects.get(i));
            match object {
                Some(o) => {
                    let place = user_place(objects, o);
                    match place.split_once(", ") {
                        Some((file, document)) => format!("\"{file}\" ({document})"),
                        None => format!("\"{file}\"", file = place),
                    }
                }
                None => c[0].to_string(),
            }
        })
        .into_owned()
}

/// Gives each failed object the error that names it: by its staged file (one object per file,
/// so the file is the document: client-side errors, validation and mapping errors quote it),
/// else by `Kind "name"` or `Kind.group "name"` (server-side errors, and the Invalid error
/// kubectl prints without the file when it is the only one), else by a missing namespace.
/// What is left over goes to the one failed object left, or is shared.
pub fn attribute_errors(failed: &[(&KubeObject, String)], error_records: &[String]) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = HashMap::new();
    let mut unused: Vec<&String> = Vec::new();
    for record in error_records {
        let by_file: Vec<&KubeObject> = match staged_file(record) {
            Some(file) => failed.iter().filter(|(_, f)| f == file).map(|(o, _)| *o).collect(),
            None => Vec::new(),
        };
        let by_name: Vec<&KubeObject> = if by_file.is_empty() {
            failed
                .iter()
                .filter(|(o, _)| {
                    let plain = format!("{} \"{}\"", o.kind, o.name);
                    let grouped = format!("{}.{} \"{}\"", o.kind, o.group(), o.name);
                    record.contains(&plain) || (!o.group().is_empty() && record.contains(&grouped))
                })
                .map(|(o, _)| *o)
                .collect()
        } else {
            by_file
        };
        let targets: Vec<&KubeObject> = if by_name.is_empty() {
            match missing_namespace(record) {
                Some(ns) => {
                    failed.iter().filter(|(o, _)| o.namespace.as_deref() == Some(ns)).map(|(o, _)| *o).collect()
                }
                None => Vec::new(),
            }
        } else {
            by_name
        };
        if targets.is_empty() {
            unused.push(record);
        }
        for o in targets {
            out.entry(o.id()).or_insert_with(|| clean_error(record));
        }
    }
    let left: Vec<&KubeObject> = failed.iter().map(|(o, _)| *o).filter(|o| !out.contains_key(&o.id())).collect();
    if left.len() == 1 && unused.len() == 1 {
        out.insert(left[0].id(), clean_error(unused[0]));
    } else {
        let shared = match unused.first() {
            Some(record) => format!("not applied; kubectl said: {}", clean_error(record)),
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

/// The first of kubectl's error messages on stderr, as one line (see [`clean_error`]).
pub fn first_error(stderr: &[String]) -> Option<String> {
    error_records(stderr).first().map(|r| clean_error(r))
}

/// One of kubectl's error messages as one line in its own words, without rdeploy's scratch
/// paths (`error when creating "/state/…/0004.json": ` names rdeploy's copy, not the operator's
/// manifest; the object's id says which it is):
/// - `applying patch:` quotes the whole patch, then `to:` and the object, then
///   `for: "FILE": ` and the cause: the patch and object lines are dropped;
/// - `ensure CRDs are installed first`, and an Invalid error's `* field: message` causes, are
///   joined to the first line with `; `.
pub fn clean_error(record: &str) -> String {
    static SOURCE: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r#"error when (\w[\w -]*?) "[^"]*": "#).expect("valid regex"));
    static MAPPING_FROM: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r#"(resource mapping not found for name: "[^"]*" namespace: "[^"]*") from "[^"]*": "#)
            .expect("valid regex")
    });
    static OTHER_SOURCE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r#"(error validating|unable to recognize|unable to decode) "[^"]*": "#).expect("valid regex")
    });
    let record = record.trim();
    let joined = match record.split_once('\n') {
        None => record.to_string(),
        // `Error from server (Invalid): error when applying patch:\n{…}\nto:\n…\nfor: "F": CAUSE`
        Some((first, _)) if record.contains("\nfor: ") || record.contains("\nfrom server for: ") => {
            let prefix = first.find("error when ").map(|at| &first[..at]).unwrap_or("");
            let tail = record.find("\nfor: \"").map(|at| &record[at + "\nfor: \"".len()..]).or_else(|| {
                record.find("\nfrom server for: \"").map(|at| &record[at + "\nfrom server for: \"".len()..])
            });
            let cause = tail.and_then(|t| t.split_once("\": ")).map(|(_, c)| c);
            match cause {
                Some(cause) => format!("{prefix}{}", cause.lines().collect::<Vec<_>>().join("; ")),
                None => first.to_string(),
            }
        }
        Some(_) => {
            let mut out = String::new();
            for line in record.lines() {
                let line = line.trim().trim_start_matches("* ");
                if line.is_empty() {
                    continue;
                }
                if !out.is_empty() {
                    out.push_str(if out.ends_with(':') { " " } else { "; " });
                }
                out.push_str(line);
            }
            out
        }
    };
    let out = SOURCE.replace_all(&joined, "error when $1: ");
    let out = MAPPING_FROM.replace_all(&out, "$1: ");
    let out = OTHER_SOURCE.replace_all(&out, |c: &regex::Captures<'_>| match &c[1] {
        "error validating" => String::new(),
        other => format!("{other}: "),
    });
    out.into_owned()
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
    use crate::kubectl::manifest::{objects_from_documents, parse_documents, Scopes};

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
        objects_from_documents(
            parse_documents(text).unwrap(),
            Path::new("app.yaml"),
            "default",
            &Scopes::with_captured_discovery(&[]),
        )
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
        let objs = objects_from_documents(docs, Path::new("x.yaml"), "default", &Scopes::with_captured_discovery(&[]))
            .unwrap();
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

    /// Objects staged as `0001.json`, `0002.json`... in the order given (as the adapter stages
    /// them), with the captured discovery.
    fn staged(text: &str) -> (Vec<KubeObject>, Vec<String>) {
        let docs = parse_documents(text).unwrap();
        let scopes = Scopes::with_captured_discovery(&docs);
        let objs = objects_from_documents(docs, Path::new("x.yaml"), "default", &scopes).unwrap();
        let files = (1..=objs.len()).map(|i| format!("{i:04}.json")).collect();
        (objs, files)
    }

    fn attribute(objs: &[KubeObject], files: &[String], failed: &[usize], stderr: &str) -> HashMap<String, String> {
        let failed: Vec<(&KubeObject, String)> = failed.iter().map(|&i| (&objs[i], files[i].clone())).collect();
        attribute_errors(&failed, &error_records(&captured(stderr)))
    }

    const UNMAPPED: &str = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: default}\n---\napiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g1}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c1, namespace: nope}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: ok}\n";

    #[test]
    fn mapping_errors_in_a_bracketed_aggregate_are_attributed_by_file() {
        // Reading the files failed for two objects and applying failed for a third: kubectl
        // prints the first two as one aggregate `[e1, e2]` across lines, the third on its own.
        let (objs, files) = staged(UNMAPPED);
        let records = error_records(&captured("apply-unmapped-and-server-error.stderr"));
        assert_eq!(records.len(), 3, "{records:#?}");
        let got = attribute(&objs, &files, &[0, 1, 2], "apply-unmapped-and-server-error.stderr");
        assert_eq!(
            got["Widget/default/w1"],
            r#"resource mapping not found for name: "w1" namespace: "default": no matches for kind "Widget" in version "example.com/v1"; ensure CRDs are installed first"#
        );
        assert_eq!(
            got["Gadget/default/g1"],
            r#"resource mapping not found for name: "g1" namespace: "": no matches for kind "Gadget" in version "example.com/v1"; ensure CRDs are installed first"#
        );
        assert_eq!(
            got["ConfigMap/nope/c1"],
            r#"Error from server (NotFound): error when creating: namespaces "nope" not found"#
        );
        // Without the server error kubectl prints them one per line, without `error: `.
        let got = attribute(&objs, &files, &[0, 1], "apply-unmapped.stderr");
        assert!(got["Widget/default/w1"].starts_with(r#"resource mapping not found for name: "w1""#), "{got:?}");
        assert!(got["Gadget/default/g1"].ends_with("; ensure CRDs are installed first"), "{got:?}");
    }

    #[test]
    fn validation_errors_are_attributed_by_file() {
        let (objs, files) = staged("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a1}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a2}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a3}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a4, namespace: nope}\n");
        for stderr in ["apply-validation.stderr", "apply-validation-and-server-error.stderr"] {
            let failed: &[usize] = if stderr.contains("server") { &[0, 1, 3] } else { &[0, 1] };
            let got = attribute(&objs, &files, failed, stderr);
            assert_eq!(
                got["ConfigMap/default/a1"],
                "error validating data: apiVersion not set; if you choose to ignore these errors, turn validation off with --validate=false",
                "{stderr}"
            );
            assert_eq!(
                got["ConfigMap/default/a2"],
                "error validating data: kind not set; if you choose to ignore these errors, turn validation off with --validate=false",
                "{stderr}"
            );
        }
        let got = attribute(&objs, &files, &[0, 1, 3], "apply-validation-and-server-error.stderr");
        assert_eq!(
            got["ConfigMap/nope/a4"],
            r#"Error from server (NotFound): error when creating: namespaces "nope" not found"#
        );
    }

    #[test]
    fn a_crd_over_the_annotation_limit_is_attributed_in_one_line() {
        let big = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "bigs.example.com"}, "spec": {"group": "example.com", "scope": "Namespaced", "names": {"kind": "Big", "plural": "bigs"}}}"#;
        let (objs, files) = staged(&format!("{big}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: b1}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: b2, namespace: nope}}\n"));
        // Created: the only error, printed as the Invalid status without the file.
        let got = attribute(&objs, &files, &[0], "apply-big-crd.stderr");
        assert_eq!(
            got["CustomResourceDefinition/bigs.example.com"],
            r#"The CustomResourceDefinition "bigs.example.com" is invalid: metadata.annotations: Too long: must have at most 262144 bytes"#
        );
        // Patched beside another failure: `applying patch:` quotes the patch, the object, then
        // `for: "FILE": ` and the cause; the warning before it is not an error.
        let records = error_records(&captured("apply-big-crd-patch.stderr"));
        assert_eq!(records.len(), 2, "{records:#?}");
        let got = attribute(&objs, &files, &[0, 2], "apply-big-crd-patch.stderr");
        assert_eq!(
            got["CustomResourceDefinition/bigs.example.com"],
            r#"Error from server (Invalid): error when patching: CustomResourceDefinition.apiextensions.k8s.io "bigs.example.com" is invalid: metadata.annotations: Too long: must have at most 262144 bytes"#
        );
        assert_eq!(
            got["ConfigMap/nope/b2"],
            r#"Error from server (NotFound): error when creating: namespaces "nope" not found"#
        );
        assert!(got.values().all(|e| !e.contains('\n')), "{got:?}");
    }

    #[test]
    fn invalid_errors_with_several_causes_become_one_line() {
        // cmd/util/helpers.go: `The Kind "name" is invalid: ` then one `* field: message` per cause.
        let stderr: Vec<String> = [
            "Warning: unknown field \"spec.foo\"",
            r#"The Deployment "web" is invalid: "#,
            r#"* spec.replicas: Invalid value: -1: must be greater than or equal to 0"#,
            r#"* spec.template.spec.containers: Required value"#,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            first_error(&stderr).unwrap(),
            r#"The Deployment "web" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0; spec.template.spec.containers: Required value"#
        );
    }

    #[test]
    fn the_staged_file_is_found_in_a_path_with_spaces_but_not_inside_a_quoted_patch() {
        let record = r#"Error from server (NotFound): error when creating "/home/ops/my stack/.rdeploy/steps/a/objects/apply-1/0002.json": namespaces "x" not found"#;
        assert_eq!(staged_file(record), Some("0002.json"));
        assert_eq!(
            clean_error(record),
            r#"Error from server (NotFound): error when creating: namespaces "x" not found"#
        );
        let patch = "Error from server (Invalid): error when applying patch:\n{\"metadata\":{\"annotations\":{\"x\":\"{\\\"f\\\":\\\"0007.json\\\"}\"}}}\nto:\nResource: \"/v1, Resource=configmaps\"\nfor: \"0003.json\": error when patching \"0003.json\": boom";
        assert_eq!(staged_file(patch), Some("0003.json"));
        assert_eq!(clean_error(patch), "Error from server (Invalid): error when patching: boom");
    }
}

//! Manifests into objects: multi-document YAML (and list documents: `List`, `ConfigMapList`...)
//! parsed into one [`KubeObject`] each, with its checkpoint id `Kind/namespace/name`, and the
//! apply order (Namespaces and CRDs first). Whether a kind is namespaced comes from the API
//! ([`Scopes`]: the cluster's discovery, or the `spec.scope` of a CRD among the step's own
//! objects), never from a list of kinds. The YAML itself is read by [`crate::yaml`].

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Kinds `kubectl rollout status` can wait for.
pub const WORKLOADS: &[&str] = &["Deployment", "StatefulSet", "DaemonSet"];

/// One object from the step's manifests.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeObject {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// `None` for cluster-scoped kinds.
    pub namespace: Option<String>,
    /// The object as kubectl will receive it (namespace filled in).
    pub body: Value,
    /// The file it came from, for messages.
    pub source: PathBuf,
    /// Which document of that file it is (1-based; empty documents not counted, the items of a
    /// list all the list's).
    pub document: usize,
}

impl KubeObject {
    /// The checkpoint id: `Kind/namespace/name`, or `Kind/name` when cluster-scoped.
    pub fn id(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.kind, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }

    /// The API group (`apps`), empty for the core group.
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
    }

    /// How kubectl's name printer spells it: `deployment.apps/web`, `configmap/settings`.
    pub fn printed_name(&self) -> String {
        let kind = self.kind.to_lowercase();
        match self.group() {
            "" => format!("{kind}/{}", self.name),
            group => format!("{kind}.{group}/{}", self.name),
        }
    }

    /// The file name `kubectl diff` gives the object: `apps.v1.Deployment.shop.web`,
    /// `v1.Namespace..shop`.
    pub fn diff_name(&self) -> String {
        format!(
            "{}.{}.{}.{}",
            self.api_version.replace('/', "."),
            self.kind,
            self.namespace.as_deref().unwrap_or(""),
            self.name
        )
    }

    /// `deployment/web`, as `kubectl rollout status` takes it.
    pub fn resource_arg(&self) -> String {
        format!("{}/{}", self.kind.to_lowercase(), self.name)
    }

    pub fn is_workload(&self) -> bool {
        self.group() == "apps" && WORKLOADS.contains(&self.kind.as_str())
    }

    fn rank(&self) -> u8 {
        match self.kind.as_str() {
            "Namespace" => 0,
            "CustomResourceDefinition" => 1,
            _ => 2,
        }
    }
}

/// Manifests parse in the crate's one YAML module; these are its names here.
pub use crate::yaml::{documents as parse_documents, value as parse_yaml};

/// The line document `document` (1-based, empty ones not counted, as [`KubeObject::document`])
/// of the manifest at `path` starts on; `None` for a directory (kustomize) or an unreadable file.
pub fn document_line(path: &Path, document: usize) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    let docs = crate::yaml::documents_located(&text).ok()?;
    let (line, _) = docs.get(document.checked_sub(1)?)?;
    line.and_then(|l| u32::try_from(l).ok())
}

/// Turns parsed documents into objects; `default_ns` fills in namespaced objects without one.
pub fn objects_from_documents(
    docs: Vec<Value>,
    source: &Path,
    default_ns: &str,
    scopes: &Scopes,
) -> Result<Vec<KubeObject>, String> {
    let mut out = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        for item in flatten_lists(vec![doc]) {
            let object = object_from_value(item, source, default_ns, scopes)?;
            out.push(KubeObject { document: i + 1, ..object });
        }
    }
    Ok(out)
}

/// Whether a document is a list as kubectl reads it: apimachinery decodes any object with an
/// `items` field as an `UnstructuredList` (`kind: List` from `kubectl get -o yaml`, or a typed
/// `ConfigMapList` as kube-prometheus ships them).
pub fn is_list(doc: &Value) -> bool {
    doc.get("items").is_some_and(|items| !items.is_null())
}

/// Replaces every list document by its items, nested lists too, as kubectl's
/// `FlattenListVisitor` does. An item with neither `apiVersion` nor `kind` takes the list's
/// `apiVersion` and its kind without the `List` suffix (apimachinery's `decodeToList`).
pub fn flatten_lists(docs: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::new();
    for doc in docs {
        if !is_list(&doc) {
            out.push(doc);
            continue;
        }
        let api_version = doc.get("apiVersion").cloned();
        let item_kind =
            doc.get("kind").and_then(Value::as_str).map(|k| k.strip_suffix("List").unwrap_or(k).to_string());
        let items = match doc.get("items") {
            Some(Value::Array(items)) => items.clone(),
            _ => Vec::new(),
        };
        let items = items
            .into_iter()
            .map(|mut item| {
                if let Some(map) = item.as_object_mut() {
                    if !map.contains_key("apiVersion") && !map.contains_key("kind") {
                        if let Some(v) = &api_version {
                            map.insert("apiVersion".into(), v.clone());
                        }
                        if let Some(k) = item_kind.as_ref().filter(|k| !k.is_empty()) {
                            map.insert("kind".into(), Value::String(k.clone()));
                        }
                    }
                }
                item
            })
            .collect();
        out.extend(flatten_lists(items));
    }
    out
}

/// Why a parsed document cannot become objects, found from its text alone (no cluster): a
/// missing `apiVersion`, `kind` or `metadata.name`, or a list whose `items` is not a list of
/// objects; items of a list are checked as its objects. Empty when it splits.
pub fn split_problems(doc: &Value) -> Vec<String> {
    let kind = doc.get("kind").and_then(Value::as_str);
    let lacks_items =
        kind.is_some_and(|k| k.ends_with("List")) && doc.get("metadata").and_then(|m| m.get("name")).is_none();
    match doc.get("items") {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .flat_map(|(i, item)| {
                // As `flatten_lists` reads it: an item with neither takes the list's.
                let mut item = item.clone();
                if let Some(map) =
                    item.as_object_mut().filter(|m| !m.contains_key("apiVersion") && !m.contains_key("kind"))
                {
                    if let Some(v) = doc.get("apiVersion") {
                        map.insert("apiVersion".into(), v.clone());
                    }
                    if let Some(k) = kind.map(|k| k.strip_suffix("List").unwrap_or(k)).filter(|k| !k.is_empty()) {
                        map.insert("kind".into(), Value::String(k.to_string()));
                    }
                }
                split_problems(&item)
                    .into_iter()
                    .map(move |p| format!("item {} of the {}: {p}", i + 1, kind.unwrap_or("list")))
                    .collect::<Vec<_>>()
            })
            .collect(),
        Some(Value::Null) | None if lacks_items => {
            vec![format!("a {} has no `items` (a list holds its objects under `items:`)", kind.unwrap_or("list"))]
        }
        Some(Value::Null) | None => object_problems(doc),
        Some(_) => vec![format!("the {}'s `items` is not a list", kind.unwrap_or("list"))],
    }
}

/// A single object's missing fields.
fn object_problems(doc: &Value) -> Vec<String> {
    if !doc.is_object() {
        return vec!["is not a mapping (an object is `apiVersion`, `kind`, `metadata`, ...)".into()];
    }
    let text = |key: &str| doc.get(key).and_then(Value::as_str).filter(|v| !v.is_empty());
    let mut missing = Vec::new();
    if text("apiVersion").is_none() {
        missing.push("`apiVersion`");
    }
    if text("kind").is_none() {
        missing.push("`kind`");
    }
    let name = doc.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).filter(|n| !n.is_empty());
    if name.is_none() {
        missing.push("`metadata.name`");
    }
    if missing.is_empty() {
        return Vec::new();
    }
    let what = text("kind").map(|k| format!("a {k}")).unwrap_or_else(|| "an object".into());
    let generate = doc.pointer("/metadata/generateName").is_some() && name.is_none();
    vec![format!(
        "{what} has no {}{}",
        missing.join(" or "),
        if generate { " (it has `generateName`, which cannot be checkpointed)" } else { "" }
    )]
}

fn object_from_value(mut body: Value, source: &Path, default_ns: &str, scopes: &Scopes) -> Result<KubeObject, String> {
    let field = |body: &Value, key: &str| body.get(key).and_then(Value::as_str).map(str::to_string);
    let (Some(api_version), Some(kind)) = (field(&body, "apiVersion"), field(&body, "kind")) else {
        return Err(format!("{}: a document has no `apiVersion` or `kind`", source.display()));
    };
    let meta = body.get("metadata");
    let Some(name) = meta.and_then(|m| m.get("name")).and_then(Value::as_str).map(str::to_string) else {
        return Err(format!(
            "{}: a {kind} has no `metadata.name` (generateName cannot be checkpointed)",
            source.display()
        ));
    };
    let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    // A kind the API does not know (its CRD is not installed) is taken as namespaced: kubectl
    // then fails it with "resource mapping not found ... ensure CRDs are installed first".
    let namespaced = scopes.namespaced(group, &kind).unwrap_or(true);
    let namespace = if namespaced {
        let ns = meta.and_then(|m| m.get("namespace")).and_then(Value::as_str).unwrap_or(default_ns).to_string();
        if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("namespace".into(), Value::String(ns.clone()));
        }
        Some(ns)
    } else {
        None
    };
    Ok(KubeObject { api_version, kind, name, namespace, body, source: source.to_path_buf(), document: 0 })
}

/// Whether each kind is namespaced, by API group and kind: from the CRDs among the step's own
/// objects (`spec.scope`), then from the cluster's discovery (`kubectl api-resources`).
#[derive(Debug, Default)]
pub struct Scopes {
    /// (group, kind) -> namespaced.
    known: HashMap<(String, String), bool>,
    /// Kinds that CRDs among the step's objects define.
    pub defined: HashSet<String>,
}

impl Scopes {
    /// The scopes the step's own CRDs declare.
    pub fn from_documents(docs: &[Value]) -> Scopes {
        let mut scopes = Scopes::default();
        for doc in docs {
            if doc.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
                continue;
            }
            let spec = doc.get("spec");
            let Some(kind) = spec.and_then(|s| s.pointer("/names/kind")).and_then(Value::as_str) else { continue };
            let group = spec.and_then(|s| s.get("group")).and_then(Value::as_str).unwrap_or_default();
            scopes.defined.insert(kind.to_string());
            let namespaced = spec.and_then(|s| s.get("scope")).and_then(Value::as_str) != Some("Cluster");
            scopes.known.insert((group.to_string(), kind.to_string()), namespaced);
        }
        scopes
    }

    /// Whether any of these documents has a kind whose scope is not known yet (then the
    /// cluster's discovery is needed).
    pub fn lacks_any(&self, docs: &[Value]) -> bool {
        docs.iter().any(|doc| {
            let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
            let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
            self.namespaced(group, kind).is_none()
        })
    }

    /// Adds what `kubectl api-resources` printed (its default table: `NAME SHORTNAMES APIVERSION
    /// NAMESPACED KIND`, SHORTNAMES often empty, so a row is read from its right end). The
    /// step's own CRDs keep precedence. Returns how many rows were read.
    pub fn add_discovery(&mut self, lines: &[String]) -> usize {
        let mut read = 0;
        for line in lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            let [.., api_version, namespaced, kind] = words.as_slice() else { continue };
            let namespaced = match *namespaced {
                "true" => true,
                "false" => false,
                _ => continue, // the header, or not a row
            };
            let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
            self.known.entry((group.to_string(), kind.to_string())).or_insert(namespaced);
            read += 1;
        }
        read
    }

    /// `Some(true)` when namespaced, `None` when neither the step nor the cluster knows the kind.
    pub fn namespaced(&self, group: &str, kind: &str) -> Option<bool> {
        self.known.get(&(group.to_string(), kind.to_string())).copied()
    }
}

/// Stable order: Namespaces, then CRDs, then everything else as written.
pub fn order(objects: &mut [KubeObject]) {
    objects.sort_by_key(KubeObject::rank);
}

/// An id declared twice, with both sources.
pub fn first_duplicate(objects: &[KubeObject]) -> Option<(String, PathBuf, PathBuf)> {
    let mut seen: std::collections::HashMap<String, &Path> = std::collections::HashMap::new();
    for o in objects {
        if let Some(first) = seen.insert(o.id(), &o.source) {
            return Some((o.id(), first.to_path_buf(), o.source.clone()));
        }
    }
    None
}

/// Whether a path names a kustomize directory.
pub fn is_kustomization(dir: &Path) -> bool {
    ["kustomization.yaml", "kustomization.yml", "Kustomization"].iter().any(|f| dir.join(f).is_file())
}

/// The manifest files of a plain directory, as `kubectl apply -f DIR` reads them: `.yaml`,
/// `.yml` and `.json`, not recursive, in lexical order.
pub fn files_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
impl Scopes {
    /// The step's CRDs, then what `kubectl api-resources` printed against kubesim with
    /// cert-manager's CRDs installed (`fixtures/kubectl/captured/api-resources.stdout`).
    pub(crate) fn with_captured_discovery(docs: &[Value]) -> Scopes {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/kubectl/captured/api-resources.stdout");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        let mut scopes = Scopes::from_documents(docs);
        assert!(scopes.add_discovery(&lines) > 30, "{}", path.display());
        scopes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: &str = include_str!("../../../fixtures/kubectl/app/app.yaml");

    fn objects(text: &str) -> Vec<KubeObject> {
        let docs = flatten_lists(parse_documents(text).unwrap());
        let scopes = Scopes::with_captured_discovery(&docs);
        objects_from_documents(docs, Path::new("app.yaml"), "default", &scopes).unwrap()
    }

    #[test]
    fn ids_printed_names_and_diff_names() {
        let objs = objects(APP);
        let ids: Vec<String> = objs.iter().map(KubeObject::id).collect();
        assert_eq!(
            ids,
            [
                "Namespace/shop",
                "ConfigMap/shop/settings",
                "Deployment/shop/web",
                "Service/shop/web",
                "ConfigMap/shop-extra/extra"
            ]
        );
        assert_eq!(objs[2].printed_name(), "deployment.apps/web");
        assert_eq!(objs[1].printed_name(), "configmap/settings");
        assert_eq!(objs[2].diff_name(), "apps.v1.Deployment.shop.web");
        assert_eq!(objs[0].diff_name(), "v1.Namespace..shop");
        assert!(objs[2].is_workload() && !objs[1].is_workload());
    }

    #[test]
    fn fills_the_default_namespace_and_expands_lists() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n---\n---\n# only a comment\n";
        let objs = objects(text);
        assert_eq!(objs.len(), 1);
        assert_eq!(objs[0].id(), "ConfigMap/default/a");
        assert_eq!(objs[0].body["metadata"]["namespace"], "default");
    }

    #[test]
    fn crd_scopes_and_order() {
        let text = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\n---\napiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g1}\n---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\nspec: {group: example.com, scope: Namespaced, names: {kind: Widget, plural: widgets}}\n---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: gadgets.example.com}\nspec: {group: example.com, scope: Cluster, names: {kind: Gadget, plural: gadgets}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: n}\n";
        let mut objs = objects(text);
        order(&mut objs);
        let ids: Vec<String> = objs.iter().map(KubeObject::id).collect();
        assert_eq!(
            ids,
            [
                "Namespace/n",
                "CustomResourceDefinition/widgets.example.com",
                "CustomResourceDefinition/gadgets.example.com",
                "Widget/default/w1",
                "Gadget/g1"
            ]
        );
    }

    #[test]
    fn rejects_objects_without_a_name_and_finds_duplicates() {
        let docs = parse_documents("apiVersion: v1\nkind: ConfigMap\nmetadata: {generateName: x-}\n").unwrap();
        let err = objects_from_documents(docs, Path::new("a.yaml"), "default", &Scopes::with_captured_discovery(&[]))
            .unwrap_err();
        assert!(err.contains("no `metadata.name`"), "{err}");
        let objs = objects("kind: ConfigMap\napiVersion: v1\nmetadata: {name: a}\n---\nkind: ConfigMap\napiVersion: v1\nmetadata: {name: a, namespace: default}\n");
        assert_eq!(first_duplicate(&objs).map(|d| d.0).as_deref(), Some("ConfigMap/default/a"));
        assert!(parse_documents("a: [").is_err());
    }

    #[test]
    fn scope_comes_from_the_api_not_a_list_of_kinds() {
        // ClusterIssuer and Issuer are known from discovery only (their CRDs came from an
        // earlier step); Gadget from a CRD in the step; Widget from nowhere.
        let text = "apiVersion: cert-manager.io/v1\nkind: ClusterIssuer\nmetadata: {name: letsencrypt}\n---\napiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: selfsigned}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: n}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: reader}\n---\napiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g}\n---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: gadgets.example.com}\nspec: {group: example.com, scope: Cluster, names: {kind: Gadget, plural: gadgets}}\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n";
        let ids: Vec<String> = objects(text).iter().map(KubeObject::id).collect();
        assert_eq!(
            ids,
            [
                "ClusterIssuer/letsencrypt",
                "Issuer/default/selfsigned",
                "Namespace/n",
                "ClusterRole/reader",
                "Gadget/g",
                "CustomResourceDefinition/gadgets.example.com",
                "Widget/default/w"
            ]
        );
        let objs = objects(text);
        assert_eq!(objs[0].diff_name(), "cert-manager.io.v1.ClusterIssuer..letsencrypt");
        assert!(objs[0].body["metadata"].get("namespace").is_none(), "{}", objs[0].body);
        // Without discovery nothing is known, not even Namespace: there is no list of kinds.
        let docs = parse_documents(text).unwrap();
        let scopes = Scopes::from_documents(&docs);
        assert!(scopes.lacks_any(&docs));
        assert_eq!(scopes.namespaced("", "Namespace"), None);
        assert_eq!(scopes.namespaced("example.com", "Gadget"), Some(false));
        // The same kind in another group is another kind.
        assert_eq!(Scopes::with_captured_discovery(&[]).namespaced("example.com", "ClusterIssuer"), None);
    }

    #[test]
    fn typed_lists_are_applied_item_by_item() {
        // kube-prometheus ships its dashboards as a `ConfigMapList` whose items may omit
        // apiVersion and kind; a `v1 List` may nest another.
        let text = "apiVersion: v1\nkind: ConfigMapList\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: dash-a, namespace: monitoring}\n- metadata: {name: dash-b, namespace: monitoring}\n  data: {x: y}\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n  items:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: monitoring}}\n- {apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole, metadata: {name: prom}}\n---\napiVersion: v1\nkind: ServiceList\nitems: []\n";
        let objs = objects(text);
        let ids: Vec<String> = objs.iter().map(KubeObject::id).collect();
        assert_eq!(
            ids,
            ["ConfigMap/monitoring/dash-a", "ConfigMap/monitoring/dash-b", "Namespace/monitoring", "ClusterRole/prom"]
        );
        assert_eq!(objs[1].body["kind"], "ConfigMap");
        assert_eq!(objs[1].body["apiVersion"], "v1");
        assert_eq!(objs[1].body["data"]["x"], "y");
    }
}

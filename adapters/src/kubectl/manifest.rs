//! Manifests into objects: multi-document YAML (and `List` kinds) parsed into one
//! [`KubeObject`] each, with its checkpoint id `Kind/namespace/name`, and the apply order
//! (Namespaces and CRDs first). The YAML itself is read by [`crate::yaml`].

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Kinds of the built-in API that are not namespaced. Kinds defined by a CRD in the same
/// step are looked up in the CRD's `spec.scope`; any other kind is taken as namespaced.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "Node",
    "PersistentVolume",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
    "RuntimeClass",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "CSIDriver",
    "CSINode",
    "VolumeAttachment",
    "CertificateSigningRequest",
    "FlowSchema",
    "PriorityLevelConfiguration",
];

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

/// Turns parsed documents into objects; `default_ns` fills in namespaced objects without one.
pub fn objects_from_documents(
    docs: Vec<Value>,
    source: &Path,
    default_ns: &str,
    scopes: &CrdScopes,
) -> Result<Vec<KubeObject>, String> {
    let mut out = Vec::new();
    for doc in docs {
        // `kind: List` (what `kubectl get -o yaml` writes) holds its objects in `items`.
        if doc.get("kind").and_then(Value::as_str) == Some("List") {
            let items = doc.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
            out.extend(objects_from_documents(items, source, default_ns, scopes)?);
            continue;
        }
        out.push(object_from_value(doc, source, default_ns, scopes)?);
    }
    Ok(out)
}

fn object_from_value(
    mut body: Value,
    source: &Path,
    default_ns: &str,
    scopes: &CrdScopes,
) -> Result<KubeObject, String> {
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
    let namespaced = !(CLUSTER_SCOPED.contains(&kind.as_str()) || scopes.cluster_scoped.contains(&kind));
    let namespace = if namespaced {
        let ns = meta.and_then(|m| m.get("namespace")).and_then(Value::as_str).unwrap_or(default_ns).to_string();
        if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("namespace".into(), Value::String(ns.clone()));
        }
        Some(ns)
    } else {
        None
    };
    Ok(KubeObject { api_version, kind, name, namespace, body, source: source.to_path_buf() })
}

/// The kinds that CRDs among the step's own objects define, by scope.
#[derive(Debug, Default)]
pub struct CrdScopes {
    pub cluster_scoped: HashSet<String>,
    pub defined: HashSet<String>,
}

impl CrdScopes {
    pub fn from_documents(docs: &[Value]) -> CrdScopes {
        let mut scopes = CrdScopes::default();
        for doc in docs {
            if doc.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
                continue;
            }
            let spec = doc.get("spec");
            let Some(kind) = spec.and_then(|s| s.pointer("/names/kind")).and_then(Value::as_str) else { continue };
            scopes.defined.insert(kind.to_string());
            if spec.and_then(|s| s.get("scope")).and_then(Value::as_str) == Some("Cluster") {
                scopes.cluster_scoped.insert(kind.to_string());
            }
        }
        scopes
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
mod tests {
    use super::*;

    const APP: &str = include_str!("../../../fixtures/kubectl/app/app.yaml");

    fn objects(text: &str) -> Vec<KubeObject> {
        let docs = parse_documents(text).unwrap();
        let scopes = CrdScopes::from_documents(&docs);
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
        let err = objects_from_documents(docs, Path::new("a.yaml"), "default", &CrdScopes::default()).unwrap_err();
        assert!(err.contains("no `metadata.name`"), "{err}");
        let objs = objects("kind: ConfigMap\napiVersion: v1\nmetadata: {name: a}\n---\nkind: ConfigMap\napiVersion: v1\nmetadata: {name: a, namespace: default}\n");
        assert_eq!(first_duplicate(&objs).map(|d| d.0).as_deref(), Some("ConfigMap/default/a"));
        assert!(parse_documents("a: [").is_err());
    }
}

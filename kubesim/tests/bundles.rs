//! Two big CRD bundles, generated here in the shape of cert-manager's and
//! prometheus-operator's (many CRDs, deep openAPIV3Schema documents with long descriptions,
//! the biggest over 256 KiB), applied as a user would: client-side, where a CRD over the
//! 256 KiB annotation limit fails as on a real cluster (`kubectl.kubernetes.io/
//! last-applied-configuration` holds the whole object) and the others are created; then
//! server-side, where every CRD is created; custom resources of the new kinds then work.

use kubesim::testing::{stderr, Kubesim};
use serde_json::{json, Map, Value};

/// A small deterministic generator (xorshift), so the bundles are the same on every run.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

const WORDS: &[&str] = &[
    "the",
    "name",
    "of",
    "secret",
    "in",
    "namespace",
    "that",
    "holds",
    "configuration",
    "for",
    "endpoint",
    "certificate",
    "issuer",
    "scrape",
    "interval",
    "selector",
    "matching",
    "labels",
    "pods",
    "service",
    "port",
    "is",
    "used",
    "when",
    "defaults",
    "to",
    "if",
    "not",
    "specified",
    "must",
    "be",
    "a",
    "valid",
    "duration",
    "TLS",
    "authorization",
    "header",
    "relabeling",
];
const FIELDS: &[&str] = &[
    "name",
    "namespace",
    "secretRef",
    "key",
    "selector",
    "matchLabels",
    "port",
    "scheme",
    "interval",
    "timeout",
    "tlsConfig",
    "ca",
    "cert",
    "keySecret",
    "serverName",
    "labels",
    "annotations",
    "resources",
    "limits",
    "requests",
    "affinity",
    "tolerations",
    "volumes",
    "env",
    "image",
    "args",
    "solver",
    "dns01",
    "http01",
    "ingress",
    "podTemplate",
    "metadata",
    "spec",
    "relabelings",
    "action",
    "regex",
    "replacement",
    "sourceLabels",
    "targetLabel",
];

/// A description of kubebuilder's usual length (one to three sentences).
fn description(g: &mut Gen) -> String {
    let n = 12 + (g.next() % 40) as usize;
    let mut s: Vec<&str> = (0..n).map(|_| g.pick(WORDS)).collect();
    s[0] = "Specifies";
    s.join(" ") + "."
}

/// An object schema `depth` levels deep with about `breadth` properties a level, using the
/// constructs controller-gen emits (types, formats, enums, int-or-string, required lists,
/// arrays of objects, preserve-unknown-fields maps).
fn object_schema(g: &mut Gen, depth: u32, breadth: u32) -> Value {
    let mut props = Map::new();
    let mut required = Vec::new();
    for i in 0..breadth {
        let name = format!("{}{}", g.pick(FIELDS), if i > 0 { i.to_string() } else { String::new() });
        let kind = if depth == 0 { g.next() % 5 } else { g.next() % 8 };
        let p = match kind {
            0 => json!({"type": "string", "description": description(g)}),
            1 => json!({"type": "integer", "format": "int32", "description": description(g)}),
            2 => json!({"type": "boolean", "description": description(g)}),
            3 => json!({"type": "string", "enum": ["Always", "IfNotPresent", "Never"], "description": description(g)}),
            4 => {
                json!({"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true, "description": description(g)})
            }
            5 => {
                json!({"type": "array", "description": description(g), "items": object_schema(g, depth - 1, breadth / 2 + 1)})
            }
            6 => json!({"type": "object", "additionalProperties": {"type": "string"}, "description": description(g)}),
            _ => {
                let mut o = object_schema(g, depth - 1, breadth);
                o["description"] = json!(description(g));
                o
            }
        };
        if g.next().is_multiple_of(4) {
            required.push(json!(name));
        }
        props.insert(name, p);
    }
    let mut o = json!({"type": "object", "properties": props});
    if !required.is_empty() {
        o["required"] = Value::Array(required);
    }
    o
}

/// One CRD whose JSON is about `target` bytes: spec properties (each a nested object
/// schema, as an embedded pod template or TLS config is) are added until it is.
fn crd(group: &str, kind: &str, plural: &str, scope: &str, target: usize, seed: u64) -> Value {
    let mut g = Gen(seed);
    let status = object_schema(&mut g, 2, 6);
    let mut spec = Map::new();
    let mut size = 2_000 + serde_json::to_vec(&status).unwrap().len();
    while size < target {
        let mut p = object_schema(&mut g, 3, 5);
        p["description"] = json!(description(&mut g));
        size += serde_json::to_vec(&p).unwrap().len() + 24;
        spec.insert(format!("{}{}", g.pick(FIELDS), spec.len()), p);
    }
    let spec = json!({"type": "object", "description": description(&mut g), "properties": spec});
    {
        let schema = json!({
            "description": format!("{kind} is the Schema for the {plural} API."),
            "type": "object",
            "required": ["spec"],
            "properties": {
                "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."},
                "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."},
                "metadata": {"type": "object"},
                "spec": spec,
                "status": status,
            }
        });
        let c = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {
                "name": format!("{plural}.{group}"),
                "annotations": {"controller-gen.kubebuilder.io/version": "v0.16.1"},
                "labels": {"app.kubernetes.io/name": group.split('.').next().unwrap()},
            },
            "spec": {
                "group": group,
                "scope": scope,
                "names": {
                    "kind": kind,
                    "listKind": format!("{kind}List"),
                    "plural": plural,
                    "singular": kind.to_lowercase(),
                    "categories": [group.split('.').next().unwrap()],
                },
                "versions": [{
                    "name": "v1",
                    "served": true,
                    "storage": true,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"}
                    ],
                    "schema": {"openAPIV3Schema": schema},
                }],
            }
        });
        c
    }
}

/// (CRDs, their sizes) as a multi-document YAML stream (each document in JSON, which is YAML).
fn bundle(crds: &[Value]) -> String {
    crds.iter().map(|c| format!("---\n{}\n", serde_json::to_string_pretty(c).unwrap())).collect()
}

/// cert-manager's six CRDs: every one under the annotation limit (they are in reality too).
fn cert_manager() -> Vec<Value> {
    [
        ("cert-manager.io", "Certificate", "certificates", "Namespaced", 60_000),
        ("cert-manager.io", "CertificateRequest", "certificaterequests", "Namespaced", 20_000),
        ("cert-manager.io", "Issuer", "issuers", "Namespaced", 200_000),
        ("cert-manager.io", "ClusterIssuer", "clusterissuers", "Cluster", 200_000),
        ("acme.cert-manager.io", "Order", "orders", "Namespaced", 15_000),
        ("acme.cert-manager.io", "Challenge", "challenges", "Namespaced", 150_000),
    ]
    .iter()
    .enumerate()
    .map(|(i, (g, k, p, s, size))| crd(g, k, p, s, *size, 0x9e37_79b9 + i as u64))
    .collect()
}

/// prometheus-operator's ten CRDs: the four that embed pod templates are over 256 KiB.
fn prometheus_operator() -> Vec<Value> {
    [
        ("AlertmanagerConfig", "alertmanagerconfigs", 240_000),
        ("Alertmanager", "alertmanagers", 400_000),
        ("PodMonitor", "podmonitors", 50_000),
        ("Probe", "probes", 45_000),
        ("PrometheusAgent", "prometheusagents", 550_000),
        ("Prometheus", "prometheuses", 700_000),
        ("PrometheusRule", "prometheusrules", 10_000),
        ("ScrapeConfig", "scrapeconfigs", 180_000),
        ("ServiceMonitor", "servicemonitors", 50_000),
        ("ThanosRuler", "thanosrulers", 380_000),
    ]
    .iter()
    .enumerate()
    .map(|(i, (k, p, size))| crd("monitoring.coreos.com", k, p, "Namespaced", *size, 0x5bd1_e995 + i as u64))
    .collect()
}

const LIMIT: usize = 262_144;

fn name(c: &Value) -> &str {
    c["metadata"]["name"].as_str().unwrap()
}

/// kubectl's last-applied annotation is the object's compact JSON: over the limit exactly
/// when that is.
fn too_big(c: &Value) -> bool {
    serde_json::to_vec(c).unwrap().len() > LIMIT
}

fn applies(k: &Kubesim, crds: &[Value]) {
    let yaml = bundle(crds);
    // client-side: the CRDs over the limit fail (kubectl goes on with the rest and exits 1)
    let o = k.kubectl_stdin(&["apply", "-f", "-"], &yaml);
    let big: Vec<&Value> = crds.iter().filter(|c| too_big(c)).collect();
    assert_eq!(o.status.success(), big.is_empty(), "{}", stderr(&o));
    for c in crds {
        let msg = format!(
            "error when creating \"STDIN\": CustomResourceDefinition.apiextensions.k8s.io \"{}\" is invalid: metadata.annotations: Too long: must have at most 262144 bytes",
            name(c)
        );
        assert_eq!(stderr(&o).contains(&msg), too_big(c), "{}: {}", name(c), stderr(&o));
        assert_eq!(k.kubectl(&["get", "crd", name(c)]).status.success(), !too_big(c), "{}", name(c));
    }
    // server-side: every CRD, the ones created client-side included (kubectl takes them over)
    let o = k.kubectl_stdin(&["apply", "--server-side", "--force-conflicts", "-f", "-"], &yaml);
    assert!(o.status.success(), "{}", stderr(&o));
    for c in crds {
        k.kubectl_ok(&["get", "crd", name(c)]);
    }
}

#[test]
fn big_crd_bundles_fail_client_side_over_the_limit_and_apply_server_side() {
    let cm = cert_manager();
    let po = prometheus_operator();
    // the shapes the test relies on
    assert!(cm.iter().all(|c| !too_big(c)));
    let big: Vec<&str> = po.iter().filter(|c| too_big(c)).map(name).collect();
    assert_eq!(
        big,
        [
            "alertmanagers.monitoring.coreos.com",
            "prometheusagents.monitoring.coreos.com",
            "prometheuses.monitoring.coreos.com",
            "thanosrulers.monitoring.coreos.com"
        ]
    );
    let total: usize = po.iter().map(|c| serde_json::to_vec(c).unwrap().len()).sum();
    assert!(total > 2 * 1024 * 1024, "the prometheus-operator bundle is {total} bytes");

    let k = Kubesim::start("kubesim");
    applies(&k, &cm);
    applies(&k, &po);
    // the new kinds are served
    k.apply(
        "kubesim",
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: web}\nspec: {}\n---\napiVersion: cert-manager.io/v1\nkind: ClusterIssuer\nmetadata: {name: selfsigned}\nspec: {}\n",
    );
    k.kubectl_ok(&["get", "servicemonitor", "web"]);
    k.kubectl_ok(&["get", "clusterissuer", "selfsigned"]);
}

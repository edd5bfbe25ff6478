//! Two real CRD bundles from the corpus (`bundles/`, see `kubesim::testing::corpus`):
//! cert-manager's six CRDs (the release's `cert-manager.crds.yaml`) and prometheus-operator's
//! ten (the CRDs of its `bundle.yaml`, over 4 MiB together), applied as a user would.
//! Client-side, kubectl stores the whole object in the `kubectl.kubernetes.io/
//! last-applied-configuration` annotation, so a CRD whose annotations then pass the API
//! server's 256 KiB limit fails as on a real cluster and the others are created; server-side,
//! every CRD is created. Custom resources of the new kinds then work.

use std::path::PathBuf;

use kubesim::testing::{corpus, stderr, Kubesim};
use serde::Deserialize;
use serde_json::Value;

const LIMIT: usize = 262_144;

/// The bundle's files (one CRD each) and the CRDs in them.
fn bundle(name: &str) -> (Vec<PathBuf>, Vec<Value>) {
    let dir = corpus().join("bundles").join(name);
    assert!(dir.join("SOURCE").is_file(), "corpus bundle {} has no SOURCE file", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus bundle {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let crds = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            serde_norway::Deserializer::from_str(&text)
                .map(|d| Value::deserialize(d).expect("a CRD file is YAML"))
                .filter(|v| !v.is_null())
                .collect::<Vec<_>>()
        })
        .collect();
    (files, crds)
}

fn name(c: &Value) -> &str {
    c["metadata"]["name"].as_str().unwrap()
}

/// The annotations' size once kubectl has added its last-applied configuration: the object as
/// Go's encoder writes it (keys sorted, `<`, `>` and `&` escaped as `\u003c`..., a trailing
/// newline) under its 48-byte key, plus the annotations the file has.
fn annotations_size(c: &Value) -> usize {
    let json = serde_json::to_string(c).unwrap();
    let escaped = json.bytes().filter(|b| b"<>&".contains(b)).count();
    let own: usize = c["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum();
    "kubectl.kubernetes.io/last-applied-configuration".len() + json.len() + 5 * escaped + 1 + own
}

/// Client-side apply: exactly the CRDs over the limit fail, with the API server's message;
/// then server-side apply: every CRD (kubectl takes over the client-side ones).
fn applies(k: &Kubesim, files: &[PathBuf], crds: &[Value], too_big: &[&str]) {
    let mut args = vec!["apply".to_string()];
    for f in files {
        args.extend(["-f".to_string(), f.to_string_lossy().into_owned()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = k.kubectl(&args);
    assert_eq!(o.status.success(), too_big.is_empty(), "{}", stderr(&o));
    for c in crds {
        let big = too_big.contains(&name(c));
        let msg = format!(
            "CustomResourceDefinition.apiextensions.k8s.io \"{}\" is invalid: metadata.annotations: Too long: must have at most 262144 bytes",
            name(c)
        );
        assert_eq!(stderr(&o).contains(&msg), big, "{}: {}", name(c), stderr(&o));
        assert_eq!(k.kubectl(&["get", "crd", name(c)]).status.success(), !big, "{}", name(c));
    }
    let mut ssa = vec!["apply", "--server-side", "--force-conflicts"];
    ssa.extend(&args[1..]);
    let o = k.kubectl(&ssa);
    assert!(o.status.success(), "{}", stderr(&o));
    for c in crds {
        let established = k.kubectl_ok(&[
            "get",
            "crd",
            name(c),
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ]);
        assert_eq!(established, "True", "{}", name(c));
    }
}

#[test]
fn cert_managers_crds_apply_client_side_and_server_side() {
    let (files, crds) = bundle("cert-manager-crds");
    assert_eq!(crds.len(), 6);
    // the biggest, issuers and clusterissuers, are over 256 KiB as YAML but not as the JSON
    // kubectl stores: the bundle applies client-side, as cert-manager's docs say it does
    assert!(crds.iter().all(|c| annotations_size(c) < LIMIT));
    let yaml_sizes: Vec<u64> = files.iter().map(|f| f.metadata().unwrap().len()).collect();
    assert!(yaml_sizes.iter().filter(|s| **s > LIMIT as u64).count() >= 2, "{yaml_sizes:?}");

    let k = Kubesim::start("kubesim");
    applies(&k, &files, &crds, &[]);
    k.apply(
        "kubesim",
        "apiVersion: cert-manager.io/v1\nkind: ClusterIssuer\nmetadata: {name: selfsigned}\nspec: {selfSigned: {}}\n---\napiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: web, namespace: default}\nspec: {secretName: web-tls, dnsNames: [web.example.com], issuerRef: {name: selfsigned, kind: ClusterIssuer}}\n",
    );
    k.kubectl_ok(&["get", "clusterissuer", "selfsigned"]);
    k.kubectl_ok(&["get", "certificate", "web", "-n", "default"]);
}

#[test]
fn prometheus_operators_big_crds_fail_client_side_and_apply_server_side() {
    let (files, crds) = bundle("prometheus-operator-crds");
    assert_eq!(crds.len(), 10);
    let total: u64 = files.iter().map(|f| f.metadata().unwrap().len()).sum();
    assert!(total > 4 * 1024 * 1024, "the bundle is {total} bytes");
    // which CRDs a real cluster refuses client-side (prometheus-operator's docs send users to
    // --server-side for them)
    let mut too_big: Vec<&str> = crds.iter().filter(|c| annotations_size(c) > LIMIT).map(name).collect();
    too_big.sort();
    assert_eq!(
        too_big,
        [
            "alertmanagerconfigs.monitoring.coreos.com",
            "alertmanagers.monitoring.coreos.com",
            "prometheusagents.monitoring.coreos.com",
            "prometheuses.monitoring.coreos.com",
            "scrapeconfigs.monitoring.coreos.com",
            "thanosrulers.monitoring.coreos.com",
        ]
    );

    let k = Kubesim::start("kubesim");
    applies(&k, &files, &crds, &too_big);
    k.apply(
        "kubesim",
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: web, namespace: default}\nspec: {selector: {matchLabels: {app: web}}, endpoints: [{port: http}]}\n---\napiVersion: monitoring.coreos.com/v1\nkind: Prometheus\nmetadata: {name: main, namespace: default}\nspec: {replicas: 1}\n",
    );
    k.kubectl_ok(&["get", "servicemonitor", "web", "-n", "default"]);
    k.kubectl_ok(&["get", "prometheus", "main", "-n", "default"]);
}

//! End-to-end tests of the kubectl adapter: the real kubectl 1.32 against a kubesim started per
//! test. Per-object checkpoints from apply's results and errors, rollout waits on a broken
//! image, and recovery by `kubectl diff` then an apply of only what is missing or differs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kubesim::testing::{kubectl_bin, workspace_root, Kubesim};
use rdeploy_adapters::kubectl::KubectlSpec;
use rdeploy_adapters::testing::{step_context, Recorder};
use rdeploy_adapters::{Adapter, Event, Failure, PriorStep, Recovered, StepContext, SubStatus, ToolSpec};

struct Setup {
    sim: Kubesim,
    stack: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        kubectl_bin();
        let sim = Kubesim::start("c1");
        let stack = tempfile::tempdir().unwrap();
        for sub in ["app", "broken", "issuer"] {
            let from = workspace_root().join("fixtures/kubectl").join(sub);
            std::fs::create_dir_all(stack.path().join(sub)).unwrap();
            for entry in std::fs::read_dir(from).unwrap() {
                let path = entry.unwrap().path();
                std::fs::copy(&path, stack.path().join(sub).join(path.file_name().unwrap())).unwrap();
            }
        }
        Setup { sim, stack }
    }

    fn spec(&self, manifest: &str) -> KubectlSpec {
        KubectlSpec {
            manifests: vec![PathBuf::from(manifest)],
            namespace: None,
            context: Some("c1".into()),
            kubeconfig: None,
            cluster_kubeconfig: None,
            server_side: None,
            // These tests are about what kubectl applies and recovers; waiting (the default in a
            // stack) has its own test below.
            wait: Some(false),
            binary: Some(kubectl_bin().to_string_lossy().into_owned()),
            outputs: Default::default(),
        }
    }

    fn ctx(&self, timeout: Duration) -> StepContext {
        StepContext {
            step: "extras".into(),
            work_dir: self.stack.path().join(".rdeploy/work/extras"),
            env: self.sim.env().into_iter().collect(),
            timeout: Some(timeout),
            ..step_context(self.stack.path())
        }
    }

    async fn apply(&self, spec: &KubectlSpec) -> (Recorder, Result<(), Failure>) {
        let sink = Recorder::default();
        let result = ToolSpec::Kubectl(spec.clone()).apply(&self.ctx(Duration::from_secs(60)), &sink).await;
        (sink, result)
    }

    async fn recover(&self, spec: &KubectlSpec, prior: &PriorStep) -> (Recorder, Result<Recovered, Failure>) {
        let sink = Recorder::default();
        let result = ToolSpec::Kubectl(spec.clone()).recover(&self.ctx(Duration::from_secs(60)), prior, &sink).await;
        (sink, result)
    }

    fn path(&self) -> &Path {
        self.stack.path()
    }

    fn write(&self, rel: &str, text: &str) {
        let path = self.stack.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

const APP_IDS: [&str; 5] = [
    "Namespace/shop",
    "ConfigMap/shop/settings",
    "Deployment/shop/web",
    "Service/shop/web",
    "ConfigMap/shop-extra/extra",
];

async fn first_apply_fails_on_the_missing_namespace(s: &Setup, spec: &KubectlSpec) -> PriorStep {
    let (sink, result) = s.apply(spec).await;
    let failure = result.unwrap_err();
    assert_eq!(failure.exit_code, Some(1));
    assert!(
        failure
            .summary
            .starts_with(r#"1 of 5 objects failed; ConfigMap/shop-extra/extra: Error from server (NotFound): "#),
        "{}",
        failure.summary
    );
    assert!(failure.summary.contains(r#"namespaces "shop-extra" not found"#), "{}", failure.summary);
    assert!(failure.hint.as_deref().unwrap().contains("rdeploy recover"), "{:?}", failure.hint);
    assert_eq!(sink.events()[0], Event::Planned { ids: APP_IDS.iter().map(|s| s.to_string()).collect() });
    let prior = sink.prior();
    for id in &APP_IDS[..4] {
        assert_eq!(prior.status_of(id), Some(SubStatus::Done), "{id}");
    }
    assert_eq!(prior.status_of(APP_IDS[4]), Some(SubStatus::Failed));
    assert!(sink.error_of(APP_IDS[4]).unwrap().contains(r#"namespaces "shop-extra" not found"#));
    prior
}

#[tokio::test]
async fn five_objects_one_fails_then_recover_applies_only_the_missing_one() {
    let s = Setup::new();
    let spec = s.spec("app/app.yaml");
    let prior = first_apply_fails_on_the_missing_namespace(&s, &spec).await;
    let settings_rv =
        s.sim.kubectl_ok(&["get", "cm", "settings", "-n", "shop", "-o", "jsonpath={.metadata.resourceVersion}"]);

    s.sim.kubectl_ok(&["create", "namespace", "shop-extra"]);
    let inspection = ToolSpec::Kubectl(spec.clone()).inspect(&s.ctx(Duration::from_secs(60)), &prior).await.unwrap();
    assert_eq!(inspection.remaining, vec![APP_IDS[4]]);
    assert!(
        inspection.actions.contains(&"apply ConfigMap/shop-extra/extra (missing from the cluster)".to_string()),
        "{:?}",
        inspection.actions
    );
    assert!(
        inspection.actions.contains(&"keep ConfigMap/shop/settings: done and unchanged".to_string()),
        "{:?}",
        inspection.actions
    );

    let (sink, result) = s.recover(&spec, &prior).await;
    result.unwrap();
    assert_eq!(sink.started(), vec![APP_IDS[4]]);
    assert!(sink.events().contains(&Event::Done { id: APP_IDS[4].into(), note: Some("created".into()) }));
    assert_eq!(s.sim.kubectl_ok(&["get", "cm", "extra", "-n", "shop-extra", "-o", "jsonpath={.data.owner}"]), "shop");
    let after =
        s.sim.kubectl_ok(&["get", "cm", "settings", "-n", "shop", "-o", "jsonpath={.metadata.resourceVersion}"]);
    assert_eq!(settings_rv, after, "recover touched an object that was done and unchanged");
}

#[tokio::test]
async fn drift_between_up_and_recover_is_diffed_and_reapplied() {
    let s = Setup::new();
    let spec = s.spec("app/app.yaml");
    let prior = first_apply_fails_on_the_missing_namespace(&s, &spec).await;

    // Someone changes a done object by hand, and fixes the cause of the failure.
    s.sim.kubectl_ok(&["patch", "cm", "settings", "-n", "shop", "-p", r#"{"data":{"color":"red"}}"#]);
    s.sim.kubectl_ok(&["create", "namespace", "shop-extra"]);
    let inspection = ToolSpec::Kubectl(spec.clone()).inspect(&s.ctx(Duration::from_secs(60)), &prior).await.unwrap();
    assert_eq!(inspection.remaining, vec![APP_IDS[1], APP_IDS[4]]);
    assert!(
        inspection.actions.contains(&"apply ConfigMap/shop/settings (differs from the live object)".to_string()),
        "{:?}",
        inspection.actions
    );

    let (sink, result) = s.recover(&spec, &prior).await;
    result.unwrap();
    let mut expected = vec![APP_IDS[1], APP_IDS[4]];
    expected.sort();
    assert_eq!(sink.started(), expected);
    assert!(sink.events().contains(&Event::Done { id: APP_IDS[1].into(), note: Some("configured".into()) }));
    assert_eq!(s.sim.kubectl_ok(&["get", "cm", "settings", "-n", "shop", "-o", "jsonpath={.data.color}"]), "blue");
}

#[tokio::test]
async fn server_side_apply_attributes_errors_without_a_file_name() {
    let s = Setup::new();
    let mut spec = s.spec("app");
    spec.server_side = Some(true);
    let (sink, result) = s.apply(&spec).await;
    assert!(result.is_err());
    assert!(sink.events().contains(&Event::Done { id: APP_IDS[2].into(), note: Some("serverside-applied".into()) }));
    assert_eq!(
        sink.error_of(APP_IDS[4]).as_deref(),
        Some(r#"Error from server (NotFound): namespaces "shop-extra" not found (app/app.yaml, document 5)"#)
    );
    // The diff of a recover runs server-side too: with the namespace still missing it fails
    // (exit 2), and the checkpoint alone decides.
    let inspection =
        ToolSpec::Kubectl(spec.clone()).inspect(&s.ctx(Duration::from_secs(60)), &sink.prior()).await.unwrap();
    assert!(
        inspection.actions[0].starts_with("`kubectl diff` failed (Error from server (NotFound)"),
        "{:?}",
        inspection.actions
    );
    assert_eq!(inspection.remaining, vec![APP_IDS[4]]);
}

#[tokio::test]
async fn a_broken_image_fails_wait_with_kubectls_message() {
    let s = Setup::new();
    let mut spec = s.spec("broken/broken.yaml");
    spec.wait = Some(true);
    let sink = Recorder::default();
    let started = std::time::Instant::now();
    let result = ToolSpec::Kubectl(spec.clone()).apply(&s.ctx(Duration::from_secs(3)), &sink).await;
    let failure = result.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    let error = sink.error_of("Deployment/default/canary").unwrap();
    assert!(error.starts_with("rollout did not finish: error: timed out waiting for the condition"), "{error}");
    assert!(
        error.contains(
            r#"(Waiting for deployment "canary" rollout to finish: 0 of 1 updated replicas are available...)"#
        ),
        "{error}"
    );
    assert!(
        failure.summary.starts_with("1 of 2 objects failed; Deployment/default/canary: rollout did not finish"),
        "{}",
        failure.summary
    );
    assert!(sink
        .events()
        .contains(&Event::Done { id: "Deployment/default/stable".into(), note: Some("rolled out".into()) }));

    // Recover: the spec is in place (no diff), but the rollout was never done: wait again.
    let inspection =
        ToolSpec::Kubectl(spec.clone()).inspect(&s.ctx(Duration::from_secs(3)), &sink.prior()).await.unwrap();
    assert_eq!(inspection.remaining, vec!["Deployment/default/canary"]);
    assert!(s.path().join(".rdeploy/work/extras/objects/apply-1/0001.json").is_file());
}

/// kube-prometheus ships Grafana's dashboards as one `ConfigMapList` document, its items
/// without apiVersion or kind; kubectl applies each item.
#[tokio::test]
async fn a_configmap_list_is_applied_item_by_item() {
    let s = Setup::new();
    s.write(
        "monitoring/dashboards.yaml",
        "apiVersion: v1\nkind: ConfigMapList\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: grafana-dashboard-nodes, namespace: default}\n  data: {nodes.json: '{}'}\n- metadata: {name: grafana-dashboard-pods, namespace: missing}\n  data: {pods.json: '{}'}\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ServiceAccount, metadata: {name: grafana}}\n",
    );
    let spec = s.spec("monitoring/dashboards.yaml");
    let (sink, result) = s.apply(&spec).await;
    assert_eq!(
        sink.planned(),
        vec![vec![
            "ConfigMap/default/grafana-dashboard-nodes".to_string(),
            "ConfigMap/missing/grafana-dashboard-pods".to_string(),
            "ServiceAccount/default/grafana".to_string()
        ]]
    );
    result.unwrap_err();
    assert_eq!(sink.done(), ["ConfigMap/default/grafana-dashboard-nodes", "ServiceAccount/default/grafana"]);
    assert_eq!(
        sink.error_of("ConfigMap/missing/grafana-dashboard-pods").as_deref(),
        Some(
            r#"Error from server (NotFound): error when creating: namespaces "missing" not found (monitoring/dashboards.yaml, document 1)"#
        )
    );
    s.sim.kubectl_ok(&["get", "cm", "grafana-dashboard-nodes", "-n", "default"]);

    // The failed item alone is applied again.
    s.sim.kubectl_ok(&["create", "namespace", "missing"]);
    let (sink, result) = s.recover(&spec, &sink.prior()).await;
    result.unwrap();
    assert_eq!(sink.started(), ["ConfigMap/missing/grafana-dashboard-pods"]);
    assert_eq!(
        s.sim.kubectl_ok(&["get", "cm", "grafana-dashboard-pods", "-n", "missing", "-o", "jsonpath={.data}"]),
        r#"{"pods.json":"{}"}"#
    );
}

/// Errors kubectl prints while reading the files (a kind whose CRD is not installed) come as
/// one bracketed aggregate when applying another object failed too; each is the object's own.
#[tokio::test]
async fn each_object_gets_its_own_kubectl_error() {
    let s = Setup::new();
    s.write(
        "k8s/mixed.yaml",
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: web}\nspec: {endpoints: [{port: http}]}\n---\napiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: web-alerts}\nspec: {groups: []}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: web-config, namespace: shop}\ndata: {a: '1'}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: fine}\ndata: {a: '1'}\n",
    );
    let (sink, result) = s.apply(&s.spec("k8s/mixed.yaml")).await;
    let failure = result.unwrap_err();
    assert_eq!(sink.done(), ["ConfigMap/default/fine"]);
    assert_eq!(
        sink.error_of("ServiceMonitor/default/web").as_deref(),
        Some(
            r#"resource mapping not found for name: "web" namespace: "default": no matches for kind "ServiceMonitor" in version "monitoring.coreos.com/v1"; ensure CRDs are installed first (k8s/mixed.yaml, document 1)"#
        )
    );
    assert!(
        sink.error_of("PrometheusRule/default/web-alerts").unwrap().contains(r#"no matches for kind "PrometheusRule""#),
        "{:?}",
        sink.failures()
    );
    assert_eq!(
        sink.error_of("ConfigMap/shop/web-config").as_deref(),
        Some(
            r#"Error from server (NotFound): error when creating: namespaces "shop" not found (k8s/mixed.yaml, document 3)"#
        )
    );
    // The step's summary is the first object's error, whole, on one line.
    assert_eq!(
        failure.summary,
        r#"3 of 4 objects failed; ServiceMonitor/default/web: resource mapping not found for name: "web" namespace: "default": no matches for kind "ServiceMonitor" in version "monitoring.coreos.com/v1"; ensure CRDs are installed first (k8s/mixed.yaml, document 1)"#
    );
    assert!(
        failure.stderr_tail.iter().any(|l| l.starts_with("[resource mapping not found")),
        "{:?}",
        failure.stderr_tail
    );
}

/// A CRD of about 270 KiB, like prometheus-operator's biggest: its client-side apply annotation
/// is over the API's 256 KiB limit on annotations.
fn big_crd() -> String {
    let props: serde_json::Map<String, serde_json::Value> = (0..1600)
        .map(|i| (format!("field{i:05}"), serde_json::json!({"type": "string", "description": "x".repeat(120)})))
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "bigs.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"kind": "Big", "plural": "bigs", "singular": "big", "listKind": "BigList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "properties": props}}}}}]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn a_crd_too_big_for_client_side_apply_says_so_and_server_side_recovers_it() {
    let s = Setup::new();
    s.write("crds/big.json", &big_crd());
    s.write("crds/small.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: small}\n");
    let mut spec = s.spec("crds");
    let (sink, result) = s.apply(&spec).await;
    let failure = result.unwrap_err();
    let id = "CustomResourceDefinition/bigs.example.com";
    assert_eq!(
        sink.error_of(id).as_deref(),
        Some(
            r#"The CustomResourceDefinition "bigs.example.com" is invalid: metadata.annotations: Too long: must have at most 262144 bytes (crds/big.json)"#
        )
    );
    assert_eq!(sink.done(), ["ConfigMap/default/small"]);
    let hint = failure.hint.unwrap();
    assert!(
        hint.starts_with("CustomResourceDefinition/bigs.example.com (263 KiB) is too big for client-side apply"),
        "{hint}"
    );
    assert!(hint.contains("set `server_side: true` on the step"), "{hint}");

    // As the hint says: server-side apply keeps no copy of the object in an annotation.
    spec.server_side = Some(true);
    let (sink, result) = s.recover(&spec, &sink.prior()).await;
    result.unwrap();
    assert_eq!(sink.started(), [id]);
    assert!(sink.events().contains(&Event::Done { id: id.into(), note: Some("serverside-applied".into()) }));
    s.sim.kubectl_ok(&["get", "crd", "bigs.example.com"]);
}

/// A custom resource applied before its CRD exists fails ("ensure CRDs are installed first")
/// and, its scope unknown, is recorded as namespaced. Once the CRD is in (cluster-scoped),
/// recover must apply it: `kubectl diff` names it `example.org.v1.Thing..t1`, which matched no
/// recorded object, and recover took it as "in place" and reported complete without applying.
#[tokio::test]
async fn a_custom_resource_whose_crd_came_later_is_applied_by_recover_not_taken_as_in_place() {
    let s = Setup::new();
    s.write(
        "k8s/thing.yaml",
        "apiVersion: example.org/v1\nkind: Thing\nmetadata: {name: t1}\nspec: {size: 3}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: thing-config}\n",
    );
    let spec = s.spec("k8s/thing.yaml");
    let (sink, result) = s.apply(&spec).await;
    result.unwrap_err();
    assert!(
        sink.error_of("Thing/default/t1").unwrap().contains("ensure CRDs are installed first"),
        "{:?}",
        sink.failures()
    );
    let crd = s.sim.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: things.example.org}\nspec:\n  group: example.org\n  scope: Cluster\n  names: {kind: Thing, plural: things, singular: thing}\n  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]\n",
    );
    assert!(crd.status.success(), "{}", String::from_utf8_lossy(&crd.stderr));
    s.sim.kubectl_ok(&["wait", "--for=condition=Established", "crd/things.example.org", "--timeout=60s"]);

    let (sink, result) = s.recover(&spec, &sink.prior()).await;
    result.unwrap();
    assert_eq!(sink.started(), ["Thing/t1"]);
    assert!(sink.warnings().iter().any(|w| w.starts_with("Thing/default/t1 is Thing/t1 now")), "{:?}", sink.warnings());
    assert_eq!(s.sim.kubectl_ok(&["get", "thing", "t1", "-o", "jsonpath={.spec.size}"]), "3");
}

//! End-to-end tests of the kubectl adapter: the real kubectl 1.32 against a kubesim started per
//! test. Per-object checkpoints from apply's results and errors, rollout waits on a broken
//! image, and recovery by `kubectl diff` then an apply of only what is missing or differs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kubesim::testing::{kubectl_bin, workspace_root, Kubesim};
use rdeploy_adapters::kubectl::KubectlSpec;
use rdeploy_adapters::testing::Recorder;
use rdeploy_adapters::{
    Adapter, CancellationToken, Event, Failure, PriorStep, Recovered, StepContext, SubStatus, ToolSpec,
};

struct Setup {
    sim: Kubesim,
    stack: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        kubectl_bin();
        let sim = Kubesim::start("c1");
        let stack = tempfile::tempdir().unwrap();
        for sub in ["app", "broken"] {
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
            server_side: None,
            wait: None,
            binary: Some(kubectl_bin().to_string_lossy().into_owned()),
        }
    }

    fn ctx(&self, timeout: Duration) -> StepContext {
        StepContext {
            step: "extras".into(),
            stack: "test".into(),
            stack_dir: self.stack.path().to_path_buf(),
            work_dir: self.stack.path().join(".rdeploy/work/extras"),
            env: self.sim.env().into_iter().collect(),
            timeout: Some(timeout),
            cancel: CancellationToken::new(),
            force: false,
            reapply_missing: false,
            secrets: Default::default(),
            processes: Default::default(),
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
        Some(r#"Error from server (NotFound): namespaces "shop-extra" not found"#)
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

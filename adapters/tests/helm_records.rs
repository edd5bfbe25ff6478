//! helm's release records read from the API in-process (`helm::records`) against what the real
//! helm 3 and helm 4 say of the same releases in kubesim (`helm history`, `helm status`), with
//! the Secret driver and `HELM_DRIVER=configmap`; and the helm adapter running one helm process
//! per apply (plus one `helm version` per binary), the reads going to the API.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kubesim::testing::{helm_bin, testdata, Kubesim};
use rdeploy_adapters::helm::records::{Driver, Records};
use rdeploy_adapters::helm::HelmSpec;
use rdeploy_adapters::testing::{step_context, Recorder};
use rdeploy_adapters::{Adapter, PriorStep, Recovered, StepContext, ToolSpec};

const NS: &str = "shop";

fn ctx(sim: &Kubesim, stack: &Path, extra: &[(&str, &str)]) -> StepContext {
    let mut env: BTreeMap<String, String> = sim.env().into_iter().collect();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    StepContext {
        step: "app".into(),
        work_dir: stack.join(".rdeploy/work/app"),
        env,
        timeout: Some(Duration::from_secs(30)),
        ..step_context(stack)
    }
}

/// helm `major` with the test's environment plus `extra`; must succeed; stdout.
fn helm(sim: &Kubesim, major: u32, extra: &[(&str, &str)], args: &[&str]) -> String {
    let out = sim.helm_cmd(major, args).envs(extra.iter().copied()).output().expect("run helm");
    assert!(out.status.success(), "helm{major} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Three revisions written by the real helm: installed, upgraded, then an upgrade the API
/// server rejects (failed); the records read in-process say what `helm history` and `helm
/// status` say of each.
async fn records_agree_with_helm(major: u32, driver: &str) {
    let sim = Kubesim::start("c1");
    let stack = tempfile::tempdir().unwrap();
    let extra: &[(&str, &str)] = &[("HELM_DRIVER", driver)];
    let chart = testdata("webapp");
    let chart = chart.to_str().unwrap();
    let base = ["-n", NS, "--kube-context", "c1"];
    let upgrade = |sets: &[&str]| {
        let mut args = vec!["upgrade", "--install", "web", chart, "--create-namespace"];
        args.extend(base);
        for s in sets {
            args.extend(["--set", s]);
        }
        let out = sim.helm_cmd(major, &args).envs(extra.iter().copied()).output().expect("run helm");
        out.status.success()
    };
    assert!(upgrade(&["color=green"]));
    assert!(upgrade(&["color=blue"]));
    assert!(!upgrade(&["color=red", "tier=not valid!"]), "the third upgrade is rejected by the API server");

    let records = Records::open("web", None, Some("c1"), Some(NS), &ctx(&sim, stack.path(), extra)).await.unwrap();
    let expected = if driver == "configmap" { Driver::ConfigMap } else { Driver::Secret };
    assert_eq!(records.driver(), expected);
    let mut args = vec!["history", "web", "-o", "json"];
    args.extend(base);
    let history: serde_json::Value = serde_json::from_str(&helm(&sim, major, extra, &args)).unwrap();
    let history = history.as_array().unwrap();

    let revisions = records.revisions().await.unwrap();
    let numbers = |v: &[serde_json::Value]| v.iter().map(|r| r["revision"].as_u64().unwrap()).collect::<Vec<_>>();
    assert_eq!(revisions.iter().map(|r| r.revision).collect::<Vec<_>>(), numbers(history));
    assert_eq!(
        revisions.iter().map(|r| r.status.as_str()).collect::<Vec<_>>(),
        ["superseded", "deployed", "failed"],
        "helm{major} {driver}"
    );
    for (label_only, helms) in revisions.iter().zip(history) {
        assert_eq!(label_only.status.as_str(), helms["status"].as_str().unwrap());
        let record = records.record(label_only.revision).await.unwrap().unwrap().revision;
        assert_eq!(record.status, label_only.status);
        assert_eq!(record.chart, helms["chart"].as_str().unwrap());
        assert_eq!(record.app_version, helms["app_version"].as_str().unwrap());
        assert_eq!(record.description, helms["description"].as_str().unwrap());
        // The same instant (helm's history prints it in its own zone format).
        assert_eq!(
            rdeploy_adapters::helm::state::parse_rfc3339(&record.updated),
            rdeploy_adapters::helm::state::parse_rfc3339(helms["updated"].as_str().unwrap()),
            "{} vs {}",
            record.updated,
            helms["updated"]
        );
    }
    let mut args = vec!["status", "web", "-o", "json"];
    args.extend(base);
    let status: serde_json::Value = serde_json::from_str(&helm(&sim, major, extra, &args)).unwrap();
    let latest = records.record(3).await.unwrap().unwrap();
    assert_eq!(latest.status.version, status["version"].as_u64().unwrap());
    assert_eq!(latest.status.config, status["config"]);
    assert_eq!(latest.status.info.status.as_str(), status["info"]["status"].as_str().unwrap());
    assert_eq!(latest.status.namespace, NS);
    let whole = records.release(3).await.unwrap().unwrap();
    assert_eq!(whole["manifest"], status["manifest"]);

    // A release with no records, and a revision that is not there.
    let none = Records::open("nothing", None, Some("c1"), Some(NS), &ctx(&sim, stack.path(), extra)).await.unwrap();
    assert!(none.revisions().await.unwrap().is_empty());
    assert_eq!(records.record(9).await.unwrap(), None);
}

macro_rules! both_majors_both_drivers {
    ($($case:ident),*) => {
        mod helm3 { $(
            #[tokio::test] async fn secrets() { super::$case(3, "secret").await }
            #[tokio::test] async fn configmaps() { super::$case(3, "configmap").await }
        )* }
        mod helm4 { $(
            #[tokio::test] async fn secrets() { super::$case(4, "secret").await }
            #[tokio::test] async fn configmaps() { super::$case(4, "configmap").await }
        )* }
    };
}
both_majors_both_drivers!(records_agree_with_helm);

#[tokio::test]
async fn storage_outside_the_api_and_cluster_overrides_are_left_to_helm() {
    let sim = Kubesim::start("c1");
    let stack = tempfile::tempdir().unwrap();
    for extra in [[("HELM_DRIVER", "sql")], [("HELM_DRIVER", "memory")], [("HELM_KUBEAPISERVER", "http://elsewhere")]] {
        let why = Records::open("web", None, Some("c1"), Some(NS), &ctx(&sim, stack.path(), &extra)).await.err();
        assert!(why.as_deref().is_some_and(|w| w.contains(extra[0].0)), "{extra:?}: {why:?}");
    }
}

#[tokio::test]
async fn an_unreachable_cluster_is_a_read_error_naming_the_release() {
    let sim = Kubesim::start("c1");
    let stack = tempfile::tempdir().unwrap();
    let dead = stack.path().join("kubeconfig");
    // A port nothing listens on: kubesim's own, once stopped, could be reused; port 1 never is.
    std::fs::write(
        &dead,
        "apiVersion: v1\nkind: Config\nclusters: [{name: d, cluster: {server: 'http://127.0.0.1:1'}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: d, context: {cluster: d, user: u}}]\ncurrent-context: d\n",
    )
    .unwrap();
    let records = Records::open("web", Some(dead), None, Some(NS), &ctx(&sim, stack.path(), &[])).await.unwrap();
    let error = records.revisions().await.unwrap_err();
    assert!(error.0.contains("listing helm's records of web in namespace shop"), "{error}");
}

fn plain(sink: &Recorder, key: &str) -> serde_json::Value {
    match sink.outputs().get(key) {
        Some(rdeploy_adapters::outputs::OutputValue::Plain(v)) => v.clone(),
        other => panic!("output {key}: {other:?}"),
    }
}

/// A `helm` that logs its arguments, one line per run, then runs the real one.
fn counting_helm(dir: &Path, major: u32) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let log = dir.join("helm-calls.log");
    let script = dir.join("helm");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$*\" >> '{}'\nexec '{}' \"$@\"\n", log.display(), helm_bin(major).display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, log)
}

/// An apply runs `helm version` once per binary and then `helm upgrade` alone: the history
/// before and after, and the outputs, come from the records; a failed upgrade and its recover
/// likewise (the recover reads the records, then one upgrade).
async fn one_helm_process_per_apply(major: u32) {
    let sim = Kubesim::start("c1");
    let stack = tempfile::tempdir().unwrap();
    let (binary, log) = counting_helm(stack.path(), major);
    let spec = |sets: &[(&str, &str)]| HelmSpec {
        marked: Default::default(),
        release: "web".into(),
        chart: testdata("webapp").to_string_lossy().into_owned(),
        namespace: Some(NS.into()),
        values: vec![],
        set: sets.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect(),
        version: None,
        context: Some("c1".into()),
        kubeconfig: None,
        cluster_kubeconfig: None,
        wait: Some(true),
        atomic: None,
        force: None,
        binary: Some(binary.to_string_lossy().into_owned()),
        recover: None,
    };
    let ctx = ctx(&sim, stack.path(), &[]);
    let calls = || -> Vec<String> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(' ').next().unwrap_or("").to_string())
            .collect()
    };

    let sink = Recorder::default();
    ToolSpec::Helm(spec(&[("color", "green")])).apply(&ctx, &sink).await.unwrap();
    assert_eq!(sink.done(), ["web@1"]);
    assert_eq!(plain(&sink, "revision"), serde_json::json!(1));
    assert_eq!(sink.fact("last_deployed_revision"), Some(serde_json::json!(1)));
    assert_eq!(calls(), ["version", "upgrade"]);

    let sink = Recorder::default();
    let failure = ToolSpec::Helm(spec(&[("tier", "not valid!")])).apply(&ctx, &sink).await.unwrap_err();
    assert!(failure.summary.contains("revision 2 failed: Upgrade \"web\" failed:"), "{}", failure.summary);
    assert!(failure.hint.as_deref().unwrap().contains("helm rollback web 1"), "{:?}", failure.hint);
    assert_eq!(sink.failed(), ["web@2"]);
    assert_eq!(calls(), ["version", "upgrade", "upgrade"]);

    let sink = Recorder::default();
    let recovered = ToolSpec::Helm(spec(&[("color", "blue")])).recover(&ctx, &PriorStep::default(), &sink).await;
    assert_eq!(recovered.unwrap(), Recovered::Complete);
    assert_eq!(sink.done(), ["web@3"]);
    assert_eq!(calls(), ["version", "upgrade", "upgrade", "upgrade"]);

    // In place: recover keeps it and takes the outputs from the record, no helm at all.
    let sink = Recorder::default();
    let recovered = ToolSpec::Helm(spec(&[("color", "blue")])).recover(&ctx, &PriorStep::default(), &sink).await;
    assert_eq!(recovered.unwrap(), Recovered::Complete);
    assert_eq!(sink.done(), ["web@3"]);
    assert_eq!(plain(&sink, "chart_version"), serde_json::json!("0.1.0"));
    assert_eq!(plain(&sink, "revision"), serde_json::json!(3));
    assert_eq!(plain(&sink, "namespace"), serde_json::json!(NS));
    assert_eq!(calls(), ["version", "upgrade", "upgrade", "upgrade"]);
}

#[tokio::test]
async fn one_helm_process_per_apply_helm3() {
    one_helm_process_per_apply(3).await
}

#[tokio::test]
async fn one_helm_process_per_apply_helm4() {
    one_helm_process_per_apply(4).await
}

//! Fleet steps through the real `rdeploy` binary, real helm 4 and real kubectl, against kubesim
//! fleets: one step runs once per cluster in waves, each cluster a checkpointed sub-change;
//! offline clusters are stragglers that `recover` finishes, a failing wave halts the rollout
//! before any later cluster is touched, and a done cluster never gets a second revision.

mod common;

use std::time::Duration;

use common::{step, sub_statuses, Project};
use kubesim::testing::{helm_bin, kubectl_bin, Kubesim};

const HELM: u32 = 4;

fn names(n: usize) -> String {
    (1..=n).map(|i| format!("edge-{i}")).collect::<Vec<_>>().join(",")
}

/// A project on the fleet: the kubesim environment and a one-Deployment chart.
fn project(sim: &Kubesim) -> Project {
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file("chart/Chart.yaml", "apiVersion: v2\nname: agent\nversion: 0.1.0\n");
    p.file("chart/values.yaml", "image: nginx:1.27\n");
    p.file(
        "chart/templates/deployment.yaml",
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: agent
spec:
  replicas: 1
  selector:
    matchLabels: { app: agent }
  template:
    metadata:
      labels: { app: agent }
    spec:
      containers:
        - name: agent
          image: {{ .Values.image | quote }}
"#,
    );
    p
}

/// A helm fleet step on `contexts`, with `rollout` and more keys (`extra`, one per line).
fn helm_stack(contexts: &str, rollout: &str, extra: &str) -> String {
    format!(
        r#"
name: fleet
steps:
  - name: agent
    tool: helm
    release: agent
    chart: chart
    namespace: monitoring
    binary: {helm}
    contexts: [{contexts}]
    timeout: 20s
    rollout: {rollout}
{extra}"#,
        helm = helm_bin(HELM).display(),
        extra = extra.lines().map(|l| format!("    {l}\n")).collect::<String>(),
    )
}

/// How many revisions the release has on `cluster` (0: not installed).
fn revisions(sim: &Kubesim, cluster: &str) -> usize {
    let out = sim.helm(HELM, &["history", "agent", "-n", "monitoring", "--kube-context", cluster, "-o", "json"]);
    if !out.status.success() {
        return 0;
    }
    let revs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("history json");
    revs.as_array().map(Vec::len).unwrap_or(0)
}

fn sub<'a>(status: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    step(status, "agent")["sub_changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no sub-change {id} in {status}"))
}

/// 10 clusters in three waves, one offline: the other nine are done, the offline one is a
/// straggler (exit 1, named with when it was last seen); once it is back, `recover` finishes it
/// and no other cluster gets a second revision.
#[test]
fn an_offline_cluster_is_a_straggler_and_recover_finishes_it_once_it_is_back() {
    let sim = Kubesim::start(&names(10));
    let p = project(&sim);
    p.stack(&helm_stack("edge-*", r#"{ waves: [1, "50%", "100%"], parallel: 4, inventory_timeout: 2s }"#, ""));
    sim.post("/_sim/clusters/edge-7/offline");

    let up = p.rdeploy(&["up"]);
    up.code(1).stdout_has("edge-7");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    for i in (1..=10).filter(|i| *i != 7) {
        let c = format!("edge-{i}");
        assert_eq!(sub(&status, &c)["status"], "done", "{c}: {status}");
        assert_eq!(revisions(&sim, &c), 1, "{c}");
    }
    let straggler = sub(&status, "edge-7");
    assert_eq!(straggler["status"], "pending", "{status}");
    assert!(straggler["note"].as_str().unwrap().contains("absent"), "{straggler}");
    let facts = &step(&status, "agent")["facts"];
    assert_eq!(
        facts["rollout"]["waves"],
        serde_json::json!([
            ["edge-1"],
            ["edge-2", "edge-3", "edge-4", "edge-5"],
            ["edge-6", "edge-7", "edge-8", "edge-9", "edge-10"]
        ])
    );

    sim.post("/_sim/clusters/edge-7/online");
    p.rdeploy(&["recover", "--dry-run"]).code(0).stdout_has("to apply: edge-7");
    p.rdeploy(&["recover"]).code(0);
    let status = p.status();
    assert_eq!(status["state"], "complete");
    assert!(sub_statuses(&status, "agent").iter().all(|(_, s)| s == "done"), "{status}");
    for i in 1..=10 {
        assert_eq!(revisions(&sim, &format!("edge-{i}")), 1, "edge-{i} must have exactly one revision");
    }
}

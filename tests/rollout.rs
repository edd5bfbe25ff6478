//! Fleet steps through the real `rdeploy` binary, real helm 4 and real kubectl, against kubesim
//! fleets: one step runs once per cluster in waves, each cluster a checkpointed sub-change;
//! offline clusters are stragglers that `recover` finishes, a failing wave halts the rollout
//! before any later cluster is touched, and a done cluster never gets a second revision.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{fleet_project, helm_group_for, step, sub_statuses, Project, Run};
use kubesim::testing::{helm_bin, kubectl_bin, Kubesim};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::time::Instant;

const HELM: u32 = 4;

fn names(n: usize) -> String {
    (1..=n).map(|i| format!("edge-{i}")).collect::<Vec<_>>().join(",")
}

/// A helm fleet step of `release` on `contexts`, with `rollout` and more keys (`extra`, one per
/// line). Each test has a release of its own: a helm naming the release anywhere on the machine
/// counts as alive for the abandoned-revision evidence.
fn helm_stack(release: &str, contexts: &str, rollout: &str, extra: &str) -> String {
    format!(
        r#"
name: agents
steps:
  - name: agent
    tool: helm
    release: {release}
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
fn revisions(sim: &Kubesim, release: &str, cluster: &str) -> usize {
    let out = sim.helm(HELM, &["history", release, "-n", "monitoring", "--kube-context", cluster, "-o", "json"]);
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
    let rel = "agent-straggler";
    let sim = Kubesim::start(&names(10));
    let p = fleet_project(&sim);
    let rollout = r#"{ waves: [1, "50%", "100%"], parallel: 4, inventory_timeout: 2s }"#;
    p.stack(&helm_stack(rel, "edge-*", rollout, "slo: \"90%@1h,100%@2h\""));
    sim.post("/_sim/clusters/edge-7/offline");

    p.rdeploy(&["up"])
        .code(1)
        .stdout_has("waves:    1: 1/1 done, 2: 4/4 done, 3: 4/5 passed (1 straggler)")
        .stdout_has("straggler: edge-7 (never seen by rdeploy)")
        .stdout_has("complete: 90% (9/10 clusters)")
        .stdout_has("slo: 90%@1h met");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    for i in (1..=10).filter(|i| *i != 7) {
        let c = format!("edge-{i}");
        assert_eq!(sub(&status, &c)["status"], "done", "{c}: {status}");
        assert_eq!(revisions(&sim, rel, &c), 1, "{c}");
    }
    let straggler = sub(&status, "edge-7");
    assert_eq!(straggler["status"], "pending", "{status}");
    assert!(straggler["note"].as_str().unwrap().contains("absent"), "{straggler}");
    assert_eq!(straggler["absent_since"], serde_json::Value::Null, "never seen: {straggler}");
    assert!(!straggler["absent_why"].as_str().unwrap().is_empty(), "{straggler}");
    assert_eq!(straggler["wave"], 3);
    let rollout = &step(&status, "agent")["rollout"];
    assert_eq!(rollout["percent"], 90.0, "{rollout}");
    assert_eq!(rollout["stragglers"][0]["id"], "edge-7", "{rollout}");
    assert_eq!(rollout["slo"][1]["state"], "pending", "{rollout}");
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
        assert_eq!(revisions(&sim, rel, &format!("edge-{i}")), 1, "edge-{i} must have exactly one revision");
    }

    // The rollout's journaled start is the start `inventory --slo` measures from.
    let started = step(&status, "agent")["facts"]["rollout"]["started"].as_str().unwrap().to_string();
    let inv =
        p.rdeploy(&["inventory", "--contexts", "edge-*", "--namespace", "monitoring", "--slo", "100%@1h", "--json"]);
    inv.code(0);
    let inv: serde_json::Value = serde_json::from_str(&inv.stdout).unwrap();
    let slo = &inv["slo"][0];
    assert_eq!(slo["started"], started.as_str(), "{inv}");
    assert!(slo["started_by"].as_str().unwrap().contains("rollout of step `agent`"), "{slo}");
}

/// A broken image on the first cluster fails the first wave (helm's wait times out): the rollout
/// halts with no cluster of the later waves touched, and its hint's rollback command names the
/// step's kubeconfig as helm found it, absolute (the stack's directory is not the working one);
/// once the image is fixed, `recover` upgrades the failed cluster and goes on.
#[test]
fn a_failing_first_wave_halts_the_rollout_before_any_later_cluster_is_touched() {
    let rel = "agent-broken";
    let sim = Kubesim::start(&names(5));
    let p = fleet_project(&sim);
    p.file("kube/fleet.yaml", &std::fs::read_to_string(&sim.kubeconfig).expect("the sim's kubeconfig"));
    let rollout = r#"{ waves: [1, "50%", "100%"], parallel: 2, max_failures: 0 }"#;
    let broken = "set: { image: \"nginx:broken\" }\nkubeconfig: kube/fleet.yaml";
    p.stack(&helm_stack(rel, "edge-*", rollout, broken).replace("timeout: 20s", "timeout: 5s"));
    let elsewhere = p.path("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("a directory beside the stack's");
    let args = ["up", "../stack.yaml"];
    let run = Run::from(p.command(&args).current_dir(&elsewhere).output().expect("run rdeploy"), &args);
    run.code(1).stdout_has("stopped in wave 1 of 3").stdout_has("no cluster of a later wave was touched");
    let hint = run.stdout.lines().find(|l| l.contains("to roll one cluster back")).unwrap_or_else(|| {
        panic!("no rollback hint:\n{}", run.stdout);
    });
    let kubeconfig = hint.split_whitespace().skip_while(|w| *w != "--kubeconfig").nth(1);
    let kubeconfig =
        kubeconfig.unwrap_or_else(|| panic!("no `--kubeconfig` in the hint: {hint}")).trim_end_matches('`');
    assert!(hint.contains("--kube-context edge-1"), "{hint}");
    // The user's file, absolute (to paste from anywhere): not the one cut for the cluster in
    // the state dir.
    assert!(kubeconfig.ends_with("/kube/fleet.yaml") && !kubeconfig.contains(".rdeploy"), "{hint}");
    assert!(Path::new(kubeconfig).is_absolute(), "{hint}");
    assert!(Path::new(kubeconfig).is_file(), "{kubeconfig} is no file");
    let status = p.status();
    assert_eq!(sub(&status, "edge-1")["status"], "failed", "{status}");
    assert_eq!(revisions(&sim, rel, "edge-1"), 1);
    for i in 2..=5 {
        let c = format!("edge-{i}");
        assert_eq!(sub(&status, &c)["status"], "pending", "{c}: {status}");
        assert_eq!(revisions(&sim, rel, &c), 0, "{c} is in a later wave and must not be touched");
    }

    // The runbook names the waves, the stop rule and the commands for the failed cluster.
    p.rdeploy(&["runbook"])
        .code(0)
        .stdout_has("- waves: 1, 50%, 100% (cumulative")
        .stdout_has("- stop rule: more than 0 failed clusters stop the rollout before the next wave")
        .stdout_has("roll back one cluster, from this directory: `")
        .stdout_has("helm rollback agent-broken REVISION -n monitoring --kube-context edge-1 --kubeconfig kube/fleet.yaml --wait`")
        .stdout_has("helm status agent-broken -n monitoring --kube-context CLUSTER");
    // From another directory, the commands are run from the stack's, where their paths are.
    let args = ["runbook", "../stack.yaml"];
    let run = Run::from(p.command(&args).current_dir(&elsewhere).output().expect("run rdeploy"), &args);
    run.code(0).stdout_has("roll back one cluster, from `cd ..`: `");

    p.stack(&helm_stack(rel, "edge-*", rollout, ""));
    p.rdeploy(&["recover"]).code(0);
    // edge-1 is the kubeconfig's current context: its failed revision, then the fixed one.
    assert_eq!(sim.helm_statuses(HELM, rel, "monitoring"), ["superseded", "deployed"]);
    for i in 2..=5 {
        assert_eq!(revisions(&sim, rel, &format!("edge-{i}")), 1, "edge-{i}");
    }
}

/// Polls `status --json` until `f` holds for it (or panics after `timeout`).
fn until_status(
    p: &Project,
    timeout: Duration,
    what: &str,
    mut f: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let end = Instant::now() + timeout;
    loop {
        let run = p.rdeploy(&["status", "--json"]);
        if let Ok(status) = serde_json::from_str::<serde_json::Value>(&run.stdout) {
            if status["steps"].as_array().is_some_and(|s| !s.is_empty()) && f(&status) {
                return status;
            }
        }
        assert!(Instant::now() < end, "timed out waiting for {what}: {}", run.stdout);
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn done_clusters(status: &serde_json::Value) -> Vec<String> {
    sub_statuses(status, "agent").into_iter().filter(|(_, s)| s == "done").map(|(id, _)| id).collect()
}

/// kill -9 of rdeploy in the middle of a wave: `recover` converges without `--force`, and no
/// cluster that was done before the kill gets a second revision. edge-6 is offline (`absent:
/// wait`) until after the kill, so the wave cannot finish before it under any load; the clusters
/// done before the kill are read from the journal after it.
#[test]
fn kill_9_during_a_wave_then_recover_converges_without_upgrading_a_done_cluster_again() {
    let rel = "agent-kill";
    let sim = Kubesim::start_with(&names(6), &["--pod-startup-ms", "1500"]);
    let p = fleet_project(&sim);
    p.stack(
        &helm_stack(rel, "edge-*", r#"{ waves: [1, "100%"], parallel: 2, absent: wait, inventory_timeout: 2s }"#, "")
            .replace("timeout: 20s", "timeout: 600s"),
    );
    sim.post("/_sim/clusters/edge-6/offline");
    let mut child = p.spawn(&["up"]);
    until_status(&p, Duration::from_secs(120), "three clusters done", |s| {
        step(s, "agent")["sub_changes"].as_array().is_some() && done_clusters(s).len() >= 3
    });
    child.kill().unwrap();
    let _ = child.wait();
    let status = p.status();
    let done_before: Vec<String> = done_clusters(&status);
    assert!(done_before.len() >= 3, "{status}");
    assert!(!done_before.iter().any(|c| c == "edge-6"), "edge-6 is offline, it cannot be done: {status}");
    sim.post("/_sim/clusters/edge-6/online");

    p.rdeploy(&["recover"]).code(0);
    let status = p.status();
    assert_eq!(status["state"], "complete", "{status}");
    for c in &done_before {
        assert_eq!(revisions(&sim, rel, c), 1, "{c} was done before the kill and must not be upgraded again");
    }
    for i in 1..=6 {
        let c = format!("edge-{i}");
        let out = sim.helm_ok(HELM, &["status", rel, "-n", "monitoring", "--kube-context", &c, "-o", "json"]);
        let st: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(st["info"]["status"], "deployed", "{c}");
    }
}

/// The bake holds the next wave: while wave 1 bakes, no cluster of wave 2 has the release; once
/// the bake has passed (with wave 1 read again, still healthy), wave 2 runs. What holds under any
/// load: the `helm history` reads prove "untouched" only when the bake is still running after
/// them; the ordering is proven from the journal and helm's own records either way (each wave-2
/// cluster's first revision was made after the bake's recorded end).
#[test]
fn the_bake_holds_the_next_wave_until_it_has_passed() {
    let rel = "agent-bake";
    let sim = Kubesim::start(&names(3));
    let p = fleet_project(&sim);
    p.stack(&helm_stack(rel, "edge-*", r#"{ waves: [1, "100%"], parallel: 2, bake: 6s }"#, ""));
    let mut child = p.spawn(&["up"]);
    let baking = |s: &serde_json::Value| {
        let bake = &step(s, "agent")["facts"]["bake"];
        bake["wave"] == 1 && bake.get("ended").is_none()
    };
    let status = until_status(&p, Duration::from_secs(120), "the bake of wave 1", baking);
    let until = step(&status, "agent")["facts"]["bake"]["until"].clone();
    assert_eq!(sub(&status, "edge-1")["status"], "done", "{status}");
    let mut untouched = Vec::new();
    for c in ["edge-2", "edge-3"] {
        assert_eq!(sub(&status, c)["status"], "pending", "{status}");
        untouched.push((c, revisions(&sim, rel, c)));
    }
    // The same bake still running after the reads: they were made while it held wave 2.
    let after = p.status();
    if baking(&after) && step(&after, "agent")["facts"]["bake"]["until"] == until {
        for (c, n) in &untouched {
            assert_eq!(*n, 0, "{c} is in wave 2: untouched while wave 1 bakes");
        }
    }
    assert!(child.wait().unwrap().success());
    let status = p.status();
    assert_eq!(status["state"], "complete", "{status}");
    let ended = step(&status, "agent")["facts"]["bake"]["ended"]
        .as_str()
        .unwrap_or_else(|| panic!("the bake has no recorded end: {status}"))
        .to_string();
    let ended = parse_time(&ended);
    for c in ["edge-1", "edge-2", "edge-3"] {
        assert_eq!(revisions(&sim, rel, c), 1, "{c}");
    }
    for c in ["edge-2", "edge-3"] {
        let first = first_revision_time(&sim, rel, c);
        assert!(first >= ended, "{c}'s first revision ({first}) was made before the bake of wave 1 ended ({ended})");
    }
}

fn parse_time(text: &str) -> time::OffsetDateTime {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("not an RFC 3339 time: {text}: {e}"))
}

/// When helm made the release's first revision in `cluster` (helm's own record).
fn first_revision_time(sim: &Kubesim, release: &str, cluster: &str) -> time::OffsetDateTime {
    let out = sim.helm_ok(HELM, &["history", release, "-n", "monitoring", "--kube-context", cluster, "-o", "json"]);
    let revs: serde_json::Value = serde_json::from_str(&out).expect("history json");
    let first = revs.as_array().and_then(|r| r.iter().find(|r| r["revision"] == 1)).expect("revision 1");
    parse_time(first["updated"].as_str().unwrap_or_else(|| panic!("no `updated` in {first}")))
}

/// `absent: wait`: the wave waits for an offline cluster and goes on once it answers.
#[test]
fn absent_wait_waits_for_an_offline_cluster_then_goes_on() {
    let rel = "agent-wait";
    let sim = Kubesim::start(&names(3));
    let p = fleet_project(&sim);
    p.stack(
        &helm_stack(rel, "edge-*", r#"{ waves: [1, "100%"], parallel: 3, absent: wait, inventory_timeout: 2s }"#, "")
            .replace("timeout: 20s", "timeout: 120s"),
    );
    sim.post("/_sim/clusters/edge-3/offline");
    let mut child = p.spawn(&["up"]);
    until_status(&p, Duration::from_secs(120), "the wave waiting for edge-3", |s| {
        step(s, "agent")["warnings"]
            .as_array()
            .is_some_and(|w| w.iter().any(|m| m.as_str().unwrap_or("").contains("waits for it")))
            && done_clusters(s).len() == 2
    });
    assert_eq!(revisions(&sim, rel, "edge-2"), 1);
    sim.post("/_sim/clusters/edge-3/online");
    assert!(child.wait().unwrap().success(), "the deploy goes on once edge-3 answers");
    let status = p.status();
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(revisions(&sim, rel, "edge-3"), 1);
}

/// A kubectl fleet step: the manifests are applied once per listed context, each cluster done.
#[test]
fn a_kubectl_fleet_step_applies_its_manifests_once_per_cluster() {
    let sim = Kubesim::start(&names(3));
    let p = fleet_project(&sim);
    p.file(
        "k8s/config.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: agent-config\n  namespace: default\ndata:\n  level: info\n",
    );
    p.stack(&format!(
        r#"
name: agents
steps:
  - name: agent
    tool: kubectl
    manifests: [k8s/]
    binary: {kubectl}
    contexts: [edge-3, edge-1, edge-2]
    rollout: {{ waves: [1, "100%"], parallel: 2 }}
"#,
        kubectl = kubectl_bin().display()
    ));
    p.rdeploy(&["up"]).code(0);
    let status = p.status();
    assert_eq!(
        sub_statuses(&status, "agent"),
        [("edge-1", "done"), ("edge-2", "done"), ("edge-3", "done")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(sub(&status, "edge-1")["note"], "1 object applied");
    for c in ["edge-1", "edge-2", "edge-3"] {
        let level =
            sim.kubectl_ok(&["--context", c, "get", "configmap", "agent-config", "-o", "jsonpath={.data.level}"]);
        assert_eq!(level, "info", "{c}");
    }

    // A fleet file's clusters, narrowed by a selector on their labels, in the file's order.
    p.file("fleet.yaml", "clusters:\n  edge-3: { tier: edge }\n  edge-1: { tier: core }\n  edge-2: { tier: edge }\n");
    p.stack(
        &p.read("stack.yaml")
            .replace("contexts: [edge-3, edge-1, edge-2]", "fleet: fleet.yaml\n    selector: tier=edge"),
    );
    p.rdeploy(&["up"]).code(0);
    let status = p.status();
    assert_eq!(step(&status, "agent")["facts"]["rollout"]["waves"], serde_json::json!([["edge-3"], ["edge-2"]]));
}

/// A fleet cluster's kubeconfig, cut from the step's `kubeconfig`, names the files the user's
/// names relative to it (`certificate-authority: certs/ca.crt`) absolute: the cut one lives in
/// the state directory, and kubectl reads a relative path against the folder of the file it
/// loaded.
#[test]
fn a_fleet_clusters_kubeconfig_names_the_users_relative_files_absolute() {
    let sim = Kubesim::start(&names(2));
    let p = fleet_project(&sim);
    let ca = rcgen::CertificateParams::new(Vec::<String>::new())
        .expect("CA params")
        .self_signed(&rcgen::KeyPair::generate().expect("CA key"))
        .expect("self-signed CA");
    p.file("kube/certs/ca.crt", &ca.pem());
    // kubesim serves plain http: kubectl reads the CA file but has no use for it.
    let fleet = std::fs::read_to_string(&sim.kubeconfig).expect("the sim's kubeconfig");
    assert!(fleet.contains("  cluster:\n"), "{fleet}");
    p.file("kube/fleet.yaml", &fleet.replace("  cluster:\n", "  cluster:\n    certificate-authority: certs/ca.crt\n"));
    p.file(
        "k8s/config.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ca-config\n  namespace: default\ndata:\n  level: info\n",
    );
    let direct = Command::new(kubectl_bin())
        .args(["--kubeconfig", "kube/fleet.yaml", "--context", "edge-1", "get", "ns"])
        .current_dir(p.path(""))
        .envs(sim.env())
        .output()
        .expect("run kubectl");
    assert!(direct.status.success(), "kubectl with the user's file: {}", String::from_utf8_lossy(&direct.stderr));
    p.stack(&format!(
        r#"
name: agents
steps:
  - name: agent
    tool: kubectl
    manifests: [k8s/]
    binary: {kubectl}
    kubeconfig: kube/fleet.yaml
    contexts: [edge-1]
"#,
        kubectl = kubectl_bin().display()
    ));
    p.rdeploy(&["up"]).code(0);
    assert_eq!(sub(&p.status(), "edge-1")["status"], "done");
    let level =
        sim.kubectl_ok(&["--context", "edge-1", "get", "configmap", "ca-config", "-o", "jsonpath={.data.level}"]);
    assert_eq!(level, "info");
}

/// A release this deploy's killed run left pending-upgrade on one cluster of the fleet is
/// recovered without `--force`, as on a single-cluster step: the journal shows this deploy
/// started that revision there, the run is dead, and no helm names the release. The cluster done
/// before the kill keeps its one upgrade.
#[test]
fn a_pending_upgrade_a_killed_run_left_on_one_cluster_is_recovered_without_force() {
    let rel = "abandoned-fleet";
    let sim = Kubesim::start(&names(2));
    let p = fleet_project(&sim);
    let rollout = r#"{ waves: [1, "100%"], parallel: 1 }"#;
    p.stack(&helm_stack(rel, "edge-*", rollout, ""));
    p.rdeploy(&["up"]).code(0);

    p.stack(&helm_stack(rel, "edge-*", rollout, "set: { image: \"nginx:1.28\" }"));
    sim.control("POST", "/_sim/clusters/edge-2/slow?ms=300");
    let mut child = p.spawn(&["up"]);
    let pending = format!(
        "/clusters/edge-2/api/v1/namespaces/monitoring/secrets?labelSelector=name%3D{rel}%2Cowner%3Dhelm%2Cstatus%3Dpending-upgrade"
    );
    let seen = sim.eventually(Duration::from_secs(90), || sim.control("GET", &pending).contains("sh.helm.release.v1."));
    // helm gets no chance to mark the revision failed: its group is stopped, then killed with rdeploy.
    let group = helm_group_for(rel, "upgrade");
    if let Some(pgid) = group {
        let _ = kill(Pid::from_raw(-pgid), Signal::SIGSTOP);
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    if let Some(pgid) = group {
        let _ = kill(Pid::from_raw(-pgid), Signal::SIGKILL);
    }
    child.wait().unwrap();
    sim.control("POST", "/_sim/clusters/edge-2/slow?ms=0");
    assert!(seen && group.is_some(), "helm never left a pending-upgrade revision on edge-2");
    let statuses = |c: &str| {
        let out = sim.helm_ok(HELM, &["history", rel, "-n", "monitoring", "--kube-context", c, "-o", "json"]);
        let revs: serde_json::Value = serde_json::from_str(&out).unwrap();
        revs.as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(statuses("edge-2"), ["deployed", "pending-upgrade"]);
    assert_eq!(sub(&p.status(), "edge-2")["uncertain"], true);

    p.rdeploy(&["recover"])
        .code(0)
        .stderr_has(&format!("rolled back abandoned revision 2 of {rel} (pending-upgrade) to revision 1"));
    assert_eq!(
        statuses("edge-2"),
        ["superseded", "pending-upgrade", "superseded", "deployed"],
        "one rollback and one upgrade"
    );
    assert_eq!(statuses("edge-1"), ["superseded", "deployed"], "edge-1 was done before the kill: upgraded once");
    let status = p.status();
    assert_eq!(status["state"], "complete", "{status}");
    assert_eq!(sub(&status, "edge-2")["status"], "done");
}

/// A fleet step asks `helm version` once for all its clusters (preflight and every cluster share
/// the answer), and each cluster costs one helm process, the upgrade: the history before and
/// after is read from helm's release records in the API (no `helm history`, no `helm status`,
/// no `helm get metadata`).
#[test]
fn a_fleet_step_asks_helm_version_once_and_one_helm_process_per_cluster() {
    let rel = "agent-helmcut";
    let sim = Kubesim::start(&names(4));
    let p = fleet_project(&sim);
    p.file(
        "bin/helm",
        &format!(
            "#!/bin/sh\ncase \" $* \" in *' --dry-run'*) verb=dry-run ;; *) verb=\"$1\" ;; esac\necho \"$verb\" >> '{}'\nexec '{}' \"$@\"\n",
            p.path("helm-calls").display(),
            helm_bin(HELM).display()
        ),
    );
    std::fs::set_permissions(p.path("bin/helm"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let stack = helm_stack(rel, "edge-*", r#"{ waves: [1, "100%"], parallel: 2 }"#, "")
        .replace(&helm_bin(HELM).display().to_string(), &p.path("bin/helm").display().to_string());
    p.stack(&stack);
    p.rdeploy(&["up"]).code(0);
    let mut calls = p.lines("helm-calls");
    calls.sort();
    let count = |verb: &str| calls.iter().filter(|c| *c == verb).count();
    assert_eq!([count("version"), count("history"), count("upgrade"), calls.len()], [1, 0, 4, 5], "{calls:?}");
    for i in 1..=4 {
        assert_eq!(revisions(&sim, rel, &format!("edge-{i}")), 1, "edge-{i}");
    }
    // Run again, every cluster is in place (its record: deployed, this chart's digest): one
    // server dry-run per cluster to compare values and live objects, no upgrade, no other helm.
    std::fs::remove_file(p.path("helm-calls")).unwrap();
    p.rdeploy(&["up"]).code(0);
    let mut calls = p.lines("helm-calls");
    calls.sort();
    let count = |verb: &str| calls.iter().filter(|c| *c == verb).count();
    assert_eq!([count("version"), count("dry-run"), count("upgrade"), calls.len()], [1, 4, 0, 5], "{calls:?}");
    for i in 1..=4 {
        assert_eq!(revisions(&sim, rel, &format!("edge-{i}")), 1, "edge-{i} was not upgraded again");
    }
}

/// Each cluster's helm reads a kubeconfig holding only that cluster's context (the fleet's
/// names every cluster, and helm parses all of it on each start), from rdeploy's memory: once the
/// run is over, no copy of it is left in the state directory.
#[test]
fn each_clusters_helm_reads_a_kubeconfig_of_its_own_context_only() {
    let rel = "agent-ownkc";
    let sim = Kubesim::start(&names(3));
    let p = fleet_project(&sim);
    // Logs, for each helm start, the verb and how many contexts its `--kubeconfig` names.
    p.file(
        "bin/helm",
        &format!(
            r#"#!/bin/sh
kc=
prev=
for a in "$@"; do [ "$prev" = --kubeconfig ] && kc="$a"; prev="$a"; done
n=all
[ -n "$kc" ] && n=$('{kubectl}' config get-contexts --kubeconfig "$kc" -o name | tr '\n' ' ')
echo "$1 $n" >> '{log}'
exec '{helm}' "$@"
"#,
            kubectl = kubectl_bin().display(),
            log = p.path("helm-calls").display(),
            helm = helm_bin(HELM).display()
        ),
    );
    std::fs::set_permissions(p.path("bin/helm"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let stack = helm_stack(rel, "edge-*", r#"{ waves: [1, "100%"], parallel: 2 }"#, "")
        .replace(&helm_bin(HELM).display().to_string(), &p.path("bin/helm").display().to_string());
    p.stack(&stack);
    p.rdeploy(&["up"]).code(0);
    let mut upgrades: Vec<String> = p.lines("helm-calls").into_iter().filter(|l| l.starts_with("upgrade")).collect();
    upgrades.sort();
    assert_eq!(upgrades, ["upgrade edge-1 ", "upgrade edge-2 ", "upgrade edge-3 "], "{:?}", p.lines("helm-calls"));
    for i in 1..=3 {
        assert_eq!(revisions(&sim, rel, &format!("edge-{i}")), 1, "edge-{i}");
    }
    let left: Vec<_> = walkdir(&p.path(".rdeploy")).into_iter().filter(|f| f.ends_with("kubeconfig")).collect();
    assert!(left.is_empty(), "a cluster's kubeconfig was left behind: {left:?}");
}

/// Every path under `dir`, links included (not followed).
fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(walkdir(&path));
        }
        found.push(path);
    }
    found
}

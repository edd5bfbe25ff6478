//! The fleet against kubesim fleets seeded with the real kubectl: `rdeploy inventory` names
//! stragglers of every kind and absent clusters, gates refuse a contract step through the real
//! `rdeploy up` (exit 4) until the fleet catches up or an unexpired exception covers a cluster,
//! and the rollout-completion SLO is computed on recorded rollout starts.

mod common;

use std::time::{Duration, Instant};

use common::{step, Project, Run};
use kubesim::testing::Kubesim;
use serde_json::Value;

const AGENT: &str = "registry.example/node-agent";

/// A kubesim serving a named fleet (pods start fast), with extra flags such as `--taint-node`.
struct Fleet(Kubesim);

impl Fleet {
    fn start(clusters: &str, extra: &[&str]) -> Fleet {
        let mut flags = vec!["--pod-startup-ms", "20"];
        flags.extend_from_slice(extra);
        Fleet(Kubesim::start_with(clusters, &flags))
    }

    fn apply(&self, ctx: &str, yaml: &str) {
        self.0.apply(ctx, yaml);
    }

    fn control(&self, path: &str) {
        self.0.post(path);
    }

    fn kubeconfig(&self) -> String {
        self.0.kubeconfig.to_string_lossy().into_owned()
    }
}

/// A project whose rdeploy runs see only this fleet's kubeconfig and an empty HOME.
fn project(fleet: &Fleet) -> Project {
    let mut p = Project::new();
    let home = p.path("home");
    std::fs::create_dir_all(&home).unwrap();
    p.env("HOME", &home.to_string_lossy()).env("KUBECONFIG", &fleet.kubeconfig());
    p
}

fn agent_ds(version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: mon}}\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: node-agent, namespace: mon, labels: {{app: node-agent}}}}\nspec:\n  selector: {{matchLabels: {{app: node-agent}}}}\n  template:\n    metadata: {{labels: {{app: node-agent}}}}\n    spec: {{containers: [{{name: agent, image: \"{AGENT}:{version}\"}}]}}\n"
    )
}

fn shop(api: &str, report: &str, paused: bool) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: api, namespace: shop, labels: {{app: api}}}}\nspec:\n  paused: {paused}\n  selector: {{matchLabels: {{app: api}}}}\n  template:\n    metadata: {{labels: {{app: api}}}}\n    spec: {{containers: [{{name: api, image: \"registry.example/shop-api:{api}\"}}]}}\n---\napiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: report, namespace: shop}}\nspec:\n  schedule: '0 3 * * *'\n  jobTemplate:\n    spec:\n      template:\n        spec: {{restartPolicy: Never, containers: [{{name: report, image: \"registry.example/report:{report}\"}}]}}\n"
    )
}

const CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: applications.argoproj.io}
spec:
  group: argoproj.io
  names: {kind: Application, listKind: ApplicationList, plural: applications, singular: application}
  scope: Namespaced
  versions: [{name: v1alpha1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: kustomizations.kustomize.toolkit.fluxcd.io}
spec:
  group: kustomize.toolkit.fluxcd.io
  names: {kind: Kustomization, listKind: KustomizationList, plural: kustomizations, singular: kustomization}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
"#;

/// An Argo CD Application and a Flux Kustomization with their status (no status subresource
/// in these CRDs, so apply writes it, as the controllers would).
fn gitops(argo_revision: &str, target: &str, flux_revision: &str, suspend: bool) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: argocd}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: flux-system}}\n---\napiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {{name: node-agent, namespace: argocd}}\nspec: {{project: default, source: {{repoURL: 'https://git.example/fleet', path: agent, targetRevision: {target}}}}}\nstatus: {{sync: {{status: Synced, revision: {argo_revision}}}, health: {{status: Healthy}}}}\n---\napiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {{name: apps, namespace: flux-system}}\nspec: {{interval: 10m, path: ./apps, suspend: {suspend}, sourceRef: {{kind: GitRepository, name: fleet}}}}\nstatus: {{lastAppliedRevision: '{flux_revision}', conditions: [{{type: Ready, status: 'True'}}]}}\n"
    )
}

/// Runs `rdeploy inventory --json ARGS` until `ready` holds for the parsed report (pods need a
/// moment to start), returning the last run.
fn inventory_until(p: &Project, args: &[&str], ready: impl Fn(&Value) -> bool) -> (Run, Value) {
    let mut full = vec!["inventory", "--json"];
    full.extend_from_slice(args);
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let run = p.rdeploy(&full);
        let report: Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("inventory --json is not JSON ({e}):\n{}\n{}", run.stdout, run.stderr));
        if ready(&report) {
            return (run, report);
        }
        if Instant::now() > end {
            panic!(
                "`rdeploy {}` never showed the expected state within 30 s; last report:\n{report:#}",
                full.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn component<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["component"] == name)
        .unwrap_or_else(|| panic!("no component {name} in {report:#}"))
}

fn straggler_reasons(report: &Value, comp: &str, cluster: &str) -> String {
    component(report, comp)["stragglers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["cluster"] == cluster)
        .map(|s| s["reasons"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect::<Vec<_>>().join("; "))
        .unwrap_or_else(|| panic!("{cluster} is not a straggler of {comp}: {:#}", component(report, comp)))
}

fn done(report: &Value, comp: &str) -> u64 {
    component(report, comp)["done"].as_u64().unwrap()
}

#[test]
fn inventory_names_stragglers_of_every_kind_and_absent_clusters() {
    let f = Fleet::start("edge-1,edge-2,edge-3,edge-4,edge-5,edge-6", &["--taint-node", "edge-3/node-3"]);
    for ctx in ["edge-1", "edge-2", "edge-3", "edge-4", "edge-5", "edge-6"] {
        let agent = if ctx == "edge-2" { "1.9" } else { "2.0" };
        let report = if ctx == "edge-5" { "1.4" } else { "1.5" };
        let (argo, target) = if ctx == "edge-2" { ("old123", "v1.9") } else { ("new456", "HEAD") };
        let (flux, suspend) = if ctx == "edge-5" { ("main@sha1:0ld", true) } else { ("main@sha1:new", false) };
        f.apply(ctx, CRDS);
        f.apply(
            ctx,
            &format!(
                "{}---\n{}---\n{}",
                agent_ds(agent),
                shop("3.1", report, ctx == "edge-4"),
                gitops(argo, target, flux, suspend)
            ),
        );
    }
    let p = project(&f);
    p.file("fleet.yaml", "clusters:\n  edge-1: {site: lyon, region: eu}\n  edge-2: {site: oslo, region: eu}\n  edge-3: {site: nyc, region: us}\n  edge-4: {site: sfo, region: us}\n  edge-5: {site: tko, region: ap}\n  edge-6: {site: syd, region: ap}\n");
    // A first inventory sees every cluster; then edge-6 goes offline.
    inventory_until(&p, &["--fleet", "fleet.yaml"], |r| done(r, AGENT) == 4);
    f.control("/_sim/clusters/edge-6/offline");
    let (run, r) = inventory_until(&p, &["--fleet", "fleet.yaml"], |r| {
        done(r, AGENT) == 3 && done(r, "registry.example/shop-api") == 4
    });
    run.code(0);

    assert_eq!((r["clusters"].as_u64(), r["answered"].as_u64()), (Some(6), Some(5)));
    let absent = &r["absent"][0];
    assert_eq!(absent["cluster"], "edge-6");
    assert_eq!(absent["labels"]["site"], "syd");
    assert!(absent["last_seen"].is_string(), "the first inventory saw it: {absent}");

    // Old image, and the Argo CD Application that pins it.
    let why = straggler_reasons(&r, AGENT, "edge-2");
    assert!(why.contains("old version 1.9 (wanted 2.0) in DaemonSet mon/node-agent"), "{why}");
    assert!(why.contains("Argo CD Application argocd/node-agent pinned to revision old123 (asks for v1.9); up-to-date clusters have new456"), "{why}");
    // DaemonSet halted on the tainted node.
    let why = straggler_reasons(&r, AGENT, "edge-3");
    assert!(why.contains("DaemonSet mon/node-agent halted on node node-3"), "{why}");
    assert!(why.contains("untolerated taint"), "{why}");
    // Paused Deployment.
    let why = straggler_reasons(&r, "registry.example/shop-api", "edge-4");
    assert!(why.contains("Deployment shop/api paused"), "{why}");
    // CronJob with an old image, and the suspended Flux Kustomization.
    let why = straggler_reasons(&r, "registry.example/report", "edge-5");
    assert!(why.contains("old version 1.4 (wanted 1.5) in CronJob shop/report"), "{why}");
    assert!(why.contains("Flux Kustomization flux-system/apps suspended at revision main@sha1:0ld"), "{why}");

    let agent = component(&r, AGENT);
    assert_eq!(
        (agent["done"].as_u64(), agent["in_scope"].as_u64()),
        (Some(3), Some(6)),
        "absent counts against completion"
    );
    let versions: Vec<(String, usize)> = agent["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["version"].as_str().unwrap().to_string(), v["clusters"].as_array().unwrap().len()))
        .collect();
    assert_eq!(versions, [("2.0".to_string(), 4), ("1.9".to_string(), 1)]);

    // The same facts as a terminal table and as markdown.
    let text = p.rdeploy(&["inventory", "--fleet", "fleet.yaml", "--supported", "1"]);
    text.code(0)
        .stdout_has("fleet inventory at ")
        .stdout_has("registry.example/node-agent  3/6 clusters done on 2.0")
        .stdout_has("straggler edge-2 [region=eu site=oslo]: old version 1.9")
        .stdout_has("edge-6 [region=ap site=syd]: absent since ")
        .stdout_has("registry.example/node-agent 1.9 is older than the supported versions (2.0) on edge-2");
    let md = p.rdeploy(&["inventory", "--fleet", "fleet.yaml", "--markdown"]);
    md.code(0)
        .stdout_has("## `registry.example/node-agent`")
        .stdout_has("| `1.9` | 1 | edge-2 |")
        .stdout_has("- **edge-3** [region=us site=nyc]: DaemonSet mon/node-agent halted on node node-3");
    assert!(p.exists(".rdeploy/fleet/last-seen.json") && p.exists(".rdeploy/fleet/rollouts.json"));
}

fn gated_stack(kubeconfig: &str, exceptions: &str) -> String {
    format!(
        r#"
name: s
steps:
  - name: add-column
    tool: shell
    phase: expand
    run: touch expanded
  - name: drop-old-column
    tool: shell
    phase: contract
    needs: [add-column]
    run: touch contracted
    gate:
      inventory:
        contexts: ['edge-*']
        kubeconfig: {kubeconfig}
        namespace: mon
        selector: app=node-agent
        image: {AGENT}
        version: "2.0"
{exceptions}"#
    )
}

#[test]
fn an_offline_cluster_is_absent_and_blocks_the_gate_until_it_is_back() {
    let f = Fleet::start("edge-1,edge-2,edge-3", &[]);
    for ctx in ["edge-1", "edge-2", "edge-3"] {
        f.apply(ctx, &agent_ds("2.0"));
    }
    let p = project(&f);
    p.stack(&gated_stack(&f.kubeconfig(), ""));
    // Wait for the agents to run everywhere, which also records every cluster as seen.
    inventory_until(&p, &[], |r| done(r, AGENT) == 3);
    f.control("/_sim/clusters/edge-2/offline");

    let run = p.rdeploy(&["up"]);
    run.code(4);
    assert!(p.exists("expanded"));
    assert!(!p.exists("contracted"), "the contract step must not run while edge-2 is absent");
    let refused = step(&p.status(), "drop-old-column")["refused"].as_str().unwrap().to_string();
    assert!(refused.contains("1 of 3 clusters in scope do not run registry.example/node-agent:2.0"), "{refused}");
    assert!(refused.contains("edge-2: absent since "), "{refused}");
    assert!(!refused.contains("edge-1") && !refused.contains("edge-3"), "only stragglers are named: {refused}");

    f.control("/_sim/clusters/edge-2/online");
    p.rdeploy(&["recover"]).code(0);
    assert!(p.exists("contracted"));
}

#[test]
fn the_gate_names_a_halted_daemonset_and_an_exception_lets_it_pass_until_it_expires() {
    let f = Fleet::start("edge-1,edge-2,edge-3", &["--taint-node", "edge-3/node-2"]);
    f.apply("edge-1", &agent_ds("2.0"));
    f.apply("edge-2", &agent_ds("1.9"));
    f.apply("edge-3", &agent_ds("2.0"));
    let p = project(&f);
    inventory_until(&p, &["--contexts", "edge-1"], |r| done(r, AGENT) == 1);
    // Let edge-3 settle on its untainted nodes, so only node-2 is left halted.
    inventory_until(&p, &["--contexts", "edge-3"], |r| {
        let why = straggler_reasons(r, AGENT, "edge-3");
        why.contains("halted on node node-2") && !why.contains("node-1")
    });

    p.stack(&gated_stack(&f.kubeconfig(), ""));
    p.rdeploy(&["up"]).code(4);
    let refused = step(&p.status(), "drop-old-column")["refused"].as_str().unwrap().to_string();
    assert!(refused.contains("2 of 3 clusters"), "{refused}");
    assert!(refused.contains("edge-2: old version 1.9 (wanted 2.0) in DaemonSet mon/node-agent"), "{refused}");
    assert!(refused.contains("edge-3: DaemonSet mon/node-agent halted on node node-2"), "{refused}");

    let day = |offset: i64| (time::OffsetDateTime::now_utc() + time::Duration::days(offset)).date().to_string();
    let exceptions = |expires: &str| {
        format!(
            "        exceptions:\n          - {{cluster: edge-2, reason: 'ship stuck in port, upgrade on arrival', expires: '{expires}'}}\n          - {{cluster: edge-3, reason: 'node-2 is being replaced', expires: '{}'}}\n",
            day(2)
        )
    };
    // An expired exception does not count, and the refusal says so.
    p.stack(&gated_stack(&f.kubeconfig(), &exceptions(&day(-1))));
    p.rdeploy(&["reset", "--yes"]).code(0);
    p.rdeploy(&["up"]).code(4);
    let refused = step(&p.status(), "drop-old-column")["refused"].as_str().unwrap().to_string();
    assert!(
        refused.contains(&format!(
            "edge-2: old version 1.9 (wanted 2.0) in DaemonSet mon/node-agent (its exception expired on {})",
            day(-1)
        )),
        "{refused}"
    );
    assert!(!refused.contains("edge-3"), "edge-3's exception holds: {refused}");
    assert!(!p.exists("contracted"));

    // Unexpired exceptions with reasons let the step run.
    p.stack(&gated_stack(&f.kubeconfig(), &exceptions(&day(1))));
    p.rdeploy(&["reset", "--yes"]).code(0);
    p.rdeploy(&["up"]).code(0);
    assert!(p.exists("contracted"));
}

#[test]
fn slo_is_computed_on_recorded_rollout_starts() {
    let f = Fleet::start("edge-1,edge-2,edge-3,edge-4", &[]);
    for ctx in ["edge-1", "edge-2", "edge-3"] {
        f.apply(ctx, &agent_ds("2.0"));
    }
    f.apply("edge-4", &agent_ds("1.9"));
    let p = project(&f);
    // The first inventory records when it first saw each version.
    inventory_until(&p, &[], |r| done(r, AGENT) == 3).0.code(0);
    let recorded: Value = serde_json::from_str(&p.read(".rdeploy/fleet/rollouts.json")).unwrap();
    assert!(recorded["components"][AGENT]["2.0"]["started"].is_string(), "{recorded}");

    // The 2.0 rollout started 50 hours ago: 75% within 24h is met, 100% within 48h is breached.
    let at = |hours: i64| {
        (time::OffsetDateTime::now_utc() - time::Duration::hours(hours))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let rollouts = |hours: i64| {
        format!(r#"{{"components": {{"{AGENT}": {{"2.0": {{"started": "{}", "source": "test"}}}}}}}}"#, at(hours))
    };
    p.file(".rdeploy/fleet/rollouts.json", &rollouts(50));
    let run = p.rdeploy(&["inventory", "--component", AGENT, "--slo", "75%@24h,100%@48h"]);
    run.code(1)
        .stdout_has("slo BREACHED: registry.example/node-agent 2.0: 3/4 clusters done (75%)")
        .stdout_has("75%@24h: met")
        .stdout_has("100%@48h: BREACHED 2h")
        .stdout_has("1 more cluster(s) needed (25 points short)")
        .stdout_has("breaching: edge-4")
        .stderr_has("error: the rollout-completion SLO is breached for registry.example/node-agent 2.0");
    let run = p.rdeploy(&["inventory", "--component", AGENT, "--slo", "75%@24h,100%@48h", "--json"]);
    run.code(1);
    let r: Value = serde_json::from_str(&run.stdout).unwrap();
    let slo = &r["slo"][0];
    assert_eq!(
        (slo["done"].as_u64(), slo["in_scope"].as_u64(), slo["breached"].as_bool()),
        (Some(3), Some(4), Some(true))
    );
    assert_eq!(slo["objectives"][1]["state"], "breached");
    assert_eq!(slo["breaching"], serde_json::json!(["edge-4"]));

    // 30 hours in, the 100% objective is not due yet: no breach, exit 0.
    p.file(".rdeploy/fleet/rollouts.json", &rollouts(30));
    p.rdeploy(&["inventory", "--component", AGENT, "--slo", "75%@24h,100%@48h"])
        .code(0)
        .stdout_has("slo ok: ")
        .stdout_has("100%@48h: not yet: due in 18h");
    // `--since` overrides the record; an absent cluster counts against completion.
    f.control("/_sim/clusters/edge-3/offline");
    p.rdeploy(&["inventory", "--component", AGENT, "--slo", "75%@24h", "--since", "25h"])
        .code(1)
        .stdout_has("2/4 clusters done (50%), rollout started ")
        .stdout_has("(--since)")
        .stdout_has("breaching: edge-3, edge-4");
    // Bad objectives are bad input.
    p.rdeploy(&["inventory", "--slo", "lots"]).code(2).stderr_has("`--slo`");
}

/// Every kubesim cluster is behind one address, as clusters behind one proxy are: the inventory
/// asks them a few dozen at a time over kept-alive connections. Asking every cluster at once
/// opened a connection for nearly each of its requests (seven per cluster: about 700 here).
#[test]
fn clusters_behind_one_address_share_kept_alive_connections() {
    let f = Fleet::start("100", &[]);
    f.apply("cluster-001", &agent_ds("2.0"));
    let p = project(&f);
    let opened = || f.0.control_json("GET", "/_sim/clusters")["connections"].as_u64().unwrap();
    let before = opened();
    let run = p.rdeploy(&["inventory", "--json"]);
    run.code(0);
    let r: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!((r["clusters"].as_u64(), r["answered"].as_u64()), (Some(100), Some(100)), "{r:#}");
    // The second count's own connection is counted too.
    let by_inventory = opened() - before - 1;
    assert!(by_inventory <= 7 * 32, "{by_inventory} connections for the inventory's 700 requests");
}

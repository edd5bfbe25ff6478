//! Real public charts (the corpus: `corpus/charts/NAME`, each fetched from its public
//! repository at a recorded commit, with its LICENSE and a SOURCE file) through the real helm 3
//! and helm 4 with their default values: install (`--wait` where the chart allows it), an
//! upgrade with a changed value, an upgrade that fails (an image matching kubesim's
//! `--fail-image`, or a value the API server refuses) and a rollback. After each step every
//! object of the release's manifest must be live in kubesim, and the step's own change must be
//! what is live.
//!
//! Where the corpus is found: `kubesim::testing::corpus`.

use std::collections::BTreeMap;
use std::process::Command;

use kubesim::testing::{corpus, stderr, Kubesim};
use serde::Deserialize;
use serde_json::Value;

fn chart(name: &str) -> String {
    let p = corpus().join("charts").join(name);
    assert!(p.join("Chart.yaml").is_file(), "corpus chart {} is missing", p.display());
    assert!(p.join("SOURCE").is_file(), "corpus chart {name} has no SOURCE file");
    p.to_string_lossy().into_owned()
}

/// One chart's lifecycle.
struct Case {
    chart: &'static str,
    /// Whether `--wait` is usable on install (a LoadBalancer Service never gets an address on a
    /// cluster without a load-balancer controller, so helm 3 would wait forever).
    wait_install: bool,
    /// The upgrade's changed values.
    upgrade: &'static [&'static str],
    /// The failing upgrade's values: an image matching `--fail-image` (so `--wait` times out),
    /// or a value the API server refuses.
    fail: &'static [&'static str],
    /// For a refused value: what the refusal says (as the real API server words it).
    refused: Option<&'static str>,
    /// `kind/name` of the workload whose first container image the steps change.
    workload: &'static str,
    /// The image suffix live after the upgrade (and after the rollback to it).
    upgraded_image: &'static str,
    /// Pods stuck on the broken revision of an OrderedReady StatefulSet: after the template is
    /// reverted they must be deleted by hand ("Forced rollback" in the StatefulSet docs).
    stuck_pods: &'static [&'static str],
    /// What the upgrade adds, checked live after it: `kind/name` that must exist.
    added: &'static [&'static str],
}

const NS: &str = "apps";

/// Every object of the release's manifest, got back from kubesim: (kind, name) of each.
fn live(k: &Kubesim, major: u32) -> Vec<(String, String)> {
    let manifest = k.helm_ok(major, &["get", "manifest", "r", "-n", NS]);
    let mut wanted: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&manifest) {
        let v = Value::deserialize(doc).expect("helm's manifest is YAML");
        if v.is_null() {
            continue;
        }
        let (kind, name) = (v["kind"].as_str().unwrap(), v["metadata"]["name"].as_str().unwrap());
        let ns = v["metadata"]["namespace"].as_str().unwrap_or(NS);
        let group = v["apiVersion"].as_str().unwrap().split_once('/').map_or("", |(g, _)| g);
        let resource = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
        wanted.entry((resource, ns.to_string())).or_default().push(name.to_string());
        out.push((kind.to_string(), name.to_string()));
    }
    for ((resource, ns), names) in &wanted {
        let mut args = vec!["get", resource.as_str(), "-n", ns, "-o", "name"];
        args.extend(names.iter().map(String::as_str));
        let o = k.kubectl(&args);
        assert!(o.status.success(), "{resource} {ns}/{names:?} of release r not live: {}", stderr(&o));
    }
    out
}

/// The images of a workload's containers.
fn images(k: &Kubesim, workload: &str) -> Vec<String> {
    let out = k.kubectl_ok(&["get", workload, "-n", NS, "-o", "jsonpath={.spec.template.spec.containers[*].image}"]);
    out.split_whitespace().map(String::from).collect()
}

fn has_image(k: &Kubesim, workload: &str, suffix: &str) -> bool {
    images(k, workload).iter().any(|i| i.ends_with(suffix) || i.contains(&format!("{suffix}@")))
}

fn sets(values: &[&str]) -> Vec<String> {
    values.iter().flat_map(|v| ["--set".to_string(), v.to_string()]).collect()
}

fn lifecycle(c: &Case, major: u32) {
    let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
    let chart = chart(c.chart);
    let helm = |args: &[&str], extra: &[String], wait: bool| {
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.extend(extra.iter().cloned());
        a.extend(["-n", NS, "--create-namespace", "--timeout", "120s"].map(String::from));
        if wait {
            a.push("--wait".into());
        }
        k.helm_ok(major, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let tag = format!("{} (helm {major})", c.chart);

    // install with the chart's default values
    helm(&["install", "r", &chart], &[], c.wait_install);
    let installed = live(&k, major);
    assert!(!installed.is_empty(), "{tag}: nothing installed");
    let original = images(&k, c.workload);

    // upgrade with a changed value
    helm(&["upgrade", "r", &chart], &sets(c.upgrade), true);
    let upgraded = live(&k, major);
    assert!(has_image(&k, c.workload, c.upgraded_image), "{tag}: {:?}", images(&k, c.workload));
    for a in c.added {
        let (kind, name) = a.split_once('/').unwrap();
        assert!(
            upgraded.iter().any(|(k, n)| k == kind && n == name),
            "{tag}: {a} not live after the upgrade: {upgraded:?}"
        );
    }
    assert_eq!(k.helm_statuses(major, "r", NS), ["superseded", "deployed"], "{tag}");

    // an upgrade that fails: an image that never becomes ready (--wait times out), or a value
    // the API server refuses
    let mut a: Vec<String> = ["upgrade", "r", &chart, "-n", NS, "--wait", "--timeout", "5s"].map(String::from).to_vec();
    a.extend(sets(c.fail));
    let failed = k.helm(major, &a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!failed.status.success(), "{tag}: the broken upgrade must fail");
    assert_eq!(k.helm_statuses(major, "r", NS), ["superseded", "deployed", "failed"], "{tag}: {}", stderr(&failed));
    match c.refused {
        None => assert!(has_image(&k, c.workload, ":broken"), "{tag}: the failed revision is what is live"),
        Some(msg) => {
            assert!(stderr(&failed).contains(msg), "{tag}: {}", stderr(&failed));
            assert!(has_image(&k, c.workload, c.upgraded_image), "{tag}: {:?}", images(&k, c.workload));
        }
    }
    live(&k, major);

    // roll back to the upgrade's revision
    for pod in c.stuck_pods {
        // the controller has replaced it with the broken revision (a loaded machine can be slow)
        let broken = || {
            let o = k.kubectl(&["get", "pod", pod, "-n", NS, "-o", "jsonpath={.spec.containers[*].image}"]);
            String::from_utf8_lossy(&o.stdout).contains(":broken")
        };
        assert!(k.eventually(std::time::Duration::from_secs(60), broken), "{tag}: {pod} never got the broken image");
        let o = k.helm(major, &["rollback", "r", "2", "-n", NS, "--wait", "--timeout", "3s"]);
        assert!(!o.status.success(), "{tag}: the StatefulSet waits on its broken pod {pod}");
        k.kubectl_ok(&["delete", "pod", pod, "-n", NS]);
    }
    k.helm_ok(major, &["rollback", "r", "2", "-n", NS, "--wait", "--timeout", "120s"]);
    let statuses = k.helm_statuses(major, "r", NS);
    assert_eq!(statuses[..3], ["superseded", "superseded", "failed"], "{tag}");
    assert_eq!(statuses.last().map(String::as_str), Some("deployed"), "{tag}");
    let rolled = live(&k, major);
    let mut a = rolled.clone();
    let mut b = upgraded.clone();
    a.sort();
    b.sort();
    assert_eq!(a, b, "{tag}: the rollback brings back the upgrade's objects");
    assert!(has_image(&k, c.workload, c.upgraded_image), "{tag} after rollback: {:?}", images(&k, c.workload));
    assert_ne!(original, images(&k, c.workload), "{tag}");
    k.kubectl_ok(&["rollout", "status", c.workload, "-n", NS, "--timeout=60s"]);
}

fn both(c: Case) {
    lifecycle(&c, 3);
    lifecycle(&c, 4);
}

#[test]
fn grafana_rbac_a_bare_rolling_update_then_persistence() {
    both(Case {
        chart: "grafana",
        wait_install: true,
        upgrade: &["image.tag=12.3.2", "persistence.enabled=true", "podDisruptionBudget.minAvailable=1"],
        fail: &["image.tag=broken", "persistence.enabled=true", "podDisruptionBudget.minAvailable=1"],
        workload: "deployment/r-grafana",
        upgraded_image: ":12.3.2",
        refused: None,
        stuck_pods: &[],
        added: &["PersistentVolumeClaim/r-grafana", "PodDisruptionBudget/r-grafana"],
    });
}

#[test]
fn prometheus_with_its_four_vendored_dependencies_pvcs_a_daemonset_and_a_statefulset() {
    both(Case {
        chart: "prometheus",
        wait_install: true,
        upgrade: &["server.image.tag=v3.14.1"],
        fail: &["server.image.tag=broken"],
        workload: "deployment/r-prometheus-server",
        upgraded_image: ":v3.14.1",
        refused: None,
        stuck_pods: &[],
        added: &[],
    });
}

#[test]
fn ingress_nginx_webhook_hooks_an_ingress_class_and_a_load_balancer() {
    both(Case {
        chart: "ingress-nginx",
        wait_install: false,
        upgrade: &["controller.service.type=NodePort", "controller.image.tag=v1.15.2", "controller.image.digest="],
        fail: &["controller.service.type=NodePort", "controller.image.tag=broken", "controller.image.digest="],
        workload: "deployment/r-ingress-nginx-controller",
        upgraded_image: ":v1.15.2",
        refused: None,
        stuck_pods: &[],
        added: &[],
    });
}

#[test]
fn metrics_server_with_an_api_service() {
    both(Case {
        chart: "metrics-server",
        wait_install: true,
        upgrade: &["image.tag=v0.8.2"],
        fail: &["image.tag=broken"],
        workload: "deployment/r-metrics-server",
        upgraded_image: ":v0.8.2",
        refused: None,
        stuck_pods: &[],
        added: &[],
    });
}

#[test]
fn podinfo_then_an_hpa() {
    both(Case {
        chart: "podinfo",
        wait_install: true,
        upgrade: &["image.tag=6.14.2", "hpa.enabled=true"],
        // with one replica and maxUnavailable 1, helm 3's --wait needs no new pod ready, so a
        // broken image passes it (as on a real cluster): this upgrade fails at the API server
        fail: &["image.tag=6.14.2", "hpa.enabled=true", "hpa.maxReplicas=0"],
        workload: "deployment/r-podinfo",
        upgraded_image: ":6.14.2",
        refused: Some("spec.maxReplicas: Invalid value: 0: must be greater than 0"),
        stuck_pods: &[],
        added: &["HorizontalPodAutoscaler/r-podinfo"],
    });
}

#[test]
fn cert_manager_webhooks_and_a_post_install_job_then_its_crds() {
    both(Case {
        chart: "cert-manager",
        wait_install: true,
        upgrade: &["image.tag=v1.19.1", "crds.enabled=true"],
        fail: &["image.tag=broken", "crds.enabled=true"],
        workload: "deployment/r-cert-manager",
        upgraded_image: ":v1.19.1",
        refused: None,
        stuck_pods: &[],
        added: &["CustomResourceDefinition/certificates.cert-manager.io"],
    });
}

#[test]
fn redis_statefulsets_pvcs_a_network_policy_and_pdbs() {
    both(Case {
        chart: "redis",
        wait_install: true,
        upgrade: &["image.tag=8.2.2-debian-12-r0"],
        fail: &["image.tag=broken"],
        workload: "statefulset/r-redis-master",
        upgraded_image: ":8.2.2-debian-12-r0",
        refused: None,
        stuck_pods: &["r-redis-master-0", "r-redis-replicas-2"],
        added: &[],
    });
}

#[test]
fn kube_state_metrics_standalone() {
    both(Case {
        chart: "kube-state-metrics",
        wait_install: true,
        upgrade: &["image.tag=v2.20.1"],
        fail: &["image.tag=broken"],
        workload: "deployment/r-kube-state-metrics",
        upgraded_image: ":v2.20.1",
        refused: None,
        stuck_pods: &[],
        added: &[],
    });
}

/// What the corpus holds between its charts' default values: the kinds the issue names.
#[test]
fn the_corpus_defaults_create_rbac_a_pdb_a_network_policy_a_pvc_and_webhooks() {
    let mut kinds = std::collections::BTreeSet::new();
    for c in ["grafana", "prometheus", "ingress-nginx", "metrics-server", "podinfo", "cert-manager", "redis"] {
        let o = Command::new(kubesim::testing::helm_bin(3)).args(["template", "r", &chart(c)]).output().unwrap();
        assert!(o.status.success(), "{c}: {}", stderr(&o));
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            if let Some(kind) = line.strip_prefix("kind: ") {
                kinds.insert(kind.trim().to_string());
            }
        }
    }
    for want in [
        "ClusterRole",
        "RoleBinding",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "APIService",
        "IngressClass",
        "DaemonSet",
        "StatefulSet",
        "Job",
    ] {
        assert!(kinds.contains(want), "no corpus chart creates a {want} with its default values: {kinds:?}");
    }
}

/// The classic refused chart upgrade: redis's persistence size lives in the StatefulSets'
/// volumeClaimTemplates, which the API server does not let an update change.
#[test]
fn redis_persistence_size_upgrade_is_refused_as_by_the_api_server() {
    for major in [3, 4] {
        let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
        let chart = chart("redis");
        k.helm_ok(major, &["install", "r", &chart, "-n", NS, "--create-namespace", "--wait", "--timeout", "120s"]);
        let o = k.helm(major, &["upgrade", "r", &chart, "-n", NS, "--set", "master.persistence.size=16Gi"]);
        assert!(!o.status.success(), "helm {major}");
        assert!(
            stderr(&o).contains("StatefulSet.apps \"r-redis-master\" is invalid: spec: Forbidden: updates to statefulset spec for fields other than 'replicas'"),
            "helm {major}: {}",
            stderr(&o)
        );
        assert_eq!(k.helm_statuses(major, "r", NS), ["deployed", "failed"], "helm {major}");
        let size = k.kubectl_ok(&[
            "get",
            "sts",
            "r-redis-master",
            "-n",
            NS,
            "-o",
            "jsonpath={.spec.volumeClaimTemplates[0].spec.resources.requests.storage}",
        ]);
        assert_eq!(size, "8Gi", "helm {major}");
    }
}

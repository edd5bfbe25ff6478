//! Real-world-shaped charts (testdata/charts, modelled on grafana, ingress-nginx,
//! metrics-server, bitnami/redis, cert-manager and podinfo: RBAC, PDBs, a NetworkPolicy, an
//! HPA, a PVC, webhook configurations, CRDs, hooks) through the real helm 3 and helm 4 with
//! their default values: install, upgrade, a failing upgrade (an image that never becomes
//! ready), and a rollback, each with `--wait`.

use kubesim::testing::{stderr, testdata, Kubesim};

/// A chart and the value that names its main image tag.
struct Chart {
    name: &'static str,
    tag: &'static str,
    /// The workload the image tag drives, `kind/name` for release `r`.
    workload: &'static str,
    /// A StatefulSet with OrderedReady: after the template is reverted, the pod stuck on the
    /// bad revision must be deleted by hand ("Forced rollback" in the StatefulSet docs).
    stuck_pod: Option<&'static str>,
}

fn lifecycle(c: &Chart, major: u32) {
    let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
    let chart = testdata(&format!("charts/{}", c.name)).to_string_lossy().into_owned();
    let ns = ["-n", "apps", "--create-namespace"];
    let wait = ["--wait", "--timeout", "60s"];
    let helm = |args: &[&str]| k.helm_ok(major, &[args, &ns[..], &wait[..]].concat());

    helm(&["install", "r", &chart]);
    helm(&["upgrade", "r", &chart, "--set", &format!("{}=next", c.tag)]);
    let image = |k: &Kubesim| {
        k.kubectl_ok(&["get", c.workload, "-n", "apps", "-o", "jsonpath={.spec.template.spec.containers[0].image}"])
    };
    assert!(image(&k).ends_with(":next"), "{}: {}", c.name, image(&k));

    let failed = k.helm(
        major,
        &["upgrade", "r", &chart, "-n", "apps", "--set", &format!("{}=broken", c.tag), "--wait", "--timeout", "3s"],
    );
    assert!(!failed.status.success(), "{} (helm {major}): an upgrade to a broken image must fail", c.name);
    assert_eq!(k.helm_statuses(major, "r", "apps"), ["superseded", "deployed", "failed"], "{}", stderr(&failed));

    match c.stuck_pod {
        None => {
            k.helm_ok(major, &["rollback", "r", "2", "-n", "apps", "--wait", "--timeout", "60s"]);
        }
        Some(pod) => {
            let o = k.helm(major, &["rollback", "r", "2", "-n", "apps", "--wait", "--timeout", "3s"]);
            assert!(!o.status.success(), "{}: the StatefulSet waits on its broken pod", c.name);
            k.kubectl_ok(&["delete", "pod", pod, "-n", "apps"]);
            k.helm_ok(major, &["rollback", "r", "2", "-n", "apps", "--wait", "--timeout", "60s"]);
        }
    }
    let statuses = k.helm_statuses(major, "r", "apps");
    assert_eq!(statuses[..3], ["superseded", "superseded", "failed"]);
    assert_eq!(statuses.last().map(String::as_str), Some("deployed"));
    assert!(image(&k).ends_with(":next"), "{} after rollback: {}", c.name, image(&k));
    k.kubectl_ok(&["rollout", "status", c.workload, "-n", "apps", "--timeout=30s"]);
}

fn both(c: Chart) {
    lifecycle(&c, 3);
    lifecycle(&c, 4);
}

#[test]
fn dashboards_like_grafana_with_rbac_pvc_and_a_bare_rolling_update_strategy() {
    both(Chart { name: "dashboards", tag: "image.tag", workload: "deployment/r-dashboards", stuck_pod: None });
}

#[test]
fn ingress_like_ingress_nginx_with_webhook_hooks_and_an_ingress_class() {
    both(Chart {
        name: "ingress",
        tag: "controller.image.tag",
        workload: "deployment/r-ingress-controller",
        stuck_pod: None,
    });
}

#[test]
fn metrics_like_metrics_server_with_an_api_service() {
    both(Chart { name: "metrics", tag: "image.tag", workload: "deployment/r-metrics", stuck_pod: None });
}

#[test]
fn cache_like_redis_with_a_statefulset_network_policy_and_pdb() {
    both(Chart {
        name: "cache",
        tag: "image.tag",
        workload: "statefulset/r-cache-master",
        stuck_pod: Some("r-cache-master-0"),
    });
}

#[test]
fn certs_like_cert_manager_with_crds_webhooks_and_a_post_install_job() {
    both(Chart { name: "certs", tag: "image.tag", workload: "deployment/r-certs-controller", stuck_pod: None });
}

#[test]
fn web_like_podinfo_with_an_hpa_and_pdb() {
    both(Chart { name: "web", tag: "image.tag", workload: "deployment/r-web", stuck_pod: None });
}

/// The PVC of the grafana-shaped chart is bound by the default StorageClass, which is what
/// lets helm 4's `--wait` finish at all.
#[test]
fn persistence_binds_and_helm4_waits_for_it() {
    let k = Kubesim::start_with("kubesim", &["--pod-startup-ms", "50"]);
    let chart = testdata("charts/dashboards").to_string_lossy().into_owned();
    k.helm_ok(4, &["install", "g", &chart, "--wait", "--timeout", "60s"]);
    let phase = k.kubectl_ok(&["get", "pvc", "g-dashboards", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(phase, "Bound");
}

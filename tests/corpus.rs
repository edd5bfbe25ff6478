//! The real-world corpus (public roles, modules, manifest bundles and charts nobody on the team
//! wrote, each with its SOURCE and LICENSE; kept out of this repository's commits, so it is found
//! through `kubesim::testing::corpus`: `$KUBESIM_CORPUS`, else `../shared/corpus`; a missing
//! corpus fails these tests loudly) through the real `rdeploy` binary
//! and the real tools: each item deploys, fails part-way on an injected realistic failure (a host
//! whose task fails, a provisioner that fails, an image that cannot pull, CRDs too big for
//! client-side apply, a hook Job that never runs, a claim that cannot bind, a value the chart's
//! schema rejects), `status` says exactly what is in place and what is missing, and `recover`
//! touches only what was missing (helm history per release, resourceVersions of the objects
//! that were in place).
//!
//! The eight charts and two CRD bundles run in four multi-step stacks, one kubesim each, on
//! helm 3 and helm 4 (two stacks each); values are the charts' defaults except where a test says
//! why (the failure itself, or what kubesim needs: ingress-nginx's Service as NodePort).

mod common;

use common::{copy_dir, repo_root, require_tool, step, sub_statuses, Project};
use kubesim::testing::{corpus, kubectl_bin, Kubesim};

/// Copies an item of the corpus into the project, then lays the project's own wrappers for it
/// (`fixtures/corpus/ITEM`: a playbook and inventory around a role, a root module calling a
/// module) over the copy, as a user's repository wraps a public role or module. The corpus
/// itself is upstream material only and is never edited.
fn copy_corpus(p: &Project, item: &str, to: &str) {
    copy_dir(&corpus().join(item), &p.path(to));
    let wrappers = repo_root().join("fixtures/corpus").join(item);
    if wrappers.is_dir() {
        copy_dir(&wrappers, &p.path(to));
    }
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

/// `.venv/bin/ansible-playbook`; a missing ansible fails loudly, never skips.
fn ansible_playbook() -> String {
    let bin = repo_root().join(".venv/bin/ansible-playbook");
    assert!(bin.is_file(), "{} is missing: run scripts/setup-ansible.sh", bin.display());
    bin.to_string_lossy().into_owned()
}

/// geerlingguy.nginx (trimmed) on three local hosts. web2 has a plain file where `etc/nginx`
/// must be a directory, so the role's own "Ensure nginx_vhost_path exists." task fails there.
#[test]
fn ansible_geerlingguy_nginx_one_host_fails_and_recover_runs_only_it() {
    let p = Project::new();
    copy_corpus(&p, "ansible/nginx", "nginx");
    p.file("nginx/out/web2/etc/nginx", "not a directory\n");
    p.stack(&format!(
        r#"
name: corpus-nginx
steps:
  - name: web
    tool: ansible
    playbook: nginx/site.yml
    inventory: nginx/inventory.ini
    binary: {binary}
    env: {{ ANSIBLE_NOCOLOR: "1" }}
"#,
        binary = ansible_playbook()
    ));

    p.rdeploy(&["up"]).code(1).stdout_has("web2");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(sub_statuses(&status, "web"), pairs(&[("web1", "done"), ("web2", "failed"), ("web3", "done")]));
    assert!(step(&status, "web")["error"].as_str().unwrap().contains("web2"), "{status}");
    for host in ["web1", "web3"] {
        assert!(p.read(&format!("nginx/out/{host}/etc/nginx/nginx.conf")).contains("worker_processes"));
        assert!(p.exists(&format!("nginx/out/{host}/etc/nginx/sites-enabled/shop.example.com.conf")));
        assert_eq!(p.lines(&format!("nginx/out/{host}/handlers.log")), ["reload"]);
    }

    // Drift on a done host: a recover that ran web1 again would put the template back.
    let drifted = format!("{}# edited by hand\n", p.read("nginx/out/web1/etc/nginx/nginx.conf"));
    p.file("nginx/out/web1/etc/nginx/nginx.conf", &drifted);
    p.remove("nginx/out/web2/etc/nginx");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(sub_statuses(&p.status(), "web"), pairs(&[("web1", "done"), ("web2", "done"), ("web3", "done")]));
    assert!(p.exists("nginx/out/web2/etc/nginx/sites-enabled/admin.example.com.conf"));
    assert_eq!(p.lines("nginx/out/web2/handlers.log"), ["reload"]);
    assert_eq!(p.read("nginx/out/web1/etc/nginx/nginx.conf"), drifted, "recover did not touch web1");
    for host in ["web1", "web3"] {
        assert_eq!(p.lines(&format!("nginx/out/{host}/handlers.log")), ["reload"], "{host} not reloaded again");
    }
}

fn runs(p: &Project, name: &str) -> usize {
    let rel = format!("tf/labelled/runs/{name}.log");
    if p.exists(&rel) {
        p.lines(&rel).len()
    } else {
        0
    }
}

/// cloudposse/terraform-null-label (pure logic, no provider download) naming a chain of three
/// terraform_data resources; the db's provisioner fails.
#[test]
fn terraform_null_label_a_provisioner_fails_and_recover_applies_only_the_rest() {
    require_tool("terraform", "install terraform v1.11 (https://developer.hashicorp.com/terraform/install)");
    let p = Project::new();
    copy_corpus(&p, "terraform", "tf");
    p.file("tf/labelled/prov.sh", &std::fs::read_to_string(repo_root().join("fixtures/terraform/prov.sh")).unwrap());
    p.file("tf/labelled/fail-db", "");
    p.stack(
        r#"
name: corpus-terraform
steps:
  - name: labelled
    tool: terraform
    dir: tf/labelled
"#,
    );

    p.rdeploy(&["up"]).code(1).stdout_has("terraform_data.db").stdout_has("fail-db is present");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(
        sub_statuses(&status, "labelled"),
        pairs(&[
            ("terraform_data.network", "done"),
            ("terraform_data.db", "failed"),
            ("terraform_data.app", "pending")
        ])
    );
    assert_eq!((runs(&p, "network"), runs(&p, "db"), runs(&p, "app")), (1, 0, 0));

    p.remove("tf/labelled/fail-db");
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    assert_eq!((runs(&p, "network"), runs(&p, "db"), runs(&p, "app")), (1, 1, 1), "network was not applied again");
    let out = std::process::Command::new("terraform")
        .args(["output", "-json", "ids"])
        .current_dir(p.path("tf/labelled"))
        .output()
        .unwrap();
    let ids: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids, ["eg-prod-shop-public", "eg-prod-db-public", "eg-prod-app-public-blue"], "the module's labels");
}

/// kubernetes/examples' guestbook bundle (3 Services, 3 Deployments) as upstream ships it, with
/// `wait: true`; the frontend's image cannot be pulled, so its rollout fails while the redis
/// tier is in place. The Deployment keeps the default 600 s progress deadline: the step's
/// `timeout` is what bounds the wait, as a user would write it.
#[test]
fn manifests_guestbook_an_image_that_cannot_pull_and_recover_applies_only_the_frontend() {
    let sim = Kubesim::start_with("c1", &["--fail-image", "*gb-frontend:v5"]);
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    copy_corpus(&p, "manifests/guestbook", "guestbook");
    p.stack(&format!(
        r#"
name: corpus-guestbook
steps:
  - name: guestbook
    tool: kubectl
    manifests: [guestbook/guestbook-all-in-one.yaml]
    context: c1
    wait: true
    timeout: 30s
    binary: {kubectl}
"#,
        kubectl = kubectl_bin().display()
    ));

    p.rdeploy(&["up"]).code(1).stdout_has("Deployment/default/frontend");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(
        sub_statuses(&status, "guestbook"),
        pairs(&[
            ("Service/default/redis-master", "done"),
            ("Deployment/default/redis-master", "done"),
            ("Service/default/redis-replica", "done"),
            ("Deployment/default/redis-replica", "done"),
            ("Service/default/frontend", "done"),
            ("Deployment/default/frontend", "failed"),
        ])
    );
    let rv = |kind: &str, name: &str| {
        sim.kubectl_ok(&["get", kind, name, "-n", "default", "-o", "jsonpath={.metadata.resourceVersion}"])
    };
    let before: Vec<String> = [("deploy", "redis-master"), ("deploy", "redis-replica"), ("svc", "frontend")]
        .iter()
        .map(|(k, n)| rv(k, n))
        .collect();

    // The fix: a tag that exists.
    let bundle = p.read("guestbook/guestbook-all-in-one.yaml");
    p.file("guestbook/guestbook-all-in-one.yaml", &bundle.replace("gb-frontend:v5", "gb-frontend:v6"));
    p.rdeploy(&["recover"]).code(0);
    assert!(sub_statuses(&p.status(), "guestbook").iter().all(|(_, s)| s == "done"));
    assert_eq!(
        sim.kubectl_ok(&[
            "get",
            "deploy",
            "frontend",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}"
        ]),
        "gcr.io/google-samples/gb-frontend:v6"
    );
    let after: Vec<String> = [("deploy", "redis-master"), ("deploy", "redis-replica"), ("svc", "frontend")]
        .iter()
        .map(|(k, n)| rv(k, n))
        .collect();
    assert_eq!(before, after, "recover left the objects that were in place alone");
}

// ---- The charts and CRD bundles through rdeploy: multi-step stacks on one kubesim each ----

/// A project whose every tool run talks to `sim`.
fn sim_project(sim: &Kubesim) -> Project {
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p
}

/// `metadata.resourceVersion` of each named object (`kind`, `namespace` or "" for
/// cluster-scoped): an object recover did not touch keeps it.
fn versions(sim: &Kubesim, kind: &str, ns: &str, names: &[String]) -> Vec<(String, String)> {
    names
        .iter()
        .map(|n| {
            let mut args = vec!["get", kind, n.as_str(), "-o", "jsonpath={.metadata.resourceVersion}"];
            if !ns.is_empty() {
                args.extend(["-n", ns]);
            }
            (n.clone(), sim.kubectl_ok(&args))
        })
        .collect()
}

/// The CRD names of a corpus bundle, from its files (one CRD each, named GROUP_PLURAL.yaml).
fn bundle_crds(item: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(corpus().join(item))
        .unwrap_or_else(|e| panic!("corpus {item}: {e}"))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|f| f.strip_suffix(".yaml").map(|s| s.to_string()))
        .map(|f| {
            let (group, plural) = f.split_once('_').unwrap();
            format!("{plural}.{group}")
        })
        .collect();
    names.sort();
    names
}

fn helm(major: u32) -> String {
    kubesim::testing::helm_bin(major).display().to_string()
}

/// The sub-changes of a step with the given status.
fn with_status(status: &serde_json::Value, step_name: &str, want: &str) -> Vec<String> {
    let mut ids: Vec<String> =
        sub_statuses(status, step_name).into_iter().filter(|(_, s)| s == want).map(|(id, _)| id).collect();
    ids.sort();
    ids
}

/// prometheus-operator's ten CRDs (a kubectl step), kube-state-metrics and prometheus (helm 3
/// steps, default values), then ServiceMonitors of the new kind (a kubectl step).
/// 1. Client-side, the six CRDs over the 256 KiB annotation limit fail with the hint to set
///    `server_side: true`; with it, recover applies exactly those six and the rest of the stack.
/// 2. A prometheus upgrade to a server image that cannot be pulled fails; recover upgrades only
///    that release and applies the monitors, leaving the CRDs and kube-state-metrics alone.
#[test]
fn bundle_prometheus_operator_crds_then_kube_state_metrics_and_prometheus_on_helm3() {
    let sim = Kubesim::start_with("c1", &["--pod-startup-ms", "50", "--fail-image", "*prometheus/prometheus:v3.14.9"]);
    let p = sim_project(&sim);
    copy_corpus(&p, "bundles/prometheus-operator-crds", "crds");
    copy_corpus(&p, "charts/kube-state-metrics", "charts/kube-state-metrics");
    copy_corpus(&p, "charts/prometheus", "charts/prometheus");
    p.file(
        "monitors/ksm.yaml",
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: ksm, namespace: monitoring}\nspec:\n  selector: {matchLabels: {app.kubernetes.io/name: kube-state-metrics}}\n  endpoints: [{port: http}]\n",
    );
    let stack = |server_side: bool, prom_set: &str| {
        format!(
            r#"
name: corpus-monitoring
steps:
  - name: crds
    tool: kubectl
    manifests: [crds/]
    context: c1
{ssa}    binary: {kubectl}
  - name: ksm
    tool: helm
    release: ksm
    chart: charts/kube-state-metrics
    namespace: monitoring
    context: c1
    wait: true
    timeout: 120s
    binary: {helm}
  - name: prometheus
    tool: helm
    release: prom
    chart: charts/prometheus
    namespace: monitoring
    context: c1
    wait: true
    timeout: 20s
{prom_set}    binary: {helm}
  - name: monitors
    tool: kubectl
    needs: [crds, prometheus]
    manifests: [monitors/]
    context: c1
    binary: {kubectl}
"#,
            ssa = if server_side { "    server_side: true\n" } else { "" },
            kubectl = kubectl_bin().display(),
            helm = helm(3),
        )
    };
    let all = bundle_crds("bundles/prometheus-operator-crds");
    let big: Vec<String> =
        ["alertmanagerconfigs", "alertmanagers", "prometheusagents", "prometheuses", "scrapeconfigs", "thanosrulers"]
            .iter()
            .map(|n| format!("{n}.monitoring.coreos.com"))
            .collect();
    let small: Vec<String> = all.iter().filter(|n| !big.contains(n)).cloned().collect();
    let ids =
        |names: &[String]| -> Vec<String> { names.iter().map(|n| format!("CustomResourceDefinition/{n}")).collect() };

    // 1. client-side: the six big CRDs fail, the hint names server_side
    p.stack(&stack(false, ""));
    p.rdeploy(&["up"]).code(1).stdout_has("server_side: true").stdout_has("prometheuses.monitoring.coreos.com");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(with_status(&status, "crds", "done"), ids(&small), "{status}");
    assert_eq!(with_status(&status, "crds", "failed"), ids(&big), "{status}");
    for s in ["ksm", "prometheus", "monitors"] {
        assert!(step(&status, s)["sub_changes"].as_array().is_none_or(|a| a.is_empty()), "{s} ran: {status}");
        assert_ne!(step(&status, s)["status"], "done", "{status}");
    }
    assert!(step(&status, "crds")["error"].as_str().unwrap().contains("Too long"), "{status}");
    let in_place = versions(&sim, "crd", "", &small);
    assert!(sim.kubectl(&["get", "crd", &big[0]]).status.code() != Some(0), "{} must not exist", big[0]);

    p.stack(&stack(true, ""));
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    let status = p.status();
    assert_eq!(with_status(&status, "crds", "done"), ids(&all), "{status}");
    assert_eq!(versions(&sim, "crd", "", &small), in_place, "recover left the CRDs that were in place alone");
    for n in &big {
        let est = sim.kubectl_ok(&[
            "get",
            "crd",
            n,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ]);
        assert_eq!(est, "True", "{n}");
    }
    assert_eq!(sim.helm_statuses(3, "ksm", "monitoring"), ["deployed"]);
    assert_eq!(sim.helm_statuses(3, "prom", "monitoring"), ["deployed"]);
    sim.kubectl_ok(&["get", "servicemonitor", "ksm", "-n", "monitoring"]);

    // 2. an upgrade to a prometheus image that cannot be pulled
    p.stack(&stack(true, "    set: { server.image.tag: v3.14.9 }\n"));
    p.rdeploy(&["up"]).code(1).stdout_has("prom@2");
    // (this `up` applied the CRDs server-side again: kubectl moves the four first applied
    // client-side to server-side field management, a new resourceVersion)
    let crds_before = versions(&sim, "crd", "", &all);
    let status = p.status();
    assert_eq!(status["state"], "partial");
    // kube-state-metrics did not change: found in place, no second revision (issue 28)
    assert_eq!(sub_statuses(&status, "ksm"), pairs(&[("ksm@1", "done")]));
    assert_eq!(step(&status, "ksm")["in_place"], true, "{status}");
    assert_eq!(sub_statuses(&status, "prometheus"), pairs(&[("prom@2", "failed")]));
    assert_eq!(step(&status, "crds")["status"], "done");
    assert_ne!(step(&status, "monitors")["status"], "done");
    assert_eq!(sim.helm_statuses(3, "prom", "monitoring"), ["deployed", "failed"]);
    let ksm_history = sim.helm_statuses(3, "ksm", "monitoring");
    assert_eq!(ksm_history, ["deployed"], "the second `up` made no revision of the unchanged release");
    let monitor = versions(&sim, "servicemonitor", "monitoring", &["ksm".to_string()]);

    // the fix: a tag that exists
    p.stack(&stack(true, "    set: { server.image.tag: v3.14.1 }\n"));
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    let status = p.status();
    assert!(status["steps"].as_array().unwrap().iter().all(|s| s["status"] == "done"), "{status}");
    assert_eq!(sim.helm_statuses(3, "prom", "monitoring"), ["superseded", "failed", "deployed"]);
    assert_eq!(
        sim.helm_statuses(3, "ksm", "monitoring"),
        ksm_history,
        "recover did not upgrade kube-state-metrics again"
    );
    assert_eq!(versions(&sim, "crd", "", &all), crds_before, "recover left the CRDs alone");
    assert_eq!(versions(&sim, "servicemonitor", "monitoring", &["ksm".to_string()]), monitor);
    let image = sim.kubectl_ok(&[
        "get",
        "deploy",
        "prom-prometheus-server",
        "-n",
        "monitoring",
        "-o",
        "jsonpath={.spec.template.spec.containers[*].image}",
    ]);
    assert!(image.contains("prometheus:v3.14.1"), "{image}");
}

/// cert-manager's six CRDs as a kubectl step (they fit client-side), the cert-manager chart from
/// its source tree (helm 4, default values: CRDs off, the bundle's used), then a ClusterIssuer
/// and a Certificate. The source tree's chart renders its images with the tag v0.0.0, which no
/// registry has: the install fails, and recover, with the release's tag set, upgrades only that
/// release and applies the issuers, leaving the CRDs alone.
#[test]
fn bundle_cert_manager_crds_then_cert_manager_and_its_issuers_on_helm4() {
    let sim = Kubesim::start_with("c1", &["--pod-startup-ms", "50", "--fail-image", "quay.io/jetstack/*:v0.0.0"]);
    let p = sim_project(&sim);
    copy_corpus(&p, "bundles/cert-manager-crds", "crds");
    copy_corpus(&p, "charts/cert-manager", "charts/cert-manager");
    p.file(
        "issuers/selfsigned.yaml",
        "apiVersion: cert-manager.io/v1\nkind: ClusterIssuer\nmetadata: {name: selfsigned}\nspec: {selfSigned: {}}\n---\napiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: web, namespace: cert-manager}\nspec: {secretName: web-tls, dnsNames: [web.example.com], issuerRef: {name: selfsigned, kind: ClusterIssuer}}\n",
    );
    let stack = |set: &str| {
        format!(
            r#"
name: corpus-cert-manager
steps:
  - name: crds
    tool: kubectl
    manifests: [crds/]
    context: c1
    binary: {kubectl}
  - name: cert-manager
    tool: helm
    release: cm
    chart: charts/cert-manager
    namespace: cert-manager
    context: c1
    wait: true
    timeout: 20s
{set}    binary: {helm}
  - name: issuers
    tool: kubectl
    manifests: [issuers/]
    context: c1
    binary: {kubectl}
"#,
            kubectl = kubectl_bin().display(),
            helm = helm(4),
        )
    };
    let all = bundle_crds("bundles/cert-manager-crds");
    assert_eq!(all.len(), 6);

    p.stack(&stack(""));
    p.rdeploy(&["up"]).code(1).stdout_has("cm@1");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(
        with_status(&status, "crds", "done"),
        all.iter().map(|n| format!("CustomResourceDefinition/{n}")).collect::<Vec<_>>()
    );
    assert_eq!(sub_statuses(&status, "cert-manager"), pairs(&[("cm@1", "failed")]));
    assert_ne!(step(&status, "issuers")["status"], "done");
    assert!(sub_statuses(&status, "issuers").is_empty(), "{status}");
    assert_eq!(sim.helm_statuses(4, "cm", "cert-manager"), ["failed"]);
    let crds = versions(&sim, "crd", "", &all);

    // the fix: the release's tag for each component
    p.stack(&stack(
        "    set: { image.tag: v1.19.1, webhook.image.tag: v1.19.1, cainjector.image.tag: v1.19.1, startupapicheck.image.tag: v1.19.1 }\n",
    ));
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    let status = p.status();
    assert_eq!(sub_statuses(&status, "cert-manager"), pairs(&[("cm@2", "done")]));
    assert_eq!(
        sub_statuses(&status, "issuers"),
        pairs(&[("ClusterIssuer/selfsigned", "done"), ("Certificate/cert-manager/web", "done")])
    );
    // (helm 4 marks a failed first install superseded once an upgrade deploys)
    assert_eq!(sim.helm_statuses(4, "cm", "cert-manager"), ["superseded", "deployed"]);
    assert_eq!(versions(&sim, "crd", "", &all), crds, "recover left the CRDs alone");
    sim.kubectl_ok(&["get", "clusterissuer", "selfsigned"]);
    sim.kubectl_ok(&["get", "certificate", "web", "-n", "cert-manager"]);
    let image = sim.kubectl_ok(&[
        "get",
        "deploy",
        "cm-cert-manager",
        "-n",
        "cert-manager",
        "-o",
        "jsonpath={.spec.template.spec.containers[*].image}",
    ]);
    assert!(image.ends_with(":v1.19.1"), "{image}");
}

/// podinfo with an Ingress (helm 3), then ingress-nginx (helm 3; `controller.service.type:
/// NodePort` because kubesim, like a cluster without a load-balancer controller, never gives a
/// LoadBalancer an address, which helm 3's `--wait` waits for). An upgrade bumps the admission
/// webhook's certgen image to a tag that does not exist: the pre-upgrade hook Job never runs,
/// helm fails the release, and recover upgrades only ingress-nginx.
#[test]
fn charts_podinfo_then_ingress_nginx_whose_hook_job_fails_on_helm3() {
    let sim = Kubesim::start_with("c1", &["--pod-startup-ms", "50", "--fail-image", "*kube-webhook-certgen:v1.6.10"]);
    let p = sim_project(&sim);
    copy_corpus(&p, "charts/podinfo", "charts/podinfo");
    copy_corpus(&p, "charts/ingress-nginx", "charts/ingress-nginx");
    let stack = |certgen: &str| {
        format!(
            r#"
name: corpus-ingress
steps:
  - name: podinfo
    tool: helm
    release: web
    chart: charts/podinfo
    namespace: web
    context: c1
    set: {{ ingress.enabled: true, ingress.className: nginx }}
    wait: true
    timeout: 120s
    binary: {helm}
  - name: ingress
    tool: helm
    release: ing
    chart: charts/ingress-nginx
    namespace: ingress-nginx
    context: c1
    set: {{ controller.service.type: NodePort{certgen} }}
    wait: true
    timeout: 30s
    binary: {helm}
"#,
            helm = helm(3),
        )
    };
    p.stack(&stack(""));
    p.rdeploy(&["up"]).code(0).stdout_has("deploy complete");
    assert_eq!(sim.helm_statuses(3, "ing", "ingress-nginx"), ["deployed"]);

    let bump = ", controller.admissionWebhooks.patch.image.tag: v1.6.10, controller.admissionWebhooks.patch.image.digest: \"\"";
    p.stack(&stack(bump));
    p.rdeploy(&["up"]).code(1).stdout_has("ing@2");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    // podinfo did not change: found in place, no second revision (issue 28)
    assert_eq!(sub_statuses(&status, "podinfo"), pairs(&[("web@1", "done")]));
    assert_eq!(step(&status, "podinfo")["in_place"], true, "{status}");
    assert_eq!(sub_statuses(&status, "ingress"), pairs(&[("ing@2", "failed")]));
    let error = step(&status, "ingress")["error"].as_str().unwrap().to_string();
    assert!(error.contains("pre-upgrade hooks failed") || error.contains("hook"), "{error}");
    assert_eq!(sim.helm_statuses(3, "ing", "ingress-nginx"), ["deployed", "failed"]);
    let podinfo_history = sim.helm_statuses(3, "web", "web");
    let podinfo_objects = versions(&sim, "deploy", "web", &["web-podinfo".to_string()]);

    // the fix: back to the chart's pinned certgen image
    p.stack(&stack(""));
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    let status = p.status();
    assert_eq!(sub_statuses(&status, "ingress"), pairs(&[("ing@3", "done")]));
    assert_eq!(sub_statuses(&status, "podinfo"), pairs(&[("web@1", "done")]));
    assert_eq!(sim.helm_statuses(3, "ing", "ingress-nginx"), ["superseded", "failed", "deployed"]);
    assert_eq!(sim.helm_statuses(3, "web", "web"), podinfo_history, "recover did not upgrade podinfo again");
    assert_eq!(versions(&sim, "deploy", "web", &["web-podinfo".to_string()]), podinfo_objects);
    sim.kubectl_ok(&["get", "ingress", "web-podinfo", "-n", "web"]);
    sim.kubectl_ok(&["get", "ingressclass", "nginx"]);
}

/// metrics-server, grafana and bitnami's redis on helm 4, default values except grafana's
/// persistence (the failure) and redis's replica count (the second failure).
/// 1. grafana's values name the storage class `standard-rwo` of another cluster: its claim
///    never binds, the pod stays Pending, the install fails; redis does not run.
/// 2. The admin adds the class; recover installs grafana and reaches redis, whose replica
///    count, quoted in the stack, the chart's schema rejects.
/// 3. With a number, recover installs only redis.
#[test]
fn charts_metrics_server_grafana_with_a_claim_that_cannot_bind_and_redis_on_helm4() {
    let sim = Kubesim::start_with("c1", &["--pod-startup-ms", "50"]);
    let p = sim_project(&sim);
    for c in ["metrics-server", "grafana", "redis"] {
        copy_corpus(&p, &format!("charts/{c}"), &format!("charts/{c}"));
    }
    let stack = |replicas: &str| {
        format!(
            r#"
name: corpus-apps
steps:
  - name: metrics
    tool: helm
    release: ms
    chart: charts/metrics-server
    namespace: kube-system
    context: c1
    wait: true
    timeout: 120s
    binary: {helm}
  - name: grafana
    tool: helm
    release: gr
    chart: charts/grafana
    namespace: grafana
    context: c1
    set: {{ persistence.enabled: true, persistence.storageClassName: standard-rwo }}
    wait: true
    timeout: 20s
    binary: {helm}
  - name: redis
    tool: helm
    release: cache
    chart: charts/redis
    namespace: cache
    context: c1
    set: {{ replica.replicaCount: {replicas} }}
    wait: true
    timeout: 180s
    binary: {helm}
"#,
            helm = helm(4),
        )
    };
    p.stack(&stack("\"3\""));
    p.rdeploy(&["up"]).code(1).stdout_has("gr@1");
    let status = p.status();
    assert_eq!(sub_statuses(&status, "metrics"), pairs(&[("ms@1", "done")]));
    assert_eq!(sub_statuses(&status, "grafana"), pairs(&[("gr@1", "failed")]));
    assert!(sub_statuses(&status, "redis").is_empty(), "{status}");
    assert_eq!(
        sim.kubectl_ok(&["get", "pvc", "gr-grafana", "-n", "grafana", "-o", "jsonpath={.status.phase}"]),
        "Pending"
    );
    let ms = versions(&sim, "deploy", "kube-system", &["ms-metrics-server".to_string()]);

    sim.apply("c1", "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: standard-rwo}\nprovisioner: pd.csi.storage.gke.io\nvolumeBindingMode: Immediate\n");
    p.rdeploy(&["recover"]).code(1).stdout_has("cache@1");
    let status = p.status();
    assert_eq!(sub_statuses(&status, "grafana"), pairs(&[("gr@2", "done")]));
    assert_eq!(sub_statuses(&status, "redis"), pairs(&[("cache@1", "failed")]));
    let error = step(&status, "redis")["error"].as_str().unwrap().to_string();
    assert!(error.contains("replicaCount"), "{error}");
    assert!(!error.contains('\n'), "{error:?}");
    assert_eq!(
        sim.kubectl_ok(&["get", "pvc", "gr-grafana", "-n", "grafana", "-o", "jsonpath={.status.phase}"]),
        "Bound"
    );
    assert_eq!(sim.helm_statuses(4, "gr", "grafana"), ["superseded", "deployed"]);
    assert!(
        sim.helm(4, &["status", "cache", "-n", "cache"]).status.code() != Some(0),
        "the schema refused redis before helm wrote a release"
    );
    let grafana = versions(&sim, "deploy", "grafana", &["gr-grafana".to_string()]);

    p.stack(&stack("3"));
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    let status = p.status();
    assert_eq!(sub_statuses(&status, "redis"), pairs(&[("cache@1", "done")]));
    assert_eq!(sim.helm_statuses(4, "cache", "cache"), ["deployed"]);
    assert_eq!(sim.helm_statuses(4, "ms", "kube-system"), ["deployed"], "metrics-server ran once");
    assert_eq!(sim.helm_statuses(4, "gr", "grafana"), ["superseded", "deployed"], "grafana was not upgraded again");
    assert_eq!(versions(&sim, "deploy", "kube-system", &["ms-metrics-server".to_string()]), ms);
    assert_eq!(versions(&sim, "deploy", "grafana", &["gr-grafana".to_string()]), grafana);
    assert_eq!(
        sim.kubectl_ok(&["get", "sts", "cache-redis-replicas", "-n", "cache", "-o", "jsonpath={.spec.replicas}"]),
        "3"
    );
}

/// prometheus's node-exporter subchart (a DaemonSet) on three nodes, node-3 tainted, with the
/// subchart's tolerations emptied in values (as a user keeping it off tainted nodes writes it):
/// helm 3's `--wait` counts the DaemonSet ready one pod short (its `maxUnavailable`), so only
/// rdeploy's own check stops the deploy, naming the node and the scheduler's reason; recover
/// after restoring the chart's tolerations upgrades once and finishes.
#[test]
fn chart_prometheus_node_exporter_halted_on_a_tainted_node_on_helm3() {
    let sim = Kubesim::start_with("c1", &["--pod-startup-ms", "50", "--taint-node", "c1/node-3"]);
    let p = sim_project(&sim);
    copy_corpus(&p, "charts/prometheus", "charts/prometheus");
    let stack = |set: &str| {
        format!(
            r#"
name: corpus-node-exporter
steps:
  - name: prometheus
    tool: helm
    release: prom
    chart: charts/prometheus
    namespace: monitoring
    context: c1
    timeout: 30s
{set}    binary: {helm}
"#,
            helm = helm(3),
        )
    };
    p.stack(&stack("    set: { prometheus-node-exporter.tolerations: [] }\n"));
    p.rdeploy(&["up"])
        .code(1)
        .stdout_has("prom@1")
        .stdout_has("DaemonSet monitoring/prom-prometheus-node-exporter halted on node node-3")
        .stdout_has("on node node-3: Unschedulable: 0/3 nodes are available: 1 node(s) had untolerated taint");
    let status = p.status();
    assert_eq!(sub_statuses(&status, "prometheus"), pairs(&[("prom@1", "failed")]));
    assert_eq!(sim.helm_statuses(3, "prom", "monitoring"), ["deployed"], "helm 3 called it deployed");

    p.stack(&stack(""));
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    assert_eq!(sub_statuses(&p.status(), "prometheus"), pairs(&[("prom@2", "done")]));
    assert_eq!(sim.helm_statuses(3, "prom", "monitoring"), ["superseded", "deployed"], "one revision for the fix");
    let available = sim.kubectl_ok(&[
        "get",
        "ds",
        "prom-prometheus-node-exporter",
        "-n",
        "monitoring",
        "-o",
        "jsonpath={.status.numberAvailable}",
    ]);
    assert_eq!(available, "3");
}

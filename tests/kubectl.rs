//! kubectl steps through the real `rdeploy` binary, the real kubectl and a kubesim per test:
//! one object of five fails, status names it, and recover applies only that object.

mod common;

use common::{step, sub_statuses, Project};
use kubesim::testing::{kubectl_bin, Kubesim};

fn project(sim: &Kubesim) -> Project {
    let mut p = Project::new();
    p.copy_fixture("kubectl/app", "k8s");
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.stack(&format!(
        r#"
name: k8s
steps:
  - name: extras
    tool: kubectl
    manifests: [k8s/app.yaml]
    context: c1
    binary: {kubectl}
  - name: after
    tool: shell
    needs: [extras]
    run: echo after >> after.log
"#,
        kubectl = kubectl_bin().display()
    ));
    p
}

#[test]
fn a_failed_object_stops_the_deploy_and_recover_applies_only_it() {
    let sim = Kubesim::start("c1");
    let p = project(&sim);

    let up = p.rdeploy(&["up"]);
    up.code(1).stdout_has("ConfigMap/shop-extra/extra").stdout_has(r#"namespaces "shop-extra" not found"#);
    let status = p.status();
    assert_eq!(status["state"], "partial");
    let subs = sub_statuses(&status, "extras");
    assert_eq!(subs.len(), 5, "{subs:?}");
    for (id, st) in &subs {
        let want = if id == "ConfigMap/shop-extra/extra" { "failed" } else { "done" };
        assert_eq!(st, want, "{id}");
    }
    assert_eq!(step(&status, "after")["status"], "skipped");

    sim.kubectl_ok(&["create", "namespace", "shop-extra"]);
    let dry = p.rdeploy(&["recover", "--dry-run"]);
    dry.code(0)
        .stdout_has("apply ConfigMap/shop-extra/extra (missing from the cluster)")
        .stdout_has("keep Deployment/shop/web: done and unchanged");

    // The Deployment's resourceVersion must not move during recover; kubesim's controller writes
    // its status until its pods are ready, so let the rollout finish before reading it.
    sim.kubectl_ok(&["rollout", "status", "deploy/web", "-n", "shop", "--timeout=60s"]);
    let rv = sim.kubectl_ok(&["get", "deploy", "web", "-n", "shop", "-o", "jsonpath={.metadata.resourceVersion}"]);
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(sim.kubectl_ok(&["get", "cm", "extra", "-n", "shop-extra", "-o", "jsonpath={.data.owner}"]), "shop");
    assert_eq!(
        sim.kubectl_ok(&["get", "deploy", "web", "-n", "shop", "-o", "jsonpath={.metadata.resourceVersion}"]),
        rv
    );
    assert_eq!(p.read("after.log"), "after\n");
}

#[test]
fn the_api_server_offline_for_a_moment_is_retried_through_the_transient_class() {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file(
        "k8s/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: default}\ndata: {a: \"1\"}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: flags, namespace: default}\ndata: {b: \"2\"}\n",
    );
    p.stack(&format!(
        r#"
name: k8s
steps:
  - name: config
    tool: kubectl
    manifests: [k8s/cm.yaml]
    context: c1
    binary: {kubectl}
    retry: {{ attempts: 40, delay: 250ms, backoff: 1 }}
"#,
        kubectl = kubectl_bin().display()
    ));
    sim.post("/_sim/clusters/c1/offline");
    let child = p.spawn(&["up"]);
    let start = std::time::Instant::now();
    while !p.exists(&p.state("journal.jsonl")) || !p.read(&p.state("journal.jsonl")).contains(r#""attempt":2"#) {
        assert!(start.elapsed() < std::time::Duration::from_secs(120), "no second attempt was journaled");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    sim.post("/_sim/clusters/c1/online");
    let run = common::Run::from(child.wait_with_output().unwrap(), &["up"]);
    run.code(0).stdout_has("succeeded on attempt").stderr_has("(transient: the Kubernetes API is unavailable)");
    assert!(sim
        .kubectl_ok(&["--context", "c1", "get", "configmap", "settings", "-n", "default", "-o", "name"])
        .contains("configmap/settings"));
}

/// cert-manager's CRDs in one step, its issuers in the next: the ClusterIssuer's scope is known
/// only from the API (discovery at the time of the apply), so it is `ClusterIssuer/NAME`. Deleted
/// out of band while the step is unfinished, recover finds it missing and applies it again
/// (recorded under a namespace, `kubectl diff`'s name for it matched nothing and recover kept it,
/// reporting complete while it was missing).
#[test]
fn a_cluster_scoped_custom_resource_is_recorded_by_its_scope_and_recovered_when_deleted() {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    p.copy_fixture("kubectl/issuer", "certs");
    p.file(
        "certs/config.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: acme-config, namespace: cert-manager}\ndata: {email: ops@example.com}\n",
    );
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.stack(&format!(
        r#"
name: certs
steps:
  - name: crds
    tool: kubectl
    manifests: [certs/crds.yaml]
    context: c1
    binary: {kubectl}
  - name: issuers
    tool: kubectl
    needs: [crds]
    manifests: [certs/issuers.yaml, certs/config.yaml]
    namespace: web
    context: c1
    binary: {kubectl}
"#,
        kubectl = kubectl_bin().display()
    ));
    sim.kubectl_ok(&["create", "namespace", "web"]);

    p.rdeploy(&["up"]).code(1).stdout_has(r#"namespaces "cert-manager" not found"#);
    let status = p.status();
    let subs = sub_statuses(&status, "issuers");
    assert_eq!(
        subs,
        [
            ("ClusterIssuer/letsencrypt-staging".to_string(), "done".to_string()),
            ("Issuer/web/selfsigned".to_string(), "done".to_string()),
            ("ConfigMap/cert-manager/acme-config".to_string(), "failed".to_string()),
        ]
    );
    let error = subs_error(&status, "issuers", "ConfigMap/cert-manager/acme-config");
    assert_eq!(
        error,
        r#"Error from server (NotFound): error when creating: namespaces "cert-manager" not found (certs/config.yaml)"#
    );

    sim.kubectl_ok(&["delete", "clusterissuer", "letsencrypt-staging"]);
    sim.kubectl_ok(&["create", "namespace", "cert-manager"]);
    p.rdeploy(&["recover", "--dry-run"])
        .code(0)
        .stdout_has("apply ClusterIssuer/letsencrypt-staging (missing from the cluster)")
        .stdout_has("keep Issuer/web/selfsigned: done and unchanged");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(
        sim.kubectl_ok(&["get", "clusterissuer", "letsencrypt-staging", "-o", "jsonpath={.spec.acme.email}"]),
        "ops@example.com"
    );
    assert_eq!(p.status()["state"], "complete");
}

/// The recorded error of one sub-change in `status --json`.
fn subs_error(status: &serde_json::Value, step_name: &str, id: &str) -> String {
    step(status, step_name)["sub_changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .and_then(|s| s["error"].as_str())
        .unwrap_or_else(|| panic!("no error recorded for {id}: {status}"))
        .to_string()
}

/// A CRD whose scope changed (deleted and created again as cluster-scoped, which also deletes
/// its objects) leaves the checkpoint with `Widget/web/w`, a record under an identity the
/// object no longer has, as a checkpoint of an older rdeploy does for a cluster-scoped kind.
/// recover reconciles the record to the object's identity now (`Widget/w`): one sub-change,
/// judged by `kubectl diff` alone (the old record's `done` does not carry over: it is missing,
/// so it is applied), and no stale `Widget/web/w` is left reported done. Then the reverse:
/// back to namespaced, `Widget/w` becomes `Widget/web/w`.
#[test]
fn a_record_under_an_older_scope_is_reconciled_to_the_objects_identity_now() {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    let crd = |scope: &str| {
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: widgets.example.com}}\nspec:\n  group: example.com\n  scope: {scope}\n  names: {{kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}\n"
        )
    };
    let manifest = |scope: &str, cm_ns: &str| {
        format!(
            "{}---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w}}\nspec: {{size: 3}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c, namespace: {cm_ns}}}\ndata: {{a: \"1\"}}\n",
            crd(scope)
        )
    };
    // An SRE changes a CRD's scope (immutable in the API) by deleting it, which deletes its
    // objects, and creating it again.
    let rescope = |scope: &str| {
        sim.kubectl_ok(&["delete", "crd", "widgets.example.com"]);
        sim.apply("c1", &crd(scope));
        sim.kubectl_ok(&["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=60s"]);
    };
    p.file("k8s/widgets.yaml", &manifest("Namespaced", "nope"));
    p.stack(&format!(
        "name: w\nsteps:\n  - name: widgets\n    tool: kubectl\n    manifests: [k8s/widgets.yaml]\n    namespace: web\n    context: c1\n    binary: {}\n",
        kubectl_bin().display()
    ));
    sim.kubectl_ok(&["create", "namespace", "web"]);
    p.rdeploy(&["up"]).code(1).stdout_has(r#"namespaces "nope" not found"#);
    // Sorted: a renamed record keeps its place, a new one comes last.
    let ids = |status: &serde_json::Value| {
        let mut subs = sub_statuses(status, "widgets");
        subs.sort();
        subs
    };
    let pairs = |items: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = items.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        pairs.sort();
        pairs
    };
    assert_eq!(
        ids(&p.status()),
        pairs(&[
            ("CustomResourceDefinition/widgets.example.com", "done"),
            ("Widget/web/w", "done"),
            ("ConfigMap/nope/c", "failed")
        ])
    );

    // The CRD comes back cluster-scoped: its old objects are gone with it.
    rescope("Cluster");
    p.file("k8s/widgets.yaml", &manifest("Cluster", "nope"));
    sim.kubectl_ok(&["create", "namespace", "nope"]);
    p.rdeploy(&["recover", "--dry-run"])
        .code(0)
        .stdout_has("apply Widget/w (missing from the cluster)")
        .stdout_has("Widget/web/w is Widget/w now");
    p.rdeploy(&["recover"]).code(0).stderr_has("Widget/web/w is Widget/w now");
    assert_eq!(sim.kubectl_ok(&["get", "widget", "w", "-o", "jsonpath={.spec.size}"]), "3");
    let status = p.status();
    assert_eq!(status["state"], "complete");
    assert_eq!(
        ids(&status),
        pairs(&[
            ("CustomResourceDefinition/widgets.example.com", "done"),
            ("Widget/w", "done"),
            ("ConfigMap/nope/c", "done")
        ])
    );

    // And back to namespaced, with another object failing so that recover runs.
    rescope("Namespaced");
    p.file("k8s/widgets.yaml", &manifest("Namespaced", "gone"));
    p.rdeploy(&["up"]).code(1).stdout_has(r#"namespaces "gone" not found"#);
    sim.kubectl_ok(&["create", "namespace", "gone"]);
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(sim.kubectl_ok(&["get", "widget", "w", "-n", "web", "-o", "jsonpath={.spec.size}"]), "3");
    let widgets: Vec<(String, String)> =
        ids(&p.status()).into_iter().filter(|(id, _)| id.starts_with("Widget/")).collect();
    assert_eq!(widgets, pairs(&[("Widget/web/w", "done")]));
}

/// kubectl's own client-side validation (`error validating "FILE": ...`), printed for real
/// through rdeploy: kubectl v1.32 validates with `--validate=strict` by default, which checks an
/// object's `apiVersion` and `kind` before it sends anything (field checks are the server's).
/// Two objects whose `apiVersion` is no group/version (`apps/v1/beta`, a typo), and one whose
/// namespace does not exist, among objects that are fine: each bad one is failed with
/// kubectl's message, attributed through its staged file to its document, and every other
/// object is applied (kubectl goes on past them, and so does the checkpoint).
#[test]
fn kubectl_validation_errors_fail_each_object_by_its_document_and_the_rest_apply() {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file(
        "k8s/app.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: one}\n---\napiVersion: rbac.authorization.k8s.io/v1/Role\nkind: Role\nmetadata: {name: two}\nrules: []\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: three}\n---\napiVersion: apps/v1/Deployment\nkind: Deployment\nmetadata: {name: four}\nspec: {selector: {matchLabels: {a: b}}, template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: nginx}]}}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: five, namespace: nope}\n",
    );
    p.stack(&format!(
        "name: v\nsteps:\n  - name: objects\n    tool: kubectl\n    manifests: [k8s/app.yaml]\n    context: c1\n    binary: {}\n",
        kubectl_bin().display()
    ));
    p.rdeploy(&["up"]).code(1).stdout_has("3 of 5 objects failed");
    let status = p.status();
    let mut subs = sub_statuses(&status, "objects");
    subs.sort();
    let want: Vec<(String, String)> = [
        ("ConfigMap/default/one", "done"),
        ("ConfigMap/default/three", "done"),
        ("ConfigMap/nope/five", "failed"),
        ("Deployment/default/four", "failed"),
        ("Role/default/two", "failed"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(subs, want);
    let validation = |group_version: &str, document: u32| {
        format!(
            "error validating data: unexpected GroupVersion string: {group_version}; if you choose to ignore these errors, turn validation off with --validate=false (k8s/app.yaml, document {document})"
        )
    };
    assert_eq!(subs_error(&status, "objects", "Role/default/two"), validation("rbac.authorization.k8s.io/v1/Role", 2));
    assert_eq!(subs_error(&status, "objects", "Deployment/default/four"), validation("apps/v1/Deployment", 4));
    assert_eq!(
        subs_error(&status, "objects", "ConfigMap/nope/five"),
        r#"Error from server (NotFound): error when creating: namespaces "nope" not found (k8s/app.yaml, document 5)"#
    );
    // The stderr kubectl printed names the operator's file and document, never rdeploy's staged
    // copy (issue 31, point 5).
    let tail = step(&status, "objects")["stderr_tail"].to_string();
    assert!(!tail.contains(".json") && !tail.contains(".rdeploy"), "{tail}");
    assert!(tail.contains(r#"error when creating \"k8s/app.yaml\" (document 5): namespaces"#), "{tail}");
    assert!(tail.contains(r#"error validating \"k8s/app.yaml\" (document 2)"#), "{tail}");
    for name in ["one", "three"] {
        assert_eq!(sim.kubectl_ok(&["get", "configmap", name, "-o", "jsonpath={.metadata.name}"]), name);
    }

    // Fixed, recover applies the three and touches nothing else.
    let text = p.read("k8s/app.yaml").replace("/v1/Role", "/v1").replace("apps/v1/Deployment", "apps/v1");
    p.file("k8s/app.yaml", &text);
    sim.kubectl_ok(&["create", "namespace", "nope"]);
    p.rdeploy(&["recover"]).code(0);
    let mut subs = sub_statuses(&p.status(), "objects");
    subs.sort();
    assert!(subs.iter().all(|(_, s)| s == "done"), "{subs:?}");
}

/// A CRD deleted out of band (and with it its custom resources) while the step is unfinished:
/// `kubectl diff` cannot map the custom resource's kind and fails as a whole, so it says nothing
/// of any object. recover does not let the checkpoint decide alone (it kept the CRD, recorded
/// done, and the apply of the custom resource then failed with "resource mapping not found"):
/// it asks the API which objects exist, applies the CRD again, then the custom resource, leaves
/// the untouched ConfigMap alone and ends complete.
#[test]
fn recover_applies_a_crd_deleted_out_of_band_when_kubectl_diff_fails_as_a_whole() {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file(
        "k8s/gadgets.yaml",
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: gadgets.example.com}\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {kind: Gadget, plural: gadgets, singular: gadget, listKind: GadgetList}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n---\napiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g}\nspec: {size: 3}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {a: \"1\"}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: late, namespace: later}\ndata: {b: \"2\"}\n",
    );
    p.stack(&format!(
        "name: g\nsteps:\n  - name: gadgets\n    tool: kubectl\n    manifests: [k8s/gadgets.yaml]\n    namespace: web\n    context: c1\n    binary: {}\n",
        kubectl_bin().display()
    ));
    sim.kubectl_ok(&["create", "namespace", "web"]);
    p.rdeploy(&["up"]).code(1).stdout_has(r#"namespaces "later" not found"#);
    let mut subs = sub_statuses(&p.status(), "gadgets");
    subs.sort();
    assert_eq!(
        subs,
        [
            ("ConfigMap/later/late".to_string(), "failed".to_string()),
            ("ConfigMap/web/settings".to_string(), "done".to_string()),
            ("CustomResourceDefinition/gadgets.example.com".to_string(), "done".to_string()),
            ("Gadget/web/g".to_string(), "done".to_string()),
        ]
    );

    // Out of band: the CRD is deleted, and its Gadget with it.
    sim.kubectl_ok(&["delete", "crd", "gadgets.example.com"]);
    assert!(sim.eventually(std::time::Duration::from_secs(30), || {
        !sim.kubectl(&["get", "crd", "gadgets.example.com"]).status.success()
    }));
    sim.kubectl_ok(&["create", "namespace", "later"]);
    let rv = || sim.kubectl_ok(&["get", "cm", "settings", "-n", "web", "-o", "jsonpath={.metadata.resourceVersion}"]);
    let before = rv();

    p.rdeploy(&["recover", "--dry-run"])
        .code(0)
        .stdout_has("apply CustomResourceDefinition/gadgets.example.com (missing from the cluster)")
        .stdout_has("apply Gadget/web/g (missing from the cluster)")
        .stdout_has("keep ConfigMap/web/settings: done and in the cluster");
    p.rdeploy(&["recover"]).code(0).stderr_has("`kubectl diff` failed");
    assert_eq!(sim.kubectl_ok(&["get", "gadget", "g", "-n", "web", "-o", "jsonpath={.spec.size}"]), "3");
    assert_eq!(sim.kubectl_ok(&["get", "cm", "late", "-n", "later", "-o", "jsonpath={.data.b}"]), "2");
    assert_eq!(rv(), before, "the untouched ConfigMap was applied again");
    let status = p.status();
    assert_eq!(status["state"], "complete");
    assert!(sub_statuses(&status, "gadgets").iter().all(|(_, st)| st == "done"), "{status}");
}

/// A stack run from another directory (`rdeploy up deploy/stack.yaml`): kubectl runs in the
/// stack's directory, and is given the step's `kubeconfig` and kustomization made absolute, so
/// it finds them (relative to rdeploy's directory, it would look for them a second time under
/// the stack's).
#[test]
fn a_stack_run_from_another_directory_finds_its_kubeconfig_and_kustomization() {
    let sim = Kubesim::start_with("c1", &["--pod-startup-ms", "50"]);
    let p = Project::new();
    p.file("deploy/kube/k.yaml", &std::fs::read_to_string(&sim.kubeconfig).expect("the sim's kubeconfig"));
    p.file("deploy/k8s/kustomization.yaml", "resources: [web.yaml]\n");
    p.file(
        "deploy/k8s/web.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web, namespace: default}\ndata: {a: b}\n",
    );
    p.file(
        "deploy/stack.yaml",
        &format!(
            "name: web\nsteps:\n  - name: web\n    tool: kubectl\n    manifests: [k8s]\n    kubeconfig: kube/k.yaml\n    context: c1\n    binary: {}\n",
            kubectl_bin().display()
        ),
    );
    let args = ["up", "deploy/stack.yaml"];
    let up = p.command(&args).env_remove("KUBECONFIG").output().expect("run rdeploy");
    let up = common::Run::from(up, &args);
    up.code(0).stdout_has("deploy complete");
    assert_eq!(sim.kubectl_ok(&["get", "configmap", "web", "-o", "jsonpath={.data.a}"]), "b");
}

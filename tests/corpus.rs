//! The real-world corpus (public roles, modules, manifest bundles and charts nobody on the team
//! wrote, each with its SOURCE and LICENSE; kept out of this repository's commits, so it is found
//! through `kubesim::testing::corpus`: `$KUBESIM_CORPUS`, else `../shared/corpus`; these tests
//! are behind the `corpus` feature, run by `scripts/test-corpus.sh`) through the real `rdeploy` binary
//! and the real tools: each item deploys, fails part-way on an injected realistic failure (a host
//! whose task fails, a provisioner that fails, an image that cannot pull), `status` says exactly
//! what is in place and what is missing, and `recover` touches only what was missing.

mod common;

use common::{copy_dir, repo_root, require_tool, step, sub_statuses, Project};
use kubesim::testing::{corpus, kubectl_bin, Kubesim};

/// Copies an item of the corpus into the project, as `copy_fixture` does for `fixtures/`.
fn copy_corpus(p: &Project, item: &str, to: &str) {
    copy_dir(&corpus().join(item), &p.path(to));
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

/// kubernetes/examples' guestbook bundle (3 Services, 3 Deployments) with `wait: true`; the
/// frontend's image cannot be pulled, so its rollout fails while the redis tier is in place.
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

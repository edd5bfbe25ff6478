//! `rdeploy plan` through the real binary on a stack of all five tools: real terraform, real
//! ansible-core (`.venv`), real helm 4 and kubectl against a kubesim, and shell. The plan lists
//! every change and changes nothing (proved by reading each tool's state); after `up` it is
//! empty (`--detailed-exitcode` 7, then 0); an edit made in the cluster after a finished deploy
//! is reported as drift.

mod common;

use common::{repo_root, require_tool, Project};
use kubesim::testing::{helm_bin, Kubesim};
use serde_json::Value;

/// ansible writes a file per host with `copy` (check mode previews it, with a diff).
const PLAYBOOK: &str = r#"
- name: roll out the release
  hosts: web
  gather_facts: false
  tasks:
    - name: write the release
      ansible.builtin.copy:
        dest: "{{ playbook_dir }}/../out/{{ inventory_hostname }}.release"
        content: "{{ release }}\n"
"#;

fn five_tools(sim: &Kubesim) -> Project {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    require_tool("kubectl", "https://kubernetes.io/docs/tasks/tools/");
    let ansible = repo_root().join(".venv/bin/ansible-playbook");
    assert!(ansible.is_file(), "{} is missing: run scripts/setup-ansible.sh", ansible.display());
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    for dir in ["infra", "hosts", "charts", "k8s"] {
        p.copy_fixture(&format!("demo/{dir}"), dir);
    }
    std::fs::create_dir_all(p.path("out")).unwrap();
    p.file("hosts/plan.yml", PLAYBOOK);
    p.stack(&format!(
        r#"
name: shop
steps:
  - name: network
    tool: terraform
    dir: infra
    vars: {{ env: demo }}
  - name: hosts
    tool: ansible
    needs: [network]
    playbook: hosts/plan.yml
    inventory: hosts/inventory.ini
    extra_vars: {{ release: "1.4.2" }}
    binary: {ansible}
    env: {{ ANSIBLE_NOCOLOR: "1" }}
  - name: app
    tool: helm
    needs: [hosts]
    release: shop
    chart: charts/webapp
    namespace: shop
    context: demo
    set: {{ image: "nginx:1.27", color: green }}
    binary: {helm}
  - name: extras
    tool: kubectl
    needs: [app]
    manifests: [k8s/]
    context: demo
  - name: seed-data
    tool: shell
    needs: [extras]
    sub_changes:
      - {{ name: users,  run: echo users >> out/seed.log,  check: grep -q users out/seed.log }}
      - {{ name: orders, run: echo orders >> out/seed.log, check: grep -q orders out/seed.log }}
"#,
        ansible = ansible.display(),
        helm = helm_bin(4).display(),
    ));
    p
}

fn plan_json(p: &Project, expected_code: i32) -> Value {
    let run = p.rdeploy(&["plan", "--json", "--detailed-exitcode"]);
    run.code(expected_code);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("plan --json is not JSON ({e}):\n{}", run.stdout))
}

fn step<'a>(plan: &'a Value, name: &str) -> &'a Value {
    plan["steps"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no step {name}"))
}

/// `(id, action)` of a step's items.
fn items(plan: &Value, name: &str) -> Vec<(String, String)> {
    step(plan, name)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["id"].as_str().unwrap().to_string(), i["action"].as_str().unwrap().to_string()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn plan_lists_every_change_of_five_tools_changes_nothing_and_is_empty_after_up() {
    let sim = Kubesim::start("demo");
    let p = five_tools(&sim);

    let plan = plan_json(&p, 7);
    assert_eq!(plan["stack"], "shop");
    let mut network = items(&plan, "network");
    network.sort();
    assert_eq!(
        network,
        pairs(&[
            ("terraform_data.lb", "create"),
            ("terraform_data.subnet[\"a\"]", "create"),
            ("terraform_data.subnet[\"b\"]", "create"),
            ("terraform_data.vpc", "create"),
        ])
    );
    assert_eq!(step(&plan, "network")["summary"], "4 to add, 0 to change, 0 to destroy");
    assert_eq!(
        items(&plan, "hosts"),
        pairs(&[("web1", "update"), ("web2", "update"), ("web3", "update"), ("web4", "update")])
    );
    let web1 = &step(&plan, "hosts")["items"][0];
    assert!(web1["details"][0].as_str().unwrap().contains("write the release"), "{web1}");
    assert!(web1["diff"].as_str().unwrap().contains("+1.4.2"), "check mode's diff is shown: {web1}");
    assert_eq!(
        items(&plan, "app"),
        pairs(&[
            ("ConfigMap/shop/shop-config", "create"),
            ("Service/shop/shop", "create"),
            ("Deployment/shop/shop", "create")
        ])
    );
    assert!(step(&plan, "app")["items"][0]["diff"].as_str().unwrap().contains("+  color: green"));
    assert_eq!(
        items(&plan, "extras"),
        pairs(&[("ConfigMap/shop/worker-settings", "create"), ("Deployment/shop/worker", "create")])
    );
    // helm's `--create-namespace` makes it: kubectl cannot diff there yet, the objects are missing.
    assert_eq!(step(&plan, "extras")["items"][0]["reason"], "missing: namespace shop does not exist yet");
    assert_eq!(items(&plan, "seed-data"), pairs(&[("users", "run"), ("orders", "run")]));
    assert_eq!(plan["changes"], 4 + 4 + 3 + 2 + 2);

    // Nothing changed anywhere: no state, no release, no object, no host file, no shell output.
    assert!(!p.exists("infra/terraform.tfstate"), "a plan writes no terraform state");
    let status = sim.helm(4, &["status", "shop", "-n", "shop", "--kube-context", "demo"]);
    assert!(
        !status.status.success() && kubesim::testing::stderr(&status).contains("release: not found"),
        "a plan installs no release"
    );
    let objects = sim.kubectl_ok(&["--context", "demo", "get", "configmaps,deployments", "-A", "-o", "name"]);
    assert!(!objects.contains("worker") && !objects.contains("shop-config"), "a plan creates no object: {objects}");
    assert!(!p.exists("out/web1.release"), "check mode changes no host");
    assert!(!p.exists("out/seed.log"), "a plan runs no sub-change");

    // The human report says the same in words.
    let text = p.rdeploy(&["plan"]);
    text.code(0)
        .stdout_has("network (terraform): 4 to add, 0 to change, 0 to destroy")
        .stdout_has("  + create ConfigMap/shop/worker-settings (missing: namespace shop does not exist yet)")
        .stdout_has("  > run users");

    p.rdeploy(&["up"]).code(0);
    let after = plan_json(&p, 0);
    assert_eq!(after["changes"], 0, "nothing left to change after up: {after:#}");
    assert_eq!(step(&after, "seed-data")["items"][0]["action"], "unchanged");
    assert_eq!(step(&after, "app")["items"][0]["action"], "unchanged");
}

#[test]
fn plan_after_a_finished_deploy_reports_drift_per_tool() {
    let sim = Kubesim::start("demo");
    let p = five_tools(&sim);
    p.rdeploy(&["up"]).code(0);

    // Out of band: a person edits the release's ConfigMap and the kubectl step's, a host file,
    // and terraform's state.
    sim.kubectl_ok(&[
        "--context",
        "demo",
        "-n",
        "shop",
        "patch",
        "configmap",
        "shop-config",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"color":"red"}}"#,
    ]);
    sim.kubectl_ok(&[
        "--context",
        "demo",
        "-n",
        "shop",
        "patch",
        "configmap",
        "worker-settings",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"queue":"manual"}}"#,
    ]);
    std::fs::write(p.path("out/web2.release"), "0.9\n").unwrap();
    let state_rm = std::process::Command::new("terraform")
        .args(["state", "rm", "terraform_data.lb"])
        .current_dir(p.path("infra"))
        .output()
        .unwrap();
    assert!(state_rm.status.success(), "{}", String::from_utf8_lossy(&state_rm.stderr));

    let plan = plan_json(&p, 7);
    let app = step(&plan, "app");
    assert_eq!(app["items"][0]["id"], "ConfigMap/shop/shop-config");
    assert_eq!(app["items"][0]["action"], "update");
    let diff = app["items"][0]["diff"].as_str().unwrap();
    assert!(diff.contains("-  color: red") && diff.contains("+  color: green"), "{diff}");
    assert_eq!(app["changes"], 1, "only the edited object of the release: {app:#}");
    let extras = items(&plan, "extras");
    assert_eq!(extras, pairs(&[("ConfigMap/shop/worker-settings", "update"), ("Deployment/shop/worker", "unchanged")]));
    assert!(step(&plan, "extras")["items"][0]["diff"].as_str().unwrap().contains("-  queue: manual"));
    assert_eq!(
        items(&plan, "hosts"),
        pairs(&[("web1", "unchanged"), ("web2", "update"), ("web3", "unchanged"), ("web4", "unchanged")])
    );
    assert_eq!(
        items(&plan, "network"),
        pairs(&[("terraform_data.lb", "create")]),
        "terraform's plan sees the state edit"
    );
    assert_eq!(step(&plan, "seed-data")["changes"], 0);
}

#[test]
fn plan_markdown_is_ready_for_a_pull_request_comment() {
    let p = Project::new();
    p.stack(
        "name: small\nsteps:\n  - name: seed\n    tool: shell\n    sub_changes:\n      - { name: users, run: echo users >> seed.log, check: grep -q users seed.log }\n      - { name: orders, run: echo orders >> seed.log, check: grep -q orders seed.log }\n",
    );
    p.file("seed.log", "users\n");
    let run = p.rdeploy(&["plan", "--markdown", "--detailed-exitcode"]);
    run.code(7)
        .stdout_has("## rdeploy plan: stack `small`")
        .stdout_has("| seed | shell | 1 | 1 to run, 1 in place |")
        .stdout_has("- `orders` **run**")
        .stdout_has("- `users` **unchanged** (already in place");
    assert_eq!(p.read("seed.log"), "users\n", "a plan runs checks only");
}

/// A step that reads outputs is previewed with their journaled values once its producer's
/// preview changes nothing (`Resolved::Known`); before any deploy it waits for the producer.
#[test]
fn plan_previews_a_consumer_with_the_journaled_outputs_of_a_producer_that_would_not_change() {
    let p = Project::new();
    p.stack(
        r#"name: small
steps:
  - name: infra
    tool: shell
    sub_changes:
      - name: mint
        check: test -e minted
        run: touch minted && echo "ip=10.0.0.7" >> "$RDEPLOY_OUTPUT"
  - name: app
    tool: shell
    needs: [infra]
    sub_changes:
      - name: use
        check: grep -qx "${{ steps.infra.outputs.ip }}" used
        run: echo "${{ steps.infra.outputs.ip }}" > used
"#,
    );
    let plan = plan_json(&p, 7);
    assert_eq!(step(&plan, "app")["unknown_until"], serde_json::json!(["infra"]));
    assert_eq!(step(&plan, "app")["inputs"]["steps.infra.outputs.ip"]["state"], "pending");
    assert!(!p.exists("used"), "a plan runs nothing");

    p.rdeploy(&["up"]).code(0);
    assert_eq!(p.read("used"), "10.0.0.7\n");
    // infra would change nothing: app is previewed with the recorded value, its check passes.
    let plan = plan_json(&p, 0);
    let app = step(&plan, "app");
    assert_eq!(app["unknown_until"], serde_json::json!([]));
    assert_eq!(app["inputs"]["steps.infra.outputs.ip"], serde_json::json!({ "state": "known", "value": "10.0.0.7" }));
    assert_eq!(items(&plan, "app"), pairs(&[("use", "unchanged")]));

    // The check ran with the value itself: a file that no longer holds it is a change.
    p.file("used", "10.0.0.8\n");
    let plan = plan_json(&p, 7);
    assert_eq!(items(&plan, "app"), pairs(&[("use", "run")]));

    // A producer that would run again may output something else: pending once more.
    p.remove("minted");
    let plan = plan_json(&p, 7);
    assert_eq!(step(&plan, "app")["unknown_until"], serde_json::json!(["infra"]));
}

#[test]
fn plan_redacts_secrets_and_refuses_a_missing_tool() {
    let p = Project::new();
    p.stack(
        "name: small\nsteps:\n  - name: call\n    tool: shell\n    env: { API_TOKEN: tok-5f3a9c }\n    sub_changes:\n      - { name: notify, run: 'curl -H \"token: tok-5f3a9c\" https://example.invalid' }\n",
    );
    let run = p.rdeploy(&["plan", "--json"]);
    run.code(0);
    assert!(!run.stdout.contains("tok-5f3a9c"), "the secret is redacted: {}", run.stdout);
    assert!(run.stdout.contains("token: ***"), "{}", run.stdout);

    p.stack("name: small\nsteps:\n  - name: extras\n    tool: kubectl\n    manifests: [k8s/]\n    binary: /nonexistent/kubectl\n");
    std::fs::create_dir_all(p.path("k8s")).unwrap();
    p.rdeploy(&["plan"]).code(2).stderr_has("step `extras`: `/nonexistent/kubectl` was not found");
}

#[test]
fn ci_plan_only_writes_the_plan_to_the_step_summary_and_junit_and_deploys_nothing() {
    let mut p = Project::new();
    p.stack(
        "name: small\nsteps:\n  - name: seed\n    tool: shell\n    sub_changes:\n      - { name: users, run: echo users >> seed.log, check: grep -q users seed.log }\n  - name: broken\n    tool: kubectl\n    manifests: [k8s/]\n    context: nowhere\n",
    );
    // No object at all: the kubectl step cannot be planned.
    p.file("k8s/empty.yaml", "# nothing yet\n");
    let summary = p.path("summary.md");
    p.env("GITHUB_ACTIONS", "true").env("GITHUB_STEP_SUMMARY", summary.to_str().unwrap());
    let run = p.rdeploy(&["ci", "--plan-only", "--junit", "junit.xml"]);
    run.code(0).stdout_has("seed (shell): 1 to run, 0 in place").stdout_has("::error ");
    let md = p.read("summary.md");
    assert!(md.contains("## rdeploy plan: stack `small`"), "{md}");
    assert!(md.contains("- `users` **run**"), "{md}");
    let junit = p.read("junit.xml");
    assert!(junit.contains("<testcase name=\"seed\" classname=\"small.plan.shell\">"), "{junit}");
    assert!(junit.contains("run users"), "{junit}");
    assert!(junit.contains("failures=\"1\"") && junit.contains("type=\"plan-failed\""), "{junit}");
    assert!(!p.exists("seed.log"), "--plan-only deploys nothing");
    assert!(!p.exists(".rdeploy/journal.jsonl"), "and records no deploy");
}

/// base64 as a Secret's `data` holds it (coreutils' `base64`).
fn b64(text: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run base64");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// A chart with a Secret (a marked value rotated since the last deploy, and a value the chart
/// makes itself, in no registry): plan shows which keys change, never a value, old or new,
/// plain or base64, in its text, `--json` or `--markdown`.
#[test]
fn plan_masks_a_secrets_data_and_a_rotated_marked_value() {
    let sim = Kubesim::start("s1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file("chart/Chart.yaml", "apiVersion: v2\nname: secretive\nversion: 0.1.0\n");
    p.file(
        "chart/templates/secret.yaml",
        r#"apiVersion: v1
kind: Secret
metadata:
  name: {{ .Release.Name }}-creds
type: Opaque
data:
  login: {{ .Values.app.login | b64enc | quote }}
  generated: {{ printf "chart-made-%s" .Values.tier | b64enc | quote }}
  fixed: {{ "unchanging-9z" | b64enc | quote }}
"#,
    );
    p.stack(&format!(
        r#"
name: demo
steps:
  - name: app
    tool: helm
    release: web
    chart: chart
    namespace: shop
    context: s1
    set: {{ app.login: {{ from_env: APP_LOGIN }}, tier: {{ from_env: TIER }} }}
    timeout: 60s
    binary: {}
"#,
        helm_bin(4).display()
    ));
    p.env("APP_LOGIN", "OLDLOGIN-rot-1").env("TIER", "gold");
    p.rdeploy(&["up"]).code(0);
    // Rotated: the old value is in no registry of the next run.
    p.env("APP_LOGIN", "NEWLOGIN-rot-2").env("TIER", "silver");
    let clear = [
        "OLDLOGIN-rot-1",
        "NEWLOGIN-rot-2",
        "chart-made-gold",
        "chart-made-silver",
        "unchanging-9z",
        &b64("OLDLOGIN-rot-1"),
        &b64("NEWLOGIN-rot-2"),
        &b64("chart-made-gold"),
        &b64("chart-made-silver"),
        &b64("unchanging-9z"),
    ]
    .map(|s| s.to_string());
    let json = p.rdeploy(&["plan", "--json"]);
    json.code(0);
    let text = p.rdeploy(&["plan"]);
    text.code(0);
    let markdown = p.rdeploy(&["plan", "--markdown"]);
    markdown.code(0);
    for (form, out) in [("--json", &json), ("text", &text), ("--markdown", &markdown)] {
        for value in &clear {
            assert!(
                !out.stdout.contains(value.as_str()) && !out.stderr.contains(value.as_str()),
                "plan {form} shows {value}:\n{}\n{}",
                out.stdout,
                out.stderr
            );
        }
    }
    let plan: Value = serde_json::from_str(&json.stdout).unwrap();
    let app = step(&plan, "app");
    let secret = app["items"].as_array().unwrap().iter().find(|i| i["id"] == "Secret/shop/web-creds").unwrap();
    assert_eq!(secret["action"], "update", "{app:#}");
    let diff = secret["diff"].as_str().unwrap();
    assert!(diff.contains("-  login: '*** (before)'") && diff.contains("+  login: '*** (after)'"), "{diff}");
    assert!(diff.contains("+  generated: '*** (after)'"), "{diff}");
    assert!(diff.contains("   fixed: '***'"), "an unchanged key shows masked: {diff}");
    let values = app["items"].as_array().unwrap().iter().find(|i| i["id"] == "web values").unwrap();
    let diff = values["diff"].as_str().unwrap();
    assert!(diff.contains("-  login: '*** (before)'") && diff.contains("+  login: '*** (after)'"), "{diff}");
}

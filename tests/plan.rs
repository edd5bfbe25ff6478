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
    assert!(!p.exists(&p.state("journal.jsonl")), "and records no deploy");
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

// ---- `plan -o PLANFILE`, `up --plan PLANFILE`, `ci --plan PLANFILE` ----

fn mode_of(p: &Project, rel: &str) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p.path(rel)).unwrap().permissions().mode() & 0o777
}

fn planfile(p: &Project, rel: &str) -> Value {
    serde_json::from_str(&p.read(rel)).unwrap_or_else(|e| panic!("{rel} is not JSON: {e}"))
}

fn terraform(p: &Project, dir: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("terraform").args(args).current_dir(p.path(dir)).output().unwrap();
    assert!(out.status.success(), "terraform {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A resource whose value comes from rdeploy's environment (`TF_VAR_owner`), so a new plan at
/// apply time would differ from the reviewed one.
const OWNER_TF: &str = r#"
variable "owner" {
  type = string
}

resource "terraform_data" "owner" {
  input = var.owner
}

output "owner" {
  value = terraform_data.owner.output
}
"#;

/// The issue's "done when": a plan of all five tools saved (0600), `--detailed-exitcode` 7;
/// `up --plan` applies exactly that set (read back from terraform's state, the release, the
/// cluster, the hosts and the shell's file), terraform from its saved plan (the value it
/// applies is the one planned, though the environment changed since); then the plan is empty.
#[test]
fn up_plan_applies_exactly_the_saved_plan_of_five_tools_and_then_plan_is_empty() {
    let sim = Kubesim::start("demo");
    let mut p = five_tools(&sim);
    p.file("infra/owner.tf", OWNER_TF);
    p.env("TF_VAR_owner", "alice");

    let run = p.rdeploy(&["plan", "-o", "reviewed.plan", "--detailed-exitcode"]);
    run.code(7).stdout_has("network (terraform): 5 to add, 0 to change, 0 to destroy");
    assert_eq!(mode_of(&p, "reviewed.plan"), 0o600, "the PLANFILE is owner-only");
    let saved = planfile(&p, "reviewed.plan");
    assert_eq!(saved["format"], "rdeploy-plan");
    assert_eq!(saved["version"], 1);
    assert_eq!(saved["stack"]["name"], "shop");
    assert_eq!(saved["changes"], 5 + 4 + 3 + 2 + 2);
    let steps = saved["steps"].as_array().unwrap();
    let network = &steps[0];
    assert!(network["files"]["infra/main.tf"].is_string() && network["files"]["infra/owner.tf"].is_string());
    assert_eq!(network["observed"][0]["value"], "absent", "no state yet: {network:#}");
    assert!(network["terraform_plan"]["base64"].as_str().unwrap().len() > 100, "terraform's saved plan rides along");
    let app = steps.iter().find(|s| s["name"] == "app").unwrap();
    assert!(app["files"]["charts/webapp/values.yaml"].is_string(), "{app:#}");
    assert!(app["observed"].as_array().unwrap().iter().any(|o| o["what"] == "revision of helm release shop"));
    let hosts = steps.iter().find(|s| s["name"] == "hosts").unwrap();
    assert!(hosts["files"]["hosts/plan.yml"].is_string() && hosts["files"]["hosts/inventory.ini"].is_string());
    assert!(saved["rendered"].as_str().unwrap().contains("+ create ConfigMap/shop/worker-settings"));
    assert!(!p.exists("infra/terraform.tfstate"), "planning applied nothing");

    // Another value in the environment now: a fresh plan would create `bob`; the saved one says alice.
    p.env("TF_VAR_owner", "bob");
    let up = p.rdeploy(&["up", "--plan", "reviewed.plan"]);
    up.code(0).stdout_has("applied from the reviewed plan reviewed.plan (sha256:");
    let owner = p.rdeploy(&["output", "stack.yaml", "network", "owner"]);
    owner.code(0);
    assert_eq!(owner.stdout.trim(), "alice", "terraform applied the saved plan, not a new one");

    // Exactly the planned set is in place, read from each tool.
    let mut state: Vec<String> = terraform(&p, "infra", &["state", "list"]).lines().map(str::to_string).collect();
    state.sort();
    assert_eq!(
        state,
        [
            "terraform_data.lb",
            "terraform_data.owner",
            "terraform_data.subnet[\"a\"]",
            "terraform_data.subnet[\"b\"]",
            "terraform_data.vpc"
        ]
    );
    let release = sim.helm(4, &["status", "shop", "-n", "shop", "--kube-context", "demo", "-o", "json"]);
    assert!(release.status.success(), "{}", kubesim::testing::stderr(&release));
    let release: Value = serde_json::from_slice(&release.stdout).unwrap();
    assert_eq!((release["version"].as_u64(), release["info"]["status"].as_str()), (Some(1), Some("deployed")));
    let objects =
        sim.kubectl_ok(&["--context", "demo", "-n", "shop", "get", "configmaps,deployments,services", "-o", "name"]);
    for object in [
        "configmap/shop-config",
        "configmap/worker-settings",
        "deployment.apps/shop",
        "deployment.apps/worker",
        "service/shop",
    ] {
        assert!(objects.lines().any(|l| l == object), "{object} is in the cluster: {objects}");
    }
    for host in ["web1", "web2", "web3", "web4"] {
        assert_eq!(p.read(&format!("out/{host}.release")), "1.4.2\n");
    }
    assert_eq!(p.lines("out/seed.log"), ["users", "orders"]);
    let status = p.status();
    assert!(status["from_plan"].as_str().unwrap().starts_with("reviewed.plan (sha256:"), "{status:#}");
    assert!(!p.exists(&p.state("steps/network/reviewed.tfplan")), "the saved plan is consumed once applied");

    // The world is now as the plan said (the environment's `bob` aside, which only terraform reads).
    p.env("TF_VAR_owner", "alice");
    let after = plan_json(&p, 0);
    assert_eq!(after["changes"], 0, "{after:#}");
}

fn shell_and_terraform(p: &Project) {
    p.copy_fixture("demo/infra", "infra");
    std::fs::create_dir_all(p.path("out")).unwrap();
    p.file("seed.sh", "#!/bin/sh\necho users >> out/seed.log\n");
    p.stack(
        r#"name: shop
steps:
  - name: network
    tool: terraform
    dir: infra
    vars: { env: demo }
  - name: seed
    tool: shell
    needs: [network]
    sub_changes:
      - { name: users, run: sh seed.sh, check: grep -q users out/seed.log }
"#,
    );
}

/// A stale plan is refused with exit 2 before anything runs or is recorded.
fn assert_refused(p: &Project, planfile: &str, cause: &str) {
    let run = p.rdeploy(&["up", "--plan", planfile]);
    run.code(2)
        .stderr_has(&format!("the plan {planfile} is stale: nothing was applied and nothing recorded"))
        .stderr_has(cause)
        .stderr_has(&format!("hint: plan again with `rdeploy plan stack.yaml -o {planfile}`"));
    assert!(!p.exists(&p.state("journal.jsonl")), "nothing recorded:\n{}", run.stderr);
    assert!(!p.exists("out/seed.log"), "nothing ran");
}

#[test]
fn up_plan_refuses_a_plan_whose_stack_file_changed() {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let p = Project::new();
    shell_and_terraform(&p);
    p.rdeploy(&["plan", "-o", "p.plan"]).code(0);
    let text = p.read("stack.yaml").replace("vars: { env: demo }", "vars: { env: prod }");
    p.stack(&text);
    assert_refused(&p, "p.plan", "the stack file stack.yaml changed since the plan");
    assert!(!p.exists("infra/terraform.tfstate"));
}

#[test]
fn up_plan_refuses_a_plan_whose_step_files_changed() {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let p = Project::new();
    shell_and_terraform(&p);
    p.rdeploy(&["plan", "-o", "p.plan"]).code(0);
    assert!(
        planfile(&p, "p.plan")["steps"][1]["files"]["seed.sh"].is_string(),
        "the script a command names is digested"
    );
    p.file("infra/extra.tf", "resource \"terraform_data\" \"extra\" {}\n");
    p.file("seed.sh", "#!/bin/sh\necho others >> out/seed.log\n");
    assert_refused(&p, "p.plan", "step `network`: file infra/extra.tf was added since the plan");
    assert_refused(&p, "p.plan", "step `seed`: file seed.sh changed since the plan");
    assert!(!p.exists("infra/terraform.tfstate"));
}

/// "terraform state moved": another apply between the plan and `up --plan`.
#[test]
fn up_plan_refuses_a_plan_whose_terraform_state_moved() {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let p = Project::new();
    shell_and_terraform(&p);
    p.rdeploy(&["plan", "-o", "p.plan"]).code(0);
    terraform(&p, "infra", &["apply", "-auto-approve", "-input=false", "-var", "env=demo"]);
    let before = p.read("infra/terraform.tfstate");
    assert_refused(
        &p,
        "p.plan",
        "step `network`: terraform state (serial, lineage) was absent when planned and is serial ",
    );
    assert_eq!(p.read("infra/terraform.tfstate"), before, "the state is untouched");
}

#[test]
fn up_plan_refuses_a_plan_of_another_stack_or_format_version() {
    let p = Project::new();
    p.file("other.yaml", "name: other\nsteps:\n  - name: seed\n    tool: shell\n    run: echo other >> out/seed.log\n");
    p.stack("name: shop\nsteps:\n  - name: seed\n    tool: shell\n    run: echo shop >> out/seed.log\n");
    std::fs::create_dir_all(p.path("out")).unwrap();
    p.rdeploy(&["plan", "other.yaml", "-o", "other.plan"]).code(0);
    assert_refused(&p, "other.plan", "the plan is of stack `other` (other.yaml), not of stack `shop` (stack.yaml)");

    p.rdeploy(&["plan", "-o", "shop.plan"]).code(0);
    let newer = p.read("shop.plan").replacen("\"version\": 1,", "\"version\": 2,", 1);
    p.file("newer.plan", &newer);
    p.rdeploy(&["up", "--plan", "newer.plan"])
        .code(2)
        .stderr_has("the plan file newer.plan is of format version 2; this rdeploy (")
        .stderr_has("hint: plan again with this rdeploy: `rdeploy plan -o newer.plan`");
    p.file("garbage.plan", "not json");
    p.rdeploy(&["up", "--plan", "garbage.plan"]).code(2).stderr_has("garbage.plan is not an rdeploy plan file");
    assert!(!p.exists(&p.state("journal.jsonl")) && !p.exists("out/seed.log"));
    // The plan of this stack applies.
    p.rdeploy(&["up", "--plan", "shop.plan"]).code(0);
    assert_eq!(p.lines("out/seed.log"), ["shop"]);
}

fn kube_project(sim: &Kubesim) -> Project {
    require_tool("kubectl", "https://kubernetes.io/docs/tasks/tools/");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.copy_fixture("demo/charts", "charts");
    p.copy_fixture("demo/k8s", "k8s");
    std::fs::create_dir_all(p.path("out")).unwrap();
    p.stack(&format!(
        r#"
name: shop
steps:
  - name: app
    tool: helm
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
"#,
        helm = helm_bin(4).display(),
    ));
    p
}

#[test]
fn up_plan_refuses_a_plan_whose_kubectl_object_was_edited_in_the_cluster() {
    let sim = Kubesim::start("demo");
    let p = kube_project(&sim);
    p.rdeploy(&["up"]).code(0);
    std::fs::remove_dir_all(p.path(&p.state(""))).unwrap();
    p.rdeploy(&["plan", "-o", "p.plan", "--detailed-exitcode"]).code(0);
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
    assert_refused(&p, "p.plan", "step `extras`: resourceVersion of ConfigMap/shop/worker-settings was ");
    let run = p.rdeploy(&["up", "--plan", "p.plan"]);
    run.code(2).stderr_has(" now: the object was edited in the cluster");
    let queue = sim.kubectl_ok(&[
        "--context",
        "demo",
        "-n",
        "shop",
        "get",
        "configmap",
        "worker-settings",
        "-o",
        "jsonpath={.data.queue}",
    ]);
    assert_eq!(queue, "manual", "nothing was applied over the edit");
}

#[test]
fn up_plan_refuses_a_plan_whose_helm_release_or_its_objects_moved() {
    let sim = Kubesim::start("demo");
    let p = kube_project(&sim);
    p.rdeploy(&["up"]).code(0);
    std::fs::remove_dir_all(p.path(&p.state(""))).unwrap();
    let text = p.read("stack.yaml").replace("color: green", "color: blue");
    p.stack(&text);
    p.rdeploy(&["plan", "-o", "p.plan", "--detailed-exitcode"]).code(7);
    // Out of band: someone upgrades the release by hand.
    let upgrade = sim.helm(
        4,
        &[
            "upgrade",
            "shop",
            &p.path("charts/webapp").display().to_string(),
            "-n",
            "shop",
            "--kube-context",
            "demo",
            "--reuse-values",
            "--set",
            "color=red",
        ],
    );
    assert!(upgrade.status.success(), "{}", kubesim::testing::stderr(&upgrade));
    assert_refused(&p, "p.plan", "step `app`: revision of helm release shop was 1 when planned and is 2 now: the release was upgraded, rolled back or uninstalled");
    let run = p.rdeploy(&["up", "--plan", "p.plan"]);
    run.code(2).stderr_has("step `app`: resourceVersion of ConfigMap/shop/shop-config was ");
    let color = sim.kubectl_ok(&[
        "--context",
        "demo",
        "-n",
        "shop",
        "get",
        "configmap",
        "shop-config",
        "-o",
        "jsonpath={.data.color}",
    ]);
    assert_eq!(color, "red", "nothing was applied over the upgrade");
    // A file of the chart changed since the plan: refused before the cluster is even read.
    let template = p.read("charts/webapp/templates/configmap.yaml");
    p.file("charts/webapp/templates/configmap.yaml", &format!("{template}# edited\n"));
    assert_refused(&p, "p.plan", "step `app`: file charts/webapp/templates/configmap.yaml changed since the plan");
}

/// PLANFILE: 0600, and neither a marked secret nor a secret by name is in it, in clear or
/// base64 (terraform's saved plan, which holds every variable's value, included).
#[test]
fn the_planfile_is_owner_only_and_holds_no_secret_in_clear() {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let mut p = Project::new();
    p.file(
        "tf/main.tf",
        "variable \"db_password\" {\n  type = string\n  sensitive = true\n}\nresource \"terraform_data\" \"db\" {\n  input = sha256(var.db_password)\n}\n",
    );
    p.stack(
        r#"name: shop
steps:
  - name: db
    tool: terraform
    dir: tf
    vars: { db_password: { from_env: DB_PASSWORD } }
  - name: call
    tool: shell
    env: { API_TOKEN: tok-5f3a9c-cafe }
    sub_changes:
      - { name: notify, run: 'echo "token: tok-5f3a9c-cafe" > /dev/null' }
"#,
    );
    p.env("DB_PASSWORD", "hunter2-Zq81-secret");
    p.rdeploy(&["plan", "-o", "s.plan"]).code(0);
    assert_eq!(mode_of(&p, "s.plan"), 0o600);
    let text = p.read("s.plan");
    for value in ["hunter2-Zq81-secret", "tok-5f3a9c-cafe"] {
        assert!(!text.contains(value), "{value} in clear in the PLANFILE");
        assert!(!text.contains(&b64(value)), "{value} in base64 in the PLANFILE");
    }
    let saved = planfile(&p, "s.plan");
    assert_eq!(saved["steps"][0]["secrets"], serde_json::json!(["vars.db_password"]));
    assert_eq!(saved["steps"][1]["secrets"], serde_json::json!(["env.API_TOKEN"]));
    assert!(saved["rendered"].as_str().unwrap().contains("token: ***"), "{}", saved["rendered"]);
    // Written again over the old one: still owner-only (a new file, created 0600).
    std::fs::set_permissions(p.path("s.plan"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    p.rdeploy(&["plan", "-o", "s.plan"]).code(0);
    assert_eq!(mode_of(&p, "s.plan"), 0o600);
    p.rdeploy(&["up", "--plan", "s.plan"]).code(0);
}

/// A failure part-way through `up --plan` is recovered as after `up`: terraform's saved plan
/// was consumed by the failed apply, so `recover` takes terraform's own path (a plan on the
/// current state, then apply), and every resource is created once.
#[test]
fn recover_after_a_failed_up_plan_takes_terraforms_own_path() {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let p = Project::new();
    shell_and_terraform(&p);
    std::fs::remove_dir_all(p.path("out")).unwrap();
    p.rdeploy(&["plan", "-o", "p.plan"]).code(0);
    // The provisioners log to ../out, which is missing: the first resource fails.
    let run = p.rdeploy(&["up", "--plan", "p.plan"]);
    run.code(1).stdout_has("applied from the reviewed plan p.plan (sha256:");
    assert!(run.stdout.contains("reviewed.tfplan"), "terraform applied the saved plan: {}", run.stdout);
    assert!(!p.exists(&p.state("steps/network/reviewed.tfplan")), "the saved plan is consumed");
    std::fs::create_dir_all(p.path("out")).unwrap();
    let recover = p.rdeploy(&["recover"]);
    recover.code(0);
    let mut lines = p.lines("out/terraform.log");
    lines.sort();
    assert_eq!(lines, ["lb", "subnet-a", "subnet-b", "vpc"], "each resource created once");
    assert_eq!(p.lines("out/seed.log"), ["users"]);
    let status = p.status();
    assert!(status["from_plan"].as_str().unwrap().starts_with("p.plan (sha256:"), "{status:#}");
    p.rdeploy(&["plan", "--detailed-exitcode"]).code(0);
}

/// `retry:` never applies a plan nobody reviewed: a terraform step applying its reviewed saved
/// plan under `up --plan` is not retried (a second attempt would plan afresh); `recover`, the
/// operator's choice, does that.
#[test]
fn up_plan_does_not_retry_a_terraform_step_with_a_fresh_plan() {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let p = Project::new();
    shell_and_terraform(&p);
    let stack = p.read("stack.yaml").replace(
        "    vars: { env: demo }\n",
        "    vars: { env: demo }\n    retry: { attempts: 3, delay: 0s, matching: [\".\"] }\n",
    );
    assert!(stack.contains("retry:"), "{stack}");
    p.stack(&stack);
    std::fs::remove_dir_all(p.path("out")).unwrap();
    p.rdeploy(&["plan", "-o", "p.plan"]).code(0);
    let run = p.rdeploy(&["up", "--plan", "p.plan"]);
    run.code(1).stdout_has("applied from the reviewed plan p.plan (sha256:");
    assert!(!run.stderr.contains("attempt 1/3 failed"), "not retried: {}", run.stderr);
    assert!(!run.stdout.contains("attempt 2/3"), "not retried: {}", run.stdout);
    std::fs::create_dir_all(p.path("out")).unwrap();
    p.rdeploy(&["recover"]).code(0);
    let mut lines = p.lines("out/terraform.log");
    lines.sort();
    assert_eq!(lines, ["lb", "subnet-a", "subnet-b", "vpc"], "each resource created once");
}

/// The pull-request and merge jobs: `ci --plan-only -o PLANFILE` saves the plan (the artifact),
/// `ci --plan PLANFILE` applies it with the step summary and JUnit of `ci`; a stale one is
/// refused with exit 2 and an annotation.
#[test]
fn ci_plan_applies_a_reviewed_plan_on_merge() {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let mut p = Project::new();
    shell_and_terraform(&p);
    let summary = p.path("summary.md");
    p.env("GITHUB_ACTIONS", "true").env("GITHUB_STEP_SUMMARY", summary.to_str().unwrap());
    p.rdeploy(&["ci", "--plan-only", "-o", "pr.plan", "--junit", "pr.xml"])
        .code(0)
        .stdout_has("network (terraform): 4 to add");
    assert_eq!(mode_of(&p, "pr.plan"), 0o600);
    assert!(!p.exists(&p.state("journal.jsonl")), "the pull request deploys nothing");

    let run = p.rdeploy(&["ci", "--plan", "pr.plan", "--junit", "merge.xml"]);
    run.code(0).stdout_has("applied from the reviewed plan pr.plan (sha256:");
    let md = p.read("summary.md");
    assert!(md.contains("- ran: `rdeploy up stack.yaml --plan pr.plan`: the reviewed plan (sha256:`"), "{md}");
    assert!(md.contains("- applied from the reviewed plan: `pr.plan (sha256:"), "{md}");
    let junit = p.read("merge.xml");
    assert!(junit.contains("<testcase name=\"network\"") && !junit.contains("<failure"), "{junit}");
    assert_eq!(p.lines("out/seed.log"), ["users"]);

    // The same plan again: the state moved (its own apply), so it is stale now.
    let stale = p.rdeploy(&["ci", "--plan", "pr.plan"]);
    stale.code(2).stdout_has("::error ").stderr_has("terraform state (serial, lineage) was absent when planned");
    let md = p.read("summary.md");
    assert!(md.contains("**Exit 2**") && md.contains("the plan pr.plan is stale: nothing was applied"), "{md}");
}

/// Output values: one known when the plan was made (its producer would not change) must be the
/// same when the consumer starts, or the consumer fails before its tool runs; one known only
/// after its producer applies was never reviewed and is taken as it comes, as `up` does.
#[test]
fn up_plan_checks_the_output_values_a_consumer_was_previewed_with() {
    let p = Project::new();
    p.stack(
        r#"name: small
steps:
  - name: infra
    tool: shell
    sub_changes:
      - name: mint
        check: test -e minted
        run: touch minted && echo "ip=$(cat ip.txt)" >> "$RDEPLOY_OUTPUT"
  - name: app
    tool: shell
    needs: [infra]
    sub_changes:
      - name: use
        check: grep -qx "${{ steps.infra.outputs.ip }}" used
        run: echo "${{ steps.infra.outputs.ip }}" > used
"#,
    );
    p.file("ip.txt", "10.0.0.7\n");
    p.rdeploy(&["plan", "-o", "first.plan"]).code(0);
    let saved = planfile(&p, "first.plan");
    assert_eq!(saved["steps"][1]["previewed"], false);
    assert_eq!(saved["steps"][1]["inputs"]["steps.infra.outputs.ip"]["state"], "pending");
    p.rdeploy(&["up", "--plan", "first.plan"]).code(0);
    assert_eq!(p.read("used"), "10.0.0.7\n", "a value known only after its producer applies is taken as it comes");

    // Known when planned: the consumer was previewed with 10.0.0.7.
    p.file("used", "stale\n");
    p.rdeploy(&["plan", "-o", "second.plan", "--detailed-exitcode"]).code(7);
    let saved = planfile(&p, "second.plan");
    assert_eq!(
        saved["steps"][1]["inputs"]["steps.infra.outputs.ip"],
        serde_json::json!({"state": "known", "value": "10.0.0.7"})
    );
    // The producer is in place (its check passes): `up --plan` does not run it again, and the
    // consumer gets the reviewed value, the one the last deploy recorded, whatever `ip.txt` says.
    p.file("ip.txt", "10.0.0.8\n");
    p.rdeploy(&["up", "--plan", "second.plan"]).code(0);
    assert_eq!(p.read("used"), "10.0.0.7\n");
}

/// helm's `revision` stays when the release is in place (no upgrade): the plan takes its
/// recorded value as known, and `up --plan` of an unchanged release keeps the revision.
#[test]
fn a_helm_revision_stays_known_while_the_release_is_in_place() {
    let sim = Kubesim::start("demo");
    let p = kube_project(&sim);
    let text = p.read("stack.yaml")
        + "  - name: migrate\n    tool: shell\n    needs: [app]\n    run: echo \"revision ${{ steps.app.outputs.revision }}\" > out/schema\n";
    p.stack(&text);
    p.rdeploy(&["up"]).code(0);
    assert_eq!(p.read("out/schema"), "revision 1\n");
    p.rdeploy(&["plan", "-o", "p.plan"]).code(0);
    let saved = planfile(&p, "p.plan");
    let migrate = saved["steps"].as_array().unwrap().iter().find(|s| s["name"] == "migrate").unwrap();
    assert_eq!(migrate["inputs"]["steps.app.outputs.revision"], serde_json::json!({"state": "known", "value": 1}));
    let app = saved["steps"].as_array().unwrap().iter().find(|s| s["name"] == "app").unwrap();
    assert_eq!(app["changes"], 0, "the release would not change: {app:#}");
    p.rdeploy(&["up", "--plan", "p.plan"]).code(0);
    assert_eq!(p.read("out/schema"), "revision 1\n", "no upgrade: the revision stays");
}

/// A retry of the merge job after its deploy stopped part-way recovers that deploy (its record
/// names the plan's digest); an unfinished deploy that did not start from the plan is refused.
#[test]
fn ci_plan_retried_recovers_its_own_deploy_and_refuses_another() {
    let p = Project::new();
    p.stack(
        "name: small\nsteps:\n  - name: seed\n    tool: shell\n    sub_changes:\n      - { name: users, run: echo users >> seed.log }\n      - { name: orders, run: test -e fixed && echo orders >> seed.log }\n",
    );
    p.rdeploy(&["plan", "-o", "merge.plan"]).code(0);
    p.rdeploy(&["ci", "--plan", "merge.plan"]).code(1);
    p.file("fixed", "");
    let retry = p.rdeploy(&["ci", "--plan", "merge.plan"]);
    retry.code(0);
    assert!(retry.stderr.contains("running `rdeploy recover stack.yaml`"), "{}", retry.stderr);
    assert_eq!(p.lines("seed.log"), ["users", "orders"], "users ran once");

    // An unfinished deploy of plain `up`: a plan was not made on top of it.
    p.remove("fixed");
    p.remove("seed.log");
    p.rdeploy(&["up"]).code(1);
    p.rdeploy(&["plan", "-o", "other.plan"]).code(0);
    p.rdeploy(&["ci", "--plan", "other.plan"])
        .code(2)
        .stderr_has("that did not start from the plan other.plan: the plan was not made on top of it");
    assert_eq!(p.lines("seed.log"), ["users"]);
}

/// A fleet step is previewed against the current kube context only, yet would apply to every
/// cluster: `plan -o` and `up --plan` refuse it (exit 2) naming it; plain `plan` still previews.
#[test]
fn plan_out_and_up_plan_refuse_a_stack_with_a_fleet_step() {
    let p = Project::new();
    std::fs::create_dir_all(p.path("out")).unwrap();
    p.file("seed.sh", "#!/bin/sh\necho users >> out/seed.log\n");
    p.file("k8s/agent.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: { name: agent }\ndata: { a: b }\n");
    let shell = "name: shop\nsteps:\n  - name: seed\n    tool: shell\n    sub_changes:\n      - { name: users, run: sh seed.sh, check: grep -q users out/seed.log }\n";
    p.stack(shell);
    p.rdeploy(&["plan", "-o", "p.plan"]).code(0);
    p.stack(&format!(
        "{shell}  - name: agent\n    tool: kubectl\n    manifests: [k8s/agent.yaml]\n    contexts: [edge-1, edge-2]\n"
    ));
    for args in [&["plan", "-o", "q.plan"][..], &["up", "--plan", "p.plan"][..]] {
        let run = p.rdeploy(args);
        run.code(2)
            .stderr_has("refuses fleet step `agent`: the reviewed plan does not cover fleet steps yet")
            .stderr_has("hint: `rdeploy up` without --plan, or move the fleet step to its own stack");
        assert!(!p.exists("q.plan"), "no plan file written");
        assert!(!p.exists(&p.state("journal.jsonl")), "nothing recorded:\n{}", run.stderr);
        assert!(!p.exists("out/seed.log"), "nothing ran");
    }
}

/// A `from_file:` secret beside what a step reads is not digested: its sha256 would let a
/// reader of the PLANFILE check a guess. A PLANFILE saved in the same tree is not an input.
#[test]
fn a_from_file_secret_inside_a_digested_tree_is_not_in_the_planfile() {
    use sha2::Digest as _;
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let p = Project::new();
    p.file(
        "main.tf",
        "variable \"db_password\" {\n  type = string\n  sensitive = true\n}\nresource \"terraform_data\" \"db\" {\n  input = sha256(var.db_password)\n}\n",
    );
    p.file("db-password", "hunter2-Zq81-secret");
    p.stack("name: shop\nsteps:\n  - name: db\n    tool: terraform\n    dir: .\n    vars: { db_password: { from_file: db-password } }\n");
    p.rdeploy(&["plan", "-o", "s.plan"]).code(0);
    let text = p.read("s.plan");
    let digest: String = sha2::Sha256::digest(b"hunter2-Zq81-secret").iter().map(|b| format!("{b:02x}")).collect();
    assert!(!text.contains(&digest), "the secret file's sha256 is in the PLANFILE");
    assert!(!text.contains("hunter2-Zq81-secret"));
    let files = &planfile(&p, "s.plan")["steps"][0]["files"];
    assert!(files.get("main.tf").is_some() && files.get("db-password").is_none(), "{files:#}");
    p.rdeploy(&["up", "--plan", "s.plan"]).code(0);
}

/// A staging refusal leaves no earlier step's reviewed terraform plan (it holds variable
/// values) behind; one a killed `up --plan` left is removed by `recover` and `reset`.
#[test]
fn no_reviewed_terraform_plan_outlives_a_refused_staging_or_a_killed_up_plan() {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let p = Project::new();
    let tf = "variable \"env\" {\n  type = string\n}\nresource \"terraform_data\" \"x\" {\n  input = var.env\n}\n";
    p.file("a/main.tf", tf);
    p.file("b/main.tf", tf);
    p.stack("name: shop\nsteps:\n  - name: a\n    tool: terraform\n    dir: a\n    vars: { env: one }\n  - name: b\n    tool: terraform\n    dir: b\n    needs: [a]\n    vars: { env: two }\n");
    p.rdeploy(&["plan", "-o", "s.plan"]).code(0);
    let mut saved = planfile(&p, "s.plan");
    saved["steps"][1]["terraform_plan"]["digest"] = serde_json::json!("0".repeat(64));
    p.file("s.plan", &serde_json::to_string_pretty(&saved).unwrap());
    p.rdeploy(&["up", "--plan", "s.plan"])
        .code(2)
        .stderr_has("terraform's saved plan of step `b` does not match its digest");
    for step in ["a", "b"] {
        assert!(
            !p.exists(&p.state(&format!("steps/{step}/reviewed.tfplan"))),
            "step {step}'s reviewed plan left behind"
        );
    }
    for command in ["recover", "reset"] {
        p.file(&p.state("steps/a/reviewed.tfplan"), "left by a killed up --plan");
        let mut args = vec![command];
        if command == "reset" {
            args.push("--yes");
        }
        p.rdeploy(&args).code(0);
        assert!(!p.exists(&p.state("steps/a/reviewed.tfplan")), "`{command}` left the reviewed plan");
    }
}

//! Converge without churn (issue 28): what `plan` shows in place is what `up` skips, through the
//! same preview. After a finished deploy, `plan --detailed-exitcode` exits 0 and a second `up`
//! creates no helm revision, moves no resourceVersion, runs no terraform apply and no shell
//! sub-change whose `check` passes, and says so; `--force-apply` and `always: true` run the
//! tools anyway; `up --plan` applies exactly what the reviewed plan said would change. Real
//! terraform, ansible-core (`.venv`), helm 4 and kubectl against kubesim.

mod common;

use common::{fleet_project, repo_root, require_tool, step, Project};
use kubesim::testing::{helm_bin, Kubesim};
use serde_json::Value;

/// ansible writes a file per host with `copy`: a second run changes nothing (`changed=0`).
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
    p.file("hosts/converge.yml", PLAYBOOK);
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
    playbook: hosts/converge.yml
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
    set: {{ image: "nginx:1.27", color: green, lbAddress: "${{{{ steps.network.outputs.lb_address }}}}" }}
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
  - name: migrate
    tool: shell
    needs: [seed-data]
    run: echo "v2 rev ${{{{ steps.app.outputs.revision }}}}" >> out/schema
    check: grep -qx "v2 rev ${{{{ steps.app.outputs.revision }}}}" out/schema
"#,
        ansible = ansible.display(),
        helm = helm_bin(4).display(),
    ));
    p
}

/// How many revisions the release has.
fn revisions(sim: &Kubesim, release: &str, ns: &str) -> usize {
    let history = sim.helm_ok(4, &["history", release, "-n", ns, "--kube-context", "demo", "-o", "json"]);
    serde_json::from_str::<Vec<Value>>(&history).unwrap().len()
}

/// `kind/name=resourceVersion` of every ConfigMap, Deployment and Service in `ns`, sorted.
fn resource_versions(sim: &Kubesim, ns: &str) -> Vec<String> {
    let json = sim.kubectl_ok(&["--context", "demo", "-n", ns, "get", "configmaps,deployments,services", "-o", "json"]);
    let list: Value = serde_json::from_str(&json).unwrap();
    let mut out: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| format!("{}/{}={}", o["kind"], o["metadata"]["name"], o["metadata"]["resourceVersion"]))
        .collect();
    out.sort();
    out
}

/// terraform's state serial: it moves with every apply that writes the state.
fn tf_serial(p: &Project) -> u64 {
    let state: Value = serde_json::from_str(&p.read("infra/terraform.tfstate")).unwrap();
    state["serial"].as_u64().unwrap()
}

#[test]
fn a_second_up_of_five_tools_applies_nothing_and_says_so() {
    let sim = Kubesim::start("demo");
    let p = five_tools(&sim);
    p.rdeploy(&["up"]).code(0);
    let revisions_before = revisions(&sim, "shop", "shop");
    let versions_before = resource_versions(&sim, "shop");
    let serial_before = tf_serial(&p);
    let tf_log = p.read("out/terraform.log");
    assert_eq!(p.read("out/seed.log"), "users\norders\n");
    assert_eq!(p.read("out/schema"), "v2 rev 1\n");

    // The plan sees nothing to do ...
    let plan = p.rdeploy(&["plan", "--json", "--detailed-exitcode"]);
    plan.code(0);
    let plan: Value = serde_json::from_str(&plan.stdout).unwrap();
    assert_eq!(plan["changes"], 0, "{plan:#}");

    // ... and `up` does nothing, and says so.
    let up = p.rdeploy(&["up"]);
    up.code(0);
    for name in ["network", "hosts", "app", "extras", "seed-data", "migrate"] {
        up.stdout_has(&format!("  {name}: done (in place, nothing to do)"));
    }
    assert_eq!(revisions(&sim, "shop", "shop"), revisions_before, "no new helm revision");
    assert_eq!(resource_versions(&sim, "shop"), versions_before, "no resourceVersion moved");
    assert_eq!(tf_serial(&p), serial_before, "no terraform apply wrote the state");
    assert_eq!(p.read("out/terraform.log"), tf_log, "no terraform provisioner ran");
    assert_eq!(p.read("out/seed.log"), "users\norders\n", "no sub-change whose check passes ran");
    assert_eq!(p.read("out/schema"), "v2 rev 1\n", "the migration's check passed: not run");

    let status = p.status();
    for name in ["network", "hosts", "app", "extras", "seed-data", "migrate"] {
        assert_eq!(step(&status, name)["in_place"], true, "{name}: {status:#}");
        assert_eq!(step(&status, name)["status"], "done");
    }
    let hosts = step(&status, "hosts")["sub_changes"].as_array().unwrap().clone();
    assert_eq!(hosts.len(), 4);
    for host in &hosts {
        assert_eq!(host["in_place"], true, "ansible ran and changed nothing: {host}");
        assert!(host["note"].as_str().unwrap().contains("changed=0"), "{host}");
    }
    assert_eq!(step(&status, "app")["outputs"]["revision"], 1, "the release's revision stays: {status:#}");
    let extras = &step(&status, "extras")["sub_changes"];
    assert_eq!(extras[0]["in_place"], true, "{extras}");

    // An edit in the cluster is drift: that one object alone is applied again.
    sim.kubectl_ok(&[
        "--context",
        "demo",
        "-n",
        "shop",
        "patch",
        "configmap",
        "worker-settings",
        "--type=merge",
        "-p",
        r#"{"data":{"queue":"edited"}}"#,
    ]);
    let edited = resource_versions(&sim, "shop");
    p.rdeploy(&["up"]).code(0).stdout_has("extras: done (2 objects, 1 in place)");
    let after = resource_versions(&sim, "shop");
    let moved: Vec<&String> = after.iter().filter(|v| !edited.contains(v)).collect();
    assert_eq!(moved.len(), 1, "only the edited object is applied: {moved:?}");
    assert!(moved[0].contains("worker-settings"), "{moved:?}");
    assert_eq!(revisions(&sim, "shop", "shop"), revisions_before);
}

fn shell_project(stack: &str) -> Project {
    let p = Project::new();
    p.stack(stack);
    p
}

const SHELL: &str = r#"
name: seed
steps:
  - name: data
    tool: shell
    sub_changes:
      - { name: users, run: echo users >> log, check: grep -q users log }
      - { name: orders, run: echo orders >> log }
  - name: bare
    tool: shell
    run: echo bare >> bare.log
    check: test -f bare.log
"#;

#[test]
fn a_shell_sub_change_whose_check_passes_is_not_run_again_and_without_check_it_runs() {
    let p = shell_project(SHELL);
    p.rdeploy(&["up"]).code(0);
    assert_eq!(p.read("log"), "users\norders\n");
    assert_eq!(p.read("bare.log"), "bare\n");
    p.rdeploy(&["up"])
        .code(0)
        .stdout_has("data: done (2 declared sub-changes, 1 in place)")
        .stdout_has("bare: done (in place, nothing to do)");
    assert_eq!(p.read("log"), "users\norders\norders\n", "users is in place; orders has no check: it runs");
    assert_eq!(p.read("bare.log"), "bare\n");
    let status = p.status();
    let subs = step(&status, "data")["sub_changes"].as_array().unwrap().clone();
    assert_eq!(subs[0]["id"], "users");
    assert_eq!(subs[0]["in_place"], true);
    assert!(subs[1].get("in_place").is_none(), "orders ran: {}", subs[1]);
}

#[test]
fn force_apply_and_always_run_the_tool_for_what_is_in_place() {
    let p = shell_project(SHELL);
    p.rdeploy(&["up"]).code(0);
    p.rdeploy(&["up", "--force-apply"]).code(0);
    assert_eq!(p.read("log"), "users\norders\nusers\norders\n", "--force-apply runs every sub-change");
    assert_eq!(p.read("bare.log"), "bare\nbare\n");

    p.stack(&SHELL.replace("  - name: bare\n", "  - name: bare\n    always: true\n"));
    p.rdeploy(&["up"]).code(0);
    assert_eq!(p.read("bare.log"), "bare\nbare\nbare\n", "`always: true` runs the step every time");
    assert_eq!(p.read("log"), "users\norders\nusers\norders\norders\n", "the other step still converges");
    // The plan says so too: a step that always runs is a change.
    p.rdeploy(&["plan", "--detailed-exitcode"]).code(7).stdout_has("`always: true`");
}

#[test]
fn up_with_a_reviewed_plan_applies_exactly_what_it_said_would_change() {
    let p = shell_project(
        r#"
name: migrations
steps:
  - name: db
    tool: shell
    sub_changes:
      - { name: m1, run: echo m1 >> applied, check: grep -q m1 applied }
      - { name: m2, run: echo m2 >> applied, check: grep -q m2 applied }
      - { name: m3, run: echo m3 >> applied, check: grep -q m3 applied }
"#,
    );
    p.file("applied", "m1\nm2\n");
    p.rdeploy(&["plan", "-o", "reviewed.plan"]).code(0).stdout_has("db (shell): 1 to run, 2 in place");
    p.rdeploy(&["up", "--plan", "reviewed.plan"]).code(0).stdout_has("db: done (3 declared sub-changes, 2 in place)");
    assert_eq!(p.read("applied"), "m1\nm2\nm3\n", "only m3, which the plan said would run, ran");
    p.rdeploy(&["plan", "--detailed-exitcode"]).code(0);
    p.rdeploy(&["up"]).code(0).stdout_has("db: done (in place, nothing to do)");
    assert_eq!(p.read("applied"), "m1\nm2\nm3\n");
}

/// helm: the same chart content, values and live objects is in place; a chart whose content
/// changed (even where nothing renders differently) is upgraded, once.
#[test]
fn helm_upgrades_only_when_the_chart_values_or_objects_differ() {
    let sim = Kubesim::start("demo");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.copy_fixture("demo/charts", "charts");
    let stack = format!(
        r#"
name: app
steps:
  - name: app
    tool: helm
    release: shop
    chart: charts/webapp
    namespace: shop
    context: demo
    set: {{ image: "nginx:1.27", color: green }}
    binary: {helm}
"#,
        helm = helm_bin(4).display()
    );
    p.stack(&stack);
    p.rdeploy(&["up"]).code(0);
    assert_eq!(revisions(&sim, "shop", "shop"), 1);
    p.rdeploy(&["up"]).code(0).stdout_has("app: done (in place, nothing to do)");
    assert_eq!(revisions(&sim, "shop", "shop"), 1, "same chart, values, objects: no upgrade");

    // Another value: upgraded.
    p.stack(&stack.replace("color: green", "color: blue"));
    p.rdeploy(&["up"]).code(0).stdout_has("app: done (1 release revision)");
    assert_eq!(revisions(&sim, "shop", "shop"), 2);
    p.rdeploy(&["up"]).code(0).stdout_has("app: done (in place, nothing to do)");
    assert_eq!(revisions(&sim, "shop", "shop"), 2);

    // The chart's content changed where no object shows it (its description): the digest does.
    let chart = p.read("charts/webapp/Chart.yaml").replace("Tiny chart", "Tiny chart, edited,");
    p.file("charts/webapp/Chart.yaml", &chart);
    p.rdeploy(&["plan", "--detailed-exitcode"]).code(7).stdout_has("shop chart");
    p.rdeploy(&["up"]).code(0);
    assert_eq!(revisions(&sim, "shop", "shop"), 3, "another chart content is upgraded");
    p.rdeploy(&["up"]).code(0).stdout_has("app: done (in place, nothing to do)");
    assert_eq!(revisions(&sim, "shop", "shop"), 3);

    // A revision rdeploy did not make from this chart (a plain `helm upgrade`) is upgraded once.
    let chart_dir = p.path("charts/webapp");
    sim.helm_ok(
        4,
        &[
            "upgrade",
            "shop",
            chart_dir.to_str().unwrap(),
            "-n",
            "shop",
            "--kube-context",
            "demo",
            "--set",
            "image=nginx:1.27",
            "--set",
            "color=blue",
        ],
    );
    assert_eq!(revisions(&sim, "shop", "shop"), 4);
    p.rdeploy(&["up"]).code(0).stdout_has("app: done (1 release revision)");
    assert_eq!(revisions(&sim, "shop", "shop"), 5);
    p.rdeploy(&["up", "--force-apply"]).code(0);
    assert_eq!(revisions(&sim, "shop", "shop"), 6, "--force-apply upgrades anyway");
}

/// terraform: a plan with no changes is not applied; a changed output is.
#[test]
fn terraform_applies_only_a_plan_with_changes() {
    require_tool("terraform", "https://developer.hashicorp.com/terraform/install");
    let p = Project::new();
    p.copy_fixture("demo/infra", "infra");
    std::fs::create_dir_all(p.path("out")).unwrap();
    p.stack("name: net\nsteps:\n  - name: network\n    tool: terraform\n    dir: infra\n    vars: { env: demo }\n");
    p.rdeploy(&["up"]).code(0);
    let serial = tf_serial(&p);
    let log = p.read("out/terraform.log");
    p.rdeploy(&["up"])
        .code(0)
        .stdout_has("network: done (in place, nothing to do)")
        .stdout_has("outputs: lb_address=lb-demo.shop.internal");
    assert_eq!(tf_serial(&p), serial, "no apply");
    assert_eq!(p.read("out/terraform.log"), log);
    // Only an output changes: terraform must apply to record it.
    let main = p.read("infra/main.tf").replace("lb-${var.env}.shop.internal", "lb-${var.env}.shop.example");
    p.file("infra/main.tf", &main);
    p.rdeploy(&["up"]).code(0).stdout_has("outputs: lb_address=lb-demo.shop.example");
    assert!(tf_serial(&p) > serial, "the output change was applied");
    assert_eq!(p.read("out/terraform.log"), log, "no resource was replaced");
}

/// A fleet rollout run again over 40 clusters of which 4 are on an older version upgrades
/// exactly those 4; the other 36 are done in place, without a helm upgrade.
#[test]
fn a_fleet_rollout_run_again_upgrades_only_the_clusters_on_an_older_version() {
    let rel = "agent-converge";
    let names: Vec<String> = (1..=40).map(|i| format!("edge-{i}")).collect();
    let sim = Kubesim::start(&names.join(","));
    let p = fleet_project(&sim);
    p.stack(&format!(
        r#"
name: agents
steps:
  - name: agent
    tool: helm
    release: {rel}
    chart: chart
    namespace: monitoring
    binary: {helm}
    contexts: ["edge-*"]
    timeout: 60s
    rollout: {{ waves: ["100%"], parallel: 8 }}
"#,
        helm = helm_bin(4).display()
    ));
    p.rdeploy(&["up"]).code(0);
    let history = |cluster: &str| {
        let out = sim.helm_ok(4, &["history", rel, "-n", "monitoring", "--kube-context", cluster, "-o", "json"]);
        serde_json::from_str::<Vec<Value>>(&out).unwrap().len()
    };
    // Four clusters go back to an older version, by hand.
    let chart = p.path("chart");
    let older: Vec<String> = (37..=40).map(|i| format!("edge-{i}")).collect();
    for cluster in &older {
        sim.helm_ok(
            4,
            &[
                "upgrade",
                rel,
                chart.to_str().unwrap(),
                "-n",
                "monitoring",
                "--kube-context",
                cluster,
                "--set",
                "image=nginx:1.26",
            ],
        );
        assert_eq!(history(cluster), 2);
    }

    p.rdeploy(&["up"]).code(0);
    let status = p.status();
    let subs = step(&status, "agent")["sub_changes"].as_array().unwrap().clone();
    assert_eq!(subs.len(), 40);
    let mut upgraded = Vec::new();
    for sub in &subs {
        let id = sub["id"].as_str().unwrap().to_string();
        assert_eq!(sub["status"], "done", "{sub}");
        if older.contains(&id) {
            assert_eq!(history(&id), 3, "{id} was upgraded once");
            assert!(sub.get("in_place").is_none(), "{sub}");
            upgraded.push(id);
        } else {
            assert_eq!(history(&id), 1, "{id} was already on the release: no upgrade");
            assert_eq!(sub["in_place"], true, "{sub}");
        }
    }
    assert_eq!(upgraded.len(), 4, "exactly the four older clusters were upgraded");
}

/// `db` writes `port` once; on the next `up` its `create` is in place (its check passes), so the
/// port is the one the last deploy recorded, carried as `create` is found in place. A later
/// sub-change that fails, then succeeds on a retry or under `rdeploy recover`, still hands it to
/// `app`: the carried outputs are in the checkpoint, not only in the first attempt's memory.
const CARRIED: &str = r#"
name: carried
steps:
  - name: db
    tool: shell
    retry: { attempts: 2, delay: 0s, matching: ["flaky"] }
    sub_changes:
      - name: create
        run: echo created >> created && echo "port=5432" >> "$RDEPLOY_OUTPUT"
        check: "[ -e created ]"
      - name: migrate
        run: |
          if [ -e flaky ]; then rm flaky; echo flaky network >&2; exit 1; fi
          if [ -e broken ]; then echo broken schema >&2; exit 1; fi
          echo migrated >> migrations
  - name: app
    tool: shell
    run: echo "${{ steps.db.outputs.port }}" >> got
"#;

#[test]
fn outputs_carried_for_a_sub_change_in_place_survive_a_retry() {
    let p = shell_project(CARRIED);
    p.rdeploy(&["up"]).code(0);
    assert_eq!(p.lines("got"), ["5432"]);

    // `migrate` fails once; the second attempt resumes the step through its recover path.
    p.file("flaky", "");
    p.rdeploy(&["up"]).code(0).stdout_has("db: done (2 declared sub-changes, 1 in place), succeeded on attempt 2 of 2");
    assert!(!p.exists("flaky"), "the first attempt ran `migrate` and failed");
    assert_eq!(p.lines("migrations"), ["migrated", "migrated"]);
    assert_eq!(p.lines("got"), ["5432", "5432"], "the retried step hands on the carried port");
    assert_eq!(step(&p.status(), "db")["outputs"]["port"], "5432");
    assert_eq!(p.lines("created"), ["created"], "`create` ran once, on the first deploy");
}

#[test]
fn outputs_carried_for_a_sub_change_in_place_survive_a_recover() {
    let p = shell_project(CARRIED);
    p.rdeploy(&["up"]).code(0);
    assert_eq!(p.lines("got"), ["5432"]);

    // `migrate` fails for good: the deploy stops, `recover` resumes it.
    p.file("broken", "");
    p.rdeploy(&["up"]).code(1);
    assert_eq!(step(&p.status(), "db")["outputs"]["port"], "5432", "journaled before `migrate` failed");
    p.remove("broken");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.lines("got"), ["5432", "5432"], "the recovered step hands on the carried port");
    assert_eq!(p.lines("migrations"), ["migrated", "migrated"]);
    assert_eq!(p.lines("created"), ["created"], "`create` ran once, on the first deploy");
}

/// A chart that generates a value on every render (`randAlphaNum` in a Secret) can never be in
/// place: `plan` shows a change and says why once, naming the template and the field; `up`
/// upgrades it and the report says the same, once; the value itself is never printed. Its
/// deterministic template (`configmap.yaml`) is not named.
fn a_chart_that_renders_anew_is_upgraded_and_said_never_in_place(major: u32) {
    let sim = Kubesim::start("demo");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.copy_fixture("helm/rerendered", "charts/rerendered");
    p.stack(&format!(
        "name: db\nsteps:\n  - name: creds\n    tool: helm\n    release: creds\n    chart: charts/rerendered\n    namespace: db\n    context: demo\n    binary: {}\n",
        helm_bin(major).display()
    ));
    p.rdeploy(&["up"]).code(0);
    assert_eq!(revisions(&sim, "creds", "db"), 1);
    let said = "never in place: `rerendered/templates/secret.yaml` renders `data.password` differently every time with the same chart and values";

    let plan = p.rdeploy(&["plan", "--detailed-exitcode"]);
    plan.code(7).stdout_has(said);
    assert_eq!(plan.stdout.matches("never in place").count(), 1, "said once: {}", plan.stdout);
    assert!(!plan.stdout.contains("configmap.yaml"), "the deterministic template is not named: {}", plan.stdout);

    let up = p.rdeploy(&["up"]);
    up.code(0).stdout_has(said).stdout_has("creds: done (1 release revision)");
    assert_eq!(up.stdout.matches("never in place").count(), 1, "said once: {}", up.stdout);
    assert_eq!(revisions(&sim, "creds", "db"), 2, "upgraded, as every `up` must");
    let status = p.status();
    let facts = &step(&status, "creds")["facts"];
    assert!(facts["never_in_place"].as_str().unwrap().contains("`data.password`"), "{facts}");

    // The generated password, as it lives in the cluster, was never printed.
    let secret = sim.kubectl_ok(&["--context", "demo", "-n", "db", "get", "secret", "creds-credentials", "-o", "json"]);
    let secret: Value = serde_json::from_str(&secret).unwrap();
    let encoded = secret["data"]["password"].as_str().unwrap().to_string();
    assert_eq!(encoded.len(), 32, "24 random characters, base64: {encoded}");
    for out in [&plan.stdout, &plan.stderr, &up.stdout, &up.stderr] {
        assert!(!out.contains(&encoded), "the password leaked: {out}");
    }
    let report = p.rdeploy(&["status"]);
    report.code(0);
    assert!(!report.stdout.contains(&encoded));

    // And so on every `up`.
    p.rdeploy(&["up"]).code(0).stdout_has(said);
    assert_eq!(revisions(&sim, "creds", "db"), 3);
}

#[test]
fn a_chart_that_renders_anew_is_upgraded_and_said_never_in_place_helm3() {
    a_chart_that_renders_anew_is_upgraded_and_said_never_in_place(3);
}

#[test]
fn a_chart_that_renders_anew_is_upgraded_and_said_never_in_place_helm4() {
    a_chart_that_renders_anew_is_upgraded_and_said_never_in_place(4);
}

/// `later`'s `check` (its early preview) waits until `first` has started running, then finds
/// `marker` in place; `first`, having waited for that check, removes `marker`. The bounded loops
/// only keep a broken build from hanging: each waits on the other side's file.
const STREAMED: &str = r#"
name: streamed
steps:
  - name: first
    tool: shell
    run: |
      touch started
      i=0; while [ ! -f checked ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      rm -f marker; touch first-done
    check: test -f first-done
  - name: later
    tool: shell
    needs: [first]
    run: echo later >> later.log; touch marker
    check: |
      i=0; while [ ! -f started ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      if [ -f started ]; then echo saw-first-run >> checks.log; else echo gave-up >> checks.log; fi
      touch checked
      test -f marker
"#;

/// `up` starts the run while the later steps' previews go on: `later`'s early check sees `first`
/// running. Its verdict (`marker` in place) was read before `first` ended having changed
/// something, so `later` does not take it: it checks again when it starts, finds `marker` gone
/// and runs. Once nothing changes, the early check is the one `later` takes.
#[test]
fn the_run_starts_while_later_previews_go_on_and_a_preview_read_before_an_apply_is_not_taken() {
    let p = shell_project(STREAMED);
    p.file("marker", "");
    p.rdeploy(&["up"]).code(0);
    assert_eq!(
        p.lines("checks.log"),
        ["saw-first-run", "saw-first-run"],
        "the early check ran while `first` ran, and `later` checked again when it started"
    );
    assert_eq!(p.lines("later.log"), ["later"], "`first` removed marker after the early check read it");

    p.rdeploy(&["up"]).code(0).stdout_has("later: done (in place, nothing to do)");
    assert_eq!(p.lines("checks.log").len(), 3, "nothing changed: `later` took its early check");
    assert_eq!(p.lines("later.log"), ["later"]);
}

/// `first` waits until `later`'s early check is under way, then fails (or waits to be
/// interrupted); the check would wait for a file nobody creates.
const STOPPED: &str = r#"
name: stopped
steps:
  - name: first
    tool: shell
    run: |
      i=0; while [ ! -f checking ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      touch first-saw
      if [ -f first-fails ]; then echo 'first: broken' >&2; exit 3; fi
      i=0; while [ ! -f never ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
  - name: later
    tool: shell
    needs: [first]
    run: echo later >> later.log
    check: |
      echo $$ > checking
      i=0; while [ ! -f never ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      touch check-finished
"#;

/// The pid the early check wrote, once it is running.
fn check_pid(p: &Project) -> i32 {
    p.wait_for("first-saw", std::time::Duration::from_secs(120));
    p.read("checking").trim().parse().expect("the check wrote its pid")
}

/// Whether a process is gone (or a zombie nobody waits for), waited for a while.
fn gone(pid: i32) -> bool {
    let start = std::time::Instant::now();
    while rdeploy_adapters::process::process_lives(pid) {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// A step that fails while a later step's early preview is under way ends the deploy at once:
/// the preview (it only reads) is stopped and waited for, and leaves no process behind.
#[test]
fn a_failing_step_stops_the_previews_still_under_way() {
    let p = shell_project(STOPPED);
    p.file("first-fails", "");
    p.rdeploy(&["up"]).code(1).stdout_has("first: broken");
    let pid = p.read("checking").trim().parse::<i32>().expect("the check wrote its pid");
    assert!(!rdeploy_adapters::process::process_lives(pid), "the early check was waited for before rdeploy exited");
    assert!(!p.exists("check-finished"), "the early check was stopped, not waited out");
    assert!(!p.exists("later.log"));
}

/// Ctrl-C while a later step's early preview is under way stops it with the running step; kill
/// -9 leaves no preview running either.
#[test]
fn sigint_or_kill_9_while_previews_are_under_way_leaves_no_tool_running() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    for signal in [Signal::SIGINT, Signal::SIGKILL] {
        let p = shell_project(STOPPED);
        let child = p.spawn(&["up"]);
        let pid = check_pid(&p);
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let output = child.wait_with_output().unwrap();
        if signal == Signal::SIGINT {
            assert_eq!(output.status.code(), Some(130), "stderr: {}", String::from_utf8_lossy(&output.stderr));
            assert!(!rdeploy_adapters::process::process_lives(pid), "the early check was waited for");
        }
        assert!(gone(pid), "{signal}: the early check (pid {pid}) is still running");
        assert!(!p.exists("check-finished"), "{signal}: the early check was stopped, not waited out");
    }
}

/// `migrate` cannot resume and has a `revert`; its `check` (its early preview) says it started
/// (`checking`, its pid), hears the SIGINT that stops it (`stop-asked`) and goes on until the
/// test writes `release`. `WAITING_ALONE`: it is the only step, so it waits for its preview under
/// way; `WAITING_STOPPED`: `first` applies something once the check is under way, so `migrate`
/// cannot take it and waits for it to stop. The bounded loops only keep a broken build from
/// hanging.
const MIGRATE: &str = r#"
  - name: migrate
    tool: shell
    resumable: false
    run: echo migrated >> migrated.log
    revert: touch reverted
    check: |
      trap 'touch stop-asked' INT
      echo $$ > checking.tmp; mv checking.tmp checking
      i=0; while [ ! -f release ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      test -f migrated.log
"#;

fn waiting_alone() -> String {
    format!("name: waiting\nsteps:{MIGRATE}")
}

fn waiting_stopped() -> String {
    let first = r#"
  - name: first
    tool: shell
    run: |
      i=0; while [ ! -f checking ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      echo first >> first.log
"#;
    format!(
        "name: waiting\nsteps:{first}{}",
        MIGRATE.replace("    resumable: false\n", "    needs: [first]\n    resumable: false\n")
    )
}

/// `rdeploy recover` right after a kill -9: retried while the dead run's tool is still exiting
/// (exit 5), as an operator would.
fn recover_after_kill(p: &Project) -> common::Run {
    let start = std::time::Instant::now();
    loop {
        let run = p.rdeploy(&["recover"]);
        if run.status != 5 || start.elapsed() > std::time::Duration::from_secs(60) {
            return run;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A step that was only waiting for its early preview (under way, or being stopped) when the run
/// was stopped has not started: no `StepStarted`, no interrupt, and its `revert` (complete or
/// revert) does not run, for it applied nothing. It stays pending, as a step not reached, and
/// `rdeploy recover` runs it once. Ctrl-C in either wait; kill -9 while its preview is being
/// stopped (before the fix it was journaled started there, and `recover` reverted it first).
#[test]
fn a_step_waiting_for_its_preview_when_the_run_stops_is_not_started_nor_reverted() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let cases = [
        ("alone, sigint", waiting_alone(), "checking", Signal::SIGINT),
        ("stopped, sigint", waiting_stopped(), "stop-asked", Signal::SIGINT),
        ("stopped, kill -9", waiting_stopped(), "stop-asked", Signal::SIGKILL),
    ];
    for (case, stack, waiting, signal) in cases {
        let p = shell_project(&stack);
        // rdeploy's debug line `starting step` (migrate's) is written once the run has taken the
        // step off its list, after its last look at a Ctrl-C before the step reaches its
        // preview: a signal sent once it is there finds the step on its way to its preview (or
        // in it), never before (where it would just not be taken off, fixed or not).
        let mut up = p.command(&["up"]);
        up.env("RDEPLOY_LOG", "warn,rdeploy::engine::run=debug")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(p.path("up.stderr")).unwrap());
        let child = up.spawn().expect("spawn rdeploy");
        p.wait_for(waiting, std::time::Duration::from_secs(120));
        let start = std::time::Instant::now();
        while !p.read("up.stderr").lines().any(|l| l.contains("starting step") && l.contains("migrate")) {
            assert!(start.elapsed() < std::time::Duration::from_secs(120), "{case}: `migrate` was never taken");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let check: i32 = p.read("checking").trim().parse().expect("the check wrote its pid");
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        // The check stopped (or rdeploy died) and ends once released.
        p.file("release", "");
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = p.read("up.stderr");
        assert!(gone(check), "{case}: the early check (pid {check}) is still running");
        assert!(!stderr.contains("migrate: shell apply"), "{case}: shown started: {stderr}");
        if signal == Signal::SIGINT {
            assert_eq!(output.status.code(), Some(130), "{case}: stdout: {stdout}\nstderr: {stderr}");
            assert!(stdout.contains("migrate (shell): not run yet"), "{case}: {stdout}");
            let status = p.status();
            assert_eq!(status["interrupted"], "SIGINT", "{case}: {status:#}");
            let migrate = step(&status, "migrate");
            assert_eq!(migrate["status"], "pending", "{case}: {status:#}");
            assert!(migrate.get("interrupted").is_none() && migrate.get("error").is_none(), "{case}: {migrate:#}");
        }
        assert!(!p.exists("reverted"), "{case}: `migrate` applied nothing, yet its revert ran");
        let recovered = recover_after_kill(&p);
        recovered.code(0);
        assert!(!recovered.stderr.contains("migrate: revert"), "{case}: {}", recovered.stderr);
        assert!(!p.exists("reverted"), "{case}: `recover` reverted a step that never started");
        assert_eq!(p.lines("migrated.log"), ["migrated"], "{case}: `recover` ran it once");
        assert_eq!(p.status()["state"], "complete", "{case}");
        if case.starts_with("stopped") {
            assert_eq!(p.lines("first.log"), ["first"], "{case}: `first` was done: not run again");
        }
    }
}

/// `broken` fails once `later`'s early check is under way; `later` needs it, so it will never
/// run. Each revert says whether the check had been told to stop (`stop-asked`) when it ran:
/// `broken`'s (complete or revert) waits for that a while, `base`'s (`on_failure: revert`, after
/// it) only looks.
const REVERTED_UNDER_A_PREVIEW: &str = r#"
name: reverting
on_failure: revert
steps:
  - name: base
    tool: shell
    run: echo base >> base.log
    revert: if [ -f stop-asked ]; then echo base-after-stop >> reverts.log; else echo base-beside-preview >> reverts.log; fi
  - name: broken
    tool: shell
    needs: [base]
    run: |
      i=0; while [ ! -f checking ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      echo 'broken: failed' >&2; exit 3
    revert: |
      i=0; while [ ! -f stop-asked ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      if [ -f stop-asked ]; then echo broken-after-stop >> reverts.log; else echo broken-beside-preview >> reverts.log; fi
  - name: later
    tool: shell
    needs: [broken]
    run: echo later >> later.log
    check: |
      trap 'touch stop-asked; exit 1' INT
      touch checking
      i=0; while [ ! -f never ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      touch check-finished
"#;

/// A failure after which a step will never run stops that step's early preview before any revert
/// runs (the revert changes the live state it reads): the run's end without `--keep-going`, and
/// with it the failed step's dependents.
#[test]
fn the_previews_of_steps_that_will_never_run_are_stopped_before_the_reverts() {
    for args in [&["up"][..], &["up", "--keep-going"][..]] {
        let p = shell_project(REVERTED_UNDER_A_PREVIEW);
        let up = p.rdeploy(args);
        up.code(3).stderr_has("broken: failed");
        assert_eq!(
            p.lines("reverts.log"),
            ["broken-after-stop", "base-after-stop"],
            "{args:?}: the preview of `later` was stopped before each revert ran"
        );
        assert!(!p.exists("check-finished"), "{args:?}: the early check was stopped, not waited out");
        assert!(!p.exists("later.log"), "{args:?}");
    }
}

/// With `--keep-going`, `b` fails on its inputs (`a` has no output `missing`), having run
/// nothing; `c` needs it, so `c`'s early check (under way since before `a` ended) is of no use.
/// `d`, beside them, says whether the check had been told to stop (`stop-asked`) when it ended:
/// it waits for that a while.
const FAILED_ON_ITS_INPUTS: &str = r#"
name: inputs
steps:
  - name: a
    tool: shell
    run: |
      i=0; while [ ! -f checking ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      echo a >> a.log
  - name: b
    tool: shell
    needs: [a]
    run: echo "${{ steps.a.outputs.missing }}" >> b.log
  - name: c
    tool: shell
    needs: [b]
    run: echo c >> c.log
    check: |
      trap 'touch stop-asked; exit 1' INT
      touch checking
      i=0; while [ ! -f never ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      touch check-finished
  - name: d
    tool: shell
    run: |
      i=0; while [ ! -f stop-asked ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
      if [ -f stop-asked ]; then echo d-after-stop >> d.log; else echo d-beside-preview >> d.log; fi
"#;

/// With `--keep-going`, a step that fails on its inputs stops the early previews of the steps
/// that need it at once, not when the run ends.
#[test]
fn keep_going_stops_the_previews_of_the_dependents_of_a_step_failed_on_its_inputs() {
    let p = shell_project(FAILED_ON_ITS_INPUTS);
    let up = p.rdeploy(&["up", "--keep-going", "--parallel", "2"]);
    up.code(1).stderr_has("has no output `missing`");
    assert_eq!(p.lines("d.log"), ["d-after-stop"], "`c`'s early check was stopped while `d` ran");
    assert!(!p.exists("check-finished"), "the early check was stopped, not waited out");
    assert!(!p.exists("b.log") && !p.exists("c.log"));
    assert_eq!(p.lines("a.log"), ["a"]);
}

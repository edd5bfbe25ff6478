//! Step outputs (`${{ steps.NAME.outputs.KEY }}`) end to end with the real binary: references
//! checked at validate, values flowing through the checkpoint, recover using the journaled
//! values, sensitive outputs never written down.

mod common;

use std::time::Duration;

use common::{step, Project};
use kubesim::testing::{helm_bin, kubectl_bin, testdata, Kubesim};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn validate_fails(yaml: &str) -> String {
    let p = Project::new();
    p.stack(yaml);
    let run = p.rdeploy(&["validate"]);
    run.code(2);
    run.stderr.clone()
}

#[test]
fn every_bad_reference_is_exit_2_at_validate_with_its_place() {
    let head = "name: s\nsteps:\n  - name: network\n    tool: shell\n    run: echo ok\n";
    let err = validate_fails(&format!(
        "{head}  - name: app\n    tool: shell\n    run: echo ${{{{ steps.netwrok.outputs.url }}}}\n"
    ));
    assert!(err.contains("stack.yaml:8:10: step `app` refers to `${{ steps.netwrok.outputs.url }}`, but `netwrok` is not a step of this stack"), "{err}");
    assert!(err.contains("hint: did you mean `network`?"), "{err}");

    let err = validate_fails(&format!(
        "{head}  - name: app\n    tool: shell\n    env:\n      URL: \"${{{{ steps.network.output.url }}}}\"\n    run: echo\n"
    ));
    assert!(err.contains("stack.yaml:9:12: `${{ steps.network.output.url }}` is not a reference"), "{err}");

    let err = validate_fails(&format!(
        "{head}  - name: app\n    tool: shell\n    run: echo ${{{{ steps.network.outputs.url\n"
    ));
    assert!(err.contains("stack.yaml:8:10:") && err.contains("never closed"), "{err}");

    let err = validate_fails(&format!(
        "{head}  - name: app\n    tool: shell\n    run: echo ${{{{ steps.app.outputs.url }}}}\n"
    ));
    assert!(err.contains("stack.yaml:8:10: step `app` refers to its own output `url`"), "{err}");

    // `network` needs `app`, and `app` uses an output of `network`: a cycle through the reference.
    let err = validate_fails(
        "name: s\nsteps:\n  - name: network\n    tool: shell\n    needs: [app]\n    run: echo ok\n  - name: app\n    tool: shell\n    revert: echo ${{ steps.network.outputs.url }}\n    run: echo\n",
    );
    assert!(
        err.contains("stack.yaml:9:13: this output reference makes a cycle between steps: network -> app -> network")
            || err
                .contains("stack.yaml:9:13: this output reference makes a cycle between steps: app -> network -> app"),
        "{err}"
    );
}

const PIPELINE: &str = r#"name: s
steps:
  - name: db
    tool: shell
    sub_changes:
      - name: create
        run: |
          echo created >> db-side-effects
          echo "url=postgres://db:5432/shop" >> "$RDEPLOY_OUTPUT"
          printf 'motd<<EOF\nline one\nline two\nEOF\n' >> "$RDEPLOY_OUTPUT"
  - name: app
    tool: shell
    env:
      DB_URL: ${{ steps.db.outputs.url }}
    sub_changes:
      - name: wait
        run: touch app-started; while [ ! -e go ]; do sleep 0.05; done
      - name: use
        run: |
          echo "$DB_URL" > app-got
          printf '%s\n' "${{ steps.db.outputs.motd }}" > app-motd
"#;

#[test]
fn a_shell_output_reaches_a_later_step_and_recover_uses_the_journaled_value() {
    let p = Project::new();
    p.stack(PIPELINE);
    // `app` waits for `go`: kill -9 rdeploy once `db` is done and `app` started.
    let mut child = p.spawn(&["up"]);
    p.wait_for("app-started", Duration::from_secs(60));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    let _ = child.wait();
    assert_eq!(p.lines("db-side-effects"), ["created"]);
    let journal = p.read(&p.state("journal.jsonl"));
    assert!(journal.contains(r#""type":"outputs","step":"db""#), "outputs are journaled: {journal}");
    // The runbook's live part shows the commands with the recorded values.
    let runbook = p.rdeploy(&["runbook"]);
    assert!(runbook.code(0).stdout.contains("printf '%s\\n' \"line one\nline two\" > app-motd"), "{}", runbook.stdout);
    // The unfinished deploy's outputs, for scripts.
    assert_eq!(p.rdeploy(&["output", "db", "url"]).stdout, "postgres://db:5432/shop\n");

    p.file("go", "");
    p.rdeploy(&["recover"]).code(0);
    // The producer was not run again: its side effect happened once.
    assert_eq!(p.lines("db-side-effects"), ["created"]);
    assert_eq!(p.read("app-got"), "postgres://db:5432/shop\n");
    assert_eq!(p.read("app-motd"), "line one\nline two\n");
    let status = p.status();
    assert_eq!(step(&status, "app")["status"], "done");
}

#[test]
fn a_missing_output_fails_the_consumer_before_its_tool_starts() {
    let p = Project::new();
    p.stack(
        "name: s\nsteps:\n  - name: db\n    tool: shell\n    sub_changes:\n      - name: a\n        run: echo host=h >> \"$RDEPLOY_OUTPUT\"\n  - name: app\n    tool: shell\n    sub_changes:\n      - name: b\n        run: touch app-ran; echo ${{ steps.db.outputs.url }}\n",
    );
    let run = p.rdeploy(&["up"]);
    run.code(1);
    assert!(
        run.stdout.contains("step `db` has no output `url` (its outputs are `host`)"),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(!p.exists("app-ran"), "the consumer's tool never started");
}

#[test]
fn a_sensitive_shell_output_reaches_its_consumer_is_never_written_and_recover_names_the_producer() {
    let p = Project::new();
    p.stack(
        r#"name: s
steps:
  - name: secret
    tool: shell
    sensitive_outputs: [token]
    sub_changes:
      - name: mint
        run: echo "token=tok-9f8e7d6c5b" >> "$RDEPLOY_OUTPUT"
  - name: use
    tool: shell
    sub_changes:
      - name: login
        run: |
          echo "${{ steps.secret.outputs.token }}" > got-token
          echo "logging in with ${{ steps.secret.outputs.token }}"
          [ ! -e fail-use ] || { echo "login failed with ${{ steps.secret.outputs.token }}" >&2; exit 1; }
"#,
    )
    .file("fail-use", "");
    let run = p.rdeploy(&["up"]);
    run.code(1);
    assert_eq!(p.read("got-token"), "tok-9f8e7d6c5b\n", "the consumer got the value");
    assert!(!run.stdout.contains("tok-9f8e7d6c5b") && !run.stderr.contains("tok-9f8e7d6c5b"));
    assert_no_file_holds(&p.path(&p.state("")), "tok-9f8e7d6c5b");
    let status = p.rdeploy(&["status", "--json"]);
    assert!(!status.stdout.contains("tok-9f8e7d6c5b"));

    // A new process never had the value, and a shell keeps no state to read it from.
    p.remove("fail-use");
    p.remove("got-token");
    let run = p.rdeploy(&["recover"]);
    run.code(1);
    assert!(
        run.stdout.contains("is a sensitive output") && run.stdout.contains("run step `secret` again"),
        "{}",
        run.stdout
    );
    assert!(!p.exists("got-token"));
}

/// A sensitive output is one of the run's secrets from the moment it is read: a step that never
/// referenced it (here it finds the value in a file the producer left) is redacted of it too, in
/// its output lines, its failure and the plain outputs it records.
#[test]
fn a_sensitive_output_is_redacted_from_every_later_step_not_only_its_consumers() {
    let p = Project::new();
    p.stack(
        r#"name: s
steps:
  - name: secret
    tool: shell
    sensitive_outputs: [token]
    sub_changes:
      - name: mint
        run: |
          echo "tok-5e4d3c2b1a" > minted
          echo "token=$(cat minted)" >> "$RDEPLOY_OUTPUT"
  - name: bystander
    tool: shell
    needs: [secret]
    sub_changes:
      - name: note
        run: |
          echo "found $(cat minted)"
          echo "url=https://svc/?t=$(cat minted)" >> "$RDEPLOY_OUTPUT"
      - name: fail
        run: |
          echo "gave up on $(cat minted)" >&2
          exit 1
"#,
    );
    let run = p.rdeploy(&["up"]);
    run.code(1);
    assert!(run.stdout.contains("gave up on ***") || run.stderr.contains("gave up on ***"), "{}", run.stdout);
    assert!(!run.stdout.contains("tok-5e4d3c2b1a") && !run.stderr.contains("tok-5e4d3c2b1a"), "{}", run.stdout);
    p.remove("minted");
    assert_no_file_holds(&p.path(&p.state("")), "tok-5e4d3c2b1a");
    // Its value holds the token: a sensitive output itself, never printed as `***` as if real.
    let out = p.rdeploy(&["output", "bystander", "url"]);
    out.code(2).stderr_has("output `url` of step `bystander` is sensitive: it is never recorded");
    assert!(!out.stdout.contains("***"), "{}", out.stdout);
}

/// A plain shell output whose value holds a stack secret (`url=postgres://app:$DB_PASSWORD@...`)
/// is a sensitive output: never recorded (not even redacted, which `recover` would hand on as
/// the value), its consumer in the same run gets the real value, and a later `recover` fails the
/// consumer as for any sensitive output a shell cannot read again, instead of giving it `***`.
#[test]
fn a_plain_output_holding_a_secret_is_sensitive_and_never_handed_on_redacted() {
    const DB_PASSWORD: &str = "db-pw-5f0c2e8a71";
    let mut p = Project::new();
    p.env("CI_DB_PASSWORD", DB_PASSWORD);
    p.stack(
        r#"name: s
steps:
  - name: db
    tool: shell
    env:
      DB_PASSWORD: { from_env: CI_DB_PASSWORD }
    sub_changes:
      - name: create
        run: echo "url=postgres://app:${DB_PASSWORD}@db/app" >> "$RDEPLOY_OUTPUT"
  - name: app
    tool: shell
    sub_changes:
      - name: connect
        run: |
          echo "${{ steps.db.outputs.url }}" > app-got
          [ ! -e fail-app ] || exit 1
"#,
    )
    .file("fail-app", "");
    let run = p.rdeploy(&["up"]);
    run.code(1);
    assert_eq!(
        p.read("app-got"),
        format!("postgres://app:{DB_PASSWORD}@db/app\n"),
        "the consumer in the producing run gets the real value"
    );
    assert_no_file_holds(&p.path(&p.state("")), DB_PASSWORD);
    let status = p.status();
    assert_eq!(step(&status, "db")["sensitive_outputs"], serde_json::json!(["url"]), "{status}");
    assert!(step(&status, "db")["outputs"].get("url").is_none(), "{status}");
    let shown = p.rdeploy(&["output", "db", "url"]);
    shown.code(2).stderr_has("output `url` of step `db` is sensitive: it is never recorded");
    assert!(!shown.stdout.contains("***"), "{}", shown.stdout);

    // A new process never had the value, and a shell keeps no state to read it from.
    p.remove("fail-app");
    p.remove("app-got");
    let run = p.rdeploy(&["recover"]);
    run.code(1);
    assert!(
        run.stdout.contains("`${{ steps.db.outputs.url }}` is a sensitive output")
            && run.stdout.contains("run step `db` again"),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(!p.exists("app-got"), "the consumer never ran with `***` in place of the value");
}

/// The same with terraform, which keeps state: its plain output built from a variable the stack
/// marks secret is sensitive to rdeploy, and a later `recover` reads it again from terraform's
/// state for the consumer; `rdeploy output --show-sensitive` prints it whole, not redacted.
#[test]
fn a_plain_terraform_output_holding_a_secret_is_read_again_from_the_state() {
    common::require_tool("terraform", "install terraform");
    const DB_PASSWORD: &str = "tf-pw-8d2b6e4a90";
    let url = format!("postgres://app:{DB_PASSWORD}@db/app");
    let mut p = Project::new();
    p.env("CI_DB_PASSWORD", DB_PASSWORD);
    p.file(
        "infra/main.tf",
        r#"variable "db_password" {
  type = string
}

output "url" {
  value = "postgres://app:${var.db_password}@db/app"
}
"#,
    )
    .stack(
        r#"name: s
steps:
  - name: infra
    tool: terraform
    dir: infra
    vars:
      db_password: { from_env: CI_DB_PASSWORD }
  - name: app
    tool: shell
    sub_changes:
      - name: connect
        run: |
          echo "${{ steps.infra.outputs.url }}" > app-got
          [ ! -e fail-app ] || exit 1
"#,
    )
    .file("fail-app", "");
    p.rdeploy(&["up"]).code(1);
    assert_eq!(p.read("app-got"), format!("{url}\n"), "the consumer in the producing run gets the real value");
    assert_eq!(step(&p.status(), "infra")["sensitive_outputs"], serde_json::json!(["url"]));
    assert_no_file_holds(&p.path(&p.state("")), DB_PASSWORD);

    p.remove("fail-app");
    p.remove("app-got");
    let run = p.rdeploy(&["recover"]);
    run.code(0);
    assert_eq!(p.read("app-got"), format!("{url}\n"), "read again from terraform's state: {}", run.stdout);
    let shown = p.rdeploy(&["output", "infra", "url", "--show-sensitive"]);
    assert_eq!(shown.code(0).stdout, format!("{url}\n"));
}

/// Panics if any file under `dir` holds `needle`.
pub fn assert_no_file_holds(dir: &std::path::Path, needle: &str) {
    for entry in walk(dir) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(needle), "{} holds the sensitive value", entry.display());
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// `.venv/bin/ansible-playbook`; a missing ansible fails loudly, never skips.
fn ansible_playbook() -> String {
    let bin = common::repo_root().join(".venv/bin/ansible-playbook");
    assert!(bin.is_file(), "{} is missing: run scripts/setup-ansible.sh", bin.display());
    bin.to_string_lossy().into_owned()
}

const PASSWORD: &str = "pw-7c1e9a42f0d3";

/// terraform -> ansible -> helm, wired with outputs, and a shell step reading the helm release's
/// and ansible's outputs; `use-password` consumes the sensitive terraform output.
fn pipeline(sim: &Kubesim) -> Project {
    common::require_tool("terraform", "install terraform");
    let mut p = Project::new();
    p.copy_fixture("outputs/infra", "infra").copy_fixture("outputs/ansible", "ansible");
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.stack(&format!(
        r#"name: shop
steps:
  - name: infra
    tool: terraform
    dir: infra
  - name: config
    tool: ansible
    playbook: ansible/site.yml
    inventory: ansible/inventory.ini
    binary: {ansible}
    env: {{ ANSIBLE_NOCOLOR: "1" }}
    extra_vars:
      db_host: "${{{{ steps.infra.outputs.db_host }}}}"
  - name: app
    tool: helm
    release: web
    chart: {chart}
    namespace: shop
    context: c1
    binary: {helm}
    set:
      color: "${{{{ steps.infra.outputs.db_host }}}}"
      replicas: ${{{{ steps.infra.outputs.replicas }}}}
  - name: report
    tool: shell
    run: echo "${{{{ steps.app.outputs.revision }}}} ${{{{ steps.app.outputs.chart_version }}}} ${{{{ steps.app.outputs.namespace }}}} ${{{{ steps.config.outputs.configured }}}}" > report.txt
  - name: use-password
    tool: shell
    needs: [report]
    sub_changes:
      - name: login
        run: |
          [ ! -e fail-login ] || {{ echo "login refused" >&2; exit 1; }}
          printf '%s\n' "${{{{ steps.infra.outputs.db_password }}}}" > got-password
          echo "password is ${{{{ steps.infra.outputs.db_password }}}}"
"#,
        ansible = ansible_playbook(),
        chart = testdata("webapp").display(),
        helm = helm_bin(3).display(),
    ));
    p
}

fn assert_never_written(p: &Project, runs: &[&common::Run]) {
    assert_no_file_holds(&p.path(&p.state("")), PASSWORD);
    for run in runs {
        assert!(!run.stdout.contains(PASSWORD) && !run.stderr.contains(PASSWORD), "{}\n{}", run.stdout, run.stderr);
    }
    let status = p.rdeploy(&["status", "--json"]);
    assert!(!status.stdout.contains(PASSWORD));
}

#[test]
fn terraform_outputs_reach_ansible_and_helm_and_a_sensitive_one_reaches_its_consumer_on_up_and_recover() {
    let sim = Kubesim::start("c1");
    let p = pipeline(&sim);
    p.file("fail-login", "");

    let up = p.rdeploy(&["up"]);
    up.code(1);
    // The extra var and the helm values come from terraform's outputs.
    assert_eq!(p.read("ansible/out-app1"), "db.internal\n");
    assert_eq!(p.read("ansible/out-app2"), "db.internal\n");
    let values = sim.helm_ok(3, &["get", "values", "web", "-n", "shop", "-o", "json", "--kube-context", "c1"]);
    let values: serde_json::Value = serde_json::from_str(&values).unwrap();
    assert_eq!(values, serde_json::json!({ "color": "db.internal", "replicas": 2 }), "the number stays a number");
    // The helm release's and ansible's `set_stats` outputs reach a later step.
    assert_eq!(p.read("report.txt"), "1 0.1.0 shop db.internal\n");

    let status = p.status();
    assert_eq!(step(&status, "infra")["outputs"]["db_host"], "db.internal");
    assert_eq!(step(&status, "infra")["outputs"]["replicas"], 2);
    assert_eq!(step(&status, "infra")["sensitive_outputs"], serde_json::json!(["db_password"]));
    assert!(step(&status, "infra")["outputs"].get("db_password").is_none());
    assert_eq!(step(&status, "config")["outputs"]["configured"], "db.internal");
    assert_eq!(step(&status, "app")["outputs"]["status"], "deployed");
    assert_eq!(step(&status, "use-password")["status"], "failed");
    assert!(!p.exists("got-password"));
    // The runbook names the sensitive value as a variable to fill in, never its value.
    let runbook = p.rdeploy(&["runbook"]);
    runbook.code(0).stdout_has("export RDEPLOY_INFRA_DB_PASSWORD=    # ${{ steps.infra.outputs.db_password }}");
    runbook.stdout_has(r#"printf '%s\n' "$RDEPLOY_INFRA_DB_PASSWORD" > got-password"#);

    // Recover: the producer is not applied again, the sensitive value is read again from
    // terraform's state and reaches the consumer, and nothing holds it.
    p.remove("fail-login");
    let recover = p.rdeploy(&["recover"]);
    recover.code(0);
    assert_eq!(p.lines("infra/runs/db.log"), ["db"], "terraform's resource was created once");
    assert_eq!(p.read("got-password"), format!("{PASSWORD}\n"));
    assert_never_written(&p, &[&up, &recover, &runbook]);
    // What the consumer printed is in its log, redacted.
    assert!(
        p.read(&p.state("logs/use-password.log")).contains("password is ***"),
        "{}",
        p.read(&p.state("logs/use-password.log"))
    );
}

#[test]
fn a_sensitive_terraform_output_reaches_its_consumer_on_up_and_is_never_written() {
    let sim = Kubesim::start("c1");
    let p = pipeline(&sim);
    let up = p.rdeploy(&["up"]);
    up.code(0);
    assert_eq!(p.read("got-password"), format!("{PASSWORD}\n"));
    assert_never_written(&p, &[&up]);

    // The finished deploy is history; `rdeploy output` reads it.
    p.rdeploy(&["output", "infra", "db_host"]).code(0).stdout_has("db.internal");
    assert_eq!(p.rdeploy(&["output", "stack.yaml", "infra", "replicas"]).stdout, "2\n");
    assert_eq!(p.rdeploy(&["output", "app", "revision", "--json"]).stdout, "1\n");
    let hidden = p.rdeploy(&["output", "infra", "db_password"]);
    hidden.code(2).stderr_has("is sensitive: it is never recorded").stderr_has("--show-sensitive");
    assert!(!hidden.stdout.contains(PASSWORD));
    let shown = p.rdeploy(&["output", "infra", "db_password", "--show-sensitive"]);
    assert_eq!(shown.code(0).stdout, format!("{PASSWORD}\n"), "read again from terraform's state");
    p.rdeploy(&["output", "infra", "db_hots"]).code(2).stderr_has("did you mean `db_host`?");
    p.rdeploy(&["output", "infar"]).code(2).stderr_has("did you mean `infra`?");
    let all = p.rdeploy(&["output", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&all.code(0).stdout).unwrap();
    assert_eq!(doc["steps"]["infra"]["outputs"]["db_host"], "db.internal");
    assert_eq!(doc["steps"]["infra"]["sensitive_outputs"], serde_json::json!(["db_password"]));
    assert_eq!(doc["steps"]["config"]["outputs"]["configured"], "db.internal");
    assert!(!all.stdout.contains(PASSWORD));
    let text = p.rdeploy(&["output"]);
    text.code(0).stdout_has("infra:\n  db_host=db.internal\n  replicas=2\n  db_password=*** (sensitive");
}

#[test]
fn a_shell_output_names_a_kubectl_manifest_and_kubectl_outputs_reach_a_later_run() {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    p.copy_fixture("kubectl/app", "k8s");
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    // Only the objects of namespace `shop` (the fixture's last one needs a namespace it lacks).
    let app = p.read("k8s/app.yaml");
    let docs: Vec<&str> = app.split("\n---").filter(|d| !d.contains("name: extra")).collect();
    p.file("k8s/generated.yaml", &docs.join("\n---"));
    p.stack(&format!(
        r#"name: k8s
steps:
  - name: render
    tool: shell
    sub_changes:
      - name: pick
        run: echo "manifest=k8s/generated.yaml" >> "$RDEPLOY_OUTPUT"
  - name: objects
    tool: kubectl
    manifests: ["${{{{ steps.render.outputs.manifest }}}}"]
    context: c1
    binary: {kubectl}
    outputs:
      color: {{ object: configmap/shop/settings, jsonpath: .data.color }}
      port: {{ object: service/shop/web, jsonpath: "{{.spec.ports[0].port}}" }}
  - name: after
    tool: shell
    run: echo "${{{{ steps.objects.outputs.color }}}}:${{{{ steps.objects.outputs.port }}}}" > after.txt
"#,
        kubectl = kubectl_bin().display()
    ));
    p.rdeploy(&["validate"]).code(0);
    p.rdeploy(&["up"]).code(0);
    let port = sim.kubectl_ok(&[
        "--context",
        "c1",
        "get",
        "service",
        "web",
        "-n",
        "shop",
        "-o",
        "jsonpath={.spec.ports[0].port}",
    ]);
    assert_eq!(p.read("after.txt"), format!("blue:{}\n", port.trim()));
}

#[test]
fn a_changed_output_makes_its_done_consumer_run_again_and_the_report_names_it() {
    let p = Project::new();
    // `on_failure: revert` reverts `version` (it declares `revert`) but not `use` (it declares
    // none), and `tail` is left half-done: the checkpoint is kept with `use` done on the value of
    // a reverted producer. Recover applies `version` again, which now produces another value.
    p.stack(
        r#"name: s
on_failure: revert
steps:
  - name: version
    tool: shell
    run: |
      n=$(($(cat counter 2>/dev/null || echo 0) + 1)); echo $n > counter
      echo "v=$n" >> "$RDEPLOY_OUTPUT"
    revert: echo reverted >> reverts
  - name: use
    tool: shell
    sub_changes:
      - name: apply
        run: echo "${{ steps.version.outputs.v }}" >> used
  - name: tail
    tool: shell
    needs: [use]
    sub_changes:
      - name: x
        run: "true"
      - name: y
        run: "[ ! -e fail-tail ]"
"#,
    )
    .file("fail-tail", "");
    p.rdeploy(&["up"]).code(6);
    assert_eq!(p.lines("used"), ["1"]);
    assert_eq!(p.lines("reverts"), ["reverted"]);
    assert_eq!(step(&p.status(), "use")["status"], "done");

    p.remove("fail-tail");
    let run = p.rdeploy(&["recover"]);
    run.code(0);
    assert_eq!(p.lines("used"), ["1", "2"], "the consumer was applied again with the new value");
    assert!(
        run.stderr.contains("step `use` used an old value: output `v` of step `version` changed"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.contains("applied again: output `v` of step `version` changed"), "{}", run.stdout);
}

#[test]
fn a_revert_gets_the_recorded_output_values_too() {
    let p = Project::new();
    p.stack(
        r#"name: s
steps:
  - name: p
    tool: shell
    sub_changes:
      - name: a
        run: echo "v=green" >> "$RDEPLOY_OUTPUT"
  - name: c
    tool: shell
    run: echo "${{ steps.p.outputs.v }}" > applied-with; exit 1
    revert: echo "${{ steps.p.outputs.v }}" > reverted-with
"#,
    );
    p.rdeploy(&["up"]).code(3);
    assert_eq!(p.read("applied-with"), "green\n");
    assert_eq!(p.read("reverted-with"), "green\n");
}

/// A recorded output edited as a hostile hand (or a corrupted store) would; the snapshot, a
/// cache, goes too, so the journal is all there is to read.
fn edit_recorded_port(p: &Project, to: &str) {
    let journal = p.read(&p.state("journal.jsonl"));
    let edited = journal.replace(r#""port":"7""#, &format!(r#""port":{}"#, serde_json::json!(to)));
    assert_ne!(edited, journal, "the output is journaled");
    std::fs::write(p.path(&p.state("journal.jsonl")), edited).unwrap();
    p.remove(&p.state("snapshot.json"));
}

const HOSTILE: &str = r#"7$(touch PWNED)`touch PWNED2`; touch PWNED3 '"x"#;

fn assert_not_pwned(p: &Project) {
    for pwned in ["PWNED", "PWNED2", "PWNED3"] {
        assert!(!p.exists(pwned), "the recorded output ran as code: {pwned}");
    }
}

/// The checkpoint is data, never code: a recorded output edited to `7$(touch PWNED)` reaches
/// the consumer's `run` (unquoted, in double quotes, in single quotes) as the text it is, and
/// nothing runs it.
#[test]
fn a_recorded_output_reaches_shell_lines_as_data_never_as_code() {
    let p = Project::new();
    p.stack(
        r#"name: s
steps:
  - name: db
    tool: shell
    sub_changes:
      - name: create
        run: echo "port=7" >> "$RDEPLOY_OUTPUT"
  - name: app
    tool: shell
    sub_changes:
      - name: use
        run: printf '%s\n' ${{ steps.db.outputs.port }} "n=${{ steps.db.outputs.port }}" 'q=${{ steps.db.outputs.port }}' >> got; [ ! -e stop ]
        check: "[ '${{ steps.db.outputs.port }}' = ok ]"
"#,
    )
    .file("stop", "");
    p.rdeploy(&["up"]).code(1);
    assert_eq!(p.lines("got"), ["7", "n=7", "q=7"]);
    edit_recorded_port(&p, HOSTILE);
    p.remove("stop");

    p.rdeploy(&["recover"]).code(0);
    let hostile = HOSTILE.to_string();
    assert_eq!(p.lines("got"), ["7", "n=7", "q=7", &hostile, &format!("n={hostile}"), &format!("q={hostile}")]);
    assert_not_pwned(&p);
}

/// The same for the `check` of a bare shell `run` (the step-level check `up` reads to find
/// the step in place): the edited value is compared as text, never run.
#[test]
fn a_recorded_output_reaches_a_bare_runs_check_as_data_never_as_code() {
    let p = Project::new();
    p.stack(
        r#"name: s
steps:
  - name: db
    tool: shell
    sub_changes:
      - name: create
        run: touch created && echo "port=7" >> "$RDEPLOY_OUTPUT"
        check: "[ -e created ]"
  - name: app
    tool: shell
    run: printf '%s\n' "${{ steps.db.outputs.port }}" >> got; [ ! -e stop ]
    check: "[ -e got ] && [ \"$(tail -n 1 got)\" = \"${{ steps.db.outputs.port }}\" ] && [ ! -e stop ]"
"#,
    )
    .file("stop", "");
    p.rdeploy(&["up"]).code(1);
    assert_eq!(p.lines("got"), ["7"]);
    edit_recorded_port(&p, HOSTILE);
    p.remove("stop");

    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.lines("got"), ["7", HOSTILE]);
    assert_not_pwned(&p);
    // A second `up` finds `db` in place (its outputs carried from the recorded deploy, the
    // edited value too) and previews `app`: its check runs with the value as data.
    let up = p.rdeploy(&["up"]);
    assert_not_pwned(&p);
    up.code(0).stdout_has("app: done (in place, nothing to do)");
}

/// The same for a step's `revert`, a shell line of any tool's step.
#[test]
fn a_recorded_output_reaches_a_revert_as_data_never_as_code() {
    let p = Project::new();
    p.stack(
        r#"name: s
steps:
  - name: db
    tool: shell
    sub_changes:
      - name: create
        run: echo "port=7" >> "$RDEPLOY_OUTPUT"
  - name: app
    tool: shell
    revert: echo ${{ steps.db.outputs.port }} > reverted
    sub_changes:
      - name: use
        run: echo ${{ steps.db.outputs.port }} >> got
  - name: gate
    tool: shell
    needs: [app]
    sub_changes:
      - name: wait
        run: "[ ! -e stop ]"
"#,
    )
    .file("stop", "");
    p.rdeploy(&["up"]).code(1);
    assert_eq!(p.lines("got"), ["7"]);
    edit_recorded_port(&p, HOSTILE);
    p.rdeploy(&["revert"]).code(0);
    assert_eq!(p.lines("reverted"), [HOSTILE]);
    assert_not_pwned(&p);
}

/// `rdeploy revert` of a finished deploy: a `revert` line that uses another step's output gets
/// the value the deploy recorded (the revert opens a new journal; the outputs come with it).
#[test]
fn revert_of_a_finished_deploy_resolves_outputs_from_the_recorded_deploy() {
    let p = Project::new();
    p.stack(
        r#"name: s
steps:
  - name: db
    tool: shell
    revert: echo db >> reverted
    sub_changes:
      - name: create
        run: echo "port=7" >> "$RDEPLOY_OUTPUT"
  - name: app
    tool: shell
    revert: echo "app ${{ steps.db.outputs.port }}" >> reverted
    sub_changes:
      - name: use
        run: echo ${{ steps.db.outputs.port }} >> got
"#,
    );
    p.rdeploy(&["up"]).code(0);
    assert_eq!(p.lines("got"), ["7"]);
    p.rdeploy(&["revert"]).code(0);
    assert_eq!(p.lines("reverted"), ["app 7", "db"], "newest first, with the recorded port");
    assert_eq!(p.status()["state"], "reverted");
    // What was undone has no outputs: none is printed as if it were live.
    let out = p.rdeploy(&["output", "db", "port"]);
    out.code(2).stderr_has("step `db` was reverted");
    assert!(!out.stdout.contains('7'), "{}", out.stdout);
}

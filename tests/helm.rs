//! helm steps through the real `rdeploy` binary with the real helm 3 and helm 4 and a kubesim
//! per test: a failed upgrade stops the deploy naming the revision, and recover upgrades again.

mod common;

use common::{helm_group_for, step, sub_statuses, Project};
use kubesim::testing::{helm_bin, testdata, Kubesim};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn stack(major: u32, tier: &str) -> String {
    stack_with(major, tier, "")
}

/// `extra` is more keys for the helm step, each on its own line.
fn stack_with(major: u32, tier: &str, extra: &str) -> String {
    format!(
        r#"
name: app
steps:
  - name: app
    tool: helm
    release: web
    chart: {chart}
    namespace: shop
    context: c1
    set: {{ color: red, tier: "{tier}" }}
    wait: true
    timeout: 60s
    binary: {helm}
{extra}  - name: after
    tool: shell
    needs: [app]
    run: echo after >> after.log
"#,
        chart = testdata("webapp").display(),
        helm = helm_bin(major).display(),
        extra = extra.lines().map(|l| format!("    {l}\n")).collect::<String>(),
    )
}

fn failed_upgrade_then_recover(major: u32) {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.stack(&stack(major, "web"));
    p.rdeploy(&["up"]).code(0);
    p.remove("after.log");

    p.stack(&stack(major, "not valid!"));
    p.rdeploy(&["up"]).code(1).stdout_has("web@2").stdout_has("Invalid value");
    let status = p.status();
    assert_eq!(sub_statuses(&status, "app"), [("web@2".to_string(), "failed".to_string())]);
    assert_eq!(step(&status, "after")["status"], "skipped");
    assert_eq!(sim.helm_statuses(major, "web", "shop"), ["deployed", "failed"]);

    p.stack(&stack(major, "web"));
    p.rdeploy(&["recover", "--dry-run"]).code(0).stdout_has("revision 2 failed: upgrade again");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(sim.helm_statuses(major, "web", "shop"), ["superseded", "failed", "deployed"]);
    assert_eq!(p.read("after.log"), "after\n");
    // The failed revision is superseded by the one recover deployed: the release is in place,
    // and a complete deploy lists no failed sub-change (nor counts one in a CI summary).
    let status = p.status();
    assert_eq!(status["state"], "complete");
    assert_eq!(sub_statuses(&status, "app"), [("web@3".to_string(), "done".to_string())]);
}

#[test]
fn helm3_failed_upgrade_stops_the_deploy_and_recover_upgrades_again() {
    failed_upgrade_then_recover(3);
}

#[test]
fn helm4_failed_upgrade_stops_the_deploy_and_recover_upgrades_again() {
    failed_upgrade_then_recover(4);
}

/// `recover: rollback` puts the release back on its last deployed revision: the step is
/// reverted (exit 3), the step after it does not run on the old version, and once the cause
/// is fixed the next `recover` upgrades.
#[test]
fn helm4_recover_rollback_reverts_the_step_and_the_next_recover_upgrades() {
    let major = 4;
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.stack(&stack_with(major, "web", "recover: rollback"));
    p.rdeploy(&["up"]).code(0);
    p.remove("after.log");

    p.stack(&stack_with(major, "not valid!", "recover: rollback"));
    p.rdeploy(&["up"]).code(1).stdout_has("web@2");
    p.rdeploy(&["recover", "--dry-run"]).code(0).stdout_has("helm rollback web 1");
    // Through the CI wrapper: exit 3, an error annotation, and a JUnit failure (not "skipped").
    let mut ci = p.command(&["ci", "--junit", "junit.xml"]);
    ci.env("GITHUB_ACTIONS", "true").env("GITHUB_STEP_SUMMARY", p.path("summary.md"));
    let ci = common::Run::from(ci.output().unwrap(), &["ci"]);
    ci.code(3)
        .stdout_has("`recover: rollback` rolled it back to web revision 1")
        .stdout_has("::error file=stack.yaml,line=4,title=rdeploy%3A step app (helm) rolled back::");
    let junit = p.read("junit.xml");
    assert!(junit.contains(r#"type="rolled-back""#) && junit.contains(r#"failures="1""#), "{junit}");
    assert!(p.read("summary.md").contains("## app (helm): reverted"), "{}", p.read("summary.md"));
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(step(&status, "app")["status"], "reverted");
    assert_eq!(step(&status, "after")["status"], "skipped");
    assert!(!p.exists("after.log"), "a step that needs a rolled-back step must not run");
    assert_eq!(sim.helm_statuses(major, "web", "shop"), ["superseded", "failed", "deployed"]);

    p.stack(&stack_with(major, "api", "recover: rollback"));
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(sim.helm_statuses(major, "web", "shop"), ["superseded", "failed", "superseded", "deployed"]);
    assert_eq!(p.read("after.log"), "after\n");

    // When the fix is in the stack before recover runs, rolling back first would only cost a
    // second recover: it upgrades to the fix at once.
    p.stack(&stack_with(major, "not valid!", "recover: rollback"));
    p.rdeploy(&["up"]).code(1).stdout_has("web@5");
    p.stack(&stack_with(major, "web", "recover: rollback"));
    p.rdeploy(&["recover", "--dry-run"]).code(0).stdout_has("the stack now asks for other values");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(sim.helm_statuses(major, "web", "shop").last().map(String::as_str), Some("deployed"));
    assert_eq!(sim.helm_statuses(major, "web", "shop").len(), 6, "one upgrade, no rollback");
}

/// `set:` values reach helm with their YAML types (`--set-json 'service.enabled=false'`): a
/// template's `if` sees a false boolean, so the Service is not created, a number is a number,
/// and a quoted `"false"` stays a string.
#[test]
fn helm4_set_values_keep_their_yaml_types() {
    let major = 4;
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file("chart/Chart.yaml", "apiVersion: v2\nname: toggles\nversion: 0.1.0\n");
    p.file("chart/values.yaml", "service:\n  enabled: true\nreplicaCount: 1\nlabel: x\n");
    p.file(
        "chart/templates/configmap.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kinds\ndata:\n  enabled: {{ kindOf .Values.service.enabled | quote }}\n  replicas: {{ kindOf .Values.replicaCount | quote }}\n  label: {{ kindOf .Values.label | quote }}\n  two: {{ eq (int .Values.replicaCount) 2 | quote }}\n  hex: {{ .Values.port | quote }}\n  oct: {{ .Values.mode | quote }}\n",
    );
    p.file(
        "chart/templates/service.yaml",
        "{{ if .Values.service.enabled }}\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n    - port: 80\n{{ end }}\n",
    );
    p.stack(&format!(
        r#"
name: app
steps:
  - name: app
    tool: helm
    release: web
    chart: ./chart
    namespace: shop
    context: c1
    set: {{ service.enabled: false, replicaCount: 2, label: "false", port: 0x1F, mode: 0o17 }}
    binary: {helm}
"#,
        helm = helm_bin(major).display(),
    ));
    p.rdeploy(&["up"]).code(0);
    let get = |field: &str| {
        sim.kubectl_ok(&["get", "cm", "kinds", "-n", "shop", "-o", &format!("jsonpath={{.data.{field}}}")])
    };
    assert_eq!(get("enabled"), "bool");
    assert_ne!(get("replicas"), "string");
    assert_eq!(get("two"), "true");
    assert_eq!(get("label"), "string");
    // YAML 1.2 core integers reach helm as JSON numbers.
    assert_eq!((get("hex"), get("oct")), ("31".to_string(), "15".to_string()));
    let services = sim.kubectl_ok(&["get", "services", "-n", "shop", "-o", "name"]);
    assert!(!services.contains("service/web"), "`service.enabled: false` must not create the Service: {services}");
}

/// Kills rdeploy with SIGKILL while helm is writing `status` (pending-upgrade or
/// pending-install), and helm's whole group with it, as when a CI job's container is killed:
/// helm gets no chance to mark the revision failed (one SIGINT would, see TOOL_FACTS.md), so the
/// release stays pending. The cluster answers slowly meanwhile, so helm is still at work.
fn kill_9_while_helm_writes(sim: &Kubesim, p: &Project, release: &str, status: &str) {
    sim.control("POST", "/_sim/clusters/c1/slow?ms=300");
    let mut child = p.spawn(&["up"]);
    let pending = format!(
        "/clusters/c1/api/v1/namespaces/shop/secrets?labelSelector=name%3D{release}%2Cowner%3Dhelm%2Cstatus%3D{status}"
    );
    let seen = sim.eventually(std::time::Duration::from_secs(60), || {
        sim.control("GET", &pending).contains("sh.helm.release.v1.")
    });
    let group = helm_group_for(release, "upgrade");
    // Stop helm first so that nothing it does after rdeploy's death (the relay's SIGINT) lands.
    if let Some(pgid) = group {
        let _ = kill(Pid::from_raw(-pgid), Signal::SIGSTOP);
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    if let Some(pgid) = group {
        let _ = kill(Pid::from_raw(-pgid), Signal::SIGKILL);
    }
    child.wait().unwrap();
    sim.control("POST", "/_sim/clusters/c1/slow?ms=0");
    assert!(seen, "helm never wrote a {status} revision");
    assert!(group.is_some(), "no helm process for the release was found while it was {status}");
}

/// issue 14: a release this deploy's killed run left pending-upgrade is rolled back to its last
/// deployed revision and upgraded, with no flag: exit 0, the stack's values deployed, and no
/// revision recorded done applied again (helm's history has exactly one rollback and one upgrade).
fn abandoned_pending_upgrade_is_recovered_without_force(major: u32) {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    // A release name of its own: the helm 3 and 4 cases run at once, and a helm naming the
    // release anywhere on this machine counts as alive.
    let release = format!("abandoned-upgrade{major}");
    let stack = |tier: &str| stack(major, tier).replace("release: web", &format!("release: {release}"));
    p.stack(&stack("web"));
    p.rdeploy(&["up"]).code(0);
    p.remove("after.log");

    p.stack(&stack("api"));
    kill_9_while_helm_writes(&sim, &p, &release, "pending-upgrade");
    assert_eq!(sim.helm_statuses(major, &release, "shop"), ["deployed", "pending-upgrade"]);
    let id = |n: u32| format!("{release}@{n}");
    let app = step(&p.status(), "app").clone();
    assert_eq!(app["sub_changes"][0]["id"], id(2).as_str(), "{app}");
    assert_eq!(app["sub_changes"][0]["uncertain"], true, "the journal shows revision 2 started: {app}");

    // A helm naming the release is alive (here a stand-in): evidence incomplete, recover refuses
    // and says so; the refusal, recorded in the journal, does not lose the other facts.
    // (`sh` running the script keeps the name `helm` in its argv, as a real helm would.)
    p.file("bin/helm", "#!/bin/sh\nsleep 60\n");
    std::fs::set_permissions(p.path("bin/helm"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut alive = std::process::Command::new(p.path("bin/helm")).args(["upgrade", &release]).spawn().unwrap();
    p.rdeploy(&["recover"])
        .code(1)
        .stdout_has("a helm process for it is still running")
        .stdout_has("let it finish, or stop it, then `rdeploy recover`")
        .stdout_has("next: rdeploy recover");
    alive.kill().unwrap();
    alive.wait().unwrap();
    assert_eq!(sim.helm_statuses(major, &release, "shop"), ["deployed", "pending-upgrade"]);

    p.rdeploy(&["recover", "--dry-run"])
        .code(0)
        .stdout_has("abandoned: this deploy started revision 2 in `rdeploy up`");
    let run = p.rdeploy(&["recover"]);
    run.code(0)
        .stderr_has(&format!("rolled back abandoned revision 2 of {release} (pending-upgrade) to revision 1"))
        .stdout_has(&format!("{}: abandoned by a dead run (pending-upgrade): rolled back to revision 1", id(2)));
    assert_eq!(
        sim.helm_statuses(major, &release, "shop"),
        ["superseded", "pending-upgrade", "superseded", "deployed"],
        "one rollback and one upgrade"
    );
    let values = sim.helm_ok(major, &["get", "values", &release, "-n", "shop", "--kube-context", "c1", "-o", "json"]);
    assert!(values.contains(r#""tier":"api""#), "{values}");
    let status = p.status();
    assert_eq!(status["state"], "complete");
    assert_eq!(
        sub_statuses(&status, "app"),
        [(id(2), "pending".to_string()), (id(3), "done".to_string()), (id(4), "done".to_string())],
        "the abandoned revision is settled (never done), the rollback and the upgrade done once each"
    );
    assert_eq!(p.read("after.log"), "after\n");
}

/// issue 14: a first install this deploy's killed run left pending-install is uninstalled and
/// installed again, with no flag and no `helm uninstall` by hand.
fn abandoned_pending_install_is_reinstalled_without_force(major: u32) {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    let release = format!("abandoned-install{major}");
    p.stack(&stack(major, "web").replace("release: web", &format!("release: {release}")));
    kill_9_while_helm_writes(&sim, &p, &release, "pending-install");
    assert_eq!(sim.helm_statuses(major, &release, "shop"), ["pending-install"]);

    let run = p.rdeploy(&["recover"]);
    run.code(0).stderr_has(&format!("uninstalled abandoned revision 1 of {release} (pending-install)"));
    assert_eq!(sim.helm_statuses(major, &release, "shop"), ["deployed"], "one install, after the uninstall");
    let status = p.status();
    assert_eq!(status["state"], "complete");
    assert_eq!(sub_statuses(&status, "app"), [(format!("{release}@1"), "done".to_string())]);
    assert_eq!(p.read("after.log"), "after\n");
}

#[test]
fn helm3_abandoned_pending_upgrade_is_recovered_without_force() {
    abandoned_pending_upgrade_is_recovered_without_force(3);
}

#[test]
fn helm4_abandoned_pending_upgrade_is_recovered_without_force() {
    abandoned_pending_upgrade_is_recovered_without_force(4);
}

#[test]
fn helm3_abandoned_pending_install_is_reinstalled_without_force() {
    abandoned_pending_install_is_reinstalled_without_force(3);
}

#[test]
fn helm4_abandoned_pending_install_is_reinstalled_without_force() {
    abandoned_pending_install_is_reinstalled_without_force(4);
}

/// A chart schema error is summarised by its first complete message (the chart and the value at
/// fault), not its header line alone, and `status --json` carries it on one line.
#[test]
fn helm3_a_chart_schema_error_names_the_value_at_fault() {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file("chart/Chart.yaml", "apiVersion: v2\nname: toggles\nversion: 0.1.0\n");
    p.file("chart/values.yaml", "replicaCount: 1\n");
    p.file("chart/values.schema.json", r#"{"type": "object", "properties": {"replicaCount": {"type": "integer"}}}"#);
    p.file("chart/templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: toggles\n");
    p.stack(&format!(
        "name: app\nsteps:\n  - name: app\n    tool: helm\n    release: web\n    chart: ./chart\n    namespace: shop\n    context: c1\n    set: {{ replicaCount: \"two\" }}\n    binary: {}\n",
        helm_bin(3).display()
    ));
    p.rdeploy(&["up"]).code(1);
    let status = p.status();
    let error = step(&status, "app")["error"].as_str().unwrap().to_string();
    assert!(error.contains("schema") && error.contains("toggles:") && error.contains("replicaCount"), "{error}");
    assert!(!error.contains('\n'), "{error:?}");
}

/// helm 3 cannot roll back a failed upgrade that renamed an object (helm/helm#13437): revision 1
/// has ConfigMap `settings`, the upgrade renames it `settings-v2` and fails at the API server, and `recover` with
/// `recover: rollback` says why and gives both ways out instead of a bare failure.
#[test]
fn helm3_rollback_over_a_renamed_object_says_why_and_the_way_out() {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file("chart/Chart.yaml", "apiVersion: v2\nname: renamer\nversion: 0.1.0\n");
    p.file("chart/values.yaml", "cmName: settings\nbroken: false\n");
    p.file(
        "chart/templates/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Values.cmName }}\ndata:\n  a: \"1\"\n",
    );
    p.file(
        "chart/templates/hpa.yaml",
        "{{ if .Values.broken }}\napiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: web\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}\n  minReplicas: 1\n  maxReplicas: 0\n{{ end }}\n",
    );
    let stack = |set: &str| {
        format!(
            "name: app\nsteps:\n  - name: app\n    tool: helm\n    release: web\n    chart: ./chart\n    namespace: shop\n    context: c1\n    recover: rollback\n{set}    binary: {}\n",
            helm_bin(3).display()
        )
    };
    p.stack(&stack(""));
    p.rdeploy(&["up"]).code(0);
    p.stack(&stack("    set: { cmName: settings-v2, broken: true }\n"));
    p.rdeploy(&["up"]).code(1);

    let recover = p.rdeploy(&["recover"]);
    recover
        .code(1)
        .stdout_has(r#"no ConfigMap with the name "settings" found"#)
        .stdout_has("helm/helm#13437")
        .stdout_has("kubectl delete configmap settings -n shop")
        .stdout_has("drop `recover: rollback`");
}

/// One helm step costs rdeploy two helm processes, not seven: `helm version` once per run
/// (preflight and apply share it) and the upgrade itself, whose `-o json` release gives the
/// step's outputs (no `helm get metadata`); the history before and after is read from helm's
/// release records in the API (no `helm history`, no `helm status`). The outputs are exactly what `helm get
/// metadata` says, with and without an `appVersion`, and the step's log keeps the chart's NOTES.
fn one_helm_step_costs_two_helm_processes_with_the_outputs_of_get_metadata(major: u32) {
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file(
        "bin/helm",
        &format!(
            "#!/bin/sh\ncase \" $* \" in *' --dry-run'*) verb=dry-run ;; *) verb=\"$1\" ;; esac\necho \"$verb\" >> '{}'\nexec '{}' \"$@\"\n",
            p.path("helm-calls").display(),
            helm_bin(major).display()
        ),
    );
    std::fs::set_permissions(p.path("bin/helm"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p.file("chart/values.yaml", "color: red\n");
    p.file(
        "chart/templates/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  color: {{ .Values.color | quote }}\n",
    );
    p.file("chart/templates/NOTES.txt", "the color is {{ .Values.color }}\n");
    let stack = |color: &str| {
        format!(
            "name: app\nsteps:\n  - name: app\n    tool: helm\n    release: web\n    chart: ./chart\n    namespace: shop\n    context: c1\n    set: {{ color: {color} }}\n    binary: {}\n  - name: after\n    tool: shell\n    needs: [app]\n    run: echo \"{}\" > outputs.txt\n",
            p.path("bin/helm").display(),
            ["revision", "status", "chart_version", "app_version", "namespace"]
                .map(|o| format!("${{{{ steps.app.outputs.{o} }}}}"))
                .join(" "),
        )
    };
    let metadata = || {
        let text = sim.helm_ok(major, &["get", "metadata", "web", "-n", "shop", "--kube-context", "c1", "-o", "json"]);
        let m: serde_json::Value = serde_json::from_str(&text).unwrap();
        format!(
            "{} {} {} {} {}\n",
            m["revision"],
            m["status"].as_str().unwrap(),
            m["version"].as_str().unwrap(),
            m["appVersion"].as_str().unwrap(),
            m["namespace"].as_str().unwrap()
        )
    };
    for (round, (chart, color)) in
        [("version: 0.1.0\nappVersion: \"2.5\"\n", "red"), ("version: 0.2.0-rc.1\n", "blue")].into_iter().enumerate()
    {
        p.file("chart/Chart.yaml", &format!("apiVersion: v2\nname: web-app\n{chart}"));
        p.stack(&stack(color));
        p.remove("helm-calls");
        p.rdeploy(&["up"]).code(0);
        assert_eq!(p.lines("helm-calls"), ["version", "upgrade"], "round {round}");
        assert_eq!(p.read("outputs.txt"), metadata(), "round {round}");
        let log = p.read(&p.state("logs/app.log"));
        assert!(log.contains(&format!("NOTES:\nthe color is {color}\n")), "{log}");
    }
    assert_eq!(p.read("outputs.txt"), "2 deployed 0.2.0-rc.1  shop\n");
    // The same `up` again: the record says deployed from this very chart, so the server dry-run
    // (values, live objects) decides: in place, no upgrade, the outputs read from the record.
    p.remove("helm-calls");
    p.remove("outputs.txt");
    p.rdeploy(&["up"]).code(0);
    let mut calls = p.lines("helm-calls");
    calls.sort();
    assert_eq!(calls, ["dry-run", "version"], "in place");
    assert_eq!(p.read("outputs.txt"), "2 deployed 0.2.0-rc.1  shop\n");
    assert_eq!(p.read("outputs.txt"), metadata());
    // A plain `helm upgrade` out of band (same chart and values): its revision carries no
    // rdeploy digest, so `up` upgrades it once, at once: no dry-run first.
    let chart = p.path("chart").display().to_string();
    sim.helm_ok(major, &["upgrade", "web", &chart, "-n", "shop", "--kube-context", "c1", "--set", "color=blue"]);
    p.remove("helm-calls");
    p.rdeploy(&["up"]).code(0);
    let mut calls = p.lines("helm-calls");
    calls.sort();
    assert_eq!(calls, ["upgrade", "version"], "a revision not made by rdeploy");
    assert_eq!(p.read("outputs.txt"), "4 deployed 0.2.0-rc.1  shop\n");
}

#[test]
fn helm3_one_helm_step_costs_two_helm_processes_with_the_outputs_of_get_metadata() {
    one_helm_step_costs_two_helm_processes_with_the_outputs_of_get_metadata(3);
}

#[test]
fn helm4_one_helm_step_costs_two_helm_processes_with_the_outputs_of_get_metadata() {
    one_helm_step_costs_two_helm_processes_with_the_outputs_of_get_metadata(4);
}

const TOKEN: &str = "tok-5e2d9a71c4";

/// A terraform step whose outputs a helm step uses: `hostname` plain, `token` sensitive.
fn infra_and_web(p: &Project, tier: &str) {
    p.file(
        "infra/main.tf",
        &format!(
            "resource \"terraform_data\" \"lb\" {{ input = \"lb\" }}\noutput \"hostname\" {{ value = \"web.example.com\" }}\noutput \"token\" {{\n  value     = \"{TOKEN}\"\n  sensitive = true\n}}\n"
        ),
    );
    p.stack(&format!(
        r#"name: app
steps:
  - name: infra
    tool: terraform
    dir: infra
  - name: web
    tool: helm
    release: web
    chart: {chart}
    namespace: web
    context: c1
    binary: {helm}
    set:
      tier: "{tier}"
      lbAddress: "${{{{ steps.infra.outputs.hostname }}}}"
      token: "${{{{ steps.infra.outputs.token }}}}"
"#,
        chart = testdata("webapp").display(),
        helm = helm_bin(4).display(),
    ));
}

/// Issue 31, point 7: a failed upgrade's long error is printed once (the step's `why` names the
/// revision instead of repeating it, the stderr tail that only quotes it is left out), `recover
/// --dry-run` shows the recorded output values (the sensitive one redacted) instead of
/// `${{ ... }}`, and the runbook's rollback names the revision, namespace and context.
#[test]
fn helm4_a_failed_upgrade_says_its_error_once_with_recorded_values_and_a_concrete_rollback() {
    common::require_tool("terraform", "install terraform (https://developer.hashicorp.com/terraform/install)");
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    infra_and_web(&p, "web");
    p.rdeploy(&["up"]).code(0);
    infra_and_web(&p, "not valid!");
    let up = p.rdeploy(&["up"]);
    up.code(1);

    let error = "a valid label must be an empty string";
    let status = p.rdeploy(&["status"]);
    status.code(0).stdout_has("web@2");
    assert_eq!(status.stdout.matches(error).count(), 1, "{}", status.stdout);
    assert_eq!(up.stdout.matches(error).count(), 1, "{}", up.stdout);
    let filters = vec![
        (r"[0-9A-HJKMNP-TV-Z]{26}", "[deploy]"),
        (r"\d{4}-\d\d-\d\dT[0-9:.]+Z", "[time]"),
        (r"`/\S*/helm ", "`[helm] "),
        (r"/\S*/\.rdeploy/", "[project]/.rdeploy/"),
        (r" \S*/testdata/webapp ", " [chart] "),
        (r"sha256:[0-9a-f]{64}", "sha256:[digest]"),
    ];
    insta::with_settings!({ filters => filters }, {
        insta::assert_snapshot!("failed_upgrade_report", status.stdout);
    });

    let dry = p.rdeploy(&["recover", "--dry-run"]);
    dry.code(0).stdout_has(r#"--set-json 'lbAddress="web.example.com"'"#);
    assert!(!dry.stdout.contains("${{"), "{}", dry.stdout);
    assert!(!dry.stdout.contains(TOKEN), "{}", dry.stdout);

    let runbook = p.rdeploy(&["runbook"]);
    runbook.code(0).stdout_has("roll back by hand to revision 1, the last deployed one the checkpoint recorded: `");
    runbook.stdout_has("/helm rollback web 1 -n web --kube-context c1 --wait=watcher`");
    runbook.stdout_has(r#"--set-json 'lbAddress="web.example.com"'"#);
    assert_eq!(runbook.stdout.matches(error).count(), 1, "{}", runbook.stdout);
    for run in [&up, &status, &dry, &runbook] {
        assert!(!run.stdout.contains(TOKEN) && !run.stderr.contains(TOKEN), "{}\n{}", run.stdout, run.stderr);
    }
}

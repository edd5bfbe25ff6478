//! helm steps through the real `rdeploy` binary with the real helm 3 and helm 4 and a kubesim
//! per test: a failed upgrade stops the deploy naming the revision, and recover upgrades again.

mod common;

use common::{step, sub_statuses, Project};
use kubesim::testing::{helm_bin, testdata, Kubesim};

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

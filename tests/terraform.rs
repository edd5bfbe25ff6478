//! End-to-end tests of a terraform step: the real `rdeploy` binary drives real terraform on the
//! fixtures in `fixtures/terraform/` (marker files inject failures, see `prov.sh`).

mod common;

use std::time::Duration;

use common::{require_tool, step, sub_statuses, Project};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const STACK: &str = r#"
name: infra
steps:
  - name: network
    tool: terraform
    dir: chain
    vars: { rev: "1" }
  - name: after
    tool: shell
    needs: [network]
    run: echo after >> out
"#;

/// A project with the chain fixture at `chain/` and the stack above.
fn chain_project() -> Project {
    require_tool("terraform", "install terraform v1.11 (https://developer.hashicorp.com/terraform/install)");
    let p = Project::new();
    p.copy_fixture("terraform/chain", "chain");
    p.file("chain/prov.sh", &std::fs::read_to_string(common::repo_root().join("fixtures/terraform/prov.sh")).unwrap());
    p.stack(STACK);
    p
}

fn runs(p: &Project, name: &str) -> usize {
    p.read(&format!("chain/runs/{name}.log")).lines().count()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn up_fails_at_5_of_6_then_recover_applies_only_the_rest() {
    let p = chain_project();
    p.file("chain/fail-a5", "");

    p.rdeploy(&["up"])
        .code(1)
        .stdout_has("terraform_data.a5")
        .stdout_has("fail-a5 is present")
        .stdout_has("next: rdeploy recover stack.yaml");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(
        sub_statuses(&status, "network"),
        pairs(&[
            ("terraform_data.a1", "done"),
            ("terraform_data.a2", "done"),
            ("terraform_data.a3", "done"),
            ("terraform_data.a4", "done"),
            ("terraform_data.a5", "failed"),
            ("terraform_data.a6", "pending"),
        ])
    );
    assert!(step(&status, "network")["error"].as_str().unwrap().contains("local-exec provisioner error"));
    assert_eq!(step(&status, "after")["status"], "skipped");

    p.remove("chain/fail-a5");
    p.rdeploy(&["recover", "--dry-run"])
        .code(0)
        .stdout_has("2 to add, 0 to change, 1 to destroy")
        .stdout_has("replace terraform_data.a5 (tainted)");
    assert_eq!(runs(&p, "a6"), 0, "the dry run applied nothing");

    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    for i in 1..=6 {
        assert_eq!(runs(&p, &format!("a{i}")), 1, "a{i} ran exactly once");
    }
    assert_eq!(p.read("out"), "after\n");
    assert_eq!(p.status()["state"], "complete");
}

#[test]
fn a_held_state_lock_is_exit_1_with_the_lock_id_and_nothing_applied() {
    let p = chain_project();
    p.file("chain/slow-a1", "");
    let mut holder = std::process::Command::new("terraform")
        .args(["apply", "-input=false", "-auto-approve", "-no-color"])
        .current_dir(p.path("chain"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    p.wait_for("chain/runs/a1.started", Duration::from_secs(60));
    let info: serde_json::Value = serde_json::from_str(&p.read("chain/.terraform.tfstate.lock.info")).unwrap();
    let lock_id = info["ID"].as_str().unwrap().to_string();

    let run = p.rdeploy(&["up"]);
    p.remove("chain/slow-a1");
    assert!(holder.wait().unwrap().success());

    run.code(1)
        .stdout_has("the terraform state is locked by another process")
        .stdout_has(&lock_id)
        .stdout_has(&format!("terraform force-unlock {lock_id}"));
    assert_eq!(runs(&p, "a1"), 1, "only the holder ran a1");
    let status = p.status();
    assert!(step(&status, "network")["error"].as_str().unwrap().contains(&lock_id));
    assert!(sub_statuses(&status, "network").iter().all(|(_, s)| s != "done"));

    // The holder finished the whole chain; recover finds nothing left to apply.
    p.rdeploy(&["recover"]).code(0);
    for i in 1..=6 {
        assert_eq!(runs(&p, &format!("a{i}")), 1, "a{i}");
    }
}

#[test]
fn sigint_mid_apply_is_exit_130_and_recover_finishes() {
    let p = chain_project();
    p.file("chain/slow-a3", "");
    let child = p.spawn(&["up"]);
    p.wait_for("chain/runs/a3.started", Duration::from_secs(60));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let output = child.wait_with_output().unwrap();
    let run = common::Run::from(output, &["up"]);
    run.code(130);

    let statuses = sub_statuses(&p.status(), "network");
    assert_eq!(statuses[..2], pairs(&[("terraform_data.a1", "done"), ("terraform_data.a2", "done")])[..]);
    assert_eq!(statuses[2], ("terraform_data.a3".to_string(), "failed".to_string()));

    p.remove("chain/slow-a3");
    p.rdeploy(&["recover"]).code(0);
    for i in 1..=6 {
        assert_eq!(runs(&p, &format!("a{i}")), 1, "a{i}");
    }
}

/// `vars:` reach terraform with their YAML types: a map's number stays a number and a boolean a
/// boolean, as terraform's own type of an `any` variable shows.
#[test]
fn typed_vars_reach_terraform_with_their_types() {
    let terraform =
        require_tool("terraform", "install terraform v1.11 (https://developer.hashicorp.com/terraform/install)");
    let p = Project::new();
    p.file(
        "typed/main.tf",
        r#"
variable "flag" {
  type = bool
}
variable "settings" {
  type = any
}
output "flag_is_false" {
  value = var.flag == false
}
output "settings" {
  value = var.settings
}
"#,
    );
    p.stack(
        r#"
name: infra
steps:
  - name: typed
    tool: terraform
    dir: typed
    vars: { flag: false, settings: { n: 2, on: true, name: "2", list: [1, "a"] } }
"#,
    );
    p.rdeploy(&["up"]).code(0);
    let out =
        std::process::Command::new(terraform).args(["output", "-json"]).current_dir(p.path("typed")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let outputs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outputs["flag_is_false"]["value"], true);
    assert_eq!(
        outputs["settings"]["type"],
        serde_json::json!(["object", { "list": ["tuple", ["number", "string"]], "n": "number", "name": "string", "on": "bool" }])
    );
}

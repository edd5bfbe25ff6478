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
        // terraform's own pointer into the configuration is kept (issue 31, point 5).
        .stdout_has("fail-a5 is present (on main.tf line ")
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

/// kill -9 of rdeploy mid-apply: terraform gets SIGINT (its graceful stop) and its output is a
/// memory file, not a pipe whose reader died, so it stops cleanly and writes its state. The next
/// `recover` waits for it, converges, and no resource is created twice.
#[test]
fn kill_9_mid_apply_keeps_terraforms_state_and_recover_creates_nothing_twice() {
    let p = chain_project();
    p.file("chain/slow-a3", "");
    let mut child = p.spawn(&["up"]);
    p.wait_for("chain/runs/a3.started", Duration::from_secs(60));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();

    // terraform outlives rdeploy: it got one SIGINT, stops the provisioner in flight (a3),
    // starts nothing more, writes its state and ends on its own.
    let running = p.path(&p.state("running"));
    let start = std::time::Instant::now();
    while !rdeploy_adapters::process::surviving_children(&running).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(120), "terraform never ended after its SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    }
    // terraform's stream was a memory file (it may hold secrets): nothing of it is on disk.
    assert!(!p.exists(&p.state("steps/network/apply.jsonl")), "terraform's stream is not written to disk");
    let state: serde_json::Value = serde_json::from_str(&p.read("chain/terraform.tfstate"))
        .unwrap_or_else(|e| panic!("terraform.tfstate is not JSON after the kill: {e}"));
    let names: Vec<&str> = state["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names[..2], ["a1", "a2"], "the resources terraform completed are in state: {names:?}");
    assert_eq!(runs(&p, "a4"), 0, "terraform started nothing after its SIGINT");

    p.remove("chain/slow-a3");
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    for i in 1..=6 {
        assert_eq!(runs(&p, &format!("a{i}")), 1, "a{i} was created exactly once");
    }
}

/// Kills rdeploy (kill -9) and waits until the terraform it started has ended on its own (it
/// got one SIGINT: it stops the provisioner in flight, taints the resource, writes its state).
fn kill_9_and_wait_for_terraform(p: &Project, mut child: std::process::Child) {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let running = p.path(&p.state("running"));
    let start = std::time::Instant::now();
    while !rdeploy_adapters::process::surviving_children(&running).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(120), "terraform never ended after its SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 32, point 2: kill -9 during a provisioner (a3 tainted), then kill -9 the `recover`
/// whose apply replaces a3, during the provisioner of the replacement. That apply completed
/// the delete half of the replace only; terraform's state holds a3 tainted again. The next
/// `recover` must not record a3 done from the dead apply (it did, and the one after warned that
/// the plan "will replace terraform_data.a3 (tainted) though it was recorded done" and applied
/// it again): a3 is replaced as not done, and recorded done only when its create completed.
#[test]
fn a_replace_killed_after_its_delete_half_is_not_recorded_done() {
    let p = chain_project();
    p.file("chain/slow-a3", "");
    let up = p.spawn(&["up"]);
    p.wait_for("chain/runs/a3.started", Duration::from_secs(60));
    kill_9_and_wait_for_terraform(&p, up);

    // The recover replaces tainted a3: delete, then create, whose provisioner waits.
    p.remove("chain/runs/a3.started");
    let recover = p.spawn(&["recover"]);
    p.wait_for("chain/runs/a3.started", Duration::from_secs(120));
    kill_9_and_wait_for_terraform(&p, recover);
    let show =
        std::process::Command::new("terraform").args(["show", "-json"]).current_dir(p.path("chain")).output().unwrap();
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(show.contains(r#""address":"terraform_data.a3""#) && show.contains(r#""tainted":true"#), "{show}");
    let a3 = |p: &Project| sub_statuses(&p.status(), "network").into_iter().find(|(id, _)| id == "terraform_data.a3");
    assert_ne!(a3(&p).map(|(_, s)| s), Some("done".to_string()), "a3 is not done after the killed replace");

    // A recover whose plan fails (the operator's fix is half-written) journals what it learnt
    // before planning: a3 must not be among it.
    p.remove("chain/slow-a3");
    p.file("chain/broken.tf", "resource \"terraform_data\" \"x\" {\n  nope = 1\n}\n");
    p.rdeploy(&["recover"]).code(1).stdout_has("Unsupported argument");
    assert_ne!(a3(&p).map(|(_, s)| s), Some("done".to_string()), "a3 recorded done while terraform has it tainted");

    p.remove("chain/broken.tf");
    let run = p.rdeploy(&["recover"]);
    run.code(0).stdout_has("deploy complete");
    let said = format!("{}{}", run.stdout, run.stderr);
    assert!(!said.contains("recorded done"), "a3 was recorded done before its replace completed: {said}");
    assert_eq!(a3(&p).map(|(_, s)| s), Some("done".to_string()));
    for i in 1..=6 {
        assert_eq!(runs(&p, &format!("a{i}")), 1, "a{i} completed exactly once");
    }
}

/// A few rounds of benches/crash-loop.sh for terraform: kill -9 once a random resource of the
/// chain has started (during `up`, then during a `recover`), then one `recover`: it converges
/// at once, and no resource recorded done (by the journal after a kill) is created again. A
/// resource whose provisioner was in flight at the kill is not done: terraform stops it on the
/// interrupt and taints it, so its own next apply replaces it (its side effect may land twice,
/// as with terraform alone; that is terraform's recovery of an unfinished create, not a re-apply).
#[test]
fn crash_loop_kill_9_during_apply_and_recover_converges_without_double_applies() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let mut rng = seed;
    let mut next = |n: usize| {
        rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        (rng >> 16) as usize % n + 1
    };
    for round in 0..3 {
        let p = chain_project();
        let kill_when = |p: &Project, args: &[&str], resource: usize| {
            let mut child = p.spawn(args);
            let start = std::time::Instant::now();
            while !p.exists(&format!("chain/runs/a{resource}.started")) && child.try_wait().unwrap().is_none() {
                assert!(start.elapsed() < Duration::from_secs(120), "seed {seed}: {args:?} never started a{resource}");
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            child.wait().unwrap();
        };
        // (resource, its runs when the journal first said done)
        let mut recorded_done: Vec<(String, usize)> = Vec::new();
        let mut note_done = |p: &Project| {
            for (id, state) in sub_statuses(&p.status(), "network") {
                let name = id.trim_start_matches("terraform_data.").to_string();
                if state == "done" && !recorded_done.iter().any(|(n, _)| *n == name) {
                    let landed = runs(p, &name);
                    recorded_done.push((name, landed));
                }
            }
        };
        let first = next(6);
        kill_when(&p, &["up"], first);
        note_done(&p);
        if round == 1 {
            kill_when(&p, &["recover"], first + next(6 - first + 1) - 1);
            note_done(&p);
        }
        p.rdeploy(&["recover"]).code(0);
        assert_eq!(p.status()["state"], "complete", "seed {seed}, round {round}");
        for (name, landed) in &recorded_done {
            assert_eq!(
                runs(&p, name),
                *landed,
                "seed {seed}, round {round}: {name} was recorded done, then created again"
            );
        }
        for i in 1..=6 {
            assert!(runs(&p, &format!("a{i}")) >= 1, "seed {seed}, round {round}: a{i} was never created");
        }
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

#[test]
fn a_state_lock_held_by_a_live_terraform_is_waited_out_by_the_retry() {
    let p = chain_project();
    p.stack(&STACK.replace(
        "    vars: { rev: \"1\" }\n",
        "    vars: { rev: \"1\" }\n    retry: { attempts: 30, delay: 500ms, backoff: 1 }\n",
    ));
    p.file("chain/slow-a1", "");
    let mut holder = std::process::Command::new("terraform")
        .args(["apply", "-input=false", "-auto-approve", "-no-color"])
        .current_dir(p.path("chain"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    p.wait_for("chain/runs/a1.started", Duration::from_secs(60));

    let child = p.spawn(&["up"]);
    // The first attempt met the lock and a second one is journaled: now the holder finishes.
    let start = std::time::Instant::now();
    while !p.exists(&p.state("journal.jsonl")) || !p.read(&p.state("journal.jsonl")).contains(r#""attempt":2"#) {
        assert!(start.elapsed() < Duration::from_secs(120), "no second attempt was journaled");
        std::thread::sleep(Duration::from_millis(50));
    }
    p.remove("chain/slow-a1");
    assert!(holder.wait().unwrap().success());
    let run = common::Run::from(child.wait_with_output().unwrap(), &["up"]);
    run.code(0).stdout_has("deploy complete").stdout_has("succeeded on attempt");
    run.stderr_has("(transient: the terraform state lock is held)");
    for i in 1..=6 {
        assert_eq!(runs(&p, &format!("a{i}")), 1, "a{i} ran once, by the holder");
    }
    assert_eq!(p.read("out"), "after\n");
}

/// The checkpoint records a1..a4 done, then terraform's state is emptied (as a kill -9 mid-write
/// did before the tool's output went to files): `recover` must not create them a second time
/// on its own. It stops (exit 1), names what is contradicted and how to reconcile; with
/// `--reapply-missing` the operator asks for them to be created again, and it does.
#[test]
fn recover_stops_when_terraforms_state_lost_what_the_checkpoint_records_done() {
    let p = chain_project();
    p.file("chain/fail-a5", "");
    p.rdeploy(&["up"]).code(1);
    p.remove("chain/fail-a5");
    p.file("chain/terraform.tfstate", "");

    p.rdeploy(&["recover"])
        .code(1)
        .stdout_has("terraform's state has no record of them: terraform_data.a1, terraform_data.a2, terraform_data.a3, terraform_data.a4")
        .stdout_has("terraform import terraform_data.a1 ID")
        .stdout_has("rdeploy recover --reapply-missing");
    for i in 1..=4 {
        assert_eq!(runs(&p, &format!("a{i}")), 1, "a{i} was not created again without the flag");
    }
    assert_eq!(runs(&p, "a6"), 0, "nothing after the contradiction ran");

    p.rdeploy(&["recover", "--reapply-missing"]).code(0).stdout_has("deploy complete");
    for i in 1..=4 {
        assert_eq!(runs(&p, &format!("a{i}")), 2, "a{i} was created again, as the flag asks");
    }
    assert_eq!(runs(&p, "a6"), 1);
}

/// The fix renames two resources with `moved` blocks: a2 (done) and a5 (the one that failed).
/// Each address that moved is one sub-change under its new name, and b5 (was a5) stays failed
/// until an apply of terraform's creates it, never "done" because a5 left the plan.
#[test]
fn moved_blocks_rename_sub_changes_and_a_moved_failed_resource_is_done_only_when_applied() {
    let p = chain_project();
    p.file("chain/fail-a5", "");
    p.rdeploy(&["up"]).code(1);

    let config = p.read("chain/main.tf");
    let config = config
        .replace(r#""terraform_data" "a2""#, r#""terraform_data" "b2""#)
        .replace("[terraform_data.a2]", "[terraform_data.b2]")
        .replace(r#""terraform_data" "a5""#, r#""terraform_data" "b5""#)
        .replace("[terraform_data.a5]", "[terraform_data.b5]");
    p.file(
        "chain/main.tf",
        &format!(
            "{config}\nmoved {{\n  from = terraform_data.a2\n  to   = terraform_data.b2\n}}\n\nmoved {{\n  from = terraform_data.a5\n  to   = terraform_data.b5\n}}\n"
        ),
    );
    // The provisioner still fails: the moved b5 must come out failed, not done.
    p.rdeploy(&["recover"]).code(1).stdout_has("terraform_data.b5");
    let expected = |b5: &str, a6: &str| {
        pairs(&[
            ("terraform_data.a1", "done"),
            ("terraform_data.b2", "done"),
            ("terraform_data.a3", "done"),
            ("terraform_data.a4", "done"),
            ("terraform_data.b5", b5),
            ("terraform_data.a6", a6),
        ])
    };
    assert_eq!(sub_statuses(&p.status(), "network"), expected("failed", "pending"));

    p.remove("chain/fail-a5");
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    for name in ["a1", "a2", "a3", "a4", "a5", "a6"] {
        assert_eq!(runs(&p, name), 1, "{name} ran exactly once (a move re-creates nothing)");
    }
}

/// A `moved` block for a resource that was never created (a6, which the failure at a5 left
/// pending, is renamed b6): terraform has nothing to move in its state and plans b6 as a
/// create. It is one sub-change under its new address, never `a6` "done" because a6 left the
/// plan; it stays pending while a5 still fails and is done only once terraform created it.
#[test]
fn a_moved_block_for_a_resource_never_created_is_one_sub_change_done_when_terraform_creates_it() {
    let p = chain_project();
    p.file("chain/fail-a5", "");
    p.rdeploy(&["up"]).code(1);
    assert!(!p.exists("chain/runs/a6.log"), "a6 never ran");

    let config = p.read("chain/main.tf").replace(r#""terraform_data" "a6""#, r#""terraform_data" "b6""#);
    let config = config.replace("terraform_data.a6.id", "terraform_data.b6.id");
    p.file(
        "chain/main.tf",
        &format!("{config}\nmoved {{\n  from = terraform_data.a6\n  to   = terraform_data.b6\n}}\n"),
    );
    let expected = |a5: &str, b6: &str| {
        pairs(&[
            ("terraform_data.a1", "done"),
            ("terraform_data.a2", "done"),
            ("terraform_data.a3", "done"),
            ("terraform_data.a4", "done"),
            ("terraform_data.a5", a5),
            ("terraform_data.b6", b6),
        ])
    };
    p.rdeploy(&["recover"]).code(1).stdout_has("terraform_data.a5");
    assert_eq!(sub_statuses(&p.status(), "network"), expected("failed", "pending"));
    assert!(!p.exists("chain/runs/a6.log"), "b6 was not created while a5 fails");

    p.remove("chain/fail-a5");
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    assert_eq!(sub_statuses(&p.status(), "network"), expected("done", "done"));
    assert_eq!(runs(&p, "a6"), 1, "b6 (the provisioner still says a6) was created once");
}

/// Ctrl-C or SIGTERM while preflight waits on a slow tool (`kubectl version --client` behind a
/// script that sleeps first; terraform's own version comes from its plan's `-json` stream, so
/// `up` starts no terraform before its step) is an interrupt (130) with nothing run, never
/// "bad input" blaming the tool.
#[test]
fn a_signal_during_preflight_is_an_interrupt_not_bad_input() {
    require_tool("kubectl", "install kubectl (https://kubernetes.io/docs/tasks/tools/)");
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let p = chain_project();
        let kubectl = std::process::Command::new("sh").args(["-c", "command -v kubectl"]).output().unwrap();
        let kubectl = String::from_utf8(kubectl.stdout).unwrap().trim().to_string();
        p.file(
            "slowkubectl",
            &format!("#!/bin/sh\ntouch \"$(dirname \"$0\")/preflight-started\"\nsleep 60\nexec {kubectl} \"$@\"\n"),
        );
        std::fs::set_permissions(p.path("slowkubectl"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        p.file("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n");
        p.stack(&format!(
            "{STACK}  - name: objects\n    tool: kubectl\n    needs: [after]\n    manifests: [cm.yaml]\n    binary: {}\n",
            p.path("slowkubectl").display()
        ));
        let child = p.spawn(&["up"]);
        p.wait_for("preflight-started", Duration::from_secs(60));
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let run = common::Run::from(child.wait_with_output().unwrap(), &["up"]);
        run.code(130);
        assert!(run.stderr.contains(&format!("{signal} received while checking the tools")), "{}", run.stderr);
        assert!(!p.exists("chain/runs/a1.log"), "nothing ran");
        assert!(!p.exists("out"), "the shell step did not run");
    }
}

/// `up` and `recover` spend no terraform start on `terraform version -json`: the version is the
/// one the plan's `-json` stream opens with, kept as the step's `tool_version`. Every start of
/// terraform goes through a wrapper that logs its arguments.
#[test]
fn up_and_recover_take_terraforms_version_from_its_json_stream_without_a_version_preflight() {
    let p = chain_project();
    let terraform = std::process::Command::new("sh").args(["-c", "command -v terraform"]).output().unwrap();
    let terraform = String::from_utf8(terraform.stdout).unwrap().trim().to_string();
    let version = std::process::Command::new(&terraform).args(["version", "-json"]).output().unwrap();
    let version: serde_json::Value = serde_json::from_slice(&version.stdout).unwrap();
    let version = version["terraform_version"].as_str().unwrap().to_string();
    p.file(
        "logtf",
        &format!("#!/bin/sh\necho \"$1\" >> \"$(dirname \"$0\")/terraform-calls\"\nexec {terraform} \"$@\"\n"),
    );
    std::fs::set_permissions(p.path("logtf"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p.stack(&STACK.replace("dir: chain", &format!("dir: chain\n    binary: {}", p.path("logtf").display())));
    p.file("chain/fail-a5", "");
    p.rdeploy(&["up"]).code(1).stdout_has("fail-a5 is present");
    p.remove("chain/fail-a5");
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    let calls = p.read("terraform-calls");
    assert!(!calls.lines().any(|l| l == "version"), "no version preflight: {calls}");
    assert!(calls.lines().filter(|l| *l == "plan").count() >= 2, "a plan on up and on recover: {calls}");
    // Nor on `output -json`: the apply's stream ends with the outputs (none sensitive here).
    assert!(!calls.lines().any(|l| l == "output"), "outputs from the apply's stream: {calls}");
    let history = std::fs::read_dir(p.path(&p.state("history"))).unwrap().next().unwrap().unwrap().path();
    let deploy: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(history).unwrap()).unwrap();
    assert_eq!(step(&deploy, "network")["tool_version"], version.as_str(), "{deploy:#}");
    let last = std::process::Command::new(&terraform)
        .args(["output", "-raw", "last"])
        .current_dir(p.path("chain"))
        .output()
        .unwrap();
    let last = String::from_utf8(last.stdout).unwrap();
    assert!(!last.is_empty());
    assert_eq!(step(&deploy, "network")["outputs"]["last"], last.as_str(), "{deploy:#}");
    // `validate` still asks terraform itself.
    p.rdeploy(&["validate"]).code(0).stdout_has(&format!("terraform {version}"));
    assert!(p.read("terraform-calls").lines().any(|l| l == "version"), "validate's preflight");
}

/// terraform's human diagnostics wrap: the failure keeps the first error's whole sentence
/// ("... no such file or directory"), not the last wrapped fragment, on one line.
#[test]
fn an_init_failure_keeps_terraforms_first_error_sentence_whole() {
    require_tool("terraform", "install terraform v1.11 (https://developer.hashicorp.com/terraform/install)");
    let p = Project::new();
    p.file("infra/main.tf", "module \"network\" {\n  source = \"./modules/network\"\n}\n");
    p.stack("name: infra\nsteps:\n  - name: network\n    tool: terraform\n    dir: infra\n");
    p.rdeploy(&["up"]).code(1);
    let status = p.status();
    let error = step(&status, "network")["error"].as_str().unwrap().to_string();
    assert!(
        error.contains(
            "Unreadable module directory: Unable to evaluate directory symlink: lstat modules: no such file or directory"
        ),
        "{error}"
    );
    assert!(!error.contains('\n'), "one line: {error:?}");
}

fn terraform_ok(p: &Project, args: &[&str]) {
    let out = std::process::Command::new("terraform").args(args).current_dir(p.path("chain")).output().unwrap();
    assert!(out.status.success(), "terraform {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// `rdeploy plan` is read-only towards terraform: it plans while another terraform holds the
/// state lock (`-lock=false`, a preview never writes state), and it plans another workspace
/// without selecting it (`TF_WORKSPACE`): the module directory's workspace stays as it was.
#[test]
fn plan_runs_beside_a_held_state_lock_and_leaves_the_selected_workspace() {
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
    assert!(p.exists("chain/.terraform.tfstate.lock.info"), "the holder has the lock");
    let plan = p.rdeploy(&["plan", "--json"]);
    p.remove("chain/slow-a1");
    assert!(holder.wait().unwrap().success());
    plan.code(0);
    let doc: serde_json::Value = serde_json::from_str(&plan.stdout).unwrap();
    assert_eq!(step(&doc, "network")["items"].as_array().unwrap().len(), 6, "{doc:#}");

    // A second workspace, the default one selected again: plan the other one.
    terraform_ok(&p, &["workspace", "new", "staging"]);
    terraform_ok(&p, &["workspace", "select", "default"]);
    p.stack(&STACK.replace("    vars: { rev: \"1\" }\n", "    vars: { rev: \"1\" }\n    workspace: staging\n"));
    let plan = p.rdeploy(&["plan", "--json"]);
    plan.code(0);
    let doc: serde_json::Value = serde_json::from_str(&plan.stdout).unwrap();
    let items = step(&doc, "network")["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 6, "{doc:#}");
    assert!(items.iter().all(|i| i["action"] == "create"), "staging's state is empty: {doc:#}");
    assert_eq!(p.read("chain/.terraform/environment").trim(), "default", "plan selected no workspace");
}

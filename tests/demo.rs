//! The README's first command, `scripts/demo.sh`, run as a new user runs it (terraform,
//! ansible-core in .venv, helm 4 from tools/, kubectl, kubesim): piped, it prints no escape
//! codes; it ends with the commands to look around; `--keep` leaves kubesim up.

mod common;

use std::process::Command;

#[test]
fn the_demo_piped_has_no_escape_codes_ends_with_where_to_go_and_keep_leaves_kubesim_up() {
    common::require_tool("terraform", "install terraform (https://developer.hashicorp.com/terraform/install)");
    let kubectl = common::require_tool("kubectl", "install kubectl (https://kubernetes.io/docs/tasks/tools/)");
    // What the demo sets up itself, checked here so that a missing one says what to install.
    if !common::repo_root().join(".venv/bin/ansible-playbook").is_file() {
        common::require_tool("python3", "install python 3.11+ (scripts/setup-ansible.sh puts ansible-core in .venv)");
    }
    kubesim::testing::helm_bin(4);
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().join("demo");
    let out = Command::new(common::repo_root().join("scripts/demo.sh"))
        .arg("--keep")
        .env("DEMO_DIR", &work)
        .env_remove("NO_COLOR")
        .env_remove("RDEPLOY_STATE_DIR")
        .output()
        .expect("run scripts/demo.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The cluster it kept (the demo says its pid as it starts it): stop it whatever the asserts
    // say, and whether or not the demo got to the end.
    let pid = stdout
        .lines()
        .find_map(|l| l.strip_prefix("kubesim (pid ").and_then(|r| r.split(')').next()).map(str::to_string));
    let _stop = pid.clone().map(Stop);
    assert!(out.status.success(), "demo failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    assert!(!stdout.contains('\u{1b}'), "escape codes on a pipe:\n{stdout}");
    assert!(stdout.contains("== 7. look around"), "{stdout}");
    for command in ["rdeploy status stack.yaml", "rdeploy runbook stack.yaml", "rdeploy output stack.yaml"] {
        assert!(stdout.contains(&format!("  {command}")), "{command} missing:\n{stdout}");
    }
    assert!(stdout.contains(&format!("  cd {}", work.display())), "{stdout}");
    // `--keep`: the cluster still answers, with the deploy's objects in it.
    assert!(pid.is_some(), "no kubesim pid to stop:\n{stdout}");
    let get = Command::new(kubectl)
        .args(["--context", "demo", "-n", "shop", "get", "deploy", "-o", "name"])
        .env("KUBECONFIG", work.join("kubeconfig"))
        .env("KUBECACHEDIR", work.join(".kube-cache"))
        .output()
        .expect("kubectl");
    assert!(get.status.success(), "{}", String::from_utf8_lossy(&get.stderr));
    assert!(
        String::from_utf8_lossy(&get.stdout).contains("deployment.apps/"),
        "{}",
        String::from_utf8_lossy(&get.stdout)
    );
}

/// Stops the kubesim the demo kept running.
struct Stop(String);

impl Drop for Stop {
    fn drop(&mut self) {
        if let Ok(pid) = self.0.parse::<i32>() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
        }
    }
}

//! `rdeploy runbook`: snapshots of the static runbook of a stack that uses every tool and of the
//! live runbook after a partial failure, and the committed `runbooks/` kept current.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{repo_root, Project};

/// Replaces what changes between runs (temp dirs, deploy ids, times) so snapshots are stable.
fn stable(p: &Project, text: &str) -> String {
    let tmp = p.dir.path().display().to_string();
    let text = text.replace(&tmp, "[TMP]");
    let time = regex::Regex::new(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z").unwrap();
    let ulid = regex::Regex::new(r"\b[0-9A-HJKMNP-TV-Z]{26}\b").unwrap();
    ulid.replace_all(&time.replace_all(&text, "[TIME]"), "[DEPLOY]").into_owned()
}

/// A project whose stack uses every tool, with the files each step names.
fn every_tool() -> Project {
    let p = Project::new();
    p.copy_fixture("terraform/chain", "infra/chain");
    p.file("infra/chain/prod.tfvars", "rev = \"3\"\n");
    p.copy_fixture("ansible", "ansible");
    let _ = std::fs::remove_dir_all(p.path("ansible/captured"));
    common::copy_dir(&kubesim::testing::testdata("webapp"), &p.path("charts/shop"));
    p.file("values/prod.yaml", "replicas: 3\n");
    p.file("k8s/extras.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: { name: extras }\n");
    p.stack(
        r#"
name: shop
steps:
  - name: network
    tool: terraform
    dir: infra/chain
    vars: { rev: "2" }
    var_files: [infra/chain/prod.tfvars]
  - name: hosts
    tool: ansible
    needs: [network]
    playbook: ansible/site.yml
    inventory: ansible/inventory.ini
    limit: web
    extra_vars: { release: "1.4.2" }
  - name: app
    tool: helm
    needs: [hosts]
    release: shop
    chart: charts/shop
    namespace: shop
    values: [values/prod.yaml]
    set: { image.tag: "1.4.2" }
    context: prod-eu
  - name: extras
    tool: kubectl
    needs: [app]
    manifests: [k8s/]
    namespace: shop
    context: prod-eu
  - name: seed-data
    tool: shell
    needs: [extras]
    sub_changes:
      - { name: users,  run: ./load.sh users, check: ./load.sh --check users }
      - { name: orders, run: ./load.sh orders }
  - name: migrate
    tool: shell
    needs: [seed-data]
    run: ./migrate.sh
    revert: ./migrate-down.sh
  - name: announce
    tool: shell
    needs: [migrate]
    run: ./announce.sh
"#,
    );
    p
}

#[test]
fn static_runbook_of_a_stack_using_every_tool() {
    let p = every_tool();
    let run = p.rdeploy(&["runbook"]);
    run.code(0);
    let text = stable(&p, &run.stdout);
    // What the operator must find, whatever the adapters' wording becomes.
    for needle in [
        "## Steps in run order",
        "## Non-resumable steps",
        "- `announce` (shell): revert: none: complete or revert is not possible, escalate",
        "## Step 1: `network` (terraform)",
        "-var rev=2 -var-file=",
        "ansible/inventory.ini",
        "```sh\n",
        "./migrate-down.sh",
    ] {
        assert!(text.contains(needle), "runbook lacks {needle:?}:\n{text}");
    }
    assert!(!text.contains("## Live state"), "no checkpoint, no live part");
    insta::assert_snapshot!("static_every_tool", text);
}

/// Three sub-changes, the third fails while `fail-three` exists; then a bare `run` step.
const SHELL: &str = r#"
name: demo
steps:
  - name: seed
    tool: shell
    sub_changes:
      - { name: one, run: echo one >> out, check: grep -q one out }
      - { name: two, run: echo two >> out }
      - { name: three, run: "if [ -f fail-three ]; then echo 'three: connection refused' >&2; exit 3; fi; echo three >> out" }
  - name: after
    tool: shell
    needs: [seed]
    run: echo after >> out
    revert: rm -f out
"#;

#[test]
fn live_runbook_after_a_partial_failure() {
    let p = Project::new();
    p.stack(SHELL).file("fail-three", "");
    p.rdeploy(&["up"]).code(1);
    let run = p.rdeploy(&["runbook", "stack.yaml"]);
    run.code(0);
    let text = stable(&p, &run.stdout);
    for needle in [
        "## Live state",
        "| `seed` | shell | failed | `one`, `two` | `three` | - | - |",
        "three: connection refused",
        "### Next good state, in order",
        "rdeploy recover stack.yaml",
    ] {
        assert!(text.contains(needle), "runbook lacks {needle:?}:\n{text}");
    }
    insta::assert_snapshot!("live_after_partial_failure", text);

    // After the fix and the recovery, the live part says there is nothing left to do.
    p.remove("fail-three");
    p.rdeploy(&["recover"]).code(0);
    let run = p.rdeploy(&["runbook"]);
    run.code(0).stdout_has("No deploy is in progress").stdout_has("completed");
}

#[test]
fn runbook_output_file_keeps_stdout_empty() {
    let p = Project::new();
    p.stack(SHELL);
    let run = p.rdeploy(&["runbook", "-o", "RUNBOOK.md"]);
    run.code(0).stderr_has("RUNBOOK.md");
    assert!(run.stdout.is_empty(), "stdout: {}", run.stdout);
    assert!(p.read("RUNBOOK.md").starts_with("# Runbook: demo\n"));
    // Deterministic: the same stack gives the same bytes.
    assert_eq!(p.read("RUNBOOK.md"), p.rdeploy(&["runbook"]).stdout);
}

#[test]
fn runbook_of_a_bad_stack_is_exit_2() {
    let p = Project::new();
    p.stack("name: x\nsteps:\n  - name: a\n    tool: shell\n    rum: echo\n");
    p.rdeploy(&["runbook"]).code(2).stderr_has("did you mean `run`?");
}

/// The fixture stacks whose runbooks live in `runbooks/<name>.md`.
fn fixture_stacks() -> Vec<(String, PathBuf)> {
    let root = repo_root();
    let mut stacks = Vec::new();
    for entry in std::fs::read_dir(root.join("fixtures/stacks")).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("stack.yaml").is_file() {
            stacks.push((dir.file_name().unwrap().to_string_lossy().into_owned(), dir));
        }
    }
    if root.join("fixtures/demo/stack.yaml").is_file() {
        stacks.push(("demo".into(), root.join("fixtures/demo")));
    }
    stacks.sort();
    stacks
}

fn generate(dir: &Path) -> String {
    let state = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_rdeploy"))
        .args(["runbook", "stack.yaml"])
        .current_dir(dir)
        .env("CI", "1")
        .env("NO_COLOR", "1")
        // Through the environment, so the committed commands carry no temporary `--state-dir`.
        .env("RDEPLOY_STATE_DIR", state.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "runbook of {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn committed_runbooks_are_current() {
    let bless = std::env::var_os("RDEPLOY_BLESS").is_some_and(|v| v == "1");
    let runbooks = repo_root().join("runbooks");
    let stacks = fixture_stacks();
    assert!(stacks.len() >= 2, "fixture stacks: {stacks:?}");
    let mut stale = Vec::new();
    for (name, dir) in &stacks {
        let path = runbooks.join(format!("{name}.md"));
        let fresh = generate(dir);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(fresh.as_str()) {
            if bless {
                std::fs::create_dir_all(&runbooks).unwrap();
                std::fs::write(&path, &fresh).unwrap();
            } else {
                stale.push(path.display().to_string());
            }
        }
    }
    // A runbook whose stack is gone is stale too.
    for entry in std::fs::read_dir(&runbooks).into_iter().flatten() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "md") && !stacks.iter().any(|(n, _)| *n == stem) {
            if bless {
                std::fs::remove_file(&path).unwrap();
            } else {
                stale.push(format!("{} (no fixture stack)", path.display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "these runbooks are stale:\n  {}\nrefresh them with `RDEPLOY_BLESS=1 cargo test --test runbook committed_runbooks_are_current` and commit runbooks/",
        stale.join("\n  ")
    );
}

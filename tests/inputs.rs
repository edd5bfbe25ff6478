//! Errors knowable before anything runs (issue 19): a chart whose `dependencies` are not built, a
//! playbook that does not parse. `validate` fails
//! (exit 2, the file and what to do) and `up` exits 2 at the start with nothing recorded, never a
//! recorded deploy stopped part-way that needs `reset`.

mod common;

use common::{repo_root, Project};
use kubesim::testing::helm_bin;

/// `validate` and `up` both refuse with exit 2, naming `file` and `hint`; `up` leaves no journal.
fn refused_before_anything_runs(p: &Project, file: &str, hint: &str) {
    p.rdeploy(&["validate"]).code(2).stderr_has(file).stderr_has(hint);
    p.rdeploy(&["up"]).code(2).stderr_has(file).stderr_has(hint);
    assert!(!p.exists(".rdeploy/journal.jsonl"), "up recorded a deploy");
    assert_eq!(p.status()["state"], "none");
}

#[test]
fn a_chart_with_unbuilt_dependencies_is_bad_input() {
    let p = Project::new();
    p.file(
        "chart/Chart.yaml",
        "apiVersion: v2\nname: shop\nversion: 0.1.0\ndependencies:\n  - name: redis\n    version: 19.6.4\n    repository: oci://registry-1.docker.io/bitnamicharts\n",
    );
    p.file("chart/templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shop}\n");
    p.stack(&format!(
        "name: app\nsteps:\n  - name: app\n    tool: helm\n    release: shop\n    chart: ./chart\n    namespace: shop\n    binary: {}\n",
        helm_bin(3).display()
    ));
    refused_before_anything_runs(&p, "chart/Chart.yaml", "helm dependency build");
}

#[test]
fn a_playbook_that_does_not_parse_is_bad_input() {
    let bin = repo_root().join(".venv/bin/ansible-playbook");
    assert!(bin.is_file(), "{} is missing: run scripts/setup-ansible.sh", bin.display());
    let p = Project::new();
    p.copy_fixture("ansible", "ansible");
    p.stack(&format!(
        "name: fleet\nsteps:\n  - name: hosts\n    tool: ansible\n    playbook: ansible/broken.yml\n    inventory: ansible/inventory.ini\n    binary: {}\n    env: {{ ANSIBLE_NOCOLOR: \"1\" }}\n",
        bin.display()
    ));
    refused_before_anything_runs(&p, "ansible/broken.yml", "--syntax-check");
}

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
    assert!(!p.exists(&p.state("journal.jsonl")), "up recorded a deploy");
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
        "name: agents\nsteps:\n  - name: hosts\n    tool: ansible\n    playbook: ansible/broken.yml\n    inventory: ansible/inventory.ini\n    binary: {}\n    env: {{ ANSIBLE_NOCOLOR: \"1\" }}\n",
        bin.display()
    ));
    refused_before_anything_runs(&p, "ansible/broken.yml", "--syntax-check");
}

/// helm matches a dependency to a subchart by the subchart's own Chart.yaml `name`
/// (`CheckDependencies` compares `Dependencies()[i].Name()`), so a chart helm installs is not
/// refused because of how its `charts/` entries are called: a vendored `charts/bitnami-redis/`
/// of `name: redis`, and `helm package`'s archive of `memcached` renamed `cache.tgz`. Both helm
/// majors accept the chart, rdeploy `validate` says ok and `up` installs it.
#[test]
fn subcharts_are_found_by_their_own_chart_name_as_helm_finds_them() {
    let sim = kubesim::testing::Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file(
        "chart/Chart.yaml",
        "apiVersion: v2\nname: shop\nversion: 0.1.0\ndependencies:\n  - name: redis\n    version: 17.1.0\n    repository: https://charts.bitnami.com/bitnami\n  - name: memcached\n    version: 6.2.0\n    repository: https://charts.bitnami.com/bitnami\n",
    );
    p.file("chart/templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shop}\n");
    p.file("chart/charts/bitnami-redis/Chart.yaml", "apiVersion: v2\nname: redis\nversion: 17.1.0\n");
    p.file(
        "chart/charts/bitnami-redis/templates/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: redis}\n",
    );
    p.file("memcached/Chart.yaml", "apiVersion: v2\nname: memcached\nversion: 6.2.0\n");
    p.file("memcached/templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: memcached}\n");
    let packaged = std::process::Command::new(helm_bin(3))
        .args(["package", "memcached", "-d", "packaged"])
        .current_dir(p.path("."))
        .output()
        .unwrap();
    assert!(packaged.status.success(), "helm package: {}", String::from_utf8_lossy(&packaged.stderr));
    std::fs::rename(p.path("packaged/memcached-6.2.0.tgz"), p.path("chart/charts/cache.tgz")).unwrap();
    for major in [3, 4] {
        let template = std::process::Command::new(helm_bin(major))
            .args(["template", "shop", "./chart"])
            .current_dir(p.path("."))
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&template.stdout);
        assert!(
            template.status.success(),
            "helm {major} refused the chart: {}",
            String::from_utf8_lossy(&template.stderr)
        );
        assert!(out.contains("name: redis") && out.contains("name: memcached"), "{out}");
    }
    p.stack(&format!(
        "name: app\nsteps:\n  - name: app\n    tool: helm\n    release: shop\n    chart: ./chart\n    namespace: shop\n    context: c1\n    binary: {}\n",
        helm_bin(3).display()
    ));
    p.rdeploy(&["validate"]).code(0);
    p.rdeploy(&["up"]).code(0);
    assert_eq!(
        sim.kubectl_ok(&["get", "configmap", "redis", "-n", "shop", "-o", "jsonpath={.metadata.name}"]),
        "redis"
    );
    assert_eq!(
        sim.kubectl_ok(&["get", "configmap", "memcached", "-n", "shop", "-o", "jsonpath={.metadata.name}"]),
        "memcached"
    );
}

/// A packaged chart that an earlier step makes (`helm package`) may be named as a path,
/// `./web-0.1.0.tgz`, as it may bare: `validate` passes before the archive exists, and `up`
/// packages the chart, then installs the archive with the real helm.
#[test]
fn a_packaged_chart_an_earlier_step_makes_is_installed_by_its_path() {
    let sim = kubesim::testing::Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.env("HELM_BIN", &helm_bin(3).to_string_lossy());
    p.file("web/Chart.yaml", "apiVersion: v2\nname: web\nversion: 0.1.0\n");
    p.file("web/templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\n");
    p.stack(&format!(
        "name: app\nsteps:\n  - name: pack\n    tool: shell\n    run: '\"$HELM_BIN\" package ./web'\n  - name: web\n    tool: helm\n    needs: [pack]\n    release: web\n    chart: ./web-0.1.0.tgz\n    namespace: shop\n    context: c1\n    binary: {}\n",
        helm_bin(3).display()
    ));
    p.rdeploy(&["validate"]).code(0);
    assert!(!p.path("web-0.1.0.tgz").exists(), "validate packaged nothing");
    p.rdeploy(&["up"]).code(0);
    assert!(p.path("web-0.1.0.tgz").is_file());
    assert_eq!(sim.kubectl_ok(&["get", "configmap", "web", "-n", "shop", "-o", "jsonpath={.metadata.name}"]), "web");
}

/// Manifests rdeploy cannot split into objects are found by `validate` from their text, with
/// no cluster (none is running here): YAML that does not parse, documents without `kind` or
/// `metadata.name` (a `generateName` one), a `*List` without `items` and one whose `items` is
/// not a list. Each is named by file, line and document; `up` refuses the same at its start
/// (exit 2, nothing recorded) instead of a recorded deploy stopped at the step. A manifest that
/// splits passes without a cluster to ask about scopes.
#[test]
fn a_manifest_rdeploy_cannot_split_is_bad_input_found_without_a_cluster() {
    let p = Project::new();
    p.file(
        "k8s/app.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ok}\n---\n# the second\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  generateName: job-\n---\napiVersion: v1\nmetadata: {name: nokind}\n",
    );
    p.file("k8s/lists.yaml", "apiVersion: v1\nkind: ConfigMapList\n---\napiVersion: v1\nkind: List\nitems: {a: b}\n---\napiVersion: v1\nkind: ConfigMapList\nitems:\n- metadata: {name: fine}\n- metadata: {labels: {a: b}}\n");
    p.file("k8s/more/broken.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a\ndata: [\n");
    p.file("k8s/fine.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n");
    p.stack(&format!(
        "name: app\nsteps:\n  - name: objects\n    tool: kubectl\n    manifests: [k8s/app.yaml, k8s/lists.yaml, k8s/more]\n    context: nowhere\n    binary: {}\n",
        kubesim::testing::kubectl_bin().display()
    ));
    for args in [&["validate"][..], &["up"][..]] {
        let run = p.rdeploy(args);
        run.code(2)
            .stderr_has("k8s/app.yaml:6: document 2: a ConfigMap has no `metadata.name` (it has `generateName`, which cannot be checkpointed)")
            .stderr_has("k8s/app.yaml:11: document 3: an object has no `kind`")
            .stderr_has("k8s/lists.yaml:1: document 1: a ConfigMapList has no `items`")
            .stderr_has("k8s/lists.yaml:4: document 2: the List's `items` is not a list")
            .stderr_has("k8s/lists.yaml:8: document 3: item 2 of the ConfigMapList: a ConfigMap has no `metadata.name`")
            .stderr_has("k8s/more/broken.yaml:4:5: the YAML does not parse: did not find expected ',' or '}', while parsing a flow mapping")
            .stderr_has("hint: every object needs `apiVersion`, `kind` and `metadata.name`");
        assert!(!run.stderr.contains("app.yaml:1:"), "the good object is not blamed: {}", run.stderr);
    }
    assert!(!p.exists(&p.state("journal.jsonl")), "up recorded a deploy");
    assert_eq!(p.status()["state"], "none");

    p.stack(&format!(
        "name: app\nsteps:\n  - name: objects\n    tool: kubectl\n    manifests: [k8s/fine.yaml]\n    context: nowhere\n    binary: {}\n",
        kubesim::testing::kubectl_bin().display()
    ));
    p.rdeploy(&["validate"]).code(0);
}

/// `validate` and `up` both refuse a bad stack file with exit 2, the problem located (`at`) and
/// said (`why`); `up` records nothing (`status` needs a valid stack file, so the journal is
/// looked for directly).
fn bad_stack_refused(p: &Project, at: &str, why: &str) {
    p.rdeploy(&["validate"]).code(2).stderr_has(at).stderr_has(why);
    p.rdeploy(&["up"]).code(2).stderr_has(at).stderr_has(why);
    assert!(!p.exists(&p.state("journal.jsonl")), "up recorded a deploy");
}

/// Issue 32, point 8: a duration outside its bounds (docs/stack-file.md) is bad input at
/// `validate`, located, never a panic of `up` (`timeout: 18446744073709551615s` overflowed the
/// clock) nor a step that times out at once (`0s`, `1ns`).
#[test]
fn a_duration_outside_its_bounds_is_located_bad_input() {
    let p = Project::new();
    let stack = |key_and_value: &str| {
        format!("name: s\nsteps:\n  - name: a\n    tool: shell\n    {key_and_value}\n    run: echo ran >> out\n")
    };
    for (written, why) in [
        ("timeout: 18446744073709551615s", "is too long: it is a duration from 1s to 7d"),
        ("timeout: 0s", "is too short: it is a duration from 1s to 7d"),
        ("timeout: 1ns", "is too short: it is a duration from 1s to 7d"),
        ("timeout: 8d", "is too long: it is a duration from 1s to 7d"),
        ("retry: { delay: 2d }", "is too long: it is a duration from 0s to 24h"),
        ("retry: { delay: 1s, max_delay: 18446744073709551615s }", "is too long: it is a duration from 0s to 24h"),
    ] {
        p.stack(&stack(written));
        let column = if written.starts_with("retry") { written.rfind(": ").unwrap() + 7 } else { 14 };
        let at = format!("stack.yaml:5:{column}: ");
        bad_stack_refused(&p, &at, why);
        p.rdeploy(&["validate"]).stderr_has("  hint: write a duration from");
        assert!(!p.exists("out"), "{written}: the step ran");
    }
    // The bounds themselves are accepted.
    for written in ["timeout: 1s", "timeout: 7d", "retry: { delay: 0s, max_delay: 24h }"] {
        p.stack(&stack(written));
        p.rdeploy(&["validate"]).code(0);
    }
    // A stack-wide default is held to the same bounds.
    p.stack("name: s\ntimeout: 0s\nsteps:\n  - name: a\n    tool: shell\n    run: echo ran >> out\n");
    bad_stack_refused(&p, "stack.yaml:2:10: ", "`timeout: 0s` is too short");
}

/// Issue 32, point 8: a NUL byte ended the YAML parse early, so the steps after it vanished
/// and `validate` said "1 steps" (exit 0). Every control character YAML forbids is located.
#[test]
fn a_nul_byte_is_located_bad_input_not_a_shorter_stack() {
    let p = Project::new();
    p.stack("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo a >> out\n\0  - name: b\n    tool: shell\n    run: echo b >> out\n");
    bad_stack_refused(&p, "stack.yaml:6:1: the stack file holds a NUL byte here", "  hint: remove it");
    p.stack("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo \u{7}a >> out\n");
    bad_stack_refused(&p, "stack.yaml:5:15: the stack file holds the control character U+0007", "hint:");
    assert!(!p.exists("out"));
}

/// Issue 32, point 8: a value of megabytes validated, then its command failed with `Argument
/// list too long` and a message that echoed the whole value. It is bad input at `validate`,
/// located, and the message stays short.
#[test]
fn a_value_too_long_for_a_command_line_is_located_bad_input() {
    let p = Project::new();
    let big = "x".repeat(2 * 1024 * 1024);
    p.stack(&format!("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo {big} >> out\n"));
    bad_stack_refused(
        &p,
        "stack.yaml:5:10: this value is 2049 KiB; a value in a stack file is at most 100 KiB",
        "hint: put large content in a file",
    );
    let run = p.rdeploy(&["validate"]);
    assert!(run.stderr.len() < 2000, "the message echoes the value: {} bytes", run.stderr.len());
    // Values each short enough that add up to more than a command line holds.
    let part = "y".repeat(90 * 1024);
    let env: String = (0..12).map(|i| format!("      V{i}: {part}\n")).collect();
    p.stack(&format!("name: s\nsteps:\n  - name: a\n    tool: shell\n    env:\n{env}    run: echo ran >> out\n"));
    bad_stack_refused(
        &p,
        "stack.yaml:3:5: this step's values add up to 1081 KiB",
        "hint: move large values into files",
    );
    assert!(!p.exists("out"));
}

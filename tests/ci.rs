//! `rdeploy ci`: up or recover as the checkpoint says, never a re-run from the top; GitHub
//! annotations and step summary; a JUnit report that parses as XML with one case per step.

mod common;

use std::collections::BTreeMap;

use common::{require_tool, Project, Run};
use quick_xml::events::Event;

/// Three sub-changes appending to `out`; the third fails while `fail-three` exists.
const STACK: &str = r#"
name: demo
steps:
  - name: seed
    tool: shell
    sub_changes:
      - { name: one, run: echo one >> out }
      - { name: two, run: echo two >> out }
      - { name: three, run: "if [ -f fail-three ]; then echo 'three: connection refused' >&2; exit 3; fi; echo three >> out" }
  - name: after
    tool: shell
    needs: [seed]
    run: echo after >> out
"#;

/// `rdeploy ci` as GitHub Actions runs it: annotations on, the step summary in the project.
fn ci_github(p: &Project, args: &[&str]) -> Run {
    let mut cmd = p.command(&[&["ci"], args].concat());
    cmd.env("GITHUB_ACTIONS", "true").env("GITHUB_STEP_SUMMARY", p.path("summary.md"));
    Run::from(cmd.output().unwrap(), args)
}

/// `rdeploy ci` outside GitHub.
fn ci_plain(p: &Project, args: &[&str]) -> Run {
    let mut cmd = p.command(&[&["ci"], args].concat());
    cmd.env_remove("GITHUB_ACTIONS").env_remove("GITHUB_STEP_SUMMARY");
    Run::from(cmd.output().unwrap(), args)
}

/// An XML element, parsed fully by quick-xml (mismatched or unclosed tags are errors).
#[derive(Debug, Default)]
struct Element {
    name: String,
    attrs: BTreeMap<String, String>,
    children: Vec<Element>,
    text: String,
}

impl Element {
    fn attr(&self, name: &str) -> &str {
        self.attrs
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("<{}> has no {name}: {:?}", self.name, self.attrs))
    }

    fn all(&self, name: &str) -> Vec<&Element> {
        self.children.iter().filter(|c| c.name == name).collect()
    }

    fn one(&self, name: &str) -> &Element {
        let found = self.all(name);
        assert_eq!(found.len(), 1, "<{}> should have one <{name}>: {self:#?}", self.name);
        found[0]
    }
}

fn element(start: &quick_xml::events::BytesStart<'_>) -> Element {
    let mut el = Element { name: String::from_utf8(start.name().as_ref().to_vec()).unwrap(), ..Element::default() };
    for attr in start.attributes() {
        let attr = attr.expect("well-formed attribute");
        let key = String::from_utf8(attr.key.as_ref().to_vec()).unwrap();
        let value = attr.normalized_value(quick_xml::XmlVersion::default()).expect("attribute unescapes").into_owned();
        assert!(el.attrs.insert(key.clone(), value).is_none(), "duplicate attribute {key}");
    }
    el
}

/// Parses a whole XML document into its root element; panics on any well-formedness error.
fn parse_xml(xml: &str) -> Element {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut stack: Vec<Element> = Vec::new();
    let mut root = None;
    loop {
        let ev =
            reader.read_event().unwrap_or_else(|e| panic!("invalid XML at {}: {e}\n{xml}", reader.buffer_position()));
        match &ev {
            Event::Start(s) => stack.push(element(s)),
            Event::Empty(s) => {
                let el = element(s);
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None => root = Some(el),
                }
            }
            Event::End(_) => {
                let el = stack.pop().expect("an end tag closes an open element");
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None => {
                        assert!(root.is_none(), "more than one root element");
                        root = Some(el);
                    }
                }
            }
            Event::Text(_) | Event::GeneralRef(_) => {
                let text = match &ev {
                    Event::Text(t) => t.decode().expect("text decodes").into_owned(),
                    Event::GeneralRef(r) => match r.resolve_char_ref().expect("a valid character reference") {
                        Some(c) => c.to_string(),
                        None => {
                            let name = r.decode().expect("reference decodes");
                            quick_xml::escape::resolve_predefined_entity(&name)
                                .expect("a predefined entity")
                                .to_string()
                        }
                    },
                    _ => unreachable!(),
                };
                match stack.last_mut() {
                    Some(el) => el.text.push_str(&text),
                    None => assert!(text.trim().is_empty(), "text outside the root: {text:?}"),
                }
            }
            Event::CData(_) | Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => {}
            Event::Eof => break,
        }
    }
    assert!(stack.is_empty(), "unclosed elements: {:?}", stack.iter().map(|e| &e.name).collect::<Vec<_>>());
    root.expect("a root element")
}

/// The JUnit report: `<testsuites>` with one `<testsuite>`, counts matching its test cases.
fn junit(p: &Project, file: &str) -> Element {
    let root = parse_xml(&p.read(file));
    assert_eq!(root.name, "testsuites");
    let suite = root.one("testsuite");
    let cases = suite.all("testcase");
    assert_eq!(suite.attr("tests"), cases.len().to_string());
    let count = |tag: &str| cases.iter().filter(|c| !c.all(tag).is_empty()).count().to_string();
    assert_eq!(suite.attr("failures"), count("failure"));
    assert_eq!(suite.attr("skipped"), count("skipped"));
    assert_eq!(suite.attr("errors"), count("error"));
    assert_eq!(root.attr("tests"), suite.attr("tests"));
    root
}

fn case<'a>(root: &'a Element, name: &str) -> &'a Element {
    root.one("testsuite")
        .all("testcase")
        .into_iter()
        .find(|c| c.attr("name") == name)
        .unwrap_or_else(|| panic!("no test case {name}"))
}

#[test]
fn ci_stops_then_recovers_after_the_fix_without_rerunning_done_work() {
    let p = Project::new();
    p.stack(STACK).file("fail-three", "");

    // First job: no checkpoint, so `up`; it stops at `three`.
    let run = ci_github(&p, &["--junit", "reports/junit.xml"]);
    run.code(1)
        .stderr_has("running `rdeploy up stack.yaml`")
        .stdout_has("::error file=stack.yaml,line=4,title=rdeploy%3A step seed (shell) failed::")
        .stdout_has("three: connection refused")
        .stdout_has("%0Anext: rdeploy recover stack.yaml");
    assert_eq!(p.lines("out"), ["one", "two"]);
    // Plain timestamped lines, no progress bars.
    let ts = regex::Regex::new(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}").unwrap();
    for line in run.stderr.lines().filter(|l| l.contains("ci:") || l.contains("seed:")) {
        assert!(ts.is_match(line), "not a timestamped line: {line:?}");
    }
    let summary = p.read("summary.md");
    for needle in [
        "state: **partial**",
        "| seed | shell | failed | 2 | 1 | 0 | yes |",
        "three: connection refused",
        "exit code: **1**",
        "`rdeploy recover stack.yaml`",
    ] {
        assert!(summary.contains(needle), "summary lacks {needle:?}:\n{summary}");
    }
    let report = junit(&p, "reports/junit.xml");
    let seed = case(&report, "seed");
    assert_eq!(seed.attr("classname"), "demo.shell");
    let failure = seed.one("failure");
    assert!(failure.attr("message").contains("three: connection refused"), "{failure:?}");
    assert!(failure.text.contains("stderr (last lines):\nthree: connection refused"), "{}", failure.text);
    assert!(failure.text.contains("in place: one, two"), "{}", failure.text);
    assert!(failure.text.contains("next: rdeploy recover stack.yaml"), "{}", failure.text);
    assert_eq!(case(&report, "after").one("skipped").attr("message"), "skipped: needs `seed`, which failed");

    // The fix lands between the jobs (the marker goes, a step's command changes): the retry
    // job recovers, reports the change and goes on.
    p.remove("fail-three");
    p.stack(&STACK.replace("echo after >> out", "echo after-fixed >> out"));
    let run = ci_github(&p, &["--junit", "reports/junit.xml"]);
    run.code(0)
        .stderr_has("running `rdeploy recover stack.yaml`, never a re-run from the top")
        .stdout_has("::warning file=stack.yaml,line=10,title=rdeploy%3A step after changed::step `after` changed since the failure")
        .stdout_has("::notice title=rdeploy%3A stack demo deployed::");
    assert!(!run.stderr.contains("running `rdeploy up"), "{}", run.stderr);
    assert_eq!(p.lines("out"), ["one", "two", "three", "after-fixed"], "one and two ran once");
    let summary = p.read("summary.md");
    assert!(
        summary.contains("state: **partial**") && summary.contains("state: **complete**"),
        "appended, not replaced:\n{summary}"
    );
    assert!(summary.contains("step `after` changed since the failure; recover uses the new settings"), "{summary}");
    let report = junit(&p, "reports/junit.xml");
    let suite = report.one("testsuite");
    assert_eq!((suite.attr("tests"), suite.attr("failures"), suite.attr("skipped")), ("2", "0", "0"));
    assert!(case(&report, "seed").all("failure").is_empty());
    assert!(case(&report, "seed").one("system-out").text.contains("three: done"));

    // A finished deploy is history: the next pipeline run is a new `up`.
    ci_plain(&p, &[]).code(0).stderr_has("running `rdeploy up stack.yaml`");
    assert_eq!(p.lines("out").len(), 8);
}

#[test]
fn ci_refuses_a_change_the_checkpoint_cannot_map() {
    let p = Project::new();
    p.stack(STACK).file("fail-three", "");
    ci_github(&p, &[]).code(1);
    p.remove("fail-three");
    p.stack(&STACK.replace("name: seed", "name: seed-renamed").replace("needs: [seed]", "needs: [seed-renamed]"));
    let run = ci_github(&p, &["--junit", "junit.xml"]);
    run.code(2)
        .stderr_has("step `seed` (shell, failed) is recorded in the checkpoint but is no longer in the stack")
        .stdout_has("::error title=rdeploy ci%3A exit 2");
    assert_eq!(p.lines("out"), ["one", "two"], "nothing ran");
    assert!(p.read("summary.md").contains("**Exit 2**: bad input; nothing was changed."));
    let report = junit(&p, "junit.xml");
    let error = case(&report, "rdeploy ci").one("error");
    assert!(error.attr("message").contains("cannot be mapped"), "{error:?}");
    assert!(error.text.contains("hint:"), "{}", error.text);
}

#[test]
fn ci_warns_when_a_completed_step_changed() {
    let p = Project::new();
    let stack = r#"
name: two
steps:
  - name: first
    tool: shell
    sub_changes: [ { name: a, run: echo a >> out } ]
  - name: second
    tool: shell
    needs: [first]
    sub_changes: [ { name: b, run: "test ! -f fail-b && echo b >> out" } ]
"#;
    p.stack(stack).file("fail-b", "");
    ci_plain(&p, &[]).code(1);
    p.remove("fail-b");
    p.stack(&stack.replace("echo a >> out", "echo a2 >> out"));
    let run = ci_github(&p, &[]);
    run.code(0)
        .stdout_has("::warning file=stack.yaml,line=4,title=rdeploy%3A step first changed::step `first` changed after it completed")
        .stderr_has("run `rdeploy up` once this deploy completes");
    assert_eq!(p.lines("out"), ["a", "b"], "recover never re-runs a done step");
}

#[test]
fn ci_keeps_the_exit_codes_of_spec() {
    // A non-resumable step that fails runs its revert: exit 3, and the JUnit case says so.
    let p = Project::new();
    p.stack(
        r#"
name: mig
steps:
  - name: migrate
    tool: shell
    run: "echo half > state; echo 'disk full' >&2; exit 1"
    revert: rm -f state
"#,
    );
    let run = ci_plain(&p, &["--junit", "junit.xml"]);
    run.code(3);
    assert!(!run.stdout.contains("::"), "no annotations outside GitHub:\n{}", run.stdout);
    assert!(!p.exists("state"));
    let report = junit(&p, "junit.xml");
    let failure = case(&report, "migrate").one("failure");
    assert_eq!(failure.attr("type"), "reverted");
    assert!(failure.text.contains("disk full"), "{}", failure.text);

    // A stack file error is exit 2 and annotated at its line.
    let p = Project::new();
    p.stack("name: x\nsteps:\n  - name: a\n    tool: shell\n    rum: echo\n");
    ci_github(&p, &["--junit", "junit.xml"])
        .code(2)
        .stdout_has("::error file=stack.yaml,line=5,title=rdeploy%3A stack file::unknown key `rum` in a shell step%0Ahint: did you mean `run`?");
    junit(&p, "junit.xml");
}

#[test]
fn ci_recovers_a_terraform_step_through_its_plan() {
    require_tool("terraform", "install terraform v1.11 (https://developer.hashicorp.com/terraform/install)");
    let p = Project::new();
    p.copy_fixture("terraform/chain", "chain");
    p.file("chain/prov.sh", &std::fs::read_to_string(common::repo_root().join("fixtures/terraform/prov.sh")).unwrap());
    p.stack(
        r#"
name: infra
steps:
  - name: network
    tool: terraform
    dir: chain
    vars: { rev: "1" }
"#,
    );
    p.file("chain/fail-a5", "");
    ci_github(&p, &["--junit", "junit.xml"])
        .code(1)
        // At terraform's own place: the failing provisioner in the step's dir (issue 31, point 5).
        .stdout_has("::error file=chain/main.tf,line=31,title=rdeploy%3A step network (terraform) failed::");
    let report = junit(&p, "junit.xml");
    let failure = case(&report, "network").one("failure");
    assert!(failure.text.contains("local-exec provisioner error"), "{}", failure.text);
    assert!(
        failure.text.contains("in place: terraform_data.a1, terraform_data.a2, terraform_data.a3, terraform_data.a4"),
        "{}",
        failure.text
    );
    // The live runbook names the addresses and the terraform commands for this configuration.
    p.rdeploy(&["runbook"])
        .code(0)
        .stdout_has("`terraform_data.a5`")
        .stdout_has("cd chain && terraform plan -input=false -out=tfplan -var rev=1");

    p.remove("chain/fail-a5");
    ci_github(&p, &["--junit", "junit.xml"]).code(0).stderr_has("running `rdeploy recover stack.yaml`");
    for i in 1..=6 {
        assert_eq!(p.read(&format!("chain/runs/a{i}.log")).lines().count(), 1, "a{i} ran exactly once");
    }
    let report = junit(&p, "junit.xml");
    assert!(case(&report, "network").all("failure").is_empty());
}

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        // What is at rest: directories and regular files. A link is not followed (one into
        // `/proc` reads a live process's memory, not the disk) and a named pipe holds nothing
        // (reading one with no writer would wait forever).
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if kind.is_file()
            && std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
        {
            found.push(path);
        }
    }
    found
}

/// up (failing while `marker` exists), status, status --json, runbook, ci --junit, then recover
/// (marker removed): asserts no output, no file of the state dir, the JUnit file or the step
/// summary holds `secret`. Returns everything printed, for the caller's own checks.
fn secret_journey(p: &Project, marker: &str, secret: &str) -> String {
    let mut runs = vec![p.rdeploy(&["up"])];
    assert_ne!(runs[0].status, 0, "{}\n{}", runs[0].stdout, runs[0].stderr);
    // Not even left behind by the failed run (a saved plan, a secret values file).
    let left = files_holding(&p.path(&p.state("")), secret);
    assert!(left.is_empty(), "after the failed up: {left:?}");
    runs.push(p.rdeploy(&["status"]));
    runs.push(p.rdeploy(&["status", "--json"]));
    runs.push(p.rdeploy(&["runbook"]));
    runs.push(ci_github(p, &["--junit", "junit.xml"]));
    p.remove(marker);
    runs.push(p.rdeploy(&["recover"]));
    runs.last().unwrap().code(0);
    for run in &runs {
        assert!(!run.stdout.contains(secret) && !run.stderr.contains(secret), "{}\n{}", run.stdout, run.stderr);
    }
    let mut leaks = files_holding(&p.path(&p.state("")), secret);
    for file in ["junit.xml", "summary.md"] {
        assert!(p.exists(file), "{file}");
        if p.read(file).contains(secret) {
            leaks.push(p.path(file));
        }
    }
    assert!(leaks.is_empty(), "{leaks:?}");
    runs.iter().map(|r| format!("{}{}", r.stdout, r.stderr)).collect()
}

/// A shell `env` value whose name says it is secret, echoed by a failing command: after up
/// (failing), status, status --json, runbook, ci --junit and recover, nothing rdeploy wrote or
/// printed holds it, while the command did receive it (it writes the value's digest).
#[test]
fn a_secret_env_value_echoed_by_a_failing_command_is_written_nowhere() {
    use sha2::Digest;
    let p = Project::new();
    p.stack(
        r#"
name: demo
steps:
  - name: seed
    tool: shell
    env: { DB_PASSWORD: SECRETVALUE-sh-7, REGION: eu-west-2 }
    sub_changes:
      - { name: one, run: "printf %s \"$DB_PASSWORD\" | sha256sum | cut -d' ' -f1 > digest" }
      - { name: two, run: "if [ -f fail-two ]; then echo \"login failed for $DB_PASSWORD in $REGION\" >&2; exit 3; fi; echo two >> out" }
"#,
    );
    p.file("fail-two", "");
    let printed = secret_journey(&p, "fail-two", "SECRETVALUE");
    // Plain values print as they are.
    assert!(printed.contains("login failed for *** in eu-west-2"), "{printed}");
    assert_eq!(
        p.read("digest").trim(),
        sha2::Sha256::digest(b"SECRETVALUE-sh-7").iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
}

/// A terraform variable declared `sensitive` in the module, echoed by a failing provisioner: the
/// same journey; terraform got the value (the provisioner writes its digest), and the runbook
/// asks for `export TF_VAR_token=...` while plain vars print in clear.
#[test]
fn a_sensitive_terraform_variable_is_written_nowhere() {
    use sha2::Digest;
    require_tool("terraform", "install terraform v1.11 (https://developer.hashicorp.com/terraform/install)");
    let p = Project::new();
    p.copy_fixture("terraform/secret-env", "infra");
    p.stack(
        r#"
name: demo
steps:
  - name: infra
    tool: terraform
    dir: infra
    vars: { token: SECRETVALUE-tf-1, enabled: false, region: eu-west-2 }
"#,
    );
    p.file("infra/fail-secret", "");
    let printed = secret_journey(&p, "infra/fail-secret", "SECRETVALUE");
    assert!(printed.contains("export TF_VAR_token="), "{printed}");
    assert!(printed.contains("-var enabled=false") && printed.contains("-var region=eu-west-2"), "{printed}");
    assert_eq!(
        p.read("infra/token.sha256").trim(),
        sha2::Sha256::digest(b"SECRETVALUE-tf-1").iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
}

/// An ansible extra var whose name is secret, printed by a failing task: the same journey;
/// ansible got the value (the play writes its digest) and plain extra vars print in clear.
#[test]
fn a_secret_ansible_extra_var_is_written_nowhere() {
    use sha2::Digest;
    let binary = common::repo_root().join(".venv/bin/ansible-playbook");
    assert!(binary.is_file(), "{} is missing: run scripts/setup-ansible.sh", binary.display());
    let p = Project::new();
    p.file("inventory.ini", "[web]\nweb1\n\n[web:vars]\nansible_connection=local\nansible_python_interpreter={{ ansible_playbook_python }}\n");
    p.file(
        "play.yml",
        r#"- hosts: web1
  gather_facts: false
  tasks:
    - name: write the digest of the password
      ansible.builtin.copy:
        content: "{{ db_password | hash('sha256') }}"
        dest: "{{ playbook_dir }}/digest"
    - name: fail quoting it
      ansible.builtin.fail:
        msg: "rejected password {{ db_password }} in {{ region }}"
      when: (playbook_dir ~ '/fail-play') is exists
"#,
    );
    p.stack(&format!(
        r#"
name: demo
steps:
  - name: hosts
    tool: ansible
    playbook: play.yml
    inventory: inventory.ini
    binary: {}
    env: {{ ANSIBLE_NOCOLOR: "1" }}
    extra_vars: {{ db_password: SECRETVALUE-ans-1, region: eu-west-2 }}
"#,
        binary.display()
    ));
    p.file("fail-play", "");
    let printed = secret_journey(&p, "fail-play", "SECRETVALUE");
    assert!(printed.contains("rejected password *** in eu-west-2"), "{printed}");
    assert_eq!(
        p.read("digest").trim(),
        sha2::Sha256::digest(b"SECRETVALUE-ans-1").iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
}

/// A helm `set` value whose key names a secret, quoted by a failing chart: the same journey
/// against kubesim with helm 4; helm got the value (the chart's error prints its digest) and a
/// plain value prints in clear.
#[test]
fn a_secret_helm_value_quoted_by_a_failing_chart_is_written_nowhere() {
    use kubesim::testing::{helm_bin, kubectl_bin, Kubesim};
    use sha2::Digest;
    kubectl_bin();
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file("chart/Chart.yaml", "apiVersion: v2\nname: quoting\nversion: 0.1.0\n");
    p.file(
        "chart/templates/cm.yaml",
        r#"{{ if .Files.Get "fail-marker" }}{{ fail (printf "rejected password %s (sha256 %s) for tier %s" .Values.db.password (sha256sum .Values.db.password) .Values.tier) }}{{ end }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-config
data:
  tier: {{ .Values.tier | quote }}
"#,
    );
    p.file("chart/fail-marker", "1");
    p.stack(&format!(
        r#"
name: demo
steps:
  - name: app
    tool: helm
    release: web
    chart: chart
    namespace: shop
    context: c1
    set: {{ db.password: SECRETVALUE-helm-1, tier: gold }}
    timeout: 60s
    binary: {}
"#,
        helm_bin(4).display()
    ));
    let printed = secret_journey(&p, "chart/fail-marker", "SECRETVALUE");
    let digest = sha2::Sha256::digest(b"SECRETVALUE-helm-1").iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert!(printed.contains(&format!("rejected password *** (sha256 {digest}) for tier gold")), "{printed}");
}

/// The journey of [`secret_journey`] for a value the stack marks secret, plus: the step's log
/// carries the tool's output with the value redacted (`redacted_line` is in some file of the
/// state dir), so the check is not vacuous.
fn marked_secret_journey(p: &Project, marker: &str, secret: &str, redacted_line: &str) -> String {
    let printed = secret_journey(p, marker, secret);
    assert!(!files_holding(&p.path(&p.state("logs")), redacted_line).is_empty(), "no log holds {redacted_line:?}");
    printed
}

/// A shell `env` value read `{ from_env: ... }` under a name that says nothing of secrets: the
/// command gets it through its environment, the failure quoting it is redacted everywhere, and
/// recover (with the variable still set) finishes; the value is written nowhere.
#[test]
fn a_shell_env_value_from_env_is_passed_and_written_nowhere() {
    let mut p = Project::new();
    p.env("CI_LOGIN_VALUE", "SECRETVALUE-sh-env-2");
    p.stack(
        r#"
name: demo
steps:
  - name: seed
    tool: shell
    env: { APP_LOGIN: { from_env: CI_LOGIN_VALUE }, REGION: eu-west-2 }
    sub_changes:
      - { name: one, run: "printf %s \"$APP_LOGIN\" > received" }
      - { name: two, run: "if [ -f fail-two ]; then echo \"login failed for $APP_LOGIN in $REGION\" >&2; exit 3; fi; echo two >> out" }
"#,
    );
    p.file("fail-two", "");
    let printed = marked_secret_journey(&p, "fail-two", "SECRETVALUE", "login failed for *** in eu-west-2");
    assert!(printed.contains("login failed for *** in eu-west-2"), "{printed}");
    // The runbook says what to export and where the value comes from.
    assert!(printed.contains("export APP_LOGIN=...  # secret, from_env: CI_LOGIN_VALUE"), "{printed}");
    assert_eq!(p.read("received"), "SECRETVALUE-sh-env-2");
    assert_eq!(p.read("out"), "two\n");
}

/// Every tool inherits rdeploy's environment, so a step that runs before the one reading a
/// `from_env` secret can print it (`env`, `set -x`, a debug log): the value is known from the
/// start of the run, and that earlier step's output is redacted too, in every file and output.
#[test]
fn a_from_env_secret_printed_by_an_earlier_step_is_redacted_there_too() {
    let mut p = Project::new();
    p.env("CI_DEPLOY_TOKEN", "SECRETVALUE-early-3");
    p.stack(
        r#"
name: demo
steps:
  - name: debug
    tool: shell
    sub_changes:
      - { name: show, run: "echo \"token is $CI_DEPLOY_TOKEN\"; echo \"failing with $CI_DEPLOY_TOKEN\" >&2; [ ! -f fail-show ]" }
  - name: use
    tool: shell
    needs: [debug]
    env: { LOGIN: { from_env: CI_DEPLOY_TOKEN } }
    run: printf %s "$LOGIN" > received
"#,
    );
    p.file("fail-show", "");
    let printed = marked_secret_journey(&p, "fail-show", "SECRETVALUE", "token is ***");
    assert!(printed.contains("failing with ***"), "{printed}");
    assert_eq!(p.read("received"), "SECRETVALUE-early-3");
}

/// A `from_env` variable that is not set fails the step before its tool starts, naming the
/// variable; once it is set, recover runs the step.
#[test]
fn a_missing_from_env_variable_fails_the_step_before_its_tool_starts() {
    let mut p = Project::new();
    p.stack(
        r#"
name: demo
steps:
  - name: seed
    tool: shell
    env: { APP_LOGIN: { from_env: RDEPLOY_TEST_UNSET_LOGIN } }
    run: printf %s "$APP_LOGIN" > received
"#,
    );
    p.rdeploy(&["validate"]).code(0);
    let up = p.rdeploy(&["up"]);
    assert_ne!(up.status, 0, "{}\n{}", up.stdout, up.stderr);
    let both = format!("{}{}", up.stdout, up.stderr);
    assert!(both.contains("`RDEPLOY_TEST_UNSET_LOGIN` is not set"), "{both}");
    assert!(both.contains("env.APP_LOGIN"), "{both}");
    assert!(!p.exists("received"), "the command ran");
    p.env("RDEPLOY_TEST_UNSET_LOGIN", "SECRETVALUE-late");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.read("received"), "SECRETVALUE-late");
    assert!(files_holding(&p.path(&p.state("")), "SECRETVALUE").is_empty());
}

/// A terraform variable the module does not declare sensitive, marked `{ value: V, secret: true }`
/// in the stack: it reaches terraform as `TF_VAR_greeting` (the provisioner writes what it got),
/// the second resource's failure quoting it is redacted everywhere, the runbook asks for
/// `export TF_VAR_greeting=...`, and recover creates only the second resource.
#[test]
fn a_terraform_var_marked_secret_is_passed_in_the_environment_and_written_nowhere() {
    require_tool("terraform", "install terraform v1.11 (https://developer.hashicorp.com/terraform/install)");
    let p = Project::new();
    p.copy_fixture("terraform/marked-secret", "infra");
    p.stack(
        r#"
name: demo
steps:
  - name: infra
    tool: terraform
    dir: infra
    vars: { greeting: { value: SECRETVALUE-tf-2, secret: true } }
"#,
    );
    p.file("infra/fail-second", "");
    let printed = marked_secret_journey(&p, "infra/fail-second", "SECRETVALUE", "rejected greeting ***");
    assert!(printed.contains("export TF_VAR_greeting=..."), "{printed}");
    assert!(printed.contains("greeting=*** (secret: true)"), "{printed}");
    assert_eq!(p.read("infra/received"), "SECRETVALUE-tf-2");
    assert_eq!(p.read("infra/runs"), "second\n", "the second resource was created once");
}

/// A one-character secret: the tools' JSON is parsed before it is redacted, so terraform's
/// `-json` stream (where `a` is in every line) still yields every resource, and the checkpoint's
/// ids (`terraform_data.first`) are names, not redacted.
#[test]
fn a_one_character_secret_does_not_corrupt_parsing_or_the_checkpoint() {
    require_tool("terraform", "install terraform v1.11 (https://developer.hashicorp.com/terraform/install)");
    let p = Project::new();
    p.copy_fixture("terraform/marked-secret", "infra");
    p.stack(
        r#"
name: demo
steps:
  - name: infra
    tool: terraform
    dir: infra
    vars: { greeting: { value: a, secret: true } }
"#,
    );
    p.rdeploy(&["up"]).code(0);
    let status = p.status();
    assert_eq!(
        common::sub_statuses(&status, "infra"),
        vec![("terraform_data.first".to_string(), "done".to_string()), ("terraform_data.second".into(), "done".into())]
    );
    assert_eq!(p.read("infra/received"), "a");
}

/// An ansible extra var read `{ from_file: ... }` (its trailing newline trimmed) under a name
/// that says nothing of secrets: ansible gets it through `-e @file` (each host writes what it
/// got), web2's failure quoting it is redacted everywhere, and recover runs web2 only.
#[test]
fn an_ansible_extra_var_from_file_is_passed_in_a_file_and_written_nowhere() {
    let binary = common::repo_root().join(".venv/bin/ansible-playbook");
    assert!(binary.is_file(), "{} is missing: run scripts/setup-ansible.sh", binary.display());
    let p = Project::new();
    p.file(
        "inventory.ini",
        "[web]\nweb1\nweb2\n\n[web:vars]\nansible_connection=local\nansible_python_interpreter={{ ansible_playbook_python }}\n",
    );
    p.file(
        "play.yml",
        r#"- hosts: web
  gather_facts: false
  tasks:
    - name: write what the host got
      ansible.builtin.copy:
        content: "{{ login }}"
        dest: "{{ playbook_dir }}/received-{{ inventory_hostname }}"
    - name: fail quoting it on web2
      ansible.builtin.fail:
        msg: "rejected login {{ login }} in {{ region }}"
      when: inventory_hostname == 'web2' and (playbook_dir ~ '/fail-web2') is exists
    - name: count the runs
      ansible.builtin.shell: "echo {{ inventory_hostname }} >> {{ playbook_dir }}/runs"
"#,
    );
    p.file("secrets/login.txt", "SECRETVALUE-ans-2\n");
    p.stack(&format!(
        r#"
name: demo
steps:
  - name: hosts
    tool: ansible
    playbook: play.yml
    inventory: inventory.ini
    binary: {}
    env: {{ ANSIBLE_NOCOLOR: "1" }}
    extra_vars: {{ login: {{ from_file: secrets/login.txt }}, region: eu-west-2 }}
"#,
        binary.display()
    ));
    p.file("fail-web2", "");
    let printed = marked_secret_journey(&p, "fail-web2", "SECRETVALUE", "rejected login *** in eu-west-2");
    assert!(printed.contains("login=*** (from_file: secrets/login.txt)"), "{printed}");
    assert_eq!(p.read("received-web1"), "SECRETVALUE-ans-2");
    assert_eq!(p.read("received-web2"), "SECRETVALUE-ans-2");
    let mut runs = p.lines("runs");
    runs.sort();
    assert_eq!(runs, vec!["web1", "web2"], "each host ran once");
}

/// rdeploy killed with `kill -9` while ansible runs, after tasks printed a marked secret: in
/// a `debug` message, a `--diff` of a file holding it (`diff: true`) and an ignored failure.
/// Nothing under the state directory holds it: not the callback's records of those results,
/// not the extra vars ansible reads it from (both are files with no name on disk), not the
/// journal or the log. recover then finishes the play, and still nothing holds it.
#[test]
fn a_kill_9_during_an_ansible_step_leaves_no_secret_in_the_state_dir() {
    let binary = common::repo_root().join(".venv/bin/ansible-playbook");
    assert!(binary.is_file(), "{} is missing: run scripts/setup-ansible.sh", binary.display());
    let mut p = Project::new();
    p.env("CI_DB_LOGIN", "SECRETVALUE-kill-9");
    p.file(
        "inventory.ini",
        "[web]\nweb1\n\n[web:vars]\nansible_connection=local\nansible_python_interpreter={{ ansible_playbook_python }}\n",
    );
    p.file(
        "play.yml",
        r#"- hosts: web
  gather_facts: false
  tasks:
    - name: say it
      ansible.builtin.debug:
        msg: "the login is {{ login }}"
    - name: write it, with its diff
      ansible.builtin.copy:
        content: "login={{ login }}\n"
        dest: "{{ playbook_dir }}/app.conf"
      diff: true
    - name: fail quoting it
      ansible.builtin.fail:
        msg: "rejected {{ login }}"
      ignore_errors: true
    - name: say where it is
      ansible.builtin.file:
        path: "{{ playbook_dir }}/reached"
        state: touch
    - name: wait to be let go
      ansible.builtin.wait_for:
        path: "{{ playbook_dir }}/go"
        timeout: 300
"#,
    );
    p.stack(&format!(
        r#"
name: demo
steps:
  - name: hosts
    tool: ansible
    playbook: play.yml
    inventory: inventory.ini
    binary: {}
    env: {{ ANSIBLE_NOCOLOR: "1" }}
    extra_vars: {{ login: {{ from_env: CI_DB_LOGIN }} }}
"#,
        binary.display()
    ));
    let mut child = p.spawn(&["up"]);
    p.wait_for("reached", std::time::Duration::from_secs(120));
    // The callback's records of the three results are written before the next task starts.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let left = files_holding(&p.path(&p.state("")), "SECRETVALUE");
    assert!(left.is_empty(), "after kill -9 mid-run: {left:?}");
    assert_eq!(p.read("app.conf"), "login=SECRETVALUE-kill-9\n", "ansible had the secret");

    p.file("go", "");
    p.rdeploy(&["recover"]).code(0);
    let left = files_holding(&p.path(&p.state("")), "SECRETVALUE");
    assert!(left.is_empty(), "after recover: {left:?}");
}

/// A helm `set` value read `{ from_env: ... }` under a key that says nothing of secrets, quoted
/// by a failing chart: helm gets it in a 0600 values file, the failure is redacted everywhere,
/// and after recover the chart has rendered the value into a ConfigMap in kubesim.
#[test]
fn a_helm_set_value_from_env_is_passed_in_a_file_and_written_nowhere() {
    use kubesim::testing::{helm_bin, kubectl_bin, Kubesim};
    let kubectl = kubectl_bin();
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.env("CI_APP_LOGIN", "SECRETVALUE-helm-2");
    p.file("chart/Chart.yaml", "apiVersion: v2\nname: quoting\nversion: 0.1.0\n");
    p.file(
        "chart/templates/cm.yaml",
        r#"{{ if .Files.Get "fail-marker" }}{{ fail (printf "rejected login %s for tier %s" .Values.app.login .Values.tier) }}{{ end }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-config
data:
  tier: {{ .Values.tier | quote }}
  login: {{ .Values.app.login | quote }}
"#,
    );
    p.file("chart/fail-marker", "1");
    p.stack(&format!(
        r#"
name: demo
steps:
  - name: app
    tool: helm
    release: web
    chart: chart
    namespace: shop
    context: c1
    set: {{ app.login: {{ from_env: CI_APP_LOGIN }}, tier: gold }}
    timeout: 60s
    binary: {}
"#,
        helm_bin(4).display()
    ));
    let printed = marked_secret_journey(&p, "chart/fail-marker", "SECRETVALUE", "rejected login *** for tier gold");
    assert!(printed.contains("app.login=*** (from_env: CI_APP_LOGIN)"), "{printed}");
    let got = std::process::Command::new(kubectl)
        .envs(sim.env())
        .args(["--context", "c1", "-n", "shop", "get", "configmap", "web-config", "-o", "jsonpath={.data.login}"])
        .output()
        .unwrap();
    assert!(got.status.success(), "{}", String::from_utf8_lossy(&got.stderr));
    assert_eq!(String::from_utf8_lossy(&got.stdout), "SECRETVALUE-helm-2");
}

/// A stand-in for a tool binary: the real tool, except that a command whose words hold `held`
/// waits until `go` exists, after touching `started` (so rdeploy has laid out the secret values
/// the command reads, and the tool has not read them yet).
fn held_tool(p: &Project, name: &str, real: &std::path::Path, held: &str) -> std::path::PathBuf {
    let script = format!(
        "#!/bin/sh\ncase \" $* \" in *'{held}'*) : > '{dir}/started'; while [ ! -f '{dir}/go' ]; do sleep 0.05; done;; esac\nexec '{real}' \"$@\"\n",
        dir = p.path(".").display(),
        real = real.display()
    );
    p.file(name, &script);
    let path = p.path(name);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// kill -9 of rdeploy, then waits until no tool it started is left (each got its graceful
/// signal and ends on its own).
fn kill_9_and_wait_for_its_tools(p: &Project, mut child: std::process::Child) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let running = p.path(&p.state("running"));
    let start = std::time::Instant::now();
    while !rdeploy_adapters::process::surviving_children(&running).is_empty() {
        assert!(start.elapsed() < std::time::Duration::from_secs(120), "a tool never ended after rdeploy died");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Issue 32, point 7: rdeploy killed with `kill -9` while terraform applies, after a provisioner
/// printed a value the stack marks secret (terraform prints it: the module does not declare it
/// sensitive). terraform's raw `-json` stream stayed in `.rdeploy/steps/*/apply.jsonl` in clear;
/// it is a memory file now, and nothing under the state dir holds the value. recover finishes.
#[test]
fn a_kill_9_during_a_terraform_apply_leaves_no_secret_at_rest() {
    require_tool("terraform", "install terraform v1.11 (https://developer.hashicorp.com/terraform/install)");
    let p = Project::new();
    p.file(
        "infra/main.tf",
        r#"variable "greeting" {
  type = string
}

resource "terraform_data" "speak" {
  provisioner "local-exec" {
    environment = { GREETING = var.greeting }
    command     = "echo \"the greeting is $GREETING\"; : > said; while [ ! -f go ]; do sleep 0.05; done"
  }
}
"#,
    );
    p.stack(
        r#"
name: demo
steps:
  - name: infra
    tool: terraform
    dir: infra
    vars: { greeting: { value: SECRETVALUE-tf-kill, secret: true } }
"#,
    );
    let child = p.spawn(&["up"]);
    // The line went through terraform's stream once rdeploy's log has it.
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(p.path(&p.state("logs/infra.log"))).is_ok_and(|l| l.contains("the greeting is ***"))
    {
        assert!(start.elapsed() < std::time::Duration::from_secs(120), "the provisioner never spoke");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    kill_9_and_wait_for_its_tools(&p, child);
    let left = files_holding(&p.path(".rdeploy"), "SECRETVALUE");
    assert!(left.is_empty(), "after kill -9 mid-apply: {left:?}");

    p.file("infra/go", "");
    p.rdeploy(&["recover"]).code(0);
    let left = files_holding(&p.path(".rdeploy"), "SECRETVALUE");
    assert!(left.is_empty(), "after recover: {left:?}");
    assert!(p.read(&p.state("logs/infra.log")).contains("the greeting is ***"), "the log holds the line, redacted");
}

/// Issue 32, point 7: rdeploy killed with `kill -9` while helm runs with a secret `set` value:
/// `secret-values.json` stayed in clear in the step's work dir. The values now live in memory
/// (helm reads them through a link into rdeploy's `/proc`), and nothing under the state dir
/// holds them; recover installs the release with the value.
#[test]
fn a_kill_9_during_a_helm_upgrade_leaves_no_secret_value_at_rest() {
    use kubesim::testing::{helm_bin, kubectl_bin, Kubesim};
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file("chart/Chart.yaml", "apiVersion: v2\nname: held\nversion: 0.1.0\n");
    p.file(
        "chart/templates/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-config\ndata:\n  login: {{ .Values.login | quote }}\n",
    );
    let helm = held_tool(&p, "helm-held", &helm_bin(4), " upgrade ");
    p.stack(&format!(
        "name: demo\nsteps:\n  - name: app\n    tool: helm\n    release: web\n    chart: chart\n    namespace: shop\n    context: c1\n    set: {{ login: {{ from_env: CI_LOGIN }} }}\n    timeout: 60s\n    binary: {}\n",
        helm.display()
    ));
    p.env("CI_LOGIN", "SECRETVALUE-helm-kill");
    let child = p.spawn(&["up"]);
    p.wait_for("started", std::time::Duration::from_secs(120));
    kill_9_and_wait_for_its_tools(&p, child);
    let left = files_holding(&p.path(".rdeploy"), "SECRETVALUE");
    assert!(left.is_empty(), "after kill -9 mid-upgrade: {left:?}");

    p.file("go", "");
    p.rdeploy(&["recover"]).code(0);
    let left = files_holding(&p.path(".rdeploy"), "SECRETVALUE");
    assert!(left.is_empty(), "after recover: {left:?}");
    let got = std::process::Command::new(kubectl_bin())
        .args(["--context", "c1", "-n", "shop", "get", "configmap", "web-config", "-o", "jsonpath={.data.login}"])
        .envs(sim.env())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&got.stdout), "SECRETVALUE-helm-kill", "helm read the value");
}

/// Issue 32, point 7: rdeploy killed with `kill -9` after it laid out ansible's secret extra
/// vars and before ansible read them: `secret-vars.json` stayed in clear. They are served
/// through a named pipe now, which holds nothing at rest; recover runs the play with the value.
#[test]
fn a_kill_9_before_ansible_reads_its_secret_vars_leaves_none_at_rest() {
    let binary = common::repo_root().join(".venv/bin/ansible-playbook");
    assert!(binary.is_file(), "{} is missing: run scripts/setup-ansible.sh", binary.display());
    let mut p = Project::new();
    p.env("CI_DB_LOGIN", "SECRETVALUE-ans-kill");
    p.file(
        "inventory.ini",
        "[web]\nweb1\n\n[web:vars]\nansible_connection=local\nansible_python_interpreter={{ ansible_playbook_python }}\n",
    );
    p.file(
        "play.yml",
        "- hosts: web\n  gather_facts: false\n  tasks:\n    - name: write it\n      ansible.builtin.copy:\n        content: \"{{ login }}\"\n        dest: \"{{ playbook_dir }}/received\"\n",
    );
    let held = held_tool(&p, "ansible-held", &binary, "secret-vars.json");
    p.stack(&format!(
        "name: demo\nsteps:\n  - name: hosts\n    tool: ansible\n    playbook: play.yml\n    inventory: inventory.ini\n    binary: {}\n    env: {{ ANSIBLE_NOCOLOR: \"1\" }}\n    extra_vars: {{ login: {{ from_env: CI_DB_LOGIN }} }}\n",
        held.display()
    ));
    let child = p.spawn(&["up"]);
    p.wait_for("started", std::time::Duration::from_secs(120));
    kill_9_and_wait_for_its_tools(&p, child);
    let left = files_holding(&p.path(".rdeploy"), "SECRETVALUE");
    assert!(left.is_empty(), "after kill -9 before ansible read its vars: {left:?}");

    p.file("go", "");
    p.rdeploy(&["recover"]).code(0);
    let left = files_holding(&p.path(".rdeploy"), "SECRETVALUE");
    assert!(left.is_empty(), "after recover: {left:?}");
    assert_eq!(p.read("received"), "SECRETVALUE-ans-kill", "ansible read the value");
}

/// Issue 31, point 5: a failure the tool places in the operator's files is annotated there, not
/// on the step's line: a kubectl object at the line its document starts on (the stack file in a
/// subdirectory, so the path is the checkout's), a terraform error at terraform's own line.
#[test]
fn github_annotations_point_at_the_failing_manifest_document_and_terraform_line() {
    use kubesim::testing::{kubectl_bin, Kubesim};
    let sim = Kubesim::start("c1");
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file(
        "deploy/m/c.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: one}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: two}\n---\n# the third\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: three, namespace: nope}\n",
    );
    p.file(
        "deploy/stack.yaml",
        &format!(
            "name: k\nsteps:\n  - name: objs\n    tool: kubectl\n    manifests: [m/c.yaml]\n    context: c1\n    binary: {}\n",
            kubectl_bin().display()
        ),
    );
    let run = ci_github(&p, &["deploy/stack.yaml"]);
    run.code(1);
    run.stdout_has("::error file=deploy/m/c.yaml,line=10,title=rdeploy%3A step objs (kubectl) failed::");
    run.stdout_has("(m/c.yaml, document 3)");
    assert!(!run.stdout.contains(".json"), "{}", run.stdout);
    let status = p.rdeploy(&["status", "--json", "deploy/stack.yaml"]);
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(common::step(&status, "objs")["location"], serde_json::json!({ "file": "m/c.yaml", "line": 10 }));

    require_tool("terraform", "install terraform (https://developer.hashicorp.com/terraform/install)");
    let t = Project::new();
    t.file(
        "infra/main.tf",
        "resource \"terraform_data\" \"a\" {\n  input = \"x\"\n}\n\noutput \"x\" {\n  value = var.nope\n}\n",
    );
    t.stack("name: t\nsteps:\n  - name: infra\n    tool: terraform\n    dir: infra\n");
    let run = ci_github(&t, &[]);
    run.code(1);
    run.stdout_has("::error file=infra/main.tf,line=6,title=rdeploy%3A step infra (terraform) failed::");
    run.stdout_has("(on main.tf line 6)");
}

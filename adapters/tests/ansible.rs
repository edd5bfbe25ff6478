//! End-to-end tests of the ansible adapter against real ansible-core (from `.venv`, made by
//! `scripts/setup-ansible.sh`): per-host checkpoints, unreachable versus failed, aborted plays,
//! serial batches and recovery with `--limit`, proven by per-host side-effect files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rdeploy_adapters::ansible::AnsibleSpec;
use rdeploy_adapters::testing::{step_context, Recorder};
use rdeploy_adapters::{Adapter, Event, Failure, PriorStep, Recovered, StepContext, SubStatus, ToolSpec};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The venv's bin dir; a missing ansible is a loud failure, never a skip.
fn venv_bin() -> PathBuf {
    let bin = repo().join(".venv/bin");
    assert!(
        bin.join("ansible-playbook").is_file(),
        "ansible-playbook is missing from {}: run scripts/setup-ansible.sh",
        bin.display()
    );
    bin
}

/// A temp stack dir holding copies of the fixtures, plus `out/` and `markers/`.
struct Stack {
    dir: tempfile::TempDir,
}

impl Stack {
    fn new() -> Stack {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(repo().join("fixtures/ansible")).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
            }
        }
        std::fs::create_dir_all(dir.path().join("out")).unwrap();
        std::fs::create_dir_all(dir.path().join("markers")).unwrap();
        Stack { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn fail(&self, host: &str) {
        std::fs::write(self.path().join("markers").join(format!("fail-{host}")), "").unwrap();
    }

    fn heal(&self, host: &str) {
        std::fs::remove_file(self.path().join("markers").join(format!("fail-{host}"))).unwrap();
    }

    /// The lines `host` appended to its side-effect file.
    fn log(&self, host: &str) -> Vec<String> {
        std::fs::read_to_string(self.path().join("out").join(format!("{host}.log")))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    fn spec(&self, playbook: &str, inventory: &str) -> AnsibleSpec {
        AnsibleSpec {
            marked: Default::default(),
            playbook: playbook.into(),
            inventory: inventory.into(),
            limit: None,
            extra_vars: BTreeMap::from([
                ("out".to_string(), serde_json::json!(self.path().join("out"))),
                ("markers".to_string(), serde_json::json!(self.path().join("markers"))),
            ]),
            tags: Vec::new(),
            binary: None,
            recover: None,
        }
    }

    fn ctx(&self) -> StepContext {
        let path = format!("{}:{}", venv_bin().display(), std::env::var("PATH").unwrap_or_default());
        StepContext {
            step: "hosts".into(),
            work_dir: self.path().join(".rdeploy/work/hosts"),
            env: BTreeMap::from([("PATH".to_string(), path), ("ANSIBLE_NOCOLOR".to_string(), "1".to_string())]),
            timeout: Some(std::time::Duration::from_secs(300)),
            ..step_context(self.path())
        }
    }
}

async fn apply(stack: &Stack, spec: &AnsibleSpec) -> (Recorder, Result<(), Failure>) {
    let sink = Recorder::default();
    let result = ToolSpec::Ansible(spec.clone()).apply(&stack.ctx(), &sink).await;
    (sink, result)
}

async fn recover(stack: &Stack, spec: &AnsibleSpec, prior: &PriorStep) -> (Recorder, Result<Recovered, Failure>) {
    let sink = Recorder::default();
    let result = ToolSpec::Ansible(spec.clone()).recover(&stack.ctx(), prior, &sink).await;
    (sink, result)
}

fn status_of(prior: &PriorStep, host: &str) -> SubStatus {
    prior.status_of(host).unwrap_or_else(|| panic!("{host} was not recorded: {prior:?}"))
}

const WEB: [&str; 5] = ["web1", "web2", "web3", "web4", "web5"];

#[tokio::test]
async fn one_failing_host_of_five_is_failed_and_recover_touches_only_it() {
    let stack = Stack::new();
    let spec = stack.spec("site.yml", "inventory.ini");
    stack.fail("web3");

    let (sink, result) = apply(&stack, &spec).await;
    let failure = result.unwrap_err();
    assert_eq!(failure.exit_code, Some(2));
    assert!(failure.summary.contains("1 failed, 4 done"), "{}", failure.summary);
    assert!(
        failure.summary.contains("web3: task `check for injected failure` failed: injected failure on web3"),
        "{}",
        failure.summary
    );
    assert!(failure.hint.as_deref().unwrap().ends_with("with `--limit web3`"), "{:?}", failure.hint);
    assert_eq!(sink.events()[0], Event::Planned { ids: WEB.iter().map(|h| h.to_string()).collect() });
    assert_eq!(sink.error_of("web3").unwrap(), "task `check for injected failure` failed: injected failure on web3");
    let prior = sink.prior();
    for host in ["web1", "web2", "web4", "web5"] {
        assert_eq!(status_of(&prior, host), SubStatus::Done, "{host}");
        assert_eq!(stack.log(host), vec!["start site", "finish site"]);
    }
    assert_eq!(status_of(&prior, "web3"), SubStatus::Failed);
    assert_eq!(stack.log("web3"), vec!["start site"]);

    let inspection = ToolSpec::Ansible(spec.clone()).inspect(&stack.ctx(), &prior).await.unwrap();
    assert_eq!(inspection.remaining, vec!["web3"]);

    stack.heal("web3");
    let (sink, result) = recover(&stack, &spec, &prior).await;
    result.unwrap();
    assert_eq!(sink.started(), vec!["web3"], "only web3 ran");
    assert!(sink.events().iter().any(|e| matches!(e, Event::Done { id, .. } if id == "web3")));
    assert_eq!(stack.log("web3"), vec!["start site", "start site", "finish site"]);
    for host in ["web1", "web2", "web4", "web5"] {
        assert_eq!(stack.log(host), vec!["start site", "finish site"], "{host} was not touched");
    }
}

#[tokio::test]
async fn unreachable_and_failed_hosts_are_told_apart_and_both_recovered() {
    let stack = Stack::new();
    let spec = stack.spec("site.yml", "inventory-unreachable.ini");
    stack.fail("web2");

    let (sink, result) = apply(&stack, &spec).await;
    let failure = result.unwrap_err();
    assert_eq!(failure.exit_code, Some(4));
    assert!(failure.summary.contains("(one or more hosts were unreachable)"), "{}", failure.summary);
    assert!(failure.summary.contains("1 failed, 1 unreachable, 3 done"), "{}", failure.summary);
    let db1 = sink.error_of("db1").unwrap();
    assert!(db1.starts_with("unreachable: task `record start`: "), "{db1}");
    let web2 = sink.error_of("web2").unwrap();
    assert!(!web2.starts_with("unreachable:") && web2.contains("injected failure on web2"), "{web2}");
    let prior = sink.prior();
    assert_eq!(status_of(&prior, "web1"), SubStatus::Done);

    // web2 is healed, db1 is still down: recover re-runs exactly those two.
    stack.heal("web2");
    let (sink, result) = recover(&stack, &spec, &prior).await;
    let failure = result.unwrap_err();
    assert_eq!(sink.started(), vec!["db1", "web2"]);
    assert!(sink.events().iter().any(|e| matches!(e, Event::Done { id, .. } if id == "web2")));
    assert!(sink.error_of("db1").unwrap().starts_with("unreachable:"));
    assert!(failure.hint.as_deref().unwrap().ends_with("`--limit db1`"), "{:?}", failure.hint);
    assert_eq!(stack.log("web1"), vec!["start site", "finish site"]);
    assert_eq!(stack.log("web2"), vec!["start site", "start site", "finish site"]);
}

#[tokio::test]
async fn an_any_errors_fatal_abort_leaves_the_unreached_hosts_pending() {
    let stack = Stack::new();
    let spec = stack.spec("fatal.yml", "inventory.ini");
    stack.fail("web3");

    let (sink, result) = apply(&stack, &spec).await;
    let failure = result.unwrap_err();
    assert!(failure.summary.contains("1 failed, 4 pending"), "{}", failure.summary);
    let prior = sink.prior();
    assert_eq!(status_of(&prior, "web3"), SubStatus::Failed);
    for host in ["web1", "web2", "web4", "web5"] {
        assert_eq!(status_of(&prior, host), SubStatus::Pending, "{host}");
        assert_eq!(stack.log(host), vec!["start fatal"], "{host} never reached the later tasks");
    }
    assert!(!sink.events().iter().any(|e| matches!(e, Event::Done { .. })));

    stack.heal("web3");
    let (sink, result) = recover(&stack, &spec, &prior).await;
    result.unwrap();
    assert_eq!(sink.started(), WEB.to_vec());
    for host in WEB {
        assert_eq!(stack.log(host).last().map(String::as_str), Some("second fatal"), "{host}");
    }
}

#[tokio::test]
async fn a_failed_serial_batch_leaves_the_later_batches_pending() {
    let stack = Stack::new();
    let spec = stack.spec("serial.yml", "inventory.ini");
    stack.fail("web1");
    stack.fail("web2");

    let (sink, result) = apply(&stack, &spec).await;
    result.unwrap_err();
    let prior = sink.prior();
    assert_eq!(status_of(&prior, "web1"), SubStatus::Failed);
    assert_eq!(status_of(&prior, "web2"), SubStatus::Failed);
    for host in ["web3", "web4", "web5"] {
        assert_eq!(status_of(&prior, host), SubStatus::Pending, "{host}");
        assert!(stack.log(host).is_empty(), "{host} never ran");
    }

    stack.heal("web1");
    stack.heal("web2");
    let (sink, result) = recover(&stack, &spec, &prior).await;
    result.unwrap();
    assert_eq!(sink.prior().sub_changes.iter().filter(|s| s.status == SubStatus::Done).count(), 5);
    for host in ["web3", "web4", "web5"] {
        assert_eq!(stack.log(host), vec!["start serial", "finish serial"]);
    }
}

#[tokio::test]
async fn recover_stays_inside_the_steps_own_limit_and_rerun_runs_everything() {
    let stack = Stack::new();
    let mut spec = stack.spec("site.yml", "inventory.ini");
    spec.limit = Some("web1,web2,web3".into());
    stack.fail("web2");

    let (sink, result) = apply(&stack, &spec).await;
    result.unwrap_err();
    assert_eq!(sink.events()[0], Event::Planned { ids: vec!["web1".into(), "web2".into(), "web3".into()] });
    let prior = sink.prior();

    stack.heal("web2");
    let (sink, result) = recover(&stack, &spec, &prior).await;
    result.unwrap();
    assert_eq!(sink.started(), vec!["web2"]);
    assert!(stack.log("web4").is_empty() && stack.log("web5").is_empty(), "outside the step's limit");

    spec.recover = Some("rerun".into());
    let (sink, result) = recover(&stack, &spec, &sink.prior()).await;
    result.unwrap();
    assert_eq!(sink.started(), vec!["web1", "web2", "web3"]);
    assert_eq!(stack.log("web1").len(), 4);
}

#[tokio::test]
async fn a_playbook_that_does_not_parse_is_named_as_such() {
    let stack = Stack::new();
    let spec = stack.spec("broken.yml", "inventory.ini");
    let (sink, result) = apply(&stack, &spec).await;
    let failure = result.unwrap_err();
    assert_eq!(failure.exit_code, Some(4));
    assert!(failure.summary.contains("could not be parsed"), "{}", failure.summary);
    assert!(failure.summary.contains("not_a_keyword"), "{}", failure.summary);
    assert!(sink.started().is_empty());
}

#[tokio::test]
async fn a_missing_ansible_playbook_says_how_to_install_it() {
    let stack = Stack::new();
    let mut spec = stack.spec("site.yml", "inventory.ini");
    spec.binary = Some("./no/such/ansible-playbook".into());
    let (_, result) = apply(&stack, &spec).await;
    let failure = result.unwrap_err();
    assert!(failure.summary.contains("was not found"), "{}", failure.summary);
    assert!(failure.hint.as_deref().unwrap().contains("pip install ansible-core"));
    let info = ToolSpec::Ansible(stack.spec("site.yml", "inventory.ini")).preflight(&stack.ctx()).await.unwrap();
    assert_eq!(info.version, "core 2.19.14");
}

#[tokio::test]
async fn the_users_own_callbacks_stay_enabled() {
    let stack = Stack::new();
    std::fs::write(stack.path().join("ansible.cfg"), "[defaults]\ncallbacks_enabled = ansible.builtin.junit\n")
        .unwrap();
    let spec = stack.spec("site.yml", "inventory.ini");
    let mut ctx = stack.ctx();
    ctx.env.insert("JUNIT_OUTPUT_DIR".into(), stack.path().join("junit").to_string_lossy().into_owned());
    let sink = Recorder::default();
    ToolSpec::Ansible(spec).apply(&ctx, &sink).await.unwrap();
    assert_eq!(sink.prior().sub_changes.iter().filter(|s| s.status == SubStatus::Done).count(), 5);
    assert!(
        std::fs::read_dir(stack.path().join("junit")).map(|d| d.count()).unwrap_or(0) > 0,
        "junit callback ran too"
    );
}

#[tokio::test]
async fn an_interrupted_run_stops_promptly_and_leaves_no_host_done() {
    let stack = Stack::new();
    let spec = stack.spec("slow.yml", "inventory.ini");
    let ctx = stack.ctx();
    let cancel = ctx.cancel.clone();
    let started_file = stack.path().join("out/web1.log");
    let cancelled = tokio::spawn(async move {
        while !started_file.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        cancel.cancel();
        std::time::Instant::now()
    });
    let sink = Recorder::default();
    let failure = ToolSpec::Ansible(spec).apply(&ctx, &sink).await.unwrap_err();
    // Measured from the interrupt, not from the start: ansible's own start-up before the play
    // reaches the hosts can take many seconds on a loaded machine. Uninterrupted, the 30 s
    // sleep would still have about 29.5 s to go at this point.
    assert!(failure.interrupted, "{failure:?}");
    let stopped_in = cancelled.await.unwrap().elapsed();
    assert!(stopped_in < std::time::Duration::from_secs(20), "the sleep was not cut short: {stopped_in:?}");
    assert!(failure.summary.contains("was interrupted"), "{}", failure.summary);
    let prior = sink.prior();
    assert!(prior.sub_changes.iter().all(|s| s.status == SubStatus::Pending), "{prior:?}");
    for host in WEB {
        assert!(!stack.log(host).contains(&"finish slow".to_string()));
    }
}

/// A task whose process leaves ansible's process groups (its own session, as `setsid`, a daemon
/// or an `async` task make) is stopped by the interrupt too: ansible's own SIGINT reaches only
/// its workers' groups, so without rdeploy signalling every group of the tool's tree the task
/// ran on unobserved after rdeploy said the step stopped.
#[tokio::test]
async fn an_interrupt_reaches_a_task_process_that_left_the_process_group() {
    let stack = Stack::new();
    std::fs::write(
        stack.path().join("detached.yml"),
        r#"- hosts: all
  gather_facts: false
  tasks:
    - name: run in a session of its own
      ansible.builtin.shell: setsid sh -c 'echo $$ > "{{ out }}/{{ inventory_hostname }}.pid.tmp" && mv "{{ out }}/{{ inventory_hostname }}.pid.tmp" "{{ out }}/{{ inventory_hostname }}.pid" && exec sleep 300'
    - name: record finish
      ansible.builtin.shell: echo "finish detached" >> "{{ out }}/{{ inventory_hostname }}.log"
"#,
    )
    .unwrap();
    let spec = stack.spec("detached.yml", "inventory.ini");
    let ctx = stack.ctx();
    let cancel = ctx.cancel.clone();
    let out = stack.path().join("out");
    let pids = tokio::spawn(async move {
        let files: Vec<PathBuf> = WEB.iter().map(|h| out.join(format!("{h}.pid"))).collect();
        while !files.iter().all(|f| f.exists()) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let pids: Vec<i32> =
            files.iter().map(|f| std::fs::read_to_string(f).unwrap().trim().parse().unwrap()).collect();
        cancel.cancel();
        pids
    });
    let sink = Recorder::default();
    let failure = ToolSpec::Ansible(spec).apply(&ctx, &sink).await.unwrap_err();
    assert!(failure.interrupted, "{failure:?}");
    let pids = pids.await.unwrap();
    // Each detached task is gone (a zombie waiting for PID 1 to reap it is gone too): waited
    // for as a condition, with a bound far below the task's 300 s.
    let bound = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while pids.iter().any(|&pid| rdeploy_adapters::process::process_lives(pid)) {
        assert!(std::time::Instant::now() < bound, "a detached task still runs: {pids:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for host in WEB {
        assert!(!stack.log(host).contains(&"finish detached".to_string()));
    }
}

/// An extra var whose name is secret reaches ansible as `-e @FILE` (0600, deleted after the run),
/// not on the command line; a failing task prints it and rdeploy redacts it there, while the
/// digest the task wrote proves ansible got it, and a plain extra var prints in clear.
#[tokio::test]
async fn a_secret_extra_var_goes_in_a_file_and_a_failing_task_printing_it_is_redacted() {
    use sha2::Digest;
    let stack = Stack::new();
    std::fs::write(
        stack.path().join("secret.yml"),
        r#"- hosts: web1
  gather_facts: false
  tasks:
    - name: write the digest of the password
      ansible.builtin.copy:
        content: "{{ db_password | hash('sha256') }}"
        dest: "{{ playbook_dir }}/out/digest"
    - name: fail quoting it
      ansible.builtin.fail:
        msg: "rejected password {{ db_password }} in {{ region }}"
"#,
    )
    .unwrap();
    let mut spec = stack.spec("secret.yml", "inventory.ini");
    spec.extra_vars.insert("db_password".into(), serde_json::json!("SECRETVALUE-ans-9"));
    spec.extra_vars.insert("region".into(), serde_json::json!("eu-west-2"));
    let (sink, result) = apply(&stack, &spec).await;
    let failure = result.unwrap_err();
    let everything = format!("{:?}\n{failure:?}", sink.events());
    assert!(!everything.contains("SECRETVALUE"), "{everything}");
    assert!(everything.contains("rejected password *** in eu-west-2"), "{everything}");
    assert!(!stack.ctx().work_dir.join("secret-vars.json").exists(), "the secret vars file is deleted after the run");
    let digest = std::fs::read_to_string(stack.path().join("out/digest")).unwrap();
    assert_eq!(
        digest.trim(),
        sha2::Sha256::digest(b"SECRETVALUE-ans-9").iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    let runbook = ToolSpec::Ansible(spec).describe_recovery(
        &rdeploy_adapters::DescribeContext {
            step: "hosts",
            stack_file: "stack.yaml",
            stack_dir: &stack.path().to_string_lossy(),
            resumable: true,
        },
        None,
    );
    let runbook = format!("{runbook:?}");
    assert!(!runbook.contains("SECRETVALUE") && runbook.contains("eu-west-2"), "{runbook}");
}

/// The run names the hosts of every play before any task runs, as `--list-hosts` did in a start
/// of its own: here play 1 aborts (any_errors_fatal) on web1, so play 2 never starts, and its
/// hosts web4 and web5 are still planned and left pending, for `recover` to run.
#[tokio::test]
async fn the_run_plans_every_plays_hosts_before_any_task_and_a_play_never_started_leaves_them_pending() {
    let stack = Stack::new();
    std::fs::write(
        stack.path().join("plays.yml"),
        r#"- name: first
  hosts: web1:web2
  any_errors_fatal: true
  gather_facts: false
  tasks:
    - name: check for injected failure
      ansible.builtin.fail:
        msg: "injected failure on {{ inventory_hostname }}"
      when: (markers ~ '/fail-' ~ inventory_hostname) is exists
- name: second
  hosts: web4,web5
  gather_facts: false
  tasks:
    - ansible.builtin.shell: echo second >> "{{ out }}/{{ inventory_hostname }}.log"
"#,
    )
    .unwrap();
    let spec = stack.spec("plays.yml", "inventory.ini");
    stack.fail("web1");
    let (sink, result) = apply(&stack, &spec).await;
    result.unwrap_err();
    let planned = ["web1", "web2", "web4", "web5"].map(String::from).to_vec();
    assert_eq!(sink.events()[0], Event::Planned { ids: planned }, "{:#?}", sink.events());
    let prior = sink.prior();
    assert_eq!(status_of(&prior, "web1"), SubStatus::Failed);
    for host in ["web2", "web4", "web5"] {
        assert_eq!(status_of(&prior, host), SubStatus::Pending, "{host}");
    }
    assert_eq!(prior.status_of("web3"), None, "no play targets web3");
    assert!(stack.log("web4").is_empty());
}

/// A play whose `hosts` is a template is planned as it starts, with the hosts ansible selected.
#[tokio::test]
async fn a_templated_hosts_pattern_is_planned_as_its_play_starts() {
    let stack = Stack::new();
    std::fs::write(
        stack.path().join("templated.yml"),
        "- hosts: \"{{ targets }}\"\n  gather_facts: false\n  tasks:\n    - ansible.builtin.shell: echo templated >> \"{{ out }}/{{ inventory_hostname }}.log\"\n",
    )
    .unwrap();
    let mut spec = stack.spec("templated.yml", "inventory.ini");
    spec.extra_vars.insert("targets".into(), serde_json::json!("web2:web3"));
    let (sink, result) = apply(&stack, &spec).await;
    result.unwrap();
    let events = sink.events();
    let planned = events.iter().position(|e| matches!(e, Event::Planned { .. })).expect("planned");
    let started = events.iter().position(|e| matches!(e, Event::Started { .. })).expect("started");
    assert!(planned < started, "{events:#?}");
    assert_eq!(events[planned], Event::Planned { ids: vec!["web2".into(), "web3".into()] });
    assert_eq!(sink.done(), vec!["web2", "web3"]);
}

/// `ansible-playbook` wrappers in `bin/` of the stack that log each start to `starts.log`.
fn logging_playbook(stack: &Stack, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = stack.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let path = bin.join("ansible-playbook");
    std::fs::write(
        &path,
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n{body}\n", stack.path().join("starts.log").display()),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The checks before anything runs start `ansible-playbook` once: `-vv --syntax-check` opens
/// with the version line, then checks the playbook. A playbook that does not parse is bad input
/// naming `--syntax-check`; a program that prints no version is an unusable tool, with its words.
#[tokio::test]
async fn one_start_says_the_version_and_checks_the_playbook() {
    let stack = Stack::new();
    let real = venv_bin().join("ansible-playbook");
    let mut spec = stack.spec("site.yml", "inventory.ini");
    spec.binary = Some(logging_playbook(&stack, &format!("exec '{}' \"$@\"", real.display())).display().to_string());
    let info = ToolSpec::Ansible(spec.clone()).preflight(&stack.ctx()).await.unwrap();
    assert_eq!(info.version, "core 2.19.14");
    let starts = std::fs::read_to_string(stack.path().join("starts.log")).unwrap();
    assert_eq!(starts.lines().count(), 1, "{starts}");
    assert!(starts.contains("--syntax-check") && starts.contains("-vv"), "{starts}");

    spec.playbook = "broken.yml".into();
    let error = ToolSpec::Ansible(spec.clone()).preflight(&stack.ctx()).await.unwrap_err();
    assert!(matches!(error, rdeploy_adapters::AdapterError::BadInput { .. }), "{error:?}");
    assert!(error.to_string().contains("broken.yml: the playbook does not parse"), "{error}");
    assert!(error.hint().unwrap().contains("--syntax-check"), "{error:?}");

    spec.playbook = "site.yml".into();
    spec.binary = Some(logging_playbook(&stack, "echo 'no python here' >&2; exit 3").display().to_string());
    let error = ToolSpec::Ansible(spec).preflight(&stack.ctx()).await.unwrap_err();
    assert!(matches!(error, rdeploy_adapters::AdapterError::ToolUnusable { .. }), "{error:?}");
    assert!(error.to_string().contains("no python here"), "{error}");
}

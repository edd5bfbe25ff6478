//! End-to-end tests of ansible steps through the real `rdeploy` binary and real ansible-core
//! (from `.venv`, made by `scripts/setup-ansible.sh`): a failed host stops the deploy, status
//! names it, and recover re-runs the playbook on that host only.

mod common;

use common::{repo_root, step, sub_statuses, Project};

/// `.venv/bin/ansible-playbook`; a missing ansible fails loudly, never skips.
fn ansible_playbook() -> String {
    let bin = repo_root().join(".venv/bin/ansible-playbook");
    assert!(bin.is_file(), "{} is missing: run scripts/setup-ansible.sh", bin.display());
    bin.to_string_lossy().into_owned()
}

fn project(playbook: &str, inventory: &str) -> Project {
    let p = Project::new();
    p.copy_fixture("ansible", "ansible");
    let _ = std::fs::remove_dir_all(p.path("ansible/captured"));
    std::fs::create_dir_all(p.path("ansible/out")).unwrap();
    std::fs::create_dir_all(p.path("ansible/markers")).unwrap();
    p.stack(&format!(
        r#"
name: agents
steps:
  - name: hosts
    tool: ansible
    playbook: ansible/{playbook}
    inventory: ansible/{inventory}
    binary: {binary}
    env: {{ ANSIBLE_NOCOLOR: "1" }}
  - name: after
    tool: shell
    needs: [hosts]
    run: echo after >> after.log
"#,
        binary = ansible_playbook()
    ));
    p
}

fn log(p: &Project, host: &str) -> Vec<String> {
    p.read(&format!("ansible/out/{host}.log")).lines().map(str::to_string).collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

#[test]
fn a_failed_host_stops_the_deploy_and_recover_reruns_only_it() {
    let p = project("site.yml", "inventory.ini");
    p.file("ansible/markers/fail-web3", "");

    let up = p.rdeploy(&["up"]);
    up.code(1).stdout_has("web3").stdout_has("injected failure on web3");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(
        sub_statuses(&status, "hosts"),
        pairs(&[("web1", "done"), ("web2", "done"), ("web3", "failed"), ("web4", "done"), ("web5", "done")])
    );
    let hosts = step(&status, "hosts");
    assert_eq!(hosts["status"], "failed");
    assert!(hosts["error"].as_str().unwrap().contains("web3"), "{hosts}");
    assert_eq!(step(&status, "after")["status"], "skipped");
    assert!(!p.exists("after.log"));

    p.remove("ansible/markers/fail-web3");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(log(&p, "web3"), ["start site", "start site", "finish site"]);
    for host in ["web1", "web2", "web4", "web5"] {
        assert_eq!(log(&p, host), ["start site", "finish site"], "{host} was not touched by recover");
    }
    assert_eq!(p.read("after.log"), "after\n");
    let status = p.status();
    assert!(sub_statuses(&status, "hosts").iter().all(|(_, s)| s == "done"), "{status}");
}

#[test]
fn an_aborted_play_leaves_unreached_hosts_pending_and_unreachable_is_named() {
    let p = project("fatal.yml", "inventory-unreachable.ini");

    // db1 is unreachable; with any_errors_fatal the play aborts for everyone else.
    p.rdeploy(&["up"]).code(1).stdout_has("unreachable");
    let status = p.status();
    let subs = sub_statuses(&status, "hosts");
    assert!(subs.contains(&("db1".to_string(), "failed".to_string())), "{subs:?}");
    for host in ["web1", "web2", "web3", "web4"] {
        assert!(subs.contains(&(host.to_string(), "pending".to_string())), "{host}: {subs:?}");
        assert!(!log(&p, host).contains(&"second fatal".to_string()));
    }
}

/// A rolling deploy (`serial: 2`, `max_fail_percentage: 0`) whose health check fails on web3:
/// web4, in the same batch, had restarted and passed its check, so it is done even though
/// ansible marked it failed to stop the play; recover runs only web3 and web5 (no extra restart
/// of web4).
#[test]
fn max_fail_percentage_keeps_the_batch_hosts_that_finished_done_and_recover_skips_them() {
    let p = project("rolling.yml", "inventory.ini");
    p.file("ansible/markers/unhealthy-web3", "");

    p.rdeploy(&["up"]).code(1).stdout_has("health check failed on web3");
    let status = p.status();
    assert_eq!(
        sub_statuses(&status, "hosts"),
        pairs(&[("web1", "done"), ("web2", "done"), ("web3", "failed"), ("web4", "done"), ("web5", "pending")])
    );

    p.remove("ansible/markers/unhealthy-web3");
    p.rdeploy(&["recover"]).code(0);
    for host in ["web1", "web2", "web4"] {
        assert_eq!(log(&p, host), ["deploy", "restart"], "{host} was not touched by recover");
    }
    assert_eq!(log(&p, "web3"), ["deploy", "restart", "deploy", "restart"]);
    assert_eq!(log(&p, "web5"), ["deploy", "restart"]);
    assert!(sub_statuses(&p.status(), "hosts").iter().all(|(_, s)| s == "done"));
}

/// `extra_vars:` reach ansible with their YAML types (`-e '{"flag": false}'`), and a quoted
/// `"false"` stays a string: the play's asserts check both.
#[test]
fn extra_vars_keep_their_yaml_types() {
    let p = Project::new();
    p.file("inventory.ini", "local ansible_connection=local\n");
    p.file(
        "typed.yml",
        r#"- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.assert:
        that:
          - flag is sameas false
          - label is string
          - label == "false"
          - replicas == 2
          - replicas is number
          - ratio == 0.5
          - nothing is none
          - ports == [80, 443]
          - tags.on is sameas true
"#,
    );
    p.stack(&format!(
        r#"
name: agents
steps:
  - name: typed
    tool: ansible
    playbook: typed.yml
    inventory: inventory.ini
    extra_vars: {{ flag: false, label: "false", replicas: 2, ratio: 0.5, nothing: null, ports: [80, 443], tags: {{ on: true }} }}
    binary: {binary}
    env: {{ ANSIBLE_NOCOLOR: "1" }}
"#,
        binary = ansible_playbook()
    ));
    p.rdeploy(&["up"]).code(0);
    assert_eq!(sub_statuses(&p.status(), "typed"), pairs(&[("local", "done")]));
}

#[test]
fn a_host_unreachable_on_the_first_attempt_only_is_retried_alone() {
    let p = project("site.yml", "inventory-unreachable.ini");
    p.stack(&p.read("stack.yaml").replace(
        "    env: { ANSIBLE_NOCOLOR: \"1\" }\n",
        "    env: { ANSIBLE_NOCOLOR: \"1\" }\n    retry: { attempts: 5, delay: 2s, backoff: 1 }\n",
    ));
    let child = p.spawn(&["up"]);
    // Attempt 1 failed on db1 (a closed ssh port); db1 comes back before the next attempt.
    let start = std::time::Instant::now();
    while !p.exists(&p.state("journal.jsonl")) || !p.read(&p.state("journal.jsonl")).contains(r#""type":"step_failed""#)
    {
        assert!(start.elapsed() < std::time::Duration::from_secs(120), "attempt 1 never failed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let inventory = p.read("ansible/inventory-unreachable.ini");
    let db1 = inventory.lines().find(|l| l.starts_with("db1 ")).unwrap().to_string();
    p.file(
        "ansible/inventory-unreachable.ini",
        &inventory.replace(
            &db1,
            r#"db1 ansible_connection=local ansible_python_interpreter="{{ ansible_playbook_python }}""#,
        ),
    );
    let run = common::Run::from(child.wait_with_output().unwrap(), &["up"]);
    run.code(0).stdout_has("succeeded on attempt").stderr_has("(transient: a host was unreachable)");
    assert_eq!(log(&p, "db1"), ["start site", "finish site"], "{}", run.stderr);
    for host in ["web1", "web2", "web3", "web4"] {
        assert_eq!(log(&p, host), ["start site", "finish site"], "{host} ran once: the retry limited to db1");
    }
}

/// Wrappers named as ansible's programs in `bin/` of the project, each logging its arguments to
/// `starts.log` and running the real one from `.venv`: how many times ansible started.
fn logging_ansible(p: &Project) {
    let venv = repo_root().join(".venv/bin");
    assert!(venv.join("ansible-config").is_file(), "{} is missing: run scripts/setup-ansible.sh", venv.display());
    for program in ["ansible-playbook", "ansible-config"] {
        let path = p.path(&format!("bin/{program}"));
        p.file(
            &format!("bin/{program}"),
            &format!(
                "#!/bin/sh\necho \"{program} $*\" >> '{log}'\nexec '{real}' \"$@\"\n",
                log = p.path("starts.log").display(),
                real = venv.join(program).display()
            ),
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Every deploy the history keeps, as text.
fn history(p: &Project) -> String {
    let dir = p.path(&p.state("history"));
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    files.sort();
    files.iter().map(|f| std::fs::read_to_string(f).unwrap_or_default()).collect()
}

/// The starts `starts.log` holds since the last call, and empties it.
fn starts(p: &Project) -> Vec<String> {
    let lines = p.lines("starts.log");
    p.remove("starts.log");
    lines
}

/// A deploy runs ansible once, besides the check before anything runs (one `ansible-playbook -vv
/// --syntax-check`, whose first line is the version), and that check is not made again while
/// nothing it reads changed: a second `up` starts ansible once, for the run, whose callback names
/// the hosts before any task. An edited playbook is checked again; one that no longer parses is
/// refused (exit 2) although a check passed before; a changed `ansible.cfg` is read again
/// (`ansible-config dump`, asked once and kept meanwhile), and the callback it enables runs.
/// Before, every `up` started ansible five times (`--version`, `--syntax-check`, `--list-hosts`,
/// `ansible-config dump` and the run).
#[test]
fn a_second_up_starts_ansible_once_and_checks_again_only_what_changed() {
    let p = Project::new();
    logging_ansible(&p);
    let inventory = r#"[web]
web1
web2
web3

[web:vars]
ansible_connection=local
ansible_python_interpreter={{ ansible_playbook_python }}
"#;
    let playbook = r#"- hosts: web
  gather_facts: false
  tasks:
    - name: install the release
      ansible.builtin.copy:
        content: "release {{ release }}\n"
        dest: "{{ playbook_dir }}/../out/{{ inventory_hostname }}.release"
"#;
    p.file("play/inventory.ini", inventory).file("play/site.yml", playbook);
    std::fs::create_dir_all(p.path("out")).unwrap();
    p.stack(
        r#"
name: agents
steps:
  - name: hosts
    tool: ansible
    playbook: play/site.yml
    inventory: play/inventory.ini
    extra_vars: { release: "1.4.2" }
    binary: bin/ansible-playbook
    env: { ANSIBLE_NOCOLOR: "1", JUNIT_OUTPUT_DIR: junit }
"#,
    );
    let playbook_starts = |starts: &[String]| starts.iter().filter(|s| s.starts_with("ansible-playbook ")).count();
    let config_starts = |starts: &[String]| starts.iter().filter(|s| s.starts_with("ansible-config ")).count();

    p.rdeploy(&["up"]).code(0);
    let first = starts(&p);
    assert_eq!(playbook_starts(&first), 2, "{first:#?}");
    assert!(first.iter().any(|s| s.contains("--syntax-check")), "{first:#?}");
    assert!(!first.iter().any(|s| s.contains("--list-hosts") || s.contains("--version")), "{first:#?}");
    assert_eq!(config_starts(&first), 1, "{first:#?}");
    assert_eq!(sub_statuses(&p.status(), "hosts"), pairs(&[("web1", "done"), ("web2", "done"), ("web3", "done")]));
    let journal = history(&p);
    assert!(journal.contains("core 2.19.14"), "the version, from the check's first line: {journal}");

    p.rdeploy(&["up"]).code(0).stdout_has("in place");
    let second = starts(&p);
    assert_eq!(playbook_starts(&second), 1, "only the run: {second:#?}");
    assert!(!second.iter().any(|s| s.contains("--syntax-check")), "{second:#?}");
    assert_eq!(config_starts(&second), 0, "the settings came from the cache: {second:#?}");
    let status = p.status();
    assert!(
        step(&status, "hosts")["sub_changes"].as_array().unwrap().iter().all(|h| h["in_place"] == true),
        "{status}"
    );
    let journal = history(&p);
    assert!(journal.contains("core 2.19.14"), "the version the check said: {journal}");

    p.file("play/site.yml", &format!("{playbook}    - ansible.builtin.debug: {{ msg: edited }}\n"));
    p.rdeploy(&["up"]).code(0);
    let edited = starts(&p);
    assert_eq!(playbook_starts(&edited), 2, "an edited playbook is checked again: {edited:#?}");

    p.file("play/site.yml", &format!("{playbook}    - not_a_keyword: true\n"));
    p.rdeploy(&["up"]).code(2).stderr_has("play/site.yml: the playbook does not parse").stderr_has("--syntax-check");
    assert_eq!(playbook_starts(&starts(&p)), 1, "refused by the check alone");

    p.file("play/site.yml", playbook);
    assert!(!p.exists("junit"), "no callback of the user's is enabled yet");
    p.file("ansible.cfg", "[defaults]\ncallbacks_enabled = ansible.builtin.junit\n");
    p.rdeploy(&["up"]).code(0);
    let configured = starts(&p);
    assert_eq!(config_starts(&configured), 1, "a changed ansible.cfg is read again: {configured:#?}");
    assert_eq!(playbook_starts(&configured), 2, "and the playbook checked again under it: {configured:#?}");
    assert!(
        std::fs::read_dir(p.path("junit")).map(|d| d.count()).unwrap_or(0) > 0,
        "the junit callback ansible.cfg enables ran"
    );
}

/// A play that targets a group made as the run goes (`group_by`) matches nothing before the
/// run: the callback's listing of the hosts up front does not make ansible warn "Could not
/// match supplied host pattern" for it, while a pattern that still matches nothing when its
/// play starts is warned about by ansible, as without rdeploy. The grouped hosts are
/// checkpointed as their play starts.
#[test]
fn a_group_made_as_the_run_goes_is_not_warned_about_before_the_run() {
    let p = project("grouped.yml", "inventory.ini");
    p.file(
        "ansible/grouped.yml",
        r#"- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.group_by:
        key: "tier_{{ 'front' if inventory_hostname in ['web1', 'web2'] else 'back' }}"
- hosts: tier_front
  gather_facts: false
  tasks:
    - ansible.builtin.shell: echo front >> "{{ playbook_dir }}/out/{{ inventory_hostname }}.log"
- hosts: no_such_group
  gather_facts: false
  tasks:
    - ansible.builtin.shell: echo never >> "{{ playbook_dir }}/out/never.log"
"#,
    );
    p.rdeploy(&["up"]).code(0);
    assert_eq!(log(&p, "web1"), ["front"]);
    assert_eq!(log(&p, "web2"), ["front"]);
    assert!(!p.exists("ansible/out/web3.log"));
    let step_log = p.read(&p.state("logs/hosts.log"));
    assert!(
        !step_log.contains("Could not match supplied host pattern, ignoring: tier_front"),
        "the runtime group was warned about:\n{step_log}"
    );
    assert!(
        step_log.contains("Could not match supplied host pattern, ignoring: no_such_group"),
        "ansible's own warning for a pattern that never matches is kept:\n{step_log}"
    );
}

/// A play whose `hosts` is templated (from the extra vars) names its hosts before the run, as
/// a play written without a template does: when an earlier play fails and it never starts, its
/// hosts are pending in the partial state, not missing from it. Only a `hosts` that is one extra
/// var is: any other template is told when its play starts.
#[test]
fn the_hosts_of_a_templated_play_that_never_started_are_pending() {
    let p = project("templated.yml", "inventory.ini");
    p.file(
        "ansible/templated.yml",
        r#"- hosts: web1
  gather_facts: false
  tasks:
    - ansible.builtin.fail:
        msg: injected failure on web1
- hosts: "{{ later_hosts }}"
  gather_facts: false
  tasks:
    - ansible.builtin.shell: echo later >> "{{ playbook_dir }}/out/{{ inventory_hostname }}.log"
- hosts: "{{ hostvars['web1']['picked'] | default('web2') }}"
  gather_facts: false
  tasks:
    - ansible.builtin.shell: echo picked >> "{{ playbook_dir }}/out/{{ inventory_hostname }}.log"
"#,
    );
    p.stack(&p.read("stack.yaml").replace(
        "    inventory: ansible/inventory.ini\n",
        "    inventory: ansible/inventory.ini\n    extra_vars: { later_hosts: \"web4:web5\" }\n",
    ));
    p.rdeploy(&["up"]).code(1).stdout_has("injected failure on web1");
    assert_eq!(
        sub_statuses(&p.status(), "hosts"),
        pairs(&[("web1", "failed"), ("web4", "pending"), ("web5", "pending")])
    );
    // A template that may read what earlier plays set (its `default` hides that it is not set
    // yet) is not guessed before its play starts: web2 is named nowhere.
    assert!(!p.exists("ansible/out/web4.log"));
}

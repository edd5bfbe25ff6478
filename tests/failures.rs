//! Failures across the DAG (issue 17): `--keep-going` and `on_failure: continue`, `timeout:`
//! for every tool, `retry:` that resumes a step through its recovery path.

mod common;

use std::time::{Duration, Instant};

use common::{step, Project};

/// Two branches: `a -> b -> c`, and `d`, `e` standing alone; `a` and `e` fail while their
/// `fail-*` files exist. Every command appends its name to `out`.
const BRANCHES: &str = r#"
name: branches
steps:
  - name: a
    tool: shell
    sub_changes:
      - { name: a1, run: echo a1 >> out }
      - { name: a2, run: "if [ -f fail-a ]; then echo 'a2: quota exceeded' >&2; exit 4; fi; echo a2 >> out" }
  - name: b
    tool: shell
    needs: [a]
    run: echo b >> out
  - name: c
    tool: shell
    needs: [b]
    run: echo c >> out
  - name: d
    tool: shell
    run: echo d >> out
  - name: e
    tool: shell
    sub_changes:
      - { name: e1, run: "if [ -f fail-e ]; then echo 'e1: disk full' >&2; exit 5; fi; echo e1 >> out" }
"#;

#[test]
fn keep_going_runs_independent_branches_and_recover_runs_only_what_is_left() {
    let p = Project::new();
    p.stack(BRANCHES).file("fail-a", "").file("fail-e", "");

    let run = p.rdeploy(&["up", "--keep-going"]);
    run.code(1).stdout_has("a2: quota exceeded").stdout_has("e1: disk full");
    assert_eq!(p.lines("out"), ["a1", "d"], "the independent step ran past the failure, its dependents did not");
    let status = p.status();
    assert_eq!(step(&status, "a")["status"], "failed");
    assert_eq!(step(&status, "e")["status"], "failed");
    assert_eq!(step(&status, "d")["status"], "done");
    assert_eq!(step(&status, "b")["status"], "skipped");
    assert!(step(&status, "b")["skipped_because"].as_str().unwrap().contains("needs `a`, which failed"), "{status}");
    assert_eq!(step(&status, "c")["status"], "skipped");
    assert!(step(&status, "c")["skipped_because"].as_str().unwrap().contains("needs `b`, which was skipped"));

    // Recover resumes the failed and skipped steps only: `d` and `a1` never run again.
    p.remove("fail-a");
    p.remove("fail-e");
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    assert_eq!(p.lines("out"), ["a1", "d", "a2", "b", "c", "e1"]);
}

#[test]
fn without_keep_going_the_first_failure_stops_every_branch() {
    let p = Project::new();
    p.stack(BRANCHES).file("fail-a", "");
    p.rdeploy(&["up"]).code(1).stdout_has("a2: quota exceeded");
    assert_eq!(p.lines("out"), ["a1"], "d and e wait for `recover`");
    let status = p.status();
    assert_eq!(step(&status, "d")["status"], "pending");
}

#[test]
fn on_failure_continue_is_keep_going_by_default() {
    let p = Project::new();
    p.stack(&BRANCHES.replace("name: branches\n", "name: branches\non_failure: continue\n")).file("fail-a", "");
    p.rdeploy(&["up"]).code(1).stdout_has("a2: quota exceeded");
    assert_eq!(p.lines("out"), ["a1", "d", "e1"]);
    assert_eq!(step(&p.status(), "b")["status"], "skipped");
}

#[test]
fn ci_keep_going_reports_every_failure_in_junit() {
    let p = Project::new();
    p.stack(BRANCHES).file("fail-a", "").file("fail-e", "");
    p.rdeploy(&["ci", "--keep-going", "--junit", "junit.xml"]).code(1);
    let junit = p.read("junit.xml");
    assert!(junit.contains("failures=\"2\""), "{junit}");
    assert!(junit.contains("a2: quota exceeded") && junit.contains("e1: disk full"), "{junit}");
    assert_eq!(p.lines("out"), ["a1", "d"]);
}

#[test]
fn a_timeout_stops_the_hung_sub_change_within_the_grace_period_and_names_it() {
    let p = Project::new();
    p.stack(
        r#"
name: hang
steps:
  - name: hang
    tool: shell
    timeout: 2s
    sub_changes:
      - { name: first, run: echo first >> out }
      - { name: stuck, run: "echo stuck >> out; sleep 60" }
"#,
    );
    let started = Instant::now();
    let run = p.rdeploy(&["up"]);
    let took = started.elapsed();
    run.code(1).stdout_has("timed out after 2s while running sub-change `stuck`");
    // `sleep` dies of the SIGINT at 2s; SIGTERM and SIGKILL would follow 5s and 10s later.
    assert!(took < Duration::from_secs(2 + 10 + 20), "stopped after {took:?}, the tool slept 60s");
    let status = p.status();
    assert_eq!(step(&status, "hang")["status"], "failed");
    assert!(step(&status, "hang")["error"].as_str().unwrap().starts_with("timed out after 2s"), "{status}");
    assert_eq!(p.lines("out"), ["first", "stuck"]);
}

#[test]
fn the_top_level_timeout_is_every_steps_default_and_a_step_may_raise_it() {
    let p = Project::new();
    p.stack(
        r#"
name: hang
timeout: 1s
steps:
  - name: patient
    tool: shell
    timeout: 30s
    run: sleep 1.5 && echo patient >> out
  - name: hung
    tool: shell
    run: "trap '' INT; sleep 60"
"#,
    );
    let started = Instant::now();
    let run = p.rdeploy(&["up", "--keep-going"]);
    let took = started.elapsed();
    // `hung` ignores SIGINT: SIGTERM after the grace period stops it.
    run.code(1).stdout_has("timed out after 1s while running sub-change `run` (`trap '' INT; sleep 60`)");
    assert!(took < Duration::from_secs(1 + 5 + 30), "stopped after {took:?}");
    assert_eq!(p.lines("out"), ["patient"]);
    assert_eq!(step(&p.status(), "hung")["status"], "failed");
}

#[test]
fn bad_retry_and_timeout_values_are_refused_at_load_with_their_position() {
    let p = Project::new();
    p.stack(
        r#"
name: bad
timeout: soon
steps:
  - name: a
    tool: shell
    run: echo a
    retry: { attempts: 0, delay: quick, backoff: 0.5, matching: ["(unclosed"] }
  - name: b
    tool: shell
    run: echo b
    retry: { attemps: 2 }
"#,
    );
    let run = p.rdeploy(&["validate"]);
    run.code(2)
        .stderr_has("stack.yaml:3:10: `timeout: soon` is not a duration")
        .stderr_has("stack.yaml:8:24: `retry.attempts` is a whole number from 1 to 100, not `0`")
        .stderr_has("stack.yaml:8:34: `retry.delay: quick` is not a duration")
        .stderr_has("stack.yaml:8:50: `retry.backoff` is a factor from 1 to 10, not `0.5`")
        .stderr_has("stack.yaml:8:66: `retry.matching` entry `(unclosed` is not a regular expression: unclosed group")
        .stderr_has("stack.yaml:12:14: step `b`: `retry.attemps`: unknown field `attemps`")
        .stderr_has("did you mean `attempts`?");
}

/// `flaky` fails twice with a matching message, then succeeds; `strict` fails with a message
/// that does not match. Every run of a command appends a line to a count file.
const RETRIES: &str = r#"
name: retries
steps:
  - name: flaky
    tool: shell
    retry: { attempts: 3, delay: 100ms, backoff: 2, matching: ["service unavailable"] }
    sub_changes:
      - { name: first, run: echo first >> first.count }
      - name: second
        run: "echo x >> second.count; if [ $(wc -l < second.count) -lt 3 ]; then echo 'upstream: 503 service unavailable' >&2; exit 1; fi"
  - name: strict
    tool: shell
    retry: { attempts: 3, delay: 100ms, matching: ["service unavailable"] }
    sub_changes:
      - { name: only, run: "echo x >> strict.count; echo 'permission denied' >&2; exit 1" }
"#;

#[test]
fn a_matching_failure_is_retried_through_recover_and_succeeds_on_attempt_3() {
    let p = Project::new();
    p.stack(RETRIES);
    let run = p.rdeploy(&["up", "--keep-going"]);
    run.code(1)
        .stdout_has("flaky (shell): first, second (succeeded on attempt 3 of 3)")
        .stderr_has("attempt 1/3 failed (matches `service unavailable`)")
        .stderr_has("flaky: shell recover (attempt 2/3)")
        .stderr_has("flaky: shell recover (attempt 3/3)");
    // Completed sub-changes never run again across attempts; the failing one ran three times.
    assert_eq!(p.lines("first.count").len(), 1);
    assert_eq!(p.lines("second.count").len(), 3);
    // A failure that does not match runs once.
    assert_eq!(p.lines("strict.count").len(), 1);

    let status = p.status();
    let flaky = step(&status, "flaky");
    assert_eq!(flaky["status"], "done");
    assert_eq!(flaky["attempts"], 3);
    assert_eq!(flaky["max_attempts"], 3);
    let errors = flaky["attempt_errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{flaky}");
    assert!(errors[0].as_str().unwrap().contains("503 service unavailable"), "{flaky}");
    let strict = step(&status, "strict");
    assert_eq!(strict["status"], "failed");
    assert!(strict.get("attempts").is_none(), "not retried: {strict}");
}

#[test]
fn ci_junit_says_which_attempt_succeeded() {
    let p = Project::new();
    p.stack(RETRIES.split("  - name: strict").next().unwrap());
    p.rdeploy(&["ci", "--junit", "junit.xml"]).code(0);
    let junit = p.read("junit.xml");
    assert!(junit.contains("succeeded on attempt 3 of 3"), "{junit}");
    assert_eq!(p.lines("first.count").len(), 1);
}

#[test]
fn a_non_resumable_step_is_never_retried() {
    let p = Project::new();
    p.stack(
        r#"
name: once
steps:
  - name: migrate
    tool: shell
    retry: { attempts: 3, delay: 10ms, matching: ["."] }
    run: "echo x >> count; echo 'deadlock detected' >&2; exit 1"
    revert: echo reverted >> count
"#,
    );
    p.rdeploy(&["up"]).code(3).stderr_has("step `migrate` declares `retry` but is not resumable");
    assert_eq!(p.lines("count"), ["x", "reverted"], "it completes or reverts, never runs twice");
}

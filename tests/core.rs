//! End-to-end tests of the core with the shell adapter: the real binary in temp directories.

mod common;

use std::time::Duration;

use common::{step, sub_statuses, Project, FIVE};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[test]
fn four_of_five_then_recover_runs_only_the_fifth() {
    let p = Project::new();
    p.stack(FIVE).file("fail-five", "");

    let run = p.rdeploy(&["up"]);
    run.code(1).stdout_has("five: connection refused").stdout_has("next: rdeploy recover stack.yaml");
    assert_eq!(p.lines("out"), ["one", "two", "three", "four"]);

    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(status["next"], "rdeploy recover stack.yaml");
    assert_eq!(
        sub_statuses(&status, "seed"),
        [("one", "done"), ("two", "done"), ("three", "done"), ("four", "done"), ("five", "failed")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(step(&status, "seed")["status"], "failed");
    assert_eq!(step(&status, "seed")["resumable"], true);
    assert_eq!(step(&status, "seed")["exit_code"], 3);
    assert!(step(&status, "seed")["error"].as_str().unwrap().contains("five: connection refused"));
    assert_eq!(step(&status, "after")["status"], "skipped");
    assert!(p.exists(&p.state("report.md")), "the report is kept as markdown");

    // `up` refuses to run completed work again and names the way forward.
    p.rdeploy(&["up"]).code(2).stderr_has("rdeploy recover stack.yaml").stderr_has("rdeploy reset stack.yaml --yes");
    assert_eq!(p.lines("out").len(), 4);

    // A dry run changes nothing and says what would run.
    p.remove("fail-five");
    p.rdeploy(&["recover", "--dry-run"]).code(0).stdout_has("run five").stdout_has("keep one: done");
    assert_eq!(p.lines("out").len(), 4);

    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"]);
    let status = p.status();
    assert_eq!(status["state"], "complete");
    assert!(status["next"].is_null());
    assert!(!p.exists(&p.state("journal.jsonl")), "a finished deploy leaves no unfinished checkpoint");

    // A finished deploy is history: `up` starts a new deploy and nothing is refused.
    p.rdeploy(&["up"]).code(0);
    assert_eq!(p.lines("out").len(), 12);
    p.rdeploy(&["recover"]).code(0).stdout_has("nothing to recover");
}

#[test]
fn a_non_resumable_step_completes_or_reverts() {
    let p = Project::new();
    p.stack(
        r#"
name: migrate
steps:
  - name: prepare
    tool: shell
    run: echo prepare >> out
  - name: migrate
    tool: shell
    needs: [prepare]
    run: "echo half-applied > schema; if [ -f fail ]; then echo 'ERROR: column exists' >&2; exit 1; fi; echo migrated > schema"
    revert: rm -f schema
"#,
    )
    .file("fail", "");
    p.rdeploy(&["up"]).code(3).stdout_has("reverted");
    assert!(!p.exists("schema"), "the revert ran: no partial state is left");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(step(&status, "migrate")["status"], "reverted");
    assert_eq!(step(&status, "migrate")["resumable"], false);
    assert_eq!(step(&status, "prepare")["status"], "done");

    p.remove("fail");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.read("schema"), "migrated\n");
    assert_eq!(p.lines("out"), ["prepare"], "completed steps stay done");
}

#[test]
fn a_failed_revert_is_exit_6_and_says_so() {
    let p = Project::new();
    p.stack(
        r#"
name: migrate
steps:
  - name: migrate
    tool: shell
    run: exit 1
    revert: "echo 'cannot reach the database' >&2; exit 2"
"#,
    );
    let run = p.rdeploy(&["up"]);
    run.code(6).stdout_has("revert failed").stdout_has("cannot reach the database");
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert!(step(&status, "migrate")["revert_error"].as_str().unwrap().contains("cannot reach the database"));
    // `recover` reverts the half-done step again, then runs it from the start.
    assert_eq!(status["next"], "rdeploy recover stack.yaml");
}

#[test]
fn on_failure_revert_undoes_completed_steps_newest_first() {
    let p = Project::new();
    p.stack(
        r#"
name: shop
on_failure: revert
steps:
  - name: a
    tool: shell
    run: touch a
    revert: "rm a && echo a >> reverted"
  - name: b
    tool: shell
    needs: [a]
    sub_changes:
      - { name: b1, run: touch b }
    revert: "rm b && echo b >> reverted"
  - name: c
    tool: shell
    needs: [b]
    run: exit 1
"#,
    );
    p.rdeploy(&["up"]).code(3);
    assert_eq!(p.lines("reverted"), ["b", "a"]);
    assert!(!p.exists("a") && !p.exists("b"));
    assert!(!p.exists(&p.state("journal.jsonl")), "the checkpoint is removed after a revert");
    assert_eq!(p.status()["state"], "reverted");
    // The next `up` starts from scratch.
    p.rdeploy(&["up"]).code(3);
    assert_eq!(p.lines("reverted"), ["b", "a", "b", "a"]);
}

#[test]
fn revert_command_undoes_a_completed_deploy() {
    let p = Project::new();
    p.stack(
        r#"
name: shop
steps:
  - name: a
    tool: shell
    run: touch a
    revert: "rm a && echo a >> reverted"
  - name: b
    tool: shell
    needs: [a]
    run: touch b
    revert: "rm b && echo b >> reverted"
"#,
    );
    p.rdeploy(&["up"]).code(0);
    p.rdeploy(&["revert"]).code(0).stdout_has("deploy reverted");
    assert_eq!(p.lines("reverted"), ["b", "a"]);
    assert_eq!(p.status()["state"], "reverted");
}

/// `status --detailed-exitcode` tells a script the recorded state without parsing text: 0 with
/// nothing recorded and after a complete deploy, 1 for a deploy stopped part-way, 3 reverted.
#[test]
fn status_detailed_exitcode_tells_complete_from_partial_and_reverted() {
    let p = Project::new();
    p.stack(
        r#"
name: shop
steps:
  - name: a
    tool: shell
    run: test ! -f fail-a
    revert: "true"
"#,
    );
    p.rdeploy(&["status", "--detailed-exitcode"]).code(0);
    p.rdeploy(&["up"]).code(0);
    p.rdeploy(&["status", "--detailed-exitcode"]).code(0);
    p.rdeploy(&["status"]).code(0);
    p.file("fail-a", "");
    // The step failed and its `revert` ran: the deploy is unfinished, `recover` runs it again.
    p.rdeploy(&["up"]).code(3);
    p.rdeploy(&["status", "--detailed-exitcode", "--json"]).code(1).stdout_has(r#""state": "partial""#);
    p.rdeploy(&["revert"]).code(0);
    p.rdeploy(&["status", "--detailed-exitcode", "--json"]).code(3).stdout_has(r#""state": "reverted""#);
    p.stack(&p.read("stack.yaml").replace("    revert: \"true\"\n", ""));
    p.rdeploy(&["up"]).code(1);
    p.rdeploy(&["status", "--detailed-exitcode"]).code(1).stdout_has("stopped");
    p.rdeploy(&["status"]).code(0);
}

/// `revert` when no step that ran declares `revert`: it says so, exits 0 and records nothing,
/// so the last deploy (its outputs, its plan baseline) and an unfinished checkpoint stay as
/// they were.
#[test]
fn revert_with_no_step_to_undo_says_so_and_records_nothing() {
    let p = Project::new();
    p.stack(
        r#"
name: shop
steps:
  - name: infra
    tool: shell
    run: echo hostname=db.internal >> "$RDEPLOY_OUTPUT"
  - name: web
    tool: shell
    needs: [infra]
    run: test ! -f fail-web
"#,
    );
    p.rdeploy(&["up"]).code(0);
    let before = p.status();
    let run = p.rdeploy(&["revert"]);
    run.code(0);
    let filters = vec![(r"[0-9A-HJKMNP-TV-Z]{26}", "[deploy]"), (r"/\S*/\.rdeploy/", "[project]/.rdeploy/")];
    insta::with_settings!({ filters => filters.clone() }, {
        insta::assert_snapshot!("revert_nothing_after_complete", run.stdout);
    });
    assert_eq!(p.status()["deploy_id"], before["deploy_id"], "a new deploy was recorded");
    assert_eq!(p.status()["state"], "complete");
    p.rdeploy(&["output", "infra", "hostname"]).code(0).stdout_has("db.internal");

    // An unfinished deploy: kept, still resumable.
    p.file("fail-web", "");
    p.rdeploy(&["up"]).code(1);
    let run = p.rdeploy(&["revert"]);
    run.code(0);
    insta::with_settings!({ filters => filters }, {
        insta::assert_snapshot!("revert_nothing_unfinished", run.stdout);
    });
    assert_eq!(p.status()["state"], "partial");
    p.remove("fail-web");
    p.rdeploy(&["recover"]).code(0);
}

fn assert_bad_input(stack: &str, location: &str, message: &str) {
    let p = Project::new();
    p.stack(stack);
    let run = p.rdeploy(&["validate"]);
    run.code(2).stderr_has(&format!("stack.yaml:{location}: ")).stderr_has(message);
    // Nothing was changed: no state directory.
    let up = p.rdeploy(&["up"]);
    up.code(2);
    assert!(!p.exists(&p.state("journal.jsonl")));
}

#[test]
fn bad_input_names_file_line_and_column() {
    assert_bad_input("name: s\nsteps:\n  - name: a\n    tool: shell\n    rnu: echo\n", "5:5", "did you mean `run`?");
    assert_bad_input("name: s\nsteps:\n  - name: a\n    tool: terraforn\n", "4:11", "did you mean `terraform`?");
    assert_bad_input(
        "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n  - name: a\n    tool: shell\n    run: y\n",
        "6:11",
        "step name `a` is used twice (first on line 3)",
    );
    assert_bad_input(
        "name: s\nsteps:\n  - name: net\n    tool: shell\n    run: x\n  - name: b\n    tool: shell\n    needs: [nte]\n    run: y\n",
        "8:13",
        "did you mean `net`?",
    );
    assert_bad_input(
        "name: s\nsteps:\n  - name: a\n    tool: shell\n    needs: [b]\n    run: x\n  - name: b\n    tool: shell\n    needs: [a]\n    run: y\n",
        "3:11",
        "cycle",
    );
    assert_bad_input(
        "name: s\nsteps:\n  - name: a\n    tool: shell\n    dir: missing/dir\n    run: x\n",
        "5:10",
        "does not exist",
    );
    assert_bad_input(
        "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n    revrt: y\n",
        "6:5",
        "did you mean `revert`?",
    );
}

#[test]
fn a_missing_stack_file_is_bad_input() {
    let p = Project::new();
    p.rdeploy(&["up", "nope.yaml"]).code(2).stderr_has("no stack file at nope.yaml");
}

#[test]
fn a_second_run_is_refused_with_exit_5() {
    let p = Project::new();
    p.stack("name: s\nsteps:\n  - name: slow\n    tool: shell\n    sub_changes:\n      - { name: wait, run: 'touch started; while [ ! -f go ]; do sleep 0.05; done' }\n");
    let mut first = p.spawn(&["up"]);
    p.wait_for("started", Duration::from_secs(20));
    p.rdeploy(&["up"]).code(5).stderr_has("another run holds the lock").stderr_has("rdeploy up");
    p.rdeploy(&["recover"]).code(5);
    // status still works while the run holds the lock and names it.
    assert_eq!(p.status()["lock"]["command"], "up");
    p.file("go", "");
    assert_eq!(first.wait().unwrap().code(), Some(0));
}

/// A stack whose second sub-change waits until `go` exists, so a test can stop rdeploy there.
const WAITS: &str = r#"
name: s
steps:
  - name: seed
    tool: shell
    sub_changes:
      - { name: a, run: echo a >> out }
      - name: b
        run: "touch b-started; while [ -f hold ]; do sleep 0.05; done; echo b >> out; touch b-done"
        check: test -f b-done
      - { name: c, run: echo c >> out }
  - name: after
    tool: shell
    needs: [seed]
    sub_changes:
      - { name: d, run: echo d >> out }
"#;

#[test]
fn kill_9_mid_deploy_then_recover_converges() {
    let p = Project::new();
    p.stack(WAITS).file("hold", "");
    let mut child = p.spawn(&["up"]);
    p.wait_for("b-started", Duration::from_secs(20));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();

    let status = p.status();
    assert_eq!(status["state"], "partial");
    let seed = step(&status, "seed");
    assert_eq!(seed["status"], "failed", "a step the dead run left running is failed");
    let b = seed["sub_changes"].as_array().unwrap().iter().find(|s| s["id"] == "b").unwrap();
    assert_eq!(b["uncertain"], true, "the sub-change in flight is uncertain: {status}");
    assert_eq!(p.lines("out"), ["a"]);

    p.remove("hold");
    let run = recover_after_crash(&p);
    run.code(0).stderr_has("took over the lock");
    assert_eq!(p.lines("out"), ["a", "b", "c", "d"], "no completed sub-change ran again");
}

#[test]
fn kill_9_after_the_in_flight_change_landed_lets_its_check_decide() {
    let p = Project::new();
    // b lands (b-done) and then hangs before rdeploy hears back: its check says it is in place.
    p.stack(&WAITS.replace(
        "touch b-started; while [ -f hold ]; do sleep 0.05; done; echo b >> out; touch b-done",
        "echo b >> out; touch b-done; touch b-started; while [ -f hold ]; do sleep 0.05; done",
    ))
    .file("hold", "");
    let mut child = p.spawn(&["up"]);
    p.wait_for("b-started", Duration::from_secs(20));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    p.remove("hold");
    recover_after_crash(&p).code(0);
    assert_eq!(p.lines("out"), ["a", "b", "c", "d"], "the check kept b from running twice");
}

#[test]
fn sigint_is_forwarded_and_the_checkpoint_is_consistent() {
    let p = Project::new();
    p.stack(WAITS).file("hold", "");
    let child = p.spawn(&["up"]);
    p.wait_for("b-started", Duration::from_secs(20));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    let status = p.status();
    assert_eq!(status["interrupted"], "SIGINT");
    assert_eq!(step(&status, "seed")["interrupted"], true);
    assert_eq!(p.lines("out"), ["a"]);

    p.remove("hold");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.lines("out"), ["a", "b", "c", "d"]);
}

#[test]
fn independent_steps_run_in_parallel() {
    let p = Project::new();
    // Each step waits for the other's marker: they can only finish if they run at once.
    p.stack(
        r#"
name: s
steps:
  - name: left
    tool: shell
    run: "touch left; i=0; while [ ! -f right ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; test -f right"
  - name: right
    tool: shell
    run: "touch right; i=0; while [ ! -f left ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; test -f left"
  - name: join
    tool: shell
    needs: [left, right]
    run: touch joined
"#,
    );
    p.rdeploy(&["up", "--parallel", "2"]).code(0);
    assert!(p.exists("joined"));
}

/// `skipped` is for steps that cannot run because something they need (even indirectly) did not
/// finish; a step that merely was not reached yet stays `pending`.
#[test]
fn steps_behind_a_failure_are_skipped_and_the_rest_pending() {
    let p = Project::new();
    p.stack(
        r#"
name: s
steps:
  - name: base
    tool: shell
    run: exit 4
  - name: app
    tool: shell
    needs: [base]
    run: echo app >> out
  - name: smoke
    tool: shell
    needs: [app]
    run: echo smoke >> out
  - name: docs
    tool: shell
    run: echo docs >> out
"#,
    );
    p.rdeploy(&["up"]).code(1).stdout_has("app (shell): skipped: needs `base`, which failed");
    let status = p.status();
    assert_eq!(step(&status, "base")["status"], "failed");
    assert_eq!(step(&status, "app")["status"], "skipped");
    assert_eq!(step(&status, "app")["skipped_because"], "needs `base`, which failed");
    assert_eq!(step(&status, "smoke")["status"], "skipped");
    assert_eq!(step(&status, "smoke")["skipped_because"], "needs `app`, which was skipped");
    assert_eq!(step(&status, "docs")["status"], "pending", "independent of the failure");
    assert!(!p.exists("out"));

    p.stack(&p.read("stack.yaml").replace("run: exit 4", "run: 'true'"));
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.lines("out"), ["app", "smoke", "docs"]);
}

#[test]
fn a_changed_stack_is_reported_and_recover_uses_the_fix() {
    let p = Project::new();
    p.stack(&FIVE.replace("exit 3; fi", "exit 3; fi; true")).file("fail-five", "");
    p.rdeploy(&["up"]).code(1);
    // The fix: the fifth sub-change no longer fails.
    p.stack(&FIVE.replace("if [ -f fail-five ]", "if [ -f never ]"));
    let status = p.status();
    assert_eq!(status["stack_changed"], true);
    assert_eq!(step(&status, "seed")["changed_since_checkpoint"], true);
    p.rdeploy(&["recover"]).code(0).stderr_has("step `seed` changed since the checkpoint");
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"]);
}

#[test]
fn recover_refuses_a_checkpoint_it_cannot_map() {
    let p = Project::new();
    p.stack(FIVE).file("fail-five", "");
    p.rdeploy(&["up"]).code(1);
    p.stack(&FIVE.replace("name: seed", "name: seed-data").replace("needs: [seed]", "needs: [seed-data]"));
    p.rdeploy(&["recover"]).code(2).stderr_has("step `seed`").stderr_has("no longer in the stack");
    // reset needs --yes, then forgets the deploy.
    p.rdeploy(&["reset"]).code(2).stderr_has("--yes");
    p.rdeploy(&["reset", "--yes"]).code(0);
    assert_eq!(p.status()["state"], "none");
}

#[test]
fn a_gate_that_cannot_be_evaluated_refuses_the_step() {
    let p = Project::new();
    p.stack(
        r#"
name: s
steps:
  - name: add-column
    tool: shell
    phase: expand
    run: touch expanded
  - name: drop-old-column
    tool: shell
    phase: contract
    needs: [add-column]
    run: touch contracted
    gate:
      inventory:
        contexts: [edge-1, edge-2]
        image: registry.example/node-agent
        version: "2.0"
"#,
    );
    p.rdeploy(&["up"]).code(4);
    assert!(p.exists("expanded"));
    assert!(!p.exists("contracted"), "the gated step did not run");
    let status = p.status();
    assert!(step(&status, "drop-old-column")["refused"].as_str().unwrap().contains("edge-1"));
}

#[test]
fn sigint_in_a_non_resumable_step_reverts_it_before_exiting() {
    let p = Project::new();
    p.stack(
        r#"
name: s
steps:
  - name: migrate
    tool: shell
    run: "echo half > schema; touch started; while [ -f hold ]; do sleep 0.05; done; echo full > schema"
    revert: "rm -f schema; echo reverted >> log"
"#,
    )
    .file("hold", "");
    let child = p.spawn(&["up"]);
    p.wait_for("started", Duration::from_secs(20));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(!p.exists("schema"), "complete or revert: no half-applied schema is left");
    assert_eq!(p.lines("log"), ["reverted"]);
    assert_eq!(step(&p.status(), "migrate")["status"], "reverted");

    p.remove("hold");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.read("schema"), "full\n");
}

/// A command right after a kill -9: a tool of the dead run may take a moment to exit (it got
/// SIGTERM), during which rdeploy refuses with exit 5; retry as an operator would. The stderr
/// of every attempt is kept.
fn after_crash(p: &Project, args: &[&str]) -> common::Run {
    let start = std::time::Instant::now();
    let mut stderr = String::new();
    loop {
        let mut run = p.rdeploy(args);
        stderr.push_str(&run.stderr);
        if run.status != 5 || start.elapsed() > Duration::from_secs(10) {
            run.stderr = stderr;
            return run;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn recover_after_crash(p: &Project) -> common::Run {
    after_crash(p, &["recover"])
}

#[test]
fn kill_9_in_a_non_resumable_step_reverts_it_before_running_it_again() {
    let p = Project::new();
    p.stack(
        r#"
name: s
steps:
  - name: migrate
    tool: shell
    run: "echo half >> db; touch started; while [ -f hold ]; do sleep 0.05; done; echo full >> db"
    revert: "rm -f db; echo reverted >> log"
"#,
    )
    .file("hold", "");
    let mut child = p.spawn(&["up"]);
    p.wait_for("started", Duration::from_secs(20));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    p.remove("hold");
    after_crash(&p, &["recover", "--dry-run"]).code(0).stdout_has("run its revert, then run it again from the start");
    recover_after_crash(&p).code(0);
    assert_eq!(p.lines("log"), ["reverted"], "the half-done step was reverted first");
    assert_eq!(p.lines("db"), ["half", "full"], "then run once from the start, not on top of the half");
}

#[test]
fn a_tool_that_outlives_a_killed_rdeploy_makes_recover_wait_until_it_ends() {
    let p = Project::new();
    // The sub-change runs a separate program under `sh` (a list, so the shell forks it rather
    // than exec it): pdeathsig stops only the `sh`, the program lives on.
    p.file(
        "work.sh",
        "#!/bin/sh\ntouch b-started\nwhile [ -f hold ]; do sleep 0.05; done\necho b >> out\ntouch b-done\n",
    );
    std::fs::set_permissions(p.path("work.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p.stack(&WAITS.replace(
        "\"touch b-started; while [ -f hold ]; do sleep 0.05; done; echo b >> out; touch b-done\"",
        "\"./work.sh; true\"",
    ))
    .file("hold", "");
    let mut child = p.spawn(&["up"]);
    p.wait_for("b-started", Duration::from_secs(20));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();

    // recover waits for the old tool, saying what it waits for, and runs nothing meanwhile.
    let mut recover = p.spawn(&["recover"]);
    let mut stderr = std::io::BufReader::new(recover.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert_ne!(std::io::BufRead::read_line(&mut stderr, &mut line).unwrap(), 0, "recover never waited: {seen}");
        seen.push_str(&line);
        if line.contains("waiting for a tool started by a run that died") {
            assert!(line.contains("./work.sh"), "{line}");
            break;
        }
    }
    assert_eq!(p.lines("out"), ["a"], "nothing ran while the old tool was alive");

    p.remove("hold");
    std::io::Read::read_to_string(&mut stderr, &mut seen).unwrap();
    let status = recover.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{seen}");
    assert_eq!(p.lines("out"), ["a", "b", "c", "d"], "b landed once (its check saw it) and the rest ran");
}

/// After kill -9 the dead run's tool (here the program itself: `exec sleep`) exits on its
/// pdeathsig and stays a zombie until PID 1 reaps it, which here takes seconds: a zombie is not
/// a running tool, so a `recover` at once proceeds.
#[test]
fn recover_right_after_a_kill_9_is_not_stopped_by_the_dead_runs_zombie() {
    let p = Project::new();
    p.file("slow", "#!/bin/sh\nif [ -f started ]; then echo s >> out; exit 0; fi\ntouch started\nexec sleep 60\n");
    std::fs::set_permissions(p.path("slow"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p.stack(
        r#"
name: s
steps:
  - name: seed
    tool: shell
    sub_changes:
      - { name: a, run: ./slow }
      - { name: b, run: echo b >> out }
"#,
    );
    let mut child = p.spawn(&["up"]);
    p.wait_for("started", Duration::from_secs(20));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let running = p.path(&p.state("running"));
    let notes: String =
        std::fs::read_dir(&running).unwrap().map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap()).collect();
    let pid: i32 = notes.split('\t').next().unwrap().parse().unwrap_or_else(|_| panic!("notes: {notes:?}"));
    // Wait until the tool has exited (a zombie, or already reaped), as the next command would find it.
    let start = std::time::Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat[stat.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'))
    {
        assert!(start.elapsed() < Duration::from_secs(30), "the tool never got its pdeathsig");
        std::thread::sleep(Duration::from_millis(5));
    }
    let run = p.rdeploy(&["recover"]);
    run.code(0);
    assert!(!run.stderr.contains("waiting for"), "{}", run.stderr);
    assert_eq!(p.lines("out"), ["s", "b"]);
}

#[test]
fn on_failure_revert_keeps_the_checkpoint_when_a_failed_step_cannot_be_undone() {
    let p = Project::new();
    p.stack(
        r#"
name: s
on_failure: revert
steps:
  - name: a
    tool: shell
    run: touch a
    revert: rm a
  - name: hosts
    tool: shell
    needs: [a]
    sub_changes:
      - { name: web1, run: touch web1 }
      - { name: web2, run: exit 1 }
"#,
    );
    p.rdeploy(&["up"]).code(6).stderr_has("could not undo step `hosts`").stderr_has("web1");
    assert!(!p.exists("a"), "what could be reverted was");
    assert!(p.exists("web1"));
    let status = p.status();
    assert_eq!(status["state"], "partial", "a deploy with web1 in place is not 'reverted'");
    assert_eq!(step(&status, "a")["status"], "reverted");
}

#[test]
fn a_partial_step_outranks_a_clean_revert_in_the_exit_code() {
    let p = Project::new();
    p.stack(
        r#"
name: s
steps:
  - name: left
    tool: shell
    sub_changes:
      - { name: one, run: touch one }
      - { name: two, run: "sleep 0.3; exit 1" }
  - name: right
    tool: shell
    run: "touch right; exit 1"
    revert: rm right
"#,
    );
    p.rdeploy(&["up", "--parallel", "2"]).code(1);
    let status = p.status();
    assert_eq!(step(&status, "right")["status"], "reverted");
    assert_eq!(step(&status, "left")["status"], "failed");
}

#[test]
fn a_checkpoint_of_another_stack_in_the_same_directory_is_refused() {
    let p = Project::new();
    p.file("staging.yaml", &FIVE.replace("name: demo", "name: staging")).file("fail-five", "");
    p.file("prod.yaml", &FIVE.replace("name: demo", "name: prod"));
    p.rdeploy(&["up", "staging.yaml"]).code(1);
    // Side by side, each stack has its own state (`.rdeploy/NAME/`): prod has nothing recorded.
    p.rdeploy(&["recover", "prod.yaml"]).code(0).stdout_has("nothing to recover");
    // One directory given for both is refused to the other stack.
    p.rdeploy(&["--state-dir", ".rdeploy/staging", "recover", "prod.yaml"])
        .code(2)
        .stderr_has("belongs to stack `staging`, not `prod`");
    p.rdeploy(&["--state-dir", ".rdeploy/staging", "revert", "prod.yaml"])
        .code(2)
        .stderr_has("belongs to stack `staging`");
    assert_eq!(p.lines("out").len(), 4, "nothing of prod ran");
}

#[test]
fn a_crash_during_a_revert_is_finished_by_revert_not_glossed_over_by_recover() {
    let p = Project::new();
    p.stack(
        r#"
name: s
steps:
  - name: a
    tool: shell
    run: touch a
    revert: "touch reverting; while [ -f hold ]; do sleep 0.05; done; rm -f a"
"#,
    );
    p.rdeploy(&["up"]).code(0);
    p.file("hold", "");
    let mut child = p.spawn(&["revert"]);
    p.wait_for("reverting", Duration::from_secs(20));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();

    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert!(step(&status, "a")["revert_error"].as_str().unwrap().contains("stopped while this step's revert ran"));
    assert!(status["next"].as_str().unwrap().starts_with("rdeploy revert stack.yaml"));
    // The revert's shell got rdeploy's death signal with it, so nothing of it lives on (its
    // zombie is not a survivor): recover refuses at once to build on a half-undone step.
    recover_after_crash(&p).code(2).stderr_has("was being reverted").stderr_has("rdeploy revert stack.yaml");
    assert!(p.exists("a"), "recover neither reverted nor ran the half-reverted step");

    p.remove("hold");
    p.rdeploy(&["revert"]).code(0);
    assert!(!p.exists("a"));
    assert_eq!(p.status()["state"], "reverted");
}

#[test]
fn top_level_settings_must_be_single_values_and_a_bare_run_cannot_be_resumable() {
    let p = Project::new();
    p.stack("name: s\non_failure: [revert]\nsteps:\n  - name: a\n    tool: shell\n    run: x\n");
    p.rdeploy(&["validate"]).code(2).stderr_has("stack.yaml:2:13: `on_failure` must be a single value");
    p.stack("name: s\nsteps:\n  - name: a\n    tool: shell\n    resumable: true\n    run: x\n");
    p.rdeploy(&["validate"]).code(2).stderr_has("a bare `run` cannot be resumable");
    p.stack("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n");
    p.rdeploy(&["validate"]).code(0).stderr_has("is not resumable and declares no `revert`");
}

#[test]
fn bad_gate_values_and_bad_bytes_are_bad_input_at_validate_with_their_place() {
    let p = Project::new();
    let gated = "name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n    gate:\n      inventory:\n        contexts: [c]\n        image: r/a\n        version: \"2\"\n";
    p.stack(&format!("{gated}        kinds: [Deploymnt]\n"));
    p.rdeploy(&["validate"])
        .code(2)
        .stderr_has("stack.yaml:11:17: unknown workload kind `Deploymnt` in `gate.inventory.kinds`")
        .stderr_has("did you mean `Deployment`?");
    p.stack(&format!("{gated}        exceptions:\n          - {{cluster: e, reason: r, expires: not-a-date}}\n"));
    p.rdeploy(&["validate"])
        .code(2)
        .stderr_has("stack.yaml:12:46: the exception for `e`: `expires: not-a-date` is not a date");
    std::fs::write(p.path("stack.yaml"), b"name: s\nsteps:\n  - name: \xe9\n").unwrap();
    p.rdeploy(&["validate"]).code(2).stderr_has("stack.yaml:3:11: the file is not valid UTF-8 (byte 0xe9)");
    p.stack("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: x\n    run: y\n");
    p.rdeploy(&["validate"])
        .code(2)
        .stderr_has("stack.yaml:6:5: key `run` appears twice in the same mapping (first on line 5)");
}

/// Issue 31 point 6: `validate` (and `up`, which checks the same way) reports every problem of
/// the stack file in one run, in the order of the file, each at its place: a duplicate key does
/// not end the check; a step with a bad value still counts as a step (`needs: [base]` is fine);
/// `needs` and references get a did-you-mean; `wait: yes please` says which values are taken; a
/// local chart path with a typo is caught here, not by helm at `up`.
#[test]
fn validate_reports_every_problem_in_one_run_in_file_order() {
    let mut p = Project::new();
    // helm's repositories as this test says, whatever the machine's helm knows.
    p.env("HELM_REPOSITORY_CONFIG", "/nonexistent/repositories.yaml");
    p.file("charts/web/Chart.yaml", "apiVersion: v2\nname: web\nversion: 0.1.0\n");
    p.stack(
        r#"name: demo
steps:
  - name: base
    tool: helm
    release: base
    chart: charts/web
    wait: yes please
  - name: web
    tool: helm
    needs: [base, infr]
    release: web
    chart: charts/webb
    set:
      host: ${{ steps.infar.outputs.hostname }}
  - name: infra
    tool: shell
    run: ./make-infra.sh
    timeout: 5 minutes
    timeout: 3m
    retri: 3
"#,
    );
    let validate = p.rdeploy(&["validate"]);
    validate.code(2);
    insta::assert_snapshot!("validate_every_problem", validate.stderr);
    // `up` refuses with the same problems, before running anything.
    let up = p.rdeploy(&["up"]);
    up.code(2);
    assert_eq!(up.stderr, validate.stderr);
    assert!(!p.exists(".rdeploy/demo/checkpoint.json"), "nothing ran");
}

/// A few rounds of benches/crash-loop.sh: kill -9 at a random moment of `up` (and of a
/// `recover`), then one `recover`: it converges at once (no refusal, no human step) and no
/// sub-change whose effect landed runs again.
#[test]
fn crash_loop_kill_9_during_up_and_recover_converges_without_double_applies() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let mut rng = seed;
    let mut next = |n: usize| {
        rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        (rng >> 16) as usize % n
    };
    let names: Vec<String> = (1..=6).map(|i| format!("s{i}")).collect();
    let mut stack = "name: s\nsteps:\n  - name: seed\n    tool: shell\n    sub_changes:\n".to_string();
    for name in &names {
        stack.push_str(&format!(
            "      - {{ name: {name}, run: \"sleep 0.05; echo {name} >> effects\", check: \"grep -qx {name} effects\" }}\n"
        ));
    }
    for round in 0..4 {
        let p = Project::new();
        p.stack(&stack);
        let landed = |p: &Project| if p.exists("effects") { p.lines("effects").len() } else { 0 };
        let kill_when = |p: &Project, args: &[&str], at: usize| {
            let mut child = p.spawn(args);
            let start = std::time::Instant::now();
            while landed(p) < at && child.try_wait().unwrap().is_none() {
                assert!(start.elapsed() < Duration::from_secs(60), "seed {seed}: {args:?} never reached {at}");
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            child.wait().unwrap();
        };
        // After at least one landed effect, so there is a deploy to recover.
        let at = 1 + next(names.len() - 1);
        kill_when(&p, &["up"], at);
        if round % 2 == 1 {
            kill_when(&p, &["recover"], at + next(names.len() - at));
        }
        let run = p.rdeploy(&["recover"]);
        run.code(0);
        assert_eq!(p.status()["state"], "complete", "seed {seed}, round {round}");
        let mut effects = p.lines("effects");
        effects.sort();
        assert_eq!(effects, names, "seed {seed}, round {round}: each sub-change applied exactly once");
    }
}

/// SIGINT at random early moments of `up` never kills rdeploy by the default action and is never
/// reported as bad input: 0 (the run ended first) or 130. The moments start once Rust's runtime
/// has set SIGPIPE to ignored (`SigIgn` in /proc, just before `main`), plus at least 100 µs:
/// before that the dynamic loader runs (10-20 ms for the debug binary here), where no program
/// can catch a signal yet; the handlers are installed before that marker (`.init_array`).
#[test]
fn sigint_at_random_early_moments_is_never_a_default_death_nor_exit_2() {
    use std::os::unix::process::ExitStatusExt;
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let mut rng = seed;
    let mut next = |n: u32| {
        rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        (rng >> 16) % n
    };
    let in_main = |pid: u32| {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return true };
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (libc::SIGPIPE - 1)) != 0)
    };
    let (mut interrupted, mut finished) = (0, 0);
    for round in 0..50 {
        let p = Project::new();
        p.stack(FIVE);
        let mut child = p.spawn(&["up"]);
        let start = std::time::Instant::now();
        while !in_main(child.id()) && child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(30), "seed {seed} round {round}: rdeploy never started");
            std::hint::spin_loop();
        }
        // The random moment is the point of the test: anywhere in the first ~20 ms of `main`.
        let delay = 100 + u64::from(next(20_000));
        std::thread::sleep(Duration::from_micros(delay));
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.signal(),
            None,
            "seed {seed} round {round}: killed by a signal after {delay} µs; stderr: {stderr}"
        );
        let code = output.status.code().unwrap();
        assert!(code == 0 || code == 130, "seed {seed} round {round}: exit {code}; stderr: {stderr}");
        if code == 130 {
            interrupted += 1;
        } else {
            finished += 1;
        }
    }
    eprintln!("50 runs: {interrupted} interrupted (130), {finished} finished first (0)");
}

/// A reader that closes stdout early (`rdeploy runbook | head`) ends the output quietly: no panic,
/// and the command keeps its own exit code. The runbook is larger than a pipe's buffer, so a
/// write meets the closed pipe whatever the timing.
#[test]
fn a_closed_stdout_ends_the_output_quietly_with_the_commands_exit_code() {
    let p = Project::new();
    let mut stack = "name: s\nsteps:\n".to_string();
    for i in 0..400 {
        stack.push_str(&format!("  - name: step-{i}\n    tool: shell\n    run: echo {i}\n    revert: echo undo {i}\n"));
    }
    p.stack(&stack);
    let mut child = p.spawn(&["runbook"]);
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "a closed pipe is not an error to report: {stderr}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
}

/// `--help` reads as a list (one line per command), every flag has text, `output` shows its
/// real usage, and `plan --json` points at a page that exists.
#[test]
fn help_lists_one_line_per_command_and_every_flag_has_text() {
    let p = Project::new();
    let top = p.rdeploy(&["--help"]);
    top.code(0);
    let commands: String = top
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    insta::assert_snapshot!("help_commands", commands);
    for command in ["recover", "ci"] {
        let help = p.rdeploy(&[command, "--help"]);
        // The text is on the flag's line, or under it when the help is in its long form.
        let lines: Vec<&str> = help.stdout.lines().collect();
        let at = lines.iter().position(|l| l.contains("--parallel")).expect("--parallel is listed");
        let parallel = lines[at..(at + 2).min(lines.len())].join("\n");
        assert!(parallel.contains("Run up to N independent steps at once"), "`{command} --help`: {parallel}");
    }
    p.rdeploy(&["output", "--help"]).code(0).stdout_has("Usage: rdeploy output [OPTIONS] [STACK] [STEP [KEY]]");
    let plan = p.rdeploy(&["plan", "--help"]);
    plan.stdout_has("docs/plan.md");
    assert!(!plan.stdout.contains("SPEC.md"), "{}", plan.stdout);
    assert!(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/plan.md").is_file());
}

/// `inventory` and `alerts` take the fleet's scope flags from one definition: each flag reads
/// the same in both commands' help, and says what it defaults to.
#[test]
fn inventory_and_alerts_describe_their_scope_flags_alike() {
    let p = Project::new();
    // A flag's text, its words joined by single spaces: on the flag's line or under it, up to
    // the next flag or a blank line (columns differ between commands).
    let flag_text = |help: &str, flag: &str| -> String {
        let mut lines = help.lines().skip_while(|l| !l.trim_start().starts_with(&format!("{flag} ")));
        let first = lines.next().unwrap_or_else(|| panic!("`{flag}` is not listed:\n{help}"));
        let rest = lines.take_while(|l| !l.trim().is_empty() && !l.trim_start().starts_with('-'));
        std::iter::once(first).chain(rest).flat_map(str::split_whitespace).collect::<Vec<_>>().join(" ")
    };
    let inventory = p.rdeploy(&["inventory", "--help"]);
    inventory.code(0);
    let alerts = p.rdeploy(&["alerts", "--help"]);
    alerts.code(0);
    for (flag, says) in [
        ("--kubeconfig", "(default: `$KUBECONFIG`, else `~/.kube/config`)"),
        ("--contexts", "(default: every cluster of the fleet file, else every context)"),
        ("--fleet", "its clusters are the fleet"),
    ] {
        let text = flag_text(&inventory.stdout, flag);
        assert!(text.contains(says), "`inventory {flag}`: {text}");
        assert_eq!(text, flag_text(&alerts.stdout, flag), "`{flag}` reads differently in `alerts --help`");
    }
}

/// `--no-color` is `--color never`; `validate --json` gives editors and CI every problem with
/// its place, or the steps; `validate DIR` reads `DIR/stack.yaml`.
#[test]
fn validate_json_and_a_directory_and_no_color() {
    let p = Project::new();
    p.file("deploy/stack.yaml", FIVE);
    let run = p.rdeploy(&["validate", "deploy", "--json", "--no-color", "--color", "always"]);
    run.code(0);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["stack"], "demo");
    assert_eq!(v["steps"][0]["name"], "seed");
    assert_eq!(v["steps"][0]["tool"], "shell");
    p.rdeploy(&["validate", "deploy"]).code(0).stdout_has("ok, 2 steps");

    p.file("bad/stack.yaml", "name: x\nsteps:\n  - name: a\n    tool: shell\n    rnu: echo\n");
    let run = p.rdeploy(&["validate", "bad", "--json"]);
    run.code(2);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["valid"], false);
    let problem = &v["problems"][0];
    assert_eq!((problem["line"].as_u64(), problem["column"].as_u64()), (Some(5), Some(5)), "{v}");
    assert!(problem["file"].as_str().unwrap().ends_with("bad/stack.yaml"), "{v}");
    assert!(problem["message"].as_str().unwrap().contains("unknown key `rnu`"), "{v}");
    assert!(problem["hint"].as_str().unwrap().contains("`run`"), "{v}");
    // With colour forced, `--no-color` still wins: no escape codes.
    let status = p.rdeploy(&["status", "deploy", "--color", "always", "--no-color"]);
    assert!(!status.stdout.contains('\u{1b}'), "{}", status.stdout);
    assert!(p.rdeploy(&["status", "deploy", "--color", "always"]).stdout.contains('\u{1b}'));
}

/// Install conveniences: `--version` names the commit the binary was built from, `completions`
/// writes a script the shell accepts, `man` a page `man` renders.
#[test]
fn version_names_the_commit_and_completions_and_man_page_are_generated() {
    let p = Project::new();
    let version = p.rdeploy(&["--version"]);
    version.code(0);
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git is needed to check --version: `apt-get install git`");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert_eq!(head.len(), 12, "this test runs in the git checkout it was built from");
    // Built from this checkout (build.rs reruns when HEAD moves).
    assert!(
        version.stdout.starts_with(&format!("rdeploy {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{}",
        version.stdout
    );
    let commit = version.stdout.split("(commit ").nth(1).unwrap_or_default();
    assert!(commit.starts_with(&head), "built from {head}: {}", version.stdout);

    let bash = p.rdeploy(&["completions", "bash"]);
    bash.code(0).stdout_has("complete -F _rdeploy").stdout_has("recover");
    p.file("rdeploy.bash", &bash.stdout);
    let check = std::process::Command::new("bash").args(["-n"]).arg(p.path("rdeploy.bash")).output().unwrap();
    assert!(check.status.success(), "bash rejects the completion script: {}", String::from_utf8_lossy(&check.stderr));
    p.rdeploy(&["completions", "zsh"]).code(0).stdout_has("#compdef rdeploy");
    p.rdeploy(&["completions", "fish"]).code(0).stdout_has("complete -c rdeploy");
    p.rdeploy(&["completions", "tcsh"]).code(2);

    let man = p.rdeploy(&["man"]);
    man.code(0).stdout_has(".TH rdeploy 1");
    p.file("rdeploy.1", &man.stdout);
    let rendered = std::process::Command::new("man")
        .args(["-l", "-P", "cat"])
        .arg(p.path("rdeploy.1"))
        .env("MANWIDTH", "100")
        .output()
        .expect("man is needed to check the page: `apt-get install man-db`");
    let text = String::from_utf8_lossy(&rendered.stdout);
    assert!(text.contains("Resumable multi") && text.contains("--state-dir"), "{text}");
}

/// After Ctrl-C the report says the step was interrupted by the user and that `recover`
/// resumes, not a guess at a fault of the tool ("check that the cluster is reachable").
#[test]
fn ctrl_c_is_reported_as_interrupted_by_the_user_with_recover_as_the_way_on() {
    let p = Project::new();
    p.stack(
        r#"
name: s
steps:
  - name: seed
    tool: shell
    sub_changes:
      - { name: one, run: "touch started; while [ -f hold ]; do sleep 0.05; done; echo one >> out" }
"#,
    )
    .file("hold", "");
    let child = p.spawn(&["up"]);
    p.wait_for("started", Duration::from_secs(20));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    let lines: String = report
        .lines()
        .filter(|l| ["why:", "hint:", "next:", "interrupted", "failed:"].iter().any(|w| l.contains(w)))
        .collect::<Vec<_>>()
        .join("\n");
    insta::assert_snapshot!("ctrl_c_report", lines);
    p.remove("hold");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.lines("out"), ["one"]);
}

/// Counts read as English: `1 step`, not `1 steps`.
#[test]
fn counts_are_pluralised() {
    let p = Project::new();
    p.stack("name: one\nsteps:\n  - name: a\n    tool: shell\n    run: \"true\"\n");
    let validate = p.rdeploy(&["validate"]);
    let up = p.rdeploy(&["up"]);
    up.code(0);
    let started = up.stderr.lines().find(|l| l.contains("deploy ") && l.contains("of stack one")).unwrap_or_default();
    let started = started.split_once("deploy ").map(|(_, rest)| rest).unwrap_or_default();
    let started = started.split_once(' ').map(|(_, rest)| rest).unwrap_or_default();
    insta::assert_snapshot!(
        "counts_one_step",
        format!("{}\n{started}", validate.stdout.lines().next().unwrap_or_default())
    );
}

/// Issue 31, point 7: a complete deploy's counts read as counts (`1 declared sub-change`, `2
/// declared sub-changes`), not `1/1 declared sub-changes`.
#[test]
fn complete_deploy_counts_read_as_counts() {
    let p = Project::new();
    p.stack(
        r#"
name: shop
steps:
  - name: one
    tool: shell
    run: "true"
  - name: two
    tool: shell
    sub_changes:
      - { name: a, run: "true" }
      - { name: b, run: "true" }
"#,
    );
    let run = p.rdeploy(&["up"]);
    run.code(0);
    insta::assert_snapshot!("complete_deploy_counts", run.stdout);
}

/// Issue 31, point 11: on a terminal a running step's bar shows how long it has run, ticking
/// (`[3s elapsed]`, as terraform's `Still creating... [20s elapsed]`). The terminal is a pty
/// from util-linux's `script`; the step waits for a file the test writes once the bar said so.
#[test]
fn a_running_step_shows_its_elapsed_time_on_a_terminal() {
    let script = common::require_tool("script", "apt-get install bsdutils (util-linux's `script`)");
    let p = Project::new();
    p.stack("name: s\nsteps:\n  - name: wait\n    tool: shell\n    run: while [ ! -f go ]; do sleep 0.1; done\n");
    use std::os::unix::process::CommandExt;
    // `script -c` hands its command to a shell: the path quoted, whatever it holds.
    let rdeploy = env!("CARGO_BIN_EXE_rdeploy").replace('\'', r"'\''");
    let child = std::process::Command::new(script)
        .args(["-qfec", &format!("'{rdeploy}' up"), "/dev/null"])
        .process_group(0)
        .current_dir(p.path(""))
        .env_remove("CI")
        .env("NO_COLOR", "1")
        .env("COLUMNS", "120")
        .env_remove("RDEPLOY_STATE_DIR")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start script");
    // Whatever an assert below says, the step's loop ends and `script` stops.
    let mut guard = Release { go: p.path("go"), child };
    let mut stdout = guard.child.stdout.take().expect("piped");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut stdout, &mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    // Two different readings of the clock: the bar ticks while the step runs. A reading is
    // written as the bar writes it: `7s`, `1m05s`, `1h02m`.
    let ticking = regex::Regex::new(r"\[(?:(\d+)h(\d+)m|(?:(\d+)m)?(\d+)s) elapsed\]").unwrap();
    let seconds = |c: regex::Captures<'_>| -> Option<u64> {
        let n = |i: usize| c.get(i).map_or(Some(0), |m| m.as_str().parse::<u64>().ok());
        Some(n(1)? * 3600 + n(2)? * 60 + n(3)? * 60 + n(4)?)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let readings = loop {
        let text = seen.lock().unwrap().clone();
        let mut readings: Vec<u64> = ticking.captures_iter(&text).filter_map(seconds).filter(|s| *s > 0).collect();
        readings.dedup();
        if readings.len() >= 2 {
            break readings;
        }
        assert!(std::time::Instant::now() < deadline, "no ticking elapsed time on the terminal:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(readings.windows(2).all(|w| w[0] < w[1]), "{readings:?}");
    p.file("go", "");
    let status = guard.child.wait().expect("script ends");
    reader.join().expect("reader");
    assert!(status.success(), "{}", seen.lock().unwrap());
    assert_eq!(p.status()["state"], "complete");
}

/// Ends a step waiting for `go` and the `script` running it (in a process group of its own), if
/// it has not ended: a failed assert must not leave the loop and `script` running for ever.
struct Release {
    go: std::path::PathBuf,
    child: std::process::Child,
}

impl Drop for Release {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = std::fs::write(&self.go, "");
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

/// Issue 31, point 11: plain progress lines (not a terminal, CI) are stamped to the millisecond.
#[test]
fn plain_progress_lines_are_stamped_to_the_millisecond() {
    let p = Project::new();
    p.stack("name: s\nsteps:\n  - name: one\n    tool: shell\n    run: \"true\"\n");
    let run = p.rdeploy(&["up"]);
    run.code(0);
    let stamp = regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \S").unwrap();
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(!lines.is_empty());
    for line in lines {
        assert!(stamp.is_match(line), "{line:?}");
    }
}

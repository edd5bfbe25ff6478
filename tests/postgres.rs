//! The PostgreSQL store end to end: the real binary against a throwaway PostgreSQL server
//! (`initdb` + `pg_ctl` on a loopback port), with leases shortened so takeovers are quick.

mod common;
#[path = "common/postgres.rs"]
mod pg;

use std::process::Child;
use std::time::{Duration, Instant};

use common::{step, sub_statuses, Project, Run, FIVE};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pg::PgServer;

/// Lease and heartbeat of every run in these tests (seconds).
const LEASE: f64 = 2.0;

/// A project whose runs keep their state in `server` (through `RDEPLOY_STATE`).
fn project(server: &PgServer) -> Project {
    let mut p = Project::new();
    p.env("RDEPLOY_STATE", &server.url());
    lease_env(&mut p);
    p
}

fn lease_env(p: &mut Project) {
    p.env("RDEPLOY_LEASE_SECONDS", &LEASE.to_string()).env("RDEPLOY_HEARTBEAT_SECONDS", "0.3");
}

fn wait(child: Child, args: &[&str]) -> Run {
    Run::from(child.wait_with_output().unwrap(), args)
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

/// Sleeps past a lease a dead or paused holder can no longer renew.
fn let_the_lease_expire() {
    std::thread::sleep(Duration::from_secs_f64(LEASE + 0.7));
}

/// The second sub-change waits while `hold` exists, so a test can act on the run there; `c`
/// fails while `fail-c` exists and counts its attempts.
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
      - { name: c, run: "echo c >> attempts; if [ -f fail-c ]; then echo 'c: refused' >&2; exit 1; fi; echo c >> out" }
  - name: after
    tool: shell
    needs: [seed]
    sub_changes:
      - { name: d, run: echo d >> out }
"#;

fn sub<'a>(status: &'a serde_json::Value, step_name: &str, id: &str) -> &'a serde_json::Value {
    step(status, step_name)["sub_changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {status}"))
}

#[test]
fn two_runners_on_one_stack_one_gets_the_lock_the_other_exits_5() {
    let server = PgServer::start();
    let p = project(&server);
    p.stack("name: s\nsteps:\n  - name: slow\n    tool: shell\n    sub_changes:\n      - { name: wait, run: 'touch started; while [ ! -f go ]; do sleep 0.05; done' }\n");
    let first = p.spawn(&["up"]);
    p.wait_for("started", Duration::from_secs(20));

    // A second runner elsewhere (its own scratch directory) shares only the database.
    p.rdeploy(&["up", "--state-dir", "runner-2"])
        .code(5)
        .stderr_has("another run holds the lock")
        .stderr_has("`rdeploy up`")
        .stderr_has("lease renewed");
    p.rdeploy(&["recover", "--state-dir", "runner-2"]).code(5);

    // status names the holder and the age of its lease, which the heartbeat keeps young.
    std::thread::sleep(Duration::from_secs_f64(LEASE));
    let status = p.status();
    assert_eq!(status["lock"]["command"], "up", "{status}");
    assert_eq!(status["lock"]["pid"], first.id());
    let age = status["lock"]["lease_age"].as_f64().unwrap();
    assert!(age < LEASE, "the heartbeat renews the lease: {status}");
    assert!(status["lock"]["lease_expires_in"].as_f64().unwrap() > 0.0);
    p.rdeploy(&["status"]).code(0).stdout_has("in progress: `rdeploy up`").stdout_has("lease renewed");

    // One database serves many stacks: another stack deploys meanwhile.
    let other = project(&server);
    other.stack("name: other\nsteps:\n  - name: a\n    tool: shell\n    run: 'true'\n");
    other.rdeploy(&["up"]).code(0);

    p.file("go", "");
    wait(first, &["up"]).code(0);
    assert_eq!(server.psql("SELECT count(*) FROM rdeploy.locks"), "0", "a clean exit releases the lease");
    assert_eq!(server.psql("SELECT count(*) FROM rdeploy.journals"), "0", "finished deploys leave no journal");
    assert_eq!(
        server.psql("SELECT string_agg(stack || ':' || state, ',' ORDER BY id) FROM rdeploy.history"),
        "other:complete,s:complete"
    );
    assert_eq!(
        server.psql("SELECT string_agg(version::text, ',' ORDER BY version) FROM rdeploy.schema_migrations"),
        "1,2"
    );
    assert!(!p.exists(&p.state("journal.jsonl")), "nothing is journaled locally");
}

#[test]
fn a_runner_killed_with_kill_9_loses_its_lease_and_another_recovers_the_deploy() {
    let server = PgServer::start();
    let mut p = project(&server);
    // A longer lease than the other tests: the second runner must reach the database while the
    // dead one's lease still runs, even on a slow machine.
    const KILLED_LEASE: f64 = 6.0;
    p.env("RDEPLOY_LEASE_SECONDS", &KILLED_LEASE.to_string());
    p.stack(WAITS).file("hold", "");
    let child = p.spawn(&["up"]);
    p.wait_for("b-started", Duration::from_secs(20));
    signal(&child, Signal::SIGKILL);
    wait(child, &["up"]);
    let killed = Instant::now();

    // Its lease still runs for a moment: nobody may take over before it expires.
    p.rdeploy(&["recover", "--state-dir", "runner-2"]).code(5).stderr_has("expires in");

    std::thread::sleep(Duration::from_secs_f64(KILLED_LEASE + 0.7).saturating_sub(killed.elapsed()));
    let status = p.status();
    assert!(status["lock"].is_null(), "an expired lease has no holder: {status}");
    assert_eq!(status["state"], "partial");
    assert_eq!(step(&status, "seed")["status"], "failed", "a step the dead run left running is failed");
    assert_eq!(sub(&status, "seed", "b")["uncertain"], true, "the sub-change in flight is uncertain: {status}");
    assert_eq!(p.lines("out"), ["a"]);

    p.remove("hold");
    p.rdeploy(&["recover", "--state-dir", "runner-2"]).code(0).stderr_has("took over");
    assert_eq!(p.lines("out"), ["a", "b", "c", "d"], "no completed sub-change ran again");
    assert_eq!(p.status()["state"], "complete");
}

#[test]
fn a_paused_runner_cannot_write_after_its_lease_was_taken_over() {
    let server = PgServer::start();
    let p = project(&server);
    p.stack(WAITS).file("hold", "").file("fail-c", "");
    let paused = p.spawn(&["up"]);
    p.wait_for("b-started", Duration::from_secs(20));
    signal(&paused, Signal::SIGSTOP);
    let_the_lease_expire();

    // b lands while its rdeploy is stopped; another runner takes over and stops at c.
    p.remove("hold");
    p.wait_for("b-done", Duration::from_secs(20));
    p.rdeploy(&["recover", "--state-dir", "runner-2"]).code(1).stderr_has("took over").stdout_has("c: refused");
    let records = server.psql("SELECT count(*) FROM rdeploy.records");
    let before = p.status();
    assert_eq!(sub_statuses(&before, "seed")[1], ("b".to_string(), "done".to_string()), "b's check found it in place");

    // The paused runner wakes up: every write is fenced, it stops without running c.
    signal(&paused, Signal::SIGCONT);
    let run = wait(paused, &["up"]);
    run.code(1).stderr_has("lost the lock on stack `s`");
    assert_eq!(
        server.psql("SELECT count(*) FROM rdeploy.records"),
        records,
        "nothing the paused run wrote after the takeover exists"
    );
    assert_eq!(p.status()["steps"], before["steps"]);
    assert_eq!(p.lines("attempts"), ["c"], "the paused run started nothing after losing its lease");

    p.remove("fail-c");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.lines("out"), ["a", "b", "c", "d"]);
}

#[test]
fn the_database_restarted_mid_deploy_records_are_retried_and_the_deploy_completes() {
    let server = PgServer::start();
    let p = project(&server);
    p.stack(WAITS).file("hold", "");
    let child = p.spawn(&["up"]);
    p.wait_for("b-started", Duration::from_secs(20));
    // A crash, not a clean shutdown: b finishes while the database is down.
    server.crash();
    p.remove("hold");
    p.wait_for("b-done", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(800));
    server.start_again();

    let run = wait(child, &["up"]);
    run.code(0).stdout_has("deploy complete").stderr_has("is unreachable");
    assert_eq!(p.lines("out"), ["a", "b", "c", "d"]);
    let status = p.status();
    assert_eq!(status["state"], "complete");
    assert_eq!(sub_statuses(&status, "seed").iter().filter(|(_, s)| s == "done").count(), 3);
}

#[test]
fn a_database_that_stays_down_stops_the_run_with_exit_1_and_loses_nothing() {
    let server = PgServer::start();
    let mut p = project(&server);
    p.env("RDEPLOY_STATE_RETRY_SECONDS", "2");
    p.stack(WAITS).file("hold", "");
    let child = p.spawn(&["up"]);
    p.wait_for("b-started", Duration::from_secs(20));
    server.stop();
    let stopped = Instant::now();
    p.remove("hold");
    let run = wait(child, &["up"]);
    run.code(1)
        .stderr_has("is unreachable while writing the checkpoint journal")
        .stderr_has("`rdeploy recover` resumes");
    assert!(stopped.elapsed() < Duration::from_secs(20), "the retries are bounded: {:?}", stopped.elapsed());
    assert_eq!(p.lines("out"), ["a", "b"], "the sub-change in flight finished; nothing after it ran");

    server.start_again();
    let_the_lease_expire();
    let status = p.status();
    assert_eq!(sub(&status, "seed", "a")["status"], "done", "what was recorded is kept: {status}");
    assert_eq!(sub(&status, "seed", "b")["uncertain"], true, "b's end was never recorded: {status}");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.lines("out"), ["a", "b", "c", "d"], "b's check kept it from running twice");
}

#[test]
fn four_of_five_then_recover_on_postgres_with_state_in_the_stack_file() {
    let server = PgServer::start();
    let mut p = Project::new();
    lease_env(&mut p);
    p.stack(&format!("state: {}\n{FIVE}", server.url())).file("fail-five", "");

    p.rdeploy(&["up"]).code(1).stdout_has("five: connection refused").stdout_has("next: rdeploy recover stack.yaml");
    assert_eq!(p.lines("out"), ["one", "two", "three", "four"]);
    let status = p.status();
    assert_eq!(status["state"], "partial");
    assert_eq!(
        sub_statuses(&status, "seed"),
        [("one", "done"), ("two", "done"), ("three", "done"), ("four", "done"), ("five", "failed")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(step(&status, "seed")["exit_code"], 3);
    assert_eq!(step(&status, "after")["status"], "skipped");

    p.rdeploy(&["up"]).code(2).stderr_has("rdeploy recover stack.yaml").stderr_has("stack demo");
    p.remove("fail-five");
    p.rdeploy(&["recover", "--dry-run"]).code(0).stdout_has("run five").stdout_has("keep one: done");
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"]);
    assert_eq!(p.status()["state"], "complete");
    assert!(!p.exists(&p.state("journal.jsonl")));
    p.rdeploy(&["up"]).code(0);
    p.rdeploy(&["recover"]).code(0).stdout_has("nothing to recover");
}

#[test]
fn complete_or_revert_on_postgres() {
    let server = PgServer::start();
    let p = project(&server);
    p.stack(
        r#"
name: migrate
steps:
  - name: prepare
    tool: shell
    run: echo prepare >> out
    revert: "echo prepare >> reverted"
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
    assert_eq!(step(&status, "migrate")["status"], "reverted");
    assert_eq!(step(&status, "prepare")["status"], "done");

    p.remove("fail");
    p.rdeploy(&["recover"]).code(0);
    assert_eq!(p.read("schema"), "migrated\n");
    assert_eq!(p.lines("out"), ["prepare"], "completed steps stay done");

    p.rdeploy(&["revert"]).code(0).stdout_has("deploy reverted");
    assert_eq!(p.lines("reverted"), ["prepare"]);
    assert_eq!(p.status()["state"], "reverted");
}

#[test]
fn state_migrate_moves_a_checkpoint_to_postgres_and_back() {
    let server = PgServer::start();
    let url = server.url();
    let mut p = Project::new();
    lease_env(&mut p);
    p.stack(FIVE).file("fail-five", "");

    // A deploy stopped part-way in the local directory moves to the database ...
    p.rdeploy(&["up"]).code(1);
    p.rdeploy(&["state", "migrate", "--from", ".rdeploy", "--to", &url])
        .code(0)
        .stdout_has("unfinished deploy")
        .stdout_has("moved (");
    assert!(!p.exists(&p.state("journal.jsonl")), "the source can no longer be resumed");
    p.rdeploy(&["recover"]).code(0).stdout_has("nothing to recover");
    let status: serde_json::Value =
        serde_json::from_str(&p.rdeploy(&["status", "--json", "--state", &url]).code(0).stdout).unwrap();
    assert_eq!(status["state"], "partial");
    assert_eq!(sub_statuses(&status, "seed")[4], ("five".to_string(), "failed".to_string()));

    // ... where another runner finishes it.
    p.remove("fail-five");
    p.rdeploy(&["recover", "--state", &url]).code(0).stdout_has("deploy complete");
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"]);

    // Back: a database holds many stacks, so the stack is named.
    p.rdeploy(&["state", "migrate", "--from", &url, "--to", "back"]).code(2).stderr_has("--stack NAME");
    p.file("fail-five", "");
    p.rdeploy(&["up", "--state", &url]).code(1);
    p.rdeploy(&["state", "migrate", "--from", &url, "--to", "back", "--stack", "demo"]).code(0).stdout_has("moved (");
    assert_eq!(server.psql("SELECT count(*) FROM rdeploy.journals"), "0");
    let status: serde_json::Value =
        serde_json::from_str(&p.rdeploy(&["status", "--json", "--state-dir", "back"]).code(0).stdout).unwrap();
    assert_eq!(status["state"], "partial");
    p.remove("fail-five");
    p.rdeploy(&["recover", "--state-dir", "back"]).code(0);
    assert_eq!(p.status_in("back")["state"], "complete");
    // The history came along: the first deploy (completed on PostgreSQL) and the second.
    assert_eq!(std::fs::read_dir(p.path("back/history")).unwrap().count(), 2);
    // History moves too, and moving it again adds no duplicate.
    p.rdeploy(&["state", "migrate", "--from", "back", "--to", &url]).code(0).stdout_has("1 finished deploy(s)");
    p.rdeploy(&["state", "migrate", "--from", "back", "--to", &url]).code(0).stdout_has("0 finished deploy(s)");
    assert_eq!(server.psql("SELECT count(*) FROM rdeploy.history WHERE stack = 'demo'"), "2");
}

#[test]
fn a_schema_newer_than_this_rdeploy_is_refused() {
    let server = PgServer::start();
    let p = project(&server);
    p.stack("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: 'true'\n");
    p.rdeploy(&["up"]).code(0);
    server.psql("INSERT INTO rdeploy.schema_migrations (version, name) VALUES (99, 'from the future')");
    p.rdeploy(&["up"]).code(1).stderr_has("schema is version 99, newer than this rdeploy knows");
}

/// TLS with libpq's sslmode meanings, against a server that accepts TLS connections only:
/// verify-full checks the chain and the host name, verify-ca the chain only, require encrypts
/// without checking; a certificate that does not verify fails at once, not after retries.
#[test]
fn tls_follows_libpq_sslmode_against_a_server_that_accepts_tls_only() {
    let ca = pg::TestCa::new();
    let server = PgServer::start_tls(&ca);
    let rogue = pg::TestCa::new();
    let url = |host: &str, query: &str| format!("postgres://postgres@{host}:{}/postgres?{query}", server.port);
    let with_ca = |mode: &str, ca: &pg::TestCa| format!("sslmode={mode}&sslrootcert={}", ca.ca_file().display());
    let run = |state: &str| {
        let mut p = Project::new();
        p.env("RDEPLOY_STATE", state).env("RDEPLOY_STATE_RETRY_SECONDS", "20");
        lease_env(&mut p);
        p.stack("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: echo a >> out\n");
        let started = Instant::now();
        let run = p.rdeploy(&["up"]);
        (p, run, started.elapsed())
    };

    // The certificate names `localhost`: verify-full succeeds there (over TLS: the server takes
    // nothing else) ...
    let (p, up, _) = run(&url("localhost", &with_ca("verify-full", &ca)));
    up.code(0).stdout_has("deploy complete");
    assert_eq!(p.lines("out"), ["a"]);
    // ... and refuses 127.0.0.1, which it does not name, at once.
    let (p, up, took) = run(&url("127.0.0.1", &with_ca("verify-full", &ca)));
    up.code(1).stderr_has("TLS certificate was not accepted");
    assert!(took < Duration::from_secs(15), "a certificate verdict is not retried: {took:?}");
    assert!(!p.exists("out"));
    // verify-ca checks the chain only.
    run(&url("127.0.0.1", &with_ca("verify-ca", &ca))).1.code(0);
    // A certificate from another CA is refused.
    run(&url("localhost", &with_ca("verify-full", &rogue))).1.code(1).stderr_has("invalid peer certificate");
    // require encrypts without verifying, as libpq does without a root certificate.
    run(&url("127.0.0.1", "sslmode=require")).1.code(0);
    // disable: the server turns a plain connection away, and its reason reaches the operator.
    run(&url("127.0.0.1", "sslmode=disable")).1.code(1).stderr_has("no encryption");
    // A Unix socket has no host name, and PostgreSQL offers no TLS there: `prefer` (the
    // default) connects in plain text, as psql does.
    let socket = server.dir().display().to_string().replace('/', "%2F");
    run(&format!("postgres://postgres@{socket}:{}/postgres", server.port)).1.code(0);
    // Only `hostaddr=`: the address is the name the certificate is checked against.
    let hostaddr = format!("postgres://postgres@/postgres?hostaddr=127.0.0.1&port={}", server.port);
    run(&format!("{hostaddr}&{}", with_ca("verify-ca", &ca))).1.code(0);
    run(&format!("{hostaddr}&{}", with_ca("verify-full", &ca))).1.code(1).stderr_has("not accepted");
    // An empty host name leaves verify-full nothing to check: refused before connecting.
    let empty_host = format!("postgres://postgres@:{}/postgres?hostaddr=127.0.0.1", server.port);
    run(&format!("{empty_host}&{}", with_ca("verify-full", &ca))).1.code(2).stderr_has("gives an empty one");
    run(&format!("{empty_host}&{}", with_ca("verify-ca", &ca))).1.code(0);
    // A socket never tries TLS, even when the environment asks for it.
    let mut p = Project::new();
    p.env("RDEPLOY_STATE", &format!("postgres://postgres@{socket}:{}/postgres", server.port))
        .env("PGSSLMODE", "require");
    lease_env(&mut p);
    p.stack("name: s\nsteps:\n  - name: a\n    tool: shell\n    run: 'true'\n");
    p.rdeploy(&["up"]).code(0);
    // Mistakes in the settings are bad input, before anything runs.
    run(&url("localhost", "sslmode=verify-full")).1.code(2).stderr_has("needs the root certificate");
    run(&url("localhost", "sslmode=require&sslrootcert=system")).1.code(2).stderr_has("needs sslmode=verify-full");
}

trait StatusIn {
    fn status_in(&self, dir: &str) -> serde_json::Value;
}

impl StatusIn for Project {
    /// `status --json` of a local state directory (ignoring `RDEPLOY_STATE`).
    fn status_in(&self, dir: &str) -> serde_json::Value {
        let run = self.rdeploy(&["status", "--json", "--state-dir", dir]);
        serde_json::from_str(&run.code(0).stdout).unwrap()
    }
}

//! Step outputs (`${{ steps.NAME.outputs.KEY }}`) end to end with the real binary: references
//! checked at validate, values flowing through the checkpoint, recover using the journaled
//! values, sensitive outputs never written down.

mod common;

use std::time::Duration;

use common::{step, Project};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn validate_fails(yaml: &str) -> String {
    let p = Project::new();
    p.stack(yaml);
    let run = p.rdeploy(&["validate"]);
    run.code(2);
    run.stderr.clone()
}

#[test]
fn every_bad_reference_is_exit_2_at_validate_with_its_place() {
    let head = "name: s\nsteps:\n  - name: network\n    tool: shell\n    run: echo ok\n";
    let err = validate_fails(&format!(
        "{head}  - name: app\n    tool: shell\n    run: echo ${{{{ steps.netwrok.outputs.url }}}}\n"
    ));
    assert!(err.contains("stack.yaml:8:10: step `app` refers to `${{ steps.netwrok.outputs.url }}`, but `netwrok` is not a step of this stack"), "{err}");
    assert!(err.contains("hint: did you mean `network`?"), "{err}");

    let err = validate_fails(&format!(
        "{head}  - name: app\n    tool: shell\n    env:\n      URL: \"${{{{ steps.network.output.url }}}}\"\n    run: echo\n"
    ));
    assert!(err.contains("stack.yaml:9:12: `${{ steps.network.output.url }}` is not a reference"), "{err}");

    let err = validate_fails(&format!(
        "{head}  - name: app\n    tool: shell\n    run: echo ${{{{ steps.network.outputs.url\n"
    ));
    assert!(err.contains("stack.yaml:8:10:") && err.contains("never closed"), "{err}");

    let err = validate_fails(&format!(
        "{head}  - name: app\n    tool: shell\n    run: echo ${{{{ steps.app.outputs.url }}}}\n"
    ));
    assert!(err.contains("stack.yaml:8:10: step `app` refers to its own output `url`"), "{err}");

    // `network` needs `app`, and `app` uses an output of `network`: a cycle through the reference.
    let err = validate_fails(
        "name: s\nsteps:\n  - name: network\n    tool: shell\n    needs: [app]\n    run: echo ok\n  - name: app\n    tool: shell\n    revert: echo ${{ steps.network.outputs.url }}\n    run: echo\n",
    );
    assert!(
        err.contains("stack.yaml:9:13: this output reference makes a cycle between steps: network -> app -> network")
            || err
                .contains("stack.yaml:9:13: this output reference makes a cycle between steps: app -> network -> app"),
        "{err}"
    );
}

const PIPELINE: &str = r#"name: s
steps:
  - name: db
    tool: shell
    sub_changes:
      - name: create
        run: |
          echo created >> db-side-effects
          echo "url=postgres://db:5432/shop" >> "$RDEPLOY_OUTPUT"
          printf 'motd<<EOF\nline one\nline two\nEOF\n' >> "$RDEPLOY_OUTPUT"
  - name: app
    tool: shell
    env:
      DB_URL: ${{ steps.db.outputs.url }}
    sub_changes:
      - name: wait
        run: touch app-started; while [ ! -e go ]; do sleep 0.05; done
      - name: use
        run: |
          echo "$DB_URL" > app-got
          printf '%s\n' "${{ steps.db.outputs.motd }}" > app-motd
"#;

#[test]
fn a_shell_output_reaches_a_later_step_and_recover_uses_the_journaled_value() {
    let p = Project::new();
    p.stack(PIPELINE);
    // `app` waits for `go`: kill -9 rdeploy once `db` is done and `app` started.
    let mut child = p.spawn(&["up"]);
    p.wait_for("app-started", Duration::from_secs(60));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    let _ = child.wait();
    assert_eq!(p.lines("db-side-effects"), ["created"]);
    let journal = p.read(".rdeploy/journal.jsonl");
    assert!(journal.contains(r#""type":"outputs","step":"db""#), "outputs are journaled: {journal}");

    p.file("go", "");
    p.rdeploy(&["recover"]).code(0);
    // The producer was not run again: its side effect happened once.
    assert_eq!(p.lines("db-side-effects"), ["created"]);
    assert_eq!(p.read("app-got"), "postgres://db:5432/shop\n");
    assert_eq!(p.read("app-motd"), "line one\nline two\n");
    let status = p.status();
    assert_eq!(step(&status, "app")["status"], "done");
}

#[test]
fn a_missing_output_fails_the_consumer_before_its_tool_starts() {
    let p = Project::new();
    p.stack(
        "name: s\nsteps:\n  - name: db\n    tool: shell\n    sub_changes:\n      - name: a\n        run: echo host=h >> \"$RDEPLOY_OUTPUT\"\n  - name: app\n    tool: shell\n    sub_changes:\n      - name: b\n        run: touch app-ran; echo ${{ steps.db.outputs.url }}\n",
    );
    let run = p.rdeploy(&["up"]);
    run.code(1);
    assert!(
        run.stdout.contains("step `db` has no output `url` (its outputs are `host`)"),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(!p.exists("app-ran"), "the consumer's tool never started");
}

#[test]
fn a_sensitive_shell_output_reaches_its_consumer_is_never_written_and_recover_names_the_producer() {
    let p = Project::new();
    p.stack(
        r#"name: s
steps:
  - name: secret
    tool: shell
    sensitive_outputs: [token]
    sub_changes:
      - name: mint
        run: echo "token=tok-9f8e7d6c5b" >> "$RDEPLOY_OUTPUT"
  - name: use
    tool: shell
    sub_changes:
      - name: login
        run: |
          echo "${{ steps.secret.outputs.token }}" > got-token
          echo "logging in with ${{ steps.secret.outputs.token }}"
          [ ! -e fail-use ] || { echo "login failed with ${{ steps.secret.outputs.token }}" >&2; exit 1; }
"#,
    )
    .file("fail-use", "");
    let run = p.rdeploy(&["up"]);
    run.code(1);
    assert_eq!(p.read("got-token"), "tok-9f8e7d6c5b\n", "the consumer got the value");
    assert!(!run.stdout.contains("tok-9f8e7d6c5b") && !run.stderr.contains("tok-9f8e7d6c5b"));
    assert_no_file_holds(&p.path(".rdeploy"), "tok-9f8e7d6c5b");
    let status = p.rdeploy(&["status", "--json"]);
    assert!(!status.stdout.contains("tok-9f8e7d6c5b"));

    // A new process never had the value, and a shell keeps no state to read it from.
    p.remove("fail-use");
    p.remove("got-token");
    let run = p.rdeploy(&["recover"]);
    run.code(1);
    assert!(
        run.stdout.contains("is a sensitive output") && run.stdout.contains("run step `secret` again"),
        "{}",
        run.stdout
    );
    assert!(!p.exists("got-token"));
}

/// Panics if any file under `dir` holds `needle`.
pub fn assert_no_file_holds(dir: &std::path::Path, needle: &str) {
    for entry in walk(dir) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(needle), "{} holds the sensitive value", entry.display());
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

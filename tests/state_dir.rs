//! Hostile or careless state directories, on the real binary: deleted mid-run, a journal cut
//! short or with an unreadable line, no space or read-only before anything is recorded,
//! planted symlinks, another user's directory, and the modes of what rdeploy writes.

mod common;

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::{Project, Run, FIVE};

/// A shell step whose second sub-change deletes the whole state directory, as a cleanup job
/// would while the deploy runs. rdeploy notes the running child under `.rdeploy/running` while
/// `rm` walks the tree, so a first `rm` may find the directory not empty; the second takes the
/// rest, as a cleanup job that retries would.
const CLEANUP_MID_RUN: &str = r#"
name: wiped
steps:
  - name: seed
    tool: shell
    sub_changes:
      - { name: one, run: echo one >> out }
      - { name: two, run: "echo two >> out; rm -rf .rdeploy 2>/dev/null || rm -rf .rdeploy" }
      - { name: three, run: echo three >> out }
  - name: after
    tool: shell
    needs: [seed]
    run: echo after >> out
"#;

#[test]
fn a_state_dir_deleted_mid_run_stops_the_deploy_loudly_naming_what_completed() {
    let p = Project::new();
    p.stack(CLEANUP_MID_RUN);
    let run = p.rdeploy(&["up"]);
    run.code(1).stderr_has("was deleted or replaced while this run was using it").stderr_has(
        "What this deploy had done: step `seed` running (sub-changes done: one) (done, too late to record: two)",
    );
    // Said once, with the next step that fits: there is no checkpoint for `recover` to resume.
    assert_eq!(run.stderr.matches("was deleted or replaced").count(), 1, "said once:\n{}", run.stderr);
    assert_eq!(run.stderr.matches("What this deploy had done").count(), 1, "said once:\n{}", run.stderr);
    assert!(!run.stderr.contains("resumes once the cause is fixed"), "{}", run.stderr);
    run.stderr_has("`rdeploy recover` has nothing to resume").stderr_has("restore the state directory from a backup");
    assert_eq!(p.lines("out"), ["one", "two"], "nothing runs once the checkpoint is gone");
    assert!(!p.exists(&p.state("journal.jsonl")), "no journal was recreated to record into");
}

/// `up` of FIVE with the fifth failing: four sub-changes done, the checkpoint kept.
fn four_done() -> Project {
    let p = Project::new();
    p.stack(FIVE).file("fail-five", "");
    p.rdeploy(&["up"]).code(1);
    assert_eq!(p.lines("out"), ["one", "two", "three", "four"]);
    p.remove("fail-five");
    p
}

fn journal_lines(p: &Project) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(p.path(&p.state("journal.jsonl"))).unwrap();
    bytes.split_inclusive(|&b| b == b'\n').map(<[u8]>::to_vec).collect()
}

fn warnings(p: &Project) -> String {
    p.status()["warnings"].to_string()
}

#[test]
fn a_journal_cut_short_without_a_snapshot_is_said_and_not_run_again() {
    for cut in ["at a line boundary", "mid-line"] {
        let p = four_done();
        let lines = journal_lines(&p);
        // Keep the header and the first six records (up to `two` started), drop the rest.
        let mut kept: Vec<u8> = lines[..7].concat();
        if cut == "mid-line" {
            kept.extend_from_slice(&lines[7][..lines[7].len() / 2]);
        }
        std::fs::write(p.path(&p.state("journal.jsonl")), kept).unwrap();
        p.remove(&p.state("snapshot.json"));

        assert!(warnings(&p).contains("lost records"), "{cut}: status says so: {}", warnings(&p));
        let run = p.rdeploy(&["recover"]);
        run.code(2).stderr_has("lost records").stderr_has("nothing was run").stderr_has("rdeploy reset --yes");
        assert_eq!(p.lines("out"), ["one", "two", "three", "four"], "{cut}: no completed sub-change runs again");
        // A dry run does not hide it either, and reset always works.
        p.rdeploy(&["reset", "--yes"]).code(0).stdout_has("forgot deploy");
        assert!(!p.exists(&p.state("journal.jsonl")));
    }
}

/// A power loss after `four` finished but before its end was synced: the journal (fdatasync'd
/// up to `four` started) ends there, while `journal.seq`, in the page cache with it, reached
/// the disk saying one more record was written.
#[test]
fn a_journal_that_ends_between_the_synced_and_the_written_count_is_an_os_crash_and_recover_goes_on() {
    let p = four_done();
    let lines = journal_lines(&p);
    // The header and records 1 to 10 (`four` started); record 11 (`four` done) is gone.
    assert!(String::from_utf8_lossy(&lines[10]).contains(r#""type":"sub_started","step":"seed","id":"four""#));
    std::fs::write(p.path(&p.state("journal.jsonl")), lines[..11].concat()).unwrap();
    std::fs::write(p.path(&p.state("journal.seq")), "{\"written\":11,\"synced\":10}\n").unwrap();
    p.remove(&p.state("snapshot.json"));

    let said = warnings(&p);
    assert!(said.contains("an OS crash (power loss) dropped the unsynced record 11"), "{said}");
    assert!(!said.contains("lost records"), "{said}");
    assert_eq!(p.status()["steps"][0]["sub_changes"][3]["uncertain"], true, "`four` is uncertain");
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    // `four` has no `check` and shell has no state: recovery runs an uncertain shell
    // sub-change again, as after any crash between its start and its end.
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "four", "five", "after"]);
    let history = std::fs::read_dir(p.path(&p.state("history"))).unwrap().next().unwrap().unwrap().path();
    assert!(std::fs::read_to_string(history).unwrap().contains("an OS crash (power loss)"), "said durably");
}

/// Shorter than the synced count: records that were durable are gone (cut, truncated).
#[test]
fn a_journal_shorter_than_the_synced_count_is_refused() {
    let p = four_done();
    let lines = journal_lines(&p);
    std::fs::write(p.path(&p.state("journal.jsonl")), lines[..11].concat()).unwrap();
    std::fs::write(p.path(&p.state("journal.seq")), "{\"written\":12,\"synced\":11}\n").unwrap();
    p.remove(&p.state("snapshot.json"));
    p.rdeploy(&["recover"]).code(2).stderr_has("lost records").stderr_has("nothing was run");
    assert_eq!(p.lines("out"), ["one", "two", "three", "four"]);
}

#[test]
fn an_unreadable_journal_line_is_reported_quarantined_and_recover_goes_on() {
    for (what, garbage) in [
        ("garbage", b"{\"seq\":4,\"ts\xff\xfe garbage\n".to_vec()),
        ("nul padding", vec![0u8; 40].into_iter().chain([b'\n']).collect()),
        ("a flipped bit", Vec::new()),
    ] {
        let p = four_done();
        let mut lines = journal_lines(&p);
        // Line 4 is the `planned` record; `status` and `recover` must get past it.
        lines[3] = if garbage.is_empty() {
            let mut l = lines[3].clone();
            l[0] ^= 0x40; // `{` becomes `;`
            l
        } else {
            garbage
        };
        std::fs::write(p.path(&p.state("journal.jsonl")), lines.concat()).unwrap();
        // One bad byte in the snapshot too: it is a cache, so loading replays the journal.
        let mut snap = std::fs::read(p.path(&p.state("snapshot.json"))).unwrap();
        snap[10] = 0xff;
        std::fs::write(p.path(&p.state("snapshot.json")), snap).unwrap();

        let said = warnings(&p);
        assert!(said.contains("journal.jsonl:4: an unreadable journal line"), "{what}: {said}");
        assert!(said.contains("is uncertain"), "{what}: {said}");
        p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
        assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"], "{what}");
        let quarantined = std::fs::read(p.path(&p.state("journal.jsonl.quarantine"))).unwrap();
        assert!(String::from_utf8_lossy(&quarantined).contains("journal.jsonl:4"), "{what}: the line is kept aside");
        // The finished deploy's history keeps the warning.
        let history = std::fs::read_dir(p.path(&p.state("history"))).unwrap().next().unwrap().unwrap().path();
        assert!(std::fs::read_to_string(history).unwrap().contains("an unreadable journal line"), "{what}");
    }
}

/// One flipped bit in the snapshot that still parses (`two` becomes `twn`, as if done) is
/// caught by its checksum: loading replays the journal, so `two` is not run again.
#[test]
fn a_snapshot_with_a_flipped_bit_that_is_still_json_falls_back_to_replay() {
    let p = four_done();
    let mut snap = std::fs::read(p.path(&p.state("snapshot.json"))).unwrap();
    let text = String::from_utf8_lossy(&snap).into_owned();
    assert!(text.starts_with("rdeploy-snapshot sha256="), "a checksum header: {text}");
    let at = text.find(r#""id":"two""#).expect("`two` in the snapshot") + r#""id":"tw"#.len();
    snap[at] ^= 0x01; // `o` becomes `n`
    let body = &snap[snap.iter().position(|&b| b == b'\n').unwrap() + 1..];
    serde_json::from_slice::<serde_json::Value>(body).expect("still valid JSON");
    std::fs::write(p.path(&p.state("snapshot.json")), &snap).unwrap();

    let status = p.status();
    assert_eq!(status["steps"][0]["sub_changes"][1]["id"], "two", "{status}");
    assert_eq!(status["steps"][0]["sub_changes"][1]["status"], "done", "{status}");
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"], "no sub-change ran twice");
}

#[test]
fn reset_works_on_a_journal_with_an_unreadable_line() {
    let p = four_done();
    let mut lines = journal_lines(&p);
    lines[5] = b"\xde\xad\xbe\xef\n".to_vec();
    std::fs::write(p.path(&p.state("journal.jsonl")), lines.concat()).unwrap();
    p.rdeploy(&["reset", "--yes"]).code(0).stdout_has("forgot deploy");
    assert!(!p.exists(&p.state("journal.jsonl")));
}

#[test]
fn reset_works_on_a_journal_it_cannot_read_at_all() {
    let p = four_done();
    std::fs::write(
        p.path(&p.state("journal.jsonl")),
        "{\"format\":\"rdeploy-checkpoint\",\"version\":99,\"created\":\"x\"}\n",
    )
    .unwrap();
    p.rdeploy(&["recover"]).code(1).stderr_has("version 99 is not supported");
    p.rdeploy(&["reset", "--yes"])
        .code(0)
        .stdout_has("its journal could not be read")
        .stdout_has("the journal is kept as");
    assert!(!p.exists(&p.state("journal.jsonl")));
    p.rdeploy(&["up"]).code(0);
}

/// A tmpfs mounted at a path for the test's lifetime (tests run as root).
struct Mount(std::path::PathBuf);

impl Mount {
    fn tmpfs(at: &Path, options: &str) -> Mount {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(at).output().unwrap();
        assert!(
            out.status.success(),
            "this test needs `mount -t tmpfs` (root with CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Mount(at.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn nothing_ran(run: &Run, p: &Project) {
    run.code(2).stderr_has("could not write").stderr_has("nothing ran");
    assert!(!p.exists("out"), "no step ran:\n{}", run.stderr);
}

#[test]
fn a_state_dir_that_cannot_be_written_is_exit_2_and_says_nothing_ran() {
    // A file where the directory should be.
    let p = Project::new();
    p.stack(FIVE).file(".rdeploy", "not a directory");
    nothing_ran(&p.rdeploy(&["up"]), &p);

    // A read-only mount.
    let p = Project::new();
    p.stack(FIVE);
    let _ro = Mount::tmpfs(&p.path(".rdeploy"), "ro,mode=700");
    nothing_ran(&p.rdeploy(&["up"]), &p);

    // No space left: one page, which the lock's holder takes.
    let p = Project::new();
    p.stack(FIVE);
    let _full = Mount::tmpfs(&p.path(".rdeploy"), "size=4k,mode=700");
    let run = p.rdeploy(&["up"]);
    nothing_ran(&run, &p);
    drop(_full);
    // Once there is room, `up` starts cleanly: the failed start left no unfinished deploy.
    p.rdeploy(&["up"]).code(0);
}

#[test]
fn symlinks_planted_in_the_state_dir_are_never_followed() {
    let p = Project::new();
    p.stack(FIVE).file("victim", "precious\n");
    std::fs::create_dir_all(p.path(&p.state("logs"))).unwrap();
    std::fs::set_permissions(p.path(".rdeploy"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(p.path(&p.state("")), std::fs::Permissions::from_mode(0o700)).unwrap();
    symlink(p.path("victim"), p.path(&p.state("lock"))).unwrap();
    p.rdeploy(&["up"]).code(2).stderr_has(&format!("{} is a symbolic link", p.state("lock")));
    assert_eq!(p.read("victim"), "precious\n");
    assert!(!p.exists("out"));

    // The old predictable temporary names of atomic writes, and a step's log.
    std::fs::remove_file(p.path(&p.state("lock"))).unwrap();
    for name in [".snapshot.json.tmp", ".report.md.tmp", "logs/seed.log"] {
        symlink(p.path("victim"), p.path(&p.state(name))).unwrap();
    }
    p.file("fail-five", "");
    p.rdeploy(&["up"]).code(1).stderr_has("not writing the step's log");
    assert!(p.exists(&p.state("snapshot.json")) && p.exists(&p.state("report.md")));
    assert_eq!(p.read("victim"), "precious\n", "nothing was written through a planted link");
}

#[test]
fn a_state_dir_of_another_user_or_writable_by_all_is_refused() {
    let p = Project::new();
    p.stack(FIVE);
    std::fs::create_dir_all(p.path(".rdeploy")).unwrap();
    std::os::unix::fs::chown(p.path(".rdeploy"), Some(4242), Some(4242)).unwrap();
    p.rdeploy(&["up"]).code(2).stderr_has("belongs to uid 4242, not to the user running rdeploy");
    assert!(!p.exists("out"));

    std::os::unix::fs::chown(p.path(".rdeploy"), Some(0), Some(0)).unwrap();
    std::fs::set_permissions(p.path(".rdeploy"), std::fs::Permissions::from_mode(0o777)).unwrap();
    p.rdeploy(&["up"]).code(2).stderr_has("is writable by every user");
    assert!(!p.exists("out"));

    // A lock file another user planted.
    std::fs::set_permissions(p.path(".rdeploy"), std::fs::Permissions::from_mode(0o700)).unwrap();
    p.file(&p.state("lock"), "");
    std::os::unix::fs::chown(p.path(&p.state("lock")), Some(4242), None).unwrap();
    p.rdeploy(&["up"]).code(2).stderr_has("lock belongs to uid 4242");
    assert!(!p.exists("out"));
}

/// Every directory rdeploy made under `.rdeploy/` is 0700 and every file 0600, even under
/// umask 000. The tools' own files under `steps/<step>/` and process.rs's notes in `running/`
/// are not written by the state dir's code: only their directories are checked (0700 hides them).
fn assert_private(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mode = meta.mode() & 0o777;
        if name == "running" || name == "steps" {
            assert_eq!(mode, 0o700, "{} is {mode:o}", path.display());
            for inner in std::fs::read_dir(&path).unwrap() {
                let inner = inner.unwrap().path();
                if inner.is_dir() {
                    let mode = std::fs::metadata(&inner).unwrap().mode() & 0o777;
                    assert_eq!(mode, 0o700, "{} is {mode:o}", inner.display());
                }
            }
            continue;
        }
        if meta.is_dir() {
            assert_eq!(mode, 0o700, "{} is {mode:o}", path.display());
            assert_private(&path);
        } else {
            assert_eq!(mode, 0o600, "{} is {mode:o}", path.display());
        }
    }
}

#[test]
fn everything_rdeploy_writes_in_the_state_dir_is_private_whatever_the_umask() {
    use std::os::unix::process::CommandExt;
    let p = Project::new();
    p.stack(FIVE).file("fail-five", "");
    let run = |args: &[&str]| {
        let mut cmd = p.command(args);
        // SAFETY: umask is async-signal-safe and touches only the child's own process state.
        unsafe {
            cmd.pre_exec(|| {
                libc::umask(0);
                Ok(())
            });
        }
        Run::from(cmd.output().unwrap(), args)
    };
    run(&["up"]).code(1);
    for made in ["logs/seed.log", "report.md", "snapshot.json", "journal.seq", "steps/seed", "running"] {
        assert!(p.exists(&p.state(made)), "{made} was written");
    }
    assert_private(&p.path(".rdeploy"));
    assert_eq!(std::fs::metadata(p.path(".rdeploy")).unwrap().mode() & 0o777, 0o700);
    p.remove("fail-five");
    run(&["recover"]).code(0);
    assert!(p.exists(&p.state("history")));
    assert_private(&p.path(".rdeploy"));
}

/// Nothing starts unless its start record is durable. The first sub-change lowers rdeploy's
/// file size limit (`prlimit`, RLIMIT_FSIZE) so that its end record still fits in the journal
/// and the next sub-change's start record is cut short (`write` fails with EFBIG, as it fails
/// with ENOSPC on a full disk; rdeploy runs with SIGXFSZ ignored, so the failed write is an
/// error, not a kill). The next sub-change must not start: rdeploy's own debug log names every
/// command it spawns, and the command's side effect is absent; the run stops (exit 1) saying
/// why, and `recover` (the limit gone with that process) resumes with it.
#[test]
fn a_start_record_that_cannot_be_written_starts_nothing() {
    use std::os::unix::process::CommandExt;
    let prlimit = common::require_tool("prlimit", "apt-get install util-linux");
    let p = Project::new();
    p.stack(
        r#"
name: full
steps:
  - name: seed
    tool: shell
    sub_changes:
      - { name: fill, run: sh ./fill.sh }
      - { name: next, run: echo next >> out }
"#,
    )
    .file(
        "fill.sh",
        &format!(
            r#"j=.rdeploy/full/journal.jsonl
size=$(stat -c %s "$j")
last=$(tail -n 1 "$j" | wc -c)
# Room for this sub-change's end record (about as long as its start, the last line), and 12
# bytes of the next record.
{} --pid "$PPID" --fsize=$((size + last + 12))
echo fill >> out
"#,
            prlimit.display()
        ),
    );
    let mut cmd = p.command(&["up"]);
    cmd.env("RDEPLOY_LOG", "rdeploy_adapters::process=debug");
    // SAFETY: one async-signal-safe call in the child before exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let run = Run::from(cmd.output().unwrap(), &["up"]);
    run.code(1).stderr_has("the checkpoint could not be written");
    assert!(!run.stderr.contains("echo next"), "`next` was spawned without its start record:\n{}", run.stderr);
    assert_eq!(p.lines("out"), ["fill"], "`next` did not run");
    // The journal's torn last line is the cut-short start; the checkpoint reads back without it.
    let status = p.status();
    assert_eq!(
        common::sub_statuses(&status, "seed"),
        [("fill".into(), "done".into()), ("next".into(), "pending".into())]
    );
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    assert_eq!(p.lines("out"), ["fill", "next"]);
}

/// A flipped bit makes the end record of `two` unreadable. `recover` says so on stderr and in
/// its report, and does not run `two` again: `three` started after it, which in a shell step
/// only follows its success (its end record is what was lost).
#[test]
fn a_lost_end_record_is_said_and_the_sub_change_is_settled_not_run_again() {
    let p = four_done();
    let mut lines = journal_lines(&p);
    let at = lines
        .iter()
        .position(|l| String::from_utf8_lossy(l).contains(r#""type":"sub_done","step":"seed","id":"two""#))
        .expect("`two` done is journaled");
    lines[at][0] ^= 0x40; // `{` becomes `;`
    std::fs::write(p.path(&p.state("journal.jsonl")), lines.concat()).unwrap();

    let run = p.rdeploy(&["recover"]);
    run.code(0).stdout_has("deploy complete");
    let line = format!("journal.jsonl:{}: an unreadable journal line", at + 1);
    run.stderr_has(&line).stdout_has(&line);
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"], "`two` ran once");
}

/// The journal is deleted; the snapshot and `journal.seq` remain. Both are evidence of a
/// recorded deploy: `recover` and `up` refuse (exit 2), saying what the snapshot still shows,
/// and run nothing; `reset --yes` forgets it (the snapshot kept aside), then `up` runs.
#[test]
fn a_deleted_journal_with_its_snapshot_left_is_refused_not_forgotten() {
    for left in ["the snapshot and journal.seq", "journal.seq only"] {
        let p = four_done();
        assert!(p.exists(&p.state("snapshot.json")) && p.exists(&p.state("journal.seq")), "{left}");
        p.remove(&p.state("journal.jsonl"));
        if left == "journal.seq only" {
            p.remove(&p.state("snapshot.json"));
        }
        let run = p.rdeploy(&["recover"]);
        run.code(2)
            .stderr_has("journal.jsonl is missing, but a deploy was recorded here")
            .stderr_has("nothing was run");
        run.stderr_has("rdeploy reset --yes");
        if left == "journal.seq only" {
            run.stderr_has("records were written");
        } else {
            run.stderr_has("step `seed` failed (sub-changes done: one, two, three, four)");
        }
        p.rdeploy(&["up"]).code(2).stderr_has("journal.jsonl is missing");
        assert_eq!(p.lines("out"), ["one", "two", "three", "four"], "{left}: nothing ran again");
        p.rdeploy(&["reset", "--yes"]).code(0);
        assert!(!p.exists(&p.state("journal.seq")) && !p.exists(&p.state("snapshot.json")), "{left}");
        p.rdeploy(&["up"]).code(0).stdout_has("deploy complete");
    }
}

/// The snapshot is a cache, the journal the truth: a snapshot rewritten to say `three` is
/// pending, with its checksum recomputed, does not make `recover` run `three` again.
#[test]
fn a_snapshot_rewritten_with_a_recomputed_checksum_does_not_override_the_journal() {
    use sha2::Digest;
    let p = four_done();
    let snap = std::fs::read_to_string(p.path(&p.state("snapshot.json"))).unwrap();
    let (header, body) = snap.split_once('\n').unwrap();
    let mut deploy: serde_json::Value = serde_json::from_str(body).unwrap();
    let subs = deploy["steps"][0]["sub_changes"].as_array_mut().unwrap();
    let three = subs.iter_mut().find(|s| s["id"] == "three").unwrap();
    three["status"] = "pending".into();
    let body = serde_json::to_string(&deploy).unwrap();
    let rest = header.strip_prefix("rdeploy-snapshot sha256=").unwrap();
    let rest = rest.split_once(' ').map(|(_, r)| format!(" {r}")).unwrap_or_default();
    let header = format!("rdeploy-snapshot sha256={}{rest}", hex::encode(sha2::Sha256::digest(body.as_bytes())));
    std::fs::write(p.path(&p.state("snapshot.json")), format!("{header}\n{body}")).unwrap();

    assert_eq!(common::sub_statuses(&p.status(), "seed")[2], ("three".into(), "done".into()));
    p.rdeploy(&["recover"]).code(0).stdout_has("deploy complete");
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"], "`three` ran once");
}

/// Two stack files side by side (`prod.yaml`, `dev.yaml`): each keeps its own state in
/// `.rdeploy/<name>/`, so one's stopped deploy neither blocks nor shows up in the other's.
#[test]
fn two_stacks_beside_each_other_keep_their_own_state() {
    let p = Project::new();
    p.file("prod.yaml", &FIVE.replace("name: demo", "name: app-prod"))
        .file("dev.yaml", &FIVE.replace("name: demo", "name: app-dev").replace(">> out", ">> dev-out"))
        .file("fail-five", "");
    p.rdeploy(&["up", "prod.yaml"]).code(1).stdout_has("rdeploy recover prod.yaml");
    p.remove("fail-five");
    // dev's first deploy is its own: prod's unfinished checkpoint does not block it.
    p.rdeploy(&["up", "dev.yaml"]).code(0);
    let dev = p.rdeploy(&["status", "dev.yaml"]);
    dev.code(0).stdout_has("stack app-dev");
    assert!(!dev.stdout.contains("app-prod"), "{}", dev.stdout);
    p.rdeploy(&["status", "prod.yaml"]).code(0).stdout_has("stack app-prod");
    assert!(p.exists(".rdeploy/app-prod/journal.jsonl") && p.exists(".rdeploy/app-dev/history"));
    p.rdeploy(&["recover", "prod.yaml"]).code(0);
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"]);
}

/// A `.rdeploy/` written by an rdeploy that kept one stack's files at its top is moved into
/// `.rdeploy/<name>/` on first use (said once), and the stopped deploy recovers from there.
#[test]
fn a_single_stack_state_dir_of_an_older_layout_is_moved_into_the_stacks_own() {
    let p = Project::new();
    p.stack(FIVE).file("fail-five", "");
    // `--state-dir .rdeploy` is that directory itself: the layout an older rdeploy wrote.
    p.rdeploy(&["--state-dir", ".rdeploy", "up"]).code(1);
    assert!(p.exists(".rdeploy/journal.jsonl") && p.exists(".rdeploy/logs/seed.log"));
    p.remove("fail-five");
    let status = p.rdeploy(&["status"]);
    status.code(0).stderr_has("moved the state of stack `demo` from").stdout_has("stopped");
    for moved in ["journal.jsonl", "snapshot.json", "report.md", "logs/seed.log"] {
        assert!(p.exists(&format!(".rdeploy/demo/{moved}")), "{moved} was not moved");
        assert!(!p.exists(&format!(".rdeploy/{moved}")), "{moved} was left behind");
    }
    let again = p.rdeploy(&["recover"]);
    again.code(0);
    assert!(!again.stderr.contains("moved the state"), "moved once:\n{}", again.stderr);
    assert_eq!(p.lines("out"), ["one", "two", "three", "four", "five", "after"]);
}

/// A directory given with `--state-dir` is one stack's state: another stack's command on it is
/// refused (exit 2) on every command, naming the way out, not read as if it were its own.
#[test]
fn an_explicit_state_dir_holding_another_stacks_checkpoint_is_refused_on_every_command() {
    let p = Project::new();
    p.file("prod.yaml", &FIVE.replace("name: demo", "name: app-prod"))
        .file("dev.yaml", &FIVE.replace("name: demo", "name: app-dev"))
        .file("fail-five", "");
    p.rdeploy(&["--state-dir", "st", "up", "dev.yaml"]).code(1);
    for command in ["status", "up", "recover", "output", "runbook", "revert"] {
        p.rdeploy(&["--state-dir", "st", command, "prod.yaml"])
            .code(2)
            .stderr_has("the state directory st belongs to stack `app-dev`, not `app-prod`")
            .stderr_has("`--state-dir st-app-prod`");
    }
}

/// Every command rdeploy prints carries the flags that locate the state as the operator gave
/// them (`--state-dir`, quoted for a shell): the report's `next:`, hints, the runbook, the CI
/// annotation. Without them the printed command reads another checkpoint ("nothing to recover").
#[test]
fn printed_commands_carry_the_state_dir_given() {
    let p = Project::new();
    p.file("typo.yaml", FIVE).file("fail-five", "");
    let args = ["--state-dir", "my state", "up", "typo.yaml"];
    let up = p.rdeploy(&args);
    up.code(1);
    let commands = |text: &str| -> String {
        text.lines()
            .filter(|l| l.contains("rdeploy ") && !l.contains("::"))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let reset = p.rdeploy(&["reset", "typo.yaml", "--state-dir", "my state"]);
    reset.code(2);
    let ci =
        { p.command(&["ci", "typo.yaml", "--state-dir", "my state"]).env("GITHUB_ACTIONS", "true").output().unwrap() };
    let ci_stdout = String::from_utf8_lossy(&ci.stdout).into_owned();
    let annotation = ci_stdout.lines().find(|l| l.starts_with("::error")).unwrap_or_default().to_string();
    let runbook = p.rdeploy(&["runbook", "typo.yaml", "--state-dir", "my state"]);
    let first_moves: String =
        runbook.stdout.lines().filter(|l| l.starts_with("| ") && l.contains("rdeploy ")).collect::<Vec<_>>().join("\n");
    insta::assert_snapshot!(
        "printed_commands_carry_the_state_dir",
        format!(
            "up:\n{}\n\nreset:\n{}\n\nci annotation:\n{annotation}\n\nrunbook:\n{first_moves}",
            commands(&up.stdout),
            commands(&reset.stderr)
        )
    );
    // The printed command works: it finds the checkpoint.
    p.remove("fail-five");
    p.rdeploy(&["recover", "typo.yaml", "--state-dir", "my state"]).code(0);
    assert_eq!(p.lines("out").len(), 6);
}

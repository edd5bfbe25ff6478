//! `rdeploy plan` for an ansible step: `ansible-playbook --check --diff` with rdeploy's callback,
//! read per host: the tasks that would change (with their diffs), hosts with nothing to change,
//! and hosts that cannot be checked (unreachable, or a task that failed in check mode).

use std::collections::BTreeMap;

use super::callback::{parse_line, Record, ResultStatus, TaskDiff, TaskResult};
use super::{command_failure, events_file, AnsibleSpec, EVENTS_ENV};
use crate::preview::{unified_diff, PlanAction, PlanItem, Preview, PreviewError};
use crate::redact::redact_line;
use crate::{secrets, Failure, StepContext};

/// One host as the check run left it.
#[derive(Debug, Default)]
struct HostCheck {
    changed: Vec<TaskResult>,
    /// Command tasks check mode skips: they would run, what they change is theirs to know.
    would_run: Vec<String>,
    /// Why the host could not be checked: unreachable, or a task failed in check mode.
    unchecked: Option<String>,
}

/// The per-host items of a check run, from the callback's records, in host order.
fn items_from_records(records: &[Record], secrets: &[String]) -> Vec<PlanItem> {
    let mut hosts: BTreeMap<String, HostCheck> = BTreeMap::new();
    for record in records {
        match record {
            Record::Result(result) => {
                let host = hosts.entry(result.host.clone()).or_default();
                match result.status {
                    ResultStatus::Changed => host.changed.push(result.clone()),
                    ResultStatus::Unreachable => {
                        host.unchecked.get_or_insert_with(|| format!("unreachable: {}", result.msg));
                    }
                    // ansible's own words for a command task in check mode (2.19).
                    ResultStatus::Skipped if result.msg.contains("would have run if not in check mode") => {
                        host.would_run.push(result.task.clone())
                    }
                    ResultStatus::Skipped if result.msg.contains("does not support check mode") => {
                        host.unchecked
                            .get_or_insert_with(|| format!("task `{}` cannot be checked: {}", result.task, result.msg));
                    }
                    ResultStatus::Failed if !result.rescuable => {
                        host.unchecked.get_or_insert_with(|| {
                            format!("task `{}` failed in check mode: {}", result.task, result.msg)
                        });
                    }
                    _ => {}
                }
            }
            Record::Stats(stats) => {
                for name in stats.hosts.keys() {
                    hosts.entry(name.clone()).or_default();
                }
            }
            _ => {}
        }
    }
    let r = |s: &str| redact_line(s, secrets);
    hosts
        .into_iter()
        .map(|(name, host)| {
            let touched = host.changed.len() + host.would_run.len();
            let action = match (&host.unchecked, touched) {
                (Some(_), _) => PlanAction::Unknown,
                (None, 0) => PlanAction::Unchanged,
                (None, _) => PlanAction::Update,
            };
            let mut item = PlanItem::new(name, action);
            item.reason = match (&host.unchecked, touched) {
                (Some(why), _) => Some(r(why)),
                (None, 0) => None,
                (None, 1) => Some("1 task would change or run".into()),
                (None, n) => Some(format!("{n} tasks would change or run")),
            };
            for task in &host.would_run {
                item.details.push(format!("task `{}` would run (a command: check mode does not run it)", r(task)));
            }
            let mut diffs = String::new();
            for task in &host.changed {
                item.details.push(format!("task `{}` would change", r(&task.task)));
                for diff in &task.diff {
                    diffs.push_str(&r(&render_diff(&task.task, diff)));
                }
            }
            item.diff = Some(diffs).filter(|d| !d.is_empty());
            item
        })
        .collect()
}

/// One task diff as unified text.
fn render_diff(task: &str, diff: &TaskDiff) -> String {
    if let Some(prepared) = &diff.prepared {
        let mut text = prepared.clone();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        return text;
    }
    let before_name = diff.before_header.clone().unwrap_or_else(|| format!("before: {task}"));
    let after_name = diff.after_header.clone().unwrap_or_else(|| format!("after: {task}"));
    let before = diff.before.as_deref().unwrap_or("");
    let after = diff.after.as_deref().unwrap_or("");
    unified_diff(before, after, &before_name, &after_name).unwrap_or_default()
}

impl AnsibleSpec {
    pub(super) async fn preview_check(&self, ctx: &StepContext) -> Result<Preview, PreviewError> {
        let binary = self.resolve_binary(ctx)?;
        let plugin_dir = ctx.work_dir.join("callback_plugins");
        let events = events_file(&plugin_dir, &ctx.work_dir.join("plan-events.jsonl"))?;
        // Only rdeploy's callback, and the built-in stdout one: a plan sends no notification a
        // user's callback would, and so needs no `ansible-config dump` (seconds) to keep them.
        let from_env =
            ctx.env.get("ANSIBLE_CALLBACK_PLUGINS").cloned().or_else(|| std::env::var("ANSIBLE_CALLBACK_PLUGINS").ok());
        let mut paths = vec![plugin_dir.to_string_lossy().into_owned()];
        paths.extend(from_env.into_iter().filter(|p| !p.is_empty()));
        let callback_env = [
            ("ANSIBLE_CALLBACK_PLUGINS", paths.join(":")),
            ("ANSIBLE_CALLBACKS_ENABLED", super::PLUGIN_NAME.to_string()),
            ("ANSIBLE_STDOUT_CALLBACK", "ansible.builtin.default".to_string()),
        ];
        let secret_file = self.secret_vars_file(ctx, super::PREVIEW_SECRET_VARS_FILE)?;
        let mut cmd =
            self.command(ctx, &binary).args(self.base_args(secret_file.as_ref().map(secrets::SecretPipe::path)));
        if let Some(limit) = &self.limit {
            cmd = cmd.arg("--limit").arg(limit);
        }
        let cmd = cmd.args(["--check", "--diff"]).envs(callback_env).env(EVENTS_ENV, events.path());
        let cmd = match &secret_file {
            Some(file) => cmd
                .env(super::UNLINK_ENV, std::path::absolute(file.path()).unwrap_or_else(|_| file.path().to_path_buf())),
            None => cmd,
        };
        let outcome =
            cmd.run(&ctx.cancel, ctx.timeout, &mut |_, _| {}).await.map_err(|e| Failure::new(e.to_string()))?;
        let mut found = secrets::secret_strings(&self.extra_vars, &self.marked);
        found.extend(secrets::env_secrets(&ctx.env));
        let secrets = secrets::normalize(found);
        let mut text = String::new();
        if let Ok(mut reader) = events.reader() {
            use std::io::{Read, Seek};
            let _ = reader.seek(std::io::SeekFrom::Start(0)).and_then(|_| reader.read_to_string(&mut text));
        }
        drop(events);
        let mut records = Vec::new();
        for line in text.lines() {
            match parse_line(line) {
                Ok(Some(record)) => records.push(record),
                Ok(None) => {}
                Err(e) => return Err(Failure::new(redact_line(&e.to_string(), &secrets)).into()),
            }
        }
        let has_stats = records.iter().any(|r| matches!(r, Record::Stats(_)));
        if outcome.interrupted || !has_stats {
            return Err(secrets::redact_failure(
                command_failure(&cmd.display(), &outcome)
                    .with_hint("fix the playbook or inventory, then `rdeploy plan` again"),
                &secrets,
            )
            .into());
        }
        let mut preview = Preview { items: items_from_records(&records, &secrets), ..Preview::default() };
        let (change, unknown) = preview.items.iter().fold((0, 0), |(c, u), i| match i.action {
            PlanAction::Update => (c + 1, u),
            PlanAction::Unknown => (c, u + 1),
            _ => (c, u),
        });
        preview.summary = Some(match unknown {
            0 => format!("{change} of {} hosts would change", preview.items.len()),
            _ => format!("{change} of {} hosts would change, {unknown} cannot be checked", preview.items.len()),
        });
        Ok(preview)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(lines: &[&str]) -> Vec<Record> {
        lines.iter().filter_map(|l| parse_line(l).unwrap()).collect()
    }

    #[test]
    fn hosts_that_would_change_cannot_be_checked_or_stay_as_they_are() {
        let got = items_from_records(
            &records(&[
                r#"{"v":1,"event":"result","status":"changed","host":"web1","task":"write release","msg":"","diff":[{"before":"1.4.1\n","after":"1.4.2\n","before_header":"/srv/release","after_header":"/srv/release"}]}"#,
                r#"{"v":1,"event":"result","status":"ok","host":"web2","task":"write release","msg":""}"#,
                r#"{"v":1,"event":"result","status":"skipped","host":"web4","task":"install","msg":"Command would have run if not in check mode"}"#,
                r#"{"v":1,"event":"result","status":"unreachable","host":"web3","task":"write release","msg":"ssh: connect refused"}"#,
                r#"{"v":1,"event":"result","status":"changed","host":"web1","task":"token s3cr3t","msg":""}"#,
                r#"{"v":1,"event":"stats","hosts":{"web1":{"ok":2,"changed":2},"web2":{"ok":1},"web3":{"unreachable":1},"web4":{},"web5":{}}}"#,
            ]),
            &["s3cr3t".to_string()],
        );
        let summary: Vec<(&str, PlanAction, Option<&str>)> =
            got.iter().map(|i| (i.id.as_str(), i.action, i.reason.as_deref())).collect();
        assert_eq!(
            summary,
            [
                ("web1", PlanAction::Update, Some("2 tasks would change or run")),
                ("web2", PlanAction::Unchanged, None),
                ("web3", PlanAction::Unknown, Some("unreachable: ssh: connect refused")),
                ("web4", PlanAction::Update, Some("1 task would change or run")),
                ("web5", PlanAction::Unchanged, None),
            ]
        );
        assert_eq!(got[3].details, ["task `install` would run (a command: check mode does not run it)"]);
        assert_eq!(got[0].details, ["task `write release` would change", "task `token ***` would change"]);
        let diff = got[0].diff.as_deref().unwrap();
        assert!(diff.contains("--- /srv/release\n+++ /srv/release\n"), "{diff}");
        assert!(diff.contains("-1.4.1\n+1.4.2\n"), "{diff}");
    }
}

//! The shell adapter: declared `sub_changes` (each checkpointed, resumable, with an optional
//! `check`) or a bare `run` (not resumable, so it completes or reverts; it may carry a `check`
//! too). A `check` that exits 0 says the sub-change is in place: `plan` shows it so, `up` does
//! not run it, and `recover` settles with it a sub-change a crash left uncertain.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::outputs::{OutputValue, Secret};
use crate::process::Command;
use crate::{
    forward_output, shell_quote, Adapter, AdapterError, DescribeContext, Event, EventSink, Failure, FieldPath,
    Inspection, PathSegment, PlanAction, PlanItem, Preview, PriorStep, Recovered, RecoveryDoc, SpecProblem,
    StepContext, SubStatus, ToolInfo,
};

/// The sub-change id of a bare `run` step.
pub const RUN_ID: &str = "run";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellSpec {
    /// One command, not resumable: it completes or its `revert` runs.
    pub run: Option<String>,
    /// With `run`: exits 0 when what `run` does is already in place (`up` then skips it).
    pub check: Option<String>,
    /// Declared sub-changes, each checkpointed.
    pub sub_changes: Option<Vec<ShellSubChange>>,
    /// Working directory, relative to the stack file (default: the stack's directory).
    pub dir: Option<PathBuf>,
    /// Keys the scripts write to `$RDEPLOY_OUTPUT` whose values are secret: passed to their
    /// consumers only, never journaled (a later `recover` cannot have them back).
    #[serde(default)]
    pub sensitive_outputs: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellSubChange {
    pub name: String,
    pub run: String,
    /// Exits 0 when the sub-change is already in place: `up` does not run it then (unless
    /// `--force-apply` or the step's `always: true`), and `recover` settles an uncertain one.
    pub check: Option<String>,
}

impl ShellSpec {
    pub const KEYS: &'static [&'static str] = &["run", "check", "sub_changes", "dir", "sensitive_outputs"];

    /// The sub-changes in declaration order: `(id, command, check)`.
    fn planned(&self) -> Vec<(&str, &str, Option<&str>)> {
        match (&self.sub_changes, &self.run) {
            (Some(subs), _) => subs.iter().map(|s| (s.name.as_str(), s.run.as_str(), s.check.as_deref())).collect(),
            (None, Some(run)) => vec![(RUN_ID, run.as_str(), self.check.as_deref())],
            (None, None) => Vec::new(),
        }
    }

    async fn run_sub_change(
        &self,
        ctx: &StepContext,
        sink: &dyn EventSink,
        outputs: &OutputFiles,
        id: &str,
        run: &str,
    ) -> Result<(), Failure> {
        if ctx.cancel.is_cancelled() {
            return Err(Failure { interrupted: true, ..Failure::new(format!("stopped before `{id}`")) });
        }
        let mut output_file = outputs.next();
        sink.emit(Event::Started { id: id.to_string() });
        // Nothing starts unless its start is recorded: the sink stops the step (cancels) when
        // it could not make the start durable (a full disk), and then this one never runs.
        if ctx.cancel.is_cancelled() {
            return Err(Failure { interrupted: true, ..Failure::new(format!("stopped before `{id}` started")) });
        }
        let outcome = self
            .command(ctx, id, run)
            .env("RDEPLOY_OUTPUT", &output_file.path)
            .run(&ctx.cancel, ctx.timeout, &mut forward_output(sink))
            .await
            .map_err(|e| Failure::new(e.to_string()))?;
        if outcome.success() {
            // Journaled before the sub-change's completion, so a done sub-change has its outputs.
            self.report_outputs(sink, id, &mut output_file);
            sink.emit(Event::Done { id: id.to_string(), note: None });
            Ok(())
        } else {
            let failure = Failure::from_process_named(&format!("`{id}`"), run, &outcome);
            sink.emit(Event::Failed { id: id.to_string(), error: failure.summary.clone() });
            Err(failure)
        }
    }

    /// Runs a sub-change's `check`; `Ok(true)` when it says the sub-change is in place.
    async fn check_in_place(
        &self,
        ctx: &StepContext,
        sink: &dyn EventSink,
        id: &str,
        check: &str,
    ) -> Result<bool, Failure> {
        let outcome = self
            .command(ctx, id, check)
            .run(&ctx.cancel, ctx.timeout, &mut forward_output(sink))
            .await
            .map_err(|e| Failure::new(e.to_string()))?;
        if outcome.interrupted {
            return Err(Failure::from_process_named(&format!("the check of `{id}`"), check, &outcome));
        }
        if outcome.success() {
            sink.emit(Event::Done { id: id.to_string(), note: Some(format!("already in place: `{check}` exited 0")) });
        }
        Ok(outcome.success())
    }

    /// Reads what a sub-change wrote to `$RDEPLOY_OUTPUT` and reports it as the step's outputs.
    fn report_outputs(&self, sink: &dyn EventSink, id: &str, file: &mut OutputFile) {
        let text = match std::fs::read(&file.path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            // The sub-change wrote no output: nothing was created, nor is there anything to remove
            // (a process it left running that writes one later leaves it in the private
            // directory, removed with it when the step's run ends).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                file.exists = false;
                return;
            }
            Err(e) => {
                sink.emit(Event::Warning { message: format!("could not read `{id}`'s `$RDEPLOY_OUTPUT`: {e}") });
                return;
            }
        };
        match crate::outputs::parse_output_file(&text) {
            Ok(values) if values.is_empty() => {}
            Ok(values) => {
                let values = values
                    .into_iter()
                    .map(|(key, value)| {
                        let value = serde_json::Value::String(value);
                        let value = if self.sensitive_outputs.contains(&key) {
                            OutputValue::Sensitive(Secret::new(value))
                        } else {
                            OutputValue::Plain(value)
                        };
                        (key, value)
                    })
                    .collect();
                sink.emit(Event::Outputs { values });
            }
            Err(e) => sink.emit(Event::Warning {
                message: format!("`{id}` wrote a `$RDEPLOY_OUTPUT` rdeploy cannot read ({e}); its outputs are ignored"),
            }),
        }
    }

    fn command(&self, ctx: &StepContext, id: &str, script: &str) -> Command {
        let dir = match &self.dir {
            Some(dir) => ctx.resolve(dir),
            None => ctx.stack_dir.clone(),
        };
        Command::shell(script)
            .cwd(dir)
            .envs(ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .env("RDEPLOY_STACK", &ctx.stack)
            .env("RDEPLOY_STEP", &ctx.step)
            .env("RDEPLOY_SUB_CHANGE", id)
            .in_step(ctx)
    }
}

/// The `$RDEPLOY_OUTPUT` files of one run of a step: paths in a private directory (mode 0700,
/// outside the state directory: a sensitive output must never be written under it), one per
/// sub-change, and created by the command only if it writes one: a sub-change that writes no
/// output costs no file.
struct OutputFiles {
    dir: tempfile::TempDir,
    next: std::sync::atomic::AtomicU64,
}

impl OutputFiles {
    fn new() -> Result<OutputFiles, Failure> {
        let dir = tempfile::Builder::new()
            .prefix("rdeploy-output-")
            .tempdir()
            .map_err(|e| Failure::new(format!("could not create the directory for `$RDEPLOY_OUTPUT` files: {e}")))?;
        Ok(OutputFiles { dir, next: Default::default() })
    }

    /// A path no earlier sub-change of this run was given; the file, if the command writes
    /// it, is removed when the returned guard drops.
    fn next(&self) -> OutputFile {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        OutputFile { path: self.dir.path().join(n.to_string()), exists: true }
    }
}

struct OutputFile {
    path: PathBuf,
    /// Cleared when reading it found no file: then there is none to remove.
    exists: bool,
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.exists {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Adapter for ShellSpec {
    fn problems(&self) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        match (&self.run, &self.sub_changes) {
            (Some(_), Some(_)) => problems.push(SpecProblem {
                at: vec![PathSegment::Key("sub_changes")],
                message: "a shell step has either `run` or `sub_changes`, not both".into(),
                hint: Some("put the single command in a sub-change of its own".into()),
            }),
            (None, None) => problems.push(SpecProblem {
                at: vec![],
                message: "a shell step needs `run` or `sub_changes`".into(),
                hint: Some("add `run: ./script.sh`, or `sub_changes:` with `name` and `run` each".into()),
            }),
            (None, Some(subs)) if subs.is_empty() => problems.push(SpecProblem {
                at: vec![PathSegment::Key("sub_changes")],
                message: "`sub_changes` is empty".into(),
                hint: Some("list at least one `{ name: ..., run: ... }`".into()),
            }),
            _ => {}
        }
        if self.check.is_some() && self.run.is_none() {
            problems.push(SpecProblem {
                at: vec![PathSegment::Key("check")],
                message: "a step-level `check` goes with a bare `run`".into(),
                hint: Some("give each sub-change its own `check`".into()),
            });
        }
        for (i, key) in self.sensitive_outputs.iter().enumerate() {
            if !crate::outputs::valid_key(key) {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key("sensitive_outputs"), PathSegment::Index(i)],
                    message: format!("`{key}` is not an output name"),
                    hint: Some("use letters, digits, `_` and `-`, starting with a letter or `_`".into()),
                });
            }
        }
        if let Some(subs) = &self.sub_changes {
            // Each name's first item: a scan of the earlier items made this quadratic.
            let mut first_of: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
            for (i, sub) in subs.iter().enumerate() {
                let first = *first_of.entry(sub.name.as_str()).or_insert(i);
                if first != i {
                    problems.push(SpecProblem {
                        at: vec![PathSegment::Key("sub_changes"), PathSegment::Index(i), PathSegment::Key("name")],
                        message: format!("sub-change `{}` is declared twice (first as item {})", sub.name, first + 1),
                        hint: Some("give every sub-change a unique name: it is its checkpoint key".into()),
                    });
                }
                // A name is printed raw in reports, logs and commands: a newline in it would
                // forge a line there, so control characters are refused at load.
                if let Some(c) = sub.name.chars().find(|c| c.is_control()) {
                    problems.push(SpecProblem {
                        at: vec![PathSegment::Key("sub_changes"), PathSegment::Index(i), PathSegment::Key("name")],
                        message: format!(
                            "sub-change name {:?} holds a control character ({})",
                            sub.name,
                            c.escape_unicode()
                        ),
                        hint: Some(
                            "a name is printed in reports and commands: use letters, digits, spaces and punctuation"
                                .into(),
                        ),
                    });
                }
                if sub.name.trim().is_empty() {
                    problems.push(SpecProblem {
                        at: vec![PathSegment::Key("sub_changes"), PathSegment::Index(i), PathSegment::Key("name")],
                        message: "a sub-change name is empty".into(),
                        hint: None,
                    });
                }
            }
        }
        problems
    }

    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        self.dir.iter().map(|d| (vec![PathSegment::Key("dir")], d.clone())).collect()
    }

    async fn preflight(&self, _ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        let binary = PathBuf::from("/bin/sh");
        if !binary.exists() {
            return Err(AdapterError::ToolMissing {
                tool: "sh".into(),
                hint: "install a POSIX shell at /bin/sh".into(),
            });
        }
        Ok(ToolInfo { binary, version: "posix sh".into() })
    }

    async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        let planned = self.planned();
        sink.emit(Event::Planned { ids: planned.iter().map(|(id, ..)| id.to_string()).collect() });
        let outputs = OutputFiles::new()?;
        for (id, run, _) in planned {
            self.run_sub_change(ctx, sink, &outputs, id, run).await?;
        }
        Ok(())
    }

    /// Runs each sub-change the preview did not find in place (its `check` failed, or it has
    /// none), in order; the others are reported in place and not run.
    async fn converge(&self, ctx: &StepContext, preview: &Preview, sink: &dyn EventSink) -> Result<(), Failure> {
        let in_place: std::collections::HashMap<&str, &PlanItem> =
            preview.items.iter().filter(|i| i.action == PlanAction::Unchanged).map(|i| (i.id.as_str(), i)).collect();
        let planned = self.planned();
        sink.emit(Event::Planned { ids: planned.iter().map(|(id, ..)| id.to_string()).collect() });
        let outputs = OutputFiles::new()?;
        for (id, run, _) in planned {
            match in_place.get(id) {
                Some(item) => sink.emit(Event::InPlace { id: id.to_string(), note: item.reason.clone() }),
                None => self.run_sub_change(ctx, sink, &outputs, id, run).await?,
            }
        }
        Ok(())
    }

    async fn recover(&self, ctx: &StepContext, prior: &PriorStep, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        let planned = self.planned();
        sink.emit(Event::Planned { ids: planned.iter().map(|(id, ..)| id.to_string()).collect() });
        let statuses = prior.statuses();
        let outputs = OutputFiles::new()?;
        for (i, &(id, run, check)) in planned.iter().enumerate() {
            match statuses.get(id).copied() {
                Some(SubStatus::Done) => continue,
                Some(SubStatus::Started) => {
                    // Sub-changes run in order and the next starts only after one succeeded: a
                    // later one with a record proves this one completed, its end record lost
                    // (an unreadable journal line set aside), not cut short by a crash.
                    let later = planned[i + 1..]
                        .iter()
                        .find(|(next, ..)| statuses.get(next).is_some_and(|s| *s != SubStatus::Pending));
                    if let Some((next, ..)) = later {
                        sink.emit(Event::Done {
                            id: id.to_string(),
                            note: Some(format!(
                                "its end was not in the journal, but `{next}` started after it, which only follows its success"
                            )),
                        });
                        continue;
                    }
                    if let Some(check) = check {
                        if self.check_in_place(ctx, sink, id, check).await? {
                            continue;
                        }
                    }
                }
                _ => {}
            }
            self.run_sub_change(ctx, sink, &outputs, id, run).await?;
        }
        Ok(Recovered::Complete)
    }

    async fn inspect(&self, _ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        let mut inspection = Inspection::default();
        let statuses = prior.statuses();
        for (id, run, check) in self.planned() {
            match (statuses.get(id).copied(), check) {
                (Some(SubStatus::Done), _) => inspection.actions.push(format!("keep {id}: done")),
                (Some(SubStatus::Started), Some(check)) => {
                    inspection.actions.push(format!(
                        "check {id} (uncertain after a crash): `{check}`, then run `{run}` if it is not in place"
                    ));
                    inspection.remaining.push(id.to_string());
                }
                (Some(SubStatus::Started), None) => {
                    inspection
                        .actions
                        .push(format!("run {id} again (uncertain after a crash, no `check` declared): `{run}`"));
                    inspection.remaining.push(id.to_string());
                }
                _ if id == RUN_ID => {
                    inspection.actions.push(format!("run `{run}`"));
                    inspection.remaining.push(id.to_string());
                }
                _ => {
                    inspection.actions.push(format!("run {id}: `{run}`"));
                    inspection.remaining.push(id.to_string());
                }
            }
        }
        Ok(inspection)
    }

    /// A sub-change whose `check` exits 0 is "already in place" (the check is the stack
    /// author's read-only test): `up` does not run it ([`Adapter::converge`]). A check is run,
    /// never a `run`.
    async fn preview(&self, ctx: &StepContext) -> Result<Preview, crate::preview::PreviewError> {
        let mut preview = Preview::default();
        for (id, run, check) in self.planned() {
            let mut item = match check {
                Some(check) => {
                    let outcome = self
                        .command(ctx, id, check)
                        .run(&ctx.cancel, ctx.timeout, &mut |_, _| {})
                        .await
                        .map_err(|e| Failure::new(e.to_string()))?;
                    if outcome.interrupted {
                        return Err(
                            Failure::from_process_named(&format!("the check of `{id}`"), check, &outcome).into()
                        );
                    }
                    if outcome.success() {
                        PlanItem::new(id, PlanAction::Unchanged)
                            .because(format!("already in place: `{check}` exited 0"))
                    } else {
                        PlanItem::new(id, PlanAction::Run).because(format!("`{check}` {}", outcome.describe_status()))
                    }
                }
                None if id == RUN_ID => PlanItem::new(id, PlanAction::Run).because("a bare `run` always runs"),
                None => PlanItem::new(id, PlanAction::Run).because("no `check` declared"),
            };
            item.details.push(format!("`{run}`"));
            preview.items.push(item);
        }
        let in_place = preview.items.iter().filter(|i| i.action == PlanAction::Unchanged).count();
        preview.summary = Some(format!("{} to run, {in_place} in place", preview.items.len() - in_place));
        Ok(preview)
    }

    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        let cd = match &self.dir {
            Some(dir) => format!("cd {}", shell_quote(&PathBuf::from(ctx.stack_dir).join(dir).to_string_lossy())),
            None => format!("cd {}", shell_quote(ctx.stack_dir)),
        };
        let mut doc = RecoveryDoc::default();
        let planned = self.planned();
        let statuses = prior.map(PriorStep::statuses).unwrap_or_default();
        let left: Vec<_> =
            planned.iter().filter(|(id, ..)| statuses.get(id).copied() != Some(SubStatus::Done)).collect();
        for (id, _, check) in &planned {
            if let Some(check) = check {
                doc.inspect.push(format!("{check}    # exits 0 when `{id}` is in place"));
            }
        }
        doc.recover.push(format!("rdeploy recover {}", ctx.stack_file));
        if !left.is_empty() {
            doc.notes.push(format!(
                "by hand, run what is not done yet, in order, from `{cd}`: {}",
                left.iter().map(|(id, run, _)| format!("`{run}` ({id})")).collect::<Vec<_>>().join(", ")
            ));
        }
        if planned.iter().all(|(_, _, check)| check.is_none()) {
            doc.notes.push("no `check` commands are declared: verify by the scripts' own effects".into());
        } else {
            doc.verify.extend(planned.iter().filter_map(|(_, _, c)| c.map(str::to_string)));
        }
        if !ctx.resumable {
            doc.notes.push("a bare `run` is not resumable: it completes or its `revert` runs".into());
        }
        doc
    }

    fn default_resumable(&self) -> bool {
        self.sub_changes.is_some()
    }

    /// A sub-change in place does not run, so it writes no `$RDEPLOY_OUTPUT`.
    fn in_place_keeps_last_outputs(&self) -> bool {
        true
    }

    /// The scripts its commands (`run`, each sub-change's `run` and `check`) and the step's
    /// `revert` name, when they are files under its working `dir`: executables and script
    /// files (`.sh`, `.py`, ...), not the data files the commands write (`>> out/seed.log`).
    /// The working `dir` itself is not pinned: its scripts write there.
    fn pinned_paths(&self, stack_dir: &Path, revert: Option<&str>) -> Vec<PathBuf> {
        let cwd = self.dir.clone().unwrap_or_default();
        let mut commands: Vec<&str> = self.run.iter().map(String::as_str).collect();
        for sub in self.sub_changes.iter().flatten() {
            commands.push(&sub.run);
            commands.extend(sub.check.as_deref());
        }
        commands.extend(revert);
        let mut paths = Vec::new();
        for word in commands.iter().flat_map(|c| c.split(|ch: char| ch.is_whitespace() || ";&|()<>\"'`".contains(ch))) {
            let script = [".sh", ".bash", ".py", ".rb", ".pl"].iter().any(|e| word.ends_with(e))
                || (word.contains('/') && !word.starts_with('/') && !word.contains('$'));
            if script && stack_dir.join(&cwd).join(word).is_file() {
                let path = cwd.join(word);
                if is_script(&stack_dir.join(&path)) {
                    paths.push(path);
                }
            }
        }
        paths
    }

    fn shell_line_keys(&self) -> &'static [&'static [&'static str]] {
        &[&["run"], &["check"], &["sub_changes", "*", "run"], &["sub_changes", "*", "check"]]
    }

    fn declared_sub_changes(&self) -> Vec<crate::contract::DeclaredSubChange<'_>> {
        let declared = self.sub_changes.iter().flatten();
        declared
            .map(|s| crate::contract::DeclaredSubChange { name: &s.name, run: &s.run, check: s.check.as_deref() })
            .collect()
    }

    /// The working directory and the `run` line (a `sub_changes` list has a table of its own:
    /// [`Adapter::declared_sub_changes`]).
    fn settings(&self, _stack_dir: &Path) -> Vec<(&'static str, crate::contract::Setting)> {
        use crate::contract::Setting;
        let dir = self.dir.iter().map(|d| ("working directory", Setting::Code(d.display().to_string())));
        dir.chain(self.run.iter().map(|r| ("run", Setting::Code(r.clone())))).collect()
    }
}

/// Whether `path` is a script: named as one, or executable.
fn is_script(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let by_name = path.extension().is_some_and(|e| ["sh", "bash", "py", "rb", "pl"].iter().any(|x| e == *x));
    let executable = std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
    by_name || executable
}

/// Runs a step's `revert` command (any tool may declare one) in the stack's directory.
pub async fn run_revert(ctx: &StepContext, script: &str, sink: &dyn EventSink) -> Result<(), Failure> {
    let outcome = Command::shell(script)
        .cwd(&ctx.stack_dir)
        .envs(ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())))
        .env("RDEPLOY_STACK", &ctx.stack)
        .env("RDEPLOY_STEP", &ctx.step)
        .in_step(ctx)
        .run(&ctx.cancel, ctx.timeout, &mut forward_output(sink))
        .await
        .map_err(|e| Failure::new(e.to_string()))?;
    if outcome.success() {
        Ok(())
    } else {
        Err(Failure::from_process_named("the revert", script, &outcome))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Recorder;
    use crate::PriorSubChange;

    fn ctx(dir: &std::path::Path) -> StepContext {
        StepContext { step: "seed".into(), ..crate::testing::step_context(dir) }
    }

    fn spec(subs: &[(&str, &str, Option<&str>)]) -> ShellSpec {
        ShellSpec {
            run: None,
            check: None,
            dir: None,
            sensitive_outputs: Vec::new(),
            sub_changes: Some(
                subs.iter()
                    .map(|(n, r, c)| ShellSubChange {
                        name: n.to_string(),
                        run: r.to_string(),
                        check: c.map(str::to_string),
                    })
                    .collect(),
            ),
        }
    }

    #[tokio::test]
    async fn each_sub_change_writes_outputs_to_rdeploy_output() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec(&[
            ("one", "echo url=http://db:5432 >> \"$RDEPLOY_OUTPUT\"", None),
            ("two", "printf 'notes<<EOF\\na\\nb\\nEOF\\npass=s3cret-value\\n' >> \"$RDEPLOY_OUTPUT\"", None),
        ]);
        spec.sensitive_outputs = vec!["pass".into()];
        let rec = Recorder::default();
        spec.apply(&ctx(dir.path()), &rec).await.unwrap();
        let out = rec.outputs();
        assert_eq!(out["url"], OutputValue::Plain("http://db:5432".into()));
        assert_eq!(out["notes"], OutputValue::Plain("a\nb".into()));
        assert!(out["pass"].is_sensitive());
        assert_eq!(out["pass"].value(), "s3cret-value");
        // Outputs come before the sub-change's completion, so they are journaled with it.
        let events = rec.events();
        let outputs_at = events.iter().position(|e| matches!(e, Event::Outputs { .. })).unwrap();
        let done_at = events.iter().position(|e| matches!(e, Event::Done { id, .. } if id == "one")).unwrap();
        assert!(outputs_at < done_at, "{events:?}");
    }

    /// A sub-change that writes no output costs no file: `$RDEPLOY_OUTPUT` names a path in a
    /// private directory that only a write creates; each sub-change gets its own, and none is
    /// left behind.
    #[tokio::test]
    async fn rdeploy_output_is_created_only_by_a_write_and_removed_after() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(&[
            ("quiet", "test ! -e \"$RDEPLOY_OUTPUT\" && echo \"$RDEPLOY_OUTPUT\" >> paths", None),
            ("writes", "echo k=v >> \"$RDEPLOY_OUTPUT\" && echo \"$RDEPLOY_OUTPUT\" >> paths", None),
        ]);
        let rec = Recorder::default();
        spec.apply(&ctx(dir.path()), &rec).await.unwrap();
        assert_eq!(rec.outputs()["k"], OutputValue::Plain("v".into()));
        assert!(rec.warnings().is_empty(), "{:?}", rec.warnings());
        let paths = std::fs::read_to_string(dir.path().join("paths")).unwrap();
        let paths: Vec<&str> = paths.lines().collect();
        assert_eq!(paths.len(), 2);
        assert_ne!(paths[0], paths[1]);
        let private = std::path::Path::new(paths[0]).parent().unwrap();
        assert!(!private.starts_with(dir.path()), "outside the stack's and state's directories");
        for path in paths {
            assert!(!std::path::Path::new(path).exists(), "{path} is left behind");
        }
        assert!(!private.exists(), "the private directory is removed with the step");
    }

    #[tokio::test]
    async fn stops_at_the_first_failing_sub_change() {
        let dir = tempfile::tempdir().unwrap();
        let spec =
            spec(&[("a", "echo a >> log", None), ("b", "echo boom >&2; exit 4", None), ("c", "echo c >> log", None)]);
        let sink = Recorder::default();
        let failure = spec.apply(&ctx(dir.path()), &sink).await.unwrap_err();
        assert_eq!(failure.exit_code, Some(4));
        assert_eq!(failure.summary, "`b` exited with status 4: boom");
        assert_eq!(failure.command.as_deref(), Some("echo boom >&2; exit 4"));
        let events = sink.events();
        assert_eq!(events[0], Event::Planned { ids: vec!["a".into(), "b".into(), "c".into()] });
        assert!(events.contains(&Event::Done { id: "a".into(), note: None }));
        assert!(events.iter().any(|e| matches!(e, Event::Failed { id, .. } if id == "b")));
        assert!(!events.iter().any(|e| matches!(e, Event::Started { id } if id == "c")));
        assert_eq!(std::fs::read_to_string(dir.path().join("log")).unwrap(), "a\n");
    }

    #[tokio::test]
    async fn recover_skips_done_and_checks_uncertain() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(&[
            ("a", "echo a >> log", None),
            ("b", "echo b >> log", Some("test -f b-in-place")),
            ("c", "echo c >> log", None),
        ]);
        std::fs::write(dir.path().join("b-in-place"), "").unwrap();
        let prior = PriorStep {
            sub_changes: vec![
                PriorSubChange { id: "a".into(), status: SubStatus::Done, error: None },
                PriorSubChange { id: "b".into(), status: SubStatus::Started, error: None },
                PriorSubChange { id: "c".into(), status: SubStatus::Pending, error: None },
            ],
            facts: Default::default(),
        };
        let sink = Recorder::default();
        spec.recover(&ctx(dir.path()), &prior, &sink).await.unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("log")).unwrap(), "c\n");
        let inspection = spec.inspect(&ctx(dir.path()), &prior).await.unwrap();
        assert_eq!(inspection.remaining, vec!["b".to_string(), "c".to_string()]);
    }

    #[test]
    fn a_control_character_in_a_sub_change_name_is_refused() {
        let problems = spec(&[("users\nstep `x`: done", "true", None)]).problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(
            problems[0].message,
            "sub-change name \"users\\nstep `x`: done\" holds a control character (\\u{a})"
        );
        assert!(!problems[0].message.contains('\n'));
        // Twenty thousand distinct names are checked in one pass (this was a scan per item).
        let names: Vec<String> = (0..20_000).map(|i| format!("s{i}")).collect();
        let many: Vec<(&str, &str, Option<&str>)> = names.iter().map(|n| (n.as_str(), "true", None)).collect();
        assert!(spec(&many).problems().is_empty());
    }

    #[test]
    fn run_and_sub_changes_are_exclusive() {
        let mut both = spec(&[("a", "true", None)]);
        both.run = Some("true".into());
        assert_eq!(both.problems().len(), 1);
        let dup = spec(&[("a", "true", None), ("a", "true", None)]);
        let problems = dup.problems();
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].at,
            vec![PathSegment::Key("sub_changes"), PathSegment::Index(1), PathSegment::Key("name")]
        );
    }
}

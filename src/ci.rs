//! `rdeploy ci`: one command for pipelines. It runs `up` when no unfinished deploy is recorded
//! and `recover` when one is (never a re-run from the top), says what changed in the stack since
//! the failure, and reports in the CI's own terms: GitHub annotations and step summary, JUnit XML.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};
use rdeploy_adapters::SubStatus;

use crate::checkpoint::{Deploy, DeployState, StepStatus};
use crate::diff::{Change, StackDiff, StepDiff};
use crate::engine::Session;
use crate::exit::{Code, Refusal};
use crate::redact::Redactor;
use crate::report::{self, Status, StepReport, StepView};
use crate::reporter::{Finish, Finished};
use crate::stack::StackError;
use crate::ui::Ui;

/// Where the CI wants its reports, read from the environment GitHub Actions sets.
pub struct Outputs {
    /// `GITHUB_ACTIONS=true`: print workflow commands (`::error::`) on stdout.
    pub annotations: bool,
    /// `$GITHUB_STEP_SUMMARY`: markdown appended for the job's summary page.
    pub step_summary: Option<PathBuf>,
    /// `--junit FILE`: one test case per step, for GitLab and Jenkins.
    pub junit: Option<PathBuf>,
}

impl Outputs {
    pub fn from_env(junit: Option<PathBuf>) -> Outputs {
        Outputs {
            annotations: std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true"),
            step_summary: std::env::var_os("GITHUB_STEP_SUMMARY").filter(|v| !v.is_empty()).map(PathBuf::from),
            junit,
        }
    }
}

/// What `ci` decided to run.
enum Mode {
    Up,
    Recover { deploy_id: String, done: Vec<String> },
}

/// Runs the CI wrapper and returns its exit code (docs/exit-codes.md).
///
/// With a reviewed plan (`ci --plan PLANFILE`, on merge): `up --plan` when no unfinished deploy
/// is recorded; a retry of the job after that deploy stopped part-way recovers it (the plan is
/// spent, as after `up --plan`); an unfinished deploy of anything else is refused (exit 2): the
/// plan was not made on top of it.
pub async fn run(
    session: &mut Session,
    outputs: &Outputs,
    plan: Option<crate::planfile::Loaded>,
) -> anyhow::Result<Code> {
    let unfinished = session.store.load_unfinished()?;
    if let (Some(deploy), Some(plan)) = (&unfinished, &plan) {
        let of_this_plan = deploy.runs.iter().filter_map(|r| r.plan.as_deref()).any(|p| p.contains(&plan.digest));
        if !of_this_plan {
            let err = Refusal::new(
                Code::BadInput,
                format!(
                    "an unfinished deploy ({}) is recorded in {} that did not start from the plan {}: the plan was not made on top of it",
                    deploy.deploy_id,
                    session.store.location(),
                    plan.path.display()
                ),
            )
            .with_hint(format!(
                "settle it first (`rdeploy ci {0}` recovers it), then plan again: `rdeploy plan {0} -o {1}`",
                session.stack_arg,
                plan.path.display()
            ))
            .into();
            return Err(refused(session, outputs, err));
        }
    }
    let session: &Session = match (&unfinished, plan) {
        (None, Some(plan)) => {
            session.from_plan = Some(std::sync::Arc::new(plan));
            session
        }
        _ => session,
    };
    let mode = match &unfinished {
        None => {
            session.ui.info(format!(
                "ci: no unfinished deploy recorded in {}: running `rdeploy up {}`",
                session.store.location(),
                session.stack_arg
            ));
            Mode::Up
        }
        Some(deploy) => {
            if let Err(err) = session.check_same_stack(deploy) {
                return Err(refused(session, outputs, err));
            }
            report_changes(session, outputs, &reported_changes(StackDiff::between(&session.stack, deploy)));
            let done: Vec<String> =
                deploy.steps.iter().filter(|s| s.status == StepStatus::Done).map(|s| s.name.clone()).collect();
            session.ui.info(format!(
                "ci: unfinished deploy {} recorded ({} of {} done): running `rdeploy recover {}`, never a re-run from the top",
                deploy.deploy_id,
                done.len(),
                crate::out::count(deploy.steps.len(), "step"),
                session.stack_arg
            ));
            Mode::Recover { deploy_id: deploy.deploy_id.clone(), done }
        }
    };
    let result = match mode {
        Mode::Up => session.up().await,
        Mode::Recover { .. } => session.recover(false).await,
    };
    // The CI's own reports of the run's end, each handed the report the text was rendered from.
    let summary = outputs.step_summary.clone().map(|path| StepSummary { path, mode });
    let junit = outputs.junit.clone().map(|path| JUnit { path });
    let mut finishers: Vec<&dyn Finish> = Vec::new();
    if outputs.annotations {
        finishers.push(&Annotations);
    }
    if let Some(summary) = &summary {
        finishers.push(summary);
    }
    if let Some(junit) = &junit {
        finishers.push(junit);
    }
    match result.and_then(|report| crate::cmd::present_to(session, &report, &finishers)) {
        Ok(code) => Ok(code),
        Err(err) => Err(refused(session, outputs, err)),
    }
}

/// GitHub annotations (`GITHUB_ACTIONS=true`): a workflow command per failed, refused or rolled
/// back step, and a notice for a complete deploy.
struct Annotations;

impl Finish for Annotations {
    fn finished(&self, session: &Session, end: &Finished<'_>) {
        if let Some(status) = end.status {
            annotate_outcome(session, status);
        }
    }
}

/// `$GITHUB_STEP_SUMMARY`: the deploy's markdown report and the CI run's own lines, appended.
struct StepSummary {
    path: PathBuf,
    mode: Mode,
}

impl Finish for StepSummary {
    fn finished(&self, session: &Session, end: &Finished<'_>) {
        let Some(status) = end.status else { return };
        // What the run itself picked up (recover's diff against the checkpoint it continued).
        let changes = end.run.diff.clone().map(reported_changes).unwrap_or_default();
        let text = summary(session, status, end.code, &self.mode, &changes);
        if let Err(e) = append(&self.path, &text, &session.redactor) {
            session.ui.warn(format!("could not append to $GITHUB_STEP_SUMMARY ({}): {e:#}", self.path.display()));
        }
    }
}

/// `--junit FILE`: one test case per step.
struct JUnit {
    path: PathBuf,
}

impl Finish for JUnit {
    fn finished(&self, session: &Session, end: &Finished<'_>) {
        let (Some(status), Some(deploy)) = (end.status, end.run.deploy()) else { return };
        let xml = junit(session, deploy, status);
        if let Err(e) = write_file(&self.path, &xml, &session.redactor) {
            session.ui.warn(format!("could not write the JUnit report {}: {e:#}", self.path.display()));
        }
    }
}

/// `rdeploy ci --plan-only`, for pull requests: the plan on stdout, appended as markdown to
/// `$GITHUB_STEP_SUMMARY`, and a JUnit test case per step (a step whose preview failed is a
/// failure; changes are what a pull request is for, so they are not). Nothing is deployed.
pub async fn plan_only(session: &Session, outputs: &Outputs, save: Option<&Path>) -> anyhow::Result<Code> {
    session.ui.info(format!("ci: --plan-only: running `rdeploy plan {}`; nothing is deployed", session.stack_arg));
    let plan = match session.plan().await {
        Ok(plan) => plan,
        Err(err) => return Err(refused(session, outputs, err)),
    };
    if let Some(path) = save {
        let saved = crate::planfile::build(
            &session.stack,
            &session.stack_file,
            &session.state.shared,
            &plan,
            &session.redactor,
        )
        .and_then(|file| crate::planfile::write(path, &file));
        match saved {
            Ok(digest) => session.ui.info(format!(
                "ci: saved the plan to {} (sha256:{}): keep it as an artifact for `rdeploy ci --plan {}` on merge",
                path.display(),
                &digest[..12],
                path.display()
            )),
            Err(err) => return Err(refused(session, outputs, err)),
        }
    }
    out!(session.ui.out(), "{}", crate::plan::render_text(&plan));
    if outputs.annotations {
        for step in plan.steps.iter().filter(|s| s.error.is_some()) {
            let line = session.stack.step(&step.name).map(|s| s.line);
            let message = step.error.as_deref().unwrap_or_default();
            let title = format!("rdeploy: step {} could not be planned", step.name);
            outln!(session.ui.out(), "{}", workflow_command("error", &session.stack_file, line, &title, message));
        }
    }
    if let Some(path) = &outputs.step_summary {
        if let Err(e) = append(path, &crate::plan::render_markdown(&plan), &session.redactor) {
            session.ui.warn(format!("could not append to $GITHUB_STEP_SUMMARY ({}): {e:#}", path.display()));
        }
    }
    if let Some(path) = &outputs.junit {
        if let Err(e) = write_file(path, &plan_junit(&plan, &session.redactor), &session.redactor) {
            session.ui.warn(format!("could not write the JUnit report {}: {e:#}", path.display()));
        }
    }
    Ok(Code::Ok)
}

/// The JUnit XML of a plan: a test case per step in run order, its items as the case's output.
fn plan_junit(plan: &crate::plan::StackPlan, redactor: &Redactor) -> String {
    let redacted = |text: &str| redactor.redact_document(text);
    let mut suite = TestSuite::new(format!("{} plan", plan.stack));
    for step in &plan.steps {
        let status = match &step.error {
            Some(error) => {
                let mut failed = TestCaseStatus::non_success(NonSuccessKind::Failure);
                failed.set_message(redacted(error)).set_type("plan-failed");
                failed
            }
            None => TestCaseStatus::success(),
        };
        let mut case = TestCase::new(redacted(&step.name), status);
        case.set_classname(format!("{}.plan.{}", redacted(&plan.stack), step.tool));
        let mut text = format!("{} change(s)", step.changes);
        if let Some(summary) = &step.summary {
            let _ = write!(text, ": {summary}");
        }
        for item in &step.items {
            let _ = write!(text, "\n{} {}", item.action.as_str(), item.id);
        }
        case.set_system_out(redacted(&text));
        suite.add_test_case(case);
    }
    let mut report = Report::unnamed();
    report.add_test_suite(suite);
    junit_text(&report)
}

/// The changes `ci` reports: the fix committed between the failed job and the retry is the
/// normal case, so it is reported, not refused (recover refuses the ones it cannot map: a step
/// that ran and was removed, or given another tool).
fn reported_changes(diff: StackDiff) -> Vec<StepDiff> {
    diff.steps
        .into_iter()
        .filter(|s| {
            matches!(
                s.change,
                Change::Changed { tool_changed: false, .. } | Change::Added | Change::Removed { ran: false }
            )
        })
        .collect()
}

fn change_text(name: &str, change: &Change) -> String {
    match change {
        Change::Changed { done: false, .. } => format!("step `{name}` changed since the failure; recover uses the new settings"),
        Change::Changed { done: true, .. } => format!(
            "step `{name}` changed after it completed; recover does not run done steps again: run `rdeploy up` once this deploy completes to apply the change"
        ),
        Change::Added => format!("step `{name}` was added since the failure; recover runs it in its place in the order"),
        Change::Removed { .. } => format!("step `{name}` was removed from the stack before it ran; it will not run"),
    }
}

fn report_changes(session: &Session, outputs: &Outputs, changes: &[StepDiff]) {
    if changes.is_empty() {
        session.ui.info("ci: no step changed since the checkpoint");
        return;
    }
    for StepDiff { name, change } in changes {
        let text = change_text(name, change);
        match change {
            // The engine warns about these itself when it recovers the step.
            Change::Changed { done: false, .. } => session.ui.info(format!("ci: {text}")),
            _ => session.ui.warn(format!("ci: {text}")),
        }
        if outputs.annotations {
            let line = session.stack.step(name).map(|s| s.line);
            outln!(
                session.ui.out(),
                "{}",
                workflow_command("warning", &session.stack_file, line, &format!("rdeploy: step {name} changed"), &text)
            );
        }
    }
}

/// Reports an error that ended `ci` before or instead of a run (bad input, lock, refusal) to the
/// CI, then hands it back so `main` prints it and picks the exit code.
fn refused(session: &Session, outputs: &Outputs, err: anyhow::Error) -> anyhow::Error {
    report_error(outputs, &session.ui, &session.stack.name, &session.stack_file, err)
}

/// Like `refused`, for errors before a session exists (the stack file does not load): each
/// problem becomes an annotation at its line.
pub fn report_error(outputs: &Outputs, ui: &Ui, suite: &str, stack_file: &str, err: anyhow::Error) -> anyhow::Error {
    let redactor = ui.redactor();
    let redacted = |text: &str| redactor.redact_document(text);
    let (message, hint, code) = if let Some(r) = err.downcast_ref::<Refusal>() {
        (r.message.clone(), r.hint.clone(), r.code)
    } else if let Some(e) = err.downcast_ref::<StackError>() {
        (e.to_string().trim_end().to_string(), None, Code::BadInput)
    } else {
        (format!("{err:#}"), None, Code::Partial)
    };
    let full = match &hint {
        Some(h) => format!("{message}\nhint: {h}"),
        None => message.clone(),
    };
    let title = format!("rdeploy ci: exit {} ({})", code as i32, code_meaning(code));
    if outputs.annotations {
        match err.downcast_ref::<StackError>() {
            Some(e) => {
                for p in &e.problems {
                    let text = match &p.hint {
                        Some(h) => format!("{}\nhint: {h}", p.message),
                        None => p.message.clone(),
                    };
                    outln!(
                        ui.out(),
                        "{}",
                        workflow_command(
                            "error",
                            &p.file.display().to_string(),
                            Some(p.line),
                            "rdeploy: stack file",
                            &text
                        )
                    );
                }
            }
            None => outln!(ui.out(), "{}", workflow_command("error", stack_file, None, &title, &full)),
        }
    }
    if let Some(path) = &outputs.step_summary {
        let mut text = format!("# rdeploy ci: {suite}\n\n**Exit {}**: {}.\n\n", code as i32, code_meaning(code));
        let _ = writeln!(text, "```text\n{full}\n```\n");
        if let Err(e) = append(path, &text, redactor) {
            ui.warn(format!("could not append to $GITHUB_STEP_SUMMARY ({}): {e:#}", path.display()));
        }
    }
    if let Some(path) = &outputs.junit {
        let mut error = TestCaseStatus::non_success(NonSuccessKind::Error);
        error
            .set_message(redacted(message.lines().next().unwrap_or_default()))
            .set_type(format!("exit {}", code as i32))
            .set_description(redacted(&full));
        let mut case = TestCase::new("rdeploy ci", error);
        case.set_classname(redacted(suite));
        let mut junit_suite = TestSuite::new(redacted(suite));
        junit_suite.add_test_case(case);
        let mut report = Report::new("rdeploy ci");
        report.add_test_suite(junit_suite);
        if let Err(e) = write_file(path, &junit_text(&report), redactor) {
            ui.warn(format!("could not write the JUnit report {}: {e:#}", path.display()));
        }
    }
    err
}

fn annotate_outcome(session: &Session, status: &Status) {
    let next = status.next.as_deref().map(|n| format!("\nnext: {n}")).unwrap_or_default();
    for s in &status.steps {
        let line = session.stack.step(&s.name).map(|st| st.line);
        let (title, body) = if let Some(reason) = &s.refused {
            (format!("rdeploy: step {} refused by its gate", s.name), reason.clone())
        } else if let Some(revert) = &s.revert_error {
            (
                format!("rdeploy: step {} revert failed", s.name),
                format!("{revert}\nmanual action needed: undo what the revert left, then reconcile"),
            )
        } else if s.status.is_failed() {
            (format!("rdeploy: step {} ({}) failed", s.name, s.tool), failure_text(s))
        } else if s.status == StepView::Reverted && s.error.is_some() {
            (format!("rdeploy: step {} failed and was reverted", s.name), failure_text(s))
        } else if let Some(how) = s.reverted_how.as_ref().filter(|_| s.status == StepView::Reverted) {
            (format!("rdeploy: step {} ({}) rolled back", s.name, s.tool), how.clone())
        } else {
            continue;
        };
        // A failure the tool placed in the operator's files (a manifest's document, a line of a
        // terraform file) is annotated there; any other on the step's line in the stack file.
        let (file, line) = match s.location.as_ref().and_then(|at| Some((&at.file, at.line?))) {
            Some((file, at)) => (stack_relative(&session.stack_file, file), Some(at as usize)),
            None => (session.stack_file.clone(), line),
        };
        outln!(session.ui.out(), "{}", workflow_command("error", &file, line, &title, &format!("{body}{next}")));
    }
    if status.state == DeployState::Complete {
        let n = status.steps.len();
        outln!(
            session.ui.out(),
            "{}",
            workflow_command(
                "notice",
                &session.stack_file,
                None,
                &format!("rdeploy: stack {} deployed", status.stack),
                &format!("{} done", crate::out::count(n, "step"))
            )
        );
    }
}

/// The tool's message for a failed step: the summary, the failed sub-changes, the command.
fn failure_text(s: &StepReport) -> String {
    let mut text = s.error.clone().unwrap_or_else(|| "failed".into());
    for c in s.sub_changes.iter().filter(|c| c.status == SubStatus::Failed) {
        if c.error.is_some() && c.error != s.error {
            let _ = write!(text, "\n{}: {}", c.id, c.error.as_deref().unwrap_or("failed"));
        }
    }
    if let (Some(cmd), Some(code)) = (&s.command, s.exit_code) {
        let _ = write!(text, "\ncommand: `{cmd}` (exit {code})");
    }
    if let Some(h) = &s.hint {
        let _ = write!(text, "\nhint: {h}");
    }
    text
}

/// `file`, relative to the stack file's directory, as a path from where the stack file was
/// named (`deploy/stack.yaml` and `k8s/app.yaml` -> `deploy/k8s/app.yaml`), without `.` or a
/// `..` that a name before it takes back (`./stack.yaml` and `m/x.yaml` -> `m/x.yaml`): GitHub
/// matches an annotation's file by its path in the checkout as it is.
fn stack_relative(stack_file: &str, file: &str) -> String {
    let file = Path::new(file);
    let joined = match Path::new(stack_file).parent() {
        Some(dir) if !file.is_absolute() => dir.join(file),
        _ => file.to_path_buf(),
    };
    lexically_clean(&joined).to_string_lossy().into_owned()
}

/// `path` without `.` and with each `..` taking back the name before it, read as text only (no
/// file system: the path names a file in the checkout, wherever rdeploy runs). A `..` with no
/// name before it stays (`../shared/x.yaml`); one right after the root is the root.
fn lexically_clean(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component<'_>> = Vec::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(part),
            },
            _ => out.push(part),
        }
    }
    if out.is_empty() {
        PathBuf::from(".")
    } else {
        out.iter().collect()
    }
}

/// A GitHub workflow command (`::error file=..,line=..,title=..::message`), escaped as the
/// runner expects so multi-line messages and colons survive.
fn workflow_command(kind: &str, file: &str, line: Option<usize>, title: &str, message: &str) -> String {
    let escape_data = |s: &str| s.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A");
    let escape_prop = |s: &str| escape_data(s).replace(':', "%3A").replace(',', "%2C");
    let mut props = Vec::new();
    // A file annotation only makes sense for a path inside the checkout.
    if let Some(line) = line.filter(|_| !Path::new(file).is_absolute()) {
        props.push(format!("file={}", escape_prop(file)));
        props.push(format!("line={line}"));
    }
    props.push(format!("title={}", escape_prop(title)));
    format!("::{kind} {}::{}", props.join(","), escape_data(message))
}

fn code_meaning(code: Code) -> &'static str {
    match code {
        Code::Ok => "everything done",
        Code::Partial => "stopped part-way; the checkpoint is kept and the next `rdeploy ci` resumes it",
        Code::BadInput => "bad input; nothing was changed",
        Code::Reverted => "a step went back to where it started: it could not be resumed and its `revert` ran, or helm rolled it back (`recover: rollback`)",
        Code::Refused => "a gate refused a step; nothing was changed by that step",
        Code::Locked => "another run holds the lock",
        Code::RevertFailed => "a revert failed; manual action needed",
        Code::Interrupted => "interrupted by a signal; the checkpoint is consistent",
        Code::Changes => "the plan has changes",
    }
}

/// The markdown for `$GITHUB_STEP_SUMMARY`: the partial-state report or the success summary,
/// then what this CI run did.
fn summary(session: &Session, status: &Status, code: Code, mode: &Mode, changes: &[StepDiff]) -> String {
    let mut text = report::render_markdown(status);
    let _ = writeln!(text, "\n## CI run\n");
    let _ = writeln!(text, "- exit code: **{}** ({})", code as i32, code_meaning(code));
    match mode {
        Mode::Up => match &session.from_plan {
            Some(plan) => {
                let _ = writeln!(
                    text,
                    "- ran: `rdeploy up {} --plan {}`: the reviewed plan (sha256:`{}`), checked against the stack and the live state first",
                    session.stack_arg,
                    plan.path.display(),
                    plan.digest
                );
            }
            None => {
                let _ = writeln!(text, "- ran: `rdeploy up {}` (no unfinished deploy was recorded)", session.stack_arg);
            }
        },
        Mode::Recover { deploy_id, done } => {
            let before = if done.is_empty() {
                "none".to_string()
            } else {
                done.iter().map(|d| format!("`{d}`")).collect::<Vec<_>>().join(", ")
            };
            let _ = writeln!(
                text,
                "- ran: `rdeploy recover {}`, resuming deploy `{deploy_id}` (steps already done, not run again: {before})",
                session.stack_arg
            );
        }
    }
    if !changes.is_empty() {
        let _ = writeln!(text, "- changed since the failure:");
        for StepDiff { name, change } in changes {
            let _ = writeln!(text, "  - {}", change_text(name, change));
        }
    }
    let _ = writeln!(
        text,
        "- checkpoint: `{}` (carry it to the retry job as a cache or artifact)\n",
        session.store.location()
    );
    text
}

/// The JUnit report as XML, by quick-junit: it escapes, and drops what XML 1.0 forbids (a tool's
/// stderr may carry ANSI escapes).
fn junit_text(report: &Report) -> String {
    report.to_string().unwrap_or_else(|e| {
        tracing::warn!("cannot serialize the JUnit report: {e}");
        String::new()
    })
}

/// Appends `text` to `path`, redacted with the run's secrets.
fn append(path: &Path, text: &str, redactor: &Redactor) -> anyhow::Result<()> {
    let text = redactor.redact_document(text);
    let mut f = fs_err::OpenOptions::new().create(true).append(true).open(path)?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// Writes `text` to `path`, redacted with the run's secrets: the JUnit report redacts each value
/// before XML escapes it (a secret holding `&` would not read the same in the file), then the
/// file once more here.
fn write_file(path: &Path, text: &str, redactor: &Redactor) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs_err::create_dir_all(dir)?;
    }
    fs_err::write(path, redactor.redact_document(text))?;
    Ok(())
}

/// The JUnit XML report: a test case per step in run order; failures carry the tool's message
/// and the tail of its stderr, steps that did not run are skipped.
fn junit(session: &Session, deploy: &Deploy, status: &Status) -> String {
    let redacted = |text: &str| session.redactor.redact_document(text);
    let mut ordered: Vec<&StepReport> =
        session.stack.ordered().filter_map(|st| status.steps.iter().find(|s| s.name == st.name)).collect();
    for s in &status.steps {
        if !ordered.iter().any(|o| o.name == s.name) {
            ordered.push(s);
        }
    }
    let mut suite = TestSuite::new(redacted(&status.stack));
    let mut total_time = std::time::Duration::ZERO;
    for s in &ordered {
        let state = deploy.step(&s.name);
        let time = state.and_then(|d| Some(d.finished?.seconds_since(d.started?).max(0.0)));
        let time = time.and_then(|t| std::time::Duration::try_from_secs_f64(t).ok());
        total_time += time.unwrap_or_default();
        let done: Vec<&str> =
            s.sub_changes.iter().filter(|c| c.status == SubStatus::Done).map(|c| c.id.as_str()).collect();
        let failed_like = s.status.is_failed()
            || s.status == StepView::Refused
            || s.revert_error.is_some()
            || (s.status == StepView::Reverted && (s.error.is_some() || s.reverted_how.is_some()));
        let case_status = if failed_like {
            let kind = if s.status == StepView::Refused {
                "refused"
            } else if s.revert_error.is_some() {
                "revert-failed"
            } else if s.status == StepView::Reverted && s.error.is_none() {
                "rolled-back"
            } else if s.status == StepView::Reverted {
                "reverted"
            } else if s.interrupted {
                "interrupted"
            } else {
                "failed"
            };
            let message = s
                .error
                .clone()
                .or_else(|| s.revert_error.clone())
                .or_else(|| s.reverted_how.clone())
                .unwrap_or_else(|| kind.to_string());
            let mut body = failure_text(s);
            if let Some(r) = &s.revert_error {
                let _ = write!(body, "\nrevert failed: {r}");
            }
            if !done.is_empty() {
                let _ = write!(body, "\nin place: {}", done.join(", "));
            }
            if let Some(words) = s.attempt_words() {
                let _ = write!(body, "\n{words}");
                for (i, e) in s.attempt_errors.iter().enumerate() {
                    let _ = write!(body, "\nattempt {}: {e}", i + 1);
                }
            }
            if !s.stderr_tail.is_empty() {
                let _ = write!(body, "\n\nstderr (last lines):\n{}", s.stderr_tail.join("\n"));
            }
            if let Some(next) = &status.next {
                let _ = write!(body, "\n\nnext: {next}");
            }
            let mut failure = TestCaseStatus::non_success(NonSuccessKind::Failure);
            failure.set_message(redacted(&message)).set_type(kind).set_description(redacted(&body));
            failure
        } else if s.status != StepView::Done {
            let why = match s.status {
                StepView::Reverted => "reverted with the rest of the deploy (on_failure: revert)".to_string(),
                StepView::Skipped => {
                    format!("skipped: {}", s.skipped_because.as_deref().unwrap_or("a step it needs did not finish"))
                }
                _ if !s.blocked_by.is_empty() => format!("not run: waits for {}", s.blocked_by.join(", ")),
                _ => "not run".to_string(),
            };
            let mut skipped = TestCaseStatus::skipped();
            skipped.set_message(redacted(&why));
            skipped
        } else {
            TestCaseStatus::success()
        };
        let mut case = TestCase::new(redacted(&s.name), case_status);
        case.set_classname(format!("{}.{}", redacted(&status.stack), redacted(&s.tool)));
        if let Some(time) = time {
            case.set_time(time);
        }
        if !s.sub_changes.is_empty() {
            let mut lines: Vec<String> = s
                .sub_changes
                .iter()
                .map(|c| match c.status {
                    SubStatus::Started => format!("{}: uncertain", c.id),
                    other => format!("{}: {}", c.id, report::sub_word(other)),
                })
                .collect();
            if let Some(words) = s.attempt_words().filter(|_| s.status == StepView::Done) {
                lines.push(words);
            }
            case.set_system_out(redacted(&lines.join("\n")));
        }
        suite.add_test_case(case);
    }
    suite.set_time(total_time);
    let started = deploy.started.0;
    if let Some(at) = chrono::DateTime::from_timestamp(started.unix_timestamp(), started.nanosecond()) {
        suite.set_timestamp(at.fixed_offset());
    }
    let state =
        serde_json::to_value(status.state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    suite.add_property(Property::new("deploy_id", redacted(&deploy.deploy_id)));
    suite.add_property(Property::new("state", state));
    if let Some(next) = &status.next {
        suite.add_property(Property::new("next", redacted(next)));
    }
    let mut report = Report::new("rdeploy ci");
    report.set_time(total_time);
    report.add_test_suite(suite);
    junit_text(&report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_commands_escape_data_and_properties() {
        assert_eq!(
            workflow_command("error", "stack.yaml", Some(4), "step a: failed, 50%", "line 1\nline 2: 100%"),
            "::error file=stack.yaml,line=4,title=step a%3A failed%2C 50%25::line 1%0Aline 2: 100%25"
        );
        assert_eq!(workflow_command("warning", "/abs/stack.yaml", Some(4), "t", "m"), "::warning title=t::m");
    }

    #[test]
    fn junit_escapes_and_drops_forbidden_characters() {
        let mut failed = TestCaseStatus::non_success(NonSuccessKind::Failure);
        failed.set_message("a<b & \"c\" \u{1b}[31mred\u{1b}[0m \u{7}bell");
        let mut suite = TestSuite::new("s");
        suite.add_test_case(TestCase::new("t", failed));
        let mut report = Report::new("r");
        report.add_test_suite(suite);
        let xml = junit_text(&report);
        assert!(xml.contains(r#"message="a&lt;b &amp; &quot;c&quot; red bell""#), "{xml}");
        assert!(!xml.contains('\u{1b}') && !xml.contains('\u{7}'), "{xml}");
    }

    /// An annotation names its file as the checkout has it: from the stack file's directory,
    /// without `./` and without a `..` that a name before it takes back.
    #[test]
    fn an_annotations_file_is_named_without_dot_segments() {
        assert_eq!(stack_relative("deploy/stack.yaml", "k8s/app.yaml"), "deploy/k8s/app.yaml");
        assert_eq!(stack_relative("stack.yaml", "m/x.yaml"), "m/x.yaml");
        assert_eq!(stack_relative("./stack.yaml", "m/x.yaml"), "m/x.yaml");
        assert_eq!(stack_relative("stack.yaml", "./m/x.yaml"), "m/x.yaml");
        assert_eq!(stack_relative("a/../stack.yaml", "m/x.yaml"), "m/x.yaml");
        assert_eq!(stack_relative("stack.yaml", "a/../m/x.yaml"), "m/x.yaml");
        assert_eq!(stack_relative("deploy/./stack.yaml", "../m/./x.yaml"), "m/x.yaml");
        assert_eq!(stack_relative("stack.yaml", "../shared/x.yaml"), "../shared/x.yaml");
        assert_eq!(stack_relative("../deploy/stack.yaml", "../../x.yaml"), "../../x.yaml");
        assert_eq!(stack_relative("deploy/stack.yaml", "/srv/./k8s/../x.yaml"), "/srv/x.yaml");
        assert_eq!(stack_relative("stack.yaml", "/../x.yaml"), "/x.yaml");
    }
}

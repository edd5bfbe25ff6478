//! The terraform adapter: `plan -out` then `apply` of that saved plan, both with `-json`, turning
//! each resource instance address into a checkpointed sub-change as terraform reports it, and
//! recovering through terraform's own path (a read-only plan on the current state, then apply).
//!
//! Sensitive values: a variable the configuration declares `sensitive = true` reaches terraform
//! as `TF_VAR_<name>` in its environment, never on the command line, and its value (from `vars`,
//! or `TF_VAR_*` in the step's `env` or rdeploy's own environment) is redacted from everything
//! terraform prints, as are the step's secret `env` values (see [`crate::secrets`]); when var
//! files are used, the values of sensitive variables are read from the saved plan and redacted
//! too. Every other value prints as it is.
//! Terraform itself prints a sensitive value in a failed `local-exec` diagnostic (see
//! `fixtures/terraform/captured/sensitive-apply-fail.jsonl`), so its own masking is not enough.

pub mod config;
pub mod events;
pub mod lock;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use self::events::{parse_line, ApplyTracker, Diagnostic, PlanReport, PlannedChange, Progress, UiLine, UiMessage};
use self::lock::{parse_lock_diagnostic, LockInfo};
use self::state::InState;
use crate::process::{Command, Outcome, Signal};
use crate::redact::redact_line;
use crate::secrets;
use crate::{
    display_command, shell_quote, Adapter, AdapterError, CancellationToken, DescribeContext, Event, EventSink, Failure,
    FieldPath, Inspection, PathSegment, PlanAction, PlanItem, Preview, PriorStep, Recovered, RecoveryDoc, SpecProblem,
    StepContext, Stream, SubStatus, ToolInfo, TOOL_VERSION_FACT,
};

/// The key whose values reach terraform with their YAML types.
const TYPED_KEY: &str = "vars";

/// The `outputs` message of an apply's `-json` stream: name to `{sensitive, type, value}`.
type OutputsMessage = serde_json::Map<String, serde_json::Value>;

/// Facts kept in the checkpoint when another process holds the state lock.
pub const FACT_LOCK_ID: &str = "lock_id";
pub const FACT_LOCK: &str = "lock";

/// The saved plan `apply` and `recover` apply, inside the step's work dir.
const PLAN_FILE: &str = "tfplan";
/// `recover --dry-run` plans into its own file so it never replaces a plan being applied.
const INSPECT_PLAN_FILE: &str = "inspect.tfplan";
const PREVIEW_PLAN_FILE: &str = "preview.tfplan";
/// What a preview observes of the state, in words a stale plan's refusal names.
const STATE_OBSERVED: &str = "terraform state (serial, lineage)";
const INSTALL_HINT: &str =
    "install terraform 1.x (https://developer.hashicorp.com/terraform/install), or set `binary: tofu` for OpenTofu";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerraformSpec {
    /// Directory of the terraform configuration, relative to the stack file.
    pub dir: std::path::PathBuf,
    #[serde(default)]
    pub vars: std::collections::BTreeMap<String, serde_json::Value>,
    /// The entries of `vars` the stack marks secret, by key (not a stack key: the stack module
    /// fills it). Once resolved, their values are in `vars` too; they never go on the command line.
    #[serde(skip)]
    pub marked: BTreeMap<String, crate::secrets::Marked>,
    #[serde(default)]
    pub var_files: Vec<std::path::PathBuf>,
    pub workspace: Option<String>,
    /// `terraform` (default) or `tofu`.
    pub binary: Option<String>,
    /// Passed as `-lock-timeout`, e.g. `30s`.
    pub lock_timeout: Option<String>,
    /// `up --plan`: the reviewed saved plan (`plan -out`, written into the step's work dir from
    /// the PLANFILE) that `apply` applies as it is, instead of planning again (not a stack key).
    #[serde(skip)]
    pub saved_plan: Option<PathBuf>,
}

impl TerraformSpec {
    pub const KEYS: &'static [&'static str] = &["dir", "vars", "var_files", "workspace", "binary", "lock_timeout"];

    /// `terraform` or `tofu`, as an operator types it.
    fn tool_word(&self) -> String {
        let binary = self.binary.as_deref().unwrap_or("terraform");
        Path::new(binary).file_name().map_or_else(|| binary.to_string(), |n| n.to_string_lossy().into_owned())
    }

    fn resolve_binary(&self, ctx: &StepContext) -> Result<PathBuf, AdapterError> {
        crate::resolve_binary(ctx, self.binary.as_deref().unwrap_or("terraform"), INSTALL_HINT)
    }
}

impl TerraformSpec {
    async fn recover_unredacted(
        &self,
        ctx: &StepContext,
        prior: &PriorStep,
        sink: &dyn EventSink,
    ) -> Result<Recovered, Failure> {
        let mut run = Run::new(self, ctx, sink)?;
        // What the apply of a run that died did after the checkpoint last heard (it got SIGINT
        // and finished what was in flight) is read from terraform's state, through the plan
        // below, never from that apply's output: a replace killed after its delete half left
        // the resource tainted, and only the state says so.
        let plan_file = ctx.work_dir.join(PLAN_FILE);
        let plan = run.plan(&plan_file, Workspace::Create).await?;
        // The plan went through, so whatever held the lock has let go of it.
        for key in [FACT_LOCK_ID, FACT_LOCK] {
            if prior.facts.get(key).is_some_and(|v| !v.is_null()) {
                sink.emit(Event::Fact { key: key.into(), value: serde_json::Value::Null });
            }
        }
        // A `moved` block renamed what the checkpoint recorded: one sub-change under its new
        // address, its status kept; only the apply (terraform's own word) can make it done.
        let moves = moves_of(&plan, prior, &run.dir);
        for (from, to) in &moves {
            sink.emit(Event::Moved { from: from.clone(), to: to.clone() });
        }
        let prior = &renamed(prior, &moves);
        let missing = missing_from_state(&plan, prior);
        if !missing.is_empty() {
            if !ctx.reapply_missing {
                return Err(contradiction(&run.dir, self.workspace.as_deref(), &self.tool_word(), &missing));
            }
            sink.emit(Event::Warning {
                message: format!(
                    "--reapply-missing: creating again {} recorded done but absent from {}'s state: {}",
                    if missing.len() == 1 { "a resource" } else { "resources" },
                    self.tool_word(),
                    missing.join(", ")
                ),
            });
        }
        if let Some(message) = changed_since_failure(&plan, prior) {
            sink.emit(Event::Warning { message });
        }
        // Recorded as not done, yet terraform has nothing to do for them: they are in place
        // (applied after all, by the apply of a run that died or before the checkpoint heard,
        // or dropped from the configuration by the fix). A resource the plan still touches is
        // not done, whatever an earlier apply printed: terraform's state decides.
        for sub in &prior.sub_changes {
            if sub.status != SubStatus::Done && !plan.changes.iter().any(|c| c.addr == sub.id) {
                sink.emit(Event::Done {
                    id: sub.id.clone(),
                    note: Some("terraform plans no change for it now".into()),
                });
            }
        }
        let outputs = run.apply_saved(&plan, &plan_file).await?;
        run.report_outputs(outputs).await?;
        Ok(Recovered::Complete)
    }

    async fn inspect_unredacted(&self, ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        let sink = Collect::default();
        let mut run = Run::new(self, ctx, &sink)?;
        let inspect_plan = ctx.work_dir.join(INSPECT_PLAN_FILE);
        let plan = run.plan(&inspect_plan, Workspace::Existing).await;
        // The saved plan holds every variable's value: it goes once read.
        let _ = std::fs::remove_file(&inspect_plan);
        let plan = plan?;
        let mut inspection = Inspection::default();
        if plan.changes.is_empty() {
            inspection.actions.push(format!("`{} plan`: no changes; nothing left to apply", self.tool_word()));
        } else {
            inspection.actions.push(format!("`{} plan`: {}", self.tool_word(), plan.describe()));
            inspection.actions.extend(plan.changes.iter().map(PlannedChange::describe));
        }
        let prior = &renamed(prior, &moves_of(&plan, prior, &run.dir));
        let missing = missing_from_state(&plan, prior);
        if !missing.is_empty() && !ctx.reapply_missing {
            let failure = contradiction(&run.dir, self.workspace.as_deref(), &self.tool_word(), &missing);
            inspection.actions.push(format!("stop: {}", failure.summary));
            inspection.actions.extend(failure.hint);
        }
        if let Some(message) = changed_since_failure(&plan, prior) {
            inspection.actions.push(message);
        }
        inspection.actions.extend(sink.warnings.into_inner().unwrap_or_default());
        inspection.remaining = plan.ids();
        Ok(inspection)
    }
}

impl Adapter for TerraformSpec {
    /// The configuration, its variables (those the configuration declares sensitive hidden),
    /// var files and workspace.
    fn settings(&self, stack_dir: &Path) -> Vec<(&'static str, crate::contract::Setting)> {
        use crate::contract::Setting;
        let mut out = vec![("configuration", Setting::Code(self.dir.display().to_string()))];
        // The configuration is read only when there are values to hide.
        let secret = if self.vars.is_empty() {
            Default::default()
        } else {
            config::declared_sensitive(&stack_dir.join(&self.dir))
        };
        out.push(("vars", Setting::Values { values: self.vars.clone(), secret }));
        if !self.var_files.is_empty() {
            out.push(("var files", Setting::List(self.var_files.iter().map(|p| p.display().to_string()).collect())));
        }
        if let Some(w) = &self.workspace {
            out.push(("workspace", Setting::Code(w.clone())));
        }
        out
    }

    fn problems(&self) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        if let Some(binary) = &self.binary {
            if !binary.contains('/') && !matches!(binary.as_str(), "terraform" | "tofu") {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key("binary")],
                    message: format!("`binary` is `{binary}`; it must be `terraform`, `tofu` or a path to one of them"),
                    hint: Some("remove `binary` to use `terraform` from PATH".into()),
                });
            }
        }
        if let Some(timeout) = &self.lock_timeout {
            if !is_duration(timeout) {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key("lock_timeout")],
                    message: format!("`lock_timeout` is `{timeout}`, not a duration terraform accepts"),
                    hint: Some("write a number with a unit, like `30s` or `5m`".into()),
                });
            }
        }
        if self.workspace.as_deref().is_some_and(|w| w.trim().is_empty()) {
            problems.push(SpecProblem {
                at: vec![PathSegment::Key("workspace")],
                message: "`workspace` is empty".into(),
                hint: Some("remove it to use the `default` workspace".into()),
            });
        }
        for name in self.vars.keys() {
            let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key("vars")],
                    message: format!("`{name}` is not a valid terraform variable name"),
                    hint: Some("use letters, digits, `_` and `-`, starting with a letter".into()),
                });
            }
        }
        problems
    }

    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        let mut paths = vec![(vec![PathSegment::Key("dir")], self.dir.clone())];
        for (i, file) in self.var_files.iter().enumerate() {
            paths.push((vec![PathSegment::Key("var_files"), PathSegment::Index(i)], file.clone()));
        }
        paths
    }

    async fn preflight(&self, ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        let binary = self.resolve_binary(ctx)?;
        let command = format!("{} version -json", self.tool_word());
        let mut stdout = String::new();
        let outcome = Command::new(&binary)
            .args(["version", "-json"])
            .envs(ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())))
            // `version` waits for HashiCorp's update check (over a second when it runs, until a
            // firewall's timeout when it cannot): rdeploy only wants the version.
            .env("CHECKPOINT_DISABLE", "1")
            .run(&ctx.cancel, Some(Duration::from_secs(60)), &mut |stream, line| {
                if stream == Stream::Stdout {
                    stdout.push_str(line);
                    stdout.push('\n');
                }
            })
            .await?;
        if !outcome.success() {
            let detail = outcome.last_error_line().unwrap_or_else(|| outcome.describe_status());
            return Err(AdapterError::ToolUnusable { command, detail });
        }
        let version = parse_version(&stdout).ok_or_else(|| AdapterError::ToolUnusable {
            command: command.clone(),
            detail: "no `terraform_version` in its output".into(),
        })?;
        check_version(&version).map_err(|detail| AdapterError::ToolUnusable { command, detail })?;
        Ok(ToolInfo { binary, version })
    }

    /// `up` and `recover` plan first, and the plan's `-json` stream opens with the version: it is
    /// checked and reported there ([`Run::plan`]), one terraform start fewer per step. The
    /// binary must be there all the same.
    async fn preflight_for_run(&self, ctx: &StepContext) -> Result<Option<ToolInfo>, AdapterError> {
        self.resolve_binary(ctx)?;
        Ok(None)
    }

    async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        // terraform's output is parsed as it came; what the parsers report is redacted on the
        // way out with the run's secrets, which the plan may add to (a var file's sensitive values).
        let sink = &secrets::RegistrySink { inner: sink, registry: &ctx.secrets };
        let applied = async {
            let mut run = Run::new(self, ctx, sink)?;
            if let Some(saved) = self.saved_plan.as_ref().filter(|p| p.is_file()) {
                // The reviewed plan, applied as it is: no new plan. terraform itself refuses it
                // if the state moved since ("Saved plan is stale"); `up --plan` checked first.
                let plan = run.read_saved(saved).await?;
                let outputs = run.apply_saved(&plan, saved).await?;
                return run.report_outputs(outputs).await;
            }
            if let Some(saved) = &self.saved_plan {
                // Never a fresh plan in place of the reviewed one (`up --plan` is never retried).
                return Err(Failure::new(format!(
                    "the reviewed saved plan {} is gone: nothing was applied in its place",
                    saved.display()
                ))
                .with_hint("rdeploy recover (plans again against the current state), or rdeploy plan -o PLANFILE and review it"));
            }
            let plan_file = ctx.work_dir.join(PLAN_FILE);
            let plan = run.plan(&plan_file, Workspace::Create).await?;
            let outputs = run.apply_saved(&plan, &plan_file).await?;
            run.report_outputs(outputs).await
        };
        applied.await.map_err(|f| ctx.secrets.redact_failure(f))
    }

    async fn read_outputs(&self, ctx: &StepContext) -> Result<Option<crate::outputs::Outputs>, Failure> {
        let sink = Collect::default();
        let read = async {
            let run = Run::new(self, ctx, &sink)?;
            run.prepare(Workspace::Existing).await?;
            run.outputs().await.map(Some)
        };
        read.await.map_err(|f| ctx.secrets.redact_failure(f))
    }

    async fn recover(&self, ctx: &StepContext, prior: &PriorStep, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        let sink = &secrets::RegistrySink { inner: sink, registry: &ctx.secrets };
        self.recover_unredacted(ctx, prior, sink).await.map_err(|f| ctx.secrets.redact_failure(f))
    }

    async fn inspect(&self, ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        let redact = |lines: Vec<String>| lines.iter().map(|l| ctx.secrets.redact(l)).collect();
        match self.inspect_unredacted(ctx, prior).await {
            Ok(i) => Ok(Inspection { actions: redact(i.actions), remaining: redact(i.remaining) }),
            Err(f) => Err(ctx.secrets.redact_failure(f)),
        }
    }

    /// `terraform plan -out` against the current state: each address with its action, and
    /// terraform's own "N to add, M to change, K to destroy" line. Refresh is read-only (a plan
    /// never writes the state); the saved plan holds every variable's value, so it goes once read.
    async fn preview(&self, ctx: &StepContext) -> Result<Preview, crate::preview::PreviewError> {
        self.resolve_binary(ctx)?;
        let sink = Collect::default();
        let mut run = Run::new(self, ctx, &sink)?;
        run.preview = true;
        let plan_file = ctx.work_dir.join(PREVIEW_PLAN_FILE);
        let plan = run.plan(&plan_file, Workspace::Existing).await;
        // Kept in memory for `plan -o PLANFILE` (owner-only there), never left on disk here.
        let saved = std::fs::read(&plan_file).ok();
        let _ = std::fs::remove_file(&plan_file);
        let plan = plan?;
        let mut preview = Preview { summary: Some(plan.describe()), saved_plan: saved, ..Preview::default() };
        preview.observe(STATE_OBSERVED, run.state_identity().await?);
        for change in &plan.changes {
            let action = match change.action.as_str() {
                "create" => PlanAction::Create,
                "replace" => PlanAction::Replace,
                "delete" => PlanAction::Delete,
                _ => PlanAction::Update,
            };
            let mut item = PlanItem::new(change.addr.clone(), action);
            item.reason = match (change.action.as_str(), &change.reason) {
                ("create" | "replace" | "delete" | "update", Some(reason)) => Some(reason.replace('_', " ")),
                ("create" | "replace" | "delete" | "update", None) => None,
                (other, Some(reason)) => Some(format!("{other} ({})", reason.replace('_', " "))),
                (other, None) => Some(other.to_string()),
            };
            preview.items.push(item);
        }
        // An output that changes alone still needs an apply (with resources, the apply does it).
        for (name, action) in plan.output_changes.iter().filter(|_| plan.changes.is_empty()) {
            let item = PlanItem::new(format!("output.{name}"), PlanAction::Update).because(format!("output {action}"));
            preview.items.push(item);
        }
        preview.notes.extend(sink.warnings.into_inner().unwrap_or_default());
        Ok(preview)
    }

    /// A plan with no changes (no resource, no output) is not applied: terraform's state is
    /// as the configuration says. The outputs later steps read are read from the state
    /// (`output -json`). Anything else is applied as `apply` does (a reviewed saved plan under
    /// `up --plan`, else a fresh plan against the state).
    async fn converge(&self, ctx: &StepContext, preview: &Preview, sink: &dyn EventSink) -> Result<(), Failure> {
        if preview.changes() > 0 {
            return self.apply(ctx, sink).await;
        }
        let sink = &secrets::RegistrySink { inner: sink, registry: &ctx.secrets };
        let read = async {
            let run = Run::new(self, ctx, sink)?;
            run.prepare(Workspace::Existing).await?;
            run.report_outputs(None).await
        };
        read.await.map_err(|f| ctx.secrets.redact_failure(f))
    }

    /// The state's serial and lineage (`state pull`), as the preview recorded them: another
    /// apply in between moves the serial, a state replaced by another moves the lineage.
    async fn observe(&self, ctx: &StepContext) -> Result<Vec<crate::preview::Observed>, crate::preview::PreviewError> {
        self.resolve_binary(ctx)?;
        let sink = Collect::default();
        let mut run = Run::new(self, ctx, &sink)?;
        run.preview = true;
        run.prepare(Workspace::Existing).await?;
        let identity = run.state_identity().await?;
        Ok(vec![crate::preview::Observed { what: STATE_OBSERVED.into(), value: identity }])
    }

    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        let tf = self.tool_word();
        let dir = Path::new(ctx.stack_dir).join(&self.dir);
        let cd = format!("cd {}", shell_quote(&dir.to_string_lossy()));
        let sensitive = config::declared_sensitive(&dir);
        let mut plan_words = vec![tf.clone(), "plan".into(), "-input=false".into(), "-out=tfplan".into()];
        let mut doc = RecoveryDoc::default();
        for (name, marked) in &self.marked {
            // A secret the stack reads from rdeploy's environment can be read from the same place.
            let value = match &marked.source {
                secrets::SecretSource::Env(var) => format!("\"${var}\""),
                _ => "...".into(),
            };
            doc.notes.push(format!(
                "`{name}` is secret ({}): `export TF_VAR_{name}={value}` before `{tf} plan`; it is not written here",
                marked.source
            ));
        }
        for (name, value) in self.vars.iter().filter(|(name, _)| !self.marked.contains_key(*name)) {
            if sensitive.contains(name) {
                doc.notes.push(format!(
                    "`{name}` is a sensitive variable: `export TF_VAR_{name}=...` with its value before `{tf} plan`; it is not written here"
                ));
            } else {
                plan_words.push("-var".into());
                plan_words.push(format!("{name}={}", var_value(value)));
            }
        }
        for file in &self.var_files {
            plan_words.push(format!("-var-file={}", relative_to(&self.dir, file).to_string_lossy()));
        }
        if let Some(timeout) = &self.lock_timeout {
            plan_words.push(format!("-lock-timeout={timeout}"));
        }
        let workspace = self.workspace.as_ref().map(|w| format!("{tf} workspace select {}", shell_quote(w)));
        let in_dir = |words: &str| match &workspace {
            Some(ws) if !words.starts_with(&format!("{tf} init")) => format!("{cd} && {ws} && {words}"),
            _ => format!("{cd} && {words}"),
        };
        doc.inspect.push(in_dir(&format!("{tf} state list")));
        doc.inspect.push(in_dir(&format!(
            "{tf} show -json | grep -c '\"tainted\":true'    # resources terraform marked tainted"
        )));
        doc.recover.push(in_dir(&format!("{tf} init -input=false")));
        doc.recover.push(in_dir(&display_command(&plan_words)));
        doc.recover.push(in_dir(&format!("{tf} apply -input=false tfplan")));
        let mut verify_words = plan_words.clone();
        verify_words.retain(|w| w != "-out=tfplan");
        verify_words.push("-detailed-exitcode".into());
        doc.verify.push(format!("{}    # exit 0: nothing left to apply", in_dir(&display_command(&verify_words))));
        doc.notes.push(format!(
            "`rdeploy recover {}` runs the same plan and apply and records each resource address; review the plan before applying by hand",
            ctx.stack_file
        ));
        if let Some(prior) = prior {
            let failed: Vec<_> = prior.ids_with(SubStatus::Failed).chain(prior.ids_with(SubStatus::Started)).collect();
            if !failed.is_empty() {
                doc.notes.push(format!(
                    "failed or uncertain: {}; terraform replaces tainted ones on the next apply",
                    failed.iter().map(|id| format!("`{id}`")).collect::<Vec<_>>().join(", ")
                ));
            }
            if let Some(lock) = prior_lock(prior) {
                doc.notes.push(format!(
                    "the state was locked by another process ({}); if that process is dead, unlock it by hand: `{cd} && {tf} force-unlock {}` (rdeploy never does)",
                    lock.describe(),
                    shell_quote(&lock.id)
                ));
            }
        }
        doc
    }

    fn typed_values_mut(&mut self) -> Option<(&'static str, &mut BTreeMap<String, serde_json::Value>)> {
        Some((TYPED_KEY, &mut self.vars))
    }

    fn typed_values_key(&self) -> Option<&'static str> {
        Some(TYPED_KEY)
    }

    fn marked_mut(&mut self) -> Option<&mut BTreeMap<String, crate::secrets::Marked>> {
        Some(&mut self.marked)
    }
}

/// The recorded sub-changes a `moved` block renamed, old address to new, as the plan says.
fn moves_of_recorded(plan: &PlanReport, prior: &PriorStep) -> BTreeMap<String, String> {
    plan.changes
        .iter()
        .filter_map(|c| Some((c.previous.clone()?, c.addr.clone())))
        .filter(|(from, _)| prior.sub_changes.iter().any(|s| &s.id == from))
        .collect()
}

/// Every recorded sub-change a `moved` block renamed: those terraform moved in its state (the
/// plan's `previous_resource`), and those it had nothing to move for because the old address
/// was never in its state (a resource that was never created), which terraform plans as a plain
/// create of the new address without a word about the block. The second kind is read from the
/// configuration's `moved` blocks, and taken only when terraform plans the new address and no
/// longer knows the old one. Either way it is one sub-change under the new address with its
/// status kept: only terraform's apply makes it done.
fn moves_of(plan: &PlanReport, prior: &PriorStep, dir: &Path) -> BTreeMap<String, String> {
    let mut moves = moves_of_recorded(plan, prior);
    let planned = |addr: &str| plan.changes.iter().any(|c| c.addr == addr);
    let blocks = config::moved_blocks(dir);
    if blocks.is_empty() {
        return moves;
    }
    for sub in &prior.sub_changes {
        if moves.contains_key(&sub.id) || planned(&sub.id) || moves.values().any(|to| to == &sub.id) {
            continue;
        }
        if let Some(to) = config::moved_address(&blocks, &sub.id).filter(|to| planned(to)) {
            moves.insert(sub.id.clone(), to);
        }
    }
    moves
}

/// The checkpoint's view after the renames, as the journal folds them: a moved sub-change takes
/// its new address and keeps its status; onto an address already recorded, the old one goes.
fn renamed(prior: &PriorStep, moves: &BTreeMap<String, String>) -> PriorStep {
    let mut out = prior.clone();
    if moves.is_empty() {
        return out;
    }
    let recorded: std::collections::HashSet<String> = prior.sub_changes.iter().map(|s| s.id.clone()).collect();
    out.sub_changes.retain_mut(|s| match moves.get(&s.id) {
        Some(to) if recorded.contains(to) => false,
        Some(to) => {
            s.id = to.clone();
            true
        }
        None => true,
    });
    out
}

/// The lock recorded by an earlier run, if it is still recorded.
fn prior_lock(prior: &PriorStep) -> Option<LockInfo> {
    if let Some(lock) = prior.facts.get(FACT_LOCK).and_then(|v| serde_json::from_value::<LockInfo>(v.clone()).ok()) {
        return Some(lock);
    }
    prior.facts.get(FACT_LOCK_ID).and_then(|v| v.as_str()).map(|id| LockInfo { id: id.into(), ..LockInfo::default() })
}

/// Says so when the plan touches resources the checkpoint recorded as done: the configuration
/// (usually the fix) or the real infrastructure changed since the failure.
fn changed_since_failure(plan: &PlanReport, prior: &PriorStep) -> Option<String> {
    let changed: Vec<_> = plan
        .changes
        .iter()
        .filter(|c| prior.status_of(&c.addr) == Some(SubStatus::Done))
        .map(PlannedChange::describe)
        .collect();
    if changed.is_empty() {
        return None;
    }
    Some(format!(
        "the configuration or the real infrastructure changed since the failure: the plan will {} though {} recorded done; recover applies the plan as terraform made it",
        changed.join(", "),
        if changed.len() == 1 { "it was" } else { "they were" }
    ))
}

/// The resources the checkpoint records done that the plan would create: terraform's state has
/// no record of them (a state emptied by a crash, or a backend that lost it), so applying the
/// plan would create a second copy of completed work.
fn missing_from_state(plan: &PlanReport, prior: &PriorStep) -> Vec<String> {
    plan.changes
        .iter()
        .filter(|c| c.action == "create" && prior.status_of(&c.addr) == Some(SubStatus::Done))
        .map(|c| c.addr.clone())
        .collect()
}

/// Why recover stops when the checkpoint and terraform's state disagree, with the commands that
/// reconcile them.
fn contradiction(dir: &Path, workspace: Option<&str>, tf: &str, missing: &[String]) -> Failure {
    let cd = format!("cd {}", shell_quote(&dir.to_string_lossy()));
    let state = match workspace {
        Some(ws) if ws != "default" => format!("terraform.tfstate.d/{ws}/terraform.tfstate"),
        _ => "terraform.tfstate".to_string(),
    };
    let backup = format!("{state}.backup");
    let first = shell_quote(&missing[0]);
    let restore = if dir.join(&backup).is_file() {
        format!("restore the backup terraform kept (`{cd} && cp {backup} {state}`), or ")
    } else {
        String::new()
    };
    Failure::new(format!(
        "the checkpoint records {} done but {tf}'s state has no record of {}: {}; applying the plan would create {} a second time",
        if missing.len() == 1 { "a resource" } else { "resources" },
        if missing.len() == 1 { "it" } else { "them" },
        missing.join(", "),
        if missing.len() == 1 { "it" } else { "them" },
    ))
    .with_hint(format!(
        "{restore}import each existing object (`{cd} && {tf} import {first} ID`), then run `rdeploy recover` again; to create them anew instead, run `rdeploy recover --reapply-missing`"
    ))
}

/// A value as `-var name=value` wants it: strings as they are, anything else as JSON, which is
/// valid HCL for numbers, bools, lists and maps.
/// What must never be printed for this step: the stack's values of the variables declared
/// sensitive (whole and each string inside a map or list), `TF_VAR_*` for those variables in the
/// step's `env` and in rdeploy's own environment (`process_env`), and the step's secret `env`.
fn sensitive_values(
    spec: &TerraformSpec,
    ctx: &StepContext,
    sensitive: &BTreeSet<String>,
    process_env: impl Iterator<Item = (String, String)>,
) -> Vec<String> {
    let mut out: Vec<String> = spec
        .vars
        .iter()
        .filter(|(name, _)| sensitive.contains(*name))
        .flat_map(|(_, value)| secrets::redactable(value))
        .collect();
    let is_sensitive_env = |k: &str| k.strip_prefix("TF_VAR_").is_some_and(|name| sensitive.contains(name));
    out.extend(ctx.env.iter().filter(|(k, _)| is_sensitive_env(k)).map(|(_, v)| v.clone()));
    out.extend(process_env.filter(|(k, _)| is_sensitive_env(k)).map(|(_, v)| v));
    out.extend(secrets::env_secrets(&ctx.env));
    out
}

fn var_value(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `file` (relative to the stack file) as seen from `dir` (also relative to the stack file), for
/// runbook commands that `cd` into the configuration first.
fn relative_to(dir: &Path, file: &Path) -> PathBuf {
    if file.is_absolute() {
        return file.to_path_buf();
    }
    let depth = dir.components().filter(|c| matches!(c, Component::Normal(_))).count();
    if dir.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) {
        let mut path: PathBuf = std::iter::repeat_n("..", depth).collect();
        path.push(file);
        path
    } else {
        std::env::current_dir().map(|cwd| cwd.join(file)).unwrap_or_else(|_| file.to_path_buf())
    }
}

/// Terraform runs in the configuration's directory, so every other path it gets (the plan file
/// in the state directory, var files beside the stack) must not be relative to ours.
fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    let path = path.strip_prefix(".").unwrap_or(path);
    std::env::current_dir().map_or_else(|_| path.to_path_buf(), |cwd| cwd.join(path))
}

fn is_duration(text: &str) -> bool {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &text[digits.len()..];
    !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) && matches!(unit, "ms" | "s" | "m" | "h")
}

/// Whether rdeploy can drive this version (1.0 or later: `apply -json` of a saved plan).
fn check_version(version: &str) -> Result<(), String> {
    let major: u64 = version.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    if major < 1 {
        return Err(format!(
            "version {version} is too old; rdeploy needs 1.0 or later for `apply -json` of a saved plan"
        ));
    }
    Ok(())
}

/// `terraform_version` from `terraform version -json` (OpenTofu uses the same key).
pub fn parse_version(json: &str) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_str(json.trim()).ok()?;
    doc["terraform_version"].as_str().map(str::to_string)
}

/// Whether `workspace select` may create the workspace: never for a read-only inspection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workspace {
    Create,
    Existing,
}

/// One step's terraform runs: the binary, directory, secrets and the step's deadline.
struct Run<'a> {
    spec: &'a TerraformSpec,
    ctx: &'a StepContext,
    sink: &'a dyn EventSink,
    binary: PathBuf,
    dir: PathBuf,
    /// Root variables the configuration declares `sensitive = true`: they reach terraform as
    /// `TF_VAR_*` in its environment, never on the command line.
    sensitive: BTreeSet<String>,
    secrets: Vec<String>,
    deadline: Option<Instant>,
    /// A preview (`rdeploy plan`): read-only towards the module directory and the state. The
    /// workspace comes from `TF_WORKSPACE` (a `workspace select` would persist in
    /// `.terraform/environment`) and the plan runs with `-lock=false` (it never writes state,
    /// so it must not wait on, or block, a running `up`).
    preview: bool,
    /// The step's [`TOOL_VERSION_FACT`] was reported (from the first `-json` stream that said it).
    version_reported: std::sync::atomic::AtomicBool,
}

impl<'a> Run<'a> {
    fn new(spec: &'a TerraformSpec, ctx: &'a StepContext, sink: &'a dyn EventSink) -> Result<Run<'a>, Failure> {
        let binary = spec.resolve_binary(ctx).map_err(|e| {
            let hint = e.hint().map(str::to_string);
            let failure = Failure::new(e.to_string());
            match hint {
                Some(hint) => failure.with_hint(hint),
                None => failure,
            }
        })?;
        let dir = ctx.resolve(&spec.dir);
        // Declared `sensitive`, or marked secret in the stack: either way never on the command line.
        let mut sensitive = config::declared_sensitive(&dir);
        sensitive.extend(spec.marked.keys().cloned());
        let secrets = secrets::normalize(sensitive_values(spec, ctx, &sensitive, std::env::vars()));
        ctx.secrets.add_strings(secrets.iter().cloned());
        Ok(Run {
            spec,
            ctx,
            sink,
            binary,
            dir,
            sensitive,
            secrets,
            deadline: ctx.timeout.and_then(crate::deadline_after),
            preview: false,
            version_reported: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The command line as an operator would type it, secrets redacted.
    fn display(&self, args: &[String]) -> String {
        let mut words = vec![self.spec.tool_word()];
        words.extend(args.iter().cloned());
        redact_line(&display_command(&words), &self.secrets)
    }

    /// A line of terraform's output as rdeploy may keep or print it: secrets redacted.
    fn shown(&self, line: &str) -> String {
        redact_line(line, &self.secrets)
    }

    /// The stack's values of sensitive variables, as terraform reads them from its environment
    /// (a string as it is, anything else in JSON, which HCL accepts).
    fn sensitive_env(&self) -> Vec<(String, String)> {
        self.spec
            .vars
            .iter()
            .filter(|(name, _)| self.sensitive.contains(*name))
            .map(|(name, value)| (format!("TF_VAR_{name}"), var_value(value)))
            .collect()
    }

    fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }

    fn command(&self, args: &[String]) -> Command {
        let workspace_env = match (&self.spec.workspace, self.preview) {
            (Some(workspace), true) => vec![("TF_WORKSPACE".to_string(), workspace.clone())],
            _ => Vec::new(),
        };
        Command::new(&self.binary)
            .args(args)
            .cwd(&self.dir)
            .envs(self.ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .envs(self.sensitive_env())
            .envs(workspace_env)
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .redact(self.secrets.iter().cloned())
            .in_step(self.ctx)
            // Parsed first (`-json` lines, `show -json`), redacted where kept (`Run::shown`).
            .raw_lines()
            // terraform stops gracefully on SIGINT: it finishes the resources in flight, writes
            // its state and releases its lock.
            .on_rdeploy_death(Signal::SIGINT)
    }

    async fn exec(
        &self,
        args: &[String],
        cancel: &CancellationToken,
        on_line: &mut (dyn FnMut(Stream, &str) + Send),
    ) -> Result<Outcome, Failure> {
        self.exec_command(self.command(args), cancel, on_line).await
    }

    async fn exec_command(
        &self,
        command: Command,
        cancel: &CancellationToken,
        on_line: &mut (dyn FnMut(Stream, &str) + Send),
    ) -> Result<Outcome, Failure> {
        command.run(cancel, self.remaining(), on_line).await.map_err(|e| Failure::new(e.to_string()))
    }

    /// Runs a `-json` command: every line goes to the sink as output (terraform's human text for
    /// JSON lines) and each parsed message to `on_message`.
    async fn exec_json(
        &self,
        command: Command,
        on_message: &mut (dyn FnMut(&UiLine) + Send),
    ) -> Result<Outcome, Failure> {
        let sink = self.sink;
        self.exec_command(command, &self.ctx.cancel, &mut |stream, line| match (stream, parse_line(line)) {
            (Stream::Stdout, Some(ui)) => {
                for text in ui.message.lines().filter(|l| !l.trim().is_empty()) {
                    sink.emit(Event::Output { stream, line: self.shown(text) });
                }
                if let UiMessage::Diagnostic(d) = &ui.body {
                    for text in d.detail.lines().filter(|l| !l.trim().is_empty()) {
                        sink.emit(Event::Output { stream, line: self.shown(&format!("  {text}")) });
                    }
                }
                on_message(&ui);
            }
            _ => sink.emit(Event::Output { stream, line: self.shown(line) }),
        })
        .await
    }

    /// Runs a command for its effect, with its output forwarded; fails with its stderr.
    async fn exec_plain(&self, args: &[String]) -> Result<(), Failure> {
        let sink = self.sink;
        let outcome = self
            .exec(args, &self.ctx.cancel, &mut |stream, line| {
                sink.emit(Event::Output { stream, line: self.shown(line) })
            })
            .await?;
        if outcome.success() {
            Ok(())
        } else {
            let command = self.display(args);
            let mut failure = Failure::from_process(&command, &outcome);
            // terraform wraps its diagnostics: the last line is a fragment of the last one.
            let stderr: Vec<&String> = outcome.stderr_tail.iter().collect();
            if let (Some(error), false, false) =
                (events::first_human_error(&stderr), outcome.interrupted, outcome.timed_out)
            {
                failure.summary = format!("`{command}` {}: {error}", outcome.describe_status());
            }
            Err(failure)
        }
    }

    /// `show -json [plan]`'s document. Runs on its own token: it is read-only and quick, and it
    /// must still run after an interrupt, to find out what the interrupted apply left.
    async fn show_json(&self, plan_file: Option<&Path>) -> Result<String, String> {
        let mut args = vec!["show".to_string(), "-json".to_string()];
        args.extend(plan_file.map(|p| p.to_string_lossy().into_owned()));
        let mut doc = String::new();
        let outcome = self
            .exec(&args, &CancellationToken::new(), &mut |stream, line| {
                if stream == Stream::Stdout {
                    doc.push_str(line);
                }
            })
            .await
            .map_err(|f| f.summary)?;
        if outcome.success() {
            Ok(doc)
        } else {
            {
                let command = self.display(&args);
                Err(Failure::from_process(&command, &outcome).summary)
            }
        }
    }

    async fn state(&self) -> Result<BTreeMap<String, InState>, String> {
        let doc = self.show_json(None).await?;
        state::parse_state(&doc)
            .map_err(|e| format!("`{} show -json` printed what rdeploy cannot read: {e}", self.spec.tool_word()))
    }

    /// `state pull`'s serial and lineage (`absent` before the first apply). Its stdout is the
    /// whole state, sensitive values in clear: read here, never forwarded.
    async fn state_identity(&self) -> Result<String, Failure> {
        let args = vec!["state".to_string(), "pull".to_string()];
        let mut doc = String::new();
        let outcome = self
            .exec(&args, &self.ctx.cancel, &mut |stream, line| {
                if stream == Stream::Stdout {
                    doc.push_str(line);
                    doc.push('\n');
                }
            })
            .await?;
        if !outcome.success() {
            return Err(Failure::from_process(&self.display(&args), &outcome));
        }
        state::state_identity(&doc)
            .map_err(|e| Failure::new(format!("`{}` printed what rdeploy cannot read: {e}", self.display(&args))))
    }

    /// A saved plan read back for applying it as it is: its changes (`show -json PLAN`), and
    /// the values of its sensitive variables registered as the run's secrets first.
    async fn read_saved(&mut self, plan_file: &Path) -> Result<PlanReport, Failure> {
        let plan_file = &absolute(plan_file);
        self.prepare(Workspace::Create).await?;
        let doc = self.show_json(Some(plan_file)).await.map_err(|e| {
            Failure::new(format!("cannot read the reviewed saved plan: {e}"))
                .with_hint("plan again: `rdeploy plan -o PLANFILE`, review it, then `rdeploy up --plan PLANFILE`")
        })?;
        let unreadable = |e: serde_json::Error| {
            Failure::new(format!(
                "`{} show -json` of the saved plan printed what rdeploy cannot read: {e}",
                self.spec.tool_word()
            ))
        };
        let values = state::sensitive_values(&doc).map_err(unreadable)?;
        self.ctx.secrets.add_strings(values.iter().cloned());
        self.secrets.extend(values);
        self.secrets = secrets::normalize(std::mem::take(&mut self.secrets));
        Ok(PlanReport::of_saved(state::planned_changes(&doc).map_err(unreadable)?))
    }

    /// The root module's outputs (`output -json`); its stdout holds sensitive values in clear,
    /// so it is read here and never forwarded.
    async fn outputs(&self) -> Result<crate::outputs::Outputs, Failure> {
        let args = vec!["output".to_string(), "-json".to_string()];
        let mut doc = String::new();
        let sink = self.sink;
        let outcome = self
            .exec(&args, &self.ctx.cancel, &mut |stream, line| match stream {
                Stream::Stdout => {
                    doc.push_str(line);
                    doc.push('\n');
                }
                Stream::Stderr => sink.emit(Event::Output { stream, line: line.to_string() }),
            })
            .await?;
        if !outcome.success() {
            return Err(Failure::from_process(&self.display(&args), &outcome));
        }
        crate::outputs::parse_terraform_outputs(&doc)
            .map_err(|e| Failure::new(format!("`{}` printed what rdeploy cannot read: {e}", self.display(&args))))
    }

    /// Reports the root module's outputs after an apply, for later steps: the ones the apply's
    /// stream ended with (`applied`), read as `output -json`'s, or, when that message is missing
    /// or one output is sensitive (the stream leaves its value out), `output -json` itself.
    async fn report_outputs(&self, applied: Option<OutputsMessage>) -> Result<(), Failure> {
        let sensitive = |values: &OutputsMessage| {
            values.values().any(|v| v.get("sensitive").and_then(serde_json::Value::as_bool) != Some(false))
        };
        let values = match applied.filter(|values| !sensitive(values)) {
            Some(values) => crate::outputs::parse_terraform_outputs(&serde_json::Value::Object(values).to_string())
                .map_err(|e| Failure::new(format!("terraform's `outputs` message is not what rdeploy reads: {e}")))?,
            None => self.outputs().await?,
        };
        if !values.is_empty() {
            self.sink.emit(Event::Outputs { values });
        }
        Ok(())
    }

    async fn init(&self) -> Result<(), Failure> {
        self.exec_plain(&["init".into(), "-input=false".into(), "-no-color".into()]).await
    }

    /// Runs `init` when the working directory plainly needs it (providers locked but never
    /// installed), and selects the workspace. Other needs for `init` (modules, backend, lock
    /// mismatch) show up as plan diagnostics and are handled there: a configuration that needs
    /// neither providers nor modules has no `.terraform` at all, and running `init` on every
    /// deploy would cost a terraform start each time.
    async fn prepare(&self, workspace: Workspace) -> Result<(), Failure> {
        if self.dir.join(".terraform.lock.hcl").exists() && !self.dir.join(".terraform").exists() {
            self.init().await?;
        }
        if let Some(wanted) = self.spec.workspace.as_ref().filter(|_| !self.preview) {
            let current = std::fs::read_to_string(self.dir.join(".terraform/environment"))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "default".into());
            if &current != wanted {
                let mut args = vec!["workspace".to_string(), "select".to_string()];
                if workspace == Workspace::Create {
                    args.push("-or-create=true".into());
                }
                args.push(wanted.clone());
                self.exec_plain(&args).await?;
            }
        }
        Ok(())
    }

    fn plan_args(&self, plan_file: &Path) -> Vec<String> {
        let mut args =
            vec!["plan".into(), "-input=false".into(), format!("-out={}", plan_file.display()), "-json".into()];
        if self.preview {
            args.push("-lock=false".into());
        } else if let Some(timeout) = &self.spec.lock_timeout {
            args.push(format!("-lock-timeout={timeout}"));
        }
        for (name, value) in self.spec.vars.iter().filter(|(name, _)| !self.sensitive.contains(*name)) {
            args.push("-var".into());
            args.push(format!("{name}={}", var_value(value)));
        }
        for file in &self.spec.var_files {
            args.push(format!("-var-file={}", absolute(&self.ctx.resolve(file)).display()));
        }
        args
    }

    /// `plan -out` against the current state: read-only, and what `apply` will do exactly.
    async fn plan(&mut self, plan_file: &Path, workspace: Workspace) -> Result<PlanReport, Failure> {
        let plan_file = &absolute(plan_file);
        if let Some(parent) = plan_file.parent() {
            crate::private::create_dir_all(parent)
                .map_err(|e| Failure::new(format!("cannot create the work directory {}: {e}", parent.display())))?;
        }
        self.prepare(workspace).await?;
        let args = self.plan_args(plan_file);
        let mut initialized = false;
        let plan = loop {
            let mut plan = PlanReport::default();
            let outcome = self.exec_json(self.command(&args), &mut |ui| plan.observe(&ui.body)).await?;
            let errors: Vec<Diagnostic> = plan.diagnostics.iter().filter(|d| d.is_error()).cloned().collect();
            if let Some(version) = &plan.version {
                // The version the step ran with (its preflight did not ask: see
                // `preflight_for_run`), and whether rdeploy can drive it, before anything applies.
                self.report_version(version);
                if let Err(detail) = check_version(version) {
                    return Err(Failure::new(format!("`{}`: {detail}", self.display(&args)))
                        .with_hint(format!("install {} 1.0 or later", self.spec.tool_word())));
                }
            } else if !outcome.success() && !outcome.interrupted {
                // No version message at all: a terraform too old for `plan -json`, or not one. The
                // preflight's own check says which, as it would have before the run.
                if let Err(e) = self.spec.preflight(self.ctx).await {
                    let hint = e.hint().map(str::to_string);
                    let failure = Failure::new(e.to_string());
                    return Err(match hint {
                        Some(hint) => failure.with_hint(hint),
                        None => failure,
                    });
                }
            }
            if outcome.success() {
                break plan;
            }
            if !initialized && !outcome.interrupted && errors.iter().any(Diagnostic::wants_init) {
                initialized = true;
                self.init().await?;
                continue;
            }
            if let Some(lock) = errors.iter().find_map(parse_lock_diagnostic) {
                return Err(self.lock_failure(&lock, &args, &outcome));
            }
            return Err(self.diagnostics_failure(&args, &outcome, &errors));
        };
        // The saved plan holds every variable's value, sensitive ones included: owner-only.
        {
            use std::os::unix::fs::PermissionsExt;
            if let Err(e) = std::fs::set_permissions(plan_file, std::fs::Permissions::from_mode(0o600)) {
                self.sink.emit(Event::Warning {
                    message: format!("could not make the saved plan {} owner-only: {e}", plan_file.display()),
                });
            }
        }
        for warning in plan.diagnostics.iter().filter(|d| !d.is_error()) {
            self.sink.emit(Event::Warning { message: format!("terraform: {}", warning.one_line()) });
        }
        if !self.spec.var_files.is_empty() {
            // Values from var files are unknown until terraform reads them: take the sensitive
            // ones from the saved plan before anything prints during apply.
            match self.show_json(Some(plan_file)).await.map(|doc| state::sensitive_values(&doc)) {
                Ok(Ok(values)) => {
                    self.ctx.secrets.add_strings(values.iter().cloned());
                    self.secrets.extend(values);
                    self.secrets = secrets::normalize(std::mem::take(&mut self.secrets));
                }
                Ok(Err(e)) => self.sink.emit(Event::Warning {
                    message: format!("could not read sensitive variables from the saved plan: {e}"),
                }),
                Err(e) => self.sink.emit(Event::Warning {
                    message: format!("could not read sensitive variables from the saved plan: {e}"),
                }),
            }
        }
        Ok(plan)
    }

    /// Applies the saved plan, reporting each resource as terraform reports it, and after a
    /// failure settles every planned resource against state.
    /// Reports the version a `-json` stream opened with, once per step run (a preview reports
    /// nothing: its preflight asked terraform).
    fn report_version(&self, version: &str) {
        if !self.preview && !self.version_reported.swap(true, std::sync::atomic::Ordering::Relaxed) {
            self.sink.emit(Event::Fact { key: TOOL_VERSION_FACT.into(), value: version.into() });
        }
    }

    /// Returns the outputs the apply's stream ended with, when it did (see [`Run::report_outputs`]).
    async fn apply_saved(&self, plan: &PlanReport, plan_file: &Path) -> Result<Option<OutputsMessage>, Failure> {
        let plan_file = &absolute(plan_file);
        let sink = self.sink;
        sink.emit(Event::Planned { ids: plan.ids() });
        let mut args = vec!["apply".to_string(), "-input=false".into(), "-json".into()];
        if let Some(timeout) = &self.spec.lock_timeout {
            args.push(format!("-lock-timeout={timeout}"));
        }
        args.push(plan_file.to_string_lossy().into_owned());
        if self.ctx.cancel.is_cancelled() {
            for change in &plan.changes {
                sink.emit(Event::Pending { id: change.addr.clone(), reason: "interrupted before the apply".into() });
            }
            return Err(Failure {
                interrupted: true,
                ..Failure::new(format!("interrupted before `{}`", self.display(&args)))
            });
        }
        let mut tracker = ApplyTracker::new(&plan.changes);
        // The stream goes to a memory file, never to the disk: it may hold a secret terraform
        // printed (a provisioner's output, a failed command's diagnostic). If rdeploy dies,
        // terraform writes on into it (a file, not a pipe: no SIGPIPE) and finishes on its own;
        // the next `recover` learns what it did from terraform's state.
        let command = self.command(&args);
        let mut outputs = None;
        let outcome = self
            .exec_json(command, &mut |ui| {
                match &ui.body {
                    UiMessage::Outputs(values) => outputs = Some(values.clone()),
                    // A reviewed saved plan (`up --plan`) is applied without planning again.
                    UiMessage::Version { terraform } => self.report_version(terraform),
                    _ => {}
                }
                tracker.observe(&ui.body, &ui.message, &mut |event| sink.emit(event))
            })
            .await;
        // Once an apply of it ran, the saved plan is spent (terraform calls it stale), and it
        // holds every variable's value: it goes, and the next run plans again.
        let _ = std::fs::remove_file(plan_file);
        let outcome = outcome?;
        tracker.finish(&mut |event| sink.emit(event));
        for warning in &tracker.warnings {
            sink.emit(Event::Warning { message: format!("terraform: {}", warning.one_line()) });
        }

        if outcome.success() {
            // A move or a forget has no apply hook; terraform finished, so it is in place.
            for change in tracker.planned() {
                if *tracker.progress_of(&change.addr) != Progress::Done {
                    sink.emit(Event::Done {
                        id: change.addr.clone(),
                        note: Some(format!("`{}` applied without a per-resource event", change.describe())),
                    });
                }
            }
            return Ok(outputs);
        }

        if let Some(lock) = tracker.errors.iter().find_map(parse_lock_diagnostic) {
            for change in tracker.planned() {
                sink.emit(Event::Pending {
                    id: change.addr.clone(),
                    reason: "the state is locked by another process".into(),
                });
            }
            return Err(self.lock_failure(&lock, &args, &outcome));
        }

        // Settle what the stream left open against state: a resource that started and never
        // finished may be in place, tainted or absent.
        let state = self.state().await;
        if let Err(e) = &state {
            sink.emit(Event::Warning { message: format!("could not confirm the apply against state: {e}") });
        }
        let mut uncertain = Vec::new();
        for change in tracker.planned() {
            let addr = &change.addr;
            match tracker.progress_of(addr) {
                Progress::Done | Progress::Failed | Progress::Errored { .. } => {}
                // A pure move has no hook: terraform moved it in state before the walk failed.
                Progress::NotStarted
                    if change.action == "move" && state.as_ref().is_ok_and(|s| s.contains_key(addr)) =>
                {
                    sink.emit(Event::Done {
                        id: addr.clone(),
                        note: Some(format!("`{}`: in state under its new address", change.describe())),
                    })
                }
                Progress::NotStarted => sink.emit(Event::Pending {
                    id: addr.clone(),
                    reason: "terraform stopped before it started this resource".into(),
                }),
                Progress::Started { .. } => {
                    let found = state.as_ref().ok().map(|s| s.get(addr).copied());
                    let event = match (found, change.action.as_str()) {
                        (Some(Some(InState { tainted: true })), _) => {
                            Event::Failed { id: addr.clone(), error: "tainted in state after the apply stopped".into() }
                        }
                        (Some(Some(_)), "create") => {
                            Event::Done { id: addr.clone(), note: Some("in state after the apply stopped".into()) }
                        }
                        (Some(None), "delete") => Event::Done {
                            id: addr.clone(),
                            note: Some("gone from state after the apply stopped".into()),
                        },
                        _ => Event::Failed {
                            id: addr.clone(),
                            error: "started, and not confirmed complete when the apply stopped".into(),
                        },
                    };
                    if matches!(event, Event::Failed { .. }) {
                        uncertain.push(addr.clone());
                    }
                    sink.emit(event);
                }
            }
        }
        Err(self.apply_failure(&args, &outcome, &tracker, &uncertain))
    }

    fn apply_failure(
        &self,
        args: &[String],
        outcome: &Outcome,
        tracker: &ApplyTracker,
        uncertain: &[String],
    ) -> Failure {
        let command = self.display(args);
        let failed = tracker.failed();
        let done = tracker.planned().iter().filter(|c| *tracker.progress_of(&c.addr) == Progress::Done).count();
        let total = tracker.planned().len();
        let failed_count = failed.len() + uncertain.len();
        let first = failed.first().map(|(addr, diag)| match diag {
            Some(d) => format!("{addr}: {}", d.one_line()),
            None => addr.clone(),
        });
        let summary = if outcome.interrupted {
            format!("`{command}` was interrupted: {done} of {total} resources done, {failed_count} failed or uncertain")
        } else if outcome.timed_out {
            format!("`{command}` timed out: {done} of {total} resources done, {failed_count} failed or uncertain")
        } else if let Some(first) = first {
            let more = if failed_count > 1 { format!(" (and {} more)", failed_count - 1) } else { String::new() };
            format!("`{command}` failed at {first}{more}")
        } else if let Some(d) = tracker.errors.first() {
            format!("`{command}` failed: {}", d.one_line())
        } else {
            Failure::from_process(&command, outcome).summary
        };
        let mut tail: Vec<String> = tracker
            .errors
            .iter()
            .map(|d| match &d.address {
                Some(addr) => format!("Error: {addr}: {}", d.one_line()),
                None => format!("Error: {}", d.one_line()),
            })
            .collect();
        if tail.is_empty() {
            tail = outcome.stderr_tail.iter().cloned().collect();
        }
        let hint = if outcome.interrupted {
            "terraform saved its state; `rdeploy recover` plans against it and applies what is left".to_string()
        } else {
            "fix what terraform reports above, then `rdeploy recover`: it plans against the current state and applies only what is left".to_string()
        };
        Failure {
            summary,
            command: Some(command),
            exit_code: outcome.code,
            stderr_tail: tail,
            hint: Some(hint),
            interrupted: outcome.interrupted,
            timed_out: outcome.timed_out,
            location: failed
                .iter()
                .find_map(|(_, d)| d.as_ref())
                .or(tracker.errors.first().as_ref())
                .and_then(|d| self.location_of(d)),
        }
    }

    /// Where a diagnostic points, relative to the stack file: the step's `dir`, then terraform's
    /// file name (relative to the root module).
    fn location_of(&self, d: &Diagnostic) -> Option<Box<crate::Location>> {
        let range = d.range.as_ref().filter(|r| !r.filename.is_empty())?;
        let file = self.spec.dir.join(&range.filename);
        Some(Box::new(crate::Location { file: file.to_string_lossy().into_owned(), line: Some(range.start.line) }))
    }

    fn diagnostics_failure(&self, args: &[String], outcome: &Outcome, errors: &[Diagnostic]) -> Failure {
        let command = self.display(args);
        let mut failure = Failure::from_process(&command, outcome);
        if let (Some(first), false, false) = (errors.first(), outcome.interrupted, outcome.timed_out) {
            failure.summary = format!("`{command}` failed: {}", first.one_line());
            failure.location = self.location_of(first);
        }
        if !errors.is_empty() {
            failure.stderr_tail = errors.iter().map(|d| format!("Error: {}", d.one_line())).collect();
        }
        failure
    }

    fn lock_failure(&self, lock: &LockInfo, args: &[String], outcome: &Outcome) -> Failure {
        self.sink.emit(Event::Fact { key: FACT_LOCK_ID.into(), value: serde_json::Value::String(lock.id.clone()) });
        self.sink.emit(Event::Fact {
            key: FACT_LOCK.into(),
            value: serde_json::to_value(lock).unwrap_or(serde_json::Value::Null),
        });
        let tf = self.spec.tool_word();
        Failure {
            summary: format!("the terraform state is locked by another process: {}", lock.describe()),
            command: Some(self.display(args)),
            exit_code: outcome.code,
            stderr_tail: vec![format!("Error: {}: {}", lock::LOCK_SUMMARY, lock.describe())],
            hint: Some(format!(
                "wait for that run to finish, then `rdeploy recover`; only if it is dead, `cd {} && {tf} force-unlock {}` first",
                shell_quote(&self.dir.to_string_lossy()),
                shell_quote(&lock.id)
            )),
            interrupted: false,
            timed_out: false,
            location: None,
        }
    }
}

/// The sink `inspect` uses: it has no driver to report to, only warnings worth showing.
#[derive(Default)]
struct Collect {
    warnings: std::sync::Mutex<Vec<String>>,
}

impl EventSink for Collect {
    fn emit(&self, event: Event) {
        if let Event::Warning { message } = event {
            if let Ok(mut warnings) = self.warnings.lock() {
                warnings.push(message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PriorSubChange;

    fn spec() -> TerraformSpec {
        TerraformSpec {
            marked: Default::default(),
            dir: "infra/network".into(),
            vars: [
                ("region".to_string(), serde_json::json!("eu-west-1")),
                ("ports".to_string(), serde_json::json!([80, 443])),
            ]
            .into_iter()
            .collect(),
            var_files: vec!["prod.tfvars".into()],
            workspace: None,
            binary: None,
            lock_timeout: Some("30s".into()),
            saved_plan: None,
        }
    }

    #[test]
    fn only_sensitive_variables_are_secret_wherever_their_value_comes_from() {
        let mut spec = spec();
        spec.vars.insert("token".into(), serde_json::json!({"user": "u1", "pass": "hunter22"}));
        spec.vars.insert("enabled".into(), serde_json::json!(false));
        spec.vars.insert("region".into(), serde_json::json!("eu-west-2"));
        let ctx = StepContext {
            step: "infra".into(),
            env: BTreeMap::from([
                ("TF_VAR_db_pass".to_string(), "from-step-env".to_string()),
                ("TF_VAR_region".to_string(), "eu-north-1".to_string()),
                ("API_KEY".to_string(), "k-123".to_string()),
            ]),
            ..crate::testing::step_context(Path::new("."))
        };
        let sensitive = BTreeSet::from(["token".to_string(), "db_pass".to_string(), "admin".to_string()]);
        let own_env =
            [("TF_VAR_admin".to_string(), "from-rdeploy-env".to_string()), ("TF_VAR_other".into(), "plain".into())];
        let found = sensitive_values(&spec, &ctx, &sensitive, own_env.into_iter());
        for secret in ["hunter22", "u1", "from-step-env", "from-rdeploy-env", "k-123"] {
            assert!(found.contains(&secret.to_string()), "{secret} in {found:?}");
        }
        for plain in ["false", "eu-west-2", "eu-north-1", "plain"] {
            assert!(!found.contains(&plain.to_string()), "{plain} in {found:?}");
        }
    }

    #[test]
    fn validates_binary_lock_timeout_and_var_names() {
        assert!(spec().problems().is_empty());
        let mut bad = spec();
        bad.binary = Some("pulumi".into());
        bad.lock_timeout = Some("soon".into());
        bad.vars.insert("9lives".into(), serde_json::json!(1));
        let problems = bad.problems();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert_eq!(problems[0].at, vec![PathSegment::Key("binary")]);
        assert!(is_duration("500ms") && is_duration("5m") && !is_duration("5") && !is_duration("s"));
    }

    #[test]
    fn reads_the_version_of_terraform_and_tofu() {
        let captured = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/terraform/captured/version.json"
        ))
        .unwrap();
        assert_eq!(parse_version(&captured).as_deref(), Some("1.11.4"));
        assert_eq!(
            parse_version(r#"{"terraform_version":"1.9.0","platform":"linux_amd64"}"#).as_deref(),
            Some("1.9.0")
        );
        assert_eq!(parse_version("Terraform v1.11.4"), None);
    }

    #[test]
    fn the_runbook_has_the_commands_an_operator_types() {
        let ctx = DescribeContext { step: "network", stack_file: "stack.yaml", stack_dir: ".", resumable: true };
        let prior = PriorStep {
            sub_changes: vec![PriorSubChange {
                id: "terraform_data.a5".into(),
                status: SubStatus::Failed,
                error: None,
            }],
            facts: [(FACT_LOCK_ID.to_string(), serde_json::json!("abc-123"))].into_iter().collect(),
        };
        let doc = spec().describe_recovery(&ctx, Some(&prior));
        assert_eq!(doc.inspect[0], "cd ./infra/network && terraform state list");
        assert_eq!(
            doc.recover[1],
            "cd ./infra/network && terraform plan -input=false -out=tfplan -var 'ports=[80,443]' -var region=eu-west-1 -var-file=../../prod.tfvars -lock-timeout=30s"
        );
        assert_eq!(doc.recover[2], "cd ./infra/network && terraform apply -input=false tfplan");
        assert!(doc.verify[0].contains("-detailed-exitcode"));
        assert!(doc.notes.iter().any(|n| n.contains("`terraform_data.a5`")));
        assert!(doc.notes.iter().any(|n| n.contains("terraform force-unlock abc-123")), "{:?}", doc.notes);
    }

    #[test]
    fn the_runbook_never_writes_a_sensitive_value() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/terraform");
        let spec = TerraformSpec {
            marked: Default::default(),
            dir: "sensitive".into(),
            vars: [("token".to_string(), serde_json::json!("s3cr3t-value"))].into_iter().collect(),
            var_files: vec![],
            workspace: Some("prod".into()),
            binary: Some("tofu".into()),
            lock_timeout: None,
            saved_plan: None,
        };
        let ctx = DescribeContext { step: "s", stack_file: "stack.yaml", stack_dir: fixtures, resumable: true };
        let doc = spec.describe_recovery(&ctx, None);
        let all = format!("{doc:?}");
        assert!(!all.contains("s3cr3t"), "{all}");
        assert!(all.contains("TF_VAR_token"));
        assert!(doc.recover[1].contains("tofu workspace select prod && tofu plan"), "{}", doc.recover[1]);
    }

    #[test]
    fn a_done_resource_the_plan_would_create_is_a_contradiction_with_the_way_back() {
        let mut plan = PlanReport::default();
        for (addr, action) in
            [("terraform_data.a1", "create"), ("terraform_data.a2", "update"), ("terraform_data.a3", "create")]
        {
            plan.changes.push(PlannedChange { addr: addr.into(), action: action.into(), reason: None, previous: None });
        }
        let done = |id: &str| PriorSubChange { id: id.into(), status: SubStatus::Done, error: None };
        let prior = PriorStep {
            sub_changes: vec![done("terraform_data.a1"), done("terraform_data.a2")],
            facts: Default::default(),
        };
        // a2 (an update) is drift, not loss; a3 was never recorded done.
        assert_eq!(missing_from_state(&plan, &prior), ["terraform_data.a1"]);

        let dir = tempfile::tempdir().unwrap();
        let without = contradiction(dir.path(), None, "terraform", &["terraform_data.a1".into()]);
        assert!(without.summary.contains("has no record of it: terraform_data.a1"), "{}", without.summary);
        let hint = without.hint.unwrap();
        assert!(!hint.contains("backup"), "{hint}");
        assert!(hint.contains("terraform import terraform_data.a1 ID"), "{hint}");
        assert!(hint.contains("rdeploy recover --reapply-missing"), "{hint}");

        std::fs::create_dir_all(dir.path().join("terraform.tfstate.d/prod")).unwrap();
        std::fs::write(dir.path().join("terraform.tfstate.d/prod/terraform.tfstate.backup"), "{}").unwrap();
        let with = contradiction(dir.path(), Some("prod"), "tofu", &["terraform_data.a1".into()]);
        let hint = with.hint.unwrap();
        assert!(
            hint.contains(
                "cp terraform.tfstate.d/prod/terraform.tfstate.backup terraform.tfstate.d/prod/terraform.tfstate"
            ),
            "{hint}"
        );
        assert!(hint.contains("tofu import"), "{hint}");
    }

    #[test]
    fn a_change_to_a_done_resource_is_reported() {
        let mut plan = PlanReport::default();
        plan.changes.push(PlannedChange {
            addr: "terraform_data.a2".into(),
            action: "replace".into(),
            reason: Some("tainted".into()),
            previous: None,
        });
        let prior = PriorStep {
            sub_changes: vec![PriorSubChange { id: "terraform_data.a2".into(), status: SubStatus::Done, error: None }],
            facts: Default::default(),
        };
        let message = changed_since_failure(&plan, &prior).unwrap();
        assert!(message.contains("replace terraform_data.a2 (tainted)"), "{message}");
        assert_eq!(changed_since_failure(&plan, &PriorStep::default()), None);
    }
}

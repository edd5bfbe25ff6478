//! The session: what every command of the engine shares (the stack, the store, the reporters,
//! the flags), and what every command does before any step runs: the tools checked, the lock
//! taken, the checkpoint matched against the stack, each step's context and secrets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use rdeploy_adapters::{Adapter, CancellationToken, Failure, RunFate, StartedBy, StepContext, ToolInfo};

use super::event::Reporters;
use super::event::{RunEvent, StepEnd};
use super::journal::Checkpoint;
use super::outputs::SensitiveOutputs;
use crate::adapter::StepAdapter;
use crate::checkpoint::{Deploy, DeployState, StepStatus};
use crate::exit::{Code, Refusal};
use crate::redact::Redactor;
use crate::stack::{Stack, Step};
use crate::store::local::StateDir;
use crate::store::{LockGuard, Store};
use crate::ui::Ui;

/// What every command of the engine shares.
pub struct Session {
    pub stack: Arc<Stack>,
    /// Where the checkpoint and the lock live.
    pub store: Arc<dyn Store>,
    /// Local scratch: logs, adapters' work dirs, the report (the store may be remote).
    pub state: StateDir,
    pub ui: Arc<Ui>,
    /// The run's secrets: handed to the adapters (`StepContext::secrets`), the journal, the step
    /// sinks; the same set the `ui` writes stderr and stdout with.
    pub redactor: Redactor,
    /// Who is told what happens as the run goes (the progress display, the step logs).
    pub reporters: Reporters,
    /// The stack file as the operator typed it, followed by the flags that locate its state
    /// (`--state-dir`, `--state`) as given: what every command we print carries.
    pub stack_arg: String,
    /// The stack file as the operator typed it (a path: annotations, the PLANFILE).
    pub stack_file: String,
    /// Cancelled on the first SIGINT/SIGTERM.
    pub cancel: CancellationToken,
    /// The signal that cancelled, if any.
    pub signal: Arc<Mutex<Option<String>>>,
    pub parallel: usize,
    /// `recover --force`: the operator vouches that no other process is working on the
    /// release (helm's stuck pending-* rollback); adapters see it as `StepContext::force`.
    pub force: bool,
    /// `up --force-apply`: every tool runs, even for what its preview finds in place.
    pub force_apply: bool,
    /// `--keep-going` (or `on_failure: continue`): a failure stops only the steps that need
    /// the failed one; independent branches run on.
    pub keep_going: bool,
    /// `recover --reapply-missing`: apply again what the checkpoint records done but the tool's
    /// own state lost (adapters see it as `StepContext::reapply_missing`).
    pub reapply_missing: bool,
    /// Notes every tool this run starts while it runs (under the state dir's `running/`).
    pub processes: rdeploy_adapters::process::ProcessTracker,
    /// The sensitive outputs this process learned, by step: never written anywhere, passed to
    /// their consumers only.
    pub sensitive: SensitiveOutputs,
    /// The holder this run took the lock (or lease) over from, when it died holding it: a fact
    /// the adapters get through `StepContext::started_by` (helm's abandoned `pending-*`).
    pub took_over: Mutex<Option<crate::store::Holder>>,
    /// `up --plan PLANFILE`: the reviewed plan this run applies exactly, or refuses.
    pub from_plan: Option<Arc<crate::planfile::Loaded>>,
}

/// How long a run waits for a tool a dead run left running (terraform finishing the resources
/// in flight after its SIGINT) before it refuses to start beside it.
const SURVIVOR_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

impl Session {
    pub(super) fn emit(&self, event: RunEvent) {
        self.reporters.emit(event);
    }

    pub(super) fn warn(&self, message: impl Into<String>) {
        self.emit(RunEvent::Warning { from_step: None, message: message.into() });
    }

    pub(super) fn note(&self, message: impl Into<String>) {
        self.emit(RunEvent::Note(message.into()));
    }

    pub(super) fn step_ended(&self, step: &str, end: StepEnd) {
        self.emit(RunEvent::StepEnded { step: step.to_string(), end });
    }

    pub(crate) fn context(&self, step: &Step, cancel: CancellationToken) -> StepContext {
        StepContext {
            step: step.name.clone(),
            stack: self.stack.name.clone(),
            stack_dir: self.stack.dir.clone(),
            // Absolute: tools run in the stack directory, and a state directory given relative
            // to the caller's (`rdeploy up demo/stack.yaml`) would not be found from there.
            work_dir: std::path::absolute(self.state.step_dir(&step.name))
                .unwrap_or_else(|_| self.state.step_dir(&step.name)),
            cache_dir: Some(std::path::absolute(self.state.cache_dir()).unwrap_or_else(|_| self.state.cache_dir())),
            env: step.env.clone(),
            timeout: step.timeout,
            cancel,
            processes: self.processes.clone(),
            force: self.force,
            reapply_missing: self.reapply_missing,
            secrets: self.redactor.registry().clone(),
            started_by: Default::default(),
        }
    }

    /// For each sub-change of `step` an earlier run started and that is not done, that run and
    /// whether it is known to be dead: the lock was taken over from it, or its pid on this host
    /// is gone, a zombie, or this very process (a reused pid). A run on another host is never
    /// assumed dead. `current` is this run's id once its run record is in `deploy` (none for a
    /// dry run).
    pub(super) fn started_by(
        &self,
        deploy: &Deploy,
        step: &str,
        current: Option<&str>,
    ) -> std::collections::BTreeMap<String, StartedBy> {
        let here = crate::store::hostname();
        let took_over = self.took_over.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out = std::collections::BTreeMap::new();
        let Some(state) = deploy.steps.iter().find(|s| s.name == step) else { return out };
        // Started and never finished, or failed since: a refused recover records the pending
        // revision failed, which does not change which run started it (the adapter tells the two
        // apart by `in_flight` and the step's `pending_seen` fact).
        let unfinished = |s: &&crate::checkpoint::SubChangeState| {
            matches!(s.status, rdeploy_adapters::SubStatus::Started | rdeploy_adapters::SubStatus::Failed)
        };
        let pending_seen = state.facts.get("pending_seen").and_then(|v| v.as_u64());
        for sub in state.sub_changes.iter().filter(unfinished) {
            let Some(run_id) = sub.started_by.as_deref().filter(|id| Some(*id) != current) else { continue };
            let Some(run) = deploy.runs.iter().find(|r| r.run_id == run_id) else { continue };
            let dead_here = run.host == here
                && (run.pid == std::process::id() || !rdeploy_adapters::process::process_lives(run.pid as i32));
            let fate = if run.host != here {
                RunFate::OtherHost
            } else if !dead_here {
                RunFate::AliveHere
            } else if took_over.as_ref().is_some_and(|h| h.host == here && h.pid == run.pid) {
                RunFate::LockTakenOver
            } else {
                RunFate::DeadHere
            };
            out.insert(
                sub.id.clone(),
                StartedBy {
                    run_id: run.run_id.clone(),
                    command: run.command.clone(),
                    host: run.host.clone(),
                    pid: run.pid,
                    fate,
                    in_flight: sub.status == rdeploy_adapters::SubStatus::Started,
                    started_at: sub.started_at.map(|t| t.0.unix_timestamp()),
                    pending_seen,
                },
            );
        }
        out
    }

    /// The step as it runs now and its context: the values the stack marks secret read (from
    /// rdeploy's environment, files) into its tool key and `env`, and registered with the run's
    /// secrets, as are the values secret by their name. A secret that cannot be read is a failure
    /// of the step before its tool starts, naming the key and the source.
    pub(crate) fn resolved(&self, step: &Step, cancel: CancellationToken) -> (Step, StepContext, Result<(), Failure>) {
        let mut step = step.clone();
        let mut ctx = self.context(&step, cancel);
        let read = self.read_secrets(&mut step, &mut ctx);
        (step, ctx, read)
    }

    pub(super) fn read_secrets(&self, step: &mut Step, ctx: &mut StepContext) -> Result<(), Failure> {
        let env = |name: &str| std::env::var(name).ok();
        let failed = |key: String, e: rdeploy_adapters::secrets::SecretError| {
            Failure::new(format!("cannot read the secret `{key}` before starting the tool: {e}")).with_hint(e.hint())
        };
        ctx.secrets.add_strings(rdeploy_adapters::secrets::env_secrets(&step.env));
        let tool_key = step.spec.typed_values_key().unwrap_or("values");
        step.spec
            .resolve_secrets(&self.stack.dir, &env, &ctx.secrets)
            .map_err(|(key, e)| failed(format!("{tool_key}.{key}"), e))?;
        for (name, marked) in &step.env_marked {
            let secret = marked.resolve(&self.stack.dir, &env).map_err(|e| failed(format!("env.{name}"), e))?;
            ctx.secrets.add(&secret);
            let text = match secret.expose() {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            ctx.env.insert(name.clone(), text.clone());
            step.env.insert(name.clone(), text);
        }
        Ok(())
    }

    /// Checks every step's tool before anything changes (exit 2 when one is missing).
    pub async fn preflight(&self, steps: &[&Step]) -> anyhow::Result<HashMap<String, ToolInfo>> {
        self.check_tools(steps, false).await
    }

    /// [`Session::preflight`] for `up` and `recover`: a tool that says its version as its step
    /// runs is not started once more for it (see `Adapter::preflight_for_run`).
    pub(super) async fn check_tools(
        &self,
        steps: &[&Step],
        for_run: bool,
    ) -> anyhow::Result<HashMap<String, ToolInfo>> {
        let mut found = HashMap::new();
        let mut problems = Vec::new();
        for step in steps.iter().filter(|s| !s.resumable && s.revert.is_none()) {
            self.warn(format!(
                "step `{}` is not resumable and declares no `revert`: if it fails part-way it can only be run again from the start",
                step.name
            ));
        }
        for step in steps.iter().filter(|s| !s.resumable && s.retry.is_some()) {
            self.warn(format!(
                "step `{}` declares `retry` but is not resumable: it completes or reverts, and is never retried",
                step.name
            ));
        }
        // Each check only reads (a version, a playbook's syntax), so they run side by side, as
        // many as there are cores: the checks cost about the slowest tool's, not their sum.
        // Problems are told in the stack's order.
        let at_once = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
        let checks = steps.iter().map(|step| async move {
            let mut ctx = self.context(step, self.cancel.clone());
            if !for_run {
                // `validate` records nothing and reads no cache: it checks every playbook itself
                // (a cache a run keeps is written under that run's lock).
                ctx.cache_dir = None;
            }
            let adapter = StepAdapter::of(step, &self.state.shared);
            if for_run {
                adapter.preflight_for_run(&ctx).await
            } else {
                adapter.preflight(&ctx).await.map(Some)
            }
        });
        let checked: Vec<_> = futures::stream::iter(checks).buffered(at_once).collect().await;
        for (step, checked) in steps.iter().zip(checked) {
            match checked {
                Ok(Some(info)) => {
                    found.insert(step.name.clone(), info);
                }
                Ok(None) => {}
                Err(e) => {
                    let hint = e.hint().map(|h| format!("\n  hint: {h}")).unwrap_or_default();
                    problems.push(format!("step `{}`: {e}{hint}", step.name));
                }
            }
        }
        // A tool stopped by our Ctrl-C or SIGTERM is no fault of the tool or the stack.
        if self.cancel.is_cancelled() {
            let signal =
                self.signal.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_else(|| "a signal".into());
            return Err(Refusal::new(
                Code::Interrupted,
                format!("{signal} received while checking the tools: stopped before anything ran"),
            )
            .with_hint(format!(
                "nothing changed; run the same command again (`rdeploy status {}` shows the checkpoint)",
                self.stack_arg
            ))
            .into());
        }
        if problems.is_empty() {
            Ok(found)
        } else {
            Err(Refusal::new(Code::BadInput, problems.join("\n")).into())
        }
    }

    pub(super) fn lock(&self, command: &str) -> anyhow::Result<Box<dyn LockGuard>> {
        match self.store.lock(command) {
            Ok(lock) => {
                if let Some(dead) = lock.took_over_from() {
                    *self.took_over.lock().unwrap_or_else(|e| e.into_inner()) = Some(dead.clone());
                    if dead.host == crate::store::hostname() && !dead.is_alive_here() {
                        self.warn(format!(
                            "took over the lock of a run that died without releasing it: {dead}; its checkpoint is used as it was left"
                        ));
                    } else {
                        self.warn(format!(
                            "took over a lock left by {dead}; if that run is still alive on {}, stop this one now: two runs would interleave",
                            dead.host
                        ));
                    }
                }
                // A clean run forgets each tool it reaped, so a noted group that is still alive
                // belongs to a run that died (a grandchild outlives the pdeathsig): running the
                // same sub-change again now would interleave with it.
                let running = self.state.path.join("running");
                let describe = |alive: &[(i32, String)]| -> Vec<String> {
                    alive.iter().map(|(pgid, cmd)| format!("process group {pgid} (`{cmd}`)")).collect()
                };
                let alive = rdeploy_adapters::process::wait_for_survivors(&running, SURVIVOR_WAIT, |alive| {
                    self.warn(format!(
                        "waiting for a tool started by a run that died to finish (up to {} s): {}",
                        SURVIVOR_WAIT.as_secs(),
                        describe(alive).join(", ")
                    ));
                });
                if !alive.is_empty() {
                    let list = describe(&alive);
                    let kill: Vec<String> = alive.iter().map(|(pgid, _)| format!("kill -TERM -- -{pgid}")).collect();
                    return Err(Refusal::new(
                        Code::Locked,
                        format!(
                            "a tool started by a run that died is still running after {} s: {}",
                            SURVIVOR_WAIT.as_secs(),
                            list.join(", ")
                        ),
                    )
                    .with_hint(format!(
                        "wait for it to finish, or stop it with `{}`, then run this again",
                        kill.join("; ")
                    ))
                    .into());
                }
                // 0700 before process.rs writes its notes there.
                self.state.create_dir(&running)?;
                Ok(lock)
            }
            Err(crate::store::LockError::Held { dir, holder }) => {
                Err(Refusal::new(Code::Locked, format!("another run holds the lock on {dir}: {holder}"))
                    .with_hint("wait for it to finish; `rdeploy status` shows its progress")
                    .into())
            }
            Err(crate::store::LockError::Io(e)) => Err(e),
        }
    }

    /// Refuses (exit 2) when the stack no longer matches the checkpoint's steps.
    pub fn check_mapping(&self, deploy: &Deploy) -> anyhow::Result<()> {
        self.check_same_stack(deploy)?;
        let mut problems = Vec::new();
        for old in &deploy.steps {
            match self.stack.step(&old.name) {
                None if old.status != StepStatus::Pending => problems.push(format!(
                    "step `{}` ({}, {}) is recorded in the checkpoint but is no longer in the stack (removed or renamed)",
                    old.name,
                    old.tool,
                    old.status.as_str()
                )),
                Some(new) if new.tool != old.tool => problems.push(format!(
                    "step `{}` was a {} step in the checkpoint and is now a {} step",
                    old.name, old.tool, new.tool
                )),
                _ => {}
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(Refusal::new(
            Code::BadInput,
            format!("the checkpoint cannot be mapped onto the stack:\n  {}", problems.join("\n  ")),
        )
        .with_hint(format!(
            "restore the step in the stack file, or reconcile by hand and `rdeploy reset {} --yes`",
            self.stack_arg
        ))
        .into())
    }

    /// Refuses (exit 2) a checkpoint written for another stack sharing this state directory.
    /// The one same-stack check: `recover`, `revert` and `ci` all go through it.
    pub fn check_same_stack(&self, deploy: &Deploy) -> anyhow::Result<()> {
        if deploy.stack.is_empty() || deploy.stack == self.stack.name {
            return Ok(());
        }
        Err(Refusal::new(
            Code::BadInput,
            format!(
                "the checkpoint in {} belongs to stack `{}`, not `{}`",
                self.store.location(),
                deploy.stack,
                self.stack.name
            ),
        )
        .with_hint(format!("give each stack its own state: `rdeploy --state-dir .rdeploy-{} ...`", self.stack.name))
        .into())
    }

    /// A deploy whose `finished` record is written but which a crash kept from being archived
    /// is archived now, so it neither blocks `up` nor gets "recovered".
    pub(super) fn archive_if_finished(&self) -> anyhow::Result<()> {
        if let Some(deploy) = self.store.load_unfinished()? {
            if deploy.state != DeployState::Partial {
                Checkpoint::reopen_as_is(self.store.as_ref(), &self.redactor)?.archive_finished()?;
            }
        }
        Ok(())
    }
}

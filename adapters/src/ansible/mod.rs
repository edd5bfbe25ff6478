//! The ansible adapter: runs `ansible-playbook` with rdeploy's callback plugin enabled through
//! environment variables, checkpoints every inventory host (the sub-change) as the plugin's
//! records arrive, and recovers by re-running the playbook with `--limit` set to exactly the
//! hosts that are not done.

pub mod cache;
pub mod callback;
pub mod exit_codes;
pub mod preview;
pub mod recap;
pub mod settings;
pub mod syntax;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use self::callback::{parse_line, HostOutcome, HostTracker, Tail};
use crate::process::{Command, Outcome, Signal};
use crate::secrets;

/// The key whose values reach ansible with their YAML types.
const TYPED_KEY: &str = "extra_vars";
use crate::{
    display_command, shell_quote, Adapter, AdapterError, DescribeContext, Event, EventSink, Failure, FieldPath,
    Inspection, PathSegment, Preview, PriorStep, Recovered, RecoveryDoc, SpecProblem, StepContext, Stream, SubStatus,
    ToolInfo,
};

/// The environment variables that enable rdeploy's callback plugin beside the user's, and a
/// warning when the user's settings could not be read.
type CallbackEnv = (Vec<(String, String)>, Option<String>);

/// What a playbook run is prepared with: the hosts it targets (its sub-changes, planned before
/// it starts) and the callback environment.
struct Prepared {
    hosts: Vec<String>,
    callback: CallbackEnv,
}
/// The plugin's name, as `ANSIBLE_CALLBACKS_ENABLED` lists it.
pub const PLUGIN_NAME: &str = "rdeploy_events";
/// The plugin's source, written into the step's work dir before each run.
pub const PLUGIN_SOURCE: &str = include_str!("rdeploy_events.py");
/// The environment variable naming the file the plugin writes its records to (`/proc/PID/fd/N`
/// of a file with no name on disk).
pub const EVENTS_ENV: &str = "RDEPLOY_ANSIBLE_EVENTS";
/// The environment variable naming the secret extra vars file, which the plugin removes as soon
/// as ansible has read it (ansible reads `-e @FILE` once, before callbacks load, and keeps it).
pub const UNLINK_ENV: &str = "RDEPLOY_ANSIBLE_UNLINK";
/// The secret extra vars of one run, in the step's work dir (0600, deleted after the run).
const SECRET_VARS_FILE: &str = "secret-vars.json";
/// The same for `rdeploy plan`'s `--check` run: its own name, so that a plan run during `up`
/// never overwrites or deletes the file up's ansible-playbook is reading.
const PREVIEW_SECRET_VARS_FILE: &str = "preview-secret-vars.json";

const DEFAULT_BINARY: &str = "ansible-playbook";
const INSTALL_HINT: &str =
    "install ansible-core (`python3 -m pip install ansible-core`), or point the step's `binary:` at `ansible-playbook`";
/// How often the callback file is read while ansible runs.
const TAIL_EVERY: Duration = Duration::from_millis(100);
/// Above this many hosts `--limit` goes through a file (`--limit @file`) to keep argv short.
const LIMIT_FILE_ABOVE: usize = 200;
/// The lines of the check's `-vv` output read for where it searches (its version header).
const HEADER_LINES: usize = 40;
/// How many hosts a one-line message names before it says "and N more".
const NAMED_HOSTS: usize = 10;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnsibleSpec {
    pub playbook: PathBuf,
    pub inventory: PathBuf,
    pub limit: Option<String>,
    #[serde(default)]
    pub extra_vars: BTreeMap<String, serde_json::Value>,
    /// The entries of `extra_vars` the stack marks secret, by key (not a stack key: the stack module
    /// fills it). Once resolved, their values are in `extra_vars` too; they never go on the command line.
    #[serde(skip)]
    pub marked: BTreeMap<String, crate::secrets::Marked>,
    #[serde(default)]
    pub tags: Vec<String>,
    pub binary: Option<String>,
    /// `limit` (default: only failed, unreachable and pending hosts) or `rerun`.
    pub recover: Option<String>,
}

/// How `recover` resumes an ansible step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoverMode {
    /// Re-run the playbook on the hosts that are not done.
    Limit,
    /// Re-run the whole playbook: for playbooks idempotent by design.
    Rerun,
}

impl AnsibleSpec {
    pub const KEYS: &'static [&'static str] =
        &["playbook", "inventory", "limit", "extra_vars", "tags", "binary", "recover"];

    pub fn recover_mode(&self) -> RecoverMode {
        match self.recover.as_deref() {
            Some("rerun") => RecoverMode::Rerun,
            _ => RecoverMode::Limit,
        }
    }

    fn binary_name(&self) -> &str {
        self.binary.as_deref().unwrap_or(DEFAULT_BINARY)
    }

    fn resolve_binary(&self, ctx: &StepContext) -> Result<PathBuf, AdapterError> {
        crate::resolve_binary(ctx, self.binary_name(), INSTALL_HINT)
    }

    /// `-i INV PLAYBOOK [-e JSON] [--tags T]`, as the operator would type them in the stack dir.
    /// Extra vars whose name is secret go in `secret_file` (`-e @FILE`, see
    /// [`AnsibleSpec::secret_vars_file`]); without one (the runbook) they show as `***`.
    fn base_args(&self, secret_file: Option<&Path>) -> Vec<String> {
        let mut args = vec![
            "-i".to_string(),
            self.inventory.to_string_lossy().into_owned(),
            self.playbook.to_string_lossy().into_owned(),
        ];
        let secret = secrets::secret_entries(&self.extra_vars, &self.marked);
        let mut plain: BTreeMap<&String, &serde_json::Value> =
            self.extra_vars.iter().filter(|(k, _)| !secret.contains_key(*k)).collect();
        let stars = serde_json::Value::String("***".into());
        if secret_file.is_none() {
            // Marked ones are not read for the runbook: they are not in `extra_vars` yet.
            plain.extend(secret.keys().chain(self.marked.keys()).map(|k| (k, &stars)));
        }
        if !plain.is_empty() {
            // One JSON object keeps numbers, booleans and nesting as the stack file wrote them.
            args.push("-e".into());
            args.push(serde_json::to_string(&plain).expect("json values serialize"));
        }
        if let (Some(file), false) = (secret_file, secret.is_empty()) {
            args.push("-e".into());
            args.push(format!("@{}", file.display()));
        }
        if !self.tags.is_empty() {
            args.push("--tags".into());
            args.push(self.tags.join(","));
        }
        args
    }

    /// Serves the secret extra vars for one `ansible-playbook` run through a named pipe (see
    /// [`secrets::SecretPipe`]: ansible resolves `-e @FILE` to a real path, so a memory file's
    /// `/proc` link will not do), removed when dropped; the callback removes it as soon as
    /// ansible has read it (see [`UNLINK_ENV`]). A kill -9 of rdeploy leaves at most an empty pipe.
    fn secret_vars_file(&self, ctx: &StepContext, name: &str) -> Result<Option<secrets::SecretPipe>, Failure> {
        let entries = secrets::secret_entries(&self.extra_vars, &self.marked);
        if entries.is_empty() {
            return Ok(None);
        }
        let value = serde_json::Value::Object(entries.into_iter().collect());
        secrets::SecretPipe::serve(&ctx.work_dir, name, &value).map(Some).map_err(|e| {
            Failure::new(format!("cannot write the secret extra vars file in {}: {e}", ctx.work_dir.display()))
                .with_hint("check that the state directory is writable, then `rdeploy recover`")
        })
    }

    fn command(&self, ctx: &StepContext, binary: &Path) -> Command {
        // ansible-playbook stops on SIGINT as on Ctrl-C ("User interrupted execution", exit 99,
        // no further task); a SIGTERM ends it at once without a word (exit 143): checked here.
        // Its workers each start a session of their own (`setsid`), with the task's processes
        // in it, so the interrupt reaches every group of its tree; and an ansible that has not
        // ended a grace after it (its SIGINT means "stop now": it leaves nothing to save) is
        // stopped with SIGTERM, then SIGKILL.
        Command::new(binary)
            .cwd(&ctx.stack_dir)
            .envs(ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .in_step(ctx)
            .redact(secrets::secret_strings(&self.extra_vars, &self.marked))
            .on_rdeploy_death(Signal::SIGINT)
            .stop_whole_tree(crate::process::TIMEOUT_GRACE)
    }

    /// The hosts the playbook targets under `limit`, from `ansible-playbook --list-hosts`.
    async fn list_hosts(&self, ctx: &StepContext, binary: &Path, limit: Option<&str>) -> Result<Vec<String>, Failure> {
        let secret_file = self.secret_vars_file(ctx, SECRET_VARS_FILE)?;
        let mut cmd = self
            .command(ctx, binary)
            .args(self.base_args(secret_file.as_ref().map(secrets::SecretPipe::path)))
            .arg("--list-hosts");
        if let Some(limit) = limit {
            cmd = cmd.arg("--limit").arg(limit);
        }
        let mut stdout = String::new();
        let outcome = cmd
            .run(&ctx.cancel, ctx.timeout, &mut |stream, line| {
                if stream == Stream::Stdout {
                    stdout.push_str(line);
                    stdout.push('\n');
                }
            })
            .await
            .map_err(|e| Failure::new(e.to_string()))?;
        if !outcome.success() {
            return Err(command_failure(&cmd.display(), &outcome)
                .with_hint("fix the playbook or inventory, then run the step again"));
        }
        Ok(recap::parse_list_hosts(&stdout))
    }

    /// The hosts the run targets ([`AnsibleSpec::list_hosts`]) and the callback environment
    /// ([`AnsibleSpec::callback_env`]): two read-only ansible starts of a second or more each,
    /// made at once.
    async fn hosts_and_callback_env(
        &self,
        ctx: &StepContext,
        binary: &Path,
    ) -> (Result<Vec<String>, Failure>, CallbackEnv) {
        let plugin_dir = ctx.work_dir.join("callback_plugins");
        tokio::join!(self.list_hosts(ctx, binary, self.limit.as_deref()), self.callback_env(ctx, binary, &plugin_dir))
    }

    /// The environment that enables the plugin without disturbing the user's own callbacks:
    /// `ANSIBLE_CALLBACK_PLUGINS` and `ANSIBLE_CALLBACKS_ENABLED` override ansible.cfg, so the
    /// values in effect (from `ansible-config dump`, which sees cfg and env alike) are kept and
    /// ours appended.
    async fn callback_env(&self, ctx: &StepContext, binary: &Path, plugin_dir: &Path) -> CallbackEnv {
        let (mut paths, mut enabled, warning) = match self.effective_callback_config(ctx, binary).await {
            Ok(found) => (found.0, found.1, None),
            Err(why) => {
                let from_env =
                    |key: &str| ctx.env.get(key).cloned().or_else(|| std::env::var(key).ok()).unwrap_or_default();
                let paths = from_env("ANSIBLE_CALLBACK_PLUGINS")
                    .split(':')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                let enabled = from_env("ANSIBLE_CALLBACKS_ENABLED")
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                (paths, enabled, Some(format!("could not read ansible's callback settings ({why}); callbacks enabled only in ansible.cfg may be off for this run")))
            }
        };
        paths.push(plugin_dir.to_string_lossy().into_owned());
        if !enabled.iter().any(|e| e == PLUGIN_NAME) {
            enabled.push(PLUGIN_NAME.to_string());
        }
        (
            vec![
                ("ANSIBLE_CALLBACK_PLUGINS".to_string(), paths.join(":")),
                ("ANSIBLE_CALLBACKS_ENABLED".to_string(), enabled.join(",")),
            ],
            warning,
        )
    }

    /// `CALLBACK_PLUGINS` and `CALLBACKS_ENABLED` in effect, from `ansible-config dump` (a
    /// second or more of python), or from the state directory's cache when nothing that dump
    /// reads has changed since it last said them ([`settings`]).
    async fn effective_callback_config(
        &self,
        ctx: &StepContext,
        binary: &Path,
    ) -> Result<(Vec<String>, Vec<String>), String> {
        let sibling = binary.with_file_name("ansible-config");
        let config = if sibling.is_file() { sibling } else { PathBuf::from("ansible-config") };
        // The program that will run, for the digest; one not found is asked (and fails) as before.
        let found = match config.components().count() > 1 {
            true => Some(config.clone()),
            false => crate::resolve_binary(ctx, "ansible-config", INSTALL_HINT).ok(),
        };
        let inputs = found.map(|program| settings::inputs_digest(ctx, &[&program, binary]));
        if let Some(known) = inputs.as_deref().and_then(|inputs| settings::recall(ctx, inputs)) {
            return Ok((known.paths, known.enabled));
        }
        let cmd = self.command(ctx, &config).args(["dump", "--format", "json"]);
        let mut stdout = String::new();
        let outcome = cmd
            .run(&ctx.cancel, Some(Duration::from_secs(60)), &mut |stream, line| {
                if stream == Stream::Stdout {
                    stdout.push_str(line);
                }
            })
            .await
            .map_err(|e| e.to_string())?;
        if !outcome.success() {
            return Err(format!("`{}` {}", cmd.display(), outcome.describe_status()));
        }
        let (paths, enabled) = parse_callback_config(&stdout)
            .ok_or_else(|| format!("`{}` printed no callback settings", cmd.display()))?;
        if let Some(inputs) = &inputs {
            settings::remember(
                ctx,
                inputs,
                &settings::CallbackSettings { paths: paths.clone(), enabled: enabled.clone() },
            );
        }
        Ok((paths, enabled))
    }

    /// `h1,h2` or, for long lists, `@file` with one host per line in the work dir.
    fn limit_arg(&self, ctx: &StepContext, hosts: &[String]) -> Result<String, Failure> {
        if hosts.len() <= LIMIT_FILE_ABOVE {
            return Ok(hosts.join(","));
        }
        let path = ctx.work_dir.join("recover.limit");
        crate::private::create_dir_all(&ctx.work_dir)
            .and_then(|()| crate::private::write(&path, (hosts.join("\n") + "\n").as_bytes()))
            .map_err(|e| Failure::new(format!("could not write {}: {e}", path.display())))?;
        Ok(format!("@{}", path.display()))
    }

    /// `ansible-playbook -i INV PB [-e JSON] [--tags T] [--limit L]` with the paths of the stack file.
    fn runbook_words(&self, limit: Option<&str>) -> Vec<String> {
        let mut words = vec![self.binary_name().to_string()];
        words.extend(self.base_args(None));
        if let Some(limit) = limit.or(self.limit.as_deref()) {
            words.push("--limit".into());
            words.push(limit.to_string());
        }
        words
    }

    /// Runs the playbook once with the plugin enabled, checkpointing each host as it settles;
    /// secrets a task prints (its `msg` reaches the callback's records) are redacted.
    async fn run_playbook(
        &self,
        ctx: &StepContext,
        sink: &dyn EventSink,
        binary: &Path,
        limit: Option<&str>,
        prepared: Prepared,
        phase: &str,
    ) -> Result<(), Failure> {
        let mut found = secrets::secret_strings(&self.extra_vars, &self.marked);
        found.extend(secrets::env_secrets(&ctx.env));
        let redacting = secrets::RedactingSink { inner: sink, secrets: secrets::normalize(found) };
        self.run_playbook_redacted(ctx, &redacting, binary, limit, prepared, phase)
            .await
            .map_err(|f| secrets::redact_failure(f, &redacting.secrets))
    }

    async fn run_playbook_redacted(
        &self,
        ctx: &StepContext,
        sink: &dyn EventSink,
        binary: &Path,
        limit: Option<&str>,
        Prepared { hosts: planned, callback: (callback_env, warning) }: Prepared,
        phase: &str,
    ) -> Result<(), Failure> {
        if ctx.cancel.is_cancelled() {
            return Err(Failure { interrupted: true, ..Failure::new("stopped before `ansible-playbook` started") });
        }
        let plugin_dir = ctx.work_dir.join("callback_plugins");
        let events = events_file(&plugin_dir, &ctx.work_dir.join(format!("{phase}-events.jsonl")))?;
        if let Some(message) = warning {
            sink.emit(Event::Warning { message });
        }

        let secret_file = self.secret_vars_file(ctx, SECRET_VARS_FILE)?;
        let mut cmd =
            self.command(ctx, binary).args(self.base_args(secret_file.as_ref().map(secrets::SecretPipe::path)));
        if let Some(limit) = limit {
            cmd = cmd.arg("--limit").arg(limit);
        }
        let mut cmd = cmd.envs(callback_env).env(EVENTS_ENV, events.path()).env("PYTHONUNBUFFERED", "1");
        if let Some(file) = &secret_file {
            cmd = cmd.env(UNLINK_ENV, std::path::absolute(file.path()).unwrap_or_else(|_| file.path().to_path_buf()));
        }

        let tail = Tail::new(
            events.reader().map_err(|e| Failure::new(format!("could not read the callback's records: {e}")))?,
        );
        // Read by the ticker and, until the first record is in, before each line ansible prints:
        // the hosts the run targets are planned (the plugin names them before any task) before
        // any output of the run is told. Never locked twice: `select!` polls one at a time (a
        // mutex, not a cell, only so the step's future may move between threads).
        let reading = std::sync::Mutex::new((tail, HostTracker::new(planned)));
        let mut recap_lines = Vec::new();
        let mut no_more_hosts = false;
        let outcome = {
            let mut on_line = |stream: Stream, line: &str| {
                if stream == Stream::Stdout {
                    if let Some(recap) = recap::parse_recap_line(line) {
                        recap_lines.push(recap);
                    } else if line.contains("NO MORE HOSTS LEFT") {
                        no_more_hosts = true;
                    }
                }
                let mut guard = reading.lock().unwrap_or_else(|e| e.into_inner());
                let (tail, tracker) = &mut *guard;
                if tracker.records() == 0 {
                    drain(tail, tracker, sink);
                }
                sink.emit(Event::Output { stream, line: line.to_string() });
            };
            let run = cmd.run(&ctx.cancel, ctx.timeout, &mut on_line);
            tokio::pin!(run);
            let mut ticker = tokio::time::interval(TAIL_EVERY);
            loop {
                tokio::select! {
                    outcome = &mut run => break outcome.map_err(|e| Failure::new(e.to_string()))?,
                    _ = ticker.tick() => {
                        let mut guard = reading.lock().unwrap_or_else(|e| e.into_inner());
                        let (tail, tracker) = &mut *guard;
                        drain(tail, tracker, sink);
                    }
                }
            }
        };
        let (mut tail, mut tracker) = reading.into_inner().unwrap_or_else(|e| e.into_inner());
        drain(&mut tail, &mut tracker, sink);
        if let Some(rest) = tail.remainder() {
            sink.emit(Event::Warning { message: format!("the callback's last record was cut off: {rest}") });
        }
        // Read to the end, the callback's records have told everything; they hold what tasks
        // printed as ansible printed it (a secret in a `fail` message): the file has no name
        // and goes with its last descriptor.
        drop(events);
        if !tracker.has_stats() && !recap_lines.is_empty() {
            if tracker.records() == 0 {
                sink.emit(Event::Warning {
                    message: format!(
                        "the `{PLUGIN_NAME}` callback wrote nothing; per-host results come from the play recap"
                    ),
                });
            }
            tracker.use_recap(&recap_lines, no_more_hosts);
        }
        let custom = tracker.custom_stats();
        if outcome.success() && !custom.is_empty() {
            let values = custom.into_iter().map(|(k, v)| (k, crate::outputs::OutputValue::Plain(v))).collect();
            sink.emit(Event::Outputs { values });
        }
        let mut events = Vec::new();
        let outcomes = tracker.finish(outcome.code, &mut events);
        for event in events {
            sink.emit(event);
        }
        self.judge(&cmd, &outcome, &tracker, &outcomes)
    }

    /// Ok when ansible succeeded and every host is done; otherwise one line that names what
    /// happened and the first host's error, and a hint with the recovery `--limit`.
    fn judge(
        &self,
        cmd: &Command,
        outcome: &Outcome,
        tracker: &HostTracker,
        outcomes: &[(String, HostOutcome)],
    ) -> Result<(), Failure> {
        let mut counts = [0usize; 4];
        let mut not_done = Vec::new();
        let mut first_error = None;
        for (host, o) in outcomes {
            let slot = match o {
                HostOutcome::Done => 0,
                HostOutcome::Failed(_) => 1,
                HostOutcome::Unreachable(_) => 2,
                HostOutcome::Pending(_) => 3,
            };
            counts[slot] += 1;
            if slot != 0 {
                not_done.push(host.clone());
            }
            if let (None, HostOutcome::Failed(e) | HostOutcome::Unreachable(e)) = (&first_error, o) {
                first_error = Some(format!("{host}: {e}"));
            }
        }
        if outcome.success() && not_done.is_empty() {
            return Ok(());
        }
        let display = cmd.display();
        let mut failure = Failure::from_process(&display, outcome);
        let tally: Vec<String> =
            [(counts[1], "failed"), (counts[2], "unreachable"), (counts[3], "pending"), (counts[0], "done")]
                .iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, what)| format!("{n} {what}"))
                .collect();
        let status = match outcome.code {
            _ if outcome.interrupted => "was interrupted".to_string(),
            _ if outcome.timed_out => "timed out".to_string(),
            Some(code) => format!(
                "exited with status {code} ({})",
                exit_codes::describe(code, counts[2] > 0, tracker.records() > 0)
            ),
            None => outcome.describe_status(),
        };
        let detail = first_error.or_else(|| {
            // No host to blame (a parse error, a bad option): ansible's own last words.
            (counts[1] + counts[2] == 0).then(|| ansible_error_line(outcome)).flatten()
        });
        failure.summary = match (tally.is_empty(), detail) {
            (false, Some(detail)) => format!("`ansible-playbook` {status}: {}; {detail}", tally.join(", ")),
            (false, None) => format!("`ansible-playbook` {status}: {}", tally.join(", ")),
            (true, Some(detail)) => format!("`ansible-playbook` {status}: {detail}"),
            (true, None) => format!("`ansible-playbook` {status}"),
        };
        failure.hint = Some(if not_done.is_empty() {
            "fix the problem above, then `rdeploy recover` runs the step again".to_string()
        } else if self.recover_mode() == RecoverMode::Rerun {
            "`rdeploy recover` re-runs the whole playbook (`recover: rerun`)".to_string()
        } else {
            format!("`rdeploy recover` re-runs the playbook with {}", limit_words(&not_done))
        });
        Err(failure)
    }
}

impl Adapter for AnsibleSpec {
    /// The playbook, inventory, limit, extra vars (secret by their name hidden) and tags.
    fn settings(&self, _stack_dir: &Path) -> Vec<(&'static str, crate::contract::Setting)> {
        use crate::contract::Setting;
        let mut out = vec![
            ("playbook", Setting::Code(self.playbook.display().to_string())),
            ("inventory", Setting::Code(self.inventory.display().to_string())),
        ];
        if let Some(l) = &self.limit {
            out.push(("limit", Setting::Code(l.clone())));
        }
        let secret = self.extra_vars.keys().filter(|k| secrets::is_secret_key(k)).cloned().collect();
        out.push(("extra vars", Setting::Values { values: self.extra_vars.clone(), secret }));
        if !self.tags.is_empty() {
            out.push(("tags", Setting::List(self.tags.clone())));
        }
        out
    }

    fn problems(&self) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        if let Some(mode) = &self.recover {
            if !matches!(mode.as_str(), "limit" | "rerun") {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key("recover")],
                    message: format!("`recover: {mode}` is not a recovery mode of ansible steps"),
                    hint: Some("use `limit` (re-run only the hosts not done) or `rerun` (the whole playbook)".into()),
                });
            }
        }
        if self.limit.as_deref().is_some_and(|l| l.trim().is_empty()) {
            problems.push(SpecProblem {
                at: vec![PathSegment::Key("limit")],
                message: "`limit` is empty".into(),
                hint: Some("remove it to target every host the playbook names".into()),
            });
        }
        for (i, tag) in self.tags.iter().enumerate() {
            if tag.trim().is_empty() || tag.contains(',') {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key("tags"), PathSegment::Index(i)],
                    message: format!("tag `{tag}` is empty or contains a comma"),
                    hint: Some("list one tag per item".into()),
                });
            }
        }
        problems
    }

    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        let mut paths = vec![(vec![PathSegment::Key("playbook")], self.playbook.clone())];
        // `host1,host2,` is an inline inventory, not a file.
        if !self.inventory.to_string_lossy().contains(',') {
            paths.push((vec![PathSegment::Key("inventory")], self.inventory.clone()));
        }
        paths
    }

    async fn preflight(&self, ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        let binary = self.resolve_binary(ctx)?;
        // A playbook that does not parse is bad input, known before anything runs. One start
        // says both that and the version: at `-vv` ansible-playbook opens with its version
        // line (`ansible-playbook [core 2.19.14]`, before it reads the inventory or the
        // playbook), then checks the playbook; each start costs a second or more of python.
        // Once passed, the check is not made again while nothing it reads changed ([`syntax`]).
        // Secret extra vars show as `***` here.
        let args: Vec<String> =
            self.base_args(None).into_iter().chain(["--syntax-check".to_string(), "-vv".to_string()]).collect();
        let inputs = syntax::inputs_digest(ctx, &binary, &args, &self.playbook, &self.inventory);
        if let Some(version) = inputs.as_deref().and_then(|inputs| syntax::recall(ctx, inputs)) {
            return Ok(ToolInfo { binary, version });
        }
        let check = self.command(ctx, &binary).args(&args);
        let mut version = None;
        let mut header = Vec::new();
        let outcome = check
            .run(&ctx.cancel, Some(Duration::from_secs(120)), &mut |_, line| {
                if version.is_none() {
                    version = parse_version(line);
                }
                if header.len() < HEADER_LINES {
                    header.push(line.to_string());
                }
            })
            .await?;
        let Some(version) = version else {
            // No version line: ansible itself did not start (a broken install, a binary that is
            // not ansible-playbook), whatever the playbook holds.
            return Err(AdapterError::ToolUnusable {
                command: check.display(),
                detail: outcome.last_error_line().unwrap_or_else(|| outcome.describe_status()),
            });
        };
        // Only a check that ran to its end and failed says the playbook does not parse: one cut
        // short (a slow dynamic inventory on a loaded runner, a Ctrl-C the driver reports itself)
        // proved nothing, and ansible still checks the playbook when the step runs.
        if !outcome.success() && !outcome.interrupted && !outcome.timed_out {
            syntax::forget(ctx);
            return Err(crate::inputs::playbook_syntax(
                &self.playbook,
                &display_command(&[self.runbook_words(None), vec!["--syntax-check".into()]].concat()),
                ansible_error_line(&outcome),
            ));
        }
        // Kept only if nothing it read moved while it ran.
        if let (true, Some(inputs)) = (outcome.success(), &inputs) {
            if syntax::inputs_digest(ctx, &binary, &args, &self.playbook, &self.inventory).as_ref() == Some(inputs) {
                syntax::remember(ctx, inputs, &version, &header);
            }
        }
        Ok(ToolInfo { binary, version })
    }

    async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        let binary = self.resolve_binary(ctx).map_err(Failure::from)?;
        // The hosts come from the run itself: the plugin names them before any task runs
        // (`callback::Record::Hosts`), as `--list-hosts` would, without a start of their own.
        let callback = self.callback_env(ctx, &binary, &ctx.work_dir.join("callback_plugins")).await;
        self.run_playbook(ctx, sink, &binary, self.limit.as_deref(), Prepared { hosts: Vec::new(), callback }, "apply")
            .await
    }

    async fn recover(&self, ctx: &StepContext, prior: &PriorStep, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        if self.recover_mode() == RecoverMode::Rerun {
            return self.apply(ctx, sink).await.map(|()| Recovered::Complete);
        }
        let binary = self.resolve_binary(ctx).map_err(Failure::from)?;
        let (planned, callback) = self.hosts_and_callback_env(ctx, &binary).await;
        let planned = planned?;
        sink.emit(Event::Planned { ids: planned.clone() });
        let selection = select_targets(&planned, prior);
        if !selection.gone.is_empty() {
            sink.emit(Event::Warning {
                message: format!(
                    "{} not done but no longer targeted by the playbook and `limit`; left alone",
                    name_hosts(&selection.gone)
                ),
            });
        }
        if selection.targets.is_empty() {
            return Ok(Recovered::Complete);
        }
        // `targets` is a subset of what the step's own `limit` selects (list-hosts applied it),
        // so a plain host list is already the intersection.
        let limit = self.limit_arg(ctx, &selection.targets)?;
        self.run_playbook(ctx, sink, &binary, Some(&limit), Prepared { hosts: selection.targets, callback }, "recover")
            .await
            .map(|()| Recovered::Complete)
    }

    async fn inspect(&self, ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        let binary = self.resolve_binary(ctx).map_err(Failure::from)?;
        let planned = self.list_hosts(ctx, &binary, self.limit.as_deref()).await?;
        let mut inspection = Inspection::default();
        if self.recover_mode() == RecoverMode::Rerun {
            inspection.actions.push(format!(
                "re-run the whole playbook (`recover: rerun`): `{}`",
                display_command(&self.runbook_words(None))
            ));
            inspection.remaining = planned;
            return Ok(inspection);
        }
        let selection = select_targets(&planned, prior);
        for host in &planned {
            match prior.sub_changes.iter().find(|s| &s.id == host) {
                Some(s) if s.status == SubStatus::Done => inspection.actions.push(format!("keep {host}: done")),
                Some(s) => inspection.actions.push(match &s.error {
                    Some(error) => format!("re-run on {host} ({}): {error}", s.status.as_str()),
                    None => format!("re-run on {host} ({})", s.status.as_str()),
                }),
                None => inspection.actions.push(format!("run on {host} (not recorded yet)")),
            }
        }
        if !selection.gone.is_empty() {
            inspection.actions.push(format!("leave {} alone: no longer targeted", name_hosts(&selection.gone)));
        }
        if !selection.targets.is_empty() {
            inspection.actions.push(format!(
                "command: `{}`",
                display_command(&self.runbook_words(Some(&selection.targets.join(","))))
            ));
        }
        inspection.remaining = selection.targets;
        Ok(inspection)
    }

    async fn preview(&self, ctx: &StepContext) -> Result<Preview, crate::preview::PreviewError> {
        self.preview_check(ctx).await
    }

    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        let mut doc = RecoveryDoc::default();
        let cd = format!("cd {}", shell_quote(ctx.stack_dir));
        doc.inspect.push(format!("{cd} && {} --list-hosts", display_command(&self.runbook_words(None))));
        doc.recover.push(format!("rdeploy recover {}", ctx.stack_file));
        let remaining: Vec<String> = prior
            .map(|p| p.sub_changes.iter().filter(|s| s.status != SubStatus::Done).map(|s| s.id.clone()).collect())
            .unwrap_or_default();
        match (self.recover_mode(), prior) {
            (RecoverMode::Rerun, _) => doc.notes.push(format!(
                "`recover: rerun`: recovery re-runs the whole playbook; by hand: `{cd} && {}`",
                display_command(&self.runbook_words(None))
            )),
            (RecoverMode::Limit, Some(_)) if !remaining.is_empty() => {
                // The one command an operator can paste: the same run, only where it is not done.
                doc.notes.push(format!(
                    "by hand, re-run only the hosts not done ({}): `{cd} && {}`",
                    remaining.len(),
                    display_command(&self.runbook_words(Some(&remaining.join(","))))
                ));
                let failed: Vec<String> = prior
                    .into_iter()
                    .flat_map(|p| p.sub_changes.iter())
                    .filter(|s| s.status == SubStatus::Failed)
                    .map(|s| format!("{}: {}", s.id, s.error.as_deref().unwrap_or("failed")))
                    .collect();
                doc.notes.extend(failed);
            }
            (RecoverMode::Limit, Some(_)) => doc.notes.push("every host is done".into()),
            (RecoverMode::Limit, None) => doc.notes.push(format!(
                "recovery re-runs the playbook with `--limit` set to the failed, unreachable and pending hosts (`rdeploy status {}` names them): `{cd} && {} --limit HOST1,HOST2`",
                ctx.stack_file,
                display_command(&self.runbook_words(None).into_iter().filter(|w| w != "--limit" && Some(w) != self.limit.as_ref()).collect::<Vec<_>>())
            )),
        }
        doc.verify.push(format!("{cd} && {} --check --diff", display_command(&self.runbook_words(None))));
        doc
    }

    fn typed_values_mut(&mut self) -> Option<(&'static str, &mut BTreeMap<String, serde_json::Value>)> {
        Some((TYPED_KEY, &mut self.extra_vars))
    }

    fn typed_values_key(&self) -> Option<&'static str> {
        Some(TYPED_KEY)
    }

    /// ansible decides as it runs: `up` runs it as `apply` does (it is idempotent by design),
    /// and its hosts with `changed=0` are reported in place.
    fn converges_by_preview(&self) -> bool {
        false
    }

    /// Besides the playbook and the inventory: the playbook's whole directory tree (what it
    /// imports, includes and reads beside it: `import_playbook`, `include_tasks`, `vars_files`,
    /// roles, `group_vars`, ...), and the `group_vars/` and `host_vars/` beside an inventory file.
    fn pinned_paths(&self, stack_dir: &Path, _revert: Option<&str>) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self.referenced_paths().into_iter().map(|(_, path)| path).collect();
        paths.push(self.playbook.parent().map(Path::to_path_buf).unwrap_or_default());
        if !self.inventory.to_string_lossy().contains(',') && !stack_dir.join(&self.inventory).is_dir() {
            let beside = self.inventory.parent().map(Path::to_path_buf).unwrap_or_default();
            for sub in ["group_vars", "host_vars"] {
                paths.push(beside.join(sub));
            }
        }
        paths
    }

    fn marked_mut(&mut self) -> Option<&mut BTreeMap<String, crate::secrets::Marked>> {
        Some(&mut self.marked)
    }
}

/// Feeds new callback records to the tracker and the events they settle to the sink.
fn drain(tail: &mut Tail, tracker: &mut HostTracker, sink: &dyn EventSink) {
    let lines = match tail.read_lines() {
        Ok(lines) => lines,
        Err(e) => {
            sink.emit(Event::Warning { message: format!("could not read the callback's records: {e}") });
            return;
        }
    };
    let mut events = Vec::new();
    for line in lines {
        match parse_line(&line) {
            Ok(Some(record)) => tracker.observe(record, &mut events),
            Ok(None) => {}
            Err(e) => events.push(Event::Warning { message: e.to_string() }),
        }
    }
    for event in events {
        sink.emit(event);
    }
}

/// Writes the callback plugin and makes the file its records go to: one with no name on disk
/// (see [`secrets::UnlinkedFile`]), since they hold task messages and `--diff` texts as ansible
/// printed them, secrets included, and a kill -9 must not leave them in the state dir. The
/// named file `stale` of an older rdeploy, which had such records, is removed.
fn events_file(plugin_dir: &Path, stale: &Path) -> Result<secrets::UnlinkedFile, Failure> {
    let io =
        |what: &str, path: &Path, e: std::io::Error| Failure::new(format!("could not {what} {}: {e}", path.display()));
    crate::private::create_dir_all(plugin_dir).map_err(|e| io("create", plugin_dir, e))?;
    let plugin = plugin_dir.join(format!("{PLUGIN_NAME}.py"));
    crate::private::write(&plugin, PLUGIN_SOURCE.as_bytes()).map_err(|e| io("write", &plugin, e))?;
    match std::fs::remove_file(stale) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("remove", stale, e)),
        _ => {}
    }
    let dir = plugin_dir.parent().unwrap_or(plugin_dir);
    secrets::UnlinkedFile::new(dir).map_err(|e| io("create a file in", dir, e))
}

/// An `ansible-playbook` command that did not succeed, summarised by its exit status (what
/// ansible's code means) and its own error line.
fn command_failure(display: &str, outcome: &Outcome) -> Failure {
    let mut failure = Failure::from_process(display, outcome);
    if let Some(code) = outcome.code.filter(|_| !outcome.interrupted) {
        let what = exit_codes::describe(code, false, false);
        failure.summary = match ansible_error_line(outcome) {
            Some(line) => format!("`{display}` exited with status {code} ({what}): {line}"),
            None => format!("`{display}` exited with status {code} ({what})"),
        };
    }
    failure
}

/// Ansible's own `[ERROR]: ...` line (it is followed by an excerpt of the playbook, so the
/// last line of output is a caret, not the message); else the last line of output.
fn ansible_error_line(outcome: &Outcome) -> Option<String> {
    outcome
        .stderr_tail
        .iter()
        .chain(outcome.stdout_tail.iter())
        .rev()
        .find_map(|line| line.trim().strip_prefix("[ERROR]:").map(|rest| rest.trim().to_string()))
        .or_else(|| outcome.last_error_line())
}

/// "web3" / "web3, web4" / "web1, ..., web10 and 5 more".
fn name_hosts(hosts: &[String]) -> String {
    let shown = hosts.iter().take(NAMED_HOSTS).map(String::as_str).collect::<Vec<_>>().join(",");
    match hosts.len().saturating_sub(NAMED_HOSTS) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// "`--limit web3,db1`", or for long lists "`--limit` on 23 hosts (web1,... and 13 more)".
fn limit_words(hosts: &[String]) -> String {
    if hosts.len() <= NAMED_HOSTS {
        format!("`--limit {}`", hosts.join(","))
    } else {
        format!("`--limit` on {} hosts ({})", hosts.len(), name_hosts(hosts))
    }
}

/// `ansible-playbook [core 2.19.14]` -> `core 2.19.14`: the first line of `--version`, and of
/// any run at `-vv` (in colour under `ANSIBLE_FORCE_COLOR`); `None` for any other line.
fn parse_version(line: &str) -> Option<String> {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // An SGR sequence: ESC [ digits and semicolons, then `m`.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    let (program, rest) = plain.trim().split_once(" [")?;
    let inner = rest.strip_suffix(']')?.trim();
    let program_ok = !program.is_empty() && !program.contains(char::is_whitespace) && !program.starts_with('[');
    (program_ok && !inner.is_empty() && !inner.contains(['[', ']'])).then(|| inner.to_string())
}

/// `CALLBACK_PLUGINS` paths and `CALLBACKS_ENABLED` names from `ansible-config dump --format json`.
fn parse_callback_config(json: &str) -> Option<(Vec<String>, Vec<String>)> {
    #[derive(Deserialize)]
    struct Setting {
        name: Option<String>,
        value: Option<serde_json::Value>,
    }
    let settings: Vec<Setting> = serde_json::from_str(json).ok()?;
    let list = |name: &str| -> Option<Vec<String>> {
        let value = settings.iter().find(|s| s.name.as_deref() == Some(name))?.value.as_ref()?;
        Some(match value {
            serde_json::Value::Array(items) => items.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
            serde_json::Value::Null => Vec::new(),
            other => other.as_str().map(|s| vec![s.to_string()]).unwrap_or_default(),
        })
    };
    Some((list("DEFAULT_CALLBACK_PLUGIN_PATH")?, list("CALLBACKS_ENABLED").unwrap_or_default()))
}

/// Which hosts `recover` re-runs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// Targeted hosts not recorded as done, in the playbook's order.
    pub targets: Vec<String>,
    /// Hosts recorded as not done that the playbook and `limit` no longer target.
    pub gone: Vec<String>,
}

/// Linear in the number of hosts: one set of done hosts, one of planned hosts.
pub fn select_targets(planned: &[String], prior: &PriorStep) -> Selection {
    let done: HashSet<&str> = prior.ids_with(SubStatus::Done).collect();
    let planned_set: HashSet<&str> = planned.iter().map(String::as_str).collect();
    Selection {
        targets: planned.iter().filter(|h| !done.contains(h.as_str())).cloned().collect(),
        gone: prior
            .sub_changes
            .iter()
            .filter(|s| s.status != SubStatus::Done && !planned_set.contains(s.id.as_str()))
            .map(|s| s.id.clone())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PriorSubChange;

    fn spec() -> AnsibleSpec {
        AnsibleSpec {
            marked: Default::default(),
            playbook: "site.yml".into(),
            inventory: "inventory.ini".into(),
            limit: None,
            extra_vars: BTreeMap::from([
                ("release".to_string(), serde_json::json!("1.4.2")),
                ("n".to_string(), serde_json::json!(3)),
            ]),
            tags: vec!["deploy".into()],
            binary: None,
            recover: None,
        }
    }

    fn prior(subs: &[(&str, SubStatus, Option<&str>)]) -> PriorStep {
        PriorStep {
            sub_changes: subs
                .iter()
                .map(|(id, status, error)| PriorSubChange {
                    id: id.to_string(),
                    status: *status,
                    error: error.map(str::to_string),
                })
                .collect(),
            facts: Default::default(),
        }
    }

    #[test]
    fn selects_the_hosts_not_done_and_notes_the_ones_gone() {
        let planned: Vec<String> = ["web1", "web2", "web3", "web4"].iter().map(|s| s.to_string()).collect();
        let prior = prior(&[
            ("web1", SubStatus::Done, None),
            ("web2", SubStatus::Failed, Some("task `x` failed: boom")),
            ("web3", SubStatus::Pending, None),
            ("old9", SubStatus::Failed, None),
        ]);
        let selection = select_targets(&planned, &prior);
        assert_eq!(selection.targets, vec!["web2", "web3", "web4"]);
        assert_eq!(selection.gone, vec!["old9"]);
    }

    #[test]
    fn selection_stays_linear_for_large_fleets() {
        let planned: Vec<String> = (0..50_000).map(|i| format!("h{i}")).collect();
        let prior = PriorStep {
            sub_changes: planned
                .iter()
                .enumerate()
                .map(|(i, h)| PriorSubChange {
                    id: h.clone(),
                    status: if i % 7 == 0 { SubStatus::Failed } else { SubStatus::Done },
                    error: None,
                })
                .collect(),
            facts: Default::default(),
        };
        // CPU time of this thread, not wall-clock time: on a loaded CI machine the thread may
        // wait for a core far longer than the selection takes. A quadratic selection of 50,000
        // hosts costs many seconds of CPU; the linear one a small fraction of one.
        let cpu = || {
            let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
            Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
        };
        let started = cpu();
        let selection = select_targets(&planned, &prior);
        let took = cpu() - started;
        assert_eq!(selection.targets.len(), 50_000 / 7 + 1);
        assert!(took < Duration::from_secs(1), "the selection took {took:?} of CPU time");
    }

    #[test]
    fn runbook_gives_the_exact_limited_command() {
        let ctx = DescribeContext { step: "hosts", stack_file: "stack.yaml", stack_dir: "deploy", resumable: true };
        let prior = prior(&[
            ("web1", SubStatus::Done, None),
            ("web3", SubStatus::Failed, Some("task `check` failed: boom")),
            ("db1", SubStatus::Failed, Some("unreachable: task `ping`: refused")),
        ]);
        let doc = spec().describe_recovery(&ctx, Some(&prior));
        assert_eq!(doc.recover, vec!["rdeploy recover stack.yaml"]);
        assert_eq!(
            doc.notes[0],
            r#"by hand, re-run only the hosts not done (2): `cd deploy && ansible-playbook -i inventory.ini site.yml -e '{"n":3,"release":"1.4.2"}' --tags deploy --limit web3,db1`"#
        );
        assert!(doc.notes.contains(&"db1: unreachable: task `ping`: refused".to_string()));
        let static_doc = spec().describe_recovery(&ctx, None);
        assert!(static_doc.notes[0].contains("--limit HOST1,HOST2"), "{}", static_doc.notes[0]);
    }

    #[test]
    fn spec_problems_name_the_key() {
        let mut bad = spec();
        bad.recover = Some("retry".into());
        bad.tags = vec!["a,b".into()];
        let problems = bad.problems();
        assert_eq!(problems.len(), 2);
        assert_eq!(problems[0].at, vec![PathSegment::Key("recover")]);
        assert!(spec().problems().is_empty());
        let mut inline = spec();
        inline.inventory = "web1,web2,".into();
        assert_eq!(inline.referenced_paths().len(), 1);
    }

    #[test]
    fn reads_the_version_and_the_callback_config() {
        assert_eq!(parse_version("ansible-playbook [core 2.19.14]").as_deref(), Some("core 2.19.14"));
        assert_eq!(parse_version("nonsense"), None);
        // `-vv` output: the colour ANSIBLE_FORCE_COLOR adds, and lines that are not the version.
        assert_eq!(parse_version("\x1b[0;34mansible-playbook [core 2.19.14]\x1b[0m").as_deref(), Some("core 2.19.14"));
        assert_eq!(parse_version("[WARNING]: Ansible is being run in a world writable directory"), None);
        assert_eq!(parse_version("PLAY [configure web hosts] ******"), None);
        assert_eq!(parse_version("  config file = None"), None);
        let json = r#"[{"name":"CALLBACKS_ENABLED","origin":"env","value":["profile_tasks"]},
            {"name":"DEFAULT_CALLBACK_PLUGIN_PATH","origin":"default","value":["/a","/b"]},{"GALAXY_SERVERS":{}}]"#;
        assert_eq!(
            parse_callback_config(json),
            Some((vec!["/a".to_string(), "/b".to_string()], vec!["profile_tasks".to_string()]))
        );
    }

    #[test]
    fn names_long_host_lists_briefly() {
        let hosts: Vec<String> = (1..=12).map(|i| format!("h{i}")).collect();
        assert_eq!(name_hosts(&hosts[..2]), "h1,h2");
        assert!(name_hosts(&hosts).ends_with("h10 and 2 more"));
    }
}

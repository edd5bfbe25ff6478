//! The contract between the driver and an adapter: the [`Adapter`] trait every tool's spec
//! implements, what the driver hands down ([`StepContext`], [`PriorStep`], an [`EventSink`]) and
//! what comes back ([`Event`], [`Failure`], [`Recovered`], [`Inspection`], [`RecoveryDoc`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::preview::{Preview, PreviewError};
use crate::process;

/// What every tool's spec implements; the driver calls nothing else. Adapters never print and
/// never touch the checkpoint: they report through the sink and return a [`Failure`]. An
/// adapter is shared by the tasks that run its step (`Sync`), so its futures are `Send`.
pub trait Adapter: Sync {
    /// Problems a stack file can have that serde cannot see (exclusive keys, empty lists).
    fn problems(&self) -> Vec<SpecProblem>;

    /// Files and directories the step needs, relative to the stack file, with the key naming them.
    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)>;

    /// Problems only the files beside the stack file show, `dir` being its directory (a helm
    /// `chart: charts/webb` that is no directory there, which helm would look up as chart
    /// `webb` of a repository `charts`). Paths [`Adapter::referenced_paths`] names are checked
    /// by the caller. `env` is the step's `env`, which the tool sees over rdeploy's environment.
    fn problems_beside(&self, _dir: &Path, _env: &BTreeMap<String, String>) -> Vec<SpecProblem> {
        Vec::new()
    }

    /// Whether this step can resume from a checkpoint when the stack does not say.
    fn default_resumable(&self) -> bool {
        true
    }

    /// The step's key whose values reach the tool with their YAML types (helm `set`, ansible
    /// `extra_vars`, terraform `vars`), and those values. serde reads every YAML scalar as a
    /// string, so the stack module, which sees the YAML nodes, writes the typed values here.
    fn typed_values_mut(&mut self) -> Option<(&'static str, &mut BTreeMap<String, serde_json::Value>)> {
        None
    }

    /// The name of that key (`set`, `extra_vars`, `vars`), for what names a value by it (a
    /// reviewed plan lists its secret values as `set.password`); `None`: the tool takes no typed
    /// values. The same name [`Adapter::typed_values_mut`] returns.
    fn typed_values_key(&self) -> Option<&'static str> {
        None
    }

    /// The entries of that same key the stack marks secret (`{ from_env: NAME }`,
    /// `{ from_file: PATH }`, `{ value: V, secret: true }`), by key. The stack module fills it;
    /// [`crate::ToolSpec::resolve_secrets`] reads each value when the step runs and puts it in
    /// the typed values, where the adapter finds it and passes it off the command line.
    fn marked_mut(&mut self) -> Option<&mut BTreeMap<String, crate::secrets::Marked>> {
        None
    }

    /// The Kubernetes cluster the step's tool targets (helm, kubectl), as the stack sets it; `None`
    /// for a tool that targets none. A fleet step reads the kubeconfig's contexts from it.
    fn kube_target(&self) -> Option<KubeTarget<'_>> {
        None
    }

    /// The workloads the step's tool changes in its cluster (helm, kubectl), as the tool picks
    /// the context and namespace (its keys, else its own variables in the step's `env` over
    /// rdeploy's): what a single-cluster `up` reads until their rollout is complete. `None`:
    /// the tool changes no workloads.
    fn workloads(&self, ctx: &StepContext) -> Option<Workloads> {
        let _ = ctx;
        None
    }

    /// What `recover` applies again of a step whose tool succeeded but whose workloads did not
    /// become ready, when nothing changed since, in words for that failure's hint (helm's: a
    /// new revision only if the chart or values changed). `None`: the tool applies again only
    /// what changed, with nothing more to say.
    fn reapplies(&self) -> Option<&'static str> {
        None
    }

    /// How an operator rolls one cluster of a fleet step back by hand, for the step's spec
    /// pointed at that cluster ([`Adapter::target_context`]): the tool's commands, ready to
    /// paste. Running (`ctx`), they name the step's files as the tool resolves them against
    /// the stack's directory (the user's kubeconfig, never the one cut for the cluster); in a
    /// runbook (`None`), as written. `None`: the tool has no rollback of its own to point at.
    fn cluster_rollback(&self, ctx: Option<&StepContext>) -> Option<String> {
        let _ = ctx;
        None
    }

    /// Points the step at one cluster of a fleet: its kube `context` passed through, waiting for
    /// the workloads to be ready unless the step says `wait: false`. `false` (and nothing
    /// changed): the tool targets no kube context.
    fn target_context(&mut self, context: &str) -> bool {
        let _ = context;
        false
    }

    /// Checks that the tool is installed and usable; returns what was found.
    fn preflight(&self, ctx: &StepContext) -> impl Future<Output = Result<ToolInfo, AdapterError>> + Send;

    /// The preflight of `up` and `recover`, which start the tool anyway: `None` when the tool is
    /// there and says its version itself as the step runs (terraform's `-json` stream opens
    /// with it), reported as the [`TOOL_VERSION_FACT`] fact, so no separate start is spent on
    /// it. Anything else is [`Adapter::preflight`].
    fn preflight_for_run(
        &self,
        ctx: &StepContext,
    ) -> impl Future<Output = Result<Option<ToolInfo>, AdapterError>> + Send {
        async { self.preflight(ctx).await.map(Some) }
    }

    /// Runs the step from the start, reporting every sub-change.
    fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> impl Future<Output = Result<(), Failure>> + Send;

    /// Resumes a stopped step through the tool's native recovery path, never re-running a
    /// sub-change `prior` records as done.
    fn recover(
        &self,
        ctx: &StepContext,
        prior: &PriorStep,
        sink: &dyn EventSink,
    ) -> impl Future<Output = Result<Recovered, Failure>> + Send;

    /// Read-only: what `recover` would do now, from the tool's live state.
    fn inspect(&self, ctx: &StepContext, prior: &PriorStep)
        -> impl Future<Output = Result<Inspection, Failure>> + Send;

    /// The step's outputs read again from the tool's own state (terraform's `output -json`),
    /// for a consumer that needs a sensitive value the checkpoint never held. `None`: the tool
    /// keeps no such state (a shell output exists only in the run that wrote it).
    fn read_outputs(
        &self,
        _ctx: &StepContext,
    ) -> impl Future<Output = Result<Option<crate::outputs::Outputs>, Failure>> + Send {
        async { Ok(None) }
    }
    /// Read-only, for `rdeploy plan`: what `apply` would change now, item by item, from the
    /// tool's own preview (terraform `plan`, helm's server dry-run against the live objects,
    /// `kubectl diff`, ansible `--check --diff`, a shell sub-change's `check`). Changes nothing
    /// anywhere but the step's work dir (terraform's saved plan goes there).
    fn preview(&self, ctx: &StepContext) -> impl Future<Output = Result<Preview, PreviewError>> + Send;

    /// `up`'s decision ([`Adapter::converge`] takes it): the same in-place verdict as
    /// [`Adapter::preview`], through the same code, but a tool may stop where the verdict is
    /// already known and skip what only `plan` shows (helm's dry-run, when the release's
    /// record already says it must be upgraded). The default is the preview itself.
    fn decision_preview(&self, ctx: &StepContext) -> impl Future<Output = Result<Preview, PreviewError>> + Send {
        self.preview(ctx)
    }

    /// The outputs whose value changes on every apply, even one that changes nothing else
    /// (helm's `revision`: an upgrade to the same chart and values is a new revision). `plan`
    /// never takes their recorded value as known: they are known after the step applies.
    fn volatile_outputs(&self) -> &'static [&'static str] {
        &[]
    }

    /// Read-only, for `up --plan`: what [`Adapter::preview`] recorded in [`Preview::observed`],
    /// read again now (a helm release's revision, the resourceVersions of the objects a diff
    /// read, terraform's state serial and lineage), so a saved plan can tell what moved since.
    /// The default: the tool's preview observes nothing (ansible, shell).
    fn observe(
        &self,
        _ctx: &StepContext,
    ) -> impl Future<Output = Result<Vec<crate::preview::Observed>, PreviewError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// `up`: applies what `preview` (this adapter's own [`Adapter::preview`], run just before,
    /// or the reviewed plan's items under `up --plan`) says is not in place, and reports every
    /// item it says is in place as [`Event::InPlace`] without running the tool for it. This is
    /// the one decision `plan` shows and `up` takes. The default (ansible, idempotent by its own
    /// design) applies everything.
    fn converge(
        &self,
        ctx: &StepContext,
        preview: &Preview,
        sink: &dyn EventSink,
    ) -> impl Future<Output = Result<(), Failure>> + Send {
        let _ = preview;
        self.apply(ctx, sink)
    }

    /// Whether `up`'s decision is this adapter's own preview ([`Adapter::decision_preview`]),
    /// taken before [`Adapter::converge`] and so before the run too (`up` previews such steps at
    /// once, as `plan` does). `false` for a tool that decides as it runs (ansible, idempotent by
    /// its own design: its hosts with `changed=0` are reported in place) and for a step whose
    /// parts each preview their own when their turn comes (a fleet step's clusters).
    fn converges_by_preview(&self) -> bool {
        true
    }

    /// `up`'s one decision, the one `plan` shows: the adapter's own read-only preview (its
    /// [`Adapter::decision_preview`]: the same verdict, maybe fewer reads), or `decided` (the
    /// reviewed plan's items under `up --plan`, or a preview `up` made before the run), then
    /// [`Adapter::converge`] on it, which applies what is not in place and reports the rest
    /// [`Event::InPlace`]. A preview that fails (a cluster that cannot be diffed yet) is warned
    /// about and everything is applied; a missing tool or an interrupt is the step's failure. An
    /// adapter that does not converge by preview ([`Adapter::converges_by_preview`]) runs as
    /// `apply` does. The step is [`Converged::InPlace`] when nothing was reported done by the
    /// tool (only in place, or nothing at all).
    fn converge_step(
        &self,
        ctx: &StepContext,
        decided: Option<Preview>,
        sink: &dyn EventSink,
    ) -> impl Future<Output = Result<Converged, Failure>> + Send {
        async move {
            let counting = CountDone { inner: sink, done: AtomicBool::new(false) };
            let sink = &counting;
            let preview = match decided {
                _ if !self.converges_by_preview() => None,
                Some(preview) => Some(preview),
                None => match self.decision_preview(ctx).await {
                    Ok(preview) => Some(preview),
                    Err(PreviewError::Tool(e)) => return Err(e.into()),
                    Err(PreviewError::Failed(failure)) if failure.interrupted || ctx.cancel.is_cancelled() => {
                        return Err(Failure { interrupted: true, ..failure })
                    }
                    Err(PreviewError::Failed(failure)) => {
                        sink.emit(Event::Warning {
                            message: format!(
                                "could not tell what is already in place ({}): applying everything",
                                ctx.secrets.redact(&failure.summary)
                            ),
                        });
                        None
                    }
                },
            };
            match preview {
                Some(preview) => self.converge(ctx, &preview, sink).await?,
                None => self.apply(ctx, sink).await?,
            }
            Ok(if counting.done.load(Ordering::SeqCst) { Converged::Applied } else { Converged::InPlace })
        }
    }

    /// Whether a sub-change found in place ([`Event::InPlace`]) leaves the step's outputs
    /// unwritten, so that `up` hands on those the last finished deploy recorded for it (as
    /// `plan` showed them): a shell sub-change in place does not run, so it writes no
    /// `$RDEPLOY_OUTPUT`. `false` for a tool that reads its outputs again as it converges
    /// (terraform's state) or has none.
    fn in_place_keeps_last_outputs(&self) -> bool {
        false
    }

    /// What a reviewed plan pins of this step (`plan -o` records each file's digest, `up --plan`
    /// refuses when one changed): the files and directories, relative to the stack file's
    /// directory `stack_dir`, whose content decides what the tool does. `revert` is the step's
    /// `revert` line, for a tool whose own lines are shell lines (its scripts are pinned as
    /// theirs are). The default: every path [`Adapter::referenced_paths`] names but a
    /// `kubeconfig` (its tokens refresh).
    fn pinned_paths(&self, stack_dir: &Path, revert: Option<&str>) -> Vec<PathBuf> {
        let _ = (stack_dir, revert);
        self.referenced_paths()
            .into_iter()
            .filter(|(at, _)| !matches!(at.first(), Some(PathSegment::Key("kubeconfig"))))
            .map(|(_, path)| path)
            .collect()
    }

    /// The step's settings its commands use, as the runbook lists them under the step so the
    /// operator can check them at a glance: a label and its value, in order. `stack_dir` is the
    /// stack file's directory (terraform reads which variables its configuration declares
    /// sensitive). The default: none.
    fn settings(&self, stack_dir: &Path) -> Vec<(&'static str, Setting)> {
        let _ = stack_dir;
        Vec::new()
    }

    /// The sub-changes the stack declares itself (a shell step's `sub_changes`), each with the
    /// lines it runs, in order, for the runbook's table of them. The default: none, the tool
    /// finds its sub-changes as it runs (resources, hosts, objects, revisions).
    fn declared_sub_changes(&self) -> Vec<DeclaredSubChange<'_>> {
        Vec::new()
    }

    /// The runbook section for this step: exact commands an operator would type.
    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc;

    /// Where the step's keys hold shell lines (a shell step's `run` and `check`, and those of
    /// each `sub_changes` entry), as paths of keys with `*` for any entry of a list. A value a
    /// reference brings into such a line reaches the shell through its environment, never in
    /// its text. The default: the tool runs no shell line of the stack's.
    fn shell_line_keys(&self) -> &'static [&'static [&'static str]] {
        &[]
    }

    /// The kube context the step names itself (`context:`), for a tool that talks to a
    /// cluster: a fleet step takes its clusters from `contexts` instead. The default: none.
    fn own_context(&self) -> Option<&str> {
        None
    }
}

/// The Kubernetes cluster a step targets ([`Adapter::kube_target`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeTarget<'a> {
    /// Its `kubeconfig`, relative to the stack file (`None`: `KUBECONFIG` or `~/.kube/config`).
    pub kubeconfig: Option<&'a Path>,
    /// Its `namespace` (`None`: the context's, or every namespace for what the step reads).
    pub namespace: Option<&'a str>,
}

/// The workloads a step's tool changes in its cluster ([`Adapter::workloads`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workloads {
    /// The kube context the tool writes to (`None`: the kubeconfig's current one).
    pub context: Option<String>,
    /// The namespace to read (`None`: for a release, the context's, else `default`; for
    /// objects, every namespace).
    pub namespace: Option<String>,
    /// The tool is told to wait for them (`wait:`, the default); `false`: they are not checked,
    /// and the step's sub-changes say they were not waited for.
    pub wait: bool,
    pub touched: Touched,
}

/// Which workloads a step's tool changes ([`Workloads::touched`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touched {
    /// The workloads of a helm release (`meta.helm.sh/release-name`), and its hook Jobs when
    /// the tool failed (helm waited for them).
    Release { name: String },
    /// The workloads the step's sub-changes name, their ids being `Kind/namespace/name`.
    Objects,
}

/// A sub-change the stack declares, as the runbook lists it ([`Adapter::declared_sub_changes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeclaredSubChange<'a> {
    pub name: &'a str,
    /// The shell line that makes the change.
    pub run: &'a str,
    /// The shell line that exits 0 when it is already in place, if any.
    pub check: Option<&'a str>,
}

/// The value of one of a step's settings in the runbook ([`Adapter::settings`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Setting {
    /// A word, a path or a command, shown as code.
    Code(String),
    /// Several, each shown as code.
    List(Vec<String>),
    /// The step's typed values (`vars`, `extra_vars`, `set`), shown as `key=value`, those named
    /// in `secret` as `***`. The runbook adds the entries the stack marks secret, named by
    /// their source, and leaves the line out when there are neither.
    Values { values: BTreeMap<String, serde_json::Value>, secret: std::collections::BTreeSet<String> },
}

/// How [`Adapter::converge_step`] left a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Converged {
    /// Everything was found in place: the tool reported nothing done.
    InPlace,
    /// Something was applied (the tool reported a sub-change done).
    Applied,
}

/// Passes events on, noting whether the tool reported any sub-change done (applied).
struct CountDone<'a> {
    inner: &'a dyn EventSink,
    done: AtomicBool,
}

impl EventSink for CountDone<'_> {
    fn emit(&self, event: Event) {
        if matches!(event, Event::Done { .. }) {
            self.done.store(true, Ordering::SeqCst);
        }
        self.inner.emit(event);
    }
}

/// How a successful `recover` left the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovered {
    /// What the stack asks for is in place.
    Complete,
    /// The tool's own recovery took the step back to its last good state instead (helm's
    /// `recover: rollback`): nothing is half-done, but the stack's change is not in place
    /// either. The driver marks the step reverted; the next `recover` applies it again.
    RolledBack { to: String },
}

/// One segment of a path into a step's mapping, so the stack module can point at a line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathSegment {
    Key(&'static str),
    Index(usize),
}

pub type FieldPath = Vec<PathSegment>;

/// A problem in a step's settings, located by its path inside the step.
#[derive(Clone, Debug)]
pub struct SpecProblem {
    pub at: FieldPath,
    pub message: String,
    pub hint: Option<String>,
}

/// The fact (a JSON string) by which a step reports the version of its tool when its preflight
/// did not ask for it ([`Adapter::preflight_for_run`]): the step's `tool_version`.
pub const TOOL_VERSION_FACT: &str = "tool_version";

/// The fact (`true`) by which `up` records that a step's preview found everything in place, so
/// the tool applied nothing: the report says "in place, nothing to do".
pub const IN_PLACE_FACT: &str = "in_place";

/// The fact (a JSON string, one sentence) by which `up` records that a step can never be found
/// in place, and why (a helm chart that renders differently every time: its templates and
/// fields): the report says it once, under the step.
pub const NEVER_IN_PLACE_FACT: &str = "never_in_place";

/// What preflight found.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ToolInfo {
    pub binary: PathBuf,
    pub version: String,
}

/// Everything an adapter needs to run one step.
#[derive(Clone, Debug)]
pub struct StepContext {
    /// The step's name in the stack file.
    pub step: String,
    /// The stack's name.
    pub stack: String,
    /// The directory holding the stack file; relative paths in a step resolve against it.
    pub stack_dir: PathBuf,
    /// A scratch directory for this step inside the state directory (plan files, callback
    /// output); it survives a crash so recovery can read it.
    pub work_dir: PathBuf,
    /// A directory inside the state directory that outlives deploys, where an adapter keeps
    /// what it learnt from a tool under a digest of everything the answer depends on (ansible's
    /// callback settings), so a later run need not ask again. `None`: nothing is kept.
    pub cache_dir: Option<PathBuf>,
    /// Extra environment for the tool (`env:` on the step).
    pub env: BTreeMap<String, String>,
    /// The step's time limit, if any.
    pub timeout: Option<Duration>,
    /// Cancelled on SIGINT/SIGTERM or when the checkpoint cannot be written; adapters forward it
    /// to their child once and wait for it.
    pub cancel: CancellationToken,
    /// Notes the tool's processes while they run, so a run taking over after a crash can wait
    /// for one that outlived this run. The driver makes one per run; the default notes nothing.
    pub processes: crate::process::ProcessTracker,
    /// The operator's `--force`: recover may take steps it would otherwise refuse while another
    /// process may be working on the step (helm rolls back a stuck release).
    pub force: bool,
    /// The operator's `recover --reapply-missing`: a sub-change recorded done whose tool state
    /// says it is absent (terraform's state lost it) may be applied again instead of stopping.
    pub reapply_missing: bool,
    /// The run's secret values: every command of the step redacts them, and an adapter that
    /// learns of another (terraform's sensitive variables) adds it, so the driver redacts it too.
    pub secrets: crate::secrets::Registry,
    /// For each of this step's sub-changes the journal records as started by an earlier run and
    /// not done (still started, or failed since), the run that started it and what the driver established about that run (empty outside
    /// `recover`). helm reads it to tell an abandoned `pending-*` revision from a live one.
    pub started_by: BTreeMap<String, StartedBy>,
}

/// The run that journaled a sub-change as started, as the driver knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartedBy {
    /// The run's id (its `run` record in the journal).
    pub run_id: String,
    /// `up` or `recover`.
    pub command: String,
    pub host: String,
    pub pid: u32,
    pub fate: RunFate,
    /// The sub-change is still `started` in the journal: the run ended (or died) with it in
    /// flight. A `failed` one was reported failed, so its tool may never have changed anything.
    pub in_flight: bool,
    /// When the journal recorded it started (unix seconds).
    pub started_at: Option<i64>,
    /// The step's `pending_seen` fact: the revision a refused recover saw pending while this
    /// sub-change was in flight (that refusal recorded it failed).
    pub pending_seen: Option<u64>,
}

/// Whether the run that started a sub-change is known to be gone: a fact, never a guess.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunFate {
    /// This run took the lock over from it, and it is dead on this host (gone, a zombie, or its
    /// pid now belongs to another process).
    LockTakenOver,
    /// It ran on this host and is dead there (as above), though another run held the lock
    /// between it and this one.
    DeadHere,
    /// It ran on this host and its pid is alive (it may be that run still, or a reused pid).
    AliveHere,
    /// It ran on another host, whose processes this one cannot see.
    OtherHost,
}

impl RunFate {
    pub fn is_dead(self) -> bool {
        matches!(self, RunFate::LockTakenOver | RunFate::DeadHere)
    }
}

impl std::fmt::Display for StartedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`rdeploy {}` (pid {} on {})", self.command, self.pid, self.host)?;
        f.write_str(match self.fate {
            RunFate::LockTakenOver => ", which died: this run took its lock over",
            RunFate::DeadHere => ", which is no longer running",
            RunFate::AliveHere => ", whose pid is still alive on this host",
            RunFate::OtherHost => ", on another host, which this one cannot check",
        })
    }
}

impl StepContext {
    pub fn resolve(&self, path: &Path) -> PathBuf {
        self.stack_dir.join(path)
    }

    /// [`StepContext::resolve`], made absolute: what a tool started in the stack's directory
    /// is given (it would take a relative one against that directory a second time when the
    /// stack's directory is not rdeploy's, `rdeploy up deploy/stack.yaml`), and what its
    /// command shows, to paste from anywhere.
    pub fn resolve_absolute(&self, path: &Path) -> PathBuf {
        let resolved = self.resolve(path);
        std::path::absolute(&resolved).unwrap_or(resolved)
    }
}

/// What `describe_recovery` needs: names and paths as the operator will type them.
#[derive(Clone, Debug)]
pub struct DescribeContext<'a> {
    pub step: &'a str,
    /// The stack file as the operator refers to it (relative when possible), followed by the
    /// flags that locate its state (`--state-dir DIR`), as shell words ready to paste after
    /// `rdeploy recover`: already quoted, never quoted again.
    pub stack_file: &'a str,
    /// The stack directory as the operator refers to it.
    pub stack_dir: &'a str,
    pub resumable: bool,
}

/// The state of a sub-change as the checkpoint records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubStatus {
    /// Planned, never started.
    Pending,
    /// Started, never finished: a crash or kill left it uncertain.
    Started,
    Done,
    Failed,
}

impl SubStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SubStatus::Pending => "pending",
            SubStatus::Started => "started",
            SubStatus::Done => "done",
            SubStatus::Failed => "failed",
        }
    }
}

/// One sub-change as the checkpoint recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorSubChange {
    pub id: String,
    pub status: SubStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the checkpoint knows about a step when `recover` starts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PriorStep {
    pub sub_changes: Vec<PriorSubChange>,
    /// Adapter facts recorded during earlier runs (a helm revision, a terraform lock ID).
    pub facts: BTreeMap<String, serde_json::Value>,
}

impl PriorStep {
    /// One sub-change's status (a scan: for many look-ups, [`PriorStep::statuses`]).
    pub fn status_of(&self, id: &str) -> Option<SubStatus> {
        self.sub_changes.iter().find(|s| s.id == id).map(|s| s.status)
    }

    /// Every sub-change's status by id, for an adapter that looks each of its sub-changes up
    /// (a scan per look-up made recovering a 100,000-sub-change step quadratic).
    pub fn statuses(&self) -> std::collections::HashMap<&str, SubStatus> {
        self.sub_changes.iter().map(|s| (s.id.as_str(), s.status)).collect()
    }

    pub fn ids_with(&self, status: SubStatus) -> impl Iterator<Item = &str> {
        self.sub_changes.iter().filter(move |s| s.status == status).map(|s| s.id.as_str())
    }
}

/// Which output stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What an adapter reports while it runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The sub-changes this run intends to touch, in order (for progress and "pending").
    Planned { ids: Vec<String> },
    /// A sub-change is about to run (shell) or the tool said it started (terraform).
    Started { id: String },
    /// A sub-change is in place. `note` says how we know when it is not obvious.
    Done { id: String, note: Option<String> },
    /// A sub-change was found already in place by the step's preview and was not applied again
    /// (a shell `check` that passed, an object whose diff is empty): done, without the tool.
    InPlace { id: String, note: Option<String> },
    /// A sub-change failed; `error` is one line in the tool's own words.
    Failed { id: String, error: String },
    /// A sub-change the tool will not reach in this run (the play aborted, the apply stopped).
    Pending { id: String, reason: String },
    /// The tool now calls sub-change `from` by the name `to` (a terraform `moved` block): one
    /// sub-change, renamed, its status kept. If `to` is already recorded, `from` is dropped.
    Moved { from: String, to: String },
    /// A fact worth keeping for recovery and reports (never a secret).
    Fact { key: String, value: serde_json::Value },
    /// A line of the tool's human output (already redacted).
    Output { stream: Stream, line: String },
    /// Something the operator should read in the report.
    Warning { message: String },
    /// Outputs for later steps (`${{ steps.NAME.outputs.KEY }}`); a later event for a key
    /// replaces the earlier value. Sensitive values are never journaled.
    Outputs { values: crate::outputs::Outputs },
}

/// Receives an adapter's events. The driver's implementation journals sub-change events
/// durably before `emit` returns, so a sub-change is recorded as started before it runs.
/// If the journal cannot be written, the driver cancels the step's token; adapters check it
/// before starting the next sub-change.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: Event);
}

/// A line handler that hands a child's output to the sink as [`Event::Output`].
pub fn forward_output(sink: &dyn EventSink) -> impl FnMut(Stream, &str) + Send + '_ {
    move |stream, line| sink.emit(Event::Output { stream, line: line.to_string() })
}

/// Why a step stopped. `summary` is one line; the rest feeds the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub summary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr_tail: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    #[serde(default)]
    pub interrupted: bool,
    /// The step's `timeout` stopped the tool (SIGINT, then SIGTERM, then SIGKILL).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// The operator's file the tool's error points at (a kubectl manifest, a terraform
    /// configuration file), when it points at one: where a CI annotation goes. Boxed: every
    /// `Result<_, Failure>` carries the room for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<Box<Location>>,
}

/// A place in the operator's files: a path relative to the stack file's directory, and the
/// line when the tool said it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

impl Failure {
    pub fn new(summary: impl Into<String>) -> Failure {
        Failure { summary: summary.into(), ..Failure::default() }
    }

    /// A failure built from a finished child process; the summary names the command.
    pub fn from_process(command: &str, outcome: &process::Outcome) -> Failure {
        Failure::from_process_named(&format!("`{command}`"), command, outcome)
    }

    /// Like [`Failure::from_process`], naming the failed thing `what` (a sub-change) in the summary.
    pub fn from_process_named(what: &str, command: &str, outcome: &process::Outcome) -> Failure {
        let last = outcome.last_error_line();
        let summary = if outcome.interrupted {
            format!("{what} was interrupted")
        } else if outcome.timed_out {
            format!("{what} timed out")
        } else {
            match (outcome.describe_status(), last) {
                (status, Some(line)) => format!("{what} {status}: {line}"),
                (status, None) => format!("{what} {status}"),
            }
        };
        Failure {
            summary,
            command: Some(command.to_string()),
            exit_code: outcome.code,
            stderr_tail: outcome.stderr_tail.iter().cloned().collect(),
            hint: None,
            interrupted: outcome.interrupted,
            timed_out: outcome.timed_out,
            location: None,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }
}

/// Read-only view of what recovery would do, for `recover --dry-run`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Inspection {
    /// Lines in plain words ("would run orders", "terraform plan: 2 to add").
    pub actions: Vec<String>,
    /// Sub-changes recovery would touch.
    pub remaining: Vec<String>,
}

/// A runbook section for one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RecoveryDoc {
    /// Read-only commands that show the live state.
    pub inspect: Vec<String>,
    /// Commands that lead to the next good state, in order.
    pub recover: Vec<String>,
    /// How to check the step is in place.
    pub verify: Vec<String>,
    /// Anything an operator must know (stuck locks, manual steps).
    pub notes: Vec<String>,
    /// How to roll the step back by hand with the tool (helm's `rollback`), or why there is
    /// nothing to roll back to; shown first among the notes. Apart from them so that a fleet
    /// step can say it per cluster instead ([`Adapter::cluster_rollback`]).
    pub rollback: Vec<String>,
}

/// Errors that stop a step before it touches anything (tool missing, unusable version).
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("`{tool}` was not found on PATH")]
    ToolMissing { tool: String, hint: String },
    #[error("`{command}` failed: {detail}")]
    ToolUnusable { command: String, detail: String },
    #[error("could not start `{command}`: {source}")]
    Spawn { command: String, source: std::io::Error },
    /// An input file the tool would refuse, found before anything ran ([`crate::inputs`]).
    #[error("{what}")]
    BadInput { what: String, hint: String },
}

impl AdapterError {
    pub fn hint(&self) -> Option<&str> {
        match self {
            AdapterError::ToolMissing { hint, .. } | AdapterError::BadInput { hint, .. } => Some(hint),
            _ => None,
        }
    }
}

impl From<AdapterError> for Failure {
    /// A tool that went missing between preflight and use still fails with its install hint.
    fn from(e: AdapterError) -> Failure {
        let failure = Failure::new(e.to_string());
        match e.hint() {
            Some(hint) => failure.with_hint(hint.to_string()),
            None => failure,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Recorder;
    use crate::{PlanAction, PlanItem};

    /// An adapter that notes which of its run-time calls ran, and reports `reports` from
    /// whichever of `apply` and `converge` runs.
    struct Noting {
        by_preview: bool,
        preview: fn() -> Result<Preview, PreviewError>,
        reports: fn(&str) -> Event,
        calls: std::sync::Mutex<Vec<String>>,
    }

    impl Noting {
        fn new(by_preview: bool, reports: fn(&str) -> Event) -> Noting {
            let preview: fn() -> Result<Preview, PreviewError> =
                || Ok(Preview { items: vec![PlanItem::new("own", PlanAction::Unchanged)], ..Preview::default() });
            Noting { by_preview, preview, reports, calls: Default::default() }
        }

        fn note(&self, call: impl Into<String>) {
            self.calls.lock().unwrap().push(call.into());
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Adapter for Noting {
        fn problems(&self) -> Vec<SpecProblem> {
            Vec::new()
        }

        fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
            vec![
                (vec![PathSegment::Key("kubeconfig")], PathBuf::from("kube/config")),
                (vec![PathSegment::Key("manifests"), PathSegment::Index(0)], PathBuf::from("k8s/app.yaml")),
            ]
        }

        async fn preflight(&self, _ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
            Ok(ToolInfo { binary: PathBuf::from("/bin/true"), version: "1".into() })
        }

        async fn apply(&self, _ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
            self.note("apply");
            sink.emit((self.reports)("a"));
            Ok(())
        }

        async fn recover(&self, _: &StepContext, _: &PriorStep, _: &dyn EventSink) -> Result<Recovered, Failure> {
            self.note("recover");
            Ok(Recovered::Complete)
        }

        async fn inspect(&self, _: &StepContext, _: &PriorStep) -> Result<Inspection, Failure> {
            Ok(Inspection::default())
        }

        async fn preview(&self, _ctx: &StepContext) -> Result<Preview, PreviewError> {
            self.note("preview");
            (self.preview)()
        }

        fn converges_by_preview(&self) -> bool {
            self.by_preview
        }

        async fn converge(&self, _: &StepContext, preview: &Preview, sink: &dyn EventSink) -> Result<(), Failure> {
            self.note(format!(
                "converge on {}",
                preview.items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>().join(",")
            ));
            sink.emit((self.reports)("a"));
            Ok(())
        }

        fn describe_recovery(&self, _: &DescribeContext<'_>, _: Option<&PriorStep>) -> RecoveryDoc {
            RecoveryDoc::default()
        }
    }

    fn ctx() -> StepContext {
        StepContext { step: "s".into(), work_dir: PathBuf::from("."), ..crate::testing::step_context(Path::new(".")) }
    }

    fn in_place(id: &str) -> Event {
        Event::InPlace { id: id.into(), note: None }
    }

    fn done(id: &str) -> Event {
        Event::Done { id: id.into(), note: None }
    }

    #[tokio::test]
    async fn converge_step_takes_the_decided_preview_without_previewing_again() {
        let adapter = Noting::new(true, in_place);
        let decided = Preview { items: vec![PlanItem::new("reviewed", PlanAction::Unchanged)], ..Preview::default() };
        let sink = Recorder::default();
        let converged = adapter.converge_step(&ctx(), Some(decided), &sink).await.unwrap();
        assert_eq!(adapter.calls(), ["converge on reviewed"]);
        assert_eq!(converged, Converged::InPlace, "nothing was reported done");
    }

    #[tokio::test]
    async fn converge_step_without_a_decision_converges_on_the_adapters_own_preview() {
        let adapter = Noting::new(true, done);
        let sink = Recorder::default();
        let converged = adapter.converge_step(&ctx(), None, &sink).await.unwrap();
        assert_eq!(adapter.calls(), ["preview", "converge on own"]);
        assert_eq!(converged, Converged::Applied, "a sub-change was reported done");
    }

    #[tokio::test]
    async fn an_adapter_that_does_not_converge_by_preview_applies_whatever_was_decided() {
        let adapter = Noting::new(false, in_place);
        let decided = Preview { items: vec![PlanItem::new("reviewed", PlanAction::Update)], ..Preview::default() };
        let sink = Recorder::default();
        let converged = adapter.converge_step(&ctx(), Some(decided), &sink).await.unwrap();
        assert_eq!(adapter.calls(), ["apply"]);
        assert_eq!(converged, Converged::InPlace);
    }

    #[tokio::test]
    async fn a_preview_that_fails_is_warned_about_and_everything_applied() {
        let mut adapter = Noting::new(true, done);
        adapter.preview = || Err(PreviewError::Failed(Failure::new("the cluster cannot be diffed yet")));
        let sink = Recorder::default();
        let converged = adapter.converge_step(&ctx(), None, &sink).await.unwrap();
        assert_eq!(adapter.calls(), ["preview", "apply"]);
        assert_eq!(converged, Converged::Applied);
        assert!(sink.events().contains(&Event::Warning {
            message: "could not tell what is already in place (the cluster cannot be diffed yet): applying everything"
                .into()
        }));
    }

    #[tokio::test]
    async fn a_missing_tool_in_the_preview_is_the_steps_failure_and_nothing_runs() {
        let mut adapter = Noting::new(true, done);
        adapter.preview =
            || Err(PreviewError::Tool(AdapterError::ToolMissing { tool: "kubectl".into(), hint: "install it".into() }));
        let failure = adapter.converge_step(&ctx(), None, &Recorder::default()).await.unwrap_err();
        assert_eq!(adapter.calls(), ["preview"]);
        assert_eq!(failure.hint.as_deref(), Some("install it"));
    }

    #[test]
    fn the_defaults_pin_every_referenced_path_but_a_kubeconfig_and_carry_no_outputs() {
        let adapter = Noting::new(true, done);
        assert_eq!(adapter.pinned_paths(Path::new("."), Some("sh undo.sh")), [PathBuf::from("k8s/app.yaml")]);
        assert!(!adapter.in_place_keeps_last_outputs());
        assert_eq!(adapter.typed_values_key(), None);
    }
}

//! The helm adapter: `helm upgrade --install` with the stack's values, checkpointed as the
//! release revision it creates (sub-change id `release@revision`, e.g. `web@3`), with helm's
//! status and history read before and after: from its release records in the cluster's API
//! ([`records`]; helm itself runs only to change the cluster), or from `helm history` and
//! `helm status` where those records cannot be read in-process. Recovery decides from helm's own state: deployed at
//! the wanted chart and values, failed (upgrade again, or roll back to the last deployed revision,
//! always named), or stuck in `pending-*`. A pending revision this deploy's dead run abandoned
//! (the journal shows the run started it and left it in flight, helm wrote it after that start,
//! the driver knows the run is dead, [`StepContext::started_by`], and no helm process names the
//! release) is rolled back to the last
//! deployed revision, or uninstalled and installed again when it was never deployed; any other
//! pending revision only once no helm for it is alive and it is older than helm's timeout, or
//! when the operator forces it with `rdeploy recover --force` ([`StepContext::force`]).

mod converge;
pub mod preview;
pub mod records;
pub mod state;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use self::state::{last_deployed, ReleaseStatus, Revision, Status};
use crate::process::{capture, Captured, Command, Outcome, Signal, StdoutLog};
use crate::secrets;

/// The key whose values reach helm with their YAML types.
const TYPED_KEY: &str = "set";
use crate::{
    display_command, shell_quote, Adapter, AdapterError, DescribeContext, Event, EventSink, Failure, FieldPath,
    Inspection, PathSegment, Preview, PriorStep, Recovered, RecoveryDoc, SpecProblem, StepContext, SubStatus, ToolInfo,
};

const DEFAULT_BINARY: &str = "helm";
const INSTALL_HINT: &str =
    "install helm 3 or 4 (https://helm.sh/docs/intro/install/), or point the step's `binary:` at it";
/// Read-only calls (version, status, history) get this long.
const QUICK: Duration = Duration::from_secs(120);
/// Beyond helm's own `--timeout`, how long before rdeploy stops a helm that hangs.
const BACKSTOP: Duration = Duration::from_secs(60);

/// How every revision description rdeploy writes starts (`converge` writes it with the chart's
/// digest, `preview` reads it to tell a revision rdeploy made).
const DESCRIPTION_PREFIX: &str = "rdeploy: chart ";

/// How a plan note starts that says the chart renders differently every time (`preview` writes
/// it); `up` (`converge`) reports it as the step's [`crate::NEVER_IN_PLACE_FACT`].
const NEVER_IN_PLACE: &str = "never in place: ";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelmSpec {
    pub release: String,
    /// A chart directory (relative to the stack file), `repo/name` or an `oci://` reference.
    pub chart: String,
    pub namespace: Option<String>,
    #[serde(default)]
    pub values: Vec<PathBuf>,
    /// Values by dotted path, passed as `--set-json` so their types are the stack file's.
    #[serde(default)]
    pub set: BTreeMap<String, Value>,
    /// The entries of `set` the stack marks secret, by key (not a stack key: the stack module
    /// fills it). Once resolved, their values are in `set` too; they never go on the command line.
    #[serde(skip)]
    pub marked: BTreeMap<String, crate::secrets::Marked>,
    pub version: Option<String>,
    pub context: Option<String>,
    /// A kubeconfig file, relative to the stack file (default: `KUBECONFIG` or `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// The file this cluster's tool reads instead, holding only its context (a fleet step's
    /// cluster: see [`crate::kubeconfig`]). Not a stack key; messages and runbooks name
    /// `kubeconfig`, the user's file.
    #[serde(skip)]
    pub cluster_kubeconfig: Option<PathBuf>,
    /// Wait until the release's resources are ready (`--wait`; `--wait=watcher` on helm 4);
    /// the default. rdeploy then checks every workload of the release itself (helm 3's `--wait`
    /// passes a DaemonSet with pods not ready up to its `maxUnavailable`).
    pub wait: Option<bool>,
    /// Roll a failed upgrade back at once (`--atomic`; `--rollback-on-failure` on helm 4).
    pub atomic: Option<bool>,
    /// Replace resources that cannot be patched (`--force`; `--force-replace` on helm 4).
    pub force: Option<bool>,
    pub binary: Option<String>,
    /// `upgrade` (default) or `rollback`.
    pub recover: Option<RecoverMode>,
}

/// How `recover` resumes a failed release: `upgrade` again once the cause is fixed, or
/// `rollback` to the last deployed revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecoverMode {
    Upgrade,
    Rollback,
}

/// helm's live state of the release.
#[derive(Clone, Debug, Default)]
struct Live {
    history: Vec<Revision>,
    status: Option<ReleaseStatus>,
}

impl Live {
    fn latest(&self) -> Option<&Revision> {
        self.history.last()
    }

    fn next_revision(&self) -> u64 {
        self.latest().map_or(1, |r| r.revision + 1)
    }
}

/// What recover does, decided from helm's state.
#[derive(Clone, Debug, PartialEq)]
enum Decision {
    /// Deployed at the wanted chart and values.
    InPlace { revision: u64 },
    /// Not installed, superseded, failed with `recover: upgrade`, or deployed with other values.
    Upgrade { why: String },
    /// Roll back to `to`, then (with `recover: upgrade` after a stuck release) upgrade.
    /// `abandoned` is the pending revision a dead run of this deploy left, when that is known.
    Rollback { to: u64, why: String, then_upgrade: bool, abandoned: Option<u64> },
    /// A release that never reached deployed, left pending by a dead run of this deploy (or
    /// forced): uninstall it, then install again.
    Reinstall { abandoned: u64, why: String },
    /// Cannot proceed without the operator.
    Refuse { failure: Failure },
}

impl HelmSpec {
    pub const KEYS: &'static [&'static str] = &[
        "release",
        "chart",
        "namespace",
        "values",
        "set",
        "version",
        "context",
        "kubeconfig",
        "wait",
        "atomic",
        "force",
        "binary",
        "recover",
    ];

    /// Whether the stack file plainly names a chart directory (`./x`, `/x`, `a/b/c`): helm
    /// tries a local path before a `repo/name`, so `a/b` is only known from the disk.
    fn is_local_chart(&self) -> bool {
        !self.chart.contains("://")
            && (self.chart.starts_with('.') || self.chart.starts_with('/') || self.chart.matches('/').count() > 1)
    }

    pub fn recover_mode(&self) -> RecoverMode {
        self.recover.unwrap_or(RecoverMode::Upgrade)
    }

    fn binary_name(&self) -> &str {
        self.binary.as_deref().unwrap_or(DEFAULT_BINARY)
    }

    fn id(&self, revision: u64) -> String {
        format!("{}@{revision}", self.release)
    }

    /// `-n NS --kube-context C --kubeconfig K`, as every helm call gets them.
    fn cluster_args(&self, ctx: Option<&StepContext>) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(ns) = &self.namespace {
            args.extend(["-n".to_string(), ns.clone()]);
        }
        if let Some(c) = &self.context {
            args.extend(["--kube-context".to_string(), c.clone()]);
        }
        if let Some(path) = self.kubeconfig_arg(ctx) {
            args.extend(["--kubeconfig".to_string(), path.to_string_lossy().into_owned()]);
        }
        args
    }

    /// The spec whose words a message shows: the cluster's own kubeconfig (a fleet step's, see
    /// [`crate::kubeconfig`]) is what helm runs with, never what is shown: that is the step's
    /// `kubeconfig`, or none, as the user would type the command.
    fn shown(&self) -> std::borrow::Cow<'_, HelmSpec> {
        match self.cluster_kubeconfig {
            None => std::borrow::Cow::Borrowed(self),
            Some(_) => std::borrow::Cow::Owned(HelmSpec { cluster_kubeconfig: None, ..self.clone() }),
        }
    }

    /// `text` (a live helm's command line) as a message shows it: the cluster's own kubeconfig
    /// (a fleet step's) becomes the step's `kubeconfig` as helm resolves it, or goes with its
    /// flag when the step names none, as [`HelmSpec::shown`] shows the commands rdeploy runs.
    fn shown_text(&self, text: &str, ctx: &StepContext) -> String {
        let Some(cut) = &self.cluster_kubeconfig else { return text.to_string() };
        let cut = cut.to_string_lossy();
        let user = self.kubeconfig.as_ref().map(|k| ctx.resolve_absolute(k).to_string_lossy().into_owned());
        let flag = format!(" --kubeconfig {cut}");
        let text = match &user {
            Some(user) => text.replace(&flag, &format!(" --kubeconfig {user}")),
            None => text.replace(&flag, ""),
        };
        text.replace(cut.as_ref(), user.as_deref().unwrap_or("the step's kubeconfig"))
    }

    /// The `--kubeconfig` a helm or kubectl call gets: running (`ctx`), the cluster's own file
    /// when the rollout made one, else the step's `kubeconfig` made absolute (helm runs in the
    /// stack's directory); in a runbook, the step's as written.
    pub(crate) fn kubeconfig_arg(&self, ctx: Option<&StepContext>) -> Option<PathBuf> {
        match ctx {
            Some(ctx) => {
                self.cluster_kubeconfig.clone().or_else(|| self.kubeconfig.as_ref().map(|k| ctx.resolve_absolute(k)))
            }
            None => self.kubeconfig.clone(),
        }
    }

    /// `upgrade --install R CHART ...` with the flags of helm `major`.
    fn upgrade_words(&self, major: u32, ctx: Option<&StepContext>) -> Vec<String> {
        self.upgrade_words_with(major, ctx, SECRET_VALUES_FILE)
    }

    /// [`HelmSpec::upgrade_words`], the secret values read from `secret_file` in the work directory.
    fn upgrade_words_with(&self, major: u32, ctx: Option<&StepContext>, secret_file: &str) -> Vec<String> {
        let mut words = vec!["upgrade".to_string(), "--install".into(), self.release.clone(), self.chart.clone()];
        words.extend(self.cluster_args(ctx));
        if self.namespace.is_some() {
            words.push("--create-namespace".into());
        }
        if let Some(v) = &self.version {
            words.extend(["--version".to_string(), v.clone()]);
        }
        for file in &self.values {
            words.extend(["-f".to_string(), file.to_string_lossy().into_owned()]);
        }
        let secret = secrets::secret_entries(&self.set, &self.marked);
        for (key, value) in &self.set {
            if !secret.contains_key(key) {
                words.extend(["--set-json".to_string(), format!("{key}={value}")]);
            }
        }
        if ctx.is_none() {
            // The runbook: the operator fills each secret in (marked ones are not read for it).
            let keys: std::collections::BTreeSet<&String> = secret.keys().chain(self.marked.keys()).collect();
            for key in keys {
                words.extend(["--set-json".to_string(), format!("{key}=***")]);
            }
        }
        if let Some(ctx) = ctx.filter(|_| !secret.is_empty()) {
            // Secret values reach helm in a 0600 file (see `secret_values_file`), never on the
            // command line.
            words.extend(["-f".to_string(), secret_values_path(ctx, secret_file).to_string_lossy().into_owned()]);
        }
        // The stack declares the whole config: never reuse values from an earlier revision.
        words.push("--reset-values".into());
        // The chart's digest, by which the next `up` knows the revision is this chart's.
        if let Some(description) = ctx.and_then(|ctx| self.chart_description(ctx)) {
            words.push(format!("--description={description}"));
        }
        if self.atomic.unwrap_or(false) {
            words.push(if major >= 4 { "--rollback-on-failure" } else { "--atomic" }.into());
        }
        if self.force.unwrap_or(false) {
            words.push(if major >= 4 { "--force-replace" } else { "--force" }.into());
        }
        words.extend(self.wait_words(major, ctx));
        words
    }

    fn rollback_words(&self, major: u32, to: u64, ctx: Option<&StepContext>) -> Vec<String> {
        let mut words = vec!["rollback".to_string(), self.release.clone(), to.to_string()];
        words.extend(self.cluster_args(ctx));
        words.extend(self.wait_words(major, ctx));
        words
    }

    /// `(history, rollback)`: the commands that name the release's revisions and roll it back
    /// to `REVISION` with helm `major`'s flags, as a runbook shows them.
    fn rollback_by_hand(&self, major: u32) -> (String, String) {
        let mut history = vec!["history".to_string(), self.release.clone()];
        history.extend(self.cluster_args(None));
        let mut rollback = self.rollback_words(major, 0, None);
        rollback[2] = "REVISION".into();
        (display_command(&self.helm_words(history)), display_command(&self.helm_words(rollback)))
    }

    fn wait_words(&self, major: u32, ctx: Option<&StepContext>) -> Vec<String> {
        let mut words = Vec::new();
        if self.wait.unwrap_or(true) {
            words.push(if major >= 4 { "--wait=watcher" } else { "--wait" }.into());
        }
        if let Some(t) = ctx.and_then(|c| c.timeout) {
            words.push(format!("--timeout={}s", t.as_secs().max(1)));
        }
        words
    }

    /// The chart's `name-version` as helm history shows it, when it can be known offline.
    fn wanted_chart(&self, ctx: &StepContext) -> Option<String> {
        let local = ctx.resolve(Path::new(&self.chart)).join("Chart.yaml");
        if !self.chart.contains("://") && local.is_file() {
            let text = std::fs::read_to_string(local).ok()?;
            let meta = crate::kubectl::manifest::parse_yaml(&text).ok()?;
            return Some(format!("{}-{}", meta.get("name")?.as_str()?, meta.get("version")?.as_str()?));
        }
        let name = self.chart.rsplit('/').next()?;
        self.version.as_ref().map(|v| format!("{name}-{}", v.trim_start_matches('v')))
    }

    /// The user values helm should have recorded, or `None` when they cannot be computed.
    fn wanted_values(&self, ctx: &StepContext) -> Option<Value> {
        let mut files = Vec::new();
        for file in &self.values {
            let text = std::fs::read_to_string(ctx.resolve(file)).ok()?;
            files.push(crate::kubectl::manifest::parse_yaml(&text).ok()?);
        }
        state::wanted_values(&files, &self.set)
    }

    /// Whether the stack asks for the latest revision's chart and its values: each `None` when
    /// it cannot tell (a repository chart without `version:`, `set` keys with list indexes).
    fn same_as(&self, ctx: &StepContext, live: &Live, latest: &Revision) -> (Option<bool>, Option<bool>) {
        let chart_same = self.wanted_chart(ctx).map(|chart| chart == latest.chart);
        let values_same = match (self.wanted_values(ctx), &live.status) {
            (Some(wanted), Some(status)) => Some(state::same_values(&status.config, &wanted)),
            _ => None,
        };
        (chart_same, values_same)
    }

    /// `uninstall R`; with `wait:` (and for rdeploy's own call, its timeout) helm waits until
    /// the release's objects are gone, so the install that follows does not meet them.
    fn uninstall_words(&self, major: u32, ctx: Option<&StepContext>) -> Vec<String> {
        let mut words = vec!["uninstall".to_string(), self.release.clone()];
        words.extend(self.cluster_args(ctx));
        if ctx.is_some() {
            words.extend(self.wait_words(major, ctx));
        }
        words
    }

    fn helm_words(&self, rest: Vec<String>) -> Vec<String> {
        let mut words = vec![self.binary_name().to_string()];
        words.extend(rest);
        words
    }

    fn record_facts(&self, live: &Live, sink: &dyn EventSink) {
        if let Some(latest) = live.latest() {
            sink.emit(Event::Fact { key: "revision".into(), value: latest.revision.into() });
            sink.emit(Event::Fact { key: "status".into(), value: latest.status.as_str().into() });
        }
        if let Some(good) = last_deployed(&live.history) {
            sink.emit(Event::Fact { key: "last_deployed_revision".into(), value: good.revision.into() });
        }
    }

    /// Journals what became of a pending revision a dead run of this deploy abandoned: never
    /// done, and now `how` (rolled back, uninstalled), as a fact and in the report.
    fn settle_abandoned(&self, sink: &dyn EventSink, before: &Live, revision: u64, how: &str) {
        let status = before
            .history
            .iter()
            .find(|r| r.revision == revision)
            .map_or_else(|| "pending".to_string(), |r| r.status.to_string());
        sink.emit(Event::Pending {
            id: self.id(revision),
            reason: format!("abandoned by a dead run ({status}): {how}"),
        });
        sink.emit(Event::Fact { key: "abandoned_revision".into(), value: revision.into() });
        let message = match how.strip_prefix("rolled back ") {
            Some(to) => format!("rolled back abandoned revision {revision} of {} ({status}) {to}", self.release),
            None => format!("{how} abandoned revision {revision} of {} ({status})", self.release),
        };
        sink.emit(Event::Warning { message });
    }

    fn failure_hint(&self, after: &Live) -> String {
        match (self.recover_mode(), last_deployed(&after.history)) {
            (RecoverMode::Rollback, Some(good)) => format!(
                "`rdeploy recover` rolls {} back to revision {} (`recover: rollback`) and marks the step reverted; once the cause is fixed, the next `rdeploy recover` upgrades",
                self.release, good.revision
            ),
            (_, Some(good)) => format!(
                "fix the cause, then `rdeploy recover` upgrades again; revision {} is the last deployed one (`{}`)",
                good.revision,
                display_command(&self.helm_words(self.rollback_words(4, good.revision, None)))
            ),
            (_, None) => "fix the cause, then `rdeploy recover` installs again".into(),
        }
    }
}

/// Whether the journal shows the sub-change of `revision` left in flight by the run that started
/// it: still `started`, or failed by a refused recover that saw `revision` pending.
fn in_flight(by: &crate::StartedBy, revision: u64) -> bool {
    by.in_flight || by.pending_seen == Some(revision)
}

/// A helm binary as found on disk: its resolved path and the file it names (device, inode,
/// modification time), so a binary replaced at the same path is asked again.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct BinaryKey {
    path: PathBuf,
    file: (u64, u64, i64, i64),
}

impl BinaryKey {
    fn of(path: &Path) -> Option<BinaryKey> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(BinaryKey { path: path.to_path_buf(), file: (meta.dev(), meta.ino(), meta.mtime(), meta.mtime_nsec()) })
    }
}

/// `helm version --short` of each binary this process asked (major, version): only a usable
/// answer (helm 3 or 4) is kept, so a failing binary is asked again and reports its own error.
fn versions() -> &'static std::sync::Mutex<std::collections::HashMap<BinaryKey, (u32, String)>> {
    static VERSIONS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<BinaryKey, (u32, String)>>> =
        std::sync::OnceLock::new();
    VERSIONS.get_or_init(Default::default)
}

fn known_version(key: &BinaryKey) -> Option<(u32, String)> {
    versions().lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
}

fn remember_version(key: BinaryKey, major: u32, version: &str) {
    versions().lock().unwrap_or_else(|e| e.into_inner()).insert(key, (major, version.to_string()));
}

/// One helm step against its release: the spec, the step's context, and the helm binary with
/// its major version (3 or 4: their flags differ), found once per run.
struct Release<'a> {
    spec: &'a HelmSpec,
    ctx: &'a StepContext,
    binary: PathBuf,
    major: u32,
    /// `helm version --short`, for preflight.
    version: String,
    /// helm's release records read from the API in-process ([`records`]), opened at the first
    /// read; `None` when helm must be asked instead (its storage or cluster settings are ones
    /// [`records::Records::open`] does not read).
    records: tokio::sync::OnceCell<Option<records::Records>>,
}

/// How much of the release a read needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Detail {
    /// Revision numbers and statuses: what an upgrade needs before it runs.
    Revisions,
    /// Those, and every revision newer than this one in full: what a helm command wrote.
    Since(u64),
    /// Those, the latest revision in full and the release's status (its values): what
    /// [`Release::decide`] needs.
    Latest,
}

impl<'a> Release<'a> {
    fn new(spec: &'a HelmSpec, ctx: &'a StepContext, binary: PathBuf) -> Release<'a> {
        Release { spec, ctx, binary, major: 0, version: String::new(), records: tokio::sync::OnceCell::new() }
    }

    /// The release's records in the cluster's API, opened once; `None` (and helm is asked)
    /// where they cannot be read in-process.
    async fn records(&self) -> Option<&records::Records> {
        self.records
            .get_or_init(|| async {
                let kubeconfig = self.spec.kubeconfig.as_ref().map(|k| self.ctx.resolve(k));
                let opened = records::Records::open(
                    &self.spec.release,
                    kubeconfig,
                    self.spec.context.as_deref(),
                    self.spec.namespace.as_deref(),
                    self.ctx,
                )
                .await;
                opened.map_err(|why| tracing::debug!("helm release records read through helm: {why}")).ok()
            })
            .await
            .as_ref()
    }

    /// Finds helm and asks its version: once per binary per rdeploy process ([`known_version`]),
    /// so a fleet step's clusters and the preflight before them share one `helm version`.
    async fn open(spec: &'a HelmSpec, ctx: &'a StepContext) -> Result<Release<'a>, AdapterError> {
        let binary = crate::resolve_binary(ctx, spec.binary_name(), INSTALL_HINT)?;
        let mut release = Release::new(spec, ctx, binary);
        let key = BinaryKey::of(&release.binary);
        if let Some((major, version)) = key.as_ref().and_then(known_version) {
            release.major = major;
            release.version = version;
            return Ok(release);
        }
        let cmd = release.command().args(["version", "--short"]);
        let Captured { outcome, stdout, .. } = capture(&cmd, ctx, Some(QUICK), None, StdoutLog::UnlessJson).await?;
        let version = stdout.first().map(|s| s.trim().to_string()).unwrap_or_default();
        match state::parse_major(&version) {
            Some(major @ (3 | 4)) if outcome.success() => {
                if let Some(key) = key {
                    remember_version(key, major, &version);
                }
                release.major = major;
                release.version = version;
                Ok(release)
            }
            Some(major) if outcome.success() => Err(AdapterError::ToolUnusable {
                command: cmd.display(),
                detail: format!("helm {major} is not supported (helm 3 or 4 is)"),
            }),
            _ => Err(AdapterError::ToolUnusable {
                command: cmd.display(),
                detail: outcome.last_error_line().unwrap_or_else(|| outcome.describe_status()),
            }),
        }
    }

    /// Writes the stack's secret `set` values for one helm call (deleted when dropped).
    fn secret_values_file(&self, name: &str) -> Result<Option<secrets::SecretFile>, Failure> {
        let entries = secrets::secret_entries(&self.spec.set, &self.spec.marked);
        if entries.is_empty() {
            return Ok(None);
        }
        let path = secret_values_path(self.ctx, name);
        let dir = path.parent().unwrap_or(Path::new("."));
        secrets::SecretFile::write(dir, name, &secrets::nest_dotted(&entries)).map(Some).map_err(|e| {
            Failure::new(format!("cannot write the secret values file {}: {e}", path.display()))
                .with_hint("check that the state directory is writable, then `rdeploy recover`")
        })
    }

    /// helm with the words `words` gives for the spec: run with this cluster's own kubeconfig
    /// where the rollout made one, shown with the user's ([`HelmSpec::shown`]).
    fn with_words(&self, words: &dyn Fn(&HelmSpec) -> Vec<String>) -> Command {
        self.command().args_shown_as(words(self.spec), words(&self.spec.shown()))
    }

    /// helm reading the release: `words`, then the cluster's arguments, run with this
    /// cluster's own kubeconfig where the rollout made one and shown with the user's, as
    /// [`Release::with_words`] does.
    fn reading(&self, words: &[&str]) -> Command {
        let cluster = |spec: &HelmSpec| spec.cluster_args(Some(self.ctx));
        self.command().args(words).args_shown_as(cluster(self.spec), cluster(&self.spec.shown()))
    }

    fn command(&self) -> Command {
        // helm install/upgrade catch SIGINT (and SIGTERM) and mark the release failed rather than
        // leave it pending.
        Command::new(&self.binary)
            .cwd(&self.ctx.stack_dir)
            .envs(self.ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .in_step(self.ctx)
            .redact(secrets::secret_strings(&self.spec.set, &self.spec.marked))
            .on_rdeploy_death(Signal::SIGINT)
    }

    /// The release's outputs for later steps: `revision`, `status`, `chart_version`,
    /// `app_version` and `namespace`, once the step's revision is in place: from the release
    /// `helm upgrade -o json` printed for that revision when there is one ([`printed_outputs`]),
    /// else from `helm get metadata`.
    async fn report_outputs(
        &self,
        sink: &dyn EventSink,
        printed: Option<crate::outputs::Outputs>,
    ) -> Result<(), Failure> {
        if let Some(values) = printed {
            sink.emit(Event::Outputs { values });
            return Ok(());
        }
        let metadata = self.metadata().await?.ok_or_else(|| {
            Failure::new(format!("release {} has no revision to take outputs from", self.spec.release))
        })?;
        sink.emit(Event::Outputs { values: release_outputs(&metadata) });
        Ok(())
    }

    /// The latest revision as `helm get metadata -o json` gives it (`revision`, `status`,
    /// `version`, `appVersion`, `namespace`): from its record in the API, in-process, else from
    /// helm. `None` when the release is not installed.
    async fn metadata(&self) -> Result<Option<Value>, Failure> {
        if let Some(records) = self.records().await {
            let read = async {
                let latest = records.revisions().await?.last().map(|r| r.revision);
                match latest {
                    Some(revision) => records.record(revision).await,
                    None => Ok(None),
                }
            };
            let record = read.await.map_err(|e| Failure::new(e.0).with_hint("check that the cluster is reachable"))?;
            return Ok(record.map(|record| {
                serde_json::json!({
                    "revision": record.status.version,
                    "status": record.status.info.status.as_str(),
                    "version": record.chart_version,
                    "appVersion": record.revision.app_version,
                    "namespace": record.status.namespace,
                })
            }));
        }
        let cmd = self.reading(&["get", "metadata", &self.spec.release, "-o", "json"]);
        let Captured { outcome, stdout, stderr } =
            capture(&cmd, self.ctx, Some(QUICK), None, StdoutLog::UnlessJson).await.map_err(Failure::from)?;
        if !outcome.success() && state::is_not_found(&stderr) {
            return Ok(None);
        }
        if !outcome.success() {
            return Err(helm_failure(&cmd.display(), &outcome, &stderr));
        }
        serde_json::from_str(&stdout.join("\n"))
            .map(Some)
            .map_err(|e| Failure::new(format!("`{}` printed unexpected JSON: {e}", cmd.display())))
    }

    /// The step's log keeps what helm's text output said (`-o json` replaces it, and a JSON
    /// document is not logged line by line): the release's name, namespace, status and
    /// revision, and the chart's NOTES, redacted like any output.
    fn log_printed_release(&self, sink: &dyn EventSink, cmd: &Command, printed: Option<&Value>) {
        let Some(printed) = printed else { return };
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
        let info = printed.get("info");
        let mut lines = vec![
            format!("NAME: {}", text(printed.get("name"))),
            format!("NAMESPACE: {}", text(printed.get("namespace"))),
            format!("STATUS: {}", text(info.and_then(|i| i.get("status")))),
            format!("REVISION: {}", printed.get("version").and_then(Value::as_u64).unwrap_or(0)),
        ];
        let notes = text(info.and_then(|i| i.get("notes")));
        if !notes.trim().is_empty() {
            lines.push("NOTES:".into());
            lines.extend(notes.lines().map(str::to_string));
        }
        for line in lines {
            sink.emit(Event::Output { stream: crate::Stream::Stdout, line: cmd.redact_text(&line) });
        }
    }

    /// `helm history` and `helm status`; a release that does not exist is an empty state. Only
    /// [`Release::decide`] needs the status (the values of [`HelmSpec::same_as`]).
    async fn live(&self, sink: Option<&dyn EventSink>) -> Result<Live, Failure> {
        self.read(sink, Detail::Latest).await
    }

    /// `helm history` alone (no status): enough where only the revisions matter, before an
    /// upgrade and when settling what a helm command wrote.
    async fn history(&self, sink: Option<&dyn EventSink>) -> Result<Live, Failure> {
        self.read(sink, Detail::Revisions).await
    }

    /// helm's state from its records in the API ([`Release::records`]), or else from `helm
    /// history` (and `helm status` for [`Detail::Latest`]). A read that fails is what a failed
    /// `helm history` is: the step fails, the cluster is judged as the rollout's rules say.
    async fn read(&self, sink: Option<&dyn EventSink>, detail: Detail) -> Result<Live, Failure> {
        if let Some(records) = self.records().await {
            return read_records(records, detail)
                .await
                .map_err(|e| Failure::new(e.0).with_hint("check that the cluster is reachable"));
        }
        let with_status = detail == Detail::Latest;
        let history_cmd = self.reading(&["history", &self.spec.release, "-o", "json", "--max", "256"]);
        let Captured { outcome, stdout, stderr } =
            capture(&history_cmd, self.ctx, Some(QUICK), sink, StdoutLog::UnlessJson).await.map_err(Failure::from)?;
        if !outcome.success() {
            if state::is_not_found(&stderr) {
                return Ok(Live::default());
            }
            return Err(helm_failure(&history_cmd.display(), &outcome, &stderr)
                .with_hint("check that the cluster is reachable"));
        }
        let history = state::parse_history(&stdout.join("\n")).map_err(Failure::new)?;
        if !with_status {
            return Ok(Live { history, status: None });
        }
        let status_cmd = self.reading(&["status", &self.spec.release, "-o", "json"]);
        let Captured { outcome, stdout, stderr } =
            capture(&status_cmd, self.ctx, Some(QUICK), None, StdoutLog::UnlessJson).await.map_err(Failure::from)?;
        let status = if outcome.success() {
            Some(state::parse_status(&stdout.join("\n")).map_err(Failure::new)?)
        } else if state::is_not_found(&stderr) {
            None
        } else {
            return Err(helm_failure(&status_cmd.display(), &outcome, &stderr));
        };
        Ok(Live { history, status })
    }

    /// What `recover` should do, from helm's state. `proc` is where live helm processes are
    /// looked for (`/proc`; a test passes its own).
    fn decide(&self, live: &Live, proc: &Path) -> Decision {
        let Some(latest) = live.latest() else {
            return Decision::Upgrade { why: format!("release {} is not installed", self.spec.release) };
        };
        // `recover: rollback` upgrades after all when the stack already differs from the failed
        // (or stuck) revision: that difference is the fix, and rolling back first would only
        // cost a second recover.
        let (chart_same, values_same) = self.spec.same_as(self.ctx, live, latest);
        let fixed = chart_same == Some(false) || values_same == Some(false);
        let rollback_only = self.spec.recover_mode() == RecoverMode::Rollback && !fixed;
        let good = last_deployed(&live.history).map(|r| r.revision);
        if latest.is_pending() {
            let age = state::parse_rfc3339(&latest.updated)
                .map(|t| state::human_age(now_secs() - t))
                .map(|a| format!(" for {a}"))
                .unwrap_or_default();
            let stuck = format!(
                "release {} is stuck in {} at revision {}{age}",
                self.spec.release, latest.status, latest.revision
            );
            // Only the operator's `rdeploy recover --force` forces it (never an environment
            // variable, which a CI environment may export to every recover).
            let forced = self.ctx.force;
            let live_helm = state::live_helm_for(&self.spec.release, proc)
                .map(|(pid, cmdline)| (pid, self.spec.shown_text(&cmdline, self.ctx)));
            let unproven = match self.abandoned(latest, live_helm.as_ref()) {
                Ok(evidence) => {
                    let why = format!("{stuck}, abandoned: {evidence}");
                    return match good {
                        Some(to) => Decision::Rollback {
                            to,
                            why,
                            then_upgrade: !rollback_only,
                            abandoned: Some(latest.revision),
                        },
                        None => Decision::Reinstall { abandoned: latest.revision, why },
                    };
                }
                Err(missing) => missing,
            };
            if let Some((pid, cmdline)) = live_helm.filter(|_| !forced) {
                let mut failure = Failure::new(format!(
                    "{stuck}, and a helm process for it is still running (pid {pid}: `{cmdline}`)"
                ));
                failure.hint = Some(match good {
                    Some(good) => format!(
                        "let it finish, or stop it, then `rdeploy recover`; to roll back now anyway: `rdeploy recover --force` (runs `{}`)",
                        display_command(&self.spec.helm_words(self.spec.rollback_words(self.major, good, None)))
                    ),
                    None => "let it finish, or stop it, then `rdeploy recover`".into(),
                });
                return Decision::Refuse { failure };
            }
            // /proc only shows this machine: a helm on another runner may still be working on
            // a revision younger than helm's own timeout, so that is refused too.
            let window = self.ctx.timeout.unwrap_or(Duration::from_secs(300)).as_secs() as i64;
            let young = state::parse_rfc3339(&latest.updated).is_some_and(|t| now_secs() - t < window);
            if young && !forced {
                let mut failure = Failure::new(format!(
                    "{stuck}; it is younger than helm's timeout ({window}s), so a helm on another machine may still be working on it ({unproven})"
                ));
                failure.hint = Some(match good {
                    Some(_) => {
                        "wait for the timeout to pass, then `rdeploy recover`; `rdeploy recover --force` rolls back now"
                            .into()
                    }
                    None => format!(
                        "it was never deployed: wait for the timeout to pass and, if no helm anywhere is still installing it, uninstall it (`{}`), then `rdeploy recover` installs it again; `rdeploy recover --force` does both now",
                        display_command(&self.spec.helm_words(self.spec.uninstall_words(self.major, None)))
                    ),
                });
                return Decision::Refuse { failure };
            }
            return match good {
                Some(to) => Decision::Rollback {
                    to,
                    why: format!(
                        "{stuck}; no helm process for it is alive{}",
                        if forced { " (or forced)" } else { "" }
                    ),
                    then_upgrade: !rollback_only,
                    abandoned: None,
                },
                None if forced => Decision::Reinstall {
                    abandoned: latest.revision,
                    why: format!("{stuck} and was never deployed (forced)"),
                },
                None => Decision::Refuse {
                    failure: Failure::new(format!(
                        "{stuck}, and it has no deployed revision to roll back to ({unproven})"
                    ))
                    .with_hint(format!(
                        "if no helm anywhere is still installing it, uninstall the half-installed release, then `rdeploy recover` installs it again: `{}` (or `rdeploy recover --force` does both)",
                        display_command(&self.spec.helm_words(self.spec.uninstall_words(self.major, None)))
                    )),
                },
            };
        }
        match &latest.status {
            Status::Failed if rollback_only => match good {
                Some(to) => Decision::Rollback {
                    to,
                    why: format!("revision {} failed; `recover: rollback`", latest.revision),
                    then_upgrade: false,
                    abandoned: None,
                },
                None => Decision::Refuse {
                    failure: Failure::new(format!(
                        "revision {} of {} failed and no revision was ever deployed: there is nothing to roll back to",
                        latest.revision, self.spec.release
                    ))
                    .with_hint(format!(
                        "fix the cause and set `recover: upgrade`, or uninstall: `{}`",
                        display_command(&self.spec.helm_words(self.spec.uninstall_words(self.major, None)))
                    )),
                },
            },
            Status::Failed if self.spec.recover_mode() == RecoverMode::Rollback => Decision::Upgrade {
                why: format!(
                    "revision {} failed, and the stack now asks for other values or another chart: upgrading to them rather than rolling back",
                    latest.revision
                ),
            },
            Status::Failed => Decision::Upgrade { why: format!("revision {} failed: upgrade again", latest.revision) },
            Status::Deployed => {
                // Values it cannot compare are upgraded again (safe); an unknown chart version
                // is taken as the same.
                let chart_ok = chart_same != Some(false);
                if chart_ok && values_same == Some(true) {
                    Decision::InPlace { revision: latest.revision }
                } else {
                    Decision::Upgrade {
                        why: format!(
                            "revision {} is deployed with {}",
                            latest.revision,
                            if chart_ok { "other values" } else { "another chart version" }
                        ),
                    }
                }
            }
            other => Decision::Upgrade { why: format!("revision {} is {other}", latest.revision) },
        }
    }

    /// The evidence that the pending revision `latest` is abandoned, each piece a fact: the
    /// journal shows this deploy started that revision (its sub-change `release@N`, recorded as
    /// started before helm ran) and the run ended with it in flight (still `started`, or failed
    /// by a refused recover that saw it pending: the step's `pending_seen` fact), helm wrote the
    /// revision after that start record, the run that started it is dead (the driver took its
    /// lock over, or its pid on this host is gone), and no helm process names the release
    /// (`live_helm`, from the process table). `Err` names the first piece missing.
    fn abandoned(&self, latest: &Revision, live_helm: Option<&(u32, String)>) -> Result<String, String> {
        let id = self.spec.id(latest.revision);
        let Some(by) = self.ctx.started_by.get(&id) else {
            return Err(format!(
                "this deploy's journal does not show it starting revision {}, so another client may have",
                latest.revision
            ));
        };
        if !in_flight(by, latest.revision) {
            return Err(format!(
                "this deploy's journal records its revision {} failed, not left in flight, so helm may never have written it and another client may have",
                latest.revision
            ));
        }
        let written = state::parse_rfc3339(&latest.updated);
        if !matches!((written, by.started_at), (Some(w), Some(s)) if w >= s) {
            return Err(format!(
                "helm's revision {} is not known to be newer than this deploy's start of it, so another client may have written it",
                latest.revision
            ));
        }
        if !by.fate.is_dead() {
            return Err(format!("revision {} was started by {by}", latest.revision));
        }
        if let Some((pid, cmdline)) = live_helm {
            return Err(format!("a helm process for it is still running (pid {pid}: `{cmdline}`)"));
        }
        Ok(format!(
            "this deploy started revision {} in {by}, and no helm process for the release is alive",
            latest.revision
        ))
    }

    /// `helm uninstall` of a release that never reached deployed; then its history is empty.
    async fn uninstall(&self, sink: &dyn EventSink) -> Result<Live, Failure> {
        if self.ctx.cancel.is_cancelled() {
            return Err(Failure {
                interrupted: true,
                ..Failure::new(format!("stopped before `helm uninstall {}`", self.spec.release))
            });
        }
        let cmd = self.with_words(&|spec| spec.uninstall_words(self.major, Some(self.ctx)));
        let backstop = self.ctx.timeout.map(|t| t.saturating_add(BACKSTOP));
        let Captured { outcome, stderr, .. } =
            capture(&cmd, self.ctx, backstop, Some(sink), StdoutLog::UnlessJson).await.map_err(Failure::from)?;
        if !outcome.success() && !state::is_not_found(&stderr) {
            return Err(helm_failure(&cmd.display(), &outcome, &stderr)
                .with_hint("check the release with `helm status`, then `rdeploy recover`"));
        }
        self.history(Some(sink)).await
    }

    /// One `helm upgrade --install`, settled from history: the first new revision is ours.
    /// `-o json` (on the command rdeploy runs, not in the runbook) makes helm print the release
    /// it wrote; the outputs of that revision come from it ([`printed_outputs`]), `None` when
    /// helm printed no release for exactly that revision.
    async fn upgrade(&self, sink: &dyn EventSink, before: &Live) -> Result<Option<crate::outputs::Outputs>, Failure> {
        let words = |spec: &HelmSpec| {
            let mut words = spec.upgrade_words(self.major, Some(self.ctx));
            words.extend(["-o".to_string(), "json".to_string()]);
            words
        };
        let what = format!("`helm upgrade --install {}`", self.spec.release);
        let _secret_values = self.secret_values_file(SECRET_VALUES_FILE)?;
        let written = self.run_revision(sink, before, &words, &what, None).await?;
        Ok(printed_outputs(written.printed.as_ref(), &self.spec.release, written.revision))
    }

    async fn rollback(&self, sink: &dyn EventSink, before: &Live, to: u64) -> Result<Live, Failure> {
        let words = |spec: &HelmSpec| spec.rollback_words(self.major, to, Some(self.ctx));
        let what = format!("`helm rollback {} {to}`", self.spec.release);
        let namespace = self.spec.namespace.clone().unwrap_or_else(|| "default".into());
        self.run_revision(sink, before, &words, &what, Some(to))
            .await
            .map(|written| written.after)
            .map_err(|f| renamed_object_rollback(f, &namespace))
    }

    /// Runs a helm command that writes one revision, then reads the history again and settles
    /// the revision it wrote as Done (deployed) or Failed.
    async fn run_revision(
        &self,
        sink: &dyn EventSink,
        before: &Live,
        words: &(dyn Fn(&HelmSpec) -> Vec<String> + Sync),
        what: &str,
        rollback_to: Option<u64>,
    ) -> Result<Written, Failure> {
        if self.ctx.cancel.is_cancelled() {
            return Err(Failure { interrupted: true, ..Failure::new(format!("stopped before {what}")) });
        }
        let expected = before.next_revision();
        sink.emit(Event::Started { id: self.spec.id(expected) });
        // Nothing starts unless its start is recorded (the sink stops the step when it could not).
        if self.ctx.cancel.is_cancelled() {
            return Err(Failure { interrupted: true, ..Failure::new(format!("stopped before {what}")) });
        }
        let cmd = self.with_words(words);
        let backstop = self.ctx.timeout.map(|t| t.saturating_add(BACKSTOP));
        let Captured { outcome, stdout, stderr } =
            capture(&cmd, self.ctx, backstop, Some(sink), StdoutLog::UnlessJson).await.map_err(Failure::from)?;
        let printed = printed_json(&stdout);
        self.log_printed_release(sink, &cmd, printed.as_ref());
        // Read helm's state even after an interrupt: the revision may be written already.
        let last_before = before.latest().map_or(0, |r| r.revision);
        let after = match self.read(Some(sink), Detail::Since(last_before)).await {
            Ok(after) => after,
            Err(e) if outcome.interrupted => return Err(Failure { interrupted: true, ..e }),
            Err(e) => return Err(e),
        };
        self.spec.record_facts(&after, sink);
        let created: Vec<&Revision> = after.history.iter().filter(|r| r.revision > last_before).collect();
        let Some(ours) = created.first() else {
            // helm stopped before it wrote a revision (chart not found, cluster unreachable).
            let failure = helm_failure(&cmd.display(), &outcome, &stderr);
            if !outcome.interrupted {
                sink.emit(Event::Failed { id: self.spec.id(expected), error: failure.summary.clone() });
            }
            return Err(failure.with_hint(self.spec.failure_hint(&after)));
        };
        if ours.revision != expected {
            sink.emit(Event::Warning {
                message: format!(
                    "helm wrote revision {} (expected {expected}): another client changed the release",
                    ours.revision
                ),
            });
            sink.emit(Event::Pending {
                id: self.spec.id(expected),
                reason: format!("helm wrote revision {} instead", ours.revision),
            });
            sink.emit(Event::Started { id: self.spec.id(ours.revision) });
        }
        let id = self.spec.id(ours.revision);
        let newest = created.last().expect("non-empty");
        if ours.status == Status::Deployed && outcome.success() {
            let note = match rollback_to {
                Some(to) => format!("rollback to revision {to} deployed"),
                None => format!("revision {} deployed ({})", ours.revision, ours.chart),
            };
            sink.emit(Event::Done { id, note: Some(note) });
            return Ok(Written { revision: ours.revision, after, printed });
        }
        if ours.is_pending() && outcome.interrupted {
            // helm was stopped mid-way: the revision stays uncertain, recover reads helm's state.
            return Err(Failure::from_process(&cmd.display(), &outcome)
                .with_hint("`rdeploy recover` reads helm's state and resumes"));
        }
        let reason = if ours.description.is_empty() { ours.status.to_string() } else { ours.description.clone() };
        let mut error = match helm_panic(&stderr) {
            // The revision's status is only what the panic left behind; the cause is the panic.
            Some(panic) => format!("helm panicked: {panic} (revision {} left {})", ours.revision, ours.status),
            None => format!("revision {} {}: {reason}", ours.revision, ours.status),
        };
        if newest.revision != ours.revision {
            // --atomic / --rollback-on-failure rolled it back at once.
            error.push_str(&format!(" (then revision {}: {})", newest.revision, newest.description));
        }
        sink.emit(Event::Failed { id, error: error.clone() });
        let mut failure = helm_failure(&cmd.display(), &outcome, &stderr);
        failure.summary = format!("{what} failed: {error}");
        Err(failure.with_hint(self.spec.failure_hint(&after)))
    }
}

/// A `chart` that helm would not find, read as helm reads it: a path that exists is a chart
/// directory; `oci://` and other URLs are fetched; `./x` and `/x` are paths only; a bare `NAME`
/// is an error (helm wants `REPO/NAME` then); `REPO/NAME` is looked up in helm's repositories.
/// `REPO/NAME` is a problem only where `REPO` is also a directory beside the stack file and helm
/// knows no repository of that name: a local path with a typo, not a repository that a CI job
/// adds before `up`. A packaged chart ([`is_packaged_chart`]) that is not there yet is no
/// problem: an earlier step (`helm package`) may make it, and helm opens it when the step runs.
/// `repositories` gives the names of helm's repositories.
fn chart_problem(chart: &str, dir: &Path, repositories: &dyn Fn() -> Vec<String>) -> Option<SpecProblem> {
    if chart.contains("://") || chart.contains("${{") || chart.starts_with('.') || chart.starts_with('/') {
        // URLs are helm's to fetch; explicit paths are checked as referenced paths.
        return None;
    }
    let full = dir.join(chart);
    if full.exists() || is_packaged_chart(chart) {
        return None;
    }
    let at = vec![PathSegment::Key("chart")];
    let Some((repo, name)) = chart.split_once('/') else {
        return Some(SpecProblem {
            at,
            message: format!(
                "chart `{chart}` is neither a chart directory nor a packaged chart beside the stack file (looked for {})",
                full.display()
            ),
            hint: Some(
                "name a chart directory or `.tgz` relative to the stack file, a repository chart as `REPO/CHART`, or an `oci://` reference"
                    .into(),
            ),
        });
    };
    let parent = dir.join(repo);
    if !parent.is_dir() || repositories().iter().any(|r| r == repo) {
        return None;
    }
    // The directories beside the one meant, for a did-you-mean.
    let siblings: Vec<String> = std::fs::read_dir(&parent)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let siblings: Vec<&str> = siblings.iter().map(String::as_str).collect();
    let closest = crate::suggest(name, &siblings);
    let hint = match closest {
        Some(s) => format!("did you mean `{repo}/{s}`?"),
        None => {
            format!("name a chart directory relative to the stack file, or add the repository first (`helm repo add {repo} URL`)")
        }
    };
    Some(SpecProblem {
        at,
        message: format!(
            "chart `{chart}` is no directory beside the stack file (looked for {}), and helm knows no repository `{repo}` to read it from",
            full.display()
        ),
        hint: Some(hint),
    })
}

/// Whether `chart` names a packaged chart, however it is written (`web-0.1.0.tgz`,
/// `./web-0.1.0.tgz`, `dist/web-0.1.0.tar.gz`): a file that an earlier step (`helm package`)
/// may make, so one that is not there when the stack loads is no problem. A chart directory
/// that is not there is one.
fn is_packaged_chart(chart: &str) -> bool {
    !chart.contains("://") && (chart.ends_with(".tgz") || chart.ends_with(".tar.gz"))
}

/// The names of the repositories helm knows (`helm repo list`), read from its repository file
/// where helm reads it: `HELM_REPOSITORY_CONFIG`, else `repositories.yaml` in helm's
/// configuration directory. `env` reads the environment helm runs in (the step's `env` over
/// rdeploy's). None when there is no such file.
fn repository_names(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<String> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let config_home = || {
        var("HELM_CONFIG_HOME").or_else(|| var("XDG_CONFIG_HOME").map(|d| d.join("helm"))).or_else(|| {
            let home = var("HOME")?;
            Some(if cfg!(target_os = "macos") {
                home.join("Library/Preferences/helm")
            } else {
                home.join(".config/helm")
            })
        })
    };
    let Some(file) = var("HELM_REPOSITORY_CONFIG").or_else(|| config_home().map(|d| d.join("repositories.yaml")))
    else {
        return Vec::new();
    };
    let Ok(text) = std::fs::read_to_string(&file) else { return Vec::new() };
    let Ok(value) = crate::yaml::value(&text) else { return Vec::new() };
    value["repositories"]
        .as_array()
        .map(|repos| repos.iter().filter_map(|r| r["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

impl Adapter for HelmSpec {
    /// The release, chart, namespace, context, values files and `set` (secret by their name
    /// hidden).
    fn settings(&self, _stack_dir: &Path) -> Vec<(&'static str, crate::contract::Setting)> {
        use crate::contract::Setting;
        let mut out =
            vec![("release", Setting::Code(self.release.clone())), ("chart", Setting::Code(self.chart.clone()))];
        if let Some(ns) = &self.namespace {
            out.push(("namespace", Setting::Code(ns.clone())));
        }
        if let Some(c) = &self.context {
            out.push(("context", Setting::Code(c.clone())));
        }
        if !self.values.is_empty() {
            out.push(("values", Setting::List(self.values.iter().map(|p| p.display().to_string()).collect())));
        }
        let secret = self.set.keys().filter(|k| secrets::is_secret_key(k)).cloned().collect();
        out.push(("set", Setting::Values { values: self.set.clone(), secret }));
        out
    }

    fn kube_target(&self) -> Option<crate::contract::KubeTarget<'_>> {
        Some(crate::contract::KubeTarget {
            kubeconfig: self.kubeconfig.as_deref(),
            namespace: self.namespace.as_deref(),
        })
    }

    fn target_context(&mut self, context: &str) -> bool {
        self.context = Some(context.to_string());
        self.wait.get_or_insert(true);
        true
    }

    /// The release's workloads, in the context and namespace helm picks: the step's keys, else
    /// `HELM_KUBECONTEXT` and `HELM_NAMESPACE`.
    fn workloads(&self, ctx: &StepContext) -> Option<crate::contract::Workloads> {
        let env = |key: &str| ctx.env.get(key).cloned().or_else(|| std::env::var(key).ok()).filter(|v| !v.is_empty());
        Some(crate::contract::Workloads {
            context: self.context.clone().or_else(|| env("HELM_KUBECONTEXT")),
            namespace: self.namespace.clone().or_else(|| env("HELM_NAMESPACE")),
            wait: self.wait != Some(false),
            touched: crate::contract::Touched::Release { name: self.release.clone() },
        })
    }

    fn reapplies(&self) -> Option<&'static str> {
        Some("helm: a new revision only if the chart or values changed")
    }

    fn cluster_rollback(&self, ctx: Option<&StepContext>) -> Option<String> {
        // The user's kubeconfig as helm resolves it when running, as written in a runbook.
        let mut shown = self.shown().into_owned();
        shown.kubeconfig = shown.kubeconfig_arg(ctx);
        // helm 3's flags: its bare `--wait` is helm 4's `--wait=watcher` too.
        let (history, rollback) = shown.rollback_by_hand(3);
        Some(format!("`{history}` names its last deployed revision, then `{rollback}`"))
    }

    fn problems(&self) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        let valid = |s: &str| {
            !s.is_empty()
                && s.len() <= 53
                && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if !valid(&self.release) {
            problems.push(SpecProblem {
                at: vec![PathSegment::Key("release")],
                message: format!("`{}` is not a valid helm release name", self.release),
                hint: Some("use at most 53 lower-case letters, digits and `-`".into()),
            });
        }
        for (i, key) in self.set.keys().enumerate() {
            if key.trim().is_empty() || key.contains('=') {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key("set"), PathSegment::Index(i)],
                    message: format!("`{key}` is not a value path"),
                    hint: Some("write dotted paths such as `image.tag`".into()),
                });
            }
        }
        problems
    }

    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        let mut paths: Vec<(FieldPath, PathBuf)> = self
            .values
            .iter()
            .enumerate()
            .map(|(i, p)| (vec![PathSegment::Key("values"), PathSegment::Index(i)], p.clone()))
            .collect();
        // A packaged chart may be made by an earlier step: `chart_problem` leaves it to helm.
        if self.is_local_chart() && !is_packaged_chart(&self.chart) {
            paths.push((vec![PathSegment::Key("chart")], PathBuf::from(&self.chart)));
        }
        if let Some(k) = &self.kubeconfig {
            paths.push((vec![PathSegment::Key("kubeconfig")], k.clone()));
        }
        paths
    }

    fn problems_beside(&self, dir: &Path, env: &BTreeMap<String, String>) -> Vec<SpecProblem> {
        let env = |key: &str| env.get(key).map(OsString::from).or_else(|| std::env::var_os(key));
        chart_problem(&self.chart, dir, &|| repository_names(&env)).into_iter().collect()
    }

    async fn preflight(&self, ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        let release = Release::open(self, ctx).await?;
        if !self.chart.contains("://") {
            crate::inputs::chart_dependencies(&ctx.resolve(Path::new(&self.chart)))?;
        }
        Ok(ToolInfo { binary: release.binary, version: release.version })
    }

    async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        let release = Release::open(self, ctx).await?;
        let before = release.history(Some(sink)).await?;
        if let Some(latest) = before.latest().filter(|r| r.is_pending()) {
            // helm itself would refuse ("another operation is in progress"); say why plainly.
            let id = self.id(before.next_revision());
            sink.emit(Event::Planned { ids: vec![id.clone()] });
            let error =
                format!("release {} is stuck in {} at revision {}", self.release, latest.status, latest.revision);
            sink.emit(Event::Failed { id, error: error.clone() });
            // Not this deploy's revision: recover acts only once no helm for it is alive and it is
            // older than helm's timeout, or when forced.
            let hint = match last_deployed(&before.history) {
                Some(good) => format!(
                    "`rdeploy recover` rolls it back to revision {} once no helm process for it is alive and it is older than helm's timeout; `rdeploy recover --force` does it now",
                    good.revision
                ),
                None => format!(
                    "it was never deployed: if no helm anywhere is still installing it, `rdeploy recover --force` uninstalls it and installs it again (`{}`)",
                    display_command(&self.helm_words(self.uninstall_words(4, None)))
                ),
            };
            return Err(Failure::new(error).with_hint(hint));
        }
        sink.emit(Event::Planned { ids: vec![self.id(before.next_revision())] });
        let printed = release.upgrade(sink, &before).await?;
        release.report_outputs(sink, printed).await
    }

    async fn recover(&self, ctx: &StepContext, prior: &PriorStep, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        let recording = LastDone { inner: sink, seen: Default::default() };
        let result = self.recover_release(ctx, &recording).await;
        let (last, settled) = recording.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let (Ok(Recovered::Complete), Some(done)) = (&result, last) {
            // The revisions this deploy wrote that failed are superseded by the one now
            // deployed: the release is one thing in place, not a done revision beside a failed
            // one (a report that says complete with a failed sub-change, a CI summary counting
            // one failure). An abandoned revision this recover settled keeps its own record.
            let superseded = prior
                .sub_changes
                .iter()
                .filter(|s| s.status == SubStatus::Failed && s.id != done && !settled.contains(&s.id));
            for old in superseded {
                if old.id.rsplit_once('@').is_some_and(|(r, _)| r == self.release) {
                    sink.emit(Event::Moved { from: old.id.clone(), to: done.clone() });
                }
            }
        }
        result
    }

    async fn inspect(&self, ctx: &StepContext, _prior: &PriorStep) -> Result<Inspection, Failure> {
        let release = Release::open(self, ctx).await?;
        let major = release.major;
        let live = release.live(None).await?;
        let mut inspection = Inspection::default();
        if let Some(latest) = live.latest() {
            inspection.actions.push(format!(
                "helm: {} is at revision {} ({}: {}){}",
                self.release,
                latest.revision,
                latest.status,
                latest.description,
                last_deployed(&live.history)
                    .map(|r| format!("; last deployed revision {}", r.revision))
                    .unwrap_or_default()
            ));
        }
        // The commands as the user would type them (never a fleet cluster's own kubeconfig).
        let shown = self.shown();
        let upgrade = display_command(&shown.helm_words(shown.upgrade_words(major, Some(ctx))));
        match release.decide(&live, Path::new("/proc")) {
            Decision::InPlace { revision } => {
                inspection.actions.push(format!("keep {}: deployed at the wanted chart and values", self.id(revision)))
            }
            Decision::Upgrade { why } => {
                inspection.actions.push(format!("{why}: `{upgrade}`"));
                inspection.remaining.push(self.id(live.next_revision()));
            }
            Decision::Reinstall { why, .. } => {
                inspection.actions.push(format!(
                    "{why}: `{}`",
                    display_command(&shown.helm_words(shown.uninstall_words(major, Some(ctx))))
                ));
                inspection.actions.push(format!("then install it again: `{upgrade}`"));
                inspection.remaining.push(self.id(1));
            }
            Decision::Rollback { to, why, then_upgrade, .. } => {
                inspection.actions.push(format!(
                    "{why}: `{}`",
                    display_command(&shown.helm_words(shown.rollback_words(major, to, Some(ctx))))
                ));
                inspection.remaining.push(self.id(live.next_revision()));
                if then_upgrade {
                    inspection.actions.push(format!("then upgrade to the stack's values: `{upgrade}`"));
                    inspection.remaining.push(self.id(live.next_revision() + 1));
                }
            }
            Decision::Refuse { failure } => {
                inspection.actions.push(format!("cannot recover now: {}", failure.summary));
                if let Some(hint) = failure.hint {
                    inspection.actions.push(format!("hint: {hint}"));
                }
            }
        }
        Ok(inspection)
    }

    async fn preview(&self, ctx: &StepContext) -> Result<Preview, crate::preview::PreviewError> {
        self.preview_release(ctx).await
    }

    /// `up`'s decision: the same verdict as [`HelmSpec::preview_release`], without the dry-run
    /// when the release's record already says it is not in place (absent, not deployed, made
    /// from another chart): then the upgrade is the only helm process.
    async fn decision_preview(&self, ctx: &StepContext) -> Result<Preview, crate::preview::PreviewError> {
        self.preview_release_to(ctx, preview::Depth::Decide).await
    }

    /// A release found in place is not upgraded ([`converge`]): its revision stays.
    async fn converge(&self, ctx: &StepContext, preview: &Preview, sink: &dyn EventSink) -> Result<(), Failure> {
        self.converge_release(ctx, preview, sink).await
    }

    /// The release's revision and the resourceVersion of each live object its manifest names, read again by the same read-only preview.
    async fn observe(&self, ctx: &StepContext) -> Result<Vec<crate::preview::Observed>, crate::preview::PreviewError> {
        Ok(self.preview_release(ctx).await?.observed)
    }

    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        let cd = format!("cd {}", shell_quote(ctx.stack_dir));
        let mut doc = RecoveryDoc::default();
        let mut status = vec!["status".to_string(), self.release.clone()];
        status.extend(self.cluster_args(None));
        let mut history = vec!["history".to_string(), self.release.clone()];
        history.extend(self.cluster_args(None));
        doc.inspect.push(display_command(&self.helm_words(status.clone())));
        doc.inspect.push(display_command(&self.helm_words(history)));
        doc.recover.push(format!("rdeploy recover {}", ctx.stack_file));
        let facts = prior.map(|p| &p.facts);
        let good = facts.and_then(|f| f.get("last_deployed_revision")).and_then(Value::as_u64);
        // The runbook is written without asking helm; flags are helm 4's where they differ.
        match good {
            Some(good) => doc.rollback.push(format!(
                "roll back by hand to revision {good}, the last deployed one the checkpoint recorded: `{}`",
                display_command(&self.helm_words(self.rollback_words(4, good, None)))
            )),
            // The checkpoint read the release's history and found no deployed revision (and
            // the revision it holds is not itself deployed).
            None if facts.is_some_and(|f| {
                f.contains_key("revision") && f.get("status").and_then(Value::as_str) != Some("deployed")
            }) =>
            {
                doc.rollback.push(format!(
                    "nothing to roll back to: no revision of `{}` was ever deployed; `{}` removes the failed install",
                    self.release,
                    display_command(&self.helm_words(self.uninstall_words(4, None)))
                ))
            }
            None => {
                let (history, rollback) = self.rollback_by_hand(4);
                doc.rollback.push(format!(
                    "roll back by hand: `{rollback}`, REVISION being the last `deployed` one in `{history}` (never \"previous\", which may be a failed revision)"
                ));
            }
        }
        doc.notes.push(format!(
            "upgrade again by hand: `{cd} && {}`",
            display_command(&self.helm_words(self.upgrade_words(4, None)))
        ));
        doc.notes.push(format!(
            "a release stuck in pending-install/upgrade/rollback that this deploy started, whose run died, and for which no helm process is alive, is recovered by `rdeploy recover` at once: rolled back to the last deployed revision, or uninstalled and installed again if it was never deployed; any other pending release only when no helm process for it is alive and the pending revision is older than helm's timeout; `rdeploy recover {} --force` forces it",
            ctx.stack_file
        ));
        if self.recover_mode() == RecoverMode::Rollback {
            doc.notes.push(
                "`recover: rollback`: `rdeploy recover` rolls a failed release back to its last deployed revision and marks the step reverted (exit 3); steps that need it wait, and the next `rdeploy recover` upgrades once the cause is fixed. If the stack already asks for other values or another chart than the failed revision (the fix), recover upgrades to them at once".into(),
            );
        }
        if let Some(status) = prior.and_then(|p| p.facts.get("status")).and_then(Value::as_str) {
            let revision = prior.and_then(|p| p.facts.get("revision")).and_then(Value::as_u64).unwrap_or(0);
            doc.notes.push(format!("recorded: revision {revision} is {status}"));
        }
        doc.verify.push(display_command(&self.helm_words(status)));
        doc
    }

    fn typed_values_mut(&mut self) -> Option<(&'static str, &mut BTreeMap<String, serde_json::Value>)> {
        Some((TYPED_KEY, &mut self.set))
    }

    fn typed_values_key(&self) -> Option<&'static str> {
        Some(TYPED_KEY)
    }

    /// Besides the values files: a local chart. `repo/chart` and a local `charts/web` look
    /// alike; helm takes a path that exists.
    fn pinned_paths(&self, stack_dir: &Path, _revert: Option<&str>) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = self
            .referenced_paths()
            .into_iter()
            .filter(|(at, _)| !matches!(at.first(), Some(PathSegment::Key("kubeconfig"))))
            .map(|(_, path)| path)
            .collect();
        if !self.chart.contains("://") && stack_dir.join(&self.chart).exists() {
            paths.push(PathBuf::from(&self.chart));
        }
        paths
    }

    fn marked_mut(&mut self) -> Option<&mut BTreeMap<String, crate::secrets::Marked>> {
        Some(&mut self.marked)
    }

    fn own_context(&self) -> Option<&str> {
        self.context.as_deref()
    }
}

/// helm's state from its records: the revisions from their labels, and the ones `detail` names
/// from their bodies (a record pruned between the two reads keeps its labels' facts).
async fn read_records(records: &records::Records, detail: Detail) -> Result<Live, records::ReadError> {
    let mut history = records.revisions().await?;
    let full: Vec<u64> = match detail {
        Detail::Revisions => Vec::new(),
        Detail::Since(last) => history.iter().filter(|r| r.revision > last).map(|r| r.revision).collect(),
        Detail::Latest => history.last().map(|r| r.revision).into_iter().collect(),
    };
    let mut status = None;
    for revision in full {
        let Some(record) = records.record(revision).await? else { continue };
        if let Some(slot) = history.iter_mut().find(|r| r.revision == revision) {
            *slot = record.revision;
        }
        if detail == Detail::Latest {
            status = Some(record.status);
        }
    }
    Ok(Live { history, status })
}

/// What a helm command that wrote a revision left: the history read after it, the revision
/// settled as ours (deployed), and the JSON helm printed (the release, for `upgrade -o json`).
struct Written {
    after: Live,
    revision: u64,
    printed: Option<Value>,
}

/// The JSON document a helm command printed on stdout (`upgrade --install -o json`: helm 3 and 4
/// print the release they wrote, on success), read once for the log and the outputs.
fn printed_json(stdout: &[String]) -> Option<Value> {
    if !stdout.first().is_some_and(|l| l.starts_with('{')) {
        return None;
    }
    serde_json::from_str(&stdout.join("\n")).ok()
}

/// The printed release when it is `release` at `revision`.
fn printed_release<'a>(printed: Option<&'a Value>, release: &str, revision: u64) -> Option<&'a Value> {
    let printed = printed?;
    let exact = printed.get("name").and_then(Value::as_str) == Some(release)
        && printed.get("version").and_then(Value::as_u64) == Some(revision);
    exact.then_some(printed)
}

/// The outputs `helm get metadata -o json` would give for the release `upgrade -o json`
/// printed, field by field from the same release record: `version` is the revision,
/// `info.status`, `chart.metadata.version` and `appVersion` (omitted when the chart has none,
/// which `get metadata` shows as ""), `namespace`. `None` unless it is `release` at `revision`.
fn printed_outputs(printed: Option<&Value>, release: &str, revision: u64) -> Option<crate::outputs::Outputs> {
    let printed = printed_release(printed, release, revision)?;
    let chart = printed.get("chart")?.get("metadata")?;
    let metadata = serde_json::json!({
        "revision": printed.get("version")?,
        "status": printed.get("info")?.get("status")?.as_str()?,
        "version": chart.get("version")?.as_str()?,
        "appVersion": chart.get("appVersion").and_then(Value::as_str).unwrap_or(""),
        "namespace": printed.get("namespace")?.as_str()?,
    });
    Some(release_outputs(&metadata))
}

/// A release's outputs from its `helm get metadata -o json`.
fn release_outputs(metadata: &Value) -> crate::outputs::Outputs {
    use crate::outputs::OutputValue::Plain;
    let field = |key: &str| metadata.get(key).cloned().unwrap_or(Value::Null);
    [
        ("revision", field("revision")),
        ("status", field("status")),
        ("chart_version", field("version")),
        ("app_version", field("appVersion")),
        ("namespace", field("namespace")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Plain(v)))
    .collect()
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// A failure naming helm's own `Error: …` line.
fn helm_failure(command: &str, outcome: &Outcome, stderr: &[String]) -> Failure {
    let mut failure = Failure::from_process(command, outcome);
    if let Some(message) = helm_error_message(stderr) {
        if !outcome.interrupted && !outcome.timed_out {
            failure.summary = format!("`{command}` {}: {message}", outcome.describe_status());
        }
    }
    failure
}

/// helm 3 cannot roll back a failed upgrade that renamed or removed an object while the old one
/// is still live ("no ConfigMap with the name "x" found", helm/helm#13437): say why, and the two
/// ways out, instead of a bare failure.
fn renamed_object_rollback(mut failure: Failure, namespace: &str) -> Failure {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| regex::Regex::new(r#"no (\w+) with the name "([^"]+)" found"#).expect("regex"));
    let text =
        std::iter::once(&failure.summary).chain(failure.stderr_tail.iter()).cloned().collect::<Vec<_>>().join("\n");
    let Some(caps) = re.captures(&text) else { return failure };
    let (kind, name) = (caps[1].to_string(), caps[2].to_string());
    failure.summary = format!(
        "{}; helm 3 cannot roll back over an object the failed upgrade renamed or removed while the old {kind} `{name}` is still live (helm/helm#13437)",
        failure.summary
    );
    failure.hint = Some(format!(
        "upgrade forward instead: fix the cause, drop `recover: rollback` from the step and `rdeploy recover` (it upgrades); or delete the leftover object (`kubectl delete {} {name} -n {namespace}`) and `rdeploy recover` rolls back",
        kind.to_lowercase()
    ));
    failure
}

/// A Go panic's own message (`panic: ...`, before the goroutine frames), when helm panicked.
fn helm_panic(stderr: &[String]) -> Option<String> {
    let at = stderr.iter().position(|l| l.starts_with("panic: "))?;
    let mut message = stderr[at].trim_start_matches("panic: ").trim().to_string();
    // `[signal SIGSEGV: segmentation violation ...]` says what the runtime caught.
    if let Some(signal) = stderr.get(at + 1).filter(|l| l.starts_with("[signal ")) {
        message = format!("{message} {}", signal.trim());
    }
    Some(message)
}

/// helm's first error, complete: a panic's message, or the last `Error:` line; a line that ends
/// in `:` (a schema error's header) takes the lines after it up to the first `- ` item, so the
/// summary names the chart and the value at fault.
fn helm_error_message(stderr: &[String]) -> Option<String> {
    if let Some(panic) = helm_panic(stderr) {
        return Some(format!("helm panicked: {panic}"));
    }
    let at = stderr.iter().rposition(|l| l.starts_with("Error:"))?;
    let mut message = stderr[at].trim_start_matches("Error:").trim().to_string();
    if message.ends_with(':') {
        for line in stderr[at + 1..].iter().map(|l| l.trim()).take_while(|l| !l.is_empty()) {
            message = format!("{message} {line}");
            if line.starts_with("- ") {
                break;
            }
        }
    }
    Some(message)
}

/// The file `up`'s helm calls read the stack's secret `set` values from (0600, deleted after).
const SECRET_VALUES_FILE: &str = "secret-values.json";
/// The same for `rdeploy plan`'s dry-run: its own name, so that a plan run during `up` never
/// overwrites or deletes the file up's helm is reading.
const PREVIEW_SECRET_VALUES_FILE: &str = "preview-secret-values.json";

/// Where one helm call reads the stack's secret `set` values from (0600, deleted after).
fn secret_values_path(ctx: &StepContext, name: &str) -> PathBuf {
    ctx.work_dir.join(name)
}

/// Passes events on, keeping the id of the last sub-change settled Done and those settled
/// Pending (an abandoned revision).
struct LastDone<'a> {
    inner: &'a dyn EventSink,
    seen: std::sync::Mutex<(Option<String>, Vec<String>)>,
}

impl EventSink for LastDone<'_> {
    fn emit(&self, event: Event) {
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            match &event {
                Event::Done { id, .. } => seen.0 = Some(id.clone()),
                Event::Pending { id, .. } => seen.1.push(id.clone()),
                _ => {}
            }
        }
        self.inner.emit(event);
    }
}

impl HelmSpec {
    /// `recover` proper: reads helm's state and resumes the release as [`Release::decide`] says.
    async fn recover_release(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        let release = Release::open(self, ctx).await?;
        let live = release.live(Some(sink)).await?;
        self.record_facts(&live, sink);
        match release.decide(&live, Path::new("/proc")) {
            Decision::InPlace { revision } => {
                let id = self.id(revision);
                sink.emit(Event::Planned { ids: vec![id.clone()] });
                sink.emit(Event::Done { id, note: Some("already deployed at the wanted chart and values".into()) });
                release.report_outputs(sink, None).await?;
                Ok(Recovered::Complete)
            }
            Decision::Upgrade { why } => {
                sink.emit(Event::Planned { ids: vec![self.id(live.next_revision())] });
                sink.emit(Event::Warning { message: format!("{why}; running `helm upgrade --install`") });
                let printed = release.upgrade(sink, &live).await?;
                release.report_outputs(sink, printed).await?;
                Ok(Recovered::Complete)
            }
            Decision::Rollback { to, why, then_upgrade, abandoned } => {
                let mut ids = vec![self.id(live.next_revision())];
                if then_upgrade {
                    ids.push(self.id(live.next_revision() + 1));
                }
                sink.emit(Event::Planned { ids });
                sink.emit(Event::Warning { message: format!("{why}; rolling back to revision {to}") });
                let after = release.rollback(sink, &live, to).await?;
                if let Some(abandoned) = abandoned {
                    self.settle_abandoned(sink, &live, abandoned, &format!("rolled back to revision {to}"));
                }
                if then_upgrade {
                    let printed = release.upgrade(sink, &after).await?;
                    release.report_outputs(sink, printed).await?;
                    Ok(Recovered::Complete)
                } else {
                    sink.emit(Event::Warning {
                        message: format!(
                            "`recover: rollback`: {} runs revision {to}'s chart and values again, not the stack's; `rdeploy recover` upgrades to them once the cause is fixed",
                            self.release
                        ),
                    });
                    Ok(Recovered::RolledBack { to: format!("{} revision {to}", self.release) })
                }
            }
            Decision::Reinstall { abandoned, why } => {
                sink.emit(Event::Warning { message: format!("{why}; uninstalling it, then installing it again") });
                let after = release.uninstall(sink).await?;
                self.settle_abandoned(sink, &live, abandoned, "uninstalled");
                sink.emit(Event::Planned { ids: vec![self.id(after.next_revision())] });
                release.upgrade(sink, &after).await.map(|_| Recovered::Complete)
            }
            Decision::Refuse { failure } => {
                if let Some(latest) = live.latest() {
                    // The failed record below hides that the sub-change was in flight: a fact
                    // keeps it, so a later recover can still take the revision for abandoned.
                    let seen = ctx.started_by.get(&self.id(latest.revision));
                    if latest.is_pending() && seen.is_some_and(|by| in_flight(by, latest.revision)) {
                        sink.emit(Event::Fact { key: "pending_seen".into(), value: latest.revision.into() });
                    }
                    sink.emit(Event::Planned { ids: vec![self.id(latest.revision)] });
                    sink.emit(Event::Failed { id: self.id(latest.revision), error: failure.summary.clone() });
                }
                Err(failure)
            }
        }
    }
}

#[cfg(test)]
mod tests {

    /// `REPO/NAME` beside a directory `REPO` is a typo only when helm knows no repository of
    /// that name: helm tries the path first, then the repository.
    #[test]
    fn a_repository_of_the_same_name_makes_a_chart_reference_helms() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("charts/web")).unwrap();
        let none = || Vec::new();
        let charts = || vec!["charts".to_string()];
        let p = chart_problem("charts/webb", dir.path(), &none).unwrap();
        assert_eq!(p.hint.as_deref(), Some("did you mean `charts/web`?"));
        assert!(chart_problem("charts/webb", dir.path(), &charts).is_none());
        assert!(chart_problem("charts/web", dir.path(), &none).is_none());
        let p = chart_problem("charts/other", dir.path(), &none).unwrap();
        assert!(p.hint.unwrap().contains("helm repo add charts URL"));
    }
    use super::*;

    /// A bare `NAME.tgz` may be packaged by an earlier step (`helm package`): it is helm's to
    /// open when the step runs. Any other bare name that is not there is a problem, said as such.
    #[test]
    fn a_packaged_chart_an_earlier_step_makes_is_no_problem() {
        let dir = tempfile::tempdir().unwrap();
        let none = || Vec::new();
        assert!(chart_problem("web-0.1.0.tgz", dir.path(), &none).is_none());
        assert!(chart_problem("web-0.1.0.tar.gz", dir.path(), &none).is_none());
        let p = chart_problem("web", dir.path(), &none).unwrap();
        assert_eq!(
            p.message,
            format!(
                "chart `web` is neither a chart directory nor a packaged chart beside the stack file (looked for {})",
                dir.path().join("web").display()
            )
        );
    }

    /// A packaged chart is no problem when the stack loads however its path is written
    /// (`./NAME.tgz`, `dist/NAME.tgz` beside a directory `dist`): an earlier step may package
    /// it, as it may a bare `NAME.tgz`. A chart directory written as a path must be there.
    #[test]
    fn a_packaged_chart_written_as_a_path_may_be_made_by_an_earlier_step() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dist")).unwrap();
        let none = || Vec::new();
        for chart in ["./web-0.1.0.tgz", "./dist/web-0.1.0.tar.gz", "dist/web-0.1.0.tgz"] {
            let spec = HelmSpec { chart: chart.into(), ..spec() };
            let chart_path = spec.referenced_paths().into_iter().find(|(at, _)| *at == [PathSegment::Key("chart")]);
            assert_eq!(chart_path, None, "{chart}");
            assert!(chart_problem(chart, dir.path(), &none).is_none(), "{chart}");
        }
        let spec = HelmSpec { chart: "./charts/web".into(), ..spec() };
        let chart_path = spec.referenced_paths().into_iter().find(|(at, _)| *at == [PathSegment::Key("chart")]);
        assert_eq!(chart_path.map(|(_, path)| path), Some(PathBuf::from("./charts/web")));
        assert!(chart_problem("dist/web", dir.path(), &none).is_some());
    }

    /// helm reads its repository file in the environment the step gives it: the step's `env`
    /// (`HELM_REPOSITORY_CONFIG`, `HELM_CONFIG_HOME`) over rdeploy's.
    #[test]
    fn helms_repositories_are_read_in_the_steps_environment() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("charts/web")).unwrap();
        let config = dir.path().join("helm-config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("repositories.yaml"), "repositories:\n- name: charts\n  url: https://example.com\n")
            .unwrap();
        let spec = HelmSpec { chart: "charts/webb".into(), ..spec() };
        let file = config.join("repositories.yaml").to_string_lossy().into_owned();
        let home = config.to_string_lossy().into_owned();
        assert_eq!(spec.problems_beside(dir.path(), &BTreeMap::new()).len(), 1);
        for env in [
            BTreeMap::from([("HELM_REPOSITORY_CONFIG".to_string(), file)]),
            BTreeMap::from([("HELM_CONFIG_HOME".to_string(), home)]),
        ] {
            assert!(spec.problems_beside(dir.path(), &env).is_empty(), "{env:?}");
        }
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn a_panic_is_summarised_by_its_message_not_its_frames() {
        let stderr = lines(
            "panic: runtime error: invalid memory address or nil pointer dereference\n[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x1d4c5a1]\n\ngoroutine 1 [running]:\nhelm.sh/helm/v3/pkg/action.(*Upgrade).performUpgrade(...)\n\t/home/runner/work/helm/pkg/action/upgrade.go:353 +0x121\n",
        );
        assert_eq!(
            helm_error_message(&stderr).as_deref(),
            Some("helm panicked: runtime error: invalid memory address or nil pointer dereference [signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x1d4c5a1]")
        );
    }

    #[test]
    fn a_schema_error_keeps_its_first_complete_message() {
        let stderr = lines(
            "Error: INSTALLATION FAILED: values don't meet the specifications of the schema(s) in the following chart(s):\ntoggles:\n- at '/replicaCount': got string, want integer\n- at '/port': got string, want integer\n",
        );
        assert_eq!(
            helm_error_message(&stderr).as_deref(),
            Some("INSTALLATION FAILED: values don't meet the specifications of the schema(s) in the following chart(s): toggles: - at '/replicaCount': got string, want integer")
        );
        assert_eq!(helm_error_message(&lines("Error: UPGRADE FAILED: boom")).as_deref(), Some("UPGRADE FAILED: boom"));
    }
    use crate::{RunFate, StartedBy};

    fn spec() -> HelmSpec {
        HelmSpec {
            marked: Default::default(),
            release: "web".into(),
            chart: "charts/webapp".into(),
            namespace: Some("shop".into()),
            values: vec!["values/prod.yaml".into()],
            set: BTreeMap::from([("image.tag".to_string(), serde_json::json!("1.4.2"))]),
            version: None,
            context: Some("c1".into()),
            kubeconfig: None,
            cluster_kubeconfig: None,
            wait: Some(true),
            atomic: Some(true),
            force: None,
            binary: None,
            recover: None,
        }
    }

    fn ctx() -> StepContext {
        StepContext {
            step: "app".into(),
            stack: "t".into(),
            work_dir: "/nonexistent/w".into(),
            timeout: Some(Duration::from_secs(90)),
            ..crate::testing::step_context(Path::new("/nonexistent"))
        }
    }

    /// A wrapper around the real helm `major` at `dir/helm` that appends its first argument to
    /// `dir/calls`; `tag` makes a different file of it.
    fn counting_helm(dir: &Path, major: u32, tag: &str) -> PathBuf {
        let real = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tools/helm{major}/helm"));
        assert!(real.is_file(), "helm {major} is missing at {} (scripts/fetch-helm.sh)", real.display());
        let wrapper = dir.join("helm");
        let _ = std::fs::remove_file(&wrapper);
        let script = format!(
            "#!/bin/sh\n# {tag}\necho \"$1\" >> '{}'\nexec '{}' \"$@\"\n",
            dir.join("calls").display(),
            real.display()
        );
        std::fs::write(&wrapper, script).unwrap();
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        wrapper
    }

    #[tokio::test]
    async fn helm_version_is_asked_once_per_binary_and_again_when_it_is_replaced() {
        for major in [3, 4] {
            let dir = tempfile::tempdir().unwrap();
            let calls = || std::fs::read_to_string(dir.path().join("calls")).unwrap_or_default().lines().count();
            let wrapper = counting_helm(dir.path(), major, "first");
            let spec = HelmSpec { binary: Some(wrapper.to_string_lossy().into_owned()), ..spec() };
            let ctx = StepContext { stack_dir: dir.path().into(), work_dir: dir.path().into(), ..ctx() };
            let first = Release::open(&spec, &ctx).await.unwrap();
            let second = Release::open(&spec, &ctx).await.unwrap();
            assert_eq!((first.major, second.major), (major, major));
            assert!(first.version.starts_with(&format!("v{major}.")), "{}", first.version);
            assert_eq!(first.version, second.version);
            assert_eq!(calls(), 1, "helm {major}: the second open asks no helm");
            // Another binary at the same path (a new file: inode or modification time differ).
            let before = BinaryKey::of(&wrapper).unwrap();
            let mut n = 0;
            while BinaryKey::of(&wrapper).unwrap() == before {
                n += 1;
                counting_helm(dir.path(), major, &format!("replaced {n}"));
            }
            assert_eq!(Release::open(&spec, &ctx).await.unwrap().major, major);
            assert_eq!(calls(), 2, "helm {major}: a replaced binary is asked again");
        }
    }

    /// `helm upgrade --install -o json` as helm 3.17 and 4.1 printed it against kubesim (manifest
    /// shortened), and `helm get metadata -o json` of the same revision right after.
    #[test]
    fn the_printed_release_gives_the_outputs_of_get_metadata() {
        let cases = [
            (
                r#"{"name":"r3","info":{"first_deployed":"2026-12-01T17:44:54.711526059Z","last_deployed":"2026-12-01T17:44:57.087750867Z","deleted":"","description":"Upgrade complete","status":"deployed","notes":"hello notes\n"},"chart":{"metadata":{"name":"agent","version":"0.1.0","apiVersion":"v2","appVersion":"1.2.3"},"lock":null,"templates":[],"values":{"level":"info"},"schema":null,"files":[]},"config":{},"manifest":"---\n","version":2,"namespace":"ns3"}"#,
                r#"{"name":"r3","chart":"agent","version":"0.1.0","appVersion":"1.2.3","namespace":"ns3","revision":2,"status":"deployed","deployedAt":"2026-12-01T17:44:57Z"}"#,
                ("r3", 2),
            ),
            (
                r#"{"name":"b4","info":{"first_deployed":"2026-12-01T17:45:24.866714587Z","last_deployed":"2026-12-01T17:45:24.866714587Z","description":"Install complete","status":"deployed"},"chart":{"metadata":{"name":"bare","version":"2.0.0-rc.1","apiVersion":"v2"},"lock":null,"templates":[],"values":null,"schema":null,"files":[]},"config":{},"manifest":"---\n","version":1,"namespace":"ns4","apply_method":"ssa"}"#,
                r#"{"name":"b4","chart":"bare","version":"2.0.0-rc.1","appVersion":"","labels":{"modifiedAt":"1796147124","name":"b4","owner":"helm","status":"deployed","version":"1"},"namespace":"ns4","revision":1,"status":"deployed","deployedAt":"2026-12-01T17:45:24Z","applyMethod":"ssa"}"#,
                ("b4", 1),
            ),
        ];
        for (printed, metadata, (release, revision)) in cases {
            let metadata: Value = serde_json::from_str(metadata).unwrap();
            let printed = printed_json(&lines(printed));
            let printed = printed.as_ref();
            assert_eq!(printed_outputs(printed, release, revision), Some(release_outputs(&metadata)), "{release}");
            // Not exactly the step's revision, or not a release at all: `helm get metadata` instead.
            assert_eq!(printed_outputs(printed, release, revision + 1), None);
            assert_eq!(printed_outputs(printed, "other", revision), None);
            assert_eq!(
                printed_outputs(
                    printed_json(&lines("Release \"r3\" has been upgraded. Happy Helming!")).as_ref(),
                    release,
                    revision
                ),
                None
            );
            assert_eq!(printed_outputs(printed_json(&[]).as_ref(), release, revision), None);
        }
    }

    #[test]
    fn flags_follow_the_major_version() {
        let v3 = spec().upgrade_words(3, Some(&ctx())).join(" ");
        assert_eq!(
            v3,
            r#"upgrade --install web charts/webapp -n shop --kube-context c1 --create-namespace -f values/prod.yaml --set-json image.tag="1.4.2" --reset-values --atomic --wait --timeout=90s"#
        );
        let v4 = spec().upgrade_words(4, Some(&ctx())).join(" ");
        assert!(v4.contains("--rollback-on-failure --wait=watcher --timeout=90s"), "{v4}");
        let mut forced = spec();
        forced.force = Some(true);
        assert!(forced.upgrade_words(3, None).contains(&"--force".to_string()));
        assert!(forced.upgrade_words(4, None).contains(&"--force-replace".to_string()));
        assert_eq!(spec().rollback_words(3, 2, None).join(" "), "rollback web 2 -n shop --kube-context c1 --wait");
    }

    impl HelmSpec {
        /// Decides with an empty process table, so a helm running elsewhere on the machine
        /// (another test) cannot make a release look busy.
        fn decide_v4(&self, ctx: &StepContext, live: &Live) -> Decision {
            let no_processes = tempfile::tempdir().unwrap();
            self.decide_in(ctx, live, no_processes.path())
        }

        /// Decides with the process table under `proc` (a test's own `/proc`).
        fn decide_in(&self, ctx: &StepContext, live: &Live, proc: &Path) -> Decision {
            let release = Release { major: 4, ..Release::new(self, ctx, DEFAULT_BINARY.into()) };
            release.decide(live, proc)
        }
    }

    fn rev(revision: u64, status: &str) -> Revision {
        Revision {
            revision,
            updated: "2020-01-01T00:00:00Z".into(),
            status: status.into(),
            chart: "webapp-0.1.0".into(),
            app_version: String::new(),
            description: String::new(),
        }
    }

    #[test]
    fn secret_values_go_in_a_file_and_the_runbook_fills_them_in() {
        let mut spec = spec();
        spec.set.insert("serviceAccount.automountServiceAccountToken".into(), serde_json::json!(false));
        spec.set.insert("app.login".into(), serde_json::json!("s3cr3t-login"));
        spec.marked.insert("app.login".into(), crate::secrets::Marked::inline(serde_json::json!("s3cr3t-login")));
        spec.marked.insert("db.password".into(), crate::secrets::Marked::from_env("DB_PASSWORD"));
        let run = spec.upgrade_words(4, Some(&ctx())).join(" ");
        assert!(!run.contains("s3cr3t") && !run.contains("app.login"), "{run}");
        assert!(run.contains("-f /nonexistent/w/secret-values.json"), "{run}");
        // A boolean under a secret-sounding key is a setting: it stays on the command line.
        assert!(run.contains("--set-json serviceAccount.automountServiceAccountToken=false"), "{run}");
        let runbook = spec.upgrade_words(4, None).join(" ");
        assert!(
            runbook.contains("--set-json app.login=***") && runbook.contains("--set-json db.password=***"),
            "{runbook}"
        );
        assert!(!runbook.contains("s3cr3t") && !runbook.contains("secret-values.json"), "{runbook}");
    }

    #[test]
    fn decisions_from_helm_state() {
        let s = spec();
        let live = |revs: Vec<Revision>| Live { history: revs, status: None };
        assert!(matches!(s.decide_v4(&ctx(), &live(vec![])), Decision::Upgrade { .. }));
        assert!(matches!(
            s.decide_v4(&ctx(), &live(vec![rev(1, "deployed"), rev(2, "failed")])),
            Decision::Upgrade { .. }
        ));
        let mut rb = spec();
        rb.recover = Some(RecoverMode::Rollback);
        assert_eq!(
            rb.decide_v4(&ctx(), &live(vec![rev(1, "superseded"), rev(2, "deployed"), rev(3, "failed")])),
            Decision::Rollback {
                to: 2,
                why: "revision 3 failed; `recover: rollback`".into(),
                then_upgrade: false,
                abandoned: None
            }
        );
        assert!(matches!(rb.decide_v4(&ctx(), &live(vec![rev(1, "failed")])), Decision::Refuse { .. }));
        // The stack already asks for other values than the failed revision has (the fix):
        // rollback mode upgrades to them; the same values as the failed revision roll back.
        let mut fixed = rb.clone();
        fixed.values.clear();
        fixed.set = BTreeMap::from([("color".to_string(), serde_json::json!("blue"))]);
        let failed_with = |color: &str| Live {
            history: vec![rev(1, "deployed"), rev(2, "failed")],
            status: Some(
                state::parse_status(&format!(
                    r#"{{"name":"web","version":2,"config":{{"color":"{color}"}},"info":{{"status":"failed"}}}}"#
                ))
                .unwrap(),
            ),
        };
        assert!(matches!(fixed.decide_v4(&ctx(), &failed_with("red")), Decision::Upgrade { .. }));
        assert!(matches!(fixed.decide_v4(&ctx(), &failed_with("blue")), Decision::Rollback { to: 1, .. }));

        // Stuck, and no helm process for `web` is alive (an empty process table).
        match s.decide_v4(&ctx(), &live(vec![rev(1, "deployed"), rev(2, "pending-upgrade")])) {
            Decision::Rollback { to: 1, why, then_upgrade: true, abandoned: None } => {
                assert!(why.starts_with("release web is stuck in pending-upgrade at revision 2 for "), "{why}")
            }
            other => panic!("{other:?}"),
        }
        match s.decide_v4(&ctx(), &live(vec![rev(1, "pending-install")])) {
            Decision::Refuse { failure } => assert!(
                failure.hint.unwrap().contains("helm uninstall web -n shop --kube-context c1"),
                "uninstall hint"
            ),
            other => panic!("{other:?}"),
        }
    }

    /// A revision younger than helm's timeout (stamped ahead of the clock), so without the
    /// evidence that it is abandoned recover refuses it.
    fn young(revision: u64, status: &str) -> Revision {
        Revision { updated: "2999-01-01T00:00:00Z".into(), ..rev(revision, status) }
    }

    fn started_by(fate: RunFate) -> StartedBy {
        StartedBy {
            run_id: "01RUN".into(),
            command: "up".into(),
            host: "here".into(),
            pid: 4242,
            fate,
            in_flight: true,
            started_at: Some(0),
            pending_seen: None,
        }
    }

    /// `ctx()` with the journal's record of who started sub-change `id`.
    fn ctx_started(id: &str, fate: RunFate) -> StepContext {
        let mut ctx = ctx();
        ctx.started_by.insert(id.into(), started_by(fate));
        ctx
    }

    /// An injected process table: `(pid, state, argv)` per process.
    fn proc_table(procs: &[(u32, char, &[&str])]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (pid, state, args) in procs {
            let dir = root.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("stat"), format!("{pid} (helm) {state} 1 {pid} {pid} 0 -1")).unwrap();
            let cmdline = if *state == 'Z' { String::new() } else { args.join("\0") + "\0" };
            std::fs::write(dir.join("cmdline"), cmdline).unwrap();
        }
        root
    }

    fn summary(decision: Decision) -> String {
        match decision {
            Decision::Refuse { failure } => format!("{} | hint: {}", failure.summary, failure.hint.unwrap_or_default()),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_abandoned_pending_upgrade_is_rolled_back_only_with_all_the_evidence() {
        let s = spec();
        let live = Live { history: vec![young(1, "deployed"), young(2, "pending-upgrade")], status: None };
        let helm_upgrading: &[&str] = &["/opt/helm", "upgrade", "--install", "web", "charts/webapp"];
        let empty = proc_table(&[]);
        let other_helm = proc_table(&[(70, 'S', &["/opt/helm", "upgrade", "api", "charts/api"])]);
        let zombie_helm = proc_table(&[(71, 'Z', helm_upgrading)]);
        let live_helm = proc_table(&[(72, 'S', helm_upgrading)]);

        // Complete evidence: the journal shows this deploy started web@2, the run that started
        // it is dead (lock taken over, or its pid gone), no live helm names the release (a
        // zombie is not alive; a helm for another release does not count).
        for fate in [RunFate::LockTakenOver, RunFate::DeadHere] {
            for table in [&empty, &other_helm, &zombie_helm] {
                match s.decide_in(&ctx_started("web@2", fate), &live, table.path()) {
                    Decision::Rollback { to: 1, then_upgrade: true, abandoned: Some(2), why } => {
                        assert!(
                            why.contains("abandoned: this deploy started revision 2 in `rdeploy up` (pid 4242"),
                            "{why}"
                        )
                    }
                    other => panic!("{fate:?}: {other:?}"),
                }
            }
        }
        // `recover: rollback` rolls back and stops there.
        let mut rb = spec();
        rb.recover = Some(RecoverMode::Rollback);
        assert!(matches!(
            rb.decide_in(&ctx_started("web@2", RunFate::LockTakenOver), &live, empty.path()),
            Decision::Rollback { to: 1, then_upgrade: false, abandoned: Some(2), .. }
        ));

        // Any piece missing: today's refusal (the revision is younger than helm's timeout), and
        // the summary names the missing piece.
        let refused = |ctx: StepContext, table: &tempfile::TempDir| summary(s.decide_in(&ctx, &live, table.path()));
        let no_record = refused(ctx(), &empty);
        assert!(no_record.contains("younger than helm's timeout"), "{no_record}");
        assert!(no_record.contains("this deploy's journal does not show it starting revision 2"), "{no_record}");
        // The journal records another revision (helm wrote 2 where this deploy expected 3).
        let other_revision = refused(ctx_started("web@3", RunFate::LockTakenOver), &empty);
        assert!(other_revision.contains("does not show it starting revision 2"), "{other_revision}");
        let alive = refused(ctx_started("web@2", RunFate::AliveHere), &empty);
        assert!(
            alive.contains("revision 2 was started by `rdeploy up` (pid 4242 on here), whose pid is still alive"),
            "{alive}"
        );
        let elsewhere = refused(ctx_started("web@2", RunFate::OtherHost), &empty);
        assert!(elsewhere.contains("on another host, which this one cannot check"), "{elsewhere}");
        let running = refused(ctx_started("web@2", RunFate::LockTakenOver), &live_helm);
        assert!(running.contains("a helm process for it is still running (pid 72: `/opt/helm upgrade"), "{running}");
        // A fleet cluster's helm runs with the cluster's own kubeconfig: the live process is
        // shown with the step's (resolved as helm resolves it), the cut file never named.
        let cut = "/state/steps/web/clusters/edge-1/kubeconfig";
        let fleet_helm = proc_table(&[(73, 'S', &["/opt/helm", "upgrade", "web", "--kubeconfig", cut])]);
        for (kubeconfig, shown) in [(Some("kube/fleet.yaml"), " --kubeconfig "), (None, "upgrade web`")] {
            let fleet =
                HelmSpec { cluster_kubeconfig: Some(cut.into()), kubeconfig: kubeconfig.map(PathBuf::from), ..spec() };
            let ctx = ctx_started("web@2", RunFate::LockTakenOver);
            let text = summary(fleet.decide_in(&ctx, &live, fleet_helm.path()));
            assert!(!text.contains(cut) && text.contains(shown), "{text}");
            if let Some(k) = kubeconfig {
                assert!(text.contains(&ctx.resolve(Path::new(k)).display().to_string()), "{text}");
            }
        }
        // Every refusal's hint ends in a `rdeploy recover` that can act once it is followed,
        // as the report's `next:` line says.
        for text in [&no_record, &other_revision, &alive, &elsewhere, &running] {
            assert!(text.contains("then `rdeploy recover`"), "{text}");
        }
    }

    #[test]
    fn a_pending_revision_is_abandoned_only_if_this_deploy_left_it_in_flight_before_helm_wrote_it() {
        let s = spec();
        let live = Live { history: vec![young(1, "deployed"), young(2, "pending-upgrade")], status: None };
        let empty = proc_table(&[]);
        let with = |in_flight: bool, started_at: Option<i64>, pending_seen: Option<u64>| {
            let mut ctx = ctx();
            let by = StartedBy { in_flight, started_at, pending_seen, ..started_by(RunFate::DeadHere) };
            ctx.started_by.insert("web@2".into(), by);
            ctx
        };
        // `up` journaled web@2 failed (helm never reached the cluster) and exited; another
        // client's helm then wrote revision 2 and is in --wait: refused, by the age window.
        let text = summary(s.decide_in(&with(false, Some(0), None), &live, empty.path()));
        assert!(text.contains("younger than helm's timeout"), "{text}");
        assert!(text.contains("journal records its revision 2 failed, not left in flight"), "{text}");
        // A `pending_seen` fact for another revision does not vouch for this one.
        let text = summary(s.decide_in(&with(false, Some(0), Some(1)), &live, empty.path()));
        assert!(text.contains("not left in flight"), "{text}");
        // Still started, its run dead, no live helm: rolled back.
        assert!(matches!(
            s.decide_in(&with(true, Some(0), None), &live, empty.path()),
            Decision::Rollback { to: 1, abandoned: Some(2), .. }
        ));
        // Failed by a refused recover that saw revision 2 pending (the `pending_seen` fact).
        assert!(matches!(
            s.decide_in(&with(false, Some(0), Some(2)), &live, empty.path()),
            Decision::Rollback { to: 1, abandoned: Some(2), .. }
        ));
        // Helm's revision older than this deploy's start record (or no start time): not ours,
        // so today's refusal while young, and past helm's timeout the plain rollback that does
        // not claim it abandoned.
        let text = summary(s.decide_in(&with(true, Some(i64::MAX), None), &live, empty.path()));
        assert!(text.contains("younger than helm's timeout"), "{text}");
        assert!(text.contains("revision 2 is not known to be newer than this deploy's start of it"), "{text}");
        let older = Live { history: vec![rev(1, "deployed"), rev(2, "pending-upgrade")], status: None };
        let started_later = state::parse_rfc3339("2020-01-01T00:00:01Z");
        assert!(matches!(
            s.decide_in(&with(true, started_later, None), &older, empty.path()),
            Decision::Rollback { to: 1, abandoned: None, .. }
        ));
        assert!(matches!(
            s.decide_in(&with(true, Some(0), None), &older, empty.path()),
            Decision::Rollback { to: 1, abandoned: Some(2), .. }
        ));
        let text = summary(s.decide_in(&with(true, None, None), &live, empty.path()));
        assert!(text.contains("not known to be newer"), "{text}");
    }

    #[test]
    fn an_abandoned_pending_install_is_uninstalled_and_installed_again_only_with_all_the_evidence() {
        let s = spec();
        let live = Live { history: vec![young(1, "pending-install")], status: None };
        let empty = proc_table(&[]);
        let live_helm = proc_table(&[(80, 'R', &["helm", "install", "web", "charts/webapp"])]);
        for fate in [RunFate::LockTakenOver, RunFate::DeadHere] {
            match s.decide_in(&ctx_started("web@1", fate), &live, empty.path()) {
                Decision::Reinstall { abandoned: 1, why } => {
                    assert!(why.starts_with("release web is stuck in pending-install at revision 1 for "), "{why}")
                }
                other => panic!("{other:?}"),
            }
        }
        // A pending upgrade of a release that never reached deployed is reinstalled too: there
        // is nothing to roll back to.
        let never_deployed = Live { history: vec![young(1, "failed"), young(2, "pending-upgrade")], status: None };
        assert!(matches!(
            s.decide_in(&ctx_started("web@2", RunFate::DeadHere), &never_deployed, empty.path()),
            Decision::Reinstall { abandoned: 2, .. }
        ));
        // Missing evidence: refused, with the uninstall command (a live helm refuses first).
        for (ctx, table, missing) in [
            (ctx(), &empty, "does not show it starting revision 1"),
            (ctx_started("web@1", RunFate::AliveHere), &empty, "whose pid is still alive"),
            (ctx_started("web@1", RunFate::OtherHost), &empty, "on another host"),
            (
                ctx_started("web@1", RunFate::LockTakenOver),
                &live_helm,
                "a helm process for it is still running (pid 80",
            ),
        ] {
            let text = summary(s.decide_in(&ctx, &live, table.path()));
            assert!(text.contains(missing), "{text}");
            if !text.contains("is still running") {
                assert!(text.contains("younger than helm's timeout"), "{text}");
                assert!(text.contains("(`helm uninstall web -n shop --kube-context c1`)"), "{text}");
                assert!(text.contains("then `rdeploy recover` installs it again"), "{text}");
            }
        }
        // Past helm's timeout, still not known to be abandoned: refused with the uninstall.
        let old = Live { history: vec![rev(1, "pending-install")], status: None };
        let text = summary(s.decide_in(&ctx(), &old, empty.path()));
        assert!(text.contains("no deployed revision to roll back to (this deploy's journal does not show"), "{text}");
        assert!(text.contains("then `rdeploy recover` installs it again"), "{text}");
        // The operator's --force vouches for it.
        let mut forced = ctx();
        forced.force = true;
        assert!(matches!(s.decide_in(&forced, &live, empty.path()), Decision::Reinstall { abandoned: 1, .. }));
    }

    #[test]
    fn an_abandoned_pending_rollback_is_rolled_back_to_the_last_deployed_revision() {
        let s = spec();
        let live = Live {
            history: vec![
                young(1, "superseded"),
                young(2, "deployed"),
                young(3, "failed"),
                young(4, "pending-rollback"),
            ],
            status: None,
        };
        let empty = proc_table(&[]);
        assert!(matches!(
            s.decide_in(&ctx_started("web@4", RunFate::LockTakenOver), &live, empty.path()),
            Decision::Rollback { to: 2, then_upgrade: true, abandoned: Some(4), .. }
        ));
        assert!(matches!(s.decide_in(&ctx(), &live, empty.path()), Decision::Refuse { .. }));
    }

    /// A fleet cluster's helm runs with the kubeconfig cut for it, and its commands are shown
    /// with the user's: the step's `kubeconfig`, else none (helm reads `KUBECONFIG`).
    #[test]
    fn a_clusters_own_kubeconfig_is_run_and_the_users_is_shown() {
        let ctx = StepContext { stack_dir: "/stack".into(), ..ctx() };
        let cut = HelmSpec { cluster_kubeconfig: Some("/work/clusters/c1/kubeconfig".into()), ..spec() };
        for (kubeconfig, shown) in [(Some("kube/fleet.yaml"), " --kubeconfig /stack/kube/fleet.yaml"), (None, "")] {
            let spec = HelmSpec { kubeconfig: kubeconfig.map(PathBuf::from), ..cut.clone() };
            let release = Release::new(&spec, &ctx, PathBuf::from("helm"));
            let cmd = release.with_words(&|s| s.rollback_words(3, 2, Some(&ctx)));
            assert_eq!(
                cmd.display(),
                format!("helm rollback web 2 -n shop --kube-context c1{shown} --wait --timeout=90s")
            );
            let run = cmd.run_args().join(" ");
            assert!(run.contains("--kubeconfig /work/clusters/c1/kubeconfig --wait"), "{run}");
            // The rollback an operator pastes: the user's file as helm found it, else as written.
            let running = spec.cluster_rollback(Some(&ctx)).expect("helm rolls back");
            assert!(running.ends_with(&format!("--kube-context c1{shown} --wait`")), "{running}");
            let written = spec.cluster_rollback(None).expect("helm rolls back");
            assert!(!written.contains("/work/") && !written.contains("/stack/"), "{written}");
            assert_eq!(written.contains("--kubeconfig kube/fleet.yaml"), kubeconfig.is_some(), "{written}");
        }
        // From another directory (`rdeploy up deploy/stack.yaml`) helm runs in `deploy`: it is
        // given the step's kubeconfig absolute, not relative to rdeploy's directory.
        let here = StepContext { stack_dir: "deploy".into(), ..ctx.clone() };
        let spec = HelmSpec { kubeconfig: Some("kube/fleet.yaml".into()), ..spec() };
        let cwd = std::env::current_dir().expect("a working directory");
        assert_eq!(spec.kubeconfig_arg(Some(&here)), Some(cwd.join("deploy/kube/fleet.yaml")));
    }

    #[test]
    fn runbook_names_the_last_deployed_revision() {
        let ctx = DescribeContext { step: "app", stack_file: "stack.yaml", stack_dir: ".", resumable: true };
        let prior = PriorStep {
            sub_changes: vec![],
            facts: BTreeMap::from([
                ("last_deployed_revision".to_string(), serde_json::json!(2)),
                ("revision".to_string(), serde_json::json!(3)),
                ("status".to_string(), serde_json::json!("failed")),
            ]),
        };
        let doc = spec().describe_recovery(&ctx, Some(&prior));
        assert_eq!(doc.inspect[0], "helm status web -n shop --kube-context c1");
        assert!(
            doc.rollback[0].contains("`helm rollback web 2 -n shop --kube-context c1 --wait=watcher`"),
            "{:?}",
            doc.rollback
        );
        assert!(doc.notes.iter().any(|n| n == "recorded: revision 3 is failed"));
        // Without a checkpoint: the release's namespace and context, the revision to look up.
        let fresh = spec().describe_recovery(&ctx, None);
        assert!(
            fresh.rollback[0].contains(
                "`helm rollback web REVISION -n shop --kube-context c1 --wait=watcher`, REVISION being the last `deployed` one in `helm history web -n shop --kube-context c1`"
            ),
            "{:?}",
            fresh.rollback
        );
        assert_eq!(
            spec().cluster_rollback(None).as_deref(),
            Some("`helm history web -n shop --kube-context c1` names its last deployed revision, then `helm rollback web REVISION -n shop --kube-context c1 --wait`")
        );
        // The checkpoint read the history and no revision was ever deployed: nothing to roll back to.
        let never = PriorStep {
            sub_changes: vec![],
            facts: BTreeMap::from([
                ("revision".to_string(), serde_json::json!(1)),
                ("status".to_string(), serde_json::json!("failed")),
            ]),
        };
        let never = spec().describe_recovery(&ctx, Some(&never));
        assert!(
            never.rollback[0].starts_with("nothing to roll back to: no revision of `web` was ever deployed; `helm uninstall web -n shop --kube-context c1`"),
            "{:?}",
            never.rollback
        );
        // A release found in place whose readiness then failed: its revision is deployed, so
        // it is never called never-deployed (an uninstall would remove a live release).
        let kept = PriorStep {
            sub_changes: vec![],
            facts: BTreeMap::from([
                ("revision".to_string(), serde_json::json!(4)),
                ("status".to_string(), serde_json::json!("deployed")),
            ]),
        };
        let kept = spec().describe_recovery(&ctx, Some(&kept));
        assert!(!kept.rollback.iter().chain(&kept.notes).any(|n| n.contains("helm uninstall")), "{kept:?}");
    }

    #[test]
    fn spec_problems() {
        let mut s = spec();
        s.release = "Web_1".into();
        assert_eq!(s.problems().len(), 1);
        assert!(spec().problems().is_empty());
    }
}

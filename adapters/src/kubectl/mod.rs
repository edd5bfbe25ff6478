//! The kubectl adapter: expands the step's manifests into objects (the sub-change is one object,
//! `Kind/namespace/name`), applies them with kubectl and checkpoints each from kubectl's own
//! per-object result lines and errors, waits for workload rollouts when asked, and recovers with
//! `kubectl diff` (read-only) followed by an apply of only the objects that are missing, differ
//! or were never recorded done.

pub mod manifest;
pub mod output;
pub mod preview;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use self::manifest::{KubeObject, Scopes};
use self::output::{
    attribute_errors, error_records, first_error, match_results, parse_apply_line, parse_diff, rollout_progress,
};
use crate::process::{capture, Captured, Command, Outcome, StdoutLog};
use crate::{
    display_command, shell_quote, Adapter, AdapterError, DescribeContext, Event, EventSink, Failure, FieldPath,
    Inspection, PathSegment, PlanAction, Preview, PriorStep, Recovered, RecoveryDoc, SpecProblem, StepContext,
    SubStatus, ToolInfo,
};

const DEFAULT_BINARY: &str = "kubectl";
const INSTALL_HINT: &str =
    "install kubectl (https://kubernetes.io/docs/tasks/tools/), or point the step's `binary:` at it";
/// How long a rollout may take when the step sets no `timeout`.
const DEFAULT_ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);
/// Read-only calls (version, config, kustomize) get this long.
const QUICK: Duration = Duration::from_secs(120);

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubectlSpec {
    /// Files (multi-document YAML or JSON) and directories (plain, or kustomize when they hold a
    /// `kustomization.yaml`), relative to the stack file.
    pub manifests: Vec<PathBuf>,
    /// The namespace of namespaced objects that name none (default: the context's).
    pub namespace: Option<String>,
    pub context: Option<String>,
    /// A kubeconfig file, relative to the stack file (default: `KUBECONFIG` or `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// The file this cluster's tool reads instead, holding only its context (a fleet step's
    /// cluster: see [`crate::kubeconfig`]). Not a stack key; messages and runbooks name
    /// `kubeconfig`, the user's file.
    #[serde(skip)]
    pub cluster_kubeconfig: Option<PathBuf>,
    pub server_side: Option<bool>,
    /// Wait for every Deployment, StatefulSet and DaemonSet to roll out (`kubectl rollout
    /// status`); the default. rdeploy then checks every applied workload (Jobs included) itself.
    pub wait: Option<bool>,
    pub binary: Option<String>,
    /// Values read from the cluster after the apply, for later steps.
    #[serde(default)]
    pub outputs: std::collections::BTreeMap<String, OutputSpec>,
}

/// One output of a kubectl step: `kubectl get KIND NAME -n NAMESPACE -o jsonpath=EXPR`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// `KIND/NAMESPACE/NAME`, or `KIND/NAME` for a cluster-scoped object.
    pub object: String,
    /// kubectl's JSONPath, with or without the surrounding `{}` (`.spec.clusterIP`).
    pub jsonpath: String,
}

impl OutputSpec {
    /// `(kind, namespace, name)` when `object` is well formed.
    fn parts(&self) -> Option<(&str, Option<&str>, &str)> {
        let parts: Vec<&str> = self.object.split('/').collect();
        match parts[..] {
            [kind, name] if !kind.is_empty() && !name.is_empty() => Some((kind, None, name)),
            [kind, ns, name] if !kind.is_empty() && !ns.is_empty() && !name.is_empty() => Some((kind, Some(ns), name)),
            _ => None,
        }
    }

    fn expression(&self) -> String {
        let e = self.jsonpath.trim();
        if e.starts_with('{') {
            e.to_string()
        } else {
            format!("{{{e}}}")
        }
    }
}

/// What one `kubectl apply` over a batch of objects settled.
struct BatchOutcome {
    failed: Vec<(String, String)>,
    /// Applied workloads still to wait for.
    to_wait: Vec<usize>,
    outcome: Outcome,
    command: String,
}

/// Why recover applies an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Missing,
    Differs,
    NotDone,
    /// `kubectl diff` reported differences it did not name as any object: not known in place.
    Unmatched,
    /// `kubectl diff` failed and `kubectl get` did not return it, for a reason other than
    /// NotFound or a kind the API cannot map: not known in place.
    Unconfirmed,
}

impl Reason {
    fn words(self) -> &'static str {
        match self {
            Reason::Missing => "missing from the cluster",
            Reason::Differs => "differs from the live object",
            Reason::NotDone => "not recorded done",
            Reason::Unmatched => "`kubectl diff` output could not be matched to it, so it is not known to be in place",
            Reason::Unconfirmed => "`kubectl get` did not return it, so it is not known to be in place",
        }
    }
}

/// What recover would do with every object, from `kubectl diff` and the checkpoint.
#[derive(Debug, Default)]
struct RecoveryPlan {
    apply: Vec<(usize, Reason)>,
    /// Not recorded done, but `kubectl diff` shows the live object already matches.
    in_place: Vec<usize>,
    keep: Vec<usize>,
    /// The diff failed (exit > 1): kubectl's message. Then `kubectl get` decides which objects
    /// exist: one recorded done and returned is kept, any other is applied.
    diff_error: Option<String>,
    /// Files `kubectl diff` named that match no object (`group.version.Kind.namespace.name`).
    unmatched: Vec<String>,
}

impl KubectlSpec {
    pub const KEYS: &'static [&'static str] =
        &["manifests", "namespace", "context", "kubeconfig", "server_side", "wait", "binary", "outputs"];

    /// Reads the declared `outputs` from the cluster (`kubectl get ... -o jsonpath`).
    async fn report_outputs(&self, ctx: &StepContext, sink: &dyn EventSink, binary: &Path) -> Result<(), Failure> {
        if self.outputs.is_empty() {
            return Ok(());
        }
        let mut values = crate::outputs::Outputs::new();
        for (key, out) in &self.outputs {
            let Some((kind, ns, name)) = out.parts() else { continue };
            let mut cmd = self.command(ctx, binary).args(["get", kind, name]);
            if let Some(ns) = ns {
                cmd = cmd.args(["-n", ns]);
            }
            let cmd = cmd.arg(format!("-o=jsonpath={}", out.expression()));
            let Captured { outcome, stdout, stderr } =
                capture(&cmd, ctx, Some(QUICK), None, StdoutLog::Lines).await.map_err(Failure::from)?;
            if !outcome.success() {
                let why = stderr.last().cloned().unwrap_or_else(|| outcome.describe_status());
                return Err(Failure::new(format!("output `{key}`: `{}` failed: {why}", cmd.display()))
                    .with_hint(format!("check `outputs.{key}.object` and `jsonpath`; the objects are applied, `rdeploy recover` reads it again")));
            }
            values.insert(key.clone(), crate::outputs::OutputValue::Plain(stdout.join("\n").into()));
        }
        sink.emit(Event::Outputs { values });
        Ok(())
    }

    fn server_side(&self) -> bool {
        self.server_side.unwrap_or(false)
    }

    fn binary_name(&self) -> &str {
        self.binary.as_deref().unwrap_or(DEFAULT_BINARY)
    }

    fn resolve_binary(&self, ctx: &StepContext) -> Result<PathBuf, AdapterError> {
        crate::resolve_binary(ctx, self.binary_name(), INSTALL_HINT)
    }

    /// `--kubeconfig K --context C`, as every kubectl call gets them.
    fn cluster_args(&self, ctx: Option<&StepContext>) -> Vec<String> {
        let mut args = Vec::new();
        // Running, the cluster's own file when the rollout made one (see `crate::kubeconfig`).
        let running = ctx.and_then(|_| self.cluster_kubeconfig.clone());
        if let Some(path) = running
            .or_else(|| self.kubeconfig.as_ref().map(|k| ctx.map_or_else(|| k.clone(), |c| c.resolve_absolute(k))))
        {
            args.push("--kubeconfig".into());
            args.push(path.to_string_lossy().into_owned());
        }
        if let Some(c) = &self.context {
            args.push("--context".into());
            args.push(c.clone());
        }
        args
    }

    /// kubectl in the step's cluster: run with this cluster's own kubeconfig where a fleet's
    /// rollout made one (see [`crate::kubeconfig`]), shown with the step's `kubeconfig`, or
    /// none, as the user would type the command.
    fn command(&self, ctx: &StepContext, binary: &Path) -> Command {
        let shown = KubectlSpec { cluster_kubeconfig: None, ..self.clone() };
        Command::new(binary)
            .cwd(&ctx.stack_dir)
            .envs(ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .args_shown_as(self.cluster_args(Some(ctx)), shown.cluster_args(Some(ctx)))
            .in_step(ctx)
    }

    /// The namespace given to namespaced objects that name none: the step's, else the context's.
    async fn default_namespace(&self, ctx: &StepContext, binary: &Path) -> String {
        if let Some(ns) = &self.namespace {
            return ns.clone();
        }
        let cmd = self.command(ctx, binary).args(["config", "view", "--minify", "-o", "jsonpath={..namespace}"]);
        match capture(&cmd, ctx, Some(QUICK), None, StdoutLog::Lines).await {
            Ok(Captured { outcome, stdout, .. }) if outcome.success() => {
                stdout.join("").split_whitespace().next().unwrap_or("default").to_string()
            }
            _ => "default".to_string(),
        }
    }

    /// The cluster's discovery (`kubectl api-resources`): which kinds are namespaced, as the API
    /// says at the time of the apply. A kind whose CRD an earlier step installed is known here
    /// and nowhere else. A partial answer (an aggregated API down: exit 1 with the rest printed)
    /// is used as far as it goes; no answer at all is the step's failure (the API is down: the
    /// apply would fail the same way, and retries treat it as transient).
    async fn discover(&self, ctx: &StepContext, binary: &Path) -> Result<Vec<String>, Failure> {
        let cmd = self.command(ctx, binary).arg("api-resources");
        let Captured { outcome, stdout, stderr } =
            capture(&cmd, ctx, Some(QUICK), None, StdoutLog::Lines).await.map_err(Failure::from)?;
        let rows = Scopes::default().add_discovery(&stdout);
        if outcome.interrupted || outcome.timed_out || rows == 0 {
            return Err(kubectl_failure(&cmd.display(), &outcome, &stderr).with_hint(
                "rdeploy asks the API which kinds are namespaced before it applies; check the cluster is reachable (`kubectl cluster-info`)",
            ));
        }
        Ok(stdout)
    }

    /// Every object of the step's manifests, in apply order.
    async fn objects(&self, ctx: &StepContext, binary: &Path) -> Result<Vec<KubeObject>, Failure> {
        let mut sources: Vec<(PathBuf, Vec<serde_json::Value>)> = Vec::new();
        for manifest in &self.manifests {
            let path = ctx.resolve(manifest);
            if path.is_dir() && manifest::is_kustomization(&path) {
                let cmd = self.command(ctx, binary).arg("kustomize").arg(ctx.resolve_absolute(manifest));
                let Captured { outcome, stdout, stderr } =
                    capture(&cmd, ctx, Some(QUICK), None, StdoutLog::Lines).await.map_err(Failure::from)?;
                if !outcome.success() {
                    return Err(kubectl_failure(&cmd.display(), &outcome, &stderr)
                        .with_hint(format!("fix the kustomization in {}", manifest.display())));
                }
                let docs = manifest::parse_documents(&stdout.join("\n"))
                    .map_err(|e| Failure::new(format!("`{}` printed YAML that does not parse: {e}", cmd.display())))?;
                sources.push((manifest.clone(), docs));
            } else if path.is_dir() {
                let files = manifest::files_in(&path)
                    .map_err(|e| Failure::new(format!("could not read the directory {}: {e}", path.display())))?;
                for file in files {
                    let rel = manifest.join(file.file_name().unwrap_or_default());
                    sources.push((rel, read_documents(&file)?));
                }
            } else {
                sources.push((manifest.clone(), read_documents(&path)?));
            }
        }
        let all: Vec<serde_json::Value> =
            sources.iter().flat_map(|(_, d)| manifest::flatten_lists(d.clone())).collect();
        let mut scopes = Scopes::from_documents(&all);
        let need_discovery = scopes.lacks_any(&all);
        let (default_ns, discovered) = tokio::join!(self.default_namespace(ctx, binary), async {
            if need_discovery {
                Some(self.discover(ctx, binary).await)
            } else {
                None
            }
        });
        if let Some(discovered) = discovered {
            let lines = discovered?;
            scopes.add_discovery(&lines);
        }
        let mut objects = Vec::new();
        for (source, docs) in sources {
            objects.extend(manifest::objects_from_documents(docs, &source, &default_ns, &scopes).map_err(|e| {
                Failure::new(e)
                    .with_hint("fix the manifest; every object needs `apiVersion`, `kind` and `metadata.name`")
            })?);
        }
        manifest::order(&mut objects);
        if let Some((id, first, second)) = manifest::first_duplicate(&objects) {
            return Err(Failure::new(format!(
                "object `{id}` is declared twice ({} and {})",
                first.display(),
                second.display()
            ))
            .with_hint("keep one definition: the object is its checkpoint key"));
        }
        if objects.is_empty() {
            return Err(
                Failure::new("the step's manifests hold no objects").with_hint("check `manifests:` in the stack file")
            );
        }
        Ok(objects)
    }

    /// Settles records that name no object of the manifests: a record under the identity an
    /// object had under another scope (`Widget/default/w` when the API says Widget is
    /// cluster-scoped now, or the reverse) is renamed to the object's identity now, so the
    /// checkpoint holds one sub-change for it and never a stale one reported done. Called after
    /// `Planned`, so the rename drops the old record: the object is judged afresh (by `kubectl
    /// diff`, or applied when the diff fails), never kept on a record made under another name.
    /// Records matching no object are left alone (rdeploy does not prune) and said so.
    fn settle_unmatched_records(&self, objects: &[KubeObject], prior: &PriorStep, sink: &dyn EventSink) {
        let ids: HashSet<String> = objects.iter().map(KubeObject::id).collect();
        let mut gone = Vec::new();
        for record in prior.sub_changes.iter().filter(|s| !ids.contains(&s.id)) {
            match rescoped(objects, &record.id) {
                Some(now) => {
                    sink.emit(Event::Moved { from: record.id.clone(), to: now.clone() });
                    sink.emit(Event::Warning { message: rescoped_words(&record.id, &now) });
                }
                None => gone.push(record.id.as_str()),
            }
        }
        if !gone.is_empty() {
            sink.emit(Event::Warning {
                message: format!(
                    "{} recorded but no longer in the manifests; left alone (rdeploy does not prune)",
                    gone.join(", ")
                ),
            });
        }
    }

    /// Runs `kubectl diff` over every object and decides, object by object, what recover does.
    async fn plan_recovery(
        &self,
        ctx: &StepContext,
        binary: &Path,
        objects: &[KubeObject],
        prior: &PriorStep,
        sink: Option<&dyn EventSink>,
    ) -> Result<RecoveryPlan, Failure> {
        let all: Vec<usize> = (0..objects.len()).collect();
        let dir = stage(ctx, "diff", objects, &all)?;
        // The default differ: its `diff -u -N LIVE/x MERGED/x` headers are what is parsed, and
        // an operator's `KUBECTL_EXTERNAL_DIFF` (dyff, colordiff) prints other ones.
        let mut cmd = self.command(ctx, binary).env("KUBECTL_EXTERNAL_DIFF", "diff -u -N").arg("diff");
        if self.server_side() {
            cmd = cmd.arg("--server-side");
        }
        let cmd = cmd.arg("-f").arg(&dir);
        let Captured { outcome, stdout, stderr } =
            capture(&cmd, ctx, Some(ctx.timeout.unwrap_or(QUICK)), sink, StdoutLog::Lines)
                .await
                .map_err(Failure::from)?;
        if outcome.interrupted {
            return Err(Failure::from_process(&cmd.display(), &outcome));
        }
        match outcome.code {
            Some(code @ (0 | 1)) if !outcome.timed_out => Ok(plan_from_diff(objects, prior, code, stdout)),
            _ => {
                let error =
                    first_error(&stderr).unwrap_or_else(|| format!("`kubectl diff` {}", outcome.describe_status()));
                let presence = self.presence(ctx, binary, objects, &dir, sink).await?;
                Ok(plan_from_presence(objects, prior, error, &presence))
            }
        }
    }

    /// When `kubectl diff` fails as a whole (one kind it cannot map, as a custom resource whose
    /// CRD was deleted out of band, fails all of it), it says nothing of any object, and the
    /// checkpoint alone would keep what was deleted. One `kubectl get -f DIR --ignore-not-found`
    /// over the same staged files tells which objects exist: kubectl goes on past objects it
    /// cannot map or find, prints those it found, and says on stderr why it skipped the others.
    async fn presence(
        &self,
        ctx: &StepContext,
        binary: &Path,
        objects: &[KubeObject],
        dir: &Path,
        sink: Option<&dyn EventSink>,
    ) -> Result<Presence, Failure> {
        let cmd = self.command(ctx, binary).arg("get").arg("-f").arg(dir).args(["--ignore-not-found", "-o", "json"]);
        let Captured { outcome, stdout, stderr } =
            capture(&cmd, ctx, Some(ctx.timeout.unwrap_or(QUICK)), sink, StdoutLog::UnlessJson)
                .await
                .map_err(Failure::from)?;
        if outcome.interrupted {
            return Err(Failure::from_process(&cmd.display(), &outcome));
        }
        if outcome.timed_out {
            return Ok(Presence::default());
        }
        Ok(presence_from_get(objects, &stdout.join("\n"), &stderr))
    }

    /// Applies the given objects (indexes into `objects`), CRDs in a batch of their own when
    /// custom resources of theirs follow, then waits for rollouts when the step asks.
    async fn apply_objects(
        &self,
        ctx: &StepContext,
        sink: &dyn EventSink,
        binary: &Path,
        objects: &[KubeObject],
        selected: &[usize],
        label: &str,
    ) -> Result<(), Failure> {
        let deadline = crate::saturating_deadline(ctx.timeout.unwrap_or(DEFAULT_ROLLOUT_TIMEOUT));
        let mut failed = Vec::new();
        let mut to_wait = Vec::new();
        let mut last: Option<(Outcome, String)> = None;
        for (n, batch) in batches(objects, selected).into_iter().enumerate() {
            let result = self.apply_batch(ctx, sink, binary, objects, &batch, &format!("{label}-{}", n + 1)).await?;
            let interrupted = result.outcome.interrupted || result.outcome.timed_out;
            failed.extend(result.failed);
            to_wait.extend(result.to_wait);
            last = Some((result.outcome, result.command));
            if interrupted {
                break;
            }
            if n == 0 {
                self.wait_for_crds(ctx, binary, objects, &batch, sink).await;
            }
        }
        let Some((outcome, command)) = last else { return Ok(()) };
        if outcome.interrupted || outcome.timed_out {
            let mut failure = Failure::from_process(&command, &outcome);
            failure.hint =
                Some("objects kubectl did not report are uncertain; `rdeploy recover` diffs them first".into());
            return Err(failure);
        }
        if self.wait.unwrap_or(true) && !to_wait.is_empty() {
            failed.extend(self.wait_rollouts(ctx, sink, binary, objects, &to_wait, deadline).await?);
        }
        if failed.is_empty() {
            return Ok(());
        }
        let mut failure = summarize(&failed, selected.len(), Some((&command, &outcome)));
        for line in &mut failure.stderr_tail {
            *line = output::name_user_files(line, objects);
        }
        // The first failed object's file and, when known, the line its document starts on.
        failure.location = failed.first().and_then(|(id, _)| objects.iter().find(|o| &o.id() == id)).map(|o| {
            Box::new(crate::Location {
                file: o.source.to_string_lossy().into_owned(),
                line: manifest::document_line(&ctx.resolve(&o.source), o.document),
            })
        });
        if let Some(hint) = self.too_big_hint(objects, selected, &failed) {
            failure.hint = Some(hint);
        }
        Err(failure)
    }

    /// One `kubectl apply -f DIR` over one file per object, each result line and error settled
    /// as the object's Done or Failed.
    async fn apply_batch(
        &self,
        ctx: &StepContext,
        sink: &dyn EventSink,
        binary: &Path,
        objects: &[KubeObject],
        batch: &[usize],
        label: &str,
    ) -> Result<BatchOutcome, Failure> {
        if ctx.cancel.is_cancelled() {
            return Err(Failure { interrupted: true, ..Failure::new("stopped before `kubectl apply` started") });
        }
        let dir = stage(ctx, label, objects, batch)?;
        let mut cmd = self.command(ctx, binary).arg("apply");
        if self.server_side() {
            cmd = cmd.arg("--server-side");
        }
        let cmd = cmd.arg("-f").arg(&dir);
        for &i in batch {
            sink.emit(Event::Started { id: objects[i].id() });
        }
        // Nothing starts unless its start is recorded (the sink stops the step when it could not).
        if ctx.cancel.is_cancelled() {
            return Err(Failure {
                interrupted: true,
                ..Failure::new(format!("stopped before `kubectl apply` ({label})"))
            });
        }
        let Captured { outcome, stdout, stderr } =
            capture(&cmd, ctx, ctx.timeout, Some(sink), StdoutLog::Lines).await.map_err(Failure::from)?;
        let results: Vec<_> = stdout.iter().filter_map(|l| parse_apply_line(l)).collect();
        let refs: Vec<&KubeObject> = batch.iter().map(|&i| &objects[i]).collect();
        let matched = match_results(&refs, &results);
        let mut to_wait = Vec::new();
        let mut not_applied = Vec::new();
        for (k, &i) in batch.iter().enumerate() {
            match matched.get(&k) {
                Some(_) if self.wait.unwrap_or(true) && objects[i].is_workload() => to_wait.push(i),
                Some(verb) => sink.emit(Event::Done { id: objects[i].id(), note: Some(verb.clone()) }),
                None => not_applied.push((&objects[i], file_name(i))),
            }
        }
        let mut failed = Vec::new();
        // Interrupted or timed out: what kubectl did not report stays uncertain (started).
        if !(outcome.interrupted || outcome.timed_out || not_applied.is_empty()) {
            let attributed = attribute_errors(&not_applied, &error_records(&stderr));
            for (object, _) in &not_applied {
                let mut error = attributed.get(&object.id()).cloned().unwrap_or_else(|| "not applied".into());
                // kubectl names the file it read, rdeploy's staged copy (dropped from the
                // message): say which of the operator's files and documents it is, since what
                // failed may be the very `apiVersion` or `kind` the object's id is made of.
                error = format!("{error} ({})", output::user_place(objects, object));
                sink.emit(Event::Failed { id: object.id(), error: error.clone() });
                failed.push((object.id(), error));
            }
        }
        Ok(BatchOutcome { failed, to_wait, outcome, command: cmd.display() })
    }

    /// The way out for objects the API refused because their annotations pass 256 KiB, as a
    /// client-side apply of a big CRD does (prometheus-operator's, Crossplane's): kubectl keeps
    /// the whole object in the `kubectl.kubernetes.io/last-applied-configuration` annotation.
    /// rdeploy says so and points at `server_side: true` rather than switching by itself: the
    /// step asked for client-side apply, the runbook's commands are client-side, and server-side
    /// apply changes who owns the object's fields (`kubectl` instead of
    /// `kubectl-client-side-apply`) and how later applies remove fields: a change an SRE makes
    /// on purpose, for the whole step, not one rdeploy makes for one object behind their back.
    fn too_big_hint(&self, objects: &[KubeObject], selected: &[usize], failed: &[(String, String)]) -> Option<String> {
        if self.server_side() {
            return None;
        }
        let big: Vec<String> = failed
            .iter()
            .filter(|(_, error)| error.contains("metadata.annotations: Too long"))
            .filter_map(|(id, _)| selected.iter().map(|&i| &objects[i]).find(|o| &o.id() == id))
            .map(|o| {
                let size = serde_json::to_string(&o.body).map(|t| t.len()).unwrap_or_default();
                format!("{} ({} KiB)", o.id(), size.div_ceil(1024))
            })
            .collect();
        if big.is_empty() {
            return None;
        }
        Some(format!(
            "{} too big for client-side apply: kubectl copies the object into its last-applied-configuration annotation, and the API limits annotations to 256 KiB; set `server_side: true` on the step (server-side apply keeps no such copy), then `rdeploy recover`",
            if big.len() == 1 { format!("{} is", big[0]) } else { format!("{} are", big.join(", ")) }
        ))
    }

    /// After a batch that created CRDs, waits until they are established so the custom
    /// resources of the next batch map (best effort: the apply reports what still fails).
    async fn wait_for_crds(
        &self,
        ctx: &StepContext,
        binary: &Path,
        objects: &[KubeObject],
        batch: &[usize],
        sink: &dyn EventSink,
    ) {
        let crds: Vec<String> = batch
            .iter()
            .filter(|&&i| objects[i].kind == "CustomResourceDefinition")
            .map(|&i| format!("crd/{}", objects[i].name))
            .collect();
        if crds.is_empty() {
            return;
        }
        let cmd = self.command(ctx, binary).args(["wait", "--for=condition=Established", "--timeout=60s"]).args(crds);
        let _ = capture(&cmd, ctx, Some(QUICK), Some(sink), StdoutLog::Lines).await;
    }

    /// `kubectl rollout status` for each workload, within the step's deadline.
    async fn wait_rollouts(
        &self,
        ctx: &StepContext,
        sink: &dyn EventSink,
        binary: &Path,
        objects: &[KubeObject],
        workloads: &[usize],
        deadline: Instant,
    ) -> Result<Vec<(String, String)>, Failure> {
        let mut failed = Vec::new();
        for &i in workloads {
            let object = &objects[i];
            if ctx.cancel.is_cancelled() {
                return Err(Failure {
                    interrupted: true,
                    ..Failure::new(format!("stopped before the rollout of `{}`", object.id()))
                });
            }
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
            let mut cmd = self.command(ctx, binary).arg("rollout").arg("status").arg(object.resource_arg());
            if let Some(ns) = &object.namespace {
                cmd = cmd.arg("-n").arg(ns);
            }
            let cmd = cmd.arg(format!("--timeout={}s", left.as_secs()));
            // kubectl enforces its own --timeout; ours is a backstop a little later.
            let Captured { outcome, stdout, .. } =
                capture(&cmd, ctx, Some(left.saturating_add(Duration::from_secs(30))), Some(sink), StdoutLog::Lines)
                    .await
                    .map_err(Failure::from)?;
            if outcome.interrupted {
                return Err(Failure::from_process(&cmd.display(), &outcome));
            }
            if outcome.success() {
                sink.emit(Event::Done { id: object.id(), note: Some("rolled out".into()) });
                continue;
            }
            let why = outcome.last_error_line().unwrap_or_else(|| outcome.describe_status());
            let error = match rollout_progress(&stdout) {
                Some(progress) if progress != why => format!("rollout did not finish: {why} ({progress})"),
                _ => format!("rollout did not finish: {why}"),
            };
            sink.emit(Event::Failed { id: object.id(), error: error.clone() });
            failed.push((object.id(), error));
        }
        Ok(failed)
    }

    /// `kubectl -f m1 -f m2 [-k dir] [-n NS] [--context C] VERB` as an operator types it in the
    /// stack directory.
    fn runbook_words(&self, verb: &[&str]) -> Vec<String> {
        let mut words = vec![self.binary_name().to_string()];
        words.extend(verb.iter().map(|s| s.to_string()));
        if self.server_side() && verb != ["rollout", "status"] {
            words.push("--server-side".into());
        }
        for m in &self.manifests {
            // The runbook cannot look at the disk; a kustomize dir is told by the note below.
            words.push("-f".into());
            words.push(m.to_string_lossy().into_owned());
        }
        if let Some(ns) = &self.namespace {
            words.push("-n".into());
            words.push(ns.clone());
        }
        words.extend(self.cluster_args(None));
        words
    }

    /// `kubectl rollout status deployment/web -n shop` for a workload id.
    fn rollout_words(&self, id: &str) -> Option<Vec<String>> {
        let mut parts = id.split('/');
        let (kind, ns, name) = (parts.next()?, parts.next()?, parts.next()?);
        if !manifest::WORKLOADS.contains(&kind) {
            return None;
        }
        let mut words = vec![self.binary_name().to_string(), "rollout".into(), "status".into()];
        words.push(format!("{}/{name}", kind.to_lowercase()));
        words.extend(["-n".to_string(), ns.to_string()]);
        words.extend(self.cluster_args(None));
        Some(words)
    }
}

impl Adapter for KubectlSpec {
    fn settings(&self, _stack_dir: &Path) -> Vec<(&'static str, crate::contract::Setting)> {
        use crate::contract::Setting;
        let mut out =
            vec![("manifests", Setting::List(self.manifests.iter().map(|p| p.display().to_string()).collect()))];
        if let Some(ns) = &self.namespace {
            out.push(("namespace", Setting::Code(ns.clone())));
        }
        if let Some(c) = &self.context {
            out.push(("context", Setting::Code(c.clone())));
        }
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

    /// The workloads the step's objects are (their sub-change ids), read in every namespace.
    fn workloads(&self, _ctx: &StepContext) -> Option<crate::contract::Workloads> {
        Some(crate::contract::Workloads {
            context: self.context.clone(),
            namespace: None,
            wait: self.wait != Some(false),
            touched: crate::contract::Touched::Objects,
        })
    }

    fn cluster_rollback(&self, ctx: Option<&StepContext>) -> Option<String> {
        // The user's kubeconfig as kubectl resolves it when running, as written in a runbook.
        let shown = KubectlSpec { cluster_kubeconfig: None, ..self.clone() };
        let words = |verb: &str| {
            let mut words =
                vec![self.binary_name().to_string(), "rollout".into(), verb.into(), "deployment/NAME".into()];
            if let Some(ns) = &self.namespace {
                words.extend(["-n".to_string(), ns.clone()]);
            }
            words.extend(shown.cluster_args(ctx));
            display_command(&words)
        };
        Some(format!(
            "`{}` for each workload the manifests change (`{}` lists its revisions)",
            words("undo"),
            words("history")
        ))
    }

    fn problems(&self) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        if self.manifests.is_empty() {
            problems.push(SpecProblem {
                at: vec![PathSegment::Key("manifests")],
                message: "`manifests` is empty".into(),
                hint: Some("list at least one manifest file or directory".into()),
            });
        }
        for (key, out) in &self.outputs {
            if !crate::outputs::valid_key(key) {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key("outputs")],
                    message: format!("`{key}` is not an output name"),
                    hint: Some("use letters, digits, `_` and `-`, starting with a letter or `_`".into()),
                });
            }
            if out.parts().is_none() {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key("outputs")],
                    message: format!("output `{key}`: `object: {}` is not `KIND/NAMESPACE/NAME`", out.object),
                    hint: Some("write it like `service/shop/web`, or `KIND/NAME` for a cluster-scoped object".into()),
                });
            }
        }
        for (key, value) in [("namespace", &self.namespace), ("context", &self.context)] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                problems.push(SpecProblem {
                    at: vec![PathSegment::Key(key)],
                    message: format!("`{key}` is empty"),
                    hint: Some("remove it to use the kubeconfig's default".into()),
                });
            }
        }
        problems
    }

    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        let mut paths: Vec<(FieldPath, PathBuf)> = self
            .manifests
            .iter()
            .enumerate()
            .map(|(i, p)| (vec![PathSegment::Key("manifests"), PathSegment::Index(i)], p.clone()))
            .collect();
        if let Some(k) = &self.kubeconfig {
            paths.push((vec![PathSegment::Key("kubeconfig")], k.clone()));
        }
        paths
    }

    async fn preflight(&self, ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        let binary = self.resolve_binary(ctx)?;
        let paths: Vec<(PathBuf, PathBuf)> = self.manifests.iter().map(|m| (m.clone(), ctx.resolve(m))).collect();
        crate::inputs::kubectl_manifests(&paths)?;
        let cmd = Command::new(&binary)
            .envs(ctx.env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .args(["version", "--client", "-o", "json"]);
        let Captured { outcome, stdout, .. } = capture(&cmd, ctx, Some(QUICK), None, StdoutLog::Lines).await?;
        let version = serde_json::from_str::<serde_json::Value>(&stdout.join("\n"))
            .ok()
            .and_then(|v| v.pointer("/clientVersion/gitVersion").and_then(|g| g.as_str()).map(str::to_string));
        match version {
            Some(version) if outcome.success() => Ok(ToolInfo { binary, version }),
            _ => Err(AdapterError::ToolUnusable {
                command: cmd.display(),
                detail: outcome.last_error_line().unwrap_or_else(|| outcome.describe_status()),
            }),
        }
    }

    async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        let binary = self.resolve_binary(ctx).map_err(Failure::from)?;
        let objects = self.objects(ctx, &binary).await?;
        sink.emit(Event::Planned { ids: objects.iter().map(KubeObject::id).collect() });
        let all: Vec<usize> = (0..objects.len()).collect();
        self.apply_objects(ctx, sink, &binary, &objects, &all, "apply").await?;
        self.report_outputs(ctx, sink, &binary).await
    }

    /// Applies only the objects the preview found missing or different (or could not check);
    /// an object whose `kubectl diff` is empty is reported in place and not applied, so its
    /// resourceVersion does not move.
    async fn converge(&self, ctx: &StepContext, preview: &Preview, sink: &dyn EventSink) -> Result<(), Failure> {
        let binary = self.resolve_binary(ctx).map_err(Failure::from)?;
        let objects = self.objects(ctx, &binary).await?;
        sink.emit(Event::Planned { ids: objects.iter().map(KubeObject::id).collect() });
        let in_place: HashSet<&str> =
            preview.items.iter().filter(|i| i.action == PlanAction::Unchanged).map(|i| i.id.as_str()).collect();
        let mut to_apply = Vec::new();
        for (i, object) in objects.iter().enumerate() {
            let id = object.id();
            if in_place.contains(id.as_str()) {
                sink.emit(Event::InPlace { id, note: Some("`kubectl diff` shows no difference".into()) });
            } else {
                to_apply.push(i);
            }
        }
        if !to_apply.is_empty() {
            self.apply_objects(ctx, sink, &binary, &objects, &to_apply, "apply").await?;
        }
        self.report_outputs(ctx, sink, &binary).await
    }

    async fn recover(&self, ctx: &StepContext, prior: &PriorStep, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        let binary = self.resolve_binary(ctx).map_err(Failure::from)?;
        let objects = self.objects(ctx, &binary).await?;
        sink.emit(Event::Planned { ids: objects.iter().map(KubeObject::id).collect() });
        self.settle_unmatched_records(&objects, prior, sink);
        let plan = self.plan_recovery(ctx, &binary, &objects, prior, Some(sink)).await?;
        if let Some(error) = &plan.diff_error {
            sink.emit(Event::Warning {
                message: format!(
                    "`kubectl diff` failed ({error}); `kubectl get` decides which objects exist: applying every object missing, not returned or not recorded done"
                ),
            });
        }
        if !plan.unmatched.is_empty() {
            sink.emit(Event::Warning { message: unmatched_words(&plan.unmatched) });
        }
        let mut waits = Vec::new();
        for &i in &plan.in_place {
            if self.wait.unwrap_or(true) && objects[i].is_workload() {
                waits.push(i);
            } else {
                sink.emit(Event::Done {
                    id: objects[i].id(),
                    note: Some("already in place: `kubectl diff` shows no difference".into()),
                });
            }
        }
        let to_apply: Vec<usize> = plan.apply.iter().map(|(i, _)| *i).collect();
        let result = if to_apply.is_empty() {
            Ok(())
        } else {
            self.apply_objects(ctx, sink, &binary, &objects, &to_apply, "recover").await
        };
        // Workloads already in place that a failed rollout left not done: wait for them again.
        let waited = if waits.is_empty() {
            Ok(())
        } else {
            for &i in &waits {
                sink.emit(Event::Started { id: objects[i].id() });
            }
            let deadline = crate::saturating_deadline(ctx.timeout.unwrap_or(DEFAULT_ROLLOUT_TIMEOUT));
            let failed = self.wait_rollouts(ctx, sink, &binary, &objects, &waits, deadline).await?;
            if failed.is_empty() {
                Ok(())
            } else {
                Err(summarize(&failed, objects.len(), None))
            }
        };
        result.and(waited)?;
        self.report_outputs(ctx, sink, &binary).await?;
        Ok(Recovered::Complete)
    }

    async fn inspect(&self, ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        let binary = self.resolve_binary(ctx).map_err(Failure::from)?;
        let objects = self.objects(ctx, &binary).await?;
        let plan = self.plan_recovery(ctx, &binary, &objects, prior, None).await?;
        let mut inspection = Inspection::default();
        if let Some(error) = &plan.diff_error {
            inspection.actions.push(format!(
                "`kubectl diff` failed ({error}): `kubectl get` decides which objects exist, and the checkpoint the rest"
            ));
        }
        if !plan.unmatched.is_empty() {
            inspection.actions.push(unmatched_words(&plan.unmatched));
        }
        for (i, reason) in &plan.apply {
            inspection.actions.push(format!("apply {} ({})", objects[*i].id(), reason.words()));
            inspection.remaining.push(objects[*i].id());
        }
        for &i in &plan.in_place {
            if self.wait.unwrap_or(true) && objects[i].is_workload() {
                inspection
                    .actions
                    .push(format!("wait for the rollout of {} (in place, not recorded done)", objects[i].id()));
                inspection.remaining.push(objects[i].id());
            } else {
                inspection
                    .actions
                    .push(format!("mark {} done: in place, `kubectl diff` shows no difference", objects[i].id()));
            }
        }
        let kept = if plan.diff_error.is_some() { "done and in the cluster" } else { "done and unchanged" };
        for &i in &plan.keep {
            inspection.actions.push(format!("keep {}: {kept}", objects[i].id()));
        }
        let ids: HashSet<String> = objects.iter().map(KubeObject::id).collect();
        for gone in prior.sub_changes.iter().filter(|s| !ids.contains(&s.id)) {
            match rescoped(&objects, &gone.id) {
                Some(now) => inspection.actions.push(rescoped_words(&gone.id, &now)),
                None => inspection.actions.push(format!("leave {} alone: no longer in the manifests", gone.id)),
            }
        }
        Ok(inspection)
    }

    async fn preview(&self, ctx: &StepContext) -> Result<Preview, crate::preview::PreviewError> {
        self.preview_objects(ctx).await
    }

    /// The resourceVersion of each object the step applies, read again by the same read-only preview.
    async fn observe(&self, ctx: &StepContext) -> Result<Vec<crate::preview::Observed>, crate::preview::PreviewError> {
        Ok(self.preview_objects(ctx).await?.observed)
    }

    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        let cd = format!("cd {}", shell_quote(ctx.stack_dir));
        let mut doc = RecoveryDoc::default();
        doc.inspect.push(format!(
            "{cd} && {}    # read-only; exit 0: no difference, 1: differences, >1: error",
            display_command(&self.runbook_words(&["diff"]))
        ));
        doc.recover.push(format!("rdeploy recover {}", ctx.stack_file));
        doc.notes.push(format!(
            "by hand: `{cd} && {}` (apply is idempotent: objects already in place come back `unchanged`)",
            display_command(&self.runbook_words(&["apply"]))
        ));
        doc.notes
            .push("a directory holding a `kustomization.yaml` is applied with `-k DIR` rather than `-f DIR`".into());
        if let Some(prior) = prior {
            let not_done: Vec<String> = prior
                .sub_changes
                .iter()
                .filter(|s| s.status != SubStatus::Done)
                .map(|s| match &s.error {
                    Some(e) => format!("{} ({}: {e})", s.id, s.status.as_str()),
                    None => format!("{} ({})", s.id, s.status.as_str()),
                })
                .collect();
            if not_done.is_empty() {
                doc.notes.push("every object is recorded done".into());
            } else {
                doc.notes.push(format!("objects not done: {}", not_done.join("; ")));
            }
            for s in &prior.sub_changes {
                if let Some(words) = self.rollout_words(&s.id) {
                    doc.verify.push(display_command(&words));
                }
            }
        }
        if doc.verify.is_empty() {
            doc.verify.push(format!(
                "{cd} && {}    # exits 0 when everything is in place",
                display_command(&self.runbook_words(&["diff"]))
            ));
        }
        doc
    }

    fn own_context(&self) -> Option<&str> {
        self.context.as_deref()
    }
}

/// Decides, object by object, what recover does from `kubectl diff`'s exit code (0: no
/// difference, 1: differences) and stdout, and the checkpoint. A diff that failed as a whole
/// never comes here: `kubectl get` decides then ([`plan_from_presence`]).
fn plan_from_diff(objects: &[KubeObject], prior: &PriorStep, code: i32, stdout: Vec<String>) -> RecoveryPlan {
    let mut plan = RecoveryPlan::default();
    let entries = if code == 0 { Vec::new() } else { parse_diff(&stdout) };
    let by_name: HashMap<String, bool> = entries.iter().map(|e| (e.name.clone(), e.missing)).collect();
    // An object absent from the diff is in place only if the diff was read whole: every
    // file it names is one of the objects, and exit 1 (differences) names at least one.
    let names: HashSet<String> = objects.iter().map(KubeObject::diff_name).collect();
    plan.unmatched = entries.iter().filter(|e| !names.contains(&e.name)).map(|e| e.name.clone()).collect();
    let matched = by_name.keys().filter(|n| names.contains(*n)).count();
    let unsure = code == 1 && (!plan.unmatched.is_empty() || matched == 0);
    for (i, object) in objects.iter().enumerate() {
        let done = prior.status_of(&object.id()) == Some(SubStatus::Done);
        match by_name.get(&object.diff_name()) {
            Some(true) => plan.apply.push((i, Reason::Missing)),
            Some(false) => plan.apply.push((i, Reason::Differs)),
            None if unsure => plan.apply.push((i, Reason::Unmatched)),
            None if done => plan.keep.push(i),
            None => plan.in_place.push(i),
        }
    }
    plan
}

/// Which objects `kubectl get` returned, and whether every one it did not return is known
/// missing (NotFound, or a kind the API cannot map) rather than skipped for another error.
#[derive(Debug, Default)]
struct Presence {
    found: HashSet<usize>,
    /// Every object not found is missing: stderr held no error but unmappable kinds.
    sure: bool,
}

/// Reads `kubectl get -o json` (one object, or a `List` of them) and its stderr. An object is
/// found when one returned has its API group, kind, namespace and name (the version may be
/// another served one).
fn presence_from_get(objects: &[KubeObject], stdout: &str, stderr: &[String]) -> Presence {
    let group = |api_version: &str| api_version.rsplit_once('/').map(|(g, _)| g.to_string()).unwrap_or_default();
    let key = |api_version: &str, kind: &str, ns: Option<&str>, name: &str| {
        (group(api_version), kind.to_string(), ns.unwrap_or("").to_string(), name.to_string())
    };
    let mut returned = HashSet::new();
    let mut parsed = true;
    if !stdout.trim().is_empty() {
        match serde_json::from_str::<serde_json::Value>(stdout) {
            Ok(value) => {
                let items = match value.get("items").and_then(|i| i.as_array()) {
                    Some(items) if value["kind"] == "List" => items.clone(),
                    _ => vec![value],
                };
                for item in &items {
                    let s = |p: &str| item.pointer(p).and_then(|v| v.as_str()).unwrap_or("");
                    let ns = Some(s("/metadata/namespace")).filter(|n| !n.is_empty());
                    returned.insert(key(s("/apiVersion"), s("/kind"), ns, s("/metadata/name")));
                }
            }
            Err(_) => parsed = false,
        }
    }
    let found = (0..objects.len())
        .filter(|&i| {
            let o = &objects[i];
            returned.contains(&key(&o.api_version, &o.kind, o.namespace.as_deref(), &o.name))
        })
        .collect();
    // kubectl prints an unmappable kind as `error: resource mapping not found for name: ...`,
    // then (with more than one) the rest again without `error: `, each followed by
    // `ensure CRDs are installed first`.
    let sure = parsed
        && stderr.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).all(|l| {
            l.trim_start_matches("error: ").starts_with("resource mapping not found for name:")
                || l == "ensure CRDs are installed first"
        });
    Presence { found, sure }
}

/// What recover applies when `kubectl diff` failed: every object `kubectl get` did not return
/// (missing when every skip was NotFound or an unmappable kind, not confirmed otherwise) and
/// every object not recorded done; an object recorded done and returned is kept. Nothing is
/// taken as in place: existing is not matching.
fn plan_from_presence(objects: &[KubeObject], prior: &PriorStep, error: String, presence: &Presence) -> RecoveryPlan {
    let mut plan = RecoveryPlan { diff_error: Some(error), ..RecoveryPlan::default() };
    for (i, object) in objects.iter().enumerate() {
        let done = prior.status_of(&object.id()) == Some(SubStatus::Done);
        match (presence.found.contains(&i), done) {
            (true, true) => plan.keep.push(i),
            (true, false) => plan.apply.push((i, Reason::NotDone)),
            (false, _) if presence.sure => plan.apply.push((i, Reason::Missing)),
            (false, _) => plan.apply.push((i, Reason::Unconfirmed)),
        }
    }
    plan
}

/// The object a record names under the other scope: `Kind/namespace/name` recorded when the
/// API did not know the kind (its CRD came later) or knew it as namespaced, and the object is
/// `Kind/name` now; or `Kind/name` recorded and the kind is namespaced now. Only when exactly
/// one object has that kind and name.
fn rescoped(objects: &[KubeObject], recorded: &str) -> Option<String> {
    let parts: Vec<&str> = recorded.split('/').collect();
    let (kind, name, was_namespaced) = match parts[..] {
        [kind, _, name] => (kind, name, true),
        [kind, name] => (kind, name, false),
        _ => return None,
    };
    let mut found =
        objects.iter().filter(|o| o.kind == kind && o.name == name && o.namespace.is_some() != was_namespaced);
    let object = found.next()?;
    found.next().is_none().then(|| object.id())
}

/// What recover says of a record it renames to an object's identity now.
fn rescoped_words(recorded: &str, now: &str) -> String {
    format!(
        "{recorded} is {now} now: recorded when the API gave its kind another scope (its CRD was not installed yet, or was created again with another scope); recorded as {now} from here on, and judged by `kubectl diff`, not by the old record"
    )
}

/// The warning for diff files that match no object.
fn unmatched_words(unmatched: &[String]) -> String {
    format!(
        "`kubectl diff` named {} that match no object of the step ({}); every object it did not name is applied again rather than taken as in place",
        if unmatched.len() == 1 { "a file" } else { "files" },
        unmatched.join(", ")
    )
}

/// Splits the selected objects into apply batches: CRDs (with the Namespaces before them) go
/// first on their own when custom resources of theirs follow, because kubectl maps every
/// object's kind before it applies any.
fn batches(objects: &[KubeObject], selected: &[usize]) -> Vec<Vec<usize>> {
    let defined: HashSet<&str> = selected
        .iter()
        .filter(|&&i| objects[i].kind == "CustomResourceDefinition")
        .filter_map(|&i| objects[i].body.pointer("/spec/names/kind").and_then(|k| k.as_str()))
        .collect();
    let needs_split = selected.iter().any(|&i| defined.contains(objects[i].kind.as_str()));
    if !needs_split {
        return vec![selected.to_vec()];
    }
    let (first, rest): (Vec<usize>, Vec<usize>) =
        selected.iter().partition(|&&i| matches!(objects[i].kind.as_str(), "Namespace" | "CustomResourceDefinition"));
    vec![first, rest]
}

/// `0003.json`: the file an object is staged in (its position in the apply order), which
/// kubectl's client-side error lines quote.
fn file_name(index: usize) -> String {
    format!("{:04}.json", index + 1)
}

/// Writes one JSON file per selected object into a fresh `work_dir/LABEL/`.
fn stage(ctx: &StepContext, label: &str, objects: &[KubeObject], selected: &[usize]) -> Result<PathBuf, Failure> {
    let dir = ctx.work_dir.join("objects").join(label);
    let io =
        |what: &str, path: &Path, e: std::io::Error| Failure::new(format!("could not {what} {}: {e}", path.display()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| io("clear", &dir, e))?;
    }
    crate::private::create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
    for &i in selected {
        let path = dir.join(file_name(i));
        let text = serde_json::to_string_pretty(&objects[i].body).expect("json values serialize");
        crate::private::write(&path, text.as_bytes()).map_err(|e| io("write", &path, e))?;
    }
    Ok(dir)
}

fn read_documents(path: &Path) -> Result<Vec<serde_json::Value>, Failure> {
    let text =
        std::fs::read_to_string(path).map_err(|e| Failure::new(format!("could not read {}: {e}", path.display())))?;
    manifest::parse_documents(&text).map_err(|e| Failure::new(format!("{} does not parse: {e}", path.display())))
}

/// A failed kubectl call whose summary is kubectl's first error message, whole, on one line
/// (the last line of a message that spans lines is only its tail).
fn kubectl_failure(command: &str, outcome: &Outcome, stderr: &[String]) -> Failure {
    let mut failure = Failure::from_process(command, outcome);
    if let Some(error) = first_error(stderr).filter(|_| !outcome.interrupted && !outcome.timed_out) {
        failure.summary = format!("`{command}` {}: {error}", outcome.describe_status());
    }
    failure
}

/// One line for the step: how many objects failed and the first one's error.
fn summarize(failed: &[(String, String)], total: usize, process: Option<(&str, &Outcome)>) -> Failure {
    let (id, error) = &failed[0];
    let summary = format!("{} of {total} objects failed; {id}: {error}", failed.len());
    let mut failure = match process {
        Some((command, outcome)) => Failure { summary, ..Failure::from_process(command, outcome) },
        None => Failure::new(summary),
    };
    failure.hint = Some(
        "fix the cause, then `rdeploy recover` runs `kubectl diff` and applies only the objects missing, different or not done"
            .into(),
    );
    // The log has every line whole; the report's tail does not need a 300 KiB patch kubectl
    // quoted (`error when applying patch:` over a big object).
    for line in &mut failure.stderr_tail {
        if line.len() > TAIL_LINE_MAX {
            let cut = (0..=TAIL_LINE_MAX).rev().find(|&i| line.is_char_boundary(i)).unwrap_or(0);
            let more = line.len() - cut;
            line.truncate(cut);
            line.push_str(&format!("… ({more} more bytes in the log)"));
        }
    }
    failure
}

/// The longest stderr line a failure's tail keeps whole.
const TAIL_LINE_MAX: usize = 500;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PriorSubChange;

    fn spec() -> KubectlSpec {
        KubectlSpec {
            manifests: vec!["k8s/app.yaml".into()],
            namespace: None,
            context: Some("c1".into()),
            kubeconfig: None,
            cluster_kubeconfig: None,
            server_side: None,
            wait: Some(true),
            binary: None,
            outputs: Default::default(),
        }
    }

    #[test]
    fn runbook_has_the_exact_commands() {
        let ctx = DescribeContext { step: "extras", stack_file: "stack.yaml", stack_dir: "deploy", resumable: true };
        let prior = PriorStep {
            sub_changes: vec![
                PriorSubChange { id: "Namespace/shop".into(), status: SubStatus::Done, error: None },
                PriorSubChange {
                    id: "Deployment/shop/web".into(),
                    status: SubStatus::Failed,
                    error: Some("rollout did not finish".into()),
                },
            ],
            facts: Default::default(),
        };
        let doc = spec().describe_recovery(&ctx, Some(&prior));
        assert!(
            doc.inspect[0].starts_with("cd deploy && kubectl diff -f k8s/app.yaml --context c1"),
            "{:?}",
            doc.inspect
        );
        assert_eq!(doc.recover, ["rdeploy recover stack.yaml"]);
        assert!(doc.notes[0].contains("`cd deploy && kubectl apply -f k8s/app.yaml --context c1`"), "{:?}", doc.notes);
        assert!(
            doc.notes.iter().any(|n| n == "objects not done: Deployment/shop/web (failed: rollout did not finish)"),
            "{:?}",
            doc.notes
        );
        assert_eq!(doc.verify, ["kubectl rollout status deployment/web -n shop --context c1"]);
        assert_eq!(
            KubectlSpec { namespace: Some("shop".into()), ..spec() }.cluster_rollback(None).as_deref(),
            Some("`kubectl rollout undo deployment/NAME -n shop --context c1` for each workload the manifests change (`kubectl rollout history deployment/NAME -n shop --context c1` lists its revisions)")
        );
    }

    /// A fleet cluster's kubectl runs with the kubeconfig cut for it, and is shown with the
    /// step's `kubeconfig`.
    #[test]
    fn a_clusters_own_kubeconfig_is_run_and_the_users_is_shown() {
        let ctx = crate::testing::step_context(Path::new("/stack"));
        let spec = KubectlSpec {
            kubeconfig: Some("kube/fleet.yaml".into()),
            cluster_kubeconfig: Some("/work/kubeconfig".into()),
            ..spec()
        };
        let cmd = spec.command(&ctx, Path::new("kubectl")).arg("diff");
        assert_eq!(cmd.display(), "kubectl --kubeconfig /stack/kube/fleet.yaml --context c1 diff");
        assert_eq!(cmd.run_args(), ["--kubeconfig", "/work/kubeconfig", "--context", "c1", "diff"]);
        // The rollback an operator pastes: the user's file as kubectl found it, else as written.
        let running = spec.cluster_rollback(Some(&ctx)).expect("kubectl rolls back");
        assert!(
            running
                .starts_with("`kubectl rollout undo deployment/NAME --kubeconfig /stack/kube/fleet.yaml --context c1`"),
            "{running}"
        );
        let written = spec.cluster_rollback(None).expect("kubectl rolls back");
        assert!(
            written.starts_with("`kubectl rollout undo deployment/NAME --kubeconfig kube/fleet.yaml --context c1`"),
            "{written}"
        );
    }

    #[test]
    fn crds_get_a_batch_of_their_own_only_when_needed() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\nspec: {group: example.com, scope: Namespaced, names: {kind: Widget, plural: widgets}}\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n";
        let docs = manifest::parse_documents(text).unwrap();
        let scopes = Scopes::with_captured_discovery(&docs);
        let mut objs = manifest::objects_from_documents(docs, Path::new("x.yaml"), "default", &scopes).unwrap();
        manifest::order(&mut objs);
        assert_eq!(batches(&objs, &[0, 1, 2]), vec![vec![0], vec![1, 2]]);
        assert_eq!(batches(&objs, &[1]), vec![vec![1]]);
    }

    #[test]
    fn a_record_under_the_other_scope_names_the_one_object_of_that_kind_and_name() {
        let text = "apiVersion: cert-manager.io/v1\nkind: ClusterIssuer\nmetadata: {name: le}\n---\napiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: s, namespace: a}\n---\napiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: t, namespace: a}\n---\napiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: t, namespace: b}\n";
        let docs = manifest::parse_documents(text).unwrap();
        let scopes = Scopes::with_captured_discovery(&docs);
        let objs = manifest::objects_from_documents(docs, Path::new("x.yaml"), "default", &scopes).unwrap();
        assert_eq!(rescoped(&objs, "ClusterIssuer/default/le").as_deref(), Some("ClusterIssuer/le"));
        assert_eq!(rescoped(&objs, "Issuer/s").as_deref(), Some("Issuer/a/s"));
        // Two objects could be it: no guess.
        assert_eq!(rescoped(&objs, "Issuer/t"), None);
        // Same scope, another namespace: a different object, not a rename.
        assert_eq!(rescoped(&objs, "Issuer/c/s"), None);
        assert_eq!(rescoped(&objs, "ClusterIssuer/other"), None);
    }

    #[test]
    fn empty_manifests_are_a_problem() {
        let mut s = spec();
        s.manifests.clear();
        s.namespace = Some(" ".into());
        let problems = s.problems();
        assert_eq!(problems.len(), 2);
        assert_eq!(problems[0].at, vec![PathSegment::Key("manifests")]);
    }

    fn captured(name: &str) -> Vec<String> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/kubectl/captured").join(name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn app_done() -> (Vec<KubeObject>, PriorStep) {
        let text = include_str!("../../../fixtures/kubectl/app/app.yaml");
        let docs = manifest::parse_documents(text).unwrap();
        let scopes = Scopes::with_captured_discovery(&docs);
        let objs = manifest::objects_from_documents(docs, Path::new("app.yaml"), "default", &scopes).unwrap();
        let prior = PriorStep {
            sub_changes: objs
                .iter()
                .map(|o| PriorSubChange { id: o.id(), status: SubStatus::Done, error: None })
                .collect(),
            facts: Default::default(),
        };
        (objs, prior)
    }

    #[test]
    fn a_diff_read_whole_keeps_what_it_does_not_name() {
        let (objs, prior) = app_done();
        let plan = plan_from_diff(&objs, &prior, 1, captured("diff-drift-and-missing.stdout"));
        assert!(plan.unmatched.is_empty(), "{plan:?}");
        assert_eq!(plan.apply, vec![(1, Reason::Differs), (4, Reason::Missing)]);
        assert_eq!(plan.keep, vec![0, 2, 3]);
    }

    #[test]
    fn recover_never_keeps_an_object_the_diff_could_not_be_matched_to() {
        // The objects named otherwise than kubectl names them (a cluster-scoped kind recorded
        // under a namespace did this): kubectl's diff files match none of them, so nothing it
        // left unnamed is known to be in place.
        let (mut objs, prior) = app_done();
        for o in &mut objs {
            o.namespace = Some("elsewhere".into());
        }
        let plan = plan_from_diff(&objs, &prior, 1, captured("diff-drift-and-missing.stdout"));
        assert_eq!(plan.unmatched, ["v1.ConfigMap.shop-extra.extra", "v1.ConfigMap.shop.settings"]);
        assert!(plan.keep.is_empty() && plan.in_place.is_empty(), "{plan:?}");
        assert_eq!(plan.apply.len(), 5);
        assert!(plan.apply.iter().all(|(_, r)| *r == Reason::Unmatched));
        // Exit 1 with no file named at all (another differ's output): the same.
        let (objs, prior) = app_done();
        let plan = plan_from_diff(&objs, &prior, 1, vec!["--- a".into(), "+++ b".into()]);
        assert_eq!(plan.apply.len(), 5, "{plan:?}");
        // Exit 0: everything done stays.
        let plan = plan_from_diff(&objs, &prior, 0, Vec::new());
        assert_eq!(plan.keep.len(), 5);
    }

    /// `kubectl get -f DIR --ignore-not-found -o json` when `kubectl diff` failed as a whole:
    /// only the objects returned are kept; a skip for a kind the API cannot map (or NotFound,
    /// which prints nothing) is missing, and any other error leaves the rest unconfirmed.
    #[test]
    fn when_the_diff_fails_only_objects_kubectl_get_returns_are_kept() {
        let (objs, prior) = app_done();
        let item = |o: &KubeObject| {
            let mut v = serde_json::json!({"apiVersion": o.api_version, "kind": o.kind, "metadata": {"name": o.name}});
            if let Some(ns) = &o.namespace {
                v["metadata"]["namespace"] = ns.clone().into();
            }
            v
        };
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [item(&objs[0]), item(&objs[2])]});
        let mapping = vec![
            "error: resource mapping not found for name: \"g\" namespace: \"web\" from \"d/0002.json\": no matches for kind \"Gadget\" in version \"example.com/v1\"".to_string(),
            "ensure CRDs are installed first".to_string(),
        ];
        let presence = presence_from_get(&objs, &list.to_string(), &mapping);
        assert!(presence.sure);
        let plan = plan_from_presence(&objs, &prior, "mapping".into(), &presence);
        assert_eq!(plan.keep, vec![0, 2]);
        assert!(plan.in_place.is_empty());
        assert_eq!(plan.apply, vec![(1, Reason::Missing), (3, Reason::Missing), (4, Reason::Missing)]);

        // One object alone comes back as itself, not in a List.
        let presence = presence_from_get(&objs, &item(&objs[3]).to_string(), &[]);
        assert_eq!(presence.found, HashSet::from([3]));

        // Another error (forbidden, the API down): what was not returned is not known missing,
        // and nothing is kept that was not returned.
        let forbidden = vec!["Error from server (Forbidden): configmaps \"settings\" is forbidden".to_string()];
        let presence = presence_from_get(&objs, &list.to_string(), &forbidden);
        assert!(!presence.sure);
        let plan = plan_from_presence(&objs, &prior, "forbidden".into(), &presence);
        assert_eq!(plan.keep, vec![0, 2]);
        assert!(plan.apply.iter().all(|(_, r)| *r == Reason::Unconfirmed), "{plan:?}");
        let presence = presence_from_get(&objs, "", &forbidden);
        let plan = plan_from_presence(&objs, &prior, "forbidden".into(), &presence);
        assert!(plan.keep.is_empty() && plan.apply.len() == 5, "{plan:?}");
    }
}

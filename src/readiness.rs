//! Done means every pod is on the new version and ready: after a single-cluster helm or
//! kubectl step's tool succeeds, every workload the step touched (a helm release's
//! Deployments, DaemonSets, StatefulSets and Jobs, or the workloads a kubectl step applied) is
//! read through the API until its rollout is complete, within the step's `timeout`. A workload
//! short of that fails the sub-change, naming the pods that hold it back from their own status
//! (pod, node, reason), as `kubectl describe` tells it. When the tool itself fails, the same
//! read (once, without waiting) names the stragglers in the failure.
//!
//! The judgement is the fleet's ([`crate::fleet::collect`] reads and evaluates, the model's
//! [`Workload::complete`] decides); this module only knows which workloads a step touched and
//! holds the step's Done events back until they are true. It does not wait for fleet steps
//! (the rollout runner reads each cluster itself) nor for a step with `wait: false`, whose
//! sub-changes say they were not waited for.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdeploy_adapters::{kubeconfig, Adapter, Event, EventSink, Failure, Recovered, StepContext, Touched};

use crate::fleet::collect::{collect, CollectOptions};
use crate::fleet::model::{ClusterInventory, Kind, Presence, Workload};
use crate::fleet::scope::{read_found, Scope};
use crate::fleet::state::LastSeen;
use crate::stack::Step;

/// How long the check may take when the step sets no `timeout` (helm's and kubectl's default).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How often an unfinished rollout is read again.
const POLL: Duration = Duration::from_millis(500);
/// The budget of one read of the cluster.
const READ_TIMEOUT: Duration = Duration::from_secs(15);
/// Pods named per straggling workload; the rest are counted.
const PODS_NAMED: usize = 3;
/// What a sub-change not checked says.
const NOT_WAITED: &str = "not waited for (`wait: false`): its pods may not be updated and ready";

/// What the step touched, and where.
#[derive(Clone, Debug)]
struct Target {
    /// The kubeconfig files the step's tool reads ([`kubeconfig::for_step`]).
    kubeconfig: kubeconfig::Found,
    context: Option<String>,
    /// The namespace to read (`None`: all of them).
    namespace: Option<String>,
    touched: Touched,
}

/// An [`EventSink`] between a single-cluster helm or kubectl step and the journal: it passes
/// every event on, except the Done and Failed events of the sub-changes whose workloads must be
/// checked, which [`Held::settle`] emits once the check has spoken.
pub struct Held<'a> {
    inner: &'a dyn EventSink,
    target: Option<Target>,
    /// `wait: false` on a helm or kubectl step: Done events say they were not waited for.
    not_waited: bool,
    started: Instant,
    timeout: Duration,
    cancel: tokio_util::sync::CancellationToken,
    held: Mutex<Vec<Event>>,
    /// The not-waited-for warning went out.
    warned: std::sync::atomic::AtomicBool,
    /// What `recover` applies again, in the tool's words ([`Adapter::reapplies`]).
    reapplies: Option<&'static str>,
}

impl<'a> Held<'a> {
    /// Holds for `step` when it is a single-cluster helm or kubectl step that waits (the
    /// default); passes everything through otherwise.
    pub fn new(step: &Step, ctx: &StepContext, inner: &'a dyn EventSink) -> Held<'a> {
        // The rollout runner reads a fleet step's clusters itself.
        let workloads = step.fleet.is_none().then(|| step.spec.workloads(ctx)).flatten();
        let (target, not_waited) = match workloads {
            None => (None, false),
            Some(w) if !w.wait => (None, true),
            Some(w) => (
                Some(Target {
                    kubeconfig: kubeconfig::for_step(step.spec.kube_target().and_then(|t| t.kubeconfig), ctx),
                    context: w.context,
                    namespace: w.namespace,
                    touched: w.touched,
                }),
                false,
            ),
        };
        Held {
            inner,
            target,
            not_waited,
            started: Instant::now(),
            timeout: ctx.timeout.unwrap_or(DEFAULT_TIMEOUT),
            cancel: ctx.cancel.clone(),
            held: Mutex::new(Vec::new()),
            warned: std::sync::atomic::AtomicBool::new(false),
            reapplies: step.spec.reapplies(),
        }
    }

    /// Whether the sub-change `id` is one whose workloads are checked.
    fn checked(&self, id: &str) -> bool {
        match &self.target {
            Some(Target { touched: Touched::Release { .. }, .. }) => true,
            Some(Target { touched: Touched::Objects, .. }) => workload_of(id).is_some(),
            None => false,
        }
    }

    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// After the tool: on success, waits until every touched workload is complete (or the
    /// step's timeout passes) and emits the held events, a Done whose workloads are short of
    /// that becoming Failed; on failure, names the stragglers in the failure.
    pub async fn settle(&self, result: Result<Recovered, Failure>) -> Result<Recovered, Failure> {
        let held = self.take();
        let Some(target) = self.target.clone() else {
            for event in held {
                self.inner.emit(event);
            }
            return result;
        };
        match result {
            Ok(done) if held.is_empty() => Ok(done),
            Ok(done) => {
                let deadline = self.started + self.timeout;
                match self.wait_complete(&target, &held, deadline).await {
                    Ok(()) => {
                        for event in held {
                            self.inner.emit(event);
                        }
                        Ok(done)
                    }
                    Err(Verdict::Interrupted) => {
                        // Not done: nobody saw the pods ready. `recover` checks again (the
                        // tool finds what it applied in place and the check decides).
                        self.fail_held(held, "interrupted before every pod was seen updated and ready", &[]);
                        Err(Failure {
                            interrupted: true,
                            ..Failure::new("interrupted while checking that every pod is ready")
                        })
                    }
                    Err(Verdict::Unreadable(Unread { why, hint })) => {
                        let summary = format!("applied, but its rollout could not be checked: {why}");
                        self.fail_held(held, &summary, &[]);
                        let first = hint.unwrap_or_else(|| "check the pods (`kubectl get pods`)".into());
                        Err(Failure::new(summary).with_hint(format!(
                            "{first}, then `rdeploy recover` checks again without applying anything the tool reports in place"
                        )))
                    }
                    Err(Verdict::Stragglers(stragglers)) => {
                        let waited = humantime::format_duration(Duration::from_secs(self.timeout.as_secs()));
                        let summary =
                            format!("not every pod is updated and ready after {waited}: {}", join(&stragglers));
                        self.fail_held(held, &summary, &stragglers);
                        let tool = self.reapplies.map(|r| format!(" ({r})")).unwrap_or_default();
                        Err(Failure::new(summary).with_hint(format!(
                            "fix what holds the pods back (above), then `rdeploy recover` checks again; it applies again only what changed{tool}"
                        )))
                    }
                }
            }
            Err(mut failure) => {
                let stragglers = if failure.interrupted || self.cancel.is_cancelled() {
                    Vec::new()
                } else {
                    match self.read(&target).await {
                        Ok(cluster) => stragglers(&target, &cluster, &held, true),
                        Err(_) => Vec::new(),
                    }
                };
                if !stragglers.is_empty() {
                    failure.summary = format!("{}; not ready: {}", failure.summary, join(&stragglers));
                }
                for event in held {
                    match event {
                        Event::Failed { id, error } if !stragglers.is_empty() => {
                            let mine = mine(&target, &id, &stragglers);
                            let error =
                                if mine.is_empty() { error } else { format!("{error}; not ready: {}", join(&mine)) };
                            self.inner.emit(Event::Failed { id, error });
                        }
                        other => self.inner.emit(other),
                    }
                }
                Err(failure)
            }
        }
    }

    /// Emits the held events, the sub-changes whose workloads straggle as failed: a helm
    /// revision with the whole summary, a kubectl workload with its own line. Without
    /// stragglers (the cluster could not be read) every held sub-change fails with `summary`.
    fn fail_held(&self, held: Vec<Event>, summary: &str, stragglers: &[Straggler]) {
        let Some(target) = self.target.as_ref() else { return };
        for event in held {
            let Some(id) = event_id(&event).map(str::to_string) else { continue };
            let error = match target.touched {
                _ if stragglers.is_empty() => Some(summary.to_string()),
                Touched::Release { .. } => Some(summary.to_string()),
                Touched::Objects => {
                    let mine = mine(target, &id, stragglers);
                    (!mine.is_empty()).then(|| format!("not updated and ready: {}", join(&mine)))
                }
            };
            match error {
                Some(error) => self.inner.emit(Event::Failed { id, error }),
                None => self.inner.emit(event),
            }
        }
    }

    async fn read(&self, target: &Target) -> Result<ClusterInventory, Unread> {
        let (kubeconfig, source) = read_found(target.kubeconfig.clone())
            .map_err(|e| Unread { why: format!("{e:#}"), hint: target.kubeconfig.hint.clone() })?;
        let context = match target.context.clone().or_else(|| kubeconfig.current_context.clone()) {
            Some(c) => c,
            None => return Err(format!("no context given and no current context in {source}").into()),
        };
        // Where the tool wrote: a helm release without `namespace` is in the context's
        // namespace (else `default`), as helm picks it; never every namespace, which may be
        // forbidden to the user and holds other releases of the same name.
        let namespace = target.namespace.clone().or_else(|| match target.touched {
            Touched::Release { .. } => Some(
                kubeconfig
                    .contexts
                    .iter()
                    .find(|c| c.name == context)
                    .and_then(|c| c.context.as_ref()?.namespace.clone())
                    .unwrap_or_else(|| "default".to_string()),
            ),
            Touched::Objects => None,
        });
        let scope =
            Scope::select(&kubeconfig, source, std::slice::from_ref(&context), None).map_err(|e| format!("{e:#}"))?;
        let options = CollectOptions {
            timeout: READ_TIMEOUT,
            namespace,
            kinds: vec![Kind::Deployment, Kind::DaemonSet, Kind::StatefulSet, Kind::Job, Kind::Pod],
            gitops: false,
            concurrency: 1,
        };
        let inventory = collect(&scope, &options, &LastSeen::default()).await;
        let cluster = inventory.clusters.into_iter().next().ok_or_else(|| format!("no answer from `{context}`"))?;
        match &cluster.presence {
            Presence::Present => Ok(cluster),
            Presence::Absent { error, .. } => Err(format!("`{context}` did not answer: {error}").into()),
        }
    }

    async fn wait_complete(&self, target: &Target, held: &[Event], deadline: Instant) -> Result<(), Verdict> {
        loop {
            let last = match self.read(target).await {
                Ok(cluster) => {
                    let stragglers = stragglers(target, &cluster, held, false);
                    if stragglers.is_empty() {
                        return Ok(());
                    }
                    Verdict::Stragglers(stragglers)
                }
                Err(why) => Verdict::Unreadable(why),
            };
            if Instant::now() + POLL >= deadline {
                return Err(last);
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = self.cancel.cancelled() => return Err(Verdict::Interrupted),
            }
        }
    }
}

enum Verdict {
    Stragglers(Vec<Straggler>),
    Unreadable(Unread),
    Interrupted,
}

/// Why the cluster could not be read, and what to do first when it says more than "check the
/// pods" ([`kubeconfig::Found::hint`]).
struct Unread {
    why: String,
    hint: Option<String>,
}

impl From<String> for Unread {
    fn from(why: String) -> Unread {
        Unread { why, hint: None }
    }
}

/// A workload whose rollout is not complete, and why, in one line.
#[derive(Clone, Debug)]
struct Straggler {
    /// `Kind/namespace/name`, as kubectl sub-changes name it.
    id: String,
    why: String,
}

fn join(stragglers: &[Straggler]) -> String {
    stragglers.iter().map(|s| s.why.clone()).collect::<Vec<_>>().join("; ")
}

/// The stragglers that belong to sub-change `id`: all of them for a helm revision, the
/// workload itself for a kubectl object.
fn mine(target: &Target, id: &str, stragglers: &[Straggler]) -> Vec<Straggler> {
    match target.touched {
        Touched::Release { .. } => stragglers.to_vec(),
        Touched::Objects => stragglers.iter().filter(|s| s.id == id).cloned().collect(),
    }
}

/// `(kind, namespace, name)` of a kubectl sub-change that is a workload.
fn workload_of(id: &str) -> Option<(Kind, &str, &str)> {
    let mut parts = id.splitn(3, '/');
    let kind = match parts.next()? {
        "Deployment" => Kind::Deployment,
        "DaemonSet" => Kind::DaemonSet,
        "StatefulSet" => Kind::StatefulSet,
        "Job" => Kind::Job,
        _ => return None,
    };
    Some((kind, parts.next()?, parts.next()?))
}

fn event_id(event: &Event) -> Option<&str> {
    match event {
        Event::Done { id, .. } | Event::Failed { id, .. } | Event::InPlace { id, .. } => Some(id),
        _ => None,
    }
}

/// The touched workloads that are not complete, each with the pods holding it back.
/// `failed`: the tool failed, so the release's hook Jobs count too (helm waited for them).
fn stragglers(target: &Target, cluster: &ClusterInventory, held: &[Event], failed: bool) -> Vec<Straggler> {
    let pods: Vec<&Workload> = cluster.workloads.iter().filter(|w| w.kind == Kind::Pod).collect();
    let mut out = Vec::new();
    match &target.touched {
        Touched::Release { name } => {
            let ns = target.namespace.as_deref();
            for w in cluster.workloads.iter().filter(|w| w.kind != Kind::Pod) {
                let ours = match &w.meta.release {
                    Some(r) => r
                        .rsplit_once('/')
                        .is_some_and(|(rns, rname)| rname == name && ns.is_none_or(|ns| rns.is_empty() || rns == ns)),
                    // helm does not label hooks as the release's: a hook Job in the release's
                    // namespace named after it is taken for one of its hooks.
                    None => failed && w.meta.hook && w.kind == Kind::Job && ns.is_none_or(|ns| w.namespace == ns),
                };
                if ours && !w.complete() {
                    out.push(describe(w, &pods));
                }
            }
        }
        Touched::Objects => {
            for id in held.iter().filter_map(event_id) {
                let Some((kind, ns, name)) = workload_of(id) else { continue };
                match cluster.workloads.iter().find(|w| w.kind == kind && w.namespace == ns && w.name == name) {
                    Some(w) if !w.complete() => out.push(describe(w, &pods)),
                    Some(_) => {}
                    None if !failed => out.push(Straggler { id: id.to_string(), why: format!("{id} not found") }),
                    None => {}
                }
            }
        }
    }
    out
}

/// One line: the workload's unfinished rollout, then its pods that are not ready or still run
/// an old image: `pod NAME on node NODE: REASON`.
fn describe(w: &Workload, pods: &[&Workload]) -> Straggler {
    let id = format!("{}/{}/{}", w.kind.name(), w.namespace, w.name);
    let label = format!("{} {}/{}", w.kind.name(), w.namespace, w.name);
    let facts: Vec<String> = w.rollout.iter().filter(|f| f.blocks()).map(|f| f.describe(&label)).collect();
    let mut why = if facts.is_empty() {
        match w.kind {
            Kind::Job => format!("{label} not complete"),
            _ => format!("{label} not ready"),
        }
    } else {
        facts.join(", ")
    };
    let behind: Vec<String> = pods
        .iter()
        .filter(|p| w.owns(p))
        .filter_map(|p| {
            let facts = p.pod.as_ref()?;
            if facts.phase == "Succeeded" {
                return None;
            }
            // Below a StatefulSet's partition a pod keeps the current revision by design.
            let ordinal = p.name.rsplit('-').next().and_then(|o| o.parse::<i64>().ok());
            let kept = w.kind == Kind::StatefulSet && ordinal.is_some_and(|o| o < w.meta.partition);
            let old = p.containers.iter().find(|c| !kept && !w.meta.images.contains(&c.image));
            let reason = match (&facts.waiting, old, facts.ready) {
                (Some(reason), _, _) => reason.clone(),
                (None, Some(c), _) => format!("still runs the old image {}", c.image),
                (None, None, false) => format!("{}, not ready", facts.phase),
                (None, None, true) => return None,
            };
            let node = facts.node.as_deref().map(|n| format!(" on node {n}")).unwrap_or_else(|| " (no node)".into());
            Some(format!("pod {}{node}: {reason}", p.name))
        })
        .collect();
    if !behind.is_empty() {
        let shown = behind.iter().take(PODS_NAMED).cloned().collect::<Vec<_>>().join(", ");
        let more = behind.len().saturating_sub(PODS_NAMED);
        why = format!("{why}: {shown}{}", if more > 0 { format!(" and {more} more") } else { String::new() });
    }
    Straggler { id, why }
}

impl EventSink for Held<'_> {
    fn emit(&self, event: Event) {
        match event {
            Event::Done { id, note } if self.not_waited => {
                if !self.warned.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    self.inner.emit(Event::Warning { message: NOT_WAITED.to_string() });
                }
                let note = Some(match note {
                    Some(n) => format!("{n}; {NOT_WAITED}"),
                    None => NOT_WAITED.to_string(),
                });
                self.inner.emit(Event::Done { id, note });
            }
            // What the tool found in place is checked too: "in place" is only as done as its pods.
            event @ (Event::Done { .. } | Event::Failed { .. } | Event::InPlace { .. })
                if event_id(&event).is_some_and(|id| self.checked(id)) =>
            {
                self.held.lock().unwrap_or_else(|e| e.into_inner()).push(event);
            }
            other => self.inner.emit(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hint after a failed check says what `recover` applies again in the step's tool's
    /// words: helm's revisions for a helm step, nothing of helm's for a kubectl step.
    #[test]
    fn what_recover_applies_again_is_said_in_the_steps_tools_words() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir_all(dir.path().join("chart")).expect("a chart directory");
        std::fs::write(dir.path().join("web.yaml"), "").expect("a manifest");
        let text = "name: s\nsteps:\n  - name: app\n    tool: helm\n    release: app\n    chart: chart\n  - name: web\n    tool: kubectl\n    manifests: [web.yaml]\n";
        let stack = crate::stack::parse(&dir.path().join("stack.yaml"), text).expect("the stack parses");
        let ctx = rdeploy_adapters::testing::step_context(dir.path());
        let sink = rdeploy_adapters::testing::Recorder::default();
        let said: Vec<(&str, Option<&str>)> =
            stack.ordered().map(|step| (step.name.as_str(), Held::new(step, &ctx, &sink).reapplies)).collect();
        assert_eq!(said, [("app", Some("helm: a new revision only if the chart or values changed")), ("web", None)]);
    }

    #[test]
    fn kubectl_workload_ids_are_recognised() {
        assert!(matches!(workload_of("DaemonSet/mon/agent"), Some((Kind::DaemonSet, "mon", "agent"))));
        assert!(matches!(workload_of("Job/default/seed"), Some((Kind::Job, "default", "seed"))));
        assert!(workload_of("Service/default/web").is_none());
        assert!(workload_of("ClusterIssuer/selfsigned").is_none());
        assert!(workload_of("Deployment/web").is_none());
    }
}

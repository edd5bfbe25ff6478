//! Fleet steps: a helm or kubectl step with `contexts:` (or `fleet:`) runs once per cluster,
//! in cumulative waves, each cluster one sub-change of the step (id: its context name).
//!
//! Inside a cluster the tool's adapter works as for a single-cluster step, with the cluster's
//! context passed through; [`ClusterSink`] folds its events into the cluster's sub-change
//! (started when the tool first starts a change there, done once the tool succeeded and a read
//! of the cluster through the API shows its workloads healthy) and keeps what the tool told
//! about the cluster as the step fact `cluster:NAME`. A cluster that does not answer a read in
//! `rollout.inventory_timeout` (or has no context) is absent: a straggler with `absent: skip`,
//! waited for (up to the step's `timeout`) with `absent: wait`, never a failure, unless its
//! tool had started changing it and failed (then it counts toward `max_failures`). Done clusters
//! are never applied again: `recover` (and a retry) skips them and goes on with the stragglers
//! and the waves not reached. A wave is done once its clusters are, and its bake has passed with
//! them still healthy (read again at its end); more failed clusters than `max_failures` stop
//! the rollout before any cluster of a later wave is touched.
//!
//! Facts the step journals (shape in docs/status-json.md): `rollout` (the start, the waves, the
//! settings), `waves_baked` (how many waves are through their bake), `bake` (the wave baking and
//! until when) and one `cluster:NAME` per cluster.

pub mod adapter;
pub mod plan;
pub mod report;
pub mod runbook;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use rdeploy_adapters::{
    Adapter, Converged, Event, EventSink, Failure, PriorStep, Recovered, StepContext, SubStatus, ToolSpec,
};
use serde_json::{json, Map, Value};
use time::OffsetDateTime;

use crate::fleet::analysis::{rfc3339, Selector};
use crate::fleet::collect::{collect, CollectOptions};
use crate::fleet::model::{ClusterInventory, Kind, Presence};
use crate::fleet::scope::{self, FleetFile, Member, Scope};
use crate::fleet::state::{LastSeen, RolloutStart, Rollouts};
use crate::stack::{AbsentPolicy, FleetStep, Step};

/// The prefix of the per-cluster step facts: `cluster:edge-17`.
pub const CLUSTER_FACT: &str = "cluster:";

/// How long `absent: wait` waits for a cluster when the step sets no `timeout`.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// How often a cluster that is absent, or applied but not yet healthy, is read again.
const POLL: Duration = Duration::from_millis(500);
/// How long an applied cluster may take to show healthy workloads (at most the step's timeout).
const HEALTH_WAIT: Duration = Duration::from_secs(60);

pub fn cluster_fact(name: &str) -> String {
    format!("{CLUSTER_FACT}{name}")
}

/// One fleet step's run.
pub struct FleetRun<'a> {
    pub step: &'a Step,
    pub fleet: &'a FleetStep,
    pub ctx: &'a StepContext,
    /// What the checkpoint knows of the step (empty on `up`).
    pub prior: &'a PriorStep,
    /// The local state directory: last-seen times and rollout starts (`fleet/`).
    pub state_dir: &'a Path,
    /// `up`: a cluster whose preview finds the release (or every object) in place is done
    /// without the tool applying anything there ([`Adapter::converge_step`]).
    pub converge: bool,
}

/// How one cluster's turn ended in this run.
#[derive(Debug)]
enum ClusterEnd {
    Done,
    Failed(String),
    /// Absent: a straggler (why, and when it was last seen).
    Absent(String),
    /// Not started: the rollout is stopping (failures, or a signal).
    NotStarted,
}

/// What a cluster whose tool run failed counts as.
#[derive(Debug, PartialEq, Eq)]
enum AfterFailure {
    /// Absent before its tool changed anything there: a straggler (why).
    Straggler(String),
    /// A failure toward `max_failures` (why).
    Failed(String),
}

/// Decides a cluster whose tool run failed, from whether it answers a read now (`absent`: why
/// not) and whether the tool had started changing it. A cluster that stops answering after its
/// tool started changing it and failed is a failure: the change may be what broke its API
/// server, and rolling on would spread it (`max_failures` must see it).
fn after_tool_failure(absent: Option<&str>, changing: bool, failure: &str) -> AfterFailure {
    match absent {
        None => AfterFailure::Failed(failure.to_string()),
        Some(why) if changing => {
            AfterFailure::Failed(format!("{failure}; then it stopped answering after the failure ({why})"))
        }
        Some(why) => AfterFailure::Straggler(format!("{why} (its tool failed before changing it: {failure})")),
    }
}

/// The clusters in scope, in the rollout's stable order: the fleet file's order, else by
/// context name (digit runs by value).
pub fn scope_of(step: &Step, fleet: &FleetStep, ctx: &StepContext) -> Result<(Vec<Member>, String), Failure> {
    // The files each cluster's own kubeconfig is cut from (`ToolSpec::use_own_kubeconfig`).
    let kubeconfig = step.spec.kube_target().and_then(|t| t.kubeconfig);
    let (kc, source) = scope::read_step_kubeconfig(kubeconfig, ctx).map_err(|e| {
        Failure::new(format!("cannot read the kubeconfig of fleet step `{}`: {e:#}", step.name))
            .with_hint("set `kubeconfig:` on the step or `KUBECONFIG`, then `rdeploy recover`")
    })?;
    let file = match &fleet.fleet_file {
        Some(path) => Some(FleetFile::load(path).map_err(|e| Failure::new(format!("{e:#}")))?),
        None => None,
    };
    let chosen = Scope::select(&kc, source.clone(), &fleet.contexts, file.as_ref())
        .map_err(|e| Failure::new(format!("fleet step `{}`: {e:#}", step.name)))?;
    let mut members = chosen.clusters;
    if let Some(text) = &fleet.selector {
        let selector = Selector::parse(text).map_err(|e| Failure::new(format!("`selector: {text}`: {e}")))?;
        members.retain(|m| selector.matches(&m.labels));
    }
    match &fleet.fleet_file {
        Some(path) => {
            let order = fleet_file_order(path);
            let at = |name: &str| order.iter().position(|n| n == name).unwrap_or(usize::MAX);
            members.sort_by(|a, b| at(&a.name).cmp(&at(&b.name)).then_with(|| plan::natural_cmp(&a.name, &b.name)));
        }
        None => members.sort_by(|a, b| plan::natural_cmp(&a.name, &b.name)),
    }
    if members.is_empty() {
        return Err(Failure::new(format!("fleet step `{}` has no cluster in scope", step.name)).with_hint(
            "check `contexts`, `fleet` and `selector` against the kubeconfig (`kubectl config get-contexts`)",
        ));
    }
    Ok((members, source))
}

/// The clusters of a fleet file in the order written (serde's map loses it).
fn fleet_file_order(path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    let Ok(root) = rdeploy_adapters::yaml::parse_located(&text) else { return Vec::new() };
    root.as_mapping()
        .and_then(|m| m.get_mapping("clusters"))
        .map(|m| m.keys().map(|k| k.as_str().to_string()).collect())
        .unwrap_or_default()
}

/// The waves as cluster names.
pub fn wave_names(members: &[Member], waves: &[Range<usize>]) -> Vec<Vec<String>> {
    waves.iter().map(|w| members[w.clone()].iter().map(|m| m.name.clone()).collect()).collect()
}

/// The waves of this run, as cluster names. On `recover` the journaled membership stays (the
/// journaled `waves_baked` counts those waves): a cluster no longer in scope leaves its wave (a
/// wave left empty stays, so the count still holds), and a cluster new to the scope joins the
/// last wave. On `up` (nothing journaled): `fresh`, the waves cut from the scope now.
fn resumed_waves(fresh: Vec<Vec<String>>, journaled: Option<Vec<Vec<String>>>) -> Vec<Vec<String>> {
    let Some(mut journaled) = journaled.filter(|j| !j.is_empty()) else { return fresh };
    let in_scope: Vec<&String> = fresh.iter().flatten().collect();
    for wave in &mut journaled {
        wave.retain(|n| in_scope.contains(&n));
    }
    let known: Vec<String> = journaled.iter().flatten().cloned().collect();
    let new: Vec<String> = in_scope.into_iter().filter(|n| !known.contains(n)).cloned().collect();
    if let Some(last) = journaled.last_mut() {
        last.extend(new);
    }
    journaled
}

/// Runs (or resumes) the rollout. `Ok` once every cluster in scope is done; a failure names
/// the failed clusters and the stragglers (the deploy is partial, `recover` goes on).
pub async fn run(r: FleetRun<'_>, sink: &dyn EventSink) -> Result<Recovered, Failure> {
    let (members, source) = scope_of(r.step, r.fleet, r.ctx)?;
    let rollout = &r.fleet.rollout;
    let fresh = wave_names(&members, &plan::waves(members.len(), &rollout.waves));
    let journaled: Option<Vec<Vec<String>>> =
        r.prior.facts.get("rollout").and_then(|v| v.get("waves")).and_then(|w| serde_json::from_value(w.clone()).ok());
    let names = resumed_waves(fresh, journaled);
    let by_name: BTreeMap<&str, &Member> = members.iter().map(|m| (m.name.as_str(), m)).collect();
    let waves: Vec<Vec<&Member>> =
        names.iter().map(|w| w.iter().filter_map(|n| by_name.get(n.as_str()).copied()).collect()).collect();
    let started = r
        .prior
        .facts
        .get("rollout")
        .and_then(|v| v.get("started"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| rfc3339(OffsetDateTime::now_utc()));
    let tolerated = rollout.max_failures.of(members.len());
    sink.emit(Event::Planned { ids: members.iter().map(|m| m.name.clone()).collect() });
    sink.emit(Event::Fact {
        key: "rollout".into(),
        value: json!({
            "started": started,
            "waves": names,
            "parallel": rollout.parallel,
            "bake": humantime::format_duration(rollout.bake).to_string(),
            "max_failures": tolerated,
            "absent": rollout.absent,
            "slo": r.fleet.slo,
        }),
    });
    let baked = r.prior.facts.get("waves_baked").and_then(Value::as_u64).unwrap_or(0) as usize;
    let status: BTreeMap<&str, SubStatus> = r.prior.sub_changes.iter().map(|s| (s.id.as_str(), s.status)).collect();
    let runner = Runner {
        r: &r,
        sink,
        source,
        options: CollectOptions {
            timeout: rollout.inventory_timeout,
            namespace: namespace_of(&r.step.spec),
            kinds: vec![Kind::Deployment, Kind::StatefulSet, Kind::DaemonSet],
            gitops: false,
            concurrency: 1,
        },
        last_seen: LastSeen::load(r.state_dir),
        failures: AtomicUsize::new(0),
        tolerated,
        started,
        facts: Mutex::default(),
    };
    let mut failed: Vec<(String, String)> = Vec::new();
    let mut stragglers: Vec<(String, String)> = Vec::new();
    for (w, wave) in waves.iter().enumerate() {
        let todo: Vec<&Member> =
            wave.iter().copied().filter(|m| status.get(m.name.as_str()) != Some(&SubStatus::Done)).collect();
        if runner.r.ctx.cancel.is_cancelled() {
            return Err(interrupted(format!("stopped before wave {} of {}", w + 1, waves.len())));
        }
        let mut ends = Vec::new();
        let mut queue = todo.into_iter();
        let mut running = FuturesUnordered::new();
        loop {
            while running.len() < rollout.parallel.max(1) {
                let Some(m) = queue.next() else { break };
                running.push(runner.named(m, w, waves.len()));
            }
            match running.next().await {
                Some(end) => ends.push(end),
                None => break,
            }
        }
        let mut done_now = Vec::new();
        for (name, end) in ends {
            match end {
                ClusterEnd::Done => done_now.push(name),
                ClusterEnd::Failed(why) => failed.push((name, why)),
                ClusterEnd::Absent(why) => stragglers.push((name, why)),
                ClusterEnd::NotStarted => {}
            }
        }
        if runner.r.ctx.cancel.is_cancelled() {
            return Err(interrupted(format!("stopped during wave {} of {}", w + 1, waves.len())));
        }
        if plan::must_stop(failed.len(), tolerated) {
            return Err(stopped(r.step, r.ctx, w, waves.len(), &failed, tolerated, &stragglers));
        }
        // The bake holds the next wave; the last wave has none to hold. A wave baked in an
        // earlier run is not baked again for its stragglers.
        let last = w + 1 == waves.len();
        if w >= baked {
            if !last && !rollout.bake.is_zero() && !wave.is_empty() {
                let in_wave: Vec<&Member> = wave
                    .iter()
                    .copied()
                    .filter(|m| done_now.contains(&m.name) || status.get(m.name.as_str()) == Some(&SubStatus::Done))
                    .collect();
                failed.extend(runner.bake(w, waves.len(), &in_wave).await?);
                if plan::must_stop(failed.len(), tolerated) {
                    return Err(stopped(r.step, r.ctx, w, waves.len(), &failed, tolerated, &stragglers));
                }
            }
            sink.emit(Event::Fact { key: "waves_baked".into(), value: (w + 1).into() });
        }
    }
    if failed.is_empty() && stragglers.is_empty() {
        return Ok(Recovered::Complete);
    }
    let mut parts = Vec::new();
    if !failed.is_empty() {
        parts.push(format!("failed (within `max_failures: {tolerated}`): {}", list(&failed)));
    }
    if !stragglers.is_empty() {
        parts.push(format!("stragglers: {}", list(&stragglers)));
    }
    let left = failed.len() + stragglers.len();
    Err(Failure::new(format!(
        "{left} of {} clusters not done; every wave ran; {}",
        members.len(),
        parts.join("; ")
    ))
    .with_hint(format!(
        "`rdeploy recover` applies the stragglers once they answer and retries the failed clusters; done clusters are never applied again (`rdeploy status` lists each cluster; step `{}`)",
        r.step.name
    )))
}

fn list(items: &[(String, String)]) -> String {
    items.iter().map(|(n, why)| format!("{n} ({why})")).collect::<Vec<_>>().join(", ")
}

fn interrupted(summary: String) -> Failure {
    Failure { interrupted: true, ..Failure::new(summary) }
}

fn stopped(
    step: &Step,
    ctx: &StepContext,
    wave: usize,
    waves: usize,
    failed: &[(String, String)],
    tolerated: usize,
    stragglers: &[(String, String)],
) -> Failure {
    let later = if wave + 1 < waves {
        format!("waves {}-{waves} not started: no cluster of a later wave was touched", wave + 2)
    } else {
        "it was the last wave".to_string()
    };
    let absent = if stragglers.is_empty() { String::new() } else { format!("; stragglers: {}", list(stragglers)) };
    let rollback = spec_for_cluster(&step.spec, &failed[0].0)
        .cluster_rollback(Some(ctx))
        .map(|how| format!("; to roll one cluster back: {how}"))
        .unwrap_or_default();
    Failure::new(format!(
        "the rollout stopped in wave {} of {waves}: {} cluster{} failed (max_failures: {tolerated}): {}; {later}{absent}",
        wave + 1,
        failed.len(),
        if failed.len() == 1 { "" } else { "s" },
        list(failed)
    ))
    .with_hint(format!("fix the cause, then `rdeploy recover` retries the failed clusters and goes on with the waves not reached{rollback}"))
}

fn namespace_of(spec: &ToolSpec) -> Option<String> {
    spec.kube_target().and_then(|t| t.namespace).map(str::to_string)
}

/// The step's spec for one cluster: its context passed through, and waiting for the
/// workloads to be ready unless the step says `wait: false` ([`Adapter::target_context`]).
pub fn spec_for_cluster(spec: &ToolSpec, cluster: &str) -> ToolSpec {
    let mut one = spec.clone();
    one.target_context(cluster);
    one
}

/// What makes a present cluster unhealthy: its workloads (in the step's namespace) whose
/// rollout has not finished. Empty when healthy.
fn unhealthy(c: &ClusterInventory) -> Vec<String> {
    c.workloads.iter().flat_map(|w| w.rollout.iter().filter(|f| f.blocks()).map(move |f| f.describe(&w.id()))).collect()
}

struct Runner<'a> {
    r: &'a FleetRun<'a>,
    sink: &'a dyn EventSink,
    source: String,
    options: CollectOptions,
    last_seen: LastSeen,
    failures: AtomicUsize,
    tolerated: usize,
    started: String,
    /// Each cluster's fact object as this run last wrote it, by fact key: the facts of one
    /// cluster are one record, updated as the tool reports (a retry starts again from the
    /// checkpoint's copy in `r.prior`).
    facts: Mutex<BTreeMap<String, Map<String, Value>>>,
}

impl Runner<'_> {
    async fn named(&self, m: &Member, wave: usize, waves: usize) -> (String, ClusterEnd) {
        (m.name.clone(), self.cluster(m, wave, waves).await)
    }

    async fn named_read(&self, m: &Member) -> (String, ClusterInventory) {
        (m.name.clone(), self.read(m).await)
    }

    /// One read of the cluster through the API (bounded by the inventory timeout).
    async fn read(&self, m: &Member) -> ClusterInventory {
        let one = Scope { source: self.source.clone(), clusters: vec![m.clone()] };
        let inv = collect(&one, &self.options, &self.last_seen).await;
        if let Err(e) = LastSeen::record(self.r.state_dir, &inv) {
            tracing::warn!("could not record when {} was last seen: {e:#}", m.name);
        }
        inv.clusters.into_iter().next().unwrap_or_else(|| ClusterInventory::absent(&m.name, "no answer".into(), None))
    }

    fn absent_why(c: &ClusterInventory) -> Option<(String, Option<OffsetDateTime>)> {
        match &c.presence {
            Presence::Present => None,
            Presence::Absent { error, last_seen } => Some((error.clone(), *last_seen)),
        }
    }

    fn fact(&self, cluster: &str, update: impl FnOnce(&mut Map<String, Value>)) {
        let key = cluster_fact(cluster);
        let mut facts = self.facts.lock().unwrap_or_else(|e| e.into_inner());
        let entry = facts
            .entry(key.clone())
            .or_insert_with(|| self.r.prior.facts.get(&key).and_then(Value::as_object).cloned().unwrap_or_default());
        update(entry);
        self.sink.emit(Event::Fact { key, value: Value::Object(entry.clone()) });
    }

    /// Leaves an absent cluster as a straggler: pending, with why and since when.
    fn straggle(&self, m: &Member, why: &str, last_seen: Option<OffsetDateTime>) -> ClusterEnd {
        let since = match last_seen {
            Some(t) => format!("absent since {} (last seen)", rfc3339(t)),
            None => "absent, never seen by rdeploy".to_string(),
        };
        let reason = format!("{since}: {why}");
        self.fact(&m.name, |f| {
            f.insert("absent_since".into(), last_seen.map(rfc3339).map(Value::from).unwrap_or(Value::Null));
            f.insert("absent_why".into(), why.into());
        });
        self.sink.emit(Event::Pending { id: m.name.clone(), reason: reason.clone() });
        self.sink.emit(Event::Warning { message: format!("{}: {reason}; left as a straggler", m.name) });
        ClusterEnd::Absent(reason)
    }

    /// One cluster's turn: absent or not, then the tool, then a healthy read.
    async fn cluster(&self, m: &Member, wave: usize, waves: usize) -> ClusterEnd {
        if self.r.ctx.cancel.is_cancelled() || plan::must_stop(self.failures.load(Ordering::SeqCst), self.tolerated) {
            return ClusterEnd::NotStarted;
        }
        let seen = self.read(m).await;
        if let Some((why, last_seen)) = Self::absent_why(&seen) {
            if self.r.fleet.rollout.absent == AbsentPolicy::Skip {
                return self.straggle(m, &why, last_seen);
            }
            let limit = self.r.step.timeout.unwrap_or(DEFAULT_WAIT);
            self.sink.emit(Event::Warning {
                message: format!(
                    "{}: absent ({why}); wave {} of {waves} waits for it up to {} (`absent: wait`)",
                    m.name,
                    wave + 1,
                    humantime::format_duration(limit)
                ),
            });
            let deadline = rdeploy_adapters::saturating_deadline(limit);
            loop {
                if Instant::now() >= deadline {
                    return self.straggle(
                        m,
                        &format!("{why}; waited {}", humantime::format_duration(limit)),
                        last_seen,
                    );
                }
                tokio::select! {
                    _ = tokio::time::sleep(POLL) => {}
                    _ = self.r.ctx.cancel.cancelled() => return ClusterEnd::NotStarted,
                }
                if Self::absent_why(&self.read(m).await).is_none() {
                    break;
                }
            }
        }
        self.fact(&m.name, |f| {
            f.remove("absent_since");
            f.remove("absent_why");
            f.insert("wave".into(), (wave + 1).into());
        });
        let started = AtomicBool::new(false);
        match self.apply(m, &started).await {
            Ok((note, in_place)) => match self.healthy(m).await {
                Ok(seen) => {
                    self.note_rollout_start(&seen);
                    self.fact(&m.name, |f| {
                        f.insert("done_at".into(), rfc3339(OffsetDateTime::now_utc()).into());
                        f.remove("in_flight");
                    });
                    if in_place {
                        self.sink.emit(Event::InPlace { id: m.name.clone(), note: Some(note) });
                    } else {
                        self.sink.emit(Event::Done { id: m.name.clone(), note: Some(note) });
                    }
                    ClusterEnd::Done
                }
                Err(why) => self.fail(m, format!("applied, but not healthy: {why}")),
            },
            Err(failure) if failure.interrupted => {
                // The sub-change stays as the tool left it (started: uncertain); recover decides.
                ClusterEnd::NotStarted
            }
            Err(failure) => {
                let now = self.read(m).await;
                let absent = Self::absent_why(&now);
                let changing = started.load(Ordering::SeqCst);
                match after_tool_failure(absent.as_ref().map(|(why, _)| why.as_str()), changing, &failure.summary) {
                    AfterFailure::Straggler(why) => self.straggle(m, &why, absent.and_then(|(_, seen)| seen)),
                    AfterFailure::Failed(why) => self.fail(m, why),
                }
            }
        }
    }

    fn fail(&self, m: &Member, why: String) -> ClusterEnd {
        self.failures.fetch_add(1, Ordering::SeqCst);
        self.sink.emit(Event::Failed { id: m.name.clone(), error: why.clone() });
        ClusterEnd::Failed(why)
    }

    /// The tool against this one cluster, as a single-cluster step would run it: `recover`
    /// when an earlier run started it there, else `apply`. The note for the done record.
    /// `started` is set once the tool starts changing the cluster in this run.
    async fn apply(&self, m: &Member, started: &AtomicBool) -> Result<(String, bool), Failure> {
        let mut spec = spec_for_cluster(&self.r.step.spec, &m.name);
        let mut ctx = self.r.ctx.clone();
        ctx.work_dir = self.r.ctx.work_dir.join("clusters").join(&m.name);
        if let Err(e) = std::fs::create_dir_all(&ctx.work_dir) {
            return Err(Failure::new(format!("cannot create {}: {e}", ctx.work_dir.display())));
        }
        // Held until the tool is done with this cluster.
        let _own_kubeconfig = spec.use_own_kubeconfig(&ctx, &m.name);
        let prior_fact = self.r.prior.facts.get(&cluster_fact(&m.name)).and_then(Value::as_object).cloned();
        ctx.started_by = BTreeMap::new();
        if let (Some(by), Some(inner)) = (
            self.r.ctx.started_by.get(&m.name),
            prior_fact.as_ref().and_then(|f| f.get("in_flight")).and_then(Value::as_str),
        ) {
            let mut by = by.clone();
            by.pending_seen = prior_fact.as_ref().and_then(|f| f.get("pending_seen")).and_then(Value::as_u64);
            ctx.started_by.insert(inner.to_string(), by);
        }
        let earlier = self.r.prior.sub_changes.iter().find(|s| s.id == m.name).map(|s| s.status);
        let mut in_place = false;
        let csink = ClusterSink { runner: self, cluster: &m.name, done: AtomicUsize::new(0), started };
        let result = match earlier {
            Some(SubStatus::Started | SubStatus::Failed) => {
                spec.recover(&ctx, &PriorStep::default(), &csink).await.and_then(|r| match r {
                    Recovered::Complete => Ok(()),
                    Recovered::RolledBack { to } => Err(Failure::new(format!(
                        "`recover: rollback` rolled it back to {to}: the stack's version is not in place"
                    ))),
                })
            }
            _ if self.r.converge => spec.converge_step(&ctx, None, &csink).await.map(|c| {
                in_place = c == Converged::InPlace;
            }),
            _ => spec.apply(&ctx, &csink).await,
        };
        result?;
        let facts = self.facts.lock().unwrap_or_else(|e| e.into_inner());
        let revision = facts.get(&cluster_fact(&m.name)).and_then(|f| f.get("revision")).and_then(Value::as_u64);
        // Only helm records a release revision.
        let note = match revision {
            Some(rev) if in_place => format!("rev {rev}, in place: no upgrade"),
            Some(rev) => format!("rev {rev}"),
            _ if in_place => "in place: nothing applied".to_string(),
            _ => {
                let n = csink.done.load(Ordering::SeqCst);
                format!("{n} object{} applied", if n == 1 { "" } else { "s" })
            }
        };
        Ok((note, in_place))
    }

    /// Reads the cluster until its workloads are healthy (bounded); the healthy read.
    async fn healthy(&self, m: &Member) -> Result<ClusterInventory, String> {
        let limit = self.r.step.timeout.unwrap_or(HEALTH_WAIT).min(HEALTH_WAIT);
        let deadline = rdeploy_adapters::saturating_deadline(limit);
        loop {
            let c = self.read(m).await;
            let why = match Self::absent_why(&c) {
                Some((error, _)) => vec![format!("did not answer the read after its change: {error}")],
                None => unhealthy(&c),
            };
            if why.is_empty() {
                return Ok(c);
            }
            if Instant::now() >= deadline || self.r.ctx.cancel.is_cancelled() {
                return Err(why.join("; "));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The wave's bake: wait, then read each of its done clusters again. The clusters no longer
    /// healthy are failed (returned); an absent one is kept done, with a warning.
    async fn bake(&self, wave: usize, waves: usize, done: &[&Member]) -> Result<Vec<(String, String)>, Failure> {
        let bake = self.r.fleet.rollout.bake;
        let until = OffsetDateTime::now_utc() + bake;
        self.sink.emit(Event::Fact { key: "bake".into(), value: json!({ "wave": wave + 1, "until": rfc3339(until) }) });
        self.sink.emit(Event::Warning {
            message: format!(
                "wave {} of {waves} is applied: baking {} before wave {}",
                wave + 1,
                humantime::format_duration(bake),
                wave + 2
            ),
        });
        tokio::select! {
            _ = tokio::time::sleep(bake) => {}
            _ = self.r.ctx.cancel.cancelled() => {
                return Err(interrupted(format!("stopped during the bake of wave {} of {waves}", wave + 1)));
            }
        }
        let mut reads = Vec::new();
        let mut queue = done.iter().copied();
        let mut running = FuturesUnordered::new();
        loop {
            while running.len() < self.r.fleet.rollout.parallel.max(1) {
                let Some(m) = queue.next() else { break };
                running.push(self.named_read(m));
            }
            match running.next().await {
                Some(read) => reads.push(read),
                None => break,
            }
        }
        let mut failed = Vec::new();
        for (name, c) in reads {
            if let Some((why, _)) = Self::absent_why(&c) {
                self.sink.emit(Event::Warning {
                    message: format!(
                        "{name}: absent at the end of the bake ({why}); kept done, as it was healthy when applied"
                    ),
                });
                continue;
            }
            let why = unhealthy(&c);
            if !why.is_empty() {
                let error = format!("unhealthy at the end of the bake of wave {}: {}", wave + 1, why.join("; "));
                self.failures.fetch_add(1, Ordering::SeqCst);
                self.sink.emit(Event::Failed { id: name.clone(), error: error.clone() });
                failed.push((name, error));
            }
        }
        self.sink.emit(Event::Fact {
            key: "bake".into(),
            value: json!({ "wave": wave + 1, "ended": rfc3339(OffsetDateTime::now_utc()) }),
        });
        Ok(failed)
    }

    /// The rollout's start becomes the start `inventory --slo` measures each image version the
    /// cluster now runs from (instead of when `inventory` first saw it).
    fn note_rollout_start(&self, c: &ClusterInventory) {
        let Ok(started) = OffsetDateTime::parse(&self.started, &time::format_description::well_known::Rfc3339) else {
            return;
        };
        let source = format!("the rollout of step `{}` (rdeploy)", self.r.step.name);
        let mut rollouts = Rollouts::load(self.r.state_dir);
        let mut changed = false;
        for container in c.workloads.iter().flat_map(|w| &w.containers) {
            let versions = rollouts.components.entry(container.component.clone()).or_default();
            let ours = RolloutStart { started, source: source.clone() };
            if versions.get(&container.version) != Some(&ours) {
                versions.insert(container.version.clone(), ours);
                changed = true;
            }
        }
        if changed {
            if let Err(e) = rollouts.save(self.r.state_dir) {
                tracing::warn!("could not record the rollout start: {e:#}");
            }
        }
    }
}

/// The adapter's events for one cluster, folded into that cluster's sub-change of the step.
struct ClusterSink<'a> {
    runner: &'a Runner<'a>,
    cluster: &'a str,
    /// Sub-changes the tool finished there (kubectl objects).
    done: AtomicUsize,
    /// Set once the tool starts changing the cluster.
    started: &'a AtomicBool,
}

impl EventSink for ClusterSink<'_> {
    fn emit(&self, event: Event) {
        let outer = self.runner.sink;
        match event {
            Event::Started { id } => {
                self.started.store(true, Ordering::SeqCst);
                // What the tool starts changing there: recover maps the cluster back to it
                // (helm's evidence that a pending revision was abandoned).
                self.runner.fact(self.cluster, |f| {
                    f.insert("in_flight".into(), id.into());
                });
                outer.emit(Event::Started { id: self.cluster.to_string() });
            }
            Event::Done { .. } => {
                self.done.fetch_add(1, Ordering::SeqCst);
            }
            Event::Fact { key, value } => self.runner.fact(self.cluster, |f| {
                f.insert(key, value);
            }),
            Event::Warning { message } => {
                outer.emit(Event::Warning { message: format!("{}: {message}", self.cluster) })
            }
            Event::Output { stream, line } => {
                outer.emit(Event::Output { stream, line: format!("[{}] {line}", self.cluster) })
            }
            // The tool's failure comes back as its `Err`; the plan, per-revision bookkeeping and outputs stay inside the cluster: the step's
            // sub-changes are its clusters, and a fleet step produces no outputs.
            Event::Failed { .. }
            | Event::InPlace { .. }
            | Event::Planned { .. }
            | Event::Pending { .. }
            | Event::Moved { .. }
            | Event::Outputs { .. } => {}
        }
    }
}

/// What `recover --dry-run` says of a fleet step, from the checkpoint alone (no cluster is
/// asked): per wave, the clusters done and those left.
pub fn dry_run(prior: &PriorStep) -> Vec<String> {
    let waves: Vec<Vec<String>> = prior
        .facts
        .get("rollout")
        .and_then(|r| r.get("waves"))
        .and_then(|w| serde_json::from_value(w.clone()).ok())
        .unwrap_or_default();
    let status: BTreeMap<&str, SubStatus> = prior.sub_changes.iter().map(|s| (s.id.as_str(), s.status)).collect();
    let baked = prior.facts.get("waves_baked").and_then(Value::as_u64).unwrap_or(0) as usize;
    let mut lines = Vec::new();
    for (i, wave) in waves.iter().enumerate() {
        let left: Vec<&str> =
            wave.iter().map(String::as_str).filter(|c| status.get(c) != Some(&SubStatus::Done)).collect();
        let done = wave.len() - left.len();
        let state = if left.is_empty() && i < baked {
            "done".to_string()
        } else if left.is_empty() {
            "applied, bake not passed".to_string()
        } else {
            format!("to apply: {}", left.join(", "))
        };
        lines.push(format!("wave {} of {}: {done}/{} clusters done; {state}", i + 1, waves.len(), wave.len()));
    }
    if lines.is_empty() {
        lines.push("no wave was planned yet: the rollout starts from its first wave".into());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_that_stops_answering_after_its_tool_changed_it_and_failed_is_a_failure() {
        let end = after_tool_failure(Some("connection refused"), true, "helm upgrade failed");
        assert_eq!(
            end,
            AfterFailure::Failed(
                "helm upgrade failed; then it stopped answering after the failure (connection refused)".into()
            )
        );
    }

    #[test]
    fn a_cluster_absent_before_its_tool_changed_anything_is_a_straggler() {
        let end = after_tool_failure(Some("connection refused"), false, "helm upgrade failed");
        assert_eq!(
            end,
            AfterFailure::Straggler(
                "connection refused (its tool failed before changing it: helm upgrade failed)".into()
            )
        );
    }

    fn w(waves: &[&[&str]]) -> Vec<Vec<String>> {
        waves.iter().map(|w| w.iter().map(|n| n.to_string()).collect()).collect()
    }

    #[test]
    fn recover_keeps_the_journaled_waves_and_puts_new_clusters_in_the_last() {
        // Journaled with 4 clusters as [1], [2, 3, 4]; now edge-0 and edge-5 are in scope and
        // edge-3 is gone: the fresh cut would move edge-1 out of wave 1.
        let journaled = w(&[&["edge-1"], &["edge-2", "edge-3", "edge-4"]]);
        let fresh = w(&[&["edge-0"], &["edge-1", "edge-2", "edge-4", "edge-5"]]);
        assert_eq!(resumed_waves(fresh, Some(journaled)), w(&[&["edge-1"], &["edge-2", "edge-4", "edge-0", "edge-5"]]));
    }

    #[test]
    fn a_wave_emptied_by_the_scope_stays_so_waves_baked_still_counts_the_same_waves() {
        let journaled = w(&[&["edge-1"], &["edge-2"], &["edge-3"]]);
        let fresh = w(&[&["edge-2"], &["edge-3"]]);
        assert_eq!(resumed_waves(fresh, Some(journaled)), w(&[&[], &["edge-2"], &["edge-3"]]));
    }

    #[test]
    fn up_cuts_the_waves_from_the_scope() {
        let fresh = w(&[&["edge-1"], &["edge-2"]]);
        assert_eq!(resumed_waves(fresh.clone(), None), fresh);
    }

    #[test]
    fn a_cluster_that_still_answers_after_its_tool_failed_is_a_failure() {
        assert_eq!(after_tool_failure(None, true, "boom"), AfterFailure::Failed("boom".into()));
        assert_eq!(after_tool_failure(None, false, "boom"), AfterFailure::Failed("boom".into()));
    }
}

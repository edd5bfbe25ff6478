//! Collection through the Kubernetes API: every cluster in scope is asked at once with the
//! `kube` client (kubeconfig, auth and TLS as kubectl does, no `kubectl` process), each under
//! its own timeout. A cluster that errors or times out is recorded absent, with the reason.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;
use time::OffsetDateTime;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::instrument::WithSubscriber as _;

use super::model::{
    ClusterInventory, Container, GitOpsObject, Inventory, Kind, PodFacts, Presence, RolloutFact, Workload, WorkloadMeta,
};
use super::scope::Scope;
use super::state::LastSeen;

/// What to ask each cluster.
#[derive(Clone, Debug)]
pub struct CollectOptions {
    /// Per-cluster budget for every request to it; past it the cluster is absent.
    pub timeout: Duration,
    /// One namespace, or all.
    pub namespace: Option<String>,
    pub kinds: Vec<Kind>,
    pub gitops: bool,
    /// Clusters asked at once (bounded so a 4,000-cluster fleet does not exhaust descriptors).
    pub concurrency: usize,
}

impl Default for CollectOptions {
    fn default() -> Self {
        CollectOptions {
            timeout: Duration::from_secs(5),
            namespace: None,
            kinds: Kind::ALL.to_vec(),
            gitops: true,
            concurrency: 512,
        }
    }
}

/// Asks every cluster of the scope; absent clusters get their last-seen time from `last_seen`.
pub async fn collect(scope: &Scope, options: &CollectOptions, last_seen: &LastSeen) -> Inventory {
    let taken_at = OffsetDateTime::now_utc();
    let permits = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let http: PlainHttp =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut tasks = JoinSet::new();
    for (index, member) in scope.clusters.iter().enumerate() {
        let Some(kubeconfig) = member.kubeconfig.clone() else {
            continue;
        };
        let (name, options, permits, http) = (member.name.clone(), options.clone(), permits.clone(), http.clone());
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let ask = tokio::time::timeout(options.timeout, ask_cluster(kubeconfig, &name, &options, &http));
            // kube logs each failed request at ERROR; an absent cluster is reported once, in
            // the inventory, so its logs are only wanted when debugging (-vv).
            let dispatch = if tracing::enabled!(tracing::Level::DEBUG) {
                tracing::dispatcher::get_default(|d| d.clone())
            } else {
                tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default())
            };
            let ask = ask.with_subscriber(dispatch);
            let answer = match ask.await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer within {}", humantime::format_duration(options.timeout))),
            };
            (index, answer)
        });
    }
    let mut answers: Vec<Option<Result<Answer, String>>> = vec![None; scope.clusters.len()];
    while let Some(joined) = tasks.join_next().await {
        if let Ok((index, answer)) = joined {
            answers[index] = Some(answer);
        }
    }
    let clusters = scope
        .clusters
        .iter()
        .zip(answers)
        .map(|(member, answer)| {
            let mut cluster = match answer {
                Some(Ok((workloads, gitops))) => ClusterInventory {
                    name: member.name.clone(),
                    labels: BTreeMap::new(),
                    presence: Presence::Present,
                    workloads,
                    gitops,
                },
                Some(Err(error)) => ClusterInventory::absent(&member.name, error, last_seen.get(&member.name)),
                None if member.kubeconfig.is_none() => ClusterInventory::absent(
                    &member.name,
                    format!("no context `{}` in {}", member.name, scope.source),
                    last_seen.get(&member.name),
                ),
                None => ClusterInventory::absent(
                    &member.name,
                    "the inventory task failed".into(),
                    last_seen.get(&member.name),
                ),
            };
            cluster.labels = member.labels.clone();
            cluster
        })
        .collect();
    Inventory { taken_at, clusters }
}

/// What a cluster that answered holds.
type Answer = (Vec<Workload>, Vec<GitOpsObject>);

async fn ask_cluster(
    kubeconfig: Kubeconfig,
    context: &str,
    options: &CollectOptions,
    http: &PlainHttp,
) -> Result<Answer, String> {
    let kube_options = KubeConfigOptions { context: Some(context.to_string()), ..KubeConfigOptions::default() };
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &kube_options)
        .await
        .map_err(|e| format!("bad kubeconfig context: {e}"))?;
    config.connect_timeout = Some(options.timeout);
    config.read_timeout = Some(options.timeout);
    let client = client_for(config, http).map_err(|e| format!("cannot build a client: {e}"))?;
    let ns = options.namespace.as_deref();
    let wants = |k: Kind| options.kinds.contains(&k);
    let (deployments, daemonsets, statefulsets, cronjobs, jobs, pods, gitops) = tokio::try_join!(
        list::<Deployment>(&client, ns, wants(Kind::Deployment)),
        list::<DaemonSet>(&client, ns, wants(Kind::DaemonSet)),
        list::<StatefulSet>(&client, ns, wants(Kind::StatefulSet)),
        list::<CronJob>(&client, ns, wants(Kind::CronJob)),
        list::<Job>(&client, ns, wants(Kind::Job)),
        // DaemonSet nodes are named from their pods, so pods are read for DaemonSets too.
        list::<Pod>(&client, ns, wants(Kind::Pod) || wants(Kind::DaemonSet)),
        // GitOps objects live in their own namespaces (argocd, flux-system), whatever the scope.
        gitops_objects(&client, options.gitops),
    )?;
    let mut workloads = Vec::new();
    workloads.extend(deployments.iter().map(deployment));
    workloads.extend(statefulsets.iter().map(statefulset));
    workloads.extend(cronjobs.iter().map(cronjob));
    workloads.extend(jobs.iter().map(job));
    let pods: Vec<Workload> = pods.iter().map(pod).collect();
    workloads.extend(daemonsets.iter().map(|ds| daemonset(ds, &pods)));
    if wants(Kind::Pod) {
        workloads.extend(pods);
    }
    workloads.sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
    Ok((workloads, gitops))
}

/// One connection pool shared by every `http://` cluster.
type PlainHttp =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, kube::client::Body>;

/// kube's own client for `https://` clusters (TLS and auth as kubectl does). A plain `http://`
/// cluster gets the shared pool with kube's base-URI and auth layers: kube's default stack
/// would load the system's root certificates for every cluster, which dominated the time of a
/// 400-cluster inventory and is useless without TLS.
fn client_for(config: Config, http: &PlainHttp) -> Result<Client, kube::Error> {
    use kube::client::ConfigExt as _;
    if config.cluster_url.scheme_str() != Some("http") {
        return Client::try_from(config);
    }
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        // kube's auth layers expect a boxed error from the service they wrap.
        .map_err(|e: hyper_util::client::legacy::Error| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })
        .service(http.clone());
    Ok(Client::new(service, config.default_namespace))
}

async fn list<K>(client: &Client, ns: Option<&str>, wanted: bool) -> Result<Vec<K>, String>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    if !wanted {
        return Ok(Vec::new());
    }
    let api: Api<K> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(e) => Err(format!("listing {}: {}", K::plural(&()), short_error(&e))),
    }
}

/// The kube error without the wrapping noise, plus its root cause (the connection error).
fn short_error(e: &kube::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

fn labels_of(meta: &ObjectMeta, template: Option<&PodTemplateSpec>) -> BTreeMap<String, String> {
    let mut labels = template.and_then(|t| t.metadata.as_ref()).and_then(|m| m.labels.clone()).unwrap_or_default();
    labels.extend(meta.labels.clone().unwrap_or_default());
    labels
}

fn containers_of(spec: Option<&PodSpec>) -> Vec<Container> {
    let Some(spec) = spec else { return Vec::new() };
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter_map(|c| c.image.as_deref().map(|image| Container::new(&c.name, image)))
        .collect()
}

fn base(kind: Kind, meta: &ObjectMeta, template: Option<&PodTemplateSpec>) -> Workload {
    let containers = containers_of(template.and_then(|t| t.spec.as_ref()));
    let annotations = meta.annotations.as_ref();
    let annotation = |k: &str| annotations.and_then(|a| a.get(k)).filter(|v| !v.is_empty());
    let release = annotation("meta.helm.sh/release-name")
        .map(|name| format!("{}/{name}", annotation("meta.helm.sh/release-namespace").cloned().unwrap_or_default()));
    Workload {
        kind,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        labels: labels_of(meta, template),
        meta: WorkloadMeta {
            release,
            hook: annotation("helm.sh/hook").is_some(),
            selector: BTreeMap::new(),
            images: containers.iter().map(|c| c.image.clone()).collect(),
            partition: 0,
        },
        containers,
        pod: None,
        rollout: Vec::new(),
    }
}

fn match_labels(selector: Option<&LabelSelector>) -> BTreeMap<String, String> {
    selector.and_then(|s| s.match_labels.clone()).unwrap_or_default()
}

fn stale_generation(meta: &ObjectMeta, observed: Option<i64>) -> bool {
    matches!((meta.generation, observed), (Some(g), Some(o)) if o < g)
}

fn deployment(d: &Deployment) -> Workload {
    let spec = d.spec.as_ref();
    let mut w = base(Kind::Deployment, &d.metadata, spec.map(|s| &s.template));
    w.meta.selector = match_labels(spec.map(|s| &s.selector));
    let status = d.status.clone().unwrap_or_default();
    if spec.and_then(|s| s.paused) == Some(true) {
        w.rollout.push(RolloutFact::Paused);
    }
    let stalled = status.conditions.iter().flatten().find(|c| c.type_ == "Progressing" && c.status == "False");
    if let Some(c) = stalled {
        w.rollout.push(RolloutFact::NotProgressing {
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
        });
    }
    let desired = i64::from(spec.and_then(|s| s.replicas).unwrap_or(1));
    let updated = i64::from(status.updated_replicas.unwrap_or(0));
    let available = i64::from(status.available_replicas.unwrap_or(0));
    // `status.replicas` counts the pods of every ReplicaSet: more than the updated ones means
    // pods of an old ReplicaSet still run.
    let total = i64::from(status.replicas.unwrap_or(0));
    if w.rollout.is_empty()
        && (updated < desired
            || available < desired
            || total > updated
            || stale_generation(&d.metadata, status.observed_generation))
    {
        w.rollout.push(RolloutFact::InProgress { updated, desired });
    }
    w
}

fn statefulset(s: &StatefulSet) -> Workload {
    let spec = s.spec.as_ref();
    let mut w = base(Kind::StatefulSet, &s.metadata, spec.map(|s| &s.template));
    w.meta.selector = match_labels(spec.map(|s| &s.selector));
    let status = s.status.clone().unwrap_or_default();
    let replicas = i64::from(spec.and_then(|s| s.replicas).unwrap_or(1));
    let updated = i64::from(status.updated_replicas.unwrap_or(0));
    let ready = i64::from(status.ready_replicas.unwrap_or(0));
    let rolling = spec.and_then(|s| s.update_strategy.as_ref());
    let on_delete = rolling.and_then(|u| u.type_.as_deref()) == Some("OnDelete");
    // A partition keeps the ordinals below it at the current revision by design: the rollout
    // is complete once the ordinals at or above it run the update revision (as `kubectl
    // rollout status` reads a partitioned StatefulSet).
    let partition = i64::from(rolling.and_then(|u| u.rolling_update.as_ref()).and_then(|r| r.partition).unwrap_or(0));
    let to_update = (replicas - partition.clamp(0, replicas)).max(0);
    w.meta.partition = partition.max(0);
    let revisions_differ = matches!((&status.current_revision, &status.update_revision), (Some(c), Some(u)) if c != u);
    let behind = if on_delete {
        false
    } else if partition > 0 {
        updated < to_update
    } else {
        revisions_differ || updated < replicas
    };
    if behind || ready < replicas || stale_generation(&s.metadata, status.observed_generation) {
        w.rollout.push(RolloutFact::InProgress { updated, desired: if partition > 0 { to_update } else { replicas } });
    }
    w
}

fn daemonset(d: &DaemonSet, pods: &[Workload]) -> Workload {
    let spec = d.spec.as_ref();
    let mut w = base(Kind::DaemonSet, &d.metadata, spec.map(|s| &s.template));
    w.meta.selector = match_labels(spec.map(|s| &s.selector));
    let status = d.status.clone().unwrap_or_default();
    let desired = i64::from(status.desired_number_scheduled);
    let updated = i64::from(status.updated_number_scheduled.unwrap_or(0));
    let available = i64::from(status.number_available.unwrap_or(0));
    if updated < desired || available < desired || stale_generation(&d.metadata, status.observed_generation) {
        let owner = format!("DaemonSet/{}", w.name);
        let wanted: BTreeSet<&str> = w.containers.iter().map(|c| c.image.as_str()).collect();
        let behind: Vec<&PodFacts> = pods
            .iter()
            .filter(|p| p.namespace == w.namespace)
            .filter_map(|p| p.pod.as_ref().map(|f| (p, f)))
            .filter(|(_, f)| f.owner.as_deref() == Some(owner.as_str()))
            .filter(|(p, f)| !f.ready || p.containers.iter().any(|c| !wanted.contains(c.image.as_str())))
            .map(|(_, f)| f)
            .collect();
        let nodes: BTreeSet<String> = behind.iter().filter_map(|f| f.node.clone()).collect();
        let why = behind.iter().find_map(|f| f.waiting.clone());
        w.rollout.push(RolloutFact::NodesNotUpdated {
            updated,
            available,
            desired,
            nodes: nodes.into_iter().collect(),
            why,
        });
    }
    w
}

fn cronjob(c: &CronJob) -> Workload {
    let template = c.spec.as_ref().and_then(|s| s.job_template.spec.as_ref()).map(|s| &s.template);
    let mut w = base(Kind::CronJob, &c.metadata, template);
    if c.spec.as_ref().and_then(|s| s.suspend) == Some(true) {
        w.rollout.push(RolloutFact::Suspended);
    }
    w
}

fn job(j: &Job) -> Workload {
    let mut w = base(Kind::Job, &j.metadata, j.spec.as_ref().map(|s| &s.template));
    let status = j.status.clone().unwrap_or_default();
    let condition = |t: &str| status.conditions.iter().flatten().find(|c| c.type_ == t && c.status == "True");
    if let Some(failed) = condition("Failed") {
        w.rollout.push(RolloutFact::JobFailed {
            reason: failed.reason.clone().unwrap_or_default(),
            message: failed.message.clone().unwrap_or_default(),
        });
    } else if condition("Complete").is_some() || status.completion_time.is_some() {
        w.rollout.push(RolloutFact::Finished);
    }
    w
}

fn pod(p: &Pod) -> Workload {
    let template = PodTemplateSpec { metadata: None, spec: p.spec.clone() };
    let mut w = base(Kind::Pod, &p.metadata, Some(&template));
    let status = p.status.clone().unwrap_or_default();
    let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
    let unscheduled = status.conditions.iter().flatten().find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let waiting = unscheduled
        .map(|c| format!("{}: {}", c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
        .or_else(|| {
            let init = status.init_container_statuses.iter().flatten();
            init.chain(status.container_statuses.iter().flatten()).find_map(container_why)
        });
    let owner = p
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .or_else(|| p.metadata.owner_references.iter().flatten().next());
    w.pod = Some(PodFacts {
        // A DaemonSet's pod names its node in a required node affinity until it is bound.
        node: p.spec.as_ref().and_then(|s| s.node_name.clone().or_else(|| pinned_node(s))),
        phase: status.phase.clone().unwrap_or_else(|| "Unknown".into()),
        ready,
        owner: owner.map(|o| format!("{}/{}", o.kind, o.name)),
        waiting,
    });
    w
}

/// The one node a pod's required node affinity allows by name (`matchFields metadata.name`).
fn pinned_node(spec: &PodSpec) -> Option<String> {
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    let fields = terms.first()?.match_fields.as_ref()?;
    let field = fields.iter().find(|f| f.key == "metadata.name" && f.operator == "In")?;
    match field.values.as_deref() {
        Some([one]) => Some(one.clone()),
        _ => None,
    }
}

/// Why a container does not run, in the words `kubectl describe pod` shows: the waiting
/// reason and message (`ImagePullBackOff: Back-off pulling image "nginx:1.277"`), with the last
/// termination for a container that keeps crashing, or how a container that ended failed.
fn container_why(s: &k8s_openapi::api::core::v1::ContainerStatus) -> Option<String> {
    let ended = |t: &k8s_openapi::api::core::v1::ContainerStateTerminated| {
        let mut text = format!("{} (exit code {})", t.reason.as_deref().unwrap_or("Error"), t.exit_code);
        if let Some(m) = t.message.as_deref().map(str::trim).filter(|m| !m.is_empty()) {
            text = format!("{text}: {}", m.lines().last().unwrap_or(m));
        }
        text
    };
    let state = s.state.as_ref()?;
    if let Some(w) = &state.waiting {
        let reason = w.reason.clone().filter(|r| !r.is_empty())?;
        let mut text = match w.message.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => format!("{reason}: {m}"),
            None => reason,
        };
        if let Some(last) = s.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
            text = format!("{text}; last terminated: {}", ended(last));
        }
        return Some(text);
    }
    state
        .terminated
        .as_ref()
        .filter(|t| t.exit_code != 0)
        .map(|t| format!("container {} terminated: {}", s.name, ended(t)))
}

/// The GitOps kinds rdeploy reads, by API group.
const GITOPS: &[(&str, &str, &str)] = &[
    ("argoproj.io", "Application", "applications"),
    ("kustomize.toolkit.fluxcd.io", "Kustomization", "kustomizations"),
    ("helm.toolkit.fluxcd.io", "HelmRelease", "helmreleases"),
];

/// Argo CD and Flux objects, when their CRDs are installed. One discovery request tells which
/// groups exist, instead of three lists that would mostly answer 404.
async fn gitops_objects(client: &Client, wanted: bool) -> Result<Vec<GitOpsObject>, String> {
    if !wanted {
        return Ok(Vec::new());
    }
    let groups = client.list_api_groups().await.map_err(|e| format!("discovery: {}", short_error(&e)))?;
    let mut out = Vec::new();
    for (group, kind, plural) in GITOPS {
        let Some(found) = groups.groups.iter().find(|g| g.name == *group) else { continue };
        let Some(version) = found
            .preferred_version
            .as_ref()
            .map(|v| v.version.clone())
            .or_else(|| found.versions.first().map(|v| v.version.clone()))
        else {
            continue;
        };
        let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, &version, kind), plural);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => out.extend(list.items.iter().map(|o| gitops_object(kind, o))),
            // The group exists but not this kind (a Flux install without helm-controller).
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(format!("listing {plural}.{group}: {}", short_error(&e))),
        }
    }
    Ok(out)
}

fn gitops_object(kind: &str, o: &DynamicObject) -> GitOpsObject {
    let d = &o.data;
    let s = |p: &str| d.pointer(p).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
    let ready = || {
        d.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .and_then(|c| c["status"].as_str())
            .map(|st| if st == "True" { "Ready".to_string() } else { format!("Ready={st}") })
    };
    let (revision, target, sync, health) = match kind {
        "Application" => (
            s("/status/sync/revision").or_else(|| s("/status/sync/revisions/0")),
            s("/spec/source/targetRevision").or_else(|| s("/spec/sources/0/targetRevision")),
            s("/status/sync/status"),
            s("/status/health/status"),
        ),
        "HelmRelease" => (
            s("/status/lastAppliedRevision").or_else(|| s("/status/history/0/chartVersion")),
            s("/spec/chart/spec/version"),
            ready(),
            None,
        ),
        _ => (s("/status/lastAppliedRevision"), None, ready(), None),
    };
    GitOpsObject {
        kind: kind.to_string(),
        namespace: o.metadata.namespace.clone().unwrap_or_default(),
        name: o.metadata.name.clone().unwrap_or_default(),
        revision,
        target,
        sync,
        health,
        suspended: d.pointer("/spec/suspend").and_then(Value::as_bool).unwrap_or(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitops_revisions_are_read_from_argo_and_flux_status() {
        let app: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "agent", "namespace": "argocd"},
            "spec": {"source": {"targetRevision": "v1.9"}},
            "status": {"sync": {"status": "Synced", "revision": "abc123"}, "health": {"status": "Healthy"}}
        }))
        .unwrap();
        let g = gitops_object("Application", &app);
        assert_eq!(
            (g.revision.as_deref(), g.target.as_deref(), g.sync.as_deref(), g.health.as_deref()),
            (Some("abc123"), Some("v1.9"), Some("Synced"), Some("Healthy"))
        );
        let ks: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization", "metadata": {"name": "apps", "namespace": "flux-system"},
            "spec": {"suspend": true},
            "status": {"lastAppliedRevision": "main@sha1:0ld", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let g = gitops_object("Kustomization", &ks);
        assert_eq!(
            (g.revision.as_deref(), g.sync.as_deref(), g.suspended),
            (Some("main@sha1:0ld"), Some("Ready"), true)
        );
        assert_eq!(g.id(), "Flux Kustomization flux-system/apps");
    }
}

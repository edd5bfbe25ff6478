//! Collection through the Kubernetes API: every cluster in scope is asked at once with the
//! `kube` client (kubeconfig, auth and TLS as kubectl does, no `kubectl` process), each under
//! its own timeout. A cluster that errors or times out is recorded absent, with the reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Bytes;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rdeploy_adapters::helm::records::{quiet, short_error};
use serde::de::DeserializeOwned;
use serde_json::Value;
use time::OffsetDateTime;
use tokio::sync::Semaphore;
use tokio::task::{JoinError, JoinSet};
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
    // Plain-HTTP clusters share the run's keep-alive connections, by server address.
    let http = PlainPool::default();
    let mut servers: HashMap<String, Arc<Semaphore>> = HashMap::new();
    // kube logs each failed request at ERROR; an absent cluster is reported once, in the
    // inventory, so its logs are only wanted when debugging (-vv). One dispatch for the run.
    let dispatch = if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::dispatcher::get_default(|d| d.clone())
    } else {
        quiet()
    };
    let options = Arc::new(options.clone());
    let limit = options.concurrency.max(1);
    let mut answers: Vec<Option<Result<Answer, String>>> = vec![None; scope.clusters.len()];
    let mut keep = |joined: Option<Joined>| {
        if let Some(Ok((index, answer))) = joined {
            answers[index] = Some(answer);
        }
    };
    // A cluster is only made a task when its turn comes, at most `limit` at once: a task holds
    // its whole future from the start, so 4,000 made up front held 4,000 futures' memory.
    let mut tasks = JoinSet::new();
    for (index, member) in scope.clusters.iter().enumerate() {
        let Some(kubeconfig) = member.kubeconfig.clone() else {
            continue;
        };
        while tasks.len() >= limit {
            keep(tasks.join_next().await);
        }
        // Clusters behind one plain-HTTP address (every kubesim cluster, every cluster behind
        // one proxy) take turns `PLAIN_CLUSTERS` at a time, so that a few hundred connections
        // are opened and kept alive, not seven for every cluster asked at once.
        // The turn is waited for in the cluster's task, so that clusters behind other addresses
        // (and `https://` ones) are not held up behind them.
        let server = plain_server(&kubeconfig)
            .map(|server| servers.entry(server).or_insert_with(|| Arc::new(Semaphore::new(PLAIN_CLUSTERS))).clone());
        let (name, options) = (member.name.clone(), options.clone());
        let (http, dispatch) = (http.clone(), dispatch.clone());
        tasks.spawn(async move {
            let _turn = match server {
                Some(server) => server.acquire_owned().await.ok(),
                None => None,
            };
            // A cluster's timeout starts when its turn comes.
            let ask = tokio::time::timeout(options.timeout, ask_cluster(kubeconfig, &name, &options, &http));
            let ask = ask.with_subscriber(dispatch);
            let answer = match ask.await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer within {}", humantime::format_duration(options.timeout))),
            };
            (index, answer)
        });
    }
    while !tasks.is_empty() {
        keep(tasks.join_next().await);
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

/// How many clusters behind one plain-HTTP address are asked at once: with a cluster's seven
/// requests, at most 224 connections to that address, well under the API server's default of
/// 400 read requests in flight (`--max-requests-inflight`).
const PLAIN_CLUSTERS: usize = 32;

/// The `host:port` of a kubeconfig's `http://` server, `None` for any other.
fn plain_server(kubeconfig: &Kubeconfig) -> Option<String> {
    let server = kubeconfig.clusters.first()?.cluster.as_ref()?.server.as_deref()?;
    let uri: hyper::Uri = server.parse().ok()?;
    if uri.scheme_str() != Some("http") {
        return None;
    }
    uri.authority().map(host_port)
}

/// An address as `Host` names it: the host and any port, never the user information a server
/// URL may carry (`http://user:pw@host:port`), which is no part of `Host` (RFC 9110 7.2) and
/// would put the credentials where proxies log them.
fn host_port(authority: &hyper::http::uri::Authority) -> String {
    match authority.port() {
        Some(port) => format!("{}:{port}", authority.host()),
        None => authority.host().to_string(),
    }
}

/// What a cluster that answered holds.
type Answer = (Vec<Workload>, Vec<GitOpsObject>);

/// A cluster's task as it ended: its index in the scope and its answer.
type Joined = Result<(usize, Result<Answer, String>), JoinError>;

async fn ask_cluster(
    kubeconfig: Kubeconfig,
    context: &str,
    options: &CollectOptions,
    http: &PlainPool,
) -> Result<Answer, String> {
    let kube_options = KubeConfigOptions { context: Some(context.to_string()), ..KubeConfigOptions::default() };
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &kube_options)
        .await
        .map_err(|e| format!("bad kubeconfig context: {e}"))?;
    config.connect_timeout = Some(options.timeout);
    config.read_timeout = Some(options.timeout);
    let client = Transport::new(config, http).map_err(|e| format!("cannot build a client: {e}"))?;
    let ns = options.namespace.as_deref();
    let wants = |k: Kind| options.kinds.contains(&k);
    let (deployments, daemonsets, statefulsets, cronjobs, jobs, pods, gitops) = tokio::try_join!(
        list::<p::Deployment>(&client, ns, "/apis/apps/v1", "deployments", wants(Kind::Deployment)),
        list::<p::DaemonSet>(&client, ns, "/apis/apps/v1", "daemonsets", wants(Kind::DaemonSet)),
        list::<p::StatefulSet>(&client, ns, "/apis/apps/v1", "statefulsets", wants(Kind::StatefulSet)),
        list::<p::CronJob>(&client, ns, "/apis/batch/v1", "cronjobs", wants(Kind::CronJob)),
        list::<p::Job>(&client, ns, "/apis/batch/v1", "jobs", wants(Kind::Job)),
        // DaemonSet nodes are named from their pods, so pods are read for DaemonSets too.
        list::<p::Pod>(&client, ns, "/api/v1", "pods", wants(Kind::Pod) || wants(Kind::DaemonSet)),
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

/// One kind's objects, each read into the partial type `T` (the fields the inventory uses).
async fn list<T: DeserializeOwned>(
    client: &Transport,
    ns: Option<&str>,
    group_version: &str,
    plural: &str,
    wanted: bool,
) -> Result<Vec<T>, String> {
    if !wanted {
        return Ok(Vec::new());
    }
    let path = match ns {
        Some(ns) => format!("{group_version}/namespaces/{ns}/{plural}"),
        None => format!("{group_version}/{plural}"),
    };
    let request = kube::core::Request::new(path)
        .list(&ListParams::default())
        .map_err(|e| format!("listing {plural}: cannot build the request: {e}"))?;
    match client.get::<p::List<T>>(request).await {
        Ok(list) => Ok(list.items),
        Err(e) => Err(format!("listing {plural}: {}", short_error(&e))),
    }
}

fn labels_of(meta: &p::Meta, template: Option<&p::Template>) -> BTreeMap<String, String> {
    let mut labels = template.map(|t| t.metadata.labels.clone()).unwrap_or_default();
    labels.extend(meta.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels
}

fn containers_of(spec: Option<&p::PodSpec>) -> Vec<Container> {
    let Some(spec) = spec else { return Vec::new() };
    spec.init_containers
        .iter()
        .chain(spec.containers.iter())
        .filter_map(|c| c.image.as_deref().map(|image| Container::new(&c.name, image)))
        .collect()
}

fn base(kind: Kind, meta: &p::Meta, template: Option<&p::Template>) -> Workload {
    let containers = containers_of(template.map(|t| &t.spec));
    let set = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
    let annotations = &meta.annotations;
    let release = set(&annotations.release_name)
        .map(|name| format!("{}/{name}", set(&annotations.release_namespace).unwrap_or_default()));
    Workload {
        kind,
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
        labels: labels_of(meta, template),
        meta: WorkloadMeta {
            release,
            hook: set(&annotations.hook).is_some(),
            selector: BTreeMap::new(),
            images: containers.iter().map(|c| c.image.clone()).collect(),
            partition: 0,
        },
        containers,
        pod: None,
        rollout: Vec::new(),
    }
}

fn stale_generation(meta: &p::Meta, observed: Option<i64>) -> bool {
    matches!((meta.generation, observed), (Some(g), Some(o)) if o < g)
}

fn deployment(d: &p::Deployment) -> Workload {
    let (spec, status) = (&d.spec, &d.status);
    let mut w = base(Kind::Deployment, &d.metadata, Some(&spec.template));
    w.meta.selector = spec.selector.match_labels.clone();
    if spec.paused == Some(true) {
        w.rollout.push(RolloutFact::Paused);
    }
    let stalled = status.conditions.iter().find(|c| c.type_ == "Progressing" && c.status == "False");
    if let Some(c) = stalled {
        w.rollout.push(RolloutFact::NotProgressing {
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
        });
    }
    let desired = i64::from(spec.replicas.unwrap_or(1));
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

fn statefulset(s: &p::StatefulSet) -> Workload {
    let (spec, status) = (&s.spec, &s.status);
    let mut w = base(Kind::StatefulSet, &s.metadata, Some(&spec.template));
    w.meta.selector = spec.selector.match_labels.clone();
    let replicas = i64::from(spec.replicas.unwrap_or(1));
    let updated = i64::from(status.updated_replicas.unwrap_or(0));
    let ready = i64::from(status.ready_replicas.unwrap_or(0));
    let strategy = &spec.update_strategy;
    let on_delete = strategy.type_.as_deref() == Some("OnDelete");
    // A partition keeps the ordinals below it at the current revision by design: the rollout
    // is complete once the ordinals at or above it run the update revision (as `kubectl
    // rollout status` reads a partitioned StatefulSet).
    let partition = i64::from(strategy.rolling_update.partition.unwrap_or(0));
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

fn daemonset(d: &p::DaemonSet, pods: &[Workload]) -> Workload {
    let status = &d.status;
    let mut w = base(Kind::DaemonSet, &d.metadata, Some(&d.spec.template));
    w.meta.selector = d.spec.selector.match_labels.clone();
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

fn cronjob(c: &p::CronJob) -> Workload {
    let mut w = base(Kind::CronJob, &c.metadata, Some(&c.spec.job_template.spec.template));
    if c.spec.suspend == Some(true) {
        w.rollout.push(RolloutFact::Suspended);
    }
    w
}

fn job(j: &p::Job) -> Workload {
    let mut w = base(Kind::Job, &j.metadata, Some(&j.spec.template));
    let status = &j.status;
    let condition = |t: &str| status.conditions.iter().find(|c| c.type_ == t && c.status == "True");
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

fn pod(pod: &p::Pod) -> Workload {
    let mut w = base(Kind::Pod, &pod.metadata, None);
    w.containers = containers_of(Some(&pod.spec));
    let status = &pod.status;
    let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
    let unscheduled = status.conditions.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let waiting = unscheduled
        .map(|c| format!("{}: {}", c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
        .or_else(|| status.init_container_statuses.iter().chain(&status.container_statuses).find_map(container_why));
    let owners = &pod.metadata.owner_references;
    let owner = owners.iter().find(|o| o.controller == Some(true)).or_else(|| owners.first());
    w.pod = Some(PodFacts {
        // A DaemonSet's pod names its node in a required node affinity until it is bound.
        node: pod.spec.node_name.clone().or_else(|| pinned_node(&pod.spec)),
        phase: status.phase.clone().unwrap_or_else(|| "Unknown".into()),
        ready,
        owner: owner.map(|o| format!("{}/{}", o.kind, o.name)),
        waiting,
    });
    w
}

/// The one node a pod's required node affinity allows by name (`matchFields metadata.name`).
fn pinned_node(spec: &p::PodSpec) -> Option<String> {
    let terms = &spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms;
    let field = terms.first()?.match_fields.iter().find(|f| f.key == "metadata.name" && f.operator == "In")?;
    match field.values.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// Why a container does not run, in the words `kubectl describe pod` shows: the waiting
/// reason and message (`ImagePullBackOff: Back-off pulling image "nginx:1.277"`), with the last
/// termination for a container that keeps crashing, or how a container that ended failed.
fn container_why(s: &p::ContainerStatus) -> Option<String> {
    let ended = |t: &p::Terminated| {
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

/// The fields of each kind the inventory reads, and nothing else: a list of 4,000 clusters'
/// objects is deserialised into these, not into the whole typed objects. A `null` where a
/// map, list or object is expected reads as empty, as Go's client does.
mod p {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer};

    fn nullable<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
        Option::<T>::deserialize(d).map(Option::unwrap_or_default)
    }

    #[derive(Deserialize)]
    pub struct List<T> {
        #[serde(default = "Vec::new", deserialize_with = "nullable", bound(deserialize = "T: Deserialize<'de>"))]
        pub items: Vec<T>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Meta {
        #[serde(default, deserialize_with = "nullable")]
        pub name: String,
        #[serde(default, deserialize_with = "nullable")]
        pub namespace: String,
        #[serde(default, deserialize_with = "nullable")]
        pub labels: BTreeMap<String, String>,
        #[serde(default, deserialize_with = "nullable")]
        pub annotations: Annotations,
        #[serde(default)]
        pub generation: Option<i64>,
        #[serde(default, deserialize_with = "nullable")]
        pub owner_references: Vec<OwnerReference>,
    }

    /// The annotations the inventory reads; the others (a `last-applied-configuration` holds
    /// the whole object again) are skipped unread.
    #[derive(Default, Deserialize)]
    pub struct Annotations {
        #[serde(default, rename = "meta.helm.sh/release-name")]
        pub release_name: Option<String>,
        #[serde(default, rename = "meta.helm.sh/release-namespace")]
        pub release_namespace: Option<String>,
        #[serde(default, rename = "helm.sh/hook")]
        pub hook: Option<String>,
    }

    /// Discovery's group list (`/apis`), the fields the GitOps read uses.
    #[derive(Deserialize)]
    pub struct GroupList {
        #[serde(default, deserialize_with = "nullable")]
        pub groups: Vec<Group>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Group {
        #[serde(default)]
        pub name: String,
        #[serde(default)]
        pub preferred_version: Option<GroupVersion>,
        #[serde(default, deserialize_with = "nullable")]
        pub versions: Vec<GroupVersion>,
    }

    #[derive(Default, Deserialize)]
    pub struct GroupVersion {
        #[serde(default)]
        pub version: String,
    }

    #[derive(Default, Deserialize)]
    pub struct OwnerReference {
        #[serde(default)]
        pub kind: String,
        #[serde(default)]
        pub name: String,
        #[serde(default)]
        pub controller: Option<bool>,
    }

    #[derive(Default, Deserialize)]
    pub struct TemplateMeta {
        #[serde(default, deserialize_with = "nullable")]
        pub labels: BTreeMap<String, String>,
    }

    #[derive(Default, Deserialize)]
    pub struct Template {
        #[serde(default, deserialize_with = "nullable")]
        pub metadata: TemplateMeta,
        #[serde(default, deserialize_with = "nullable")]
        pub spec: PodSpec,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PodSpec {
        #[serde(default, deserialize_with = "nullable")]
        pub init_containers: Vec<ContainerSpec>,
        #[serde(default, deserialize_with = "nullable")]
        pub containers: Vec<ContainerSpec>,
        #[serde(default)]
        pub node_name: Option<String>,
        #[serde(default, deserialize_with = "nullable")]
        pub affinity: Affinity,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Affinity {
        #[serde(default, deserialize_with = "nullable")]
        pub node_affinity: NodeAffinity,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct NodeAffinity {
        #[serde(default, deserialize_with = "nullable")]
        pub required_during_scheduling_ignored_during_execution: NodeSelector,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct NodeSelector {
        #[serde(default, deserialize_with = "nullable")]
        pub node_selector_terms: Vec<NodeSelectorTerm>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct NodeSelectorTerm {
        #[serde(default, deserialize_with = "nullable")]
        pub match_fields: Vec<SelectorRequirement>,
    }

    #[derive(Default, Deserialize)]
    pub struct SelectorRequirement {
        #[serde(default)]
        pub key: String,
        #[serde(default)]
        pub operator: String,
        #[serde(default, deserialize_with = "nullable")]
        pub values: Vec<String>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct LabelSelector {
        #[serde(default, deserialize_with = "nullable")]
        pub match_labels: BTreeMap<String, String>,
    }

    #[derive(Default, Deserialize)]
    pub struct ContainerSpec {
        #[serde(default)]
        pub name: String,
        #[serde(default)]
        pub image: Option<String>,
    }

    #[derive(Default, Deserialize)]
    pub struct Condition {
        #[serde(default, rename = "type")]
        pub type_: String,
        #[serde(default)]
        pub status: String,
        #[serde(default)]
        pub reason: Option<String>,
        #[serde(default)]
        pub message: Option<String>,
    }

    #[derive(Deserialize)]
    pub struct Deployment {
        #[serde(default, deserialize_with = "nullable")]
        pub metadata: Meta,
        #[serde(default, deserialize_with = "nullable")]
        pub spec: DeploymentSpec,
        #[serde(default, deserialize_with = "nullable")]
        pub status: DeploymentStatus,
    }

    #[derive(Default, Deserialize)]
    pub struct DeploymentSpec {
        #[serde(default)]
        pub replicas: Option<i32>,
        #[serde(default, deserialize_with = "nullable")]
        pub selector: LabelSelector,
        #[serde(default)]
        pub paused: Option<bool>,
        #[serde(default, deserialize_with = "nullable")]
        pub template: Template,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct DeploymentStatus {
        #[serde(default, deserialize_with = "nullable")]
        pub conditions: Vec<Condition>,
        #[serde(default)]
        pub replicas: Option<i32>,
        #[serde(default)]
        pub updated_replicas: Option<i32>,
        #[serde(default)]
        pub available_replicas: Option<i32>,
        #[serde(default)]
        pub observed_generation: Option<i64>,
    }

    #[derive(Deserialize)]
    pub struct StatefulSet {
        #[serde(default, deserialize_with = "nullable")]
        pub metadata: Meta,
        #[serde(default, deserialize_with = "nullable")]
        pub spec: StatefulSetSpec,
        #[serde(default, deserialize_with = "nullable")]
        pub status: StatefulSetStatus,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct StatefulSetSpec {
        #[serde(default)]
        pub replicas: Option<i32>,
        #[serde(default, deserialize_with = "nullable")]
        pub selector: LabelSelector,
        #[serde(default, deserialize_with = "nullable")]
        pub template: Template,
        #[serde(default, deserialize_with = "nullable")]
        pub update_strategy: UpdateStrategy,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct UpdateStrategy {
        #[serde(default, rename = "type")]
        pub type_: Option<String>,
        #[serde(default, deserialize_with = "nullable")]
        pub rolling_update: RollingUpdate,
    }

    #[derive(Default, Deserialize)]
    pub struct RollingUpdate {
        #[serde(default)]
        pub partition: Option<i32>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct StatefulSetStatus {
        #[serde(default)]
        pub updated_replicas: Option<i32>,
        #[serde(default)]
        pub ready_replicas: Option<i32>,
        #[serde(default)]
        pub current_revision: Option<String>,
        #[serde(default)]
        pub update_revision: Option<String>,
        #[serde(default)]
        pub observed_generation: Option<i64>,
    }

    #[derive(Deserialize)]
    pub struct DaemonSet {
        #[serde(default, deserialize_with = "nullable")]
        pub metadata: Meta,
        #[serde(default, deserialize_with = "nullable")]
        pub spec: DaemonSetSpec,
        #[serde(default, deserialize_with = "nullable")]
        pub status: DaemonSetStatus,
    }

    #[derive(Default, Deserialize)]
    pub struct DaemonSetSpec {
        #[serde(default, deserialize_with = "nullable")]
        pub selector: LabelSelector,
        #[serde(default, deserialize_with = "nullable")]
        pub template: Template,
    }

    #[derive(Default, Deserialize)]
    pub struct TemplateOnly {
        #[serde(default, deserialize_with = "nullable")]
        pub template: Template,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct DaemonSetStatus {
        #[serde(default)]
        pub desired_number_scheduled: i32,
        #[serde(default)]
        pub updated_number_scheduled: Option<i32>,
        #[serde(default)]
        pub number_available: Option<i32>,
        #[serde(default)]
        pub observed_generation: Option<i64>,
    }

    #[derive(Deserialize)]
    pub struct CronJob {
        #[serde(default, deserialize_with = "nullable")]
        pub metadata: Meta,
        #[serde(default, deserialize_with = "nullable")]
        pub spec: CronJobSpec,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct CronJobSpec {
        #[serde(default)]
        pub suspend: Option<bool>,
        #[serde(default, deserialize_with = "nullable")]
        pub job_template: JobTemplate,
    }

    #[derive(Default, Deserialize)]
    pub struct JobTemplate {
        #[serde(default, deserialize_with = "nullable")]
        pub spec: TemplateOnly,
    }

    #[derive(Deserialize)]
    pub struct Job {
        #[serde(default, deserialize_with = "nullable")]
        pub metadata: Meta,
        #[serde(default, deserialize_with = "nullable")]
        pub spec: TemplateOnly,
        #[serde(default, deserialize_with = "nullable")]
        pub status: JobStatus,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct JobStatus {
        #[serde(default, deserialize_with = "nullable")]
        pub conditions: Vec<Condition>,
        #[serde(default)]
        pub completion_time: Option<String>,
    }

    #[derive(Deserialize)]
    pub struct Pod {
        #[serde(default, deserialize_with = "nullable")]
        pub metadata: Meta,
        #[serde(default, deserialize_with = "nullable")]
        pub spec: PodSpec,
        #[serde(default, deserialize_with = "nullable")]
        pub status: PodStatus,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PodStatus {
        #[serde(default, deserialize_with = "nullable")]
        pub conditions: Vec<Condition>,
        #[serde(default, deserialize_with = "nullable")]
        pub init_container_statuses: Vec<ContainerStatus>,
        #[serde(default, deserialize_with = "nullable")]
        pub container_statuses: Vec<ContainerStatus>,
        #[serde(default)]
        pub phase: Option<String>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ContainerStatus {
        #[serde(default)]
        pub name: String,
        #[serde(default)]
        pub state: Option<ContainerState>,
        #[serde(default)]
        pub last_state: Option<ContainerState>,
    }

    #[derive(Default, Deserialize)]
    pub struct ContainerState {
        #[serde(default)]
        pub waiting: Option<Waiting>,
        #[serde(default)]
        pub terminated: Option<Terminated>,
    }

    #[derive(Default, Deserialize)]
    pub struct Waiting {
        #[serde(default)]
        pub reason: Option<String>,
        #[serde(default)]
        pub message: Option<String>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Terminated {
        #[serde(default)]
        pub exit_code: i32,
        #[serde(default)]
        pub reason: Option<String>,
        #[serde(default)]
        pub message: Option<String>,
    }
}

/// The GitOps kinds rdeploy reads, by API group.
const GITOPS: &[(&str, &str, &str)] = &[
    ("argoproj.io", "Application", "applications"),
    ("kustomize.toolkit.fluxcd.io", "Kustomization", "kustomizations"),
    ("helm.toolkit.fluxcd.io", "HelmRelease", "helmreleases"),
];

/// Argo CD and Flux objects, when their CRDs are installed. One discovery request tells which
/// groups exist, instead of three lists that would mostly answer 404.
async fn gitops_objects(client: &Transport, wanted: bool) -> Result<Vec<GitOpsObject>, String> {
    if !wanted {
        return Ok(Vec::new());
    }
    let groups: p::GroupList = client
        .get(hyper::Request::get("/apis").body(Vec::new()).map_err(|e| format!("discovery: {e}"))?)
        .await
        .map_err(|e| format!("discovery: {}", short_error(&e)))?;
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
        let request = kube::core::Request::new(<DynamicObject as kube::Resource>::url_path(&resource, None))
            .list(&ListParams::default())
            .map_err(|e| format!("listing {plural}.{group}: cannot build the request: {e}"))?;
        match client.get::<p::List<DynamicObject>>(request).await {
            Ok(list) => out.extend(list.items.iter().map(|o| gitops_object(kind, o))),
            // The group exists but not this kind (a Flux install without helm-controller).
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(format!("listing {plural}.{group}: {}", short_error(&e))),
        }
    }
    Ok(out)
}

/// How the inventory reaches one cluster.
enum Transport {
    /// An `http://` cluster: kube's base-URI and auth layers over the run's [`PlainPool`],
    /// called as they are. kube's `Client` would put a buffer in front (a task and a channel
    /// per cluster, a hop through them per request) and copy each body into a `String`.
    Plain(PlainService),
    /// Any other (`https://`): kube's own client, TLS and auth as kubectl does.
    Kube(Client),
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type PlainService =
    tower::util::BoxCloneSyncService<hyper::Request<kube::client::Body>, hyper::Response<Bytes>, BoxError>;

impl Transport {
    fn new(config: Config, http: &PlainPool) -> Result<Transport, kube::Error> {
        use kube::client::ConfigExt as _;
        if config.cluster_url.scheme_str() != Some("http") {
            return Client::try_from(config).map(Transport::Kube);
        }
        let service = tower::ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer()?)
            .layer(config.extra_headers_layer()?)
            .service(http.clone());
        Ok(Transport::Plain(PlainService::new(service)))
    }

    /// A GET's answer read into `T` straight from the body's bytes; an error status is
    /// kube's `Error::Api`, as kube's client makes it.
    async fn get<T: DeserializeOwned>(&self, request: hyper::Request<Vec<u8>>) -> Result<T, kube::Error> {
        use http_body_util::BodyExt as _;
        use tower::ServiceExt as _;
        let request = request.map(kube::client::Body::from);
        let (status, body) = match self {
            Transport::Plain(service) => {
                let response = service.clone().oneshot(request).await.map_err(service_error)?;
                (response.status(), response.into_body())
            }
            Transport::Kube(client) => {
                let response = client.send(request).await?;
                let status = response.status();
                let body = response.into_body().collect().await.map_err(|e| service_error(e.into()))?;
                (status, body.to_bytes())
            }
        };
        serde_json::from_slice(&answer(status, body)?).map_err(kube::Error::SerdeError)
    }
}

/// An error of the service stack, as kube's client maps it: one of kube's own (an auth layer's),
/// else a hyper error, else the service's.
fn service_error(e: BoxError) -> kube::Error {
    match e.downcast::<kube::Error>() {
        Ok(e) => *e,
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(e) => kube::Error::HyperError(*e),
            Err(e) => kube::Error::Service(e),
        },
    }
}

/// The body of a successful answer; an error status is `Error::Api` with the server's `Status`
/// (its message), or the status and body when it sent none.
fn answer(status: hyper::StatusCode, body: Bytes) -> Result<Bytes, kube::Error> {
    if !(status.is_client_error() || status.is_server_error()) {
        return Ok(body);
    }
    Err(kube::Error::Api(serde_json::from_slice::<kube::core::ErrorResponse>(&body).unwrap_or_else(|_| {
        kube::core::ErrorResponse {
            status: status.to_string(),
            code: status.as_u16(),
            message: format!("{:?}", String::from_utf8_lossy(&body)),
            reason: "Failed to parse error data".into(),
        }
    })))
}

/// The run's plain-HTTP connections, kept alive and reused last-in first-out by server
/// address (`host:port`): many clusters can share one address (every kubesim cluster, every
/// cluster behind one proxy). hyper's pool queued a waiter for every request that found no idle
/// connection and scanned that queue as each one was answered; a connection here is taken when
/// it is free and opened when none is. A request answers with its whole body, read before the
/// connection goes back.
#[derive(Clone, Default)]
struct PlainPool {
    idle: Arc<Mutex<HashMap<String, Vec<Sender>>>>,
}

type Sender = hyper::client::conn::http1::SendRequest<kube::client::Body>;

impl PlainPool {
    fn take(&self, server: &str) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let senders = idle.get_mut(server)?;
        while let Some(sender) = senders.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn give_back(&self, server: String, sender: Sender) {
        if !sender.is_closed() {
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).entry(server).or_default().push(sender);
        }
    }

    async fn send(self, mut request: hyper::Request<kube::client::Body>) -> Result<hyper::Response<Bytes>, BoxError> {
        use http_body_util::BodyExt as _;
        let uri = request.uri().clone();
        let authority = uri.authority().ok_or_else(|| format!("no server address in `{uri}`"))?;
        let server = host_port(authority);
        if !request.headers().contains_key(hyper::header::HOST) {
            request.headers_mut().insert(hyper::header::HOST, hyper::header::HeaderValue::from_str(&server)?);
        }
        // Origin form (`/path?query`), as a client that is not talking to a proxy sends it.
        *request.uri_mut() = match uri.path_and_query() {
            Some(path) => hyper::Uri::from(path.clone()),
            None => hyper::Uri::from_static("/"),
        };
        // A GET (all the inventory sends) lost with a kept-alive connection the server closed
        // as it went out is sent once more, on a new connection, as Go's client does: it changes
        // nothing, and the cluster answered the requests before it.
        let mut replay = (request.method() == hyper::Method::GET)
            .then(|| (request.uri().clone(), request.headers().clone(), request.version()));
        let mut fresh = false;
        loop {
            let (mut sender, reused) = match self.take(&server).filter(|_| !fresh) {
                Some(sender) => (sender, true),
                None => (connect(authority.host(), authority.port_u16().unwrap_or(80)).await?, false),
            };
            if reused && sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    let body = body.collect().await?.to_bytes();
                    self.give_back(server, sender);
                    return Ok(hyper::Response::from_parts(parts, body));
                }
                // A kept-alive connection the server closed before the request went out: the
                // request is handed back, to go out on another.
                Err(mut e) if reused && e.message().is_some() => {
                    request = e.take_message().expect("just checked");
                }
                Err(e) => match replay.take().filter(|_| reused) {
                    Some((uri, headers, version)) => {
                        request = hyper::Request::new(kube::client::Body::empty());
                        (*request.uri_mut(), *request.headers_mut(), *request.version_mut()) = (uri, headers, version);
                        fresh = true;
                        tracing::debug!("a kept-alive connection to {server} failed ({}): sent again", e.error());
                    }
                    None => return Err(e.into_error().into()),
                },
            }
        }
    }
}

impl tower::Service<hyper::Request<kube::client::Body>> for PlainPool {
    type Response = hyper::Response<Bytes>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<hyper::Response<Bytes>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: hyper::Request<kube::client::Body>) -> Self::Future {
        Box::pin(self.clone().send(request))
    }
}

/// A new connection to `host` at `port`, its end driven by a task of its own.
async fn connect(host: &str, port: u16) -> Result<Sender, BoxError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let stream = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| format!("tcp connect error: {e}"))?;
    // One write per request: nothing to gain from Nagle's delay.
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        // Its errors reach the request that was on it.
        let _ = connection.await;
    });
    Ok(sender)
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

    /// A server that answers a kept-alive connection's first request, then reads the second
    /// and closes without an answer (an idle connection dropped as a request arrives): the
    /// GET goes out once more on a new connection and is answered; `Host` names no credentials.
    #[tokio::test]
    async fn a_get_lost_with_a_closed_kept_alive_connection_is_sent_again_on_a_new_one() {
        use std::io::{BufRead as _, BufReader, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let read_request = |reader: &mut BufReader<std::net::TcpStream>| {
                let mut head = Vec::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                        return head;
                    }
                    head.push(line.trim_end().to_string());
                }
            };
            let answer = |stream: &mut std::net::TcpStream, body: &str| {
                write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
            };
            let (first, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(first.try_clone().unwrap());
            let head = read_request(&mut reader);
            answer(&mut reader.get_ref().try_clone().unwrap(), "one");
            assert!(!read_request(&mut reader).is_empty(), "the second request came on the kept-alive connection");
            drop(reader);
            drop(first);
            let (second, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(second.try_clone().unwrap());
            let again = read_request(&mut reader);
            answer(&mut reader.get_ref().try_clone().unwrap(), "two");
            (head, again)
        });
        let pool = PlainPool::default();
        let get = |path: &str| {
            hyper::Request::get(format!("http://user:secret@127.0.0.1:{port}{path}"))
                .body(kube::client::Body::empty())
                .unwrap()
        };
        let one = pool.clone().send(get("/api")).await.unwrap();
        assert_eq!(one.body().as_ref(), b"one");
        let two = pool.clone().send(get("/apis")).await.unwrap();
        assert_eq!(two.body().as_ref(), b"two");
        let (head, again) = server.join().unwrap();
        assert_eq!(head[0], "GET /api HTTP/1.1");
        assert_eq!(again[0], "GET /apis HTTP/1.1");
        let host = again.iter().find(|h| h.to_ascii_lowercase().starts_with("host:")).unwrap();
        assert_eq!(host.to_ascii_lowercase(), format!("host: 127.0.0.1:{port}"));
    }

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

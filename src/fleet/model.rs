//! The fleet inventory model: what each cluster runs, its rollout facts and GitOps status.
//! It is source-neutral (the Kubernetes API today, Prometheus series later), serializable
//! as the `inventory --json` document, and the only input of the analysis.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// One snapshot of the fleet.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Inventory {
    #[serde(with = "time::serde::rfc3339")]
    pub taken_at: OffsetDateTime,
    pub clusters: Vec<ClusterInventory>,
}

/// What one cluster answered, or that it did not answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterInventory {
    /// The kube context name, which is the cluster's name in rdeploy's reports.
    pub name: String,
    /// Labels from the fleet file (site, region...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(flatten)]
    pub presence: Presence,
    #[serde(default)]
    pub workloads: Vec<Workload>,
    #[serde(default)]
    pub gitops: Vec<GitOpsObject>,
}

impl ClusterInventory {
    pub fn absent(name: &str, error: String, last_seen: Option<OffsetDateTime>) -> ClusterInventory {
        ClusterInventory {
            name: name.to_string(),
            labels: BTreeMap::new(),
            presence: Presence::Absent { error, last_seen },
            workloads: Vec::new(),
            gitops: Vec::new(),
        }
    }

    pub fn is_absent(&self) -> bool {
        matches!(self.presence, Presence::Absent { .. })
    }
}

#[cfg(test)]
impl ClusterInventory {
    /// A present cluster running one workload `namespace/agent` with one container `image`.
    pub(crate) fn running(name: &str, kind: Kind, namespace: &str, image: &str) -> ClusterInventory {
        let mut c = ClusterInventory::absent(name, String::new(), None);
        c.presence = Presence::Present;
        c.workloads.push(Workload {
            kind,
            namespace: namespace.into(),
            name: "agent".into(),
            labels: Default::default(),
            containers: vec![Container::new("a", image)],
            pod: None,
            rollout: vec![],
            meta: Default::default(),
        });
        c
    }
}

/// A cluster that does not answer is absent, never healthy: it has no workloads to judge.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Presence {
    Present,
    Absent {
        error: String,
        /// When it last answered an inventory, if ever (from the state directory).
        #[serde(with = "time::serde::rfc3339::option")]
        last_seen: Option<OffsetDateTime>,
    },
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Deployment,
    DaemonSet,
    StatefulSet,
    CronJob,
    Job,
    Pod,
}

impl Kind {
    pub const ALL: [Kind; 6] =
        [Kind::Deployment, Kind::DaemonSet, Kind::StatefulSet, Kind::CronJob, Kind::Job, Kind::Pod];

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s) || format!("{}s", k.name()).eq_ignore_ascii_case(s))
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::DaemonSet => "DaemonSet",
            Kind::StatefulSet => "StatefulSet",
            Kind::CronJob => "CronJob",
            Kind::Job => "Job",
            Kind::Pod => "Pod",
        }
    }
}

/// A workload (or a pod) and the images its containers run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Workload {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    /// The object's labels merged with its pod template's (a selector may target either).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub containers: Vec<Container>,
    /// For pods: the node, and whether it is ready (a pending pod does not run its image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodFacts>,
    /// Why this workload's rollout is not complete; empty when it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollout: Vec<RolloutFact>,
    /// What the readiness check of a single-cluster step needs beyond the inventory (not part
    /// of the inventory document).
    #[serde(skip)]
    pub meta: WorkloadMeta,
}

/// Where a workload came from and how its pods are found, read from its object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadMeta {
    /// `namespace/name` of the helm release that manages it (`meta.helm.sh/release-*`).
    pub release: Option<String>,
    /// A helm hook (`helm.sh/hook`): helm runs it, it is not part of the release's manifest.
    pub hook: bool,
    /// The pod selector's `matchLabels` (a Deployment's pods are owned by its ReplicaSets).
    pub selector: BTreeMap<String, String>,
    /// The pod template's container images, with init containers.
    pub images: Vec<String>,
    /// A StatefulSet's `rollingUpdate.partition`: its pods of a lower ordinal keep the current
    /// revision by design.
    pub partition: i64,
}

impl Workload {
    pub fn id(&self) -> String {
        format!("{} {}/{}", self.kind.name(), self.namespace, self.name)
    }

    /// Whether its images are in use: terminal pods and finished Jobs run nothing any more.
    pub fn is_live(&self) -> bool {
        match (&self.pod, self.kind) {
            (Some(p), _) => !matches!(p.phase.as_str(), "Succeeded" | "Failed"),
            (None, Kind::Job) => {
                !self.rollout.iter().any(|f| matches!(f, RolloutFact::Finished | RolloutFact::JobFailed { .. }))
            }
            _ => true,
        }
    }

    /// Whether its rollout is complete for a step that applied it: no fact blocks, and a Job
    /// has completed (a running Job is not done yet, though the fleet's inventory counts it
    /// healthy).
    pub fn complete(&self) -> bool {
        !self.rollout.iter().any(RolloutFact::blocks)
            && (self.kind != Kind::Job || self.rollout.iter().any(|f| matches!(f, RolloutFact::Finished)))
    }

    /// Whether `pod` (a [`Kind::Pod`] workload) belongs to this workload: owned by it, or for
    /// a Deployment (whose pods its ReplicaSets own) matched by its selector.
    pub fn owns(&self, pod: &Workload) -> bool {
        let Some(facts) = pod.pod.as_ref() else { return false };
        if pod.namespace != self.namespace {
            return false;
        }
        match self.kind {
            Kind::Deployment => {
                !self.meta.selector.is_empty()
                    && self.meta.selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v))
                    && facts.owner.as_deref().is_some_and(|o| o.starts_with("ReplicaSet/"))
            }
            kind => facts.owner.as_deref() == Some(format!("{}/{}", kind.name(), self.name).as_str()),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PodFacts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub phase: String,
    pub ready: bool,
    /// `Kind/name` of the controller that owns the pod, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Why it is not running, when the API says (`Unschedulable: 0/3 nodes...`, `ImagePullBackOff`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

/// A rollout that has not finished, as the workload's status says.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "fact", rename_all = "snake_case")]
pub enum RolloutFact {
    Paused,
    NotProgressing {
        reason: String,
        message: String,
    },
    InProgress {
        updated: i64,
        desired: i64,
    },
    /// DaemonSet pods not updated or not available; the nodes are named from its pods.
    NodesNotUpdated {
        updated: i64,
        available: i64,
        desired: i64,
        nodes: Vec<String>,
        /// Why a pod there does not run, when its status says (`Unschedulable: ...taint...`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
    /// A Job that completed: its image no longer runs.
    Finished,
    /// A Job that failed (its `Failed` condition): its image no longer runs, and what it was
    /// to do is not done.
    JobFailed {
        reason: String,
        message: String,
    },
    /// A CronJob or Flux object that will not act.
    Suspended,
}

impl RolloutFact {
    /// Whether this fact means the rollout is incomplete. A finished Job is history and a
    /// suspended CronJob runs nothing; their images still count as versions in the fleet.
    pub fn blocks(&self) -> bool {
        !matches!(self, RolloutFact::Finished | RolloutFact::Suspended)
    }

    pub fn describe(&self, workload: &str) -> String {
        match self {
            RolloutFact::Paused => format!("{workload} paused"),
            RolloutFact::NotProgressing { reason, message } => {
                format!("{workload} not progressing ({reason}: {message})")
            }
            RolloutFact::InProgress { updated, desired } => {
                format!("{workload} rollout in progress ({updated}/{desired} updated)")
            }
            RolloutFact::NodesNotUpdated { updated, available, desired, nodes, why } => {
                let on = if nodes.is_empty() { String::new() } else { format!(" on node {}", nodes.join(", ")) };
                let why = why.as_ref().map(|w| format!("; {w}")).unwrap_or_default();
                format!("{workload} halted{on} ({updated}/{desired} updated, {available}/{desired} available{why})")
            }
            RolloutFact::Finished => format!("{workload} finished"),
            RolloutFact::JobFailed { reason, message } => format!("{workload} failed ({reason}: {message})"),
            RolloutFact::Suspended => format!("{workload} suspended"),
        }
    }
}

/// One container's image, split into the component (repository) and its version (tag).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub component: String,
    pub version: String,
}

impl Container {
    pub fn new(name: &str, image: &str) -> Container {
        let (component, version) = split_image(image);
        Container { name: name.to_string(), image: image.to_string(), component, version }
    }
}

/// `registry:5000/team/app:1.2@sha256:..` -> (`registry:5000/team/app`, `1.2`). A bare digest
/// is the version when there is no tag; no tag and no digest is `latest`, as the runtime reads it.
pub fn split_image(image: &str) -> (String, String) {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    let (repo, tag) = match name[slash..].rfind(':') {
        Some(i) => (&name[..slash + i], Some(&name[slash + i + 1..])),
        None => (name, None),
    };
    let version = match (tag, digest) {
        (Some(t), _) => t.to_string(),
        (None, Some(d)) => d.chars().take(19).collect(),
        (None, None) => "latest".to_string(),
    };
    (normalize_repo(repo), version)
}

/// Docker Hub's implicit prefixes are dropped so `nginx` and `docker.io/library/nginx` match.
pub fn normalize_repo(repo: &str) -> String {
    let r = repo.strip_prefix("docker.io/").or_else(|| repo.strip_prefix("index.docker.io/")).unwrap_or(repo);
    r.strip_prefix("library/").unwrap_or(r).to_string()
}

/// Orders versions so `1.10` is newer than `1.9` and `2.0` newer than `2.0-rc1`: numeric runs
/// compare as numbers, a pre-release suffix sorts before the release.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let strip = |v: &str| v.strip_prefix('v').unwrap_or(v).to_string();
    let (a, b) = (strip(a), strip(b));
    let (a_main, a_pre) = a.split_once('-').map_or((a.as_str(), None), |(m, p)| (m, Some(p)));
    let (b_main, b_pre) = b.split_once('-').map_or((b.as_str(), None), |(m, p)| (m, Some(p)));
    let (pa, pb) = (tokens(a_main), tokens(b_main));
    for i in 0..pa.len().max(pb.len()) {
        let zero = Token::Num(0);
        let ord = pa.get(i).unwrap_or(&zero).cmp(pb.get(i).unwrap_or(&zero));
        if ord != Ordering::Equal {
            return ord;
        }
    }
    match (a_pre, b_pre) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(x), Some(y)) => compare_versions(x, y),
    }
}

/// A run of digits or of other characters in a version; a number sorts above a word, so a
/// release (`2.0.1`) is newer than a named build of the same prefix (`2.0.beta`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Token {
    Str(String),
    Num(u64),
}

fn tokens(s: &str) -> Vec<Token> {
    let mut out = Vec::new();
    for part in s.split(['.', '_', '+']) {
        let mut chars = part.chars().peekable();
        while let Some(&c) = chars.peek() {
            let digit = c.is_ascii_digit();
            let mut run = String::new();
            while let Some(&c) = chars.peek().filter(|c| c.is_ascii_digit() == digit) {
                run.push(c);
                chars.next();
            }
            out.push(if digit { Token::Num(run.parse().unwrap_or(u64::MAX)) } else { Token::Str(run) });
        }
    }
    out
}

/// An Argo CD Application or a Flux Kustomization/HelmRelease and the revision it applied.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GitOpsObject {
    /// `Application`, `Kustomization` or `HelmRelease`.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The revision in place (Argo `status.sync.revision`, Flux `lastAppliedRevision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// What the object asks for (Argo `targetRevision`, a HelmRelease chart version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Argo sync status (`Synced`, `OutOfSync`) or Flux `Ready` condition status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<String>,
    /// Argo health (`Healthy`, `Degraded`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    #[serde(default)]
    pub suspended: bool,
}

impl GitOpsObject {
    pub fn id(&self) -> String {
        let what = match self.kind.as_str() {
            "Application" => "Argo CD Application",
            "Kustomization" => "Flux Kustomization",
            "HelmRelease" => "Flux HelmRelease",
            other => other,
        };
        format!("{what} {}/{}", self.namespace, self.name)
    }

    /// What identifies the pin: the applied revision, else the requested one.
    pub fn pin(&self) -> Option<&str> {
        self.revision.as_deref().or(self.target.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_split_into_component_and_version() {
        assert_eq!(
            split_image("registry.example/node-agent:2.0"),
            ("registry.example/node-agent".into(), "2.0".into())
        );
        assert_eq!(split_image("localhost:5000/app"), ("localhost:5000/app".into(), "latest".into()));
        assert_eq!(split_image("localhost:5000/app:1.2"), ("localhost:5000/app".into(), "1.2".into()));
        assert_eq!(split_image("docker.io/library/nginx:1.27"), ("nginx".into(), "1.27".into()));
        assert_eq!(split_image("app:1.0@sha256:abcdef"), ("app".into(), "1.0".into()));
        assert_eq!(split_image("app@sha256:0123456789abcdef0123"), ("app".into(), "sha256:0123456789ab".into()));
    }

    #[test]
    fn versions_order_numerically_with_prereleases_first() {
        use Ordering::*;
        assert_eq!(compare_versions("1.10", "1.9"), Greater);
        assert_eq!(compare_versions("v2.0", "2.0"), Equal);
        assert_eq!(compare_versions("2.0", "2.0.0"), Equal);
        assert_eq!(compare_versions("2.0-rc1", "2.0"), Less);
        assert_eq!(compare_versions("2.0-rc2", "2.0-rc10"), Less);
        assert_eq!(compare_versions("1.0", "latest"), Greater);
    }

    #[test]
    fn finished_jobs_and_terminal_pods_run_nothing() {
        let mut w = Workload {
            kind: Kind::Job,
            namespace: "n".into(),
            name: "j".into(),
            labels: BTreeMap::new(),
            containers: vec![],
            pod: None,
            rollout: vec![RolloutFact::Finished],
            meta: Default::default(),
        };
        assert!(!w.is_live());
        w.rollout.clear();
        assert!(w.is_live());
        w.kind = Kind::Pod;
        w.pod = Some(PodFacts { node: None, phase: "Succeeded".into(), ready: false, owner: None, waiting: None });
        assert!(!w.is_live());
    }
}

//! Judging a snapshot: for one component, which clusters run the wanted version and which are
//! stragglers, and why (old version, absent since, DaemonSet halted on a node, paused or stuck
//! Deployment, GitOps object pinned to another revision). Gates and the version matrix both
//! ask this module, so they never disagree.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use time::OffsetDateTime;

use super::model::{
    compare_versions, normalize_repo, ClusterInventory, GitOpsObject, Inventory, Kind, Presence, Workload,
};

/// A Kubernetes label selector: `app=x,tier!=db,env in (a,b),key,!key`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector(Vec<Requirement>);

#[derive(Clone, Debug, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (i, ch) in text.char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&text[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&text[start..]);
        let mut reqs = Vec::new();
        for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            let set = |rest: &str| -> Result<Vec<String>, String> {
                let inner = rest
                    .trim()
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| format!("`{part}`: expected a set like `(a,b)`"))?;
                Ok(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
            };
            let req = if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Requirement::NotIn(k.trim().into(), set(rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Requirement::In(k.trim().into(), set(rest)?)
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::NotExists(k.trim().into())
            } else if part.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
                Requirement::Exists(part.into())
            } else {
                return Err(format!("`{part}` is not a label selector requirement"));
            };
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => labels.get(k) == Some(v),
            Requirement::NotEq(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// Which workloads a judgment looks at.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub selector: Selector,
    /// Empty: every kind.
    pub kinds: Vec<Kind>,
}

impl Filter {
    fn admits(&self, w: &Workload) -> bool {
        self.namespace.as_ref().is_none_or(|n| &w.namespace == n)
            && (self.kinds.is_empty() || self.kinds.contains(&w.kind))
            && self.selector.matches(&w.labels)
    }
}

/// Where one cluster stands for one component.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Standing {
    /// Runs only the wanted version, and no rollout of it is unfinished.
    Done,
    /// Runs the component, but not (only) the wanted version, or its rollout is unfinished.
    Behind { versions: Vec<String>, reasons: Vec<String> },
    /// Answered, but nothing selected runs the component.
    Missing,
    /// Did not answer: counts against completion.
    Absent {
        error: String,
        #[serde(with = "time::serde::rfc3339::option")]
        last_seen: Option<OffsetDateTime>,
    },
}

#[derive(Clone, Debug, Serialize)]
pub struct ClusterStanding {
    pub cluster: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(flatten)]
    pub standing: Standing,
}

impl ClusterStanding {
    /// One line: why this cluster is not done.
    pub fn why(&self, component: &str) -> String {
        match &self.standing {
            Standing::Done => "up to date".into(),
            Standing::Behind { reasons, .. } => reasons.join("; "),
            Standing::Missing => format!("no selected workload runs {component}"),
            Standing::Absent { error, last_seen } => absent_why(error, *last_seen),
        }
    }
}

pub fn absent_why(error: &str, last_seen: Option<OffsetDateTime>) -> String {
    let since = match last_seen {
        Some(t) => format!("absent since {} (last seen)", rfc3339(t)),
        None => "absent, never seen by rdeploy".into(),
    };
    format!("{since}: {error}")
}

pub fn rfc3339(t: OffsetDateTime) -> String {
    t.replace_nanosecond(0).unwrap_or(t).format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// Every version of `component` running in the fleet, newest first.
pub fn versions_of(inventory: &Inventory, component: &str, filter: &Filter) -> Vec<String> {
    let set: BTreeSet<&str> = inventory
        .clusters
        .iter()
        .flat_map(|c| &c.workloads)
        .filter(|w| w.is_live() && filter.admits(w))
        .flat_map(|w| &w.containers)
        .filter(|c| c.component == component)
        .map(|c| c.version.as_str())
        .collect();
    let mut v: Vec<String> = set.into_iter().map(str::to_string).collect();
    v.sort_by(|a, b| compare_versions(b, a));
    v
}

/// Judges every cluster for `component` against `wanted`.
pub fn judge(inventory: &Inventory, component: &str, wanted: &str, filter: &Filter) -> Vec<ClusterStanding> {
    let component = normalize_repo(component);
    let mut standings: Vec<ClusterStanding> = inventory
        .clusters
        .iter()
        .map(|c| ClusterStanding {
            cluster: c.name.clone(),
            labels: c.labels.clone(),
            standing: judge_cluster(c, &component, wanted, filter),
        })
        .collect();
    // GitOps objects of up-to-date clusters tell which revision is current; a straggler whose
    // same-named object applied another revision is pinned to it.
    let mut current: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (c, s) in inventory.clusters.iter().zip(&standings) {
        if s.standing == Standing::Done {
            for g in &c.gitops {
                current.entry(g.id()).or_default().extend(g.pin().map(str::to_string));
            }
        }
    }
    for (c, s) in inventory.clusters.iter().zip(standings.iter_mut()) {
        if let Standing::Behind { reasons, .. } = &mut s.standing {
            reasons.extend(c.gitops.iter().filter_map(|g| gitops_why(g, current.get(&g.id()))));
        }
    }
    standings
}

fn gitops_why(g: &GitOpsObject, current: Option<&BTreeSet<String>>) -> Option<String> {
    let pin = g.pin().unwrap_or("no revision");
    let asked = match (&g.target, &g.revision) {
        (Some(t), Some(r)) if t != r => format!(" (asks for {t})"),
        _ => String::new(),
    };
    if g.suspended {
        return Some(format!("{} suspended at revision {pin}{asked}", g.id()));
    }
    let current = current?;
    if current.contains(pin) {
        return None;
    }
    let others: Vec<&str> = current.iter().map(String::as_str).collect();
    Some(format!("{} pinned to revision {pin}{asked}; up-to-date clusters have {}", g.id(), others.join(", ")))
}

fn judge_cluster(c: &ClusterInventory, component: &str, wanted: &str, filter: &Filter) -> Standing {
    if let Presence::Absent { error, last_seen } = &c.presence {
        return Standing::Absent { error: error.clone(), last_seen: *last_seen };
    }
    let mine: Vec<&Workload> = c
        .workloads
        .iter()
        .filter(|w| w.is_live() && filter.admits(w) && w.containers.iter().any(|x| x.component == component))
        .collect();
    if mine.is_empty() {
        return Standing::Missing;
    }
    // old version -> where it runs. A pod whose controller is already named adds nothing.
    let controllers: BTreeSet<String> =
        mine.iter().filter(|w| w.pod.is_none()).map(|w| format!("{}/{}", w.kind.name(), w.name)).collect();
    let owned = |w: &Workload| {
        w.pod.as_ref().and_then(|p| p.owner.as_deref()).is_some_and(|o| {
            // A Deployment's pods are owned by its ReplicaSet `<deployment>-<hash>`.
            let via_replicaset = o
                .strip_prefix("ReplicaSet/")
                .and_then(|rs| rs.rsplit_once('-'))
                .map(|(d, _)| format!("Deployment/{d}"));
            controllers.contains(o) || via_replicaset.is_some_and(|d| controllers.contains(&d))
        })
    };
    let mut old: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut versions = BTreeSet::new();
    for w in &mine {
        for x in w.containers.iter().filter(|x| x.component == component) {
            versions.insert(x.version.clone());
            if x.version != wanted && !owned(w) {
                let at = match &w.pod {
                    Some(p) => format!("{}{}", w.id(), p.node.as_ref().map(|n| format!(" on {n}")).unwrap_or_default()),
                    None => w.id(),
                };
                old.entry(x.version.clone()).or_default().push(at);
            }
        }
    }
    let mut reasons: Vec<String> = Vec::new();
    let mut old: Vec<(String, Vec<String>)> = old.into_iter().collect();
    old.sort_by(|a, b| compare_versions(&b.0, &a.0));
    for (version, mut places) in old {
        places.dedup();
        let total = places.len();
        let shown: Vec<String> = places.into_iter().take(3).collect();
        let more = if total > 3 { format!(" and {} more", total - 3) } else { String::new() };
        reasons.push(format!("old version {version} (wanted {wanted}) in {}{more}", shown.join(", ")));
    }
    for w in &mine {
        reasons.extend(w.rollout.iter().filter(|f| f.blocks()).map(|f| f.describe(&w.id())));
        if let Some(p) = w.pod.as_ref().filter(|p| !p.ready && p.owner.is_none()) {
            reasons.push(format!(
                "{} not ready{}",
                w.id(),
                p.waiting.as_ref().map(|x| format!(" ({x})")).unwrap_or_default()
            ));
        }
    }
    if reasons.is_empty() {
        Standing::Done
    } else {
        let mut versions: Vec<String> = versions.into_iter().collect();
        versions.sort_by(|a, b| compare_versions(b, a));
        Standing::Behind { versions, reasons }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::model::{Container, PodFacts, RolloutFact};

    fn workload(kind: Kind, name: &str, image: &str) -> Workload {
        Workload {
            kind,
            namespace: "mon".into(),
            name: name.into(),
            labels: [("app".to_string(), "agent".to_string())].into(),
            containers: vec![Container::new("c", image)],
            pod: None,
            rollout: vec![],
            meta: Default::default(),
        }
    }

    fn cluster(name: &str, workloads: Vec<Workload>, gitops: Vec<GitOpsObject>) -> ClusterInventory {
        ClusterInventory { name: name.into(), labels: BTreeMap::new(), presence: Presence::Present, workloads, gitops }
    }

    fn app(rev: &str) -> GitOpsObject {
        GitOpsObject {
            kind: "Application".into(),
            namespace: "argocd".into(),
            name: "agent".into(),
            revision: Some(rev.into()),
            target: None,
            sync: None,
            health: None,
            suspended: false,
        }
    }

    #[test]
    fn selectors_parse_and_match() {
        let labels: BTreeMap<String, String> = [("app".into(), "agent".into()), ("tier".into(), "edge".into())].into();
        for (sel, want) in [
            ("app=agent", true),
            ("app==agent,tier!=core", true),
            ("tier in (edge, core)", true),
            ("tier notin (edge)", false),
            ("app", true),
            ("!app", false),
            ("", true),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&labels), want, "{sel}");
        }
        assert!(Selector::parse("a in b").is_err());
    }

    #[test]
    fn stragglers_are_named_with_why() {
        let mut paused = workload(Kind::Deployment, "web", "reg/agent:2.0");
        paused.rollout.push(RolloutFact::Paused);
        let mut ds = workload(Kind::DaemonSet, "agent", "reg/agent:2.0");
        ds.rollout.push(RolloutFact::NodesNotUpdated {
            updated: 2,
            available: 2,
            desired: 3,
            nodes: vec!["node-3".into()],
            why: None,
        });
        let mut done_job = workload(Kind::Job, "old-job", "reg/agent:1.0");
        done_job.rollout.push(RolloutFact::Finished);
        let inv = Inventory {
            taken_at: OffsetDateTime::UNIX_EPOCH,
            clusters: vec![
                cluster("ok", vec![workload(Kind::Deployment, "agent", "reg/agent:2.0"), done_job], vec![app("new")]),
                cluster("old", vec![workload(Kind::CronJob, "nightly", "reg/agent:1.9")], vec![app("old")]),
                cluster("ds", vec![ds], vec![]),
                cluster("paused", vec![paused], vec![]),
                cluster("none", vec![workload(Kind::Deployment, "x", "other:1")], vec![]),
                ClusterInventory::absent("gone", "connection refused".into(), Some(OffsetDateTime::UNIX_EPOCH)),
            ],
        };
        let filter = Filter { selector: Selector::parse("app=agent").unwrap(), ..Filter::default() };
        assert_eq!(versions_of(&inv, "reg/agent", &filter), ["2.0", "1.9"], "a finished Job runs nothing");
        let s = judge(&inv, "reg/agent", "2.0", &filter);
        assert_eq!(s[0].standing, Standing::Done);
        let why: Vec<String> = s.iter().map(|c| c.why("reg/agent")).collect();
        assert!(why[1].contains("old version 1.9 (wanted 2.0) in CronJob mon/nightly"), "{}", why[1]);
        assert!(
            why[1].contains("Argo CD Application argocd/agent pinned to revision old; up-to-date clusters have new"),
            "{}",
            why[1]
        );
        assert!(why[2].contains("DaemonSet mon/agent halted on node node-3"), "{}", why[2]);
        assert!(why[3].contains("Deployment mon/web paused"), "{}", why[3]);
        assert_eq!(s[4].standing, Standing::Missing);
        assert!(why[5].starts_with("absent since 1970-01-01T00:00:00Z"), "{}", why[5]);
    }

    #[test]
    fn a_bare_pod_that_is_not_ready_is_behind() {
        let mut p = workload(Kind::Pod, "probe", "reg/agent:2.0");
        p.pod = Some(PodFacts {
            node: Some("node-1".into()),
            phase: "Pending".into(),
            ready: false,
            owner: None,
            waiting: Some("ImagePullBackOff".into()),
        });
        let inv = Inventory { taken_at: OffsetDateTime::UNIX_EPOCH, clusters: vec![cluster("a", vec![p], vec![])] };
        let s = judge(&inv, "reg/agent", "2.0", &Filter::default());
        assert_eq!(s[0].why("reg/agent"), "Pod mon/probe not ready (ImagePullBackOff)");
    }
}

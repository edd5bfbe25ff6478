//! Prometheus as an inventory source (`rdeploy inventory --source prometheus`), for fleets whose
//! clusters the deploy runner cannot reach but whose kube-state-metrics series a central
//! Prometheus holds. A few instant queries through the HTTP API (`/api/v1/query`, all at one
//! evaluation time) become the same source-neutral `Inventory` the Kubernetes API gives, so
//! the version matrix, the stragglers, the SLO and the renderers are shared.
//!
//! What a series can tell is less than the API: pods and their images and readiness, not
//! Deployments or DaemonSets. Each pod is a `Pod` workload, and a pod that is not ready counts
//! as an unfinished rollout, which is how a halted DaemonSet or a stuck canary shows here.
//!
//! A cluster is absent when Prometheus has no fresh series for it: no successful scrape
//! (`up == 1`) and no `kube_pod_container_info` sample newer than the staleness threshold.
//! Which clusters are expected comes from the kubeconfig or the fleet file, never from
//! Prometheus, since a cluster that stopped reporting is exactly the one it no longer lists.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use time::OffsetDateTime;

use super::model::{ClusterInventory, Container, Inventory, Kind, PodFacts, Presence, Workload};
use super::scope::Scope;
use super::state::LastSeen;

/// Where the series are and how they are labelled.
#[derive(Clone, Debug)]
pub struct PromSource {
    /// The Prometheus base URL (`http://prometheus:9090`, or a path prefix behind a proxy).
    pub url: String,
    /// The label naming the cluster on every series (`cluster` by convention).
    pub cluster_label: String,
    /// Series older than this mean the cluster stopped reporting.
    pub stale_after: Duration,
    /// Budget for the whole set of queries.
    pub timeout: Duration,
}

/// One instant-vector sample as the HTTP API returns it.
#[derive(Debug, Deserialize)]
struct Sample {
    metric: BTreeMap<String, String>,
    /// `[unix seconds, "value"]`.
    value: (f64, String),
}

impl Sample {
    fn number(&self) -> f64 {
        self.value.1.parse().unwrap_or(f64::NAN)
    }
}

#[derive(Debug, Deserialize)]
struct ApiResponse {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ApiData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

/// The answers the inventory is built from, by query.
#[derive(Debug, Default)]
pub(crate) struct Answers {
    /// One per (cluster, namespace, pod, container, image).
    containers: Vec<Sample>,
    /// `kube_pod_status_ready{condition="true"}` per pod: 1 ready, 0 not.
    ready: Vec<Sample>,
    /// Pods in a terminal phase (kube-state-metrics' `kube_pod_status_phase`, when exported).
    terminal: Vec<Sample>,
    /// Per cluster: the time of the newest successful scrape (`up == 1`).
    scraped: Vec<Sample>,
    /// Per cluster: the time of the newest `kube_pod_container_info` sample.
    reported: Vec<Sample>,
    /// Per cluster: `max(up)`, to tell a failing scrape from no scrape at all.
    up: Vec<Sample>,
}

/// The PromQL of each query, with the cluster label and the namespace matcher filled in.
pub(crate) fn queries(cluster: &str, namespace: Option<&str>) -> [String; 6] {
    let ns = namespace.map(|n| format!(",namespace=\"{}\"", promql_escape(n))).unwrap_or_default();
    [
        format!("max by ({cluster}, namespace, pod, container, image) (kube_pod_container_info{{{cluster}!=\"\"{ns}}})"),
        format!("max by ({cluster}, namespace, pod) (kube_pod_status_ready{{condition=\"true\",{cluster}!=\"\"{ns}}})"),
        format!("max by ({cluster}, namespace, pod) (kube_pod_status_phase{{phase=~\"Succeeded|Failed\",{cluster}!=\"\"{ns}}} == 1)"),
        // `timestamp()` of a bare selector is the sample's time; of `up == 1` it would be the
        // evaluation time, so the filter is applied with `and`.
        format!("max by ({cluster}) (timestamp(up{{{cluster}!=\"\"}}) and up{{{cluster}!=\"\"}} == 1)"),
        format!("max by ({cluster}) (timestamp(kube_pod_container_info{{{cluster}!=\"\"}}))"),
        format!("max by ({cluster}) (up{{{cluster}!=\"\"}})"),
    ]
}

/// A label value inside a double-quoted PromQL string.
pub fn promql_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Asks Prometheus about every cluster in scope. An error means Prometheus itself did not
/// answer: that says nothing about the clusters, so it is not turned into absences.
pub async fn collect(
    scope: &Scope,
    source: &PromSource,
    namespace: Option<&str>,
    last_seen: &LastSeen,
) -> Result<Inventory, String> {
    let taken_at = OffsetDateTime::now_utc();
    let client = client()?;
    let at = taken_at.unix_timestamp_nanos() as f64 / 1e9;
    let [q0, q1, q2, q3, q4, q5] = queries(&source.cluster_label, namespace);
    let ask = async {
        tokio::try_join!(
            query(&client, &source.url, &q0, at),
            query(&client, &source.url, &q1, at),
            query(&client, &source.url, &q2, at),
            query(&client, &source.url, &q3, at),
            query(&client, &source.url, &q4, at),
            query(&client, &source.url, &q5, at),
        )
    };
    let (containers, ready, terminal, scraped, reported, up) =
        tokio::time::timeout(source.timeout, ask).await.map_err(|_| {
            format!("Prometheus at {} did not answer within {}", source.url, humantime::format_duration(source.timeout))
        })??;
    let answers = Answers { containers, ready, terminal, scraped, reported, up };
    Ok(build(scope, &answers, source, taken_at, last_seen))
}

/// Turns the answers into the inventory; pure, so the staleness rules are unit-tested.
pub(crate) fn build(
    scope: &Scope,
    answers: &Answers,
    source: &PromSource,
    taken_at: OffsetDateTime,
    last_seen: &LastSeen,
) -> Inventory {
    let label = source.cluster_label.as_str();
    let cluster_of = |s: &Sample| s.metric.get(label).cloned().unwrap_or_default();
    let mut newest: HashMap<String, f64> = HashMap::new();
    for s in answers.scraped.iter().chain(&answers.reported) {
        let t = s.number();
        if t.is_finite() {
            let e = newest.entry(cluster_of(s)).or_insert(t);
            *e = e.max(t);
        }
    }
    let up: HashMap<String, f64> = answers.up.iter().map(|s| (cluster_of(s), s.number())).collect();
    let key = |s: &Sample| {
        (
            cluster_of(s),
            s.metric.get("namespace").cloned().unwrap_or_default(),
            s.metric.get("pod").cloned().unwrap_or_default(),
        )
    };
    let ready: HashMap<(String, String, String), bool> =
        answers.ready.iter().map(|s| (key(s), s.number() >= 1.0)).collect();
    let terminal: HashMap<(String, String, String), String> =
        answers.terminal.iter().map(|s| (key(s), s.metric.get("phase").cloned().unwrap_or_default())).collect();
    // cluster -> pod -> containers, in a stable order so two runs render alike.
    let mut pods: BTreeMap<String, BTreeMap<(String, String), Vec<Container>>> = BTreeMap::new();
    for s in &answers.containers {
        let (cluster, namespace, pod) = key(s);
        let image = s.metric.get("image").map(String::as_str).unwrap_or_default();
        if image.is_empty() {
            continue;
        }
        let name = s.metric.get("container").map(String::as_str).unwrap_or_default();
        pods.entry(cluster).or_default().entry((namespace, pod)).or_default().push(Container::new(name, image));
    }
    let now = taken_at.unix_timestamp_nanos() as f64 / 1e9;
    let stale = source.stale_after.as_secs_f64();
    let clusters = scope
        .clusters
        .iter()
        .map(|member| {
            let name = &member.name;
            let remembered = last_seen.get(name);
            let mut cluster = match newest.get(name) {
                None => {
                    let error = match up.get(name) {
                        Some(v) if *v < 1.0 => format!("Prometheus cannot scrape it (`up{{{label}=\"{name}\"}} == 0`) and holds no fresh series for it"),
                        _ => format!("Prometheus holds no series with {label}=\"{name}\""),
                    };
                    ClusterInventory::absent(name, error, remembered)
                }
                Some(t) if now - t > stale => {
                    let seen = OffsetDateTime::from_unix_timestamp_nanos((t * 1e9) as i128).ok();
                    let error = format!(
                        "its newest series in Prometheus is {} old (stale after {})",
                        humantime::format_duration(Duration::from_secs((now - t).max(0.0) as u64)),
                        humantime::format_duration(source.stale_after)
                    );
                    // Prometheus knows when it last reported, which may be newer than rdeploy's memory.
                    ClusterInventory::absent(name, error, remembered.max(seen))
                }
                Some(_) => {
                    let workloads = pods
                        .get(name)
                        .into_iter()
                        .flatten()
                        .map(|((namespace, pod), containers)| {
                            let id = (name.clone(), namespace.clone(), pod.clone());
                            let phase = terminal.get(&id).cloned().unwrap_or_else(|| "Running".into());
                            // No readiness series is not a reason to call the pod broken.
                            let is_ready = ready.get(&id).copied().unwrap_or(true);
                            Workload {
                                kind: Kind::Pod,
                                namespace: namespace.clone(),
                                name: pod.clone(),
                                labels: BTreeMap::new(),
                                containers: containers.clone(),
                                pod: Some(PodFacts { node: None, phase, ready: is_ready, owner: None, waiting: None }),
                                rollout: Vec::new(),
                                meta: Default::default(),
                            }
                        })
                        .collect();
                    ClusterInventory { name: name.clone(), labels: BTreeMap::new(), presence: Presence::Present, workloads, gitops: Vec::new() }
                }
            };
            cluster.labels = member.labels.clone();
            cluster
        })
        .collect();
    Inventory { taken_at, clusters }
}

type HttpClient = Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, Full<Bytes>>;

fn client() -> Result<HttpClient, String> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| format!("cannot load the system's CA certificates for https: {e}"))?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

/// One instant query by POST (a long selector does not hit URL limits), as a vector.
async fn query(client: &HttpClient, base: &str, promql: &str, at: f64) -> Result<Vec<Sample>, String> {
    let url = format!("{}/api/v1/query", base.trim_end_matches('/'));
    let body: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("query", promql)
        .append_pair("time", &format!("{at:.3}"))
        .finish();
    let request = hyper::Request::post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("bad Prometheus URL `{base}`: {e}"))?;
    let response = client.request(request).await.map_err(|e| {
        format!("cannot reach Prometheus at {base}: {}", rdeploy_adapters::helm::records::short_error(&e))
    })?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading Prometheus' answer from {base}: {e}"))?
        .to_bytes();
    let parsed: ApiResponse = serde_json::from_slice(&bytes).map_err(|_| {
        let text = String::from_utf8_lossy(&bytes);
        format!(
            "{url} answered {status} with something that is not the Prometheus API: {}",
            text.chars().take(200).collect::<String>().trim()
        )
    })?;
    if parsed.status != "success" {
        return Err(format!(
            "Prometheus refused `{promql}`: {} ({})",
            parsed.error.unwrap_or_default(),
            parsed.error_type.unwrap_or_else(|| status.to_string())
        ));
    }
    let data = parsed.data.ok_or_else(|| format!("Prometheus answered `{promql}` without data"))?;
    if data.result_type != "vector" {
        return Err(format!("Prometheus answered `{promql}` with a {}, not a vector", data.result_type));
    }
    serde_json::from_value(data.result).map_err(|e| format!("unexpected answer to `{promql}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::model::Presence;
    use crate::fleet::scope::Member;

    fn sample(labels: &[(&str, &str)], at: f64, value: &str) -> Sample {
        Sample {
            metric: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            value: (at, value.into()),
        }
    }

    fn scope(names: &[&str]) -> Scope {
        Scope {
            source: "test".into(),
            clusters: names
                .iter()
                .map(|n| Member { name: n.to_string(), labels: BTreeMap::new(), kubeconfig: None })
                .collect(),
        }
    }

    #[test]
    fn fresh_stale_down_and_unknown_clusters() {
        let now = time::macros::datetime!(2026-03-01 12:00 UTC);
        let t = now.unix_timestamp() as f64;
        let source = PromSource {
            url: "http://p".into(),
            cluster_label: "cluster".into(),
            stale_after: Duration::from_secs(300),
            timeout: Duration::from_secs(5),
        };
        let info = |c: &str, pod: &str, image: &str| {
            sample(
                &[("cluster", c), ("namespace", "mon"), ("pod", pod), ("container", "agent"), ("image", image)],
                t,
                "1",
            )
        };
        let answers = Answers {
            containers: vec![
                info("fresh", "agent-a", "reg/agent:2.0"),
                info("fresh", "agent-b", "reg/agent:1.9"),
                info("stale", "agent-a", "reg/agent:1.9"),
            ],
            ready: vec![sample(&[("cluster", "fresh"), ("namespace", "mon"), ("pod", "agent-b")], t, "0")],
            terminal: vec![],
            // `timestamp(..)` answers carry the sample time as the value.
            scraped: vec![
                sample(&[("cluster", "fresh")], t, &(t - 2.0).to_string()),
                sample(&[("cluster", "stale")], t, &(t - 600.0).to_string()),
            ],
            reported: vec![sample(&[("cluster", "stale")], t, &(t - 601.0).to_string())],
            up: vec![sample(&[("cluster", "down")], t, "0")],
        };
        let inv = build(&scope(&["fresh", "stale", "down", "unknown"]), &answers, &source, now, &LastSeen::default());
        let fresh = &inv.clusters[0];
        assert_eq!(fresh.presence, Presence::Present);
        assert_eq!(fresh.workloads.len(), 2);
        assert_eq!(fresh.workloads[1].containers[0].version, "1.9");
        assert!(!fresh.workloads[1].pod.as_ref().unwrap().ready);
        match &inv.clusters[1].presence {
            Presence::Absent { error, last_seen } => {
                assert_eq!(error, "its newest series in Prometheus is 10m old (stale after 5m)");
                assert_eq!(*last_seen, Some(now - time::Duration::seconds(600)));
            }
            p => panic!("stale is absent, not {p:?}"),
        }
        assert!(
            matches!(&inv.clusters[2].presence, Presence::Absent { error, .. } if error.contains("== 0")),
            "{:?}",
            inv.clusters[2]
        );
        assert!(
            matches!(&inv.clusters[3].presence, Presence::Absent { error, .. } if error.contains("no series with cluster=\"unknown\""))
        );
    }

    #[test]
    fn queries_carry_the_cluster_label_and_namespace() {
        let q = queries("site", Some("mon"));
        assert_eq!(
            q[0],
            "max by (site, namespace, pod, container, image) (kube_pod_container_info{site!=\"\",namespace=\"mon\"})"
        );
        assert_eq!(q[3], "max by (site) (timestamp(up{site!=\"\"}) and up{site!=\"\"} == 1)");
    }
}

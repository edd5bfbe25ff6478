//! Fleet observability against real parts: a real Prometheus (Debian's, started here on a free
//! loopback port, one scrape job per kubesim cluster with a `cluster` label, 1 s scrapes)
//! gives `rdeploy inventory --source prometheus` the same version matrix as the Kubernetes API,
//! and an offline cluster is absent in both; the rules `rdeploy alerts` writes pass
//! `promtool check rules` and the committed `promtool test rules` unit tests, and load in the
//! running Prometheus without evaluation errors; headless Chromium renders the dashboard page
//! to a PNG and its DOM names the stragglers. A missing tool fails loudly
//! (`scripts/setup-observability.sh` installs them).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{require_tool, Project};
use kubesim::testing::Kubesim;
use serde_json::{json, Value};

const SETUP: &str = "run scripts/setup-observability.sh (Debian: apt-get install prometheus chromium)";
const AGENT: &str = "registry.example/node-agent";

/// A kubesim fleet (pods start fast), with extra flags such as `--taint-node`.
struct Fleet {
    sim: Kubesim,
    clusters: Vec<String>,
}

impl Fleet {
    fn start(clusters: &[&str], extra: &[&str]) -> Fleet {
        let mut flags = vec!["--pod-startup-ms", "20"];
        flags.extend_from_slice(extra);
        Fleet {
            sim: Kubesim::start_with(&clusters.join(","), &flags),
            clusters: clusters.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn apply(&self, ctx: &str, yaml: &str) {
        self.sim.apply(ctx, yaml);
    }

    fn control(&self, path: &str) {
        self.sim.post(path);
    }

    fn project(&self) -> Project {
        let mut p = Project::new();
        let home = p.path("home");
        std::fs::create_dir_all(&home).unwrap();
        p.env("HOME", &home.to_string_lossy()).env("KUBECONFIG", &self.sim.kubeconfig.to_string_lossy());
        p
    }
}

/// A real Prometheus scraping every cluster of a fleet, in its own temp dir.
struct Prometheus {
    child: Child,
    url: String,
    addr: String,
    /// Config, data and log; removed on drop.
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(fleet: &Fleet, rules: Option<&Path>) -> Prometheus {
        let bin = require_tool("prometheus", SETUP);
        let dir = tempfile::Builder::new().prefix("obs-prometheus").tempdir().unwrap();
        let mut config = String::from("global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n");
        if let Some(rules) = rules {
            config += &format!("rule_files: ['{}']\n", rules.display());
        }
        config += "scrape_configs:\n";
        for c in &fleet.clusters {
            config += &format!(
                "  - job_name: kubesim-{c}\n    metrics_path: /clusters/{c}/metrics\n    static_configs: [{{targets: ['{}'], labels: {{cluster: {c}}}}}]\n",
                fleet.sim.addr
            );
        }
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        // A free port can be taken between the probe and the bind: try a few.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let addr = format!("127.0.0.1:{port}");
            let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
            let mut child = Command::new(&bin)
                .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn prometheus");
            let end = Instant::now() + Duration::from_secs(20);
            while Instant::now() < end {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if TcpStream::connect(&addr).is_ok() && http(&addr, "GET", "/-/ready").0 == 200 {
                    return Prometheus { child, url: format!("http://{addr}"), addr, _dir: dir };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "prometheus did not become ready: {}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
    }

    fn api(&self, path: &str) -> Value {
        let (status, body) = http(&self.addr, "GET", path);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }
}

/// A minimal HTTP/1.1 exchange (no client crate in the tests): status and body.
fn http(addr: &str, method: &str, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else { return (0, String::new()) };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out += &rest[..n];
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn agent_ds(version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: mon}}\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: node-agent, namespace: mon, labels: {{app: node-agent}}}}\nspec:\n  selector: {{matchLabels: {{app: node-agent}}}}\n  template:\n    metadata: {{labels: {{app: node-agent}}}}\n    spec: {{containers: [{{name: agent, image: \"{AGENT}:{version}\"}}]}}\n"
    )
}

fn shop_api(version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: api, namespace: shop, labels: {{app: api}}}}\nspec:\n  replicas: 2\n  selector: {{matchLabels: {{app: api}}}}\n  template:\n    metadata: {{labels: {{app: api}}}}\n    spec: {{containers: [{{name: api, image: \"registry.example/shop-api:{version}\"}}]}}\n"
    )
}

/// edge-1 and edge-2 on node-agent 2.0 (edge-2's node-3 tainted, so its DaemonSet halts
/// there), edge-3 still on 1.9; shop-api 1.4 everywhere, 1.3 on edge-3.
fn seeded_fleet() -> Fleet {
    let fleet = Fleet::start(&["edge-1", "edge-2", "edge-3"], &["--taint-node", "edge-2/node-3"]);
    fleet.apply("edge-1", &(agent_ds("2.0") + "---\n" + &shop_api("1.4")));
    fleet.apply("edge-2", &(agent_ds("2.0") + "---\n" + &shop_api("1.4")));
    fleet.apply("edge-3", &(agent_ds("1.9") + "---\n" + &shop_api("1.3")));
    fleet
}

/// The part of `inventory --json` both sources must agree on: per component the wanted
/// version, done/in-scope, each version with its clusters, the stragglers; the absent clusters.
fn matrix(report: &Value) -> Value {
    let names = |v: &Value, key: &str| -> Vec<String> {
        let mut n: Vec<String> =
            v.as_array().into_iter().flatten().map(|x| x[key].as_str().unwrap_or_default().to_string()).collect();
        n.sort();
        n
    };
    let components: Vec<Value> = report["components"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let versions: Vec<Value> = c["versions"].as_array().unwrap().iter().map(|v| json!([v["version"], v["clusters"]])).collect();
            json!({"component": c["component"], "wanted": c["wanted"], "done": c["done"], "in_scope": c["in_scope"], "versions": versions, "stragglers": names(&c["stragglers"], "cluster")})
        })
        .collect();
    json!({"clusters": report["clusters"], "answered": report["answered"], "absent": names(&report["absent"], "cluster"), "components": components})
}

fn inventory(p: &Project, args: &[&str]) -> (Value, Duration) {
    let mut full = vec!["inventory", "--json"];
    full.extend_from_slice(args);
    let started = Instant::now();
    let run = p.rdeploy(&full);
    let took = started.elapsed();
    assert!(run.status == 0, "rdeploy {full:?} exited {}: {}", run.status, run.stderr);
    (serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", run.stdout)), took)
}

/// Polls both sources until their matrices agree and `ready` holds (pods start, Prometheus
/// scrapes every second); returns both reports.
fn converge(p: &Project, prom: &Prometheus, ready: impl Fn(&Value) -> bool) -> (Value, Value) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (api, api_took) = inventory(p, &[]);
        let (from_prom, prom_took) = inventory(p, &["--source", "prometheus", "--prometheus-url", &prom.url]);
        if (matrix(&api) == matrix(&from_prom) && ready(&api)) || Instant::now() > end {
            eprintln!("inventory took {api_took:?} through the API, {prom_took:?} through Prometheus");
            return (api, from_prom);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Every pod that can start has started: two node-agent stragglers (edge-2 halted on its
/// tainted node, edge-3 old), and no container still being created.
fn settled(report: &Value) -> bool {
    report["components"].as_array().is_some_and(|c| c.len() == 2)
        && component(report, AGENT)["stragglers"].as_array().is_some_and(|s| s.len() == 2)
        && !report.to_string().contains("ContainerCreating")
}

fn component<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["component"] == name)
        .unwrap_or_else(|| panic!("no {name} in {report:#}"))
}

fn straggler_why(report: &Value, comp: &str, cluster: &str) -> String {
    let c = component(report, comp);
    let s = c["stragglers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["cluster"] == cluster)
        .unwrap_or_else(|| panic!("{cluster} is no straggler of {comp}: {c:#}"));
    s["reasons"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect::<Vec<_>>().join("; ")
}

#[test]
fn prometheus_source_gives_the_api_matrix_and_offline_is_absent_in_both() {
    let fleet = seeded_fleet();
    let p = fleet.project();
    // The rules for this fleet, loaded by the same Prometheus: they must evaluate cleanly.
    p.rdeploy(&[
        "alerts",
        "--slo",
        "95%@48h",
        "--supported",
        "1",
        "--component",
        &format!("{AGENT}:2.0"),
        "--since",
        "1h",
        "-o",
        "rules.yml",
    ])
    .code(0);
    let prom = Prometheus::start(&fleet, Some(&p.path("rules.yml")));

    let (api, from_prom) = converge(&p, &prom, settled);
    assert_eq!(
        matrix(&from_prom),
        matrix(&api),
        "the Prometheus source disagrees with the API:\nprometheus: {from_prom:#}\napi: {api:#}"
    );
    let agent =
        matrix(&api)["components"].as_array().unwrap().iter().find(|c| c["component"] == AGENT).unwrap().clone();
    assert_eq!(agent["versions"], json!([["2.0", ["edge-1", "edge-2"]], ["1.9", ["edge-3"]]]), "{agent:#}");
    assert_eq!((agent["done"].as_u64(), agent["in_scope"].as_u64()), (Some(1), Some(3)));
    // Both name why; each in its own terms (the API sees the DaemonSet, Prometheus the pod).
    assert!(straggler_why(&api, AGENT, "edge-3").contains("old version 1.9 (wanted 2.0) in DaemonSet mon/node-agent"));
    assert!(straggler_why(&from_prom, AGENT, "edge-3").contains("old version 1.9 (wanted 2.0) in Pod mon/node-agent-"));
    assert!(straggler_why(&api, AGENT, "edge-2").contains("halted on node node-3"));
    assert!(
        straggler_why(&from_prom, AGENT, "edge-2").contains("not ready"),
        "{}",
        straggler_why(&from_prom, AGENT, "edge-2")
    );

    // Without any kubeconfig, the fleet file says which clusters are expected.
    p.file(
        "fleet.yaml",
        "clusters:\n  edge-1: {site: lyon}\n  edge-2: {site: oslo}\n  edge-3: {site: austin}\n  edge-4: {site: lima}\n",
    );
    let run = p
        .command(&[
            "inventory",
            "--json",
            "--source",
            "prometheus",
            "--prometheus-url",
            &prom.url,
            "--fleet",
            "fleet.yaml",
        ])
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let by_file: Value = serde_json::from_slice(&run.stdout).unwrap();
    let absent = &by_file["absent"];
    assert_eq!(absent.as_array().unwrap().len(), 1, "{by_file:#}");
    assert_eq!((absent[0]["cluster"].as_str(), absent[0]["labels"]["site"].as_str()), (Some("edge-4"), Some("lima")));
    assert_eq!(absent[0]["error"], "Prometheus holds no series with cluster=\"edge-4\"");

    // edge-1 goes offline: its scrape fails, its series go stale, and both sources say absent.
    fleet.control("/_sim/clusters/edge-1/offline");
    let (api, from_prom) = converge(&p, &prom, |r| r["absent"].as_array().is_some_and(|a| a.len() == 1));
    assert_eq!(matrix(&from_prom), matrix(&api), "after edge-1 went offline:\nprometheus: {from_prom:#}\napi: {api:#}");
    assert_eq!(matrix(&api)["absent"], json!(["edge-1"]));
    let why = from_prom["absent"][0]["error"].as_str().unwrap();
    assert!(why.contains("up{cluster=\"edge-1\"} == 0"), "{why}");
    // It was seen before, so it is absent since then, like the API source says.
    assert!(from_prom["absent"][0]["last_seen"].is_string(), "{from_prom:#}");
    assert_eq!(component(&from_prom, AGENT)["in_scope"], 3, "an absent cluster still counts against completion");

    // A staleness threshold shorter than the scrape interval makes every cluster stale.
    let (stale, _) = inventory(&p, &["--source", "prometheus", "--prometheus-url", &prom.url, "--stale-after", "1ms"]);
    assert_eq!(stale["answered"], 0, "{stale:#}");
    assert!(stale["absent"][1]["error"].as_str().unwrap().contains("stale after 1ms"), "{stale:#}");

    // The generated rules evaluate in the real Prometheus without errors.
    let end = Instant::now() + Duration::from_secs(10);
    let rules = loop {
        let r = prom.api("/api/v1/rules");
        let all: Vec<Value> = r["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        if (!all.is_empty() && all.iter().all(|x| x["lastEvaluation"].as_str().is_some_and(|t| !t.starts_with("0001"))))
            || Instant::now() > end
        {
            break all;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(rules.len() >= 5, "{rules:#?}");
    for r in &rules {
        assert_eq!(r["health"], "ok", "rule {} failed: {}", r["name"], r["lastError"]);
    }
    // Only edge-2 runs nothing but 2.0 (its halted pod too); edge-3 is old, edge-1 absent.
    let end = Instant::now() + Duration::from_secs(10);
    let value = |q: &str| prom.api(&format!("/api/v1/query?query={q}"))["data"]["result"].clone();
    while value("rdeploy:rollout_clusters:done")[0]["value"][1] != "1" && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        value("rdeploy:rollout_clusters:done")[0]["value"][1],
        "1",
        "{:#}",
        value("count%20by%20(cluster)%20(kube_pod_container_info)")
    );
    assert_eq!(value("rdeploy:rollout_clusters:in_scope")[0]["value"][1], "3");

    // Prometheus itself down is an error, not a fleet of absent clusters.
    let dead = p.rdeploy(&["inventory", "--source", "prometheus", "--prometheus-url", "http://127.0.0.1:9"]);
    assert_eq!(dead.status, 1, "{}", dead.stderr);
    assert!(dead.stderr.contains("cannot reach Prometheus at http://127.0.0.1:9"), "{}", dead.stderr);
    let missing = p.rdeploy(&["inventory", "--source", "prometheus"]);
    assert_eq!(missing.status, 2);
    assert!(missing.stderr.contains("`--source prometheus` needs the Prometheus URL"), "{}", missing.stderr);
}

#[test]
fn generated_rules_pass_promtool_check_and_unit_tests() {
    let promtool = require_tool("promtool", SETUP);
    let p = Project::new();
    p.copy_fixture("prometheus", "obs");
    std::fs::remove_file(p.path("obs/fleet.rules.yml")).unwrap();
    p.rdeploy(&[
        "--state-dir",
        "obs/state",
        "alerts",
        "--fleet",
        "obs/fleet.yaml",
        "--slo",
        "95%@1h,100%@2h",
        "--supported",
        "2",
        "-o",
        "obs/fleet.rules.yml",
    ])
    .code(0);
    let generated = p.read("obs/fleet.rules.yml");
    let committed_path = common::repo_root().join("fixtures/prometheus/fleet.rules.yml");
    if std::env::var_os("RDEPLOY_BLESS").is_some() {
        std::fs::write(&committed_path, &generated).unwrap();
    }
    assert_eq!(
        generated,
        std::fs::read_to_string(&committed_path).unwrap(),
        "fixtures/prometheus/fleet.rules.yml is out of date: rerun with RDEPLOY_BLESS=1"
    );
    let check = Command::new(&promtool).args(["check", "rules"]).arg(p.path("obs/fleet.rules.yml")).output().unwrap();
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        String::from_utf8_lossy(&check.stdout).contains("SUCCESS: 9 rules found"),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let test =
        Command::new(&promtool).args(["test", "rules", "fleet.test.yml"]).current_dir(p.path("obs")).output().unwrap();
    assert!(
        test.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );

    // Without a recorded rollout only the absence alert is written, and it still checks.
    p.rdeploy(&["--state-dir", "empty-state", "alerts", "--contexts", "a,b", "--slo", "95%@1h", "-o", "absence.yml"])
        .code(0)
        .stderr_has("only the absence alert is written");
    assert!(
        p.read("absence.yml").contains("RdeployClusterAbsent")
            && !p.read("absence.yml").contains("RdeployRolloutSLOMissed")
    );
    let check = Command::new(&promtool).args(["check", "rules"]).arg(p.path("absence.yml")).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
}

#[test]
fn dashboard_renders_in_headless_chromium_and_names_the_stragglers() {
    let chromium = require_tool("chromium", SETUP);
    let fleet = seeded_fleet();
    fleet.control("/_sim/clusters/edge-1/offline");
    let p = fleet.project();
    // Wait for pods to start so the page shows the settled fleet.
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let (r, _) = inventory(&p, &[]);
        if settled(&r) || Instant::now() > end {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let run = p.rdeploy(&[
        "inventory",
        "--supported",
        "1",
        "--slo",
        "50%@1h,100%@2d",
        "--since",
        "3h",
        "--html",
        "fleet.html",
    ]);
    assert_eq!(run.status, 1, "the 50%@1h objective is breached: {}", run.stderr);
    run.stderr_has("wrote the fleet dashboard to fleet.html");
    let page = p.read("fleet.html");
    for external in ["<script", "<link", "src=\"http", "url("] {
        assert!(!page.contains(external), "the page must need nothing at view time: found {external}");
    }

    let profile = p.path("chromium-profile");
    let url = format!("file://{}", p.path("fleet.html").display());
    let headless = |extra: &[&str]| {
        let out = Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg(&url)
            .env("HOME", p.path("home"))
            .stdin(Stdio::null())
            .output()
            .expect("run chromium");
        assert!(out.status.success(), "chromium {extra:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        out
    };
    let started = Instant::now();
    let png = p.path("fleet.png");
    headless(&[&format!("--screenshot={}", png.display()), "--window-size=1280,900"]);
    eprintln!("chromium screenshot took {:?}", started.elapsed());
    let bytes = std::fs::read(&png).expect("chromium wrote no screenshot");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) =
        (u32::from_be_bytes(bytes[16..20].try_into().unwrap()), u32::from_be_bytes(bytes[20..24].try_into().unwrap()));
    assert_eq!((w, h), (1280, 900));
    assert!(bytes.len() > 30_000, "a {}-byte screenshot is too plain to be the dashboard", bytes.len());
    if let Some(keep) = std::env::var_os("RDEPLOY_KEEP_DASHBOARD") {
        std::fs::copy(&png, Path::new(&keep).join("fleet.png")).unwrap();
        std::fs::copy(p.path("fleet.html"), Path::new(&keep).join("fleet.html")).unwrap();
    }

    // What a reader sees: the rendered DOM's text names every straggler and the absent cluster.
    let dom = String::from_utf8_lossy(&headless(&["--dump-dom"]).stdout).into_owned();
    let text = strip_tags(&dom);
    for needle in [
        "straggler edge-3: old version 1.9 (wanted 2.0) in DaemonSet mon/node-agent",
        "straggler edge-2: DaemonSet mon/node-agent halted on node node-3",
        "straggler edge-3: old version 1.3 (wanted 1.4) in Deployment shop/api",
        "edge-1: absent, never seen by rdeploy",
        "registry.example/node-agent 1.9 is older than the supported versions (2.0) on edge-3",
        "SLO breached (50%@1h)",
        "snapshot taken",
    ] {
        assert!(text.contains(needle), "the page does not say {needle:?}:\n{text}");
    }
}

fn strip_tags(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for ch in html.chars() {
        match ch {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'")
}

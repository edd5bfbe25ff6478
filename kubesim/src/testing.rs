//! The test harness every suite of the workspace shares (feature `testing`): a kubesim per
//! test, started in-process on port 0 with its own kubeconfig and `HOME` (kubectl caches
//! discovery there) and stopped on drop; the real kubectl, helm 3 and helm 4 talk to it over
//! HTTP. A missing tool fails the test loudly, never skips it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The workspace root (the directory above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("kubesim sits inside the workspace").to_path_buf()
}

/// A file or directory of kubesim's test data (`testdata/webapp` is the test chart).
pub fn testdata(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(p)
}

/// The corpus of real public charts and manifest bundles (`charts/NAME`, `bundles/NAME`, each
/// with its LICENSE and a SOURCE file naming repository, path and commit): `$KUBESIM_CORPUS`
/// (or `$RDEPLOY_CORPUS`), else `shared/corpus` beside the workspace. Fetched third-party
/// material is never committed to this repository, so it lives there; every corpus test runs in
/// the plain `cargo test`, and a missing corpus is a loud failure, never a skip.
pub fn corpus() -> PathBuf {
    let root = workspace_root();
    let candidates: Vec<PathBuf> = ["KUBESIM_CORPUS", "RDEPLOY_CORPUS"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .chain([root.join("../shared/corpus")])
        .collect();
    candidates.iter().find(|p| p.join("charts").is_dir()).cloned().unwrap_or_else(|| {
        panic!(
            "the corpus of real charts and bundles is missing: looked in {candidates:?}\nhint: set KUBESIM_CORPUS to a directory holding charts/ and bundles/"
        )
    })
}

/// The real kubectl (1.32): `$KUBECTL` or `/usr/bin/kubectl`.
pub fn kubectl_bin() -> PathBuf {
    let p = std::env::var_os("KUBECTL").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/kubectl"));
    assert!(p.is_file(), "kubectl not found at {} (set KUBECTL): these tests need the real kubectl 1.32", p.display());
    p
}

/// The real helm `major` from `tools/helm<major>/helm`, fetched by `scripts/fetch-helm.sh` when
/// missing; still missing is a loud failure.
pub fn helm_bin(major: u32) -> PathBuf {
    static FETCH: Mutex<()> = Mutex::new(());
    let p = workspace_root().join(format!("tools/helm{major}/helm"));
    if !p.is_file() {
        let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
        if !p.is_file() {
            let status = Command::new("bash").arg(workspace_root().join("scripts/fetch-helm.sh")).status();
            eprintln!("ran scripts/fetch-helm.sh: {status:?}");
        }
    }
    assert!(p.is_file(), "helm {major} not found at {}: run scripts/fetch-helm.sh", p.display());
    p
}

/// A kubesim for one test, with a temporary directory holding its kubeconfig and the `HOME`
/// every kubectl and helm run gets.
pub struct Kubesim {
    sim: crate::Kubesim,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Kubesim {
    /// Starts kubesim serving `clusters` (comma-separated, or a count; contexts are named
    /// after them).
    pub fn start(clusters: &str) -> Kubesim {
        Kubesim::start_with(clusters, &[])
    }

    /// Like [`Kubesim::start`], with extra flags of the binary (`--taint-node`,
    /// `--pod-startup-ms`, `--offline`, `--fail-image`...).
    pub fn start_with(clusters: &str, extra: &[&str]) -> Kubesim {
        use clap::Parser;
        let dir = tempfile::Builder::new().prefix("kubesim").tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::create_dir_all(dir.path().join("home")).expect("create HOME");
        let mut args = vec!["kubesim", "--listen", "127.0.0.1:0", "--clusters", clusters, "--kubeconfig"];
        let path = kubeconfig.to_string_lossy().into_owned();
        args.push(&path);
        args.extend_from_slice(extra);
        let opts = crate::Options::try_parse_from(&args).unwrap_or_else(|e| panic!("kubesim flags {extra:?}: {e}"));
        let sim = crate::Kubesim::start(opts).unwrap_or_else(|e| panic!("starting kubesim: {e:#}"));
        Kubesim { addr: sim.addr().to_string(), sim, dir, kubeconfig }
    }

    /// The cluster names served.
    pub fn clusters(&self) -> &[String] {
        self.sim.clusters()
    }

    /// The environment every kubectl and helm run of a test gets.
    pub fn env(&self) -> Vec<(String, String)> {
        let home = self.dir.path().join("home");
        let h = |sub: &str| home.join(sub).to_string_lossy().into_owned();
        vec![
            ("HOME".into(), h("")),
            ("KUBECONFIG".into(), self.kubeconfig.to_string_lossy().into_owned()),
            ("HELM_CACHE_HOME".into(), h(".cache/helm")),
            ("HELM_CONFIG_HOME".into(), h(".config/helm")),
            ("HELM_DATA_HOME".into(), h(".local/share/helm")),
        ]
    }

    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(kubectl_bin());
        c.args(args).envs(self.env()).env_remove("HELM_NAMESPACE");
        c
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("run kubectl")
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let o = self.kubectl(args);
        assert!(
            o.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            String::from_utf8_lossy(&o.stdout)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// kubectl with `input` on stdin.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Output {
        let mut child = self
            .kubectl_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        let mut stdin = child.stdin.take().expect("kubectl stdin");
        // kubectl may fail before reading everything (a bad flag): a broken pipe is its answer.
        let _ = stdin.write_all(input.as_bytes());
        drop(stdin);
        child.wait_with_output().expect("wait for kubectl")
    }

    /// `kubectl --context CTX apply -f -` with the manifests on stdin; must succeed.
    pub fn apply(&self, ctx: &str, yaml: &str) {
        let out = self.kubectl_stdin(&["--context", ctx, "apply", "-f", "-"], yaml);
        assert!(out.status.success(), "kubectl apply on {ctx} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn helm_cmd(&self, major: u32, args: &[&str]) -> Command {
        let mut c = Command::new(helm_bin(major));
        c.args(args).envs(self.env()).env_remove("HELM_NAMESPACE");
        c
    }

    pub fn helm(&self, major: u32, args: &[&str]) -> Output {
        self.helm_cmd(major, args).output().expect("run helm")
    }

    /// helm that must succeed; returns stdout.
    pub fn helm_ok(&self, major: u32, args: &[&str]) -> String {
        let o = self.helm(major, args);
        assert!(
            o.status.success(),
            "helm{major} {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            String::from_utf8_lossy(&o.stdout)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `helm history -o json` statuses, oldest first.
    pub fn helm_statuses(&self, major: u32, release: &str, ns: &str) -> Vec<String> {
        let out = self.helm_ok(major, &["history", release, "-n", ns, "-o", "json"]);
        let revs: serde_json::Value = serde_json::from_str(&out).expect("history json");
        revs.as_array().expect("history is a list").iter().map(|r| r["status"].as_str().unwrap().to_string()).collect()
    }

    /// A raw HTTP/1.1 request (the control API or the Kubernetes API); the whole reply, head
    /// and body, as text.
    pub fn control(&self, method: &str, path: &str) -> String {
        let mut s = TcpStream::connect(&self.addr).expect("connect kubesim");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", self.addr)
            .unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// POSTs to the control API; must answer 200.
    pub fn post(&self, path: &str) {
        let reply = self.control("POST", path);
        assert!(reply.starts_with("HTTP/1.1 200"), "control {path}: {reply}");
    }

    /// A raw HTTP/1.1 request; returns (status, body with chunking undone).
    pub fn http(&self, method: &str, path: &str) -> (u16, String) {
        let text = self.control(method, path);
        let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, dechunk(&body))
    }

    /// A control API call that must answer 200 with JSON.
    pub fn control_json(&self, method: &str, path: &str) -> serde_json::Value {
        let (code, body) = self.http(method, path);
        assert_eq!(code, 200, "control {method} {path}: {body}");
        serde_json::from_str(&body).expect("control API answers JSON")
    }

    /// Polls `f` every 50 ms until it is true or `timeout` passes; whether it became true.
    pub fn eventually(&self, timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Leaves `release` in pending-upgrade the way a killed helm does: slows the cluster,
    /// starts an upgrade, SIGKILLs helm once the pending revision exists.
    pub fn strand_pending_upgrade(&self, major: u32, release: &str, ns: &str, chart: &Path, cluster: &str) {
        self.control("POST", &format!("/_sim/clusters/{cluster}/slow?ms=300"));
        let chart = chart.to_string_lossy().into_owned();
        let mut child = self
            .helm_cmd(major, &["upgrade", release, &chart, "-n", ns, "--set", "color=stuck"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn helm");
        let path = format!(
            "/clusters/{cluster}/api/v1/namespaces/{ns}/secrets?labelSelector=name%3D{release}%2Cowner%3Dhelm%2Cstatus%3Dpending-upgrade"
        );
        let seen =
            self.eventually(Duration::from_secs(30), || self.control("GET", &path).contains("sh.helm.release.v1."));
        child.kill().unwrap();
        let _ = child.wait();
        self.control("POST", &format!("/_sim/clusters/{cluster}/slow?ms=0"));
        assert!(seen, "helm{major} never wrote a pending-upgrade revision");
    }
}

/// Undoes chunked transfer encoding when present (watch responses).
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else { return body.to_string() };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { return body.to_string() };
        if n == 0 || after.len() < n {
            return out;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

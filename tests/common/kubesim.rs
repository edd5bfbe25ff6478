//! A kubesim per test, shared by the kubectl and helm tests of the adapters crate and of the
//! rdeploy binary: started on port 0 with its own kubeconfig and `HOME` (kubectl caches
//! discovery there), stopped on drop. kubectl, helm 3 and helm 4 are the real ones; a missing
//! tool fails the test loudly, never skips it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The workspace root: the nearest ancestor of the calling crate that holds `fixtures/kubesim`.
pub fn workspace_root() -> PathBuf {
    let start = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    start
        .ancestors()
        .find(|d| d.join("fixtures/kubesim").is_dir())
        .expect("workspace root above CARGO_MANIFEST_DIR")
        .to_path_buf()
}

/// The kubesim binary beside the running test's own target dir; built once when missing
/// (`cargo test -p rdeploy-adapters` does not build other packages' binaries).
pub fn kubesim_bin() -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let exe = std::env::current_exe().expect("test exe");
    // target/<profile>/deps/<test> -> target/<profile>/kubesim
    let profile_dir = exe.parent().and_then(Path::parent).expect("target profile dir").to_path_buf();
    let bin = profile_dir.join("kubesim");
    if !bin.is_file() {
        let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
        if !bin.is_file() {
            let target_dir = profile_dir.parent().expect("target dir");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "-p", "kubesim"])
                .env("CARGO_TARGET_DIR", target_dir)
                .current_dir(workspace_root())
                .status();
            eprintln!("built kubesim: {status:?}");
        }
    }
    assert!(bin.is_file(), "kubesim is missing at {}: run `cargo build -p kubesim`", bin.display());
    bin
}

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

pub struct Kubesim {
    child: Child,
    pub addr: String,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Drop for Kubesim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Kubesim {
    /// Starts kubesim serving `clusters` (comma-separated; contexts are named after them).
    pub fn start(clusters: &str) -> Kubesim {
        Kubesim::start_with(clusters, &[])
    }

    /// Like [`Kubesim::start`], with extra flags (`--taint-node`, `--pod-startup-ms`).
    pub fn start_with(clusters: &str, extra: &[&str]) -> Kubesim {
        let dir = tempfile::Builder::new().prefix("kubesim").tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        let mut child = Command::new(kubesim_bin())
            .args(["--listen", "127.0.0.1:0", "--clusters", clusters, "--kubeconfig"])
            .arg(&kubeconfig)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kubesim");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("ready line");
        let parts: Vec<&str> = line.split_whitespace().collect();
        assert!(parts.len() == 5 && parts[1] == "ready", "bad ready line {line:?}");
        Kubesim { child, addr: parts[2].to_string(), dir, kubeconfig }
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

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(kubectl_bin())
            .args(args)
            .envs(self.env())
            .env_remove("HELM_NAMESPACE")
            .output()
            .expect("run kubectl")
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let o = self.kubectl(args);
        assert!(o.status.success(), "kubectl {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn helm_cmd(&self, major: u32, args: &[&str]) -> Command {
        let mut c = Command::new(helm_bin(major));
        c.args(args).envs(self.env()).env_remove("HELM_NAMESPACE");
        c
    }

    pub fn helm_ok(&self, major: u32, args: &[&str]) -> String {
        let o = self.helm_cmd(major, args).output().expect("run helm");
        assert!(o.status.success(), "helm{major} {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `helm history -o json` statuses, oldest first.
    pub fn helm_statuses(&self, major: u32, release: &str, ns: &str) -> Vec<String> {
        let out = self.helm_ok(major, &["history", release, "-n", ns, "-o", "json"]);
        let revs: serde_json::Value = serde_json::from_str(&out).expect("history json");
        revs.as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap().to_string()).collect()
    }

    /// A raw HTTP call: the control API (`POST /_sim/clusters/c1/slow?ms=300`) or the API.
    /// `kubectl --context CTX apply -f -` with the manifests on stdin; must succeed.
    pub fn apply(&self, ctx: &str, yaml: &str) {
        let mut child = Command::new(kubectl_bin())
            .args(["--context", ctx, "apply", "-f", "-"])
            .envs(self.env())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "kubectl apply on {ctx} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// POSTs to the control API; must answer 200.
    pub fn post(&self, path: &str) {
        let reply = self.control("POST", path);
        assert!(reply.starts_with("HTTP/1.1 200"), "control {path}: {reply}");
    }

    pub fn control(&self, method: &str, path: &str) -> String {
        let mut s = TcpStream::connect(&self.addr).expect("connect kubesim");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", self.addr)
            .unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
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
        let end = Instant::now() + Duration::from_secs(30);
        let mut seen = false;
        while Instant::now() < end && !seen {
            let path = format!(
                "/clusters/{cluster}/api/v1/namespaces/{ns}/secrets?labelSelector=name%3D{release}%2Cowner%3Dhelm%2Cstatus%3Dpending-upgrade"
            );
            seen = self.control("GET", &path).contains("sh.helm.release.v1.");
            if !seen {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        child.kill().unwrap();
        let _ = child.wait();
        self.control("POST", &format!("/_sim/clusters/{cluster}/slow?ms=0"));
        assert!(seen, "helm{major} never wrote a pending-upgrade revision");
    }
}

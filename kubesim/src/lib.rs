//! kubesim: an in-memory Kubernetes API stand-in that real kubectl and helm accept, for one
//! cluster or a fleet of hundreds, all served by one listener under `/clusters/<name>`.
//! See README.md for the interface and where it differs from a real API server.
//!
//! The library starts a kubesim inside the calling process ([`Kubesim::start`]); the `kubesim`
//! binary (for scripts and benchmarks) is a thin wrapper around the same [`Options`]. With the
//! `testing` feature, [`testing`] is the harness every test suite of the workspace shares: a
//! kubesim per test, and the real kubectl and helm pointed at it with their own `HOME`.

mod api;
mod controller;
mod discovery;
mod managed;
mod metrics;
mod openapi;
mod patch;
mod protobuf;
mod selector;
mod server;
mod sim;
mod status;
mod store;
mod table;
mod util;
mod validate;
mod watch;

#[cfg(feature = "testing")]
pub mod testing;

use anyhow::{bail, Context, Result};
use clap::Parser;
use sim::{Sim, SimConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a kubesim serves: the binary's command line, also built by tests
/// (`Options::try_parse_from(["kubesim", "--clusters", "a,b"])`).
#[derive(Parser, Debug, Clone)]
#[command(name = "kubesim", version, about = "In-memory Kubernetes API stand-in for kubectl and helm tests")]
pub struct Options {
    /// Address to listen on; port 0 picks a free one (printed on the ready line).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Cluster names (comma-separated), or a count N for `cluster-001`..`cluster-N`.
    #[arg(long, default_value = "kubesim")]
    pub clusters: String,
    /// Write a kubeconfig with one context per cluster (the first is current).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Start these clusters offline (repeatable or comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub offline: Vec<String>,
    /// Start these clusters slow: CLUSTER=MS (repeatable or comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub slow: Vec<String>,
    /// Glob of container images that never become ready.
    #[arg(long, default_value = "*:broken*")]
    pub fail_image: String,
    /// Glob of PersistentVolumeClaim names whose provisioning fails: they stay Pending, and
    /// so do the pods that mount them.
    #[arg(long, default_value = "")]
    pub fail_pvc: String,
    /// Taint a node so pods that do not tolerate it stay Pending: CLUSTER/NODE (e.g. edge-1/node-3).
    #[arg(long, value_delimiter = ',')]
    pub taint_node: Vec<String>,
    /// Nodes per cluster (named node-1..node-N).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Milliseconds from pod creation to Ready.
    #[arg(long, default_value_t = 150)]
    pub pod_startup_ms: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options::parse_from(["kubesim"])
    }
}

fn cluster_names(spec: &str) -> Result<Vec<String>> {
    if let Ok(n) = spec.parse::<usize>() {
        if n == 0 {
            bail!("--clusters needs at least one cluster");
        }
        let width = n.to_string().len().max(3);
        return Ok((1..=n).map(|i| format!("cluster-{i:0width$}")).collect());
    }
    let names: Vec<String> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect();
    if names.is_empty() {
        bail!("--clusters needs at least one cluster");
    }
    for n in &names {
        if !validate::is_dns1123_label(n) {
            bail!("cluster name {n:?} must be a DNS-1123 label");
        }
    }
    Ok(names)
}

/// A kubeconfig with one cluster, user and context per simulated cluster.
fn kubeconfig(addr: &SocketAddr, names: &[String]) -> String {
    let mut s = String::from("apiVersion: v1\nkind: Config\npreferences: {}\n");
    s.push_str(&format!("current-context: {}\nclusters:\n", names[0]));
    for n in names {
        s.push_str(&format!("- name: {n}\n  cluster:\n    server: http://{addr}/clusters/{n}\n"));
    }
    s.push_str("users:\n");
    for n in names {
        s.push_str(&format!("- name: {n}\n  user:\n    token: kubesim-{n}\n"));
    }
    s.push_str("contexts:\n");
    for n in names {
        s.push_str(&format!("- name: {n}\n  context:\n    cluster: {n}\n    user: {n}\n    namespace: default\n"));
    }
    s
}

/// The simulated fleet built from the options, before it listens.
fn build(opts: &Options) -> Result<(Arc<Sim>, Vec<String>)> {
    let names = cluster_names(&opts.clusters)?;
    let mut taints = Vec::new();
    for t in &opts.taint_node {
        let (c, n) = t.split_once('/').with_context(|| format!("--taint-node {t:?} must be CLUSTER/NODE"))?;
        taints.push((c.to_string(), n.to_string()));
    }
    let config = SimConfig {
        fail_image: opts.fail_image.clone(),
        pod_startup_ms: opts.pod_startup_ms,
        nodes: opts.nodes,
        fail_pvc: opts.fail_pvc.clone(),
    };
    let sim = Arc::new(Sim::new(names.clone(), config, &taints));
    for c in &opts.offline {
        if !sim.set_offline(c, true) {
            bail!("--offline: no cluster named {c:?}");
        }
    }
    for s in &opts.slow {
        let (c, ms) = s.split_once('=').with_context(|| format!("--slow {s:?} must be CLUSTER=MS"))?;
        let ms: u64 = ms.parse().with_context(|| format!("--slow {s:?}: MS must be a number"))?;
        if !sim.set_slow(c, ms) {
            bail!("--slow: no cluster named {c:?}");
        }
    }
    Ok((sim, names))
}

/// A listener with the accept queue a real API server has (Go listens with the kernel's
/// `somaxconn`, 4096): with the 128 of Rust's default, a client that opens a few hundred
/// connections at once has some of them dropped and retried a second later.
async fn listen(address: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host(address).await? {
        let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr).and_then(|()| socket.listen(4096)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to listen on")))
}

/// Binds the listener and writes the kubeconfig (must run inside a tokio runtime).
async fn bind(opts: &Options, names: &[String]) -> Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = listen(&opts.listen).await.with_context(|| format!("listening on {}", opts.listen))?;
    let addr = listener.local_addr()?;
    if let Some(path) = &opts.kubeconfig {
        std::fs::write(path, kubeconfig(&addr, names)).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok((listener, addr))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// What a started kubesim reports once it is listening.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The bound address (`--listen` with port 0 picks one).
    pub addr: SocketAddr,
    /// The cluster names, in order; the first is the kubeconfig's current context.
    pub clusters: Vec<String>,
}

impl Ready {
    /// The line the binary prints: `kubesim ready ADDR N clusters`.
    pub fn line(&self) -> String {
        format!("kubesim ready {} {} clusters", self.addr, self.clusters.len())
    }
}

/// Runs kubesim on the calling thread until Ctrl-C (the binary's whole life); `ready` is
/// called once it is listening.
pub fn run_until_interrupted(opts: Options, ready: impl FnOnce(&Ready) -> Result<()>) -> Result<()> {
    let (sim, names) = build(&opts)?;
    runtime()?.block_on(async move {
        let (listener, addr) = bind(&opts, &names).await?;
        tokio::spawn(controller::run(sim.clone()));
        ready(&Ready { addr, clusters: names })?;
        tokio::select! {
            _ = server::serve(listener, sim) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(())
    })
}

/// A kubesim running inside this process on its own runtime thread, stopped (listener,
/// connections, watches and controller) when dropped. Clients reach it over HTTP only.
pub struct Kubesim {
    ready: Ready,
    kubeconfig: Option<PathBuf>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Kubesim {
    /// Starts a kubesim and returns once it is listening.
    pub fn start(opts: Options) -> Result<Kubesim> {
        let (sim, names) = build(&opts)?;
        let kubeconfig = opts.kubeconfig.clone();
        let rt = runtime()?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<SocketAddr>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let clusters = names.clone();
        let thread = std::thread::Builder::new().name("kubesim".into()).spawn(move || {
            rt.block_on(async move {
                let (listener, addr) = match bind(&opts, &names).await {
                    Ok(bound) => bound,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                tokio::spawn(controller::run(sim.clone()));
                let _ = ready_tx.send(Ok(addr));
                tokio::select! {
                    _ = server::serve(listener, sim) => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime here cancels every connection and watch task.
            drop(rt);
        })?;
        let addr = ready_rx.recv().context("kubesim's runtime thread ended before listening")??;
        Ok(Kubesim { ready: Ready { addr, clusters }, kubeconfig, stop: Some(stop), thread: Some(thread) })
    }

    /// The bound address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.ready.addr
    }

    /// The cluster names, in order.
    pub fn clusters(&self) -> &[String] {
        &self.ready.clusters
    }

    /// The kubeconfig written (`Options::kubeconfig`), if one was asked for.
    pub fn kubeconfig(&self) -> Option<&Path> {
        self.kubeconfig.as_deref()
    }

    /// The API base URL of one cluster: `http://ADDR/clusters/NAME`.
    pub fn server_url(&self, cluster: &str) -> String {
        format!("http://{}/clusters/{cluster}", self.ready.addr)
    }
}

impl Drop for Kubesim {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

//! helm's release records read from the Kubernetes API in-process, in place of `helm history`
//! and `helm status` (no helm process): the storage Secrets `sh.helm.release.v1.NAME.vN`, or
//! ConfigMaps under `HELM_DRIVER=configmap`, which helm 3 and helm 4 write alike
//! (`pkg/storage/driver`: labels `name`, `owner=helm`, `status`, `version`; the release as
//! base64(gzip(JSON)) under `data.release`). Revision numbers and statuses come from the labels
//! alone (a metadata-only list); a revision's chart, app version, description, time and values
//! from its record's body, read only for the revisions a caller needs.
//!
//! It only reads: helm itself changes the cluster. Where helm's storage is not one it reads
//! (`HELM_DRIVER=sql` or `memory`, the `HELM_KUBE*` overrides, a kubeconfig it cannot load),
//! [`Records::open`] says why and the caller asks helm.

use std::collections::{BTreeMap, HashMap};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use kube::api::{GetParams, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::Request;
use serde::Deserialize;
use serde_json::Value;
use tracing::instrument::WithSubscriber as _;

use super::state::{ReleaseStatus, Revision, Status, StatusInfo};
use crate::kubeconfig::{seen, Seen};
use crate::StepContext;

/// Where helm keeps its release records (`HELM_DRIVER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    Secret,
    ConfigMap,
}

impl Driver {
    /// helm's own choice from `HELM_DRIVER` (`pkg/cli` / `action.Configuration.Init`): unset,
    /// `secret` or `secrets` is the Secret driver, `configmap(s)` the ConfigMap one; any other
    /// (`memory`, `sql`) is not in the cluster's API.
    pub fn from_env(value: Option<&str>) -> Result<Driver, String> {
        match value.unwrap_or("") {
            "" | "secret" | "secrets" => Ok(Driver::Secret),
            "configmap" | "configmaps" => Ok(Driver::ConfigMap),
            other => Err(format!("`HELM_DRIVER={other}` keeps releases outside the cluster's API")),
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Driver::Secret => "secrets",
            Driver::ConfigMap => "configmaps",
        }
    }
}

/// Environment variables that change which cluster (or as whom) helm talks to, beyond the
/// kubeconfig and context: with any of them set, helm is asked instead.
const HELM_CLUSTER_OVERRIDES: &[&str] = &[
    "HELM_KUBEAPISERVER",
    "HELM_KUBETOKEN",
    "HELM_KUBEASUSER",
    "HELM_KUBEASGROUPS",
    "HELM_KUBECAFILE",
    "HELM_KUBEINSECURE_SKIP_TLS_VERIFY",
    "HELM_KUBETLS_SERVER_NAME",
];

/// A read that did not get an answer (the cluster is unreachable, the API refused it, a record
/// does not decode): what helm history failing would be.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadError(pub String);

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One revision's record read in full: the revision as `helm history` shows it, and the
/// release as `helm status` shows it (its values in `status.config`).
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub revision: Revision,
    pub status: ReleaseStatus,
    /// `chart.metadata.version` (`helm get metadata`'s `version`), "" when the record has none.
    pub chart_version: String,
}

/// The release records of one release in one cluster and namespace.
pub struct Records {
    client: kube::Client,
    namespace: String,
    release: String,
    driver: Driver,
    /// Whether kube's own logs are wanted (`-vv`): a failed request is otherwise reported once,
    /// as the step's error, not also as kube's ERROR line.
    verbose: bool,
}

/// Per-request budget, as the helm read it replaces (`helm history` under rdeploy's QUICK).
const READ_TIMEOUT: Duration = Duration::from_secs(120);

impl Records {
    /// The records of `release` as helm would find them for this step: its `kubeconfig`
    /// (else `KUBECONFIG`, else `~/.kube/config`), `context` (else `HELM_KUBECONTEXT`, else the
    /// current one) and `namespace` (else `HELM_NAMESPACE`, else the context's, else
    /// `default`), in the step's environment. `Err` says why helm must be asked instead.
    pub async fn open(
        release: &str,
        kubeconfig: Option<PathBuf>,
        context: Option<&str>,
        namespace: Option<&str>,
        ctx: &StepContext,
    ) -> Result<Records, String> {
        let env = |key: &str| -> Option<String> {
            ctx.env.get(key).cloned().or_else(|| std::env::var(key).ok()).filter(|v| !v.is_empty())
        };
        let driver = Driver::from_env(env("HELM_DRIVER").as_deref())?;
        if let Some(key) = HELM_CLUSTER_OVERRIDES.iter().find(|k| env(k).is_some()) {
            return Err(format!("`{key}` is set"));
        }
        let files = crate::kubeconfig::files(kubeconfig.as_deref(), ctx);
        let kubeconfig = load_kubeconfig(&files)?;
        let context = context
            .map(str::to_string)
            .or_else(|| env("HELM_KUBECONTEXT"))
            .or_else(|| kubeconfig.current_context.clone())
            .ok_or("the kubeconfig names no current context")?;
        let options = KubeConfigOptions { context: Some(context.clone()), ..KubeConfigOptions::default() };
        let mut config = kube::Config::from_custom_kubeconfig(only_context(&kubeconfig, &context), &options)
            .await
            .map_err(|e| format!("context `{context}`: {e}"))?;
        config.connect_timeout = Some(READ_TIMEOUT);
        config.read_timeout = Some(READ_TIMEOUT);
        let namespace = namespace.map(str::to_string).or_else(|| env("HELM_NAMESPACE"));
        let client = client_for(config).map_err(|e| format!("cannot build a client for context `{context}`: {e}"))?;
        let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_string());
        Ok(Records {
            client,
            namespace,
            release: release.to_string(),
            driver,
            verbose: tracing::enabled!(tracing::Level::DEBUG),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn driver(&self) -> Driver {
        self.driver
    }

    fn path(&self) -> String {
        format!("/api/v1/namespaces/{}/{}", self.namespace, self.driver.plural())
    }

    /// The record's object name (`sh.helm.release.v1.web.v3`), as helm's `makeKey`.
    fn key(&self, revision: u64) -> String {
        format!("sh.helm.release.v1.{}.v{revision}", self.release)
    }

    /// Every revision of the release with its status, oldest first, from the records' labels
    /// alone (a metadata-only list: no bodies cross the wire). `chart`, `description` and
    /// `updated` are empty: [`Records::record`] reads them. No record is an empty list (helm's
    /// "release: not found").
    pub async fn revisions(&self) -> Result<Vec<Revision>, ReadError> {
        let params = ListParams::default().labels(&format!("owner=helm,name={}", self.release));
        let request = Request::new(self.path())
            .list_metadata(&params)
            .map_err(|e| ReadError(format!("cannot build the request: {e}")))?;
        let list: MetaList = self.send(request, "listing").await?;
        let mut revisions: Vec<Revision> = list
            .items
            .into_iter()
            .filter_map(|item| {
                let labels = item.metadata.labels;
                // The selector already holds; a record another tool labelled alike without a
                // number is not one of helm's.
                let revision = labels.get("version")?.parse::<u64>().ok()?;
                let status = Status::from(labels.get("status").map_or("unknown", String::as_str));
                Some(Revision {
                    revision,
                    updated: String::new(),
                    status,
                    chart: String::new(),
                    app_version: String::new(),
                    description: String::new(),
                })
            })
            .collect();
        revisions.sort_by_key(|r| r.revision);
        Ok(revisions)
    }

    /// One revision's record in full, `None` when it does not exist (pruned since the list).
    pub async fn record(&self, revision: u64) -> Result<Option<Record>, ReadError> {
        let Some(body) = self.body(revision).await? else { return Ok(None) };
        let release: Body = serde_json::from_slice(&body).map_err(|e| {
            ReadError(format!("the record of {} revision {revision} is not a release: {e}", self.release))
        })?;
        Ok(Some(release.into_record(revision, &self.namespace)))
    }

    /// One revision's release as helm stored it (the JSON `helm status -o json` prints, `chart`
    /// included), `None` when it does not exist.
    pub async fn release(&self, revision: u64) -> Result<Option<Value>, ReadError> {
        let Some(body) = self.body(revision).await? else { return Ok(None) };
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| ReadError(format!("the record of {} revision {revision} is not JSON: {e}", self.release)))
    }

    /// The decoded JSON of a record's `data.release`.
    async fn body(&self, revision: u64) -> Result<Option<Vec<u8>>, ReadError> {
        let request = Request::new(self.path())
            .get(&self.key(revision), &GetParams::default())
            .map_err(|e| ReadError(format!("cannot build the request: {e}")))?;
        let stored: Stored = match self.send(request, "reading").await {
            Ok(stored) => stored,
            Err(Missing::NotFound) => return Ok(None),
            Err(Missing::Error(e)) => return Err(e),
        };
        let Some(data) = stored.data.get("release") else {
            return Err(ReadError(format!("the record {} has no `release`", self.key(revision))));
        };
        let text = match self.driver {
            // A Secret's data is base64 in the API, over helm's own base64.
            Driver::Secret => base64::engine::general_purpose::STANDARD
                .decode(data.as_bytes())
                .map_err(|e| ReadError(format!("the record {} is not base64: {e}", self.key(revision))))?,
            Driver::ConfigMap => data.as_bytes().to_vec(),
        };
        decode_release(&text).map(Some).map_err(|e| ReadError(format!("the record {}: {e}", self.key(revision))))
    }

    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        request: http::Request<Vec<u8>>,
        doing: &str,
    ) -> Result<T, Missing> {
        let what = format!("{doing} helm's records of {} in namespace {}", self.release, self.namespace);
        let call = tokio::time::timeout(READ_TIMEOUT, self.client.request::<T>(request));
        let answer = if self.verbose { call.await } else { call.with_subscriber(quiet()).await };
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(kube::Error::Api(e))) if e.code == 404 && doing == "reading" => Err(Missing::NotFound),
            Ok(Err(e)) => Err(Missing::Error(ReadError(format!("{what}: {}", short_error(&e))))),
            Err(_) => Err(Missing::Error(ReadError(format!("{what}: no answer within {}s", READ_TIMEOUT.as_secs())))),
        }
    }
}

/// Why a read gave no value: the object is not there (404 on a GET), or an error.
enum Missing {
    NotFound,
    Error(ReadError),
}

impl From<Missing> for ReadError {
    fn from(m: Missing) -> ReadError {
        match m {
            Missing::NotFound => ReadError("not found".into()),
            Missing::Error(e) => e,
        }
    }
}

/// helm's `decodeRelease`: base64, then gunzip when the gzip magic is there (records written
/// before helm compressed them are plain JSON).
pub fn decode_release(encoded: &[u8]) -> Result<Vec<u8>, String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim_ascii())
        .map_err(|e| format!("the release is not base64: {e}"))?;
    if raw.starts_with(&[0x1f, 0x8b, 0x08]) {
        let mut json = Vec::with_capacity(raw.len() * 4);
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut json)
            .map_err(|e| format!("the release does not gunzip: {e}"))?;
        return Ok(json);
    }
    Ok(raw)
}

/// The fields of a list's items read here: the labels (a `PartialObjectMetadataList`, or a full
/// list from a server that ignores the metadata-only Accept).
#[derive(Deserialize)]
struct MetaList {
    #[serde(default)]
    items: Vec<MetaItem>,
}

#[derive(Deserialize)]
struct MetaItem {
    metadata: Meta,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// A Secret or ConfigMap: its `data` only.
#[derive(Deserialize)]
struct Stored {
    #[serde(default)]
    data: BTreeMap<String, String>,
}

/// The fields of a stored release read here (helm 3's `pkg/release` and helm 4's
/// `pkg/release/v1` agree on them); the chart's templates and files are skipped unread.
#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    version: u64,
    #[serde(default)]
    info: Option<BodyInfo>,
    #[serde(default)]
    chart: Option<BodyChart>,
    #[serde(default)]
    config: Value,
}

#[derive(Deserialize)]
struct BodyInfo {
    #[serde(default)]
    status: Option<Status>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    last_deployed: Option<String>,
}

#[derive(Deserialize)]
struct BodyChart {
    #[serde(default)]
    metadata: Option<ChartMeta>,
}

#[derive(Deserialize)]
struct ChartMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    version: String,
    #[serde(default, rename = "appVersion")]
    app_version: String,
}

impl Body {
    fn into_record(self, revision: u64, namespace: &str) -> Record {
        let info = self.info.unwrap_or(BodyInfo { status: None, description: String::new(), last_deployed: None });
        let status = info.status.unwrap_or(Status::Unknown);
        let meta = self.chart.and_then(|c| c.metadata);
        let version = if self.version == 0 { revision } else { self.version };
        Record {
            revision: Revision {
                revision: version,
                updated: info.last_deployed.unwrap_or_default(),
                status: status.clone(),
                // `helm history`'s `formatChartName`.
                chart: meta.as_ref().map(|m| format!("{}-{}", m.name, m.version)).unwrap_or_default(),
                app_version: meta.as_ref().map(|m| m.app_version.clone()).unwrap_or_default(),
                description: info.description.clone(),
            },
            chart_version: meta.map(|m| m.version).unwrap_or_default(),
            status: ReleaseStatus {
                name: self.name,
                version,
                namespace: if self.namespace.is_empty() { namespace.to_string() } else { self.namespace },
                config: self.config,
                info: StatusInfo { status, description: info.description },
            },
        }
    }
}

/// A kubeconfig holding only `context`, its cluster and its user: what one cluster's client
/// needs, without copying a fleet's 4,000 contexts per cluster.
pub fn only_context(kubeconfig: &Kubeconfig, context: &str) -> Kubeconfig {
    let named = kubeconfig.contexts.iter().find(|c| c.name == context);
    let inner = named.and_then(|c| c.context.as_ref());
    let cluster = inner.map(|c| c.cluster.as_str());
    let user = inner.and_then(|c| c.user.as_deref());
    Kubeconfig {
        preferences: kubeconfig.preferences.clone(),
        clusters: kubeconfig.clusters.iter().filter(|c| Some(c.name.as_str()) == cluster).cloned().collect(),
        auth_infos: kubeconfig.auth_infos.iter().filter(|a| Some(a.name.as_str()) == user).cloned().collect(),
        contexts: named.cloned().into_iter().collect(),
        current_context: Some(context.to_string()),
        extensions: None,
        kind: kubeconfig.kind.clone(),
        api_version: kubeconfig.api_version.clone(),
    }
}

/// The kubeconfig files merged (as kubectl merges `KUBECONFIG`; missing files skipped), parsed
/// once per process while the files are unchanged: a fleet step's clusters share one parse.
/// One parse is kept per list of files, the latest: a changed file replaces it.
pub fn load_kubeconfig(files: &[PathBuf]) -> Result<Arc<Kubeconfig>, String> {
    type Cache = HashMap<Vec<PathBuf>, (Vec<Seen>, Arc<Kubeconfig>)>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let stamp: Vec<Seen> = files.iter().map(|f| seen(f)).collect();
    let cache = CACHE.get_or_init(Default::default);
    if let Some((at, found)) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(files) {
        if *at == stamp {
            return Ok(found.clone());
        }
    }
    let mut merged: Option<Kubeconfig> = None;
    for file in files.iter().filter(|f| f.exists()) {
        let one = read_kubeconfig(file).map_err(|e| format!("{}: {e}", file.display()))?;
        merged = Some(match merged {
            Some(m) => m.merge(one).map_err(|e| format!("{}: {e}", file.display()))?,
            None => one,
        });
    }
    let merged = Arc::new(merged.ok_or_else(|| {
        format!("no kubeconfig at {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(":"))
    })?);
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(files.to_vec(), (stamp, merged.clone()));
    Ok(merged)
}

/// One kubeconfig file, as kube's `Kubeconfig::read_from` reads it (its documents merged, the
/// relative paths in it made absolute against its folder). A plain UTF-8 file is parsed
/// straight into the kubeconfig's types rather than through a tree of YAML values (a 4,000-context
/// file is read in a fraction of the time); any file that way does not read (a byte-order mark,
/// UTF-16 as Windows PowerShell writes it, a null document) is read by kube itself, so what kube
/// accepts is accepted, and what it refuses is refused in its words.
fn read_kubeconfig(file: &Path) -> Result<Kubeconfig, String> {
    let by_kube = || Kubeconfig::read_from(file).map_err(|e| e.to_string());
    let bytes = std::fs::read(file).map_err(|e| format!("failed to read kubeconfig: {e}"))?;
    let Some(text) = std::str::from_utf8(&bytes).ok().filter(|t| !t.starts_with('\u{feff}')) else {
        return by_kube();
    };
    let Ok(documents) = crate::yaml::documents_into::<Kubeconfig>(text) else {
        return by_kube();
    };
    let dir = file.parent();
    let absolute = |path: &mut Option<String>| {
        if let (Some(dir), Some(relative)) = (dir, path.as_deref().filter(|p| Path::new(p).is_relative())) {
            if let Some(joined) = dir.join(relative).to_str() {
                *path = Some(joined.to_string());
            }
        }
    };
    let mut merged: Option<Kubeconfig> = None;
    for mut one in documents {
        for cluster in one.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
            absolute(&mut cluster.certificate_authority);
        }
        for user in one.auth_infos.iter_mut().filter_map(|u| u.auth_info.as_mut()) {
            absolute(&mut user.client_certificate);
            absolute(&mut user.client_key);
            absolute(&mut user.token_file);
        }
        merged = Some(match merged {
            Some(m) => m.merge(one).map_err(|e| e.to_string())?,
            None => one,
        });
    }
    Ok(merged.unwrap_or_default())
}

/// A plain-HTTP connection pool (kube's base-URI and auth layers over hyper's HTTP connector).
pub type PlainHttp =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, kube::client::Body>;

/// A new plain-HTTP pool.
pub fn plain_http() -> PlainHttp {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// kube's own client for an `https://` cluster (TLS and auth as kubectl does); an `http://`
/// cluster gets a plain pool: kube's default stack loads the system's root certificates for
/// every client, useless without TLS and most of a small read's cost.
pub fn client_with(config: kube::Config, http: &PlainHttp) -> Result<kube::Client, kube::Error> {
    use kube::client::ConfigExt as _;
    if config.cluster_url.scheme_str() != Some("http") {
        return kube::Client::try_from(config);
    }
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        // kube's auth layers expect a boxed error from the service they wrap.
        .map_err(|e: hyper_util::client::legacy::Error| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })
        .service(http.clone());
    Ok(kube::Client::new(service, config.default_namespace))
}

fn client_for(config: kube::Config) -> Result<kube::Client, kube::Error> {
    client_with(config, &plain_http())
}

/// A dispatch that drops every event, made once: kube's per-request ERROR lines are not wanted
/// where the caller reports the error itself.
pub fn quiet() -> tracing::Dispatch {
    static QUIET: OnceLock<tracing::Dispatch> = OnceLock::new();
    QUIET.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default())).clone()
}

/// An error with each cause it wraps that adds words (a kube or hyper error and its root
/// cause, the connection error), in one line.
pub fn short_error(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// Read as kube reads it: the relative paths in it are made absolute against its folder
    /// (an absolute one is kept), and its documents are merged, the first of each name kept.
    #[test]
    fn a_kubeconfig_s_relative_paths_are_made_absolute_and_its_documents_merged() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(
            &file,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://10.0.0.1', certificate-authority: ca.crt}\nusers:\n- name: u\n  user: {tokenFile: tok, client-key: /etc/key.pem}\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\n---\nclusters:\n- name: c\n  cluster: {server: 'https://10.0.0.2'}\n- name: d\n  cluster: {server: 'https://10.0.0.3'}\n",
        )
        .unwrap();
        let kc = read_kubeconfig(&file).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        let under = |name: &str| Some(dir.path().join(name).to_string_lossy().into_owned());
        assert_eq!(cluster.certificate_authority, under("ca.crt"));
        assert_eq!((user.token_file.clone(), user.client_key.as_deref()), (under("tok"), Some("/etc/key.pem")));
        let servers: Vec<_> = kc.clusters.iter().map(|c| c.cluster.as_ref().unwrap().server.clone().unwrap()).collect();
        assert_eq!(servers, ["https://10.0.0.1", "https://10.0.0.3"]);
        let kube = Kubeconfig::read_from(&file).unwrap();
        assert_eq!(serde_json::to_value(&kc).unwrap(), serde_json::to_value(&kube).unwrap(), "as kube reads it");
        assert!(read_kubeconfig(&dir.path().join("missing")).is_err());
        // What the straight path does not read, kube reads: a byte-order mark, UTF-16 (as
        // Windows PowerShell's `>` writes), a null document.
        let utf8 = std::fs::read_to_string(&file).unwrap();
        let utf16le: Vec<u8> = [0xff, 0xfe].into_iter().chain(utf8.encode_utf16().flat_map(u16::to_le_bytes)).collect();
        for bytes in [format!("\u{feff}{utf8}").into_bytes(), utf16le, b"~\n".to_vec()] {
            std::fs::write(&file, &bytes).unwrap();
            let kube = Kubeconfig::read_from(&file).unwrap();
            let ours = read_kubeconfig(&file).unwrap();
            assert_eq!(serde_json::to_value(&ours).unwrap(), serde_json::to_value(&kube).unwrap());
        }
        std::fs::write(&file, "clusters: [").unwrap();
        assert!(read_kubeconfig(&file).unwrap_err().starts_with("failed to parse kubeconfig YAML: "));
    }

    /// `kubectl config use-context` between two names of one length rewrites the kubeconfig in
    /// place with its length unchanged; with the modification time put back as well (a rewrite
    /// within the clock's granularity), the next read still sees the new context, and the parse
    /// of the old version is let go, not kept beside the new one.
    #[test]
    fn a_same_length_rewrite_replaces_the_cached_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        let text = |current: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'http://127.0.0.1:1'}}\ncontexts:\n- name: aa\n  context: {{cluster: c}}\n- name: bb\n  context: {{cluster: c}}\ncurrent-context: {current}\n"
            )
        };
        std::fs::write(&file, text("aa")).unwrap();
        let files = vec![file.clone()];
        let first = load_kubeconfig(&files).unwrap();
        assert_eq!(first.current_context.as_deref(), Some("aa"));
        let old = Arc::downgrade(&first);
        drop(first);
        let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
        {
            let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
            f.write_all(text("bb").as_bytes()).unwrap();
            f.set_modified(modified).unwrap();
        }
        assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), modified);
        let second = load_kubeconfig(&files).unwrap();
        assert_eq!(second.current_context.as_deref(), Some("bb"));
        assert!(old.upgrade().is_none(), "the old version's parse is still held");
        assert!(Arc::ptr_eq(&second, &load_kubeconfig(&files).unwrap()), "an unchanged file is parsed once");
    }

    fn encode(json: &str, gzip: bool) -> String {
        let bytes = if gzip {
            let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            w.write_all(json.as_bytes()).unwrap();
            w.finish().unwrap()
        } else {
            json.as_bytes().to_vec()
        };
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    const RELEASE: &str = r#"{"name":"web","namespace":"shop","version":3,
        "info":{"status":"failed","description":"Upgrade \"web\" failed: boom","last_deployed":"2026-12-01T10:00:00Z"},
        "chart":{"metadata":{"name":"webapp","version":"0.2.0","appVersion":"1.4"},"templates":[{"name":"t","data":"eA=="}]},
        "config":{"tier":"gold"},"manifest":"---\n"}"#;

    #[test]
    fn a_record_decodes_gzipped_or_plain_as_helm_does() {
        for gzip in [true, false] {
            let json = decode_release(encode(RELEASE, gzip).as_bytes()).unwrap();
            let record = serde_json::from_slice::<Body>(&json).unwrap().into_record(3, "shop");
            assert_eq!(record.revision.chart, "webapp-0.2.0");
            assert_eq!(record.revision.app_version, "1.4");
            assert_eq!(record.revision.status, Status::Failed);
            assert_eq!(record.revision.description, "Upgrade \"web\" failed: boom");
            assert_eq!(record.revision.updated, "2026-12-01T10:00:00Z");
            assert_eq!(record.chart_version, "0.2.0");
            assert_eq!(record.status.config, serde_json::json!({"tier": "gold"}));
            assert_eq!((record.status.version, record.status.namespace.as_str()), (3, "shop"));
        }
        assert!(decode_release(b"not base64!").is_err());
    }

    #[test]
    fn helms_driver_choice() {
        assert_eq!(Driver::from_env(None), Ok(Driver::Secret));
        assert_eq!(Driver::from_env(Some("secrets")), Ok(Driver::Secret));
        assert_eq!(Driver::from_env(Some("configmap")), Ok(Driver::ConfigMap));
        assert!(Driver::from_env(Some("sql")).unwrap_err().contains("HELM_DRIVER=sql"));
        assert!(Driver::from_env(Some("memory")).is_err());
    }
}

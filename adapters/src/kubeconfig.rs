//! Which kubeconfig files a step's tool reads, and one cluster's kubeconfig cut from them.
//!
//! A fleet's kubeconfig names every cluster (hundreds or thousands of contexts), and helm and
//! kubectl parse all of it on every start, several times per `helm upgrade`: at 400 contexts
//! that is 0.9 s of helm's CPU per cluster, five times what the upgrade itself costs. A fleet
//! step hands each cluster's tool a kubeconfig holding only that cluster's context, its
//! cluster and its user ([`one_context`]), copied from the user's files entry by entry as
//! written (every field kept, known or not), so the tool connects exactly as it would with the
//! user's files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Map, Value};

use crate::StepContext;

/// The kubeconfig files a kube client reads, and where they came from for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub files: Vec<PathBuf>,
    /// The file given, `$KUBECONFIG (LIST)` or `~/.kube/config`.
    pub source: String,
    /// What to do when the files cannot be read, for a `hint:` line, where how they were
    /// found needs a word of its own (`HOME` unset).
    pub hint: Option<String>,
}

/// The kubeconfig files the step's tool reads, as kubectl and helm find them: the step's
/// `kubeconfig` (relative to the stack file), else every file of `KUBECONFIG` (the step's `env`
/// over rdeploy's), else `~/.kube/config` (`.kube/config` in the stack's directory, where the
/// tool runs, without `HOME`).
pub fn files(kubeconfig: Option<&Path>, ctx: &StepContext) -> Vec<PathBuf> {
    for_step(kubeconfig, ctx).files
}

/// [`files`], with where they came from.
pub fn for_step(kubeconfig: Option<&Path>, ctx: &StepContext) -> Found {
    let env = |key: &str| ctx.env.get(key).cloned().or_else(|| std::env::var(key).ok());
    find(kubeconfig, &env, &ctx.stack_dir, TOOLS_WITHOUT_HOME)
}

/// Why a step's tool reads `.kube/config` where it runs (see [`find`]).
const TOOLS_WITHOUT_HOME: &str =
    "`HOME` is unset, so kubectl and helm read `.kube/config` in the directory they run in";

/// The kubeconfig files a kube client reads, as kubectl finds them: `kubeconfig` (relative to
/// `base`, the directory the client runs in), else every file of `KUBECONFIG` (missing ones
/// are skipped when read, relative ones against `base`), else `~/.kube/config` (a relative
/// `HOME` against `base` too); `env` gives the variables (`KUBECONFIG`, `HOME`), an empty one
/// counting as unset, and `without_home` says in the source why, without `HOME`, it is
/// `.kube/config` in `base`, as client-go finds it (kubectl, helm): on Linux its home
/// directory is `$HOME` alone (`homedir.HomeDir()`), with no look-up of the account's, and
/// `~/.kube/config` is that joined to `.kube/config`.
pub fn find(kubeconfig: Option<&Path>, env: &dyn Fn(&str) -> Option<String>, base: &Path, without_home: &str) -> Found {
    let env = |key: &str| env(key).filter(|v| !v.is_empty());
    match (kubeconfig, env("KUBECONFIG")) {
        (Some(file), _) => {
            let file = base.join(file);
            Found { source: file.display().to_string(), files: vec![file], hint: None }
        }
        (None, Some(list)) => Found {
            files: std::env::split_paths(&list).filter(|p| !p.as_os_str().is_empty()).map(|p| base.join(p)).collect(),
            source: format!("$KUBECONFIG ({list})"),
            hint: None,
        },
        (None, None) => match env("HOME") {
            Some(home) => Found {
                // client-go joins `$HOME` as it is: a relative one is read from where it runs.
                files: vec![base.join(home).join(".kube").join("config")],
                source: "~/.kube/config".into(),
                hint: None,
            },
            None => {
                let file = base.join(".kube").join("config");
                Found {
                    source: format!("{} ({without_home})", file.display()),
                    files: vec![file],
                    hint: Some("set `KUBECONFIG` to the kubeconfig to read, or `HOME` to the directory holding its `.kube/config`".into()),
                }
            }
        },
    }
}

/// A kubeconfig document holding only `context`, its cluster and its user, each entry taken
/// from the first of `files` that names it (kubectl's merge: the first file wins, missing files
/// are skipped). Relative file paths are made absolute against the directory of the file the
/// entry comes from, as kubectl resolves them, so the document reads the same from anywhere:
/// `certificate-authority`, `client-certificate`, `client-key`, `tokenFile`, and an `exec`
/// command written as a relative path (`./bin/token`; a bare name is looked up on `PATH`).
/// `Err` says why not (the context, or the cluster it names, is not there): the tool is then
/// given the user's files, and says it in its own words.
pub fn one_context(files: &[PathBuf], context: &str) -> Result<Value, String> {
    let parsed: Vec<Arc<Parsed>> = files.iter().filter(|f| f.exists()).map(|f| parse(f)).collect::<Result<_, _>>()?;
    let find = |list: fn(&Parsed) -> &HashMap<String, Value>, name: &str| {
        parsed.iter().find_map(|p| list(p).get(name).map(|entry| (p.dir.as_path(), entry.clone())))
    };
    let (_, named) = find(|p| &p.contexts, context).ok_or_else(|| format!("no context `{context}`"))?;
    let inner = named.get("context");
    let field = |key: &str| inner.and_then(|c| c.get(key)).and_then(Value::as_str).filter(|s| !s.is_empty());
    let cluster_name = field("cluster").ok_or_else(|| format!("context `{context}` names no cluster"))?;
    let (dir, mut cluster) =
        find(|p| &p.clusters, cluster_name).ok_or_else(|| format!("no cluster `{cluster_name}`"))?;
    absolute(&mut cluster, "cluster", &["certificate-authority"], dir);
    let mut doc = Map::new();
    doc.insert("apiVersion".into(), "v1".into());
    doc.insert("kind".into(), "Config".into());
    doc.insert("clusters".into(), Value::Array(vec![cluster]));
    doc.insert("contexts".into(), Value::Array(vec![named.clone()]));
    doc.insert("current-context".into(), context.into());
    let users = match field("user") {
        Some(user) => match find(|p| &p.users, user) {
            Some((dir, mut entry)) => {
                absolute(&mut entry, "user", &["client-certificate", "client-key", "tokenFile"], dir);
                absolute_exec(&mut entry, dir);
                vec![entry]
            }
            None => return Err(format!("no user `{user}`")),
        },
        None => Vec::new(),
    };
    doc.insert("users".into(), Value::Array(users));
    Ok(Value::Object(doc))
}

/// One kubeconfig file's entries by name, and its directory.
struct Parsed {
    dir: PathBuf,
    contexts: HashMap<String, Value>,
    clusters: HashMap<String, Value>,
    users: HashMap<String, Value>,
}

/// The parsed files by path, each with how it was when parsed.
type Cache = HashMap<PathBuf, (Seen, Arc<Parsed>)>;

/// A kubeconfig file as last seen: its inode, length, modification and change times (to the
/// nanosecond), or none where it is missing. An in-place rewrite of the same length within the
/// clock's granularity (`kubectl config use-context` between names of one length) still moves
/// the change time, and a file replaced by rename has another inode.
pub(crate) type Seen = Option<(u64, u64, i64, i64, i64, i64)>;

pub(crate) fn seen(file: &Path) -> Seen {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(file).ok()?;
    Some((m.ino(), m.len(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
}

/// `file` parsed, once per process while it is unchanged: a fleet's clusters share one parse.
fn parse(file: &Path) -> Result<Arc<Parsed>, String> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let stamp = seen(file);
    if let Some((at, parsed)) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(file) {
        if *at == stamp {
            return Ok(parsed.clone());
        }
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let value = crate::yaml::value(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let by_name = |key: &str| -> HashMap<String, Value> {
        let mut map = HashMap::new();
        for entry in value.get(key).and_then(Value::as_array).into_iter().flatten() {
            if let Some(name) = entry.get("name").and_then(Value::as_str) {
                // The first entry of a name wins within a file too, as kubectl reads it.
                map.entry(name.to_string()).or_insert_with(|| entry.clone());
            }
        }
        map
    };
    // Absolute against rdeploy's working directory, where `file` is found from (the stack's
    // directory is relative to it): the cut document is read from the state directory, and a
    // kube client reads a relative path in it against the folder of that file.
    let absolute = std::path::absolute(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let parsed = Arc::new(Parsed {
        dir: absolute.parent().map(Path::to_path_buf).unwrap_or_default(),
        contexts: by_name("contexts"),
        clusters: by_name("clusters"),
        users: by_name("users"),
    });
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(file.to_path_buf(), (stamp, parsed.clone()));
    Ok(parsed)
}

/// Makes the relative paths under `entry[inner][key]` absolute against `dir`.
fn absolute(entry: &mut Value, inner: &str, keys: &[&str], dir: &Path) {
    let Some(inner) = entry.get_mut(inner).and_then(Value::as_object_mut) else { return };
    for key in keys {
        if let Some(Value::String(path)) = inner.get_mut(*key) {
            if !path.is_empty() && Path::new(path.as_str()).is_relative() {
                *path = joined(dir, path);
            }
        }
    }
}

/// `dir/path`, without the `.` components (`./bin/x` is `DIR/bin/x`).
fn joined(dir: &Path, path: &str) -> String {
    dir.join(path).components().collect::<PathBuf>().to_string_lossy().into_owned()
}

/// An `exec` plugin's command written as a relative path (with a `/`) is made absolute against
/// `dir`; a bare name stays, for the tool to find on `PATH`.
fn absolute_exec(entry: &mut Value, dir: &Path) {
    let command = entry.get_mut("user").and_then(|u| u.get_mut("exec")).and_then(|e| e.get_mut("command"));
    if let Some(Value::String(command)) = command {
        if command.contains('/') && Path::new(command.as_str()).is_relative() {
            *command = joined(dir, command);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    const FLEET: &str = r#"
apiVersion: v1
kind: Config
current-context: c1
clusters:
  - name: k1
    cluster: { server: "https://k1.example:6443", certificate-authority: certs/k1.pem, tls-server-name: api.k1, proxy-url: "http://proxy:3128" }
  - name: k2
    cluster: { server: "https://k2.example:6443", certificate-authority-data: Q0E= }
contexts:
  - name: c1
    context: { cluster: k1, user: u1, namespace: shop }
  - name: c2
    context: { cluster: k2, user: u2 }
users:
  - name: u1
    user:
      client-certificate: certs/u1.crt
      client-key: /abs/u1.key
      tokenFile: token
      exec: { apiVersion: client.authentication.k8s.io/v1, command: ./bin/get-token, args: [--cluster, k1], interactiveMode: Never, installHint: "install get-token" }
  - name: u2
    user: { exec: { apiVersion: client.authentication.k8s.io/v1, command: aws, args: [eks, get-token] } }
"#;

    #[test]
    fn one_context_keeps_only_its_entries_every_field_and_absolute_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "config", FLEET);
        let doc = one_context(&[file], "c1").unwrap();
        assert_eq!(doc["current-context"], "c1");
        assert_eq!(doc["contexts"].as_array().unwrap().len(), 1);
        assert_eq!(doc["contexts"][0]["context"]["namespace"], "shop");
        let cluster = &doc["clusters"][0];
        assert_eq!(cluster["name"], "k1");
        assert_eq!(doc["clusters"].as_array().unwrap().len(), 1);
        // Fields kube's typed config does not model are kept as written.
        assert_eq!(cluster["cluster"]["tls-server-name"], "api.k1");
        assert_eq!(cluster["cluster"]["proxy-url"], "http://proxy:3128");
        let base = dir.path().to_string_lossy();
        assert_eq!(cluster["cluster"]["certificate-authority"], format!("{base}/certs/k1.pem"));
        let user = &doc["users"][0]["user"];
        assert_eq!(doc["users"].as_array().unwrap().len(), 1);
        assert_eq!(user["client-certificate"], format!("{base}/certs/u1.crt"));
        assert_eq!(user["client-key"], "/abs/u1.key");
        assert_eq!(user["tokenFile"], format!("{base}/token"));
        assert_eq!(user["exec"]["command"], format!("{base}/bin/get-token"));
        assert_eq!(user["exec"]["installHint"], "install get-token");
    }

    #[test]
    fn an_exec_command_without_a_slash_stays_for_path_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "config", FLEET);
        let doc = one_context(&[file], "c2").unwrap();
        assert_eq!(doc["users"][0]["user"]["exec"]["command"], "aws");
        assert_eq!(doc["clusters"][0]["cluster"]["certificate-authority-data"], "Q0E=");
    }

    #[test]
    fn the_first_file_naming_an_entry_wins_and_missing_files_are_skipped() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let first = write(
            a.path(),
            "config",
            "clusters:\n  - name: k1\n    cluster: { server: 'https://first', certificate-authority: ca.pem }\n",
        );
        let second = write(b.path(), "config", FLEET);
        let files = [a.path().join("missing"), first, second];
        let doc = one_context(&files, "c1").unwrap();
        // The cluster from the first file, its path against that file's directory; the
        // context and user from the second.
        assert_eq!(doc["clusters"][0]["cluster"]["server"], "https://first");
        assert_eq!(doc["clusters"][0]["cluster"]["certificate-authority"], format!("{}/ca.pem", a.path().display()));
        assert_eq!(doc["users"][0]["user"]["tokenFile"], format!("{}/token", b.path().display()));
    }

    #[test]
    fn a_context_or_its_cluster_that_is_not_there_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "config", FLEET);
        assert_eq!(one_context(std::slice::from_ref(&file), "c9").unwrap_err(), "no context `c9`");
        let broken = write(dir.path(), "broken", "contexts:\n  - name: c\n    context: { cluster: gone, user: u }\n");
        assert_eq!(one_context(&[broken], "c").unwrap_err(), "no cluster `gone`");
    }

    /// Where kubectl and helm look: the step's file, else `KUBECONFIG`, else `~/.kube/config`;
    /// without `HOME` (unset or empty), `.kube/config` in the directory they run in, as client-go
    /// finds it (its home directory is `$HOME` alone on Linux), said in the source and the hint.
    #[test]
    fn without_home_the_kubeconfig_is_dot_kube_config_where_the_tool_runs() {
        let base = Path::new("/stack");
        let with = |vars: &'static [(&'static str, &'static str)]| {
            move |key: &str| vars.iter().find(|(k, _)| *k == key).map(|(_, v)| v.to_string())
        };
        let home = find(None, &with(&[("HOME", "/home/op")]), base, TOOLS_WITHOUT_HOME);
        assert_eq!(home.files, [PathBuf::from("/home/op/.kube/config")]);
        assert_eq!((home.source.as_str(), home.hint), ("~/.kube/config", None));
        // client-go reads `$HOME/.kube/config` from the directory it runs in.
        let relative = find(None, &with(&[("HOME", "op")]), base, TOOLS_WITHOUT_HOME);
        assert_eq!(relative.files, [PathBuf::from("/stack/op/.kube/config")]);
        let listed = find(None, &with(&[("HOME", "/home/op"), ("KUBECONFIG", "a:/b")]), base, TOOLS_WITHOUT_HOME);
        assert_eq!(listed.files, [PathBuf::from("/stack/a"), PathBuf::from("/b")]);
        assert_eq!(
            find(Some(Path::new("k.yaml")), &with(&[]), base, TOOLS_WITHOUT_HOME).files,
            [PathBuf::from("/stack/k.yaml")]
        );
        for vars in [&[][..], &[("HOME", ""), ("KUBECONFIG", "")][..]] {
            let found = find(None, &with(vars), base, TOOLS_WITHOUT_HOME);
            assert_eq!(found.files, [PathBuf::from("/stack/.kube/config")], "{vars:?}");
            assert!(found.source.starts_with("/stack/.kube/config (`HOME` is unset"), "{}", found.source);
            let hint = found.hint.expect("a hint without `HOME`");
            assert!(hint.starts_with("set `KUBECONFIG`") && !found.source.contains("set `"), "{hint}");
        }
    }

    #[test]
    fn a_changed_file_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "config", FLEET);
        assert_eq!(one_context(std::slice::from_ref(&file), "c2").unwrap()["clusters"][0]["name"], "k2");
        // Rewritten by rename (a new inode), as `kubectl config` and editors do.
        let next = FLEET.replace("cluster: k2, user: u2", "cluster: k1, user: u2");
        let tmp = write(dir.path(), "config.new", &next);
        std::fs::rename(tmp, &file).unwrap();
        assert_eq!(one_context(&[file], "c2").unwrap()["clusters"][0]["name"], "k1");
    }
}

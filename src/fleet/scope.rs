//! Which clusters are in scope: contexts read from a kubeconfig (all, named, or globbed like
//! `edge-*`), optionally listed with labels in a fleet file. A cluster named in scope but
//! missing from the kubeconfig stays in scope, as absent: leaving it out would hide it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _};
use kube::config::{Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use rdeploy_adapters::helm::records::load_kubeconfig;
use rdeploy_adapters::{kubeconfig, StepContext};
use serde::Deserialize;

/// The clusters to ask and how to reach them.
pub struct Scope {
    /// Where the kubeconfig came from, for messages.
    pub source: String,
    pub clusters: Vec<Member>,
}

#[derive(Clone)]
pub struct Member {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// A kubeconfig holding only this context, its cluster and its user; `None` when the
    /// kubeconfig has no such context. Built once so per-cluster setup does not copy the
    /// whole (possibly 4,000-context) kubeconfig.
    pub kubeconfig: Option<Kubeconfig>,
}

/// The optional fleet file: labels per cluster, and the fleet's membership.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    #[serde(default)]
    pub clusters: BTreeMap<String, BTreeMap<String, String>>,
}

impl FleetFile {
    pub fn load(path: &Path) -> anyhow::Result<FleetFile> {
        let text = fs_err::read_to_string(path)?;
        rdeploy_adapters::yaml::from_str_located(&text)
            .with_context(|| format!("{}: not a fleet file (`clusters: {{name: {{label: value}}}}`)", path.display()))
    }
}

/// The kubeconfig of a command without a step (`rdeploy inventory`, `alerts`, a gate), as
/// kubectl finds it ([`kubeconfig::find`]): the explicit file, else `$KUBECONFIG` (its files
/// merged, missing ones skipped), else `~/.kube/config`, in rdeploy's own environment. Without
/// `HOME`, the home directory is the account's, as kube finds it: rdeploy
/// itself is the client here, not a tool that reads `HOME` alone. Parsed once per process while
/// its files are unchanged, in the cache helm's records reads use too: a rollout's scope, each
/// cluster's helm records and readiness reads share one parse of a (possibly 4,000-context)
/// kubeconfig.
pub fn read_kubeconfig(explicit: Option<&Path>) -> anyhow::Result<(Arc<Kubeconfig>, String)> {
    let env = |key: &str| match std::env::var(key) {
        Ok(value) if !value.is_empty() => Some(value),
        _ if key == "HOME" => home::home_dir().map(|home| home.display().to_string()),
        _ => None,
    };
    // rdeploy itself is the client here.
    let without_home = "`HOME` is unset and the account has no home directory, so rdeploy reads `.kube/config` in the directory it runs in";
    read_found(kubeconfig::find(explicit, &env, Path::new(""), without_home))
}

/// The kubeconfig a step's helm or kubectl reads ([`kubeconfig::for_step`]: the step's
/// `kubeconfig`, else `KUBECONFIG` from its `env` over rdeploy's, else `~/.kube/config`, which
/// without `HOME` is `.kube/config` in the stack's directory, where the tool runs): the same
/// files a fleet cluster's own kubeconfig is cut from.
pub fn read_step_kubeconfig(kubeconfig: Option<&Path>, ctx: &StepContext) -> anyhow::Result<(Arc<Kubeconfig>, String)> {
    read_found(kubeconfig::for_step(kubeconfig, ctx))
}

/// The kubeconfig files found, read.
pub fn read_found(found: kubeconfig::Found) -> anyhow::Result<(Arc<Kubeconfig>, String)> {
    let kc = load_kubeconfig(&found.files)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("could not read the kubeconfig from {}", found.source))?;
    Ok((kc, found.source))
}

pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

impl Scope {
    /// Selects clusters: `patterns` are names or globs (empty: every cluster of the fleet file,
    /// else every context). A glob that matches nothing is an error, a name is kept.
    pub fn select(
        kubeconfig: &Kubeconfig,
        source: String,
        patterns: &[String],
        fleet: Option<&FleetFile>,
    ) -> anyhow::Result<Scope> {
        let universe: Vec<String> = match fleet {
            Some(f) if !f.clusters.is_empty() => f.clusters.keys().cloned().collect(),
            _ => kubeconfig.contexts.iter().map(|c| c.name.clone()).collect(),
        };
        let mut names: Vec<String> = Vec::new();
        if patterns.is_empty() {
            names = universe.clone();
        }
        for pattern in patterns.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
            if is_glob(pattern) {
                let glob =
                    glob::Pattern::new(pattern).with_context(|| format!("`{pattern}` is not a valid context glob"))?;
                let matched: Vec<&String> = universe.iter().filter(|n| glob.matches(n)).collect();
                if matched.is_empty() {
                    bail!("no context matches `{pattern}` in {source}");
                }
                names.extend(matched.into_iter().cloned());
            } else {
                names.push(pattern.to_string());
            }
        }
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        let index = Index::of(kubeconfig);
        let clusters = names
            .into_iter()
            .map(|name| {
                let labels = fleet.and_then(|f| f.clusters.get(&name)).cloned().unwrap_or_default();
                let kubeconfig = index.contexts.get(name.as_str()).map(|ctx| index.single_context(ctx));
                Member { name, labels, kubeconfig }
            })
            .collect();
        Ok(Scope { source, clusters })
    }
}

/// A kubeconfig's entries by name, the first of each name as kube takes it: each member's
/// single-context kubeconfig is found by lookups, not by a scan of every cluster and user for
/// every context (4,000 contexts made that 16 million comparisons).
struct Index<'a> {
    contexts: HashMap<&'a str, &'a NamedContext>,
    clusters: HashMap<&'a str, &'a NamedCluster>,
    users: HashMap<&'a str, &'a NamedAuthInfo>,
}

impl<'a> Index<'a> {
    fn of(kubeconfig: &'a Kubeconfig) -> Index<'a> {
        fn first<'a, T>(items: &'a [T], name: impl Fn(&'a T) -> &'a str) -> HashMap<&'a str, &'a T> {
            let mut map = HashMap::with_capacity(items.len());
            for item in items {
                map.entry(name(item)).or_insert(item);
            }
            map
        }
        Index {
            contexts: first(&kubeconfig.contexts, |c| c.name.as_str()),
            clusters: first(&kubeconfig.clusters, |c| c.name.as_str()),
            users: first(&kubeconfig.auth_infos, |u| u.name.as_str()),
        }
    }

    fn single_context(&self, ctx: &NamedContext) -> Kubeconfig {
        let cluster = ctx.context.as_ref().and_then(|c| self.clusters.get(c.cluster.as_str()));
        let user = ctx.context.as_ref().and_then(|c| c.user.as_deref()).and_then(|u| self.users.get(u));
        Kubeconfig {
            clusters: cluster.map(|&c| c.clone()).into_iter().collect(),
            auth_infos: user.map(|&u| u.clone()).into_iter().collect(),
            contexts: vec![ctx.clone()],
            current_context: Some(ctx.name.clone()),
            ..Kubeconfig::default()
        }
    }
}

/// `~/.kube/config`, the home directory found as kube finds it (`HOME`, else the user's
/// account); none without a home directory, never a path relative to the working directory.
pub fn default_path() -> Option<PathBuf> {
    home::home_dir().map(|home| home.join(".kube").join("config"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(names: &[&str]) -> Kubeconfig {
        let mut yaml = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
        for n in names {
            yaml += &format!("- name: {n}\n  cluster: {{server: 'http://127.0.0.1:1/clusters/{n}'}}\n");
        }
        yaml += "users:\n";
        for n in names {
            yaml += &format!("- name: {n}\n  user: {{token: t}}\n");
        }
        yaml += "contexts:\n";
        for n in names {
            yaml += &format!("- name: {n}\n  context: {{cluster: {n}, user: {n}}}\n");
        }
        Kubeconfig::from_yaml(&yaml).unwrap()
    }

    fn names(s: &Scope) -> Vec<&str> {
        s.clusters.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn globs_names_and_missing_contexts() {
        let kc = kubeconfig(&["edge-1", "edge-2", "core-1"]);
        let s = Scope::select(&kc, "k".into(), &["edge-*".into()], None).unwrap();
        assert_eq!(names(&s), ["edge-1", "edge-2"]);
        let only = s.clusters[0].kubeconfig.as_ref().unwrap();
        assert_eq!((only.contexts.len(), only.clusters.len(), only.auth_infos.len()), (1, 1, 1));
        let s = Scope::select(&kc, "k".into(), &["core-1".into(), "edge-9".into()], None).unwrap();
        assert_eq!(names(&s), ["core-1", "edge-9"]);
        assert!(s.clusters[1].kubeconfig.is_none(), "a missing context stays in scope, absent");
        assert!(Scope::select(&kc, "k".into(), &["west-*".into()], None).is_err());
        assert_eq!(names(&Scope::select(&kc, "k".into(), &[], None).unwrap()).len(), 3);
    }

    /// One parse per process while the file is unchanged (a rollout reads its scope, then each
    /// cluster's records and workloads, from the same kubeconfig); a changed file is read again.
    #[test]
    fn the_kubeconfig_is_parsed_once_while_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let write = |names: &[&str]| {
            let kc = kubeconfig(names);
            std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();
        };
        write(&["edge-1", "edge-2"]);
        let (first, source) = read_kubeconfig(Some(&path)).unwrap();
        assert_eq!(source, path.display().to_string());
        let (again, _) = read_kubeconfig(Some(&path)).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "parsed twice");
        write(&["edge-1", "edge-2", "core-1"]);
        let (changed, _) = read_kubeconfig(Some(&path)).unwrap();
        assert_eq!(changed.contexts.len(), 3, "a changed file is read again");
        let missing = read_kubeconfig(Some(&dir.path().join("nope"))).unwrap_err();
        assert!(format!("{missing:#}").starts_with("could not read the kubeconfig "), "{missing:#}");
    }

    /// A step reads what its tool reads: every file of the `KUBECONFIG` its `env` sets (relative
    /// to the stack file), merged, the first naming a context winning; its `kubeconfig` over it.
    #[test]
    fn a_step_reads_every_file_of_its_kubeconfig_variable_and_its_own_key_first() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, names: &[&str]| {
            std::fs::write(dir.path().join(name), serde_json::to_string(&kubeconfig(names)).unwrap()).unwrap();
        };
        write("a.yaml", &["edge-1"]);
        write("b.yaml", &["edge-1", "edge-2"]);
        let ctx = StepContext {
            env: [("KUBECONFIG".to_string(), "a.yaml:missing.yaml:b.yaml".to_string())].into(),
            ..rdeploy_adapters::testing::step_context(dir.path())
        };
        let (kc, source) = read_step_kubeconfig(None, &ctx).unwrap();
        assert_eq!(source, "$KUBECONFIG (a.yaml:missing.yaml:b.yaml)");
        let names: Vec<&str> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["edge-1", "edge-2"], "both files merged, each context once");
        let (kc, source) = read_step_kubeconfig(Some(Path::new("a.yaml")), &ctx).unwrap();
        assert_eq!(source, dir.path().join("a.yaml").display().to_string());
        assert_eq!(kc.contexts.len(), 1);
    }

    #[test]
    fn a_fleet_file_defines_membership_and_labels() {
        let kc = kubeconfig(&["edge-1", "edge-2", "core-1"]);
        let fleet: FleetFile =
            rdeploy_adapters::yaml::from_str_located("clusters:\n  edge-1: {site: lyon}\n  edge-3: {site: oslo}\n")
                .unwrap();
        let s = Scope::select(&kc, "k".into(), &[], Some(&fleet)).unwrap();
        assert_eq!(names(&s), ["edge-1", "edge-3"]);
        assert_eq!(s.clusters[0].labels["site"], "lyon");
        assert!(s.clusters[1].kubeconfig.is_none());
    }
}

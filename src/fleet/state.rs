//! What the fleet commands remember between runs, under `<state dir>/fleet/`: when each cluster
//! last answered (`last-seen.json`, so an absent cluster says since when) and when each
//! component version was first seen in the fleet (`rollouts.json`, the start of its rollout,
//! which the SLO is measured from). Files are rewritten whole, through a temp file and a rename.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use time::OffsetDateTime;

use super::model::{Inventory, Presence};

pub fn fleet_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("fleet")
}

/// When each cluster last answered.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct LastSeen {
    #[serde(default)]
    pub clusters: BTreeMap<String, Timestamp>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Timestamp(#[serde(with = "time::serde::rfc3339")] pub OffsetDateTime);

impl LastSeen {
    pub fn path(state_dir: &Path) -> PathBuf {
        fleet_dir(state_dir).join("last-seen.json")
    }

    pub fn load(state_dir: &Path) -> LastSeen {
        read_json(&Self::path(state_dir)).unwrap_or_default()
    }

    pub fn get(&self, cluster: &str) -> Option<OffsetDateTime> {
        self.clusters.get(cluster).map(|t| t.0)
    }

    /// Marks every present cluster of the snapshot as seen at its time. The file is re-read
    /// first so a gate and an inventory running side by side do not drop each other's news.
    pub fn record(state_dir: &Path, inventory: &Inventory) -> anyhow::Result<()> {
        let mut current = Self::load(state_dir);
        for c in inventory.clusters.iter().filter(|c| c.presence == Presence::Present) {
            current.clusters.insert(c.name.clone(), Timestamp(inventory.taken_at));
        }
        write_json(&Self::path(state_dir), &current)
    }
}

/// When the rollout of each component version started.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Rollouts {
    /// component -> version -> start.
    #[serde(default)]
    pub components: BTreeMap<String, BTreeMap<String, RolloutStart>>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RolloutStart {
    #[serde(with = "time::serde::rfc3339")]
    pub started: OffsetDateTime,
    /// How the start is known: `first seen by rdeploy inventory`, or `--since`.
    pub source: String,
}

impl Rollouts {
    pub fn path(state_dir: &Path) -> PathBuf {
        fleet_dir(state_dir).join("rollouts.json")
    }

    pub fn load(state_dir: &Path) -> Rollouts {
        read_json(&Self::path(state_dir)).unwrap_or_default()
    }

    pub fn start(&self, component: &str, version: &str) -> Option<&RolloutStart> {
        self.components.get(component)?.get(version)
    }

    /// Records the versions this snapshot shows for the first time; returns whether any was new.
    pub fn note_new_versions(&mut self, inventory: &Inventory) -> bool {
        let mut changed = false;
        for w in inventory.clusters.iter().flat_map(|c| &c.workloads).filter(|w| w.is_live()) {
            for c in &w.containers {
                let versions = self.components.entry(c.component.clone()).or_default();
                if !versions.contains_key(&c.version) {
                    versions.insert(
                        c.version.clone(),
                        RolloutStart {
                            started: inventory.taken_at,
                            source: "first seen by `rdeploy inventory`".into(),
                        },
                    );
                    changed = true;
                }
            }
        }
        changed
    }

    pub fn save(&self, state_dir: &Path) -> anyhow::Result<()> {
        write_json(&Self::path(state_dir), self)
    }
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Option<T> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!("ignoring {}: {e}", path.display());
            None
        }
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let dir = path.parent().expect("state files live in a directory");
    fs_err::create_dir_all(dir)?;
    let tmp =
        dir.join(format!(".{}.{}.tmp", path.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    fs_err::write(&tmp, serde_json::to_vec_pretty(value)?)?;
    fs_err::rename(&tmp, path).with_context(|| format!("could not update {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::model::{ClusterInventory, Container, Kind, Workload};

    fn snapshot(at: OffsetDateTime, image: &str) -> Inventory {
        let mut present = ClusterInventory::absent("edge-1", String::new(), None);
        present.presence = Presence::Present;
        present.workloads.push(Workload {
            kind: Kind::Deployment,
            namespace: "n".into(),
            name: "w".into(),
            labels: Default::default(),
            containers: vec![Container::new("c", image)],
            pod: None,
            rollout: vec![],
            meta: Default::default(),
        });
        Inventory { taken_at: at, clusters: vec![present, ClusterInventory::absent("edge-2", "down".into(), None)] }
    }

    #[test]
    fn last_seen_and_rollout_starts_survive_runs() {
        let dir = tempfile::tempdir().unwrap();
        let t1 = time::macros::datetime!(2026-01-01 10:00 UTC);
        let t2 = time::macros::datetime!(2026-01-02 10:00 UTC);
        LastSeen::record(dir.path(), &snapshot(t1, "app:1")).unwrap();
        let seen = LastSeen::load(dir.path());
        assert_eq!(seen.get("edge-1"), Some(t1));
        assert_eq!(seen.get("edge-2"), None, "an absent cluster is never marked seen");

        let mut r = Rollouts::load(dir.path());
        assert!(r.note_new_versions(&snapshot(t1, "app:1")));
        assert!(r.note_new_versions(&snapshot(t2, "app:2")));
        assert!(!r.note_new_versions(&snapshot(t2, "app:1")));
        r.save(dir.path()).unwrap();
        let r = Rollouts::load(dir.path());
        assert_eq!(r.start("app", "1").unwrap().started, t1);
        assert_eq!(r.start("app", "2").unwrap().started, t2);
    }
}

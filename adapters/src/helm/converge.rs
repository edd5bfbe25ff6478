//! `up` for a helm step when its preview found the release in place: no upgrade, so no new
//! revision and no hooks. In place means the deployed revision is `deployed`, was made from the
//! same chart (its content digest, which names the chart and its version, as rdeploy wrote it in
//! the revision's description) with the same values, and every live object matches the server
//! side dry run ([`super::preview`]). The digest is what rdeploy computes here: helm keeps no
//! digest of a chart, so rdeploy writes `rdeploy: chart NAME-VERSION sha256:HEX` as the
//! description (`--description`) of every revision it makes, and a revision made another way
//! (a plain `helm upgrade`, a rollback) is not taken as in place: the next `up` upgrades it once.

use std::path::Path;

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::{HelmSpec, Release, DESCRIPTION_PREFIX, NEVER_IN_PLACE};
use crate::preview::Preview;
use crate::{Event, EventSink, Failure, StepContext};

impl HelmSpec {
    /// The description of a revision made from the step's chart as it is now: its
    /// `name-version` and content digest. `None` when the chart cannot be read here (a
    /// repository chart without a pinned `version`: its content is not known before helm
    /// fetches it, so it is never taken as in place).
    pub(super) fn chart_description(&self, ctx: &StepContext) -> Option<String> {
        let path = ctx.resolve(Path::new(&self.chart));
        let digest = if path.is_dir() {
            let mut files = Vec::new();
            collect_files(&path, &path, &mut files).ok()?;
            files.sort();
            let mut hasher = Sha256::new();
            for relative in files {
                let bytes = std::fs::read(path.join(&relative)).ok()?;
                hasher.update(relative.as_bytes());
                hasher.update([0]);
                hasher.update((bytes.len() as u64).to_le_bytes());
                hasher.update(&bytes);
            }
            hasher.finalize()
        } else if path.is_file() {
            Sha256::digest(std::fs::read(&path).ok()?)
        } else {
            // A repository or OCI chart: pinned by its reference and version (a repository that
            // republishes the same version is not seen, as in `rdeploy plan`).
            let version = self.version.as_ref()?;
            Sha256::digest(format!("{}@{version}", self.chart).as_bytes())
        };
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let name = self.wanted_chart(ctx).unwrap_or_else(|| self.chart.clone());
        Some(format!("{DESCRIPTION_PREFIX}{name} sha256:{hex}"))
    }

    /// The release is in place (the preview has no change): its revision stays, the outputs
    /// are read from it, and the revision is reported in place.
    pub(super) async fn converge_release(
        &self,
        ctx: &StepContext,
        preview: &Preview,
        sink: &dyn EventSink,
    ) -> Result<(), Failure> {
        use crate::Adapter as _;
        if preview.changes() > 0 {
            let never = preview.notes.iter().find_map(|n| n.strip_prefix(NEVER_IN_PLACE));
            if let Some(why) = never {
                sink.emit(Event::Fact { key: crate::NEVER_IN_PLACE_FACT.into(), value: why.into() });
            }
            return self.apply(ctx, sink).await;
        }
        // One read: the revision kept, for the record and the outputs (from its record in the
        // API, in-process; `helm get metadata` where the records cannot be read).
        let release = Release::open(self, ctx).await?;
        let Some(metadata) = release.metadata().await? else {
            // Gone since the preview read it: install it.
            return self.apply(ctx, sink).await;
        };
        let Some(revision) = metadata.get("revision").and_then(Value::as_u64) else {
            return Err(Failure::new(format!("release {} has no revision", self.release)));
        };
        let id = self.id(revision);
        sink.emit(Event::Planned { ids: vec![id.clone()] });
        sink.emit(Event::Fact { key: "revision".into(), value: revision.into() });
        if let Some(status) = metadata.get("status").cloned() {
            if status == "deployed" {
                // The revision kept is the one to roll back to should its readiness fail.
                sink.emit(Event::Fact { key: "last_deployed_revision".into(), value: revision.into() });
            }
            sink.emit(Event::Fact { key: "status".into(), value: status });
        }
        sink.emit(Event::InPlace {
            id,
            note: Some("same chart, values and live objects as deployed: no upgrade".into()),
        });
        sink.emit(Event::Outputs { values: super::release_outputs(&metadata) });
        Ok(())
    }
}

/// Every regular file under `dir` (symlinks followed), as a path relative to `root`.
fn collect_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let meta = std::fs::metadata(&path)?;
        if meta.is_dir() {
            collect_files(root, &path, out)?;
        } else if meta.is_file() {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            out.push(relative.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(dir: &Path) -> StepContext {
        StepContext {
            step: "app".into(),
            stack: "t".into(),
            work_dir: dir.join("w"),
            ..crate::testing::step_context(dir)
        }
    }

    #[test]
    fn the_description_changes_with_any_file_of_the_chart() {
        let dir = tempfile::tempdir().unwrap();
        let chart = dir.path().join("c");
        std::fs::create_dir_all(chart.join("templates")).unwrap();
        std::fs::write(chart.join("Chart.yaml"), "apiVersion: v2\nname: c\nversion: 1.0.0\n").unwrap();
        std::fs::write(chart.join("templates/cm.yaml"), "kind: ConfigMap\n").unwrap();
        let spec: HelmSpec = serde_json::from_value(serde_json::json!({"release": "r", "chart": "c"})).unwrap();
        let ctx = ctx(dir.path());
        let first = spec.chart_description(&ctx).unwrap();
        assert!(first.starts_with("rdeploy: chart c-1.0.0 sha256:"), "{first}");
        assert_eq!(spec.chart_description(&ctx).unwrap(), first, "the same content gives the same digest");
        std::fs::write(chart.join("templates/cm.yaml"), "kind: ConfigMap # edited\n").unwrap();
        assert_ne!(spec.chart_description(&ctx).unwrap(), first, "a template edit is another chart");
        let remote: HelmSpec = serde_json::from_value(serde_json::json!({"release": "r", "chart": "repo/x"})).unwrap();
        assert_eq!(remote.chart_description(&ctx), None, "an unpinned repository chart is never known");
    }
}

//! A fleet step as the engine runs it: [`FleetAdapter`], an [`Adapter`] wrapping the step's
//! tool that runs it once per cluster, in waves ([`super::run`]), so that the engine calls a
//! fleet step as it calls any other and never asks whether it is one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rdeploy_adapters::preview::{Observed, PreviewError};
use rdeploy_adapters::{
    Adapter, AdapterError, Converged, DeclaredSubChange, DescribeContext, EventSink, Failure, FieldPath, Inspection,
    KubeTarget, Preview, PriorStep, Recovered, RecoveryDoc, SpecProblem, StepContext, SubStatus, ToolInfo,
};

use super::{dry_run, run, runbook, FleetRun};
use crate::stack::{FleetStep, Step};

/// What a fleet step's `recover --dry-run` says before its rollout started: the checkpoint
/// holds no wave yet, and no cluster is asked.
const NOT_STARTED: &str = "runs once per cluster in scope, wave by wave";

/// A fleet step (`contexts:` / `fleet:`) as an [`Adapter`]: `apply`, `converge` and `recover`
/// run the rollout, each cluster through the step's own tool adapter with the cluster's
/// context; `inspect` and `describe_recovery` answer from the checkpoint (no cluster is asked).
/// What is read before anything runs (the step's problems, its paths, its tool's preflight) is
/// the tool's. `preview` is the tool's too, against the kube context the tool picks by itself:
/// `plan` shows that, and a reviewed plan refuses fleet steps
/// ([`crate::planfile::refuse_fleet_steps`]).
///
/// It is made from a parsed step to run it: the typed values and secrets the stack writes
/// ([`Adapter::typed_values_mut`], [`Adapter::marked_mut`]) are in the step's spec already, so
/// it answers those with the defaults.
pub struct FleetAdapter<'a> {
    step: &'a Step,
    fleet: &'a FleetStep,
    /// Where the fleet's records are kept (last-seen times and rollout starts), shared by the
    /// stacks beside one another.
    records: &'a Path,
}

impl<'a> FleetAdapter<'a> {
    pub fn new(step: &'a Step, fleet: &'a FleetStep, records: &'a Path) -> FleetAdapter<'a> {
        FleetAdapter { step, fleet, records }
    }

    /// The rollout from where `prior` left it (empty: from its first wave). `converge`: a
    /// cluster whose own preview finds it in place is done without its tool applying anything.
    async fn rollout(
        &self,
        ctx: &StepContext,
        prior: &PriorStep,
        converge: bool,
        sink: &dyn EventSink,
    ) -> Result<Recovered, Failure> {
        let run_of = FleetRun { step: self.step, fleet: self.fleet, ctx, prior, state_dir: self.records, converge };
        run(run_of, sink).await
    }
}

impl<'a> Adapter for FleetAdapter<'a> {
    fn problems(&self) -> Vec<SpecProblem> {
        self.step.spec.problems()
    }

    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        self.step.spec.referenced_paths()
    }

    fn problems_beside(&self, dir: &Path, env: &BTreeMap<String, String>) -> Vec<SpecProblem> {
        self.step.spec.problems_beside(dir, env)
    }

    fn default_resumable(&self) -> bool {
        self.step.spec.default_resumable()
    }

    fn typed_values_key(&self) -> Option<&'static str> {
        self.step.spec.typed_values_key()
    }

    fn pinned_paths(&self, stack_dir: &Path, revert: Option<&str>) -> Vec<PathBuf> {
        self.step.spec.pinned_paths(stack_dir, revert)
    }

    fn kube_target(&self) -> Option<KubeTarget<'_>> {
        self.step.spec.kube_target()
    }

    async fn preflight(&self, ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        self.step.spec.preflight(ctx).await
    }

    async fn preflight_for_run(&self, ctx: &StepContext) -> Result<Option<ToolInfo>, AdapterError> {
        self.step.spec.preflight_for_run(ctx).await
    }

    /// The rollout from its first wave. It ends `Complete` or fails: a cluster that its tool's
    /// own recovery rolled back is a failed cluster, never a step rolled back.
    async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        self.rollout(ctx, &PriorStep::default(), false, sink).await.map(|_| ())
    }

    /// The rollout resumed: the done clusters are never applied again; the stragglers, the
    /// failed clusters and the waves not reached are.
    async fn recover(&self, ctx: &StepContext, prior: &PriorStep, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        self.rollout(ctx, prior, false, sink).await
    }

    /// From the checkpoint alone, no cluster asked: per wave, the clusters done and those left.
    async fn inspect(&self, _ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        if prior.sub_changes.is_empty() && prior.facts.is_empty() {
            return Ok(Inspection { actions: vec![NOT_STARTED.to_string()], remaining: Vec::new() });
        }
        let remaining =
            prior.sub_changes.iter().filter(|c| c.status != SubStatus::Done).map(|c| c.id.clone()).collect();
        Ok(Inspection { actions: dry_run(prior), remaining })
    }

    async fn preview(&self, ctx: &StepContext) -> Result<Preview, PreviewError> {
        self.step.spec.preview(ctx).await
    }

    async fn observe(&self, ctx: &StepContext) -> Result<Vec<Observed>, PreviewError> {
        self.step.spec.observe(ctx).await
    }

    /// Each cluster previews its own when its turn comes.
    fn converges_by_preview(&self) -> bool {
        false
    }

    /// The rollout from its first wave, each cluster taking its own decision.
    async fn converge(&self, ctx: &StepContext, _preview: &Preview, sink: &dyn EventSink) -> Result<(), Failure> {
        self.rollout(ctx, &PriorStep::default(), true, sink).await.map(|_| ())
    }

    /// [`Adapter::converge`]. The step counts as applied even when every cluster was found in
    /// place: each such cluster is reported in place as its own sub-change, and the step records
    /// no `in_place` fact of its own.
    async fn converge_step(
        &self,
        ctx: &StepContext,
        _decided: Option<Preview>,
        sink: &dyn EventSink,
    ) -> Result<Converged, Failure> {
        self.rollout(ctx, &PriorStep::default(), true, sink).await.map(|_| Converged::Applied)
    }

    fn reapplies(&self) -> Option<&'static str> {
        self.step.spec.reapplies()
    }

    /// The tool's: a fleet step's sub-changes are its clusters, found as it runs.
    fn declared_sub_changes(&self) -> Vec<DeclaredSubChange<'_>> {
        self.step.spec.declared_sub_changes()
    }

    /// The tool's, for the cluster placeholder the runbook's notes explain ([`runbook::CLUSTER`]).
    fn cluster_rollback(&self, ctx: Option<&StepContext>) -> Option<String> {
        super::spec_for_cluster(&self.step.spec, runbook::CLUSTER).cluster_rollback(ctx)
    }

    /// The tool's commands for one cluster: the first one in trouble (failed, else started,
    /// else pending), else a placeholder the notes explain.
    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        let cluster = prior
            .and_then(|p| {
                let troubled = |st: SubStatus| p.sub_changes.iter().find(|c| c.status == st);
                troubled(SubStatus::Failed).or(troubled(SubStatus::Started)).or(troubled(SubStatus::Pending))
            })
            .map(|c| c.id.clone())
            .unwrap_or_else(|| runbook::CLUSTER.to_string());
        runbook::doc(self.step, ctx, &cluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdeploy_adapters::PriorSubChange;
    use serde_json::json;

    /// A helm fleet step `agent` on `edge-*`, in `dir` with its chart.
    fn stack(dir: &Path) -> crate::stack::Stack {
        let chart = dir.join("charts/agent/Chart.yaml");
        std::fs::create_dir_all(chart.parent().expect("a file in a directory")).expect("a temporary directory");
        std::fs::write(&chart, "apiVersion: v2\nname: agent\nversion: 0.1.0\n").expect("a temporary file");
        let text = "name: s\nsteps:\n  - name: agent\n    tool: helm\n    release: agent\n    chart: charts/agent\n    namespace: monitoring\n    contexts: [\"edge-*\"]\n";
        crate::stack::parse(&dir.join("stack.yaml"), text).expect("the stack parses")
    }

    /// A rollout journaled as two waves, the first done and baked, edge-2 failed in the second.
    fn prior() -> PriorStep {
        let sub = |id: &str, status| PriorSubChange { id: id.into(), status, error: None };
        PriorStep {
            sub_changes: vec![
                sub("edge-1", SubStatus::Done),
                sub("edge-2", SubStatus::Failed),
                sub("edge-3", SubStatus::Pending),
            ],
            facts: [
                ("rollout".to_string(), json!({ "waves": [["edge-1"], ["edge-2", "edge-3"]] })),
                ("waves_baked".to_string(), json!(1)),
            ]
            .into_iter()
            .collect(),
        }
    }

    fn ctx(dir: &Path) -> StepContext {
        StepContext {
            step: "agent".into(),
            stack: "s".into(),
            // No kubeconfig: a cluster asked would be an error, not an answer.
            env: [("KUBECONFIG".to_string(), dir.join("missing").display().to_string())].into_iter().collect(),
            ..rdeploy_adapters::testing::step_context(dir)
        }
    }

    #[tokio::test]
    async fn inspect_answers_from_the_checkpoint_alone() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let stack = stack(dir.path());
        let step = stack.step("agent").expect("the step");
        let adapter = FleetAdapter::new(step, step.fleet.as_ref().expect("a fleet step"), dir.path());
        let ctx = ctx(dir.path());

        let fresh = adapter.inspect(&ctx, &PriorStep::default()).await.expect("no cluster is asked");
        assert_eq!(fresh.actions, [NOT_STARTED]);
        assert!(fresh.remaining.is_empty());

        let resumed = adapter.inspect(&ctx, &prior()).await.expect("no cluster is asked");
        assert_eq!(
            resumed.actions,
            ["wave 1 of 2: 1/1 clusters done; done", "wave 2 of 2: 0/2 clusters done; to apply: edge-2, edge-3"]
        );
        assert_eq!(resumed.remaining, ["edge-2", "edge-3"]);
        assert!(!adapter.converges_by_preview(), "each cluster previews its own");
    }

    #[test]
    fn describe_recovery_names_the_first_cluster_in_trouble_else_a_placeholder() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let stack = stack(dir.path());
        let step = stack.step("agent").expect("the step");
        let adapter = FleetAdapter::new(step, step.fleet.as_ref().expect("a fleet step"), dir.path());
        let ctx = DescribeContext { step: "agent", stack_file: "stack.yaml", stack_dir: ".", resumable: true };
        let rollback = |doc: RecoveryDoc| -> String {
            doc.notes.into_iter().find(|n| n.starts_with("roll back one cluster")).expect("a rollback note")
        };
        let failed = rollback(adapter.describe_recovery(&ctx, Some(&prior())));
        assert!(failed.contains("helm history agent -n monitoring --kube-context edge-2"), "{failed}");
        let none = rollback(adapter.describe_recovery(&ctx, None));
        assert!(none.contains(&format!("--kube-context {}", runbook::CLUSTER)), "{none}");
    }

    #[test]
    fn one_clusters_spec_targets_its_context_and_waits_unless_the_step_says_not() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let manifest = dir.path().join("k8s/app.yaml");
        std::fs::create_dir_all(manifest.parent().expect("a file in a directory")).expect("a temporary directory");
        std::fs::write(&manifest, "").expect("a temporary file");
        let text = "name: s\nsteps:\n  - name: app\n    tool: kubectl\n    manifests: [k8s/app.yaml]\n    kubeconfig: kube.yaml\n    wait: false\n    contexts: [edge-1]\n";
        std::fs::write(dir.path().join("kube.yaml"), "").expect("a temporary file");
        let app = crate::stack::parse(&dir.path().join("stack.yaml"), text).expect("the stack parses");
        let app = app.step("app").expect("the step");
        assert_eq!(
            app.spec.kube_target(),
            Some(KubeTarget { kubeconfig: Some(Path::new("kube.yaml")), namespace: None })
        );
        let rdeploy_adapters::ToolSpec::Kubectl(one) = super::super::spec_for_cluster(&app.spec, "edge-1") else {
            panic!("a kubectl step")
        };
        assert_eq!((one.context.as_deref(), one.wait), (Some("edge-1"), Some(false)), "`wait: false` is kept");

        let stack = stack(dir.path());
        let agent = stack.step("agent").expect("the step");
        assert_eq!(agent.spec.kube_target(), Some(KubeTarget { kubeconfig: None, namespace: Some("monitoring") }));
        let rdeploy_adapters::ToolSpec::Helm(one) = super::super::spec_for_cluster(&agent.spec, "edge-2") else {
            panic!("a helm step")
        };
        assert_eq!((one.context.as_deref(), one.wait), (Some("edge-2"), Some(true)), "waits by default");
    }
}

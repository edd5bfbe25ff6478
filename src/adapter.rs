//! The adapter a step runs through: [`StepAdapter`], its tool's own, or for a fleet step the
//! rollout's ([`crate::rollout::adapter::FleetAdapter`]), which runs the tool's once per
//! cluster. The engine and the runbook call a step only through it, so none of them asks
//! whether a step is a fleet step to decide how to run, preview, inspect or describe it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rdeploy_adapters::preview::{Observed, PreviewError};
use rdeploy_adapters::{
    Adapter, AdapterError, Converged, DeclaredSubChange, DescribeContext, EventSink, Failure, FieldPath, Inspection,
    KubeTarget, Preview, PriorStep, Recovered, RecoveryDoc, SpecProblem, StepContext, ToolInfo, ToolSpec,
};

use crate::rollout::adapter::FleetAdapter;
use crate::stack::Step;

/// A step's adapter, chosen once from the step ([`StepAdapter::of`]).
///
/// It is made from a parsed step to run it: the typed values and secrets the stack writes
/// ([`Adapter::typed_values_mut`], [`Adapter::marked_mut`]) are in the step's spec already, so
/// it answers those with the defaults.
pub enum StepAdapter<'a> {
    /// A step on one target: its tool's adapter.
    Tool(&'a ToolSpec),
    /// A step with `contexts:` / `fleet:`: its tool's adapter once per cluster, in waves.
    Fleet(FleetAdapter<'a>),
}

impl<'a> StepAdapter<'a> {
    /// The adapter `step` runs through. `records`: the directory of the fleet's records
    /// (last-seen times and rollout starts), shared by the stacks beside one another.
    pub fn of(step: &'a Step, records: &'a Path) -> StepAdapter<'a> {
        match &step.fleet {
            Some(fleet) => StepAdapter::Fleet(FleetAdapter::new(step, fleet, records)),
            None => StepAdapter::Tool(&step.spec),
        }
    }

    /// What one checkpointed sub-change of the step is, in words for runbooks.
    pub fn sub_change_noun(&self) -> &'static str {
        match self {
            StepAdapter::Tool(spec) => spec.tool().sub_change_noun(),
            StepAdapter::Fleet(_) => "cluster (its kube context)",
        }
    }
}

/// Calls the same method on whichever adapter this is.
macro_rules! dispatch {
    ($self:expr, $a:ident => $call:expr) => {
        match $self {
            StepAdapter::Tool($a) => $call,
            StepAdapter::Fleet($a) => $call,
        }
    };
}

impl<'a> Adapter for StepAdapter<'a> {
    fn problems(&self) -> Vec<SpecProblem> {
        dispatch!(self, a => a.problems())
    }

    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        dispatch!(self, a => a.referenced_paths())
    }

    fn problems_beside(&self, dir: &Path, env: &BTreeMap<String, String>) -> Vec<SpecProblem> {
        dispatch!(self, a => a.problems_beside(dir, env))
    }

    fn default_resumable(&self) -> bool {
        dispatch!(self, a => a.default_resumable())
    }

    fn typed_values_key(&self) -> Option<&'static str> {
        dispatch!(self, a => a.typed_values_key())
    }

    fn kube_target(&self) -> Option<KubeTarget<'_>> {
        dispatch!(self, a => a.kube_target())
    }

    async fn preflight(&self, ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        dispatch!(self, a => a.preflight(ctx).await)
    }

    async fn preflight_for_run(&self, ctx: &StepContext) -> Result<Option<ToolInfo>, AdapterError> {
        dispatch!(self, a => a.preflight_for_run(ctx).await)
    }

    async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        dispatch!(self, a => a.apply(ctx, sink).await)
    }

    async fn recover(&self, ctx: &StepContext, prior: &PriorStep, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        dispatch!(self, a => a.recover(ctx, prior, sink).await)
    }

    async fn inspect(&self, ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        dispatch!(self, a => a.inspect(ctx, prior).await)
    }

    async fn read_outputs(&self, ctx: &StepContext) -> Result<Option<rdeploy_adapters::outputs::Outputs>, Failure> {
        dispatch!(self, a => a.read_outputs(ctx).await)
    }

    async fn preview(&self, ctx: &StepContext) -> Result<Preview, PreviewError> {
        dispatch!(self, a => a.preview(ctx).await)
    }

    async fn decision_preview(&self, ctx: &StepContext) -> Result<Preview, PreviewError> {
        dispatch!(self, a => a.decision_preview(ctx).await)
    }

    fn volatile_outputs(&self) -> &'static [&'static str] {
        dispatch!(self, a => a.volatile_outputs())
    }

    async fn observe(&self, ctx: &StepContext) -> Result<Vec<Observed>, PreviewError> {
        dispatch!(self, a => a.observe(ctx).await)
    }

    async fn converge(&self, ctx: &StepContext, preview: &Preview, sink: &dyn EventSink) -> Result<(), Failure> {
        dispatch!(self, a => a.converge(ctx, preview, sink).await)
    }

    fn converges_by_preview(&self) -> bool {
        dispatch!(self, a => a.converges_by_preview())
    }

    async fn converge_step(
        &self,
        ctx: &StepContext,
        decided: Option<Preview>,
        sink: &dyn EventSink,
    ) -> Result<Converged, Failure> {
        dispatch!(self, a => a.converge_step(ctx, decided, sink).await)
    }

    fn in_place_keeps_last_outputs(&self) -> bool {
        dispatch!(self, a => a.in_place_keeps_last_outputs())
    }

    fn pinned_paths(&self, stack_dir: &Path, revert: Option<&str>) -> Vec<PathBuf> {
        dispatch!(self, a => a.pinned_paths(stack_dir, revert))
    }

    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        dispatch!(self, a => a.describe_recovery(ctx, prior))
    }

    fn reapplies(&self) -> Option<&'static str> {
        dispatch!(self, a => a.reapplies())
    }

    fn declared_sub_changes(&self) -> Vec<DeclaredSubChange<'_>> {
        dispatch!(self, a => a.declared_sub_changes())
    }

    fn cluster_rollback(&self, ctx: Option<&StepContext>) -> Option<String> {
        dispatch!(self, a => a.cluster_rollback(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STACK: &str = r#"name: s
steps:
  - name: net
    tool: terraform
    dir: infra
  - name: hosts
    tool: ansible
    playbook: site.yml
    inventory: hosts.ini
  - name: app
    tool: helm
    release: app
    chart: charts/app
  - name: extras
    tool: kubectl
    manifests: [k8s/extras.yaml]
  - name: seed
    tool: shell
    sub_changes:
      - { name: a, run: "true" }
  - name: agent
    tool: helm
    release: agent
    chart: charts/agent
    contexts: ["edge-*"]
"#;

    /// The stack, in `dir` with the files its steps name.
    fn stack(dir: &Path) -> crate::stack::Stack {
        for (rel, text) in [
            ("infra/main.tf", ""),
            ("site.yml", "- hosts: all\n"),
            ("hosts.ini", "localhost\n"),
            ("charts/app/Chart.yaml", "apiVersion: v2\nname: app\nversion: 0.1.0\n"),
            ("charts/agent/Chart.yaml", "apiVersion: v2\nname: agent\nversion: 0.1.0\n"),
            ("k8s/extras.yaml", ""),
        ] {
            let path = dir.join(rel);
            std::fs::create_dir_all(path.parent().expect("a file in a directory")).expect("a temporary directory");
            std::fs::write(path, text).expect("a temporary file");
        }
        crate::stack::parse(&dir.join("stack.yaml"), STACK).expect("the stack parses")
    }

    /// What the engine asks of each step's adapter, answered by the tool's adapter, or for a
    /// fleet step by the rollout's.
    #[test]
    fn each_step_answers_through_its_own_adapter_and_a_fleet_step_through_the_rollouts() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let stack = stack(dir.path());
        let records = dir.path().join(".rdeploy");
        let records = records.as_path();
        type Answers<'a> = (&'a str, bool, bool, Option<&'a str>, &'a str, bool, usize, bool);
        let answers: Vec<Answers<'_>> = stack
            .ordered()
            .map(|step| {
                let a = StepAdapter::of(step, records);
                let fleet = matches!(a, StepAdapter::Fleet(_));
                assert_eq!(fleet, step.name == "agent", "step `{}`", step.name);
                (
                    step.name.as_str(),
                    a.converges_by_preview(),
                    a.in_place_keeps_last_outputs(),
                    a.typed_values_key(),
                    a.sub_change_noun(),
                    a.reapplies().is_some(),
                    a.declared_sub_changes().len(),
                    a.cluster_rollback(None).is_some_and(|how| how.contains("--kube-context CLUSTER")),
                )
            })
            .collect();
        assert_eq!(
            answers,
            [
                ("net", true, false, Some("vars"), "resource address", false, 0, false),
                ("hosts", false, false, Some("extra_vars"), "host", false, 0, false),
                ("app", true, false, Some("set"), "release revision", true, 0, false),
                ("extras", true, false, None, "object (kind/namespace/name)", false, 0, false),
                ("seed", true, true, None, "declared sub-change", false, 1, false),
                ("agent", false, false, Some("set"), "cluster (its kube context)", true, 0, true),
            ]
        );
    }
}

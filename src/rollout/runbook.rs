//! The runbook section of a fleet step: its waves and stop rule, and the exact commands to
//! inspect, resume or roll back one cluster, the tool's own commands with that cluster's
//! context (`CLUSTER` in the static runbook, the cluster in trouble in the live one).

use rdeploy_adapters::{Adapter, DescribeContext, RecoveryDoc};

use super::spec_for_cluster;
use crate::stack::{AbsentPolicy, FleetStep, MaxFailures, Step, WaveSize};

/// The placeholder for a cluster's context in the static runbook.
pub const CLUSTER: &str = "CLUSTER";

/// The step's settings as runbook lines: scope, waves, parallel, bake, stop rule, absent rule.
pub fn settings(fleet: &FleetStep) -> Vec<(&'static str, String)> {
    let r = &fleet.rollout;
    let mut out = Vec::new();
    let mut scope = Vec::new();
    if !fleet.contexts.is_empty() {
        scope.push(format!(
            "contexts {}",
            fleet.contexts.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(file) = &fleet.fleet_file {
        scope.push(format!("the clusters of `{}`", file.display()));
    }
    if let Some(sel) = &fleet.selector {
        scope.push(format!("whose labels match `{sel}`"));
    }
    out.push(("fleet", format!("once per cluster: {}", scope.join(", "))));
    let waves: Vec<String> = r
        .waves
        .iter()
        .map(|w| match w {
            WaveSize::Count(n) => n.to_string(),
            WaveSize::Percent(p) => format!("{p}%"),
        })
        .collect();
    out.push((
        "waves",
        format!(
            "{} (cumulative, in the fleet file's order, else by context name; the last wave takes every cluster left), {} cluster{} at a time",
            waves.join(", "),
            r.parallel,
            if r.parallel == 1 { "" } else { "s" }
        ),
    ));
    if !r.bake.is_zero() {
        out.push((
            "bake",
            format!(
                "{} after each wave but the last, then its clusters are read again: the next wave starts only if they are still healthy",
                humantime::format_duration(r.bake)
            ),
        ));
    }
    let more = match r.max_failures {
        MaxFailures::Count(1) => "more than 1 failed cluster stops".to_string(),
        MaxFailures::Count(n) => format!("more than {n} failed clusters stop"),
        MaxFailures::Percent(p) => format!("more failed clusters than {p}% of those in scope (rounded down) stop"),
    };
    out.push((
        "stop rule",
        format!("{more} the rollout before the next wave (`max_failures`): no cluster of a later wave is touched"),
    ));
    out.push((
        "absent clusters",
        match r.absent {
            AbsentPolicy::Skip => format!(
                "no answer within {} (or no context): a straggler, not a failure; the deploy ends partial (exit 1) and `rdeploy recover` applies it once it answers",
                humantime::format_duration(r.inventory_timeout)
            ),
            AbsentPolicy::Wait => "waited for, up to the step's `timeout`; then a straggler (exit 1) that `rdeploy recover` applies once it answers".into(),
        },
    ));
    if let Some(slo) = &fleet.slo {
        out.push(("slo", format!("`{slo}`, measured from the rollout's journaled start")));
    }
    out
}

/// The recovery doc of a fleet step, for one cluster (`cluster`, or [`CLUSTER`]).
pub fn doc(step: &Step, ctx: &DescribeContext<'_>, cluster: &str) -> RecoveryDoc {
    let one = spec_for_cluster(&step.spec, cluster);
    let inner = one.describe_recovery(ctx, None);
    let stack = ctx.stack_file;
    let mut doc = RecoveryDoc::default();
    doc.inspect.push(format!(
        "rdeploy status {stack} --json | jq '.steps[] | select(.name == \"{}\") | .sub_changes[] | select(.status != \"done\")'    # the clusters not done, with why",
        step.name
    ));
    doc.inspect.extend(inner.inspect);
    doc.recover.push(format!("rdeploy recover {stack}"));
    doc.verify = inner.verify;
    let placeholder = if cluster == CLUSTER {
        "; `CLUSTER` is the cluster's context, its sub-change id in `rdeploy status`".to_string()
    } else {
        String::new()
    };
    doc.notes.push(format!(
        "`rdeploy recover` resumes the rollout: the stragglers that answer now and the failed clusters, then the waves not reached; a done cluster is never applied again{placeholder}"
    ));
    // The tool's own rollback (`inner.rollback`) is the step's: this one names the cluster. Its
    // commands name the step's files as written, relative to the stack's directory, as the
    // step's other commands do from a `cd` there.
    if let Some(how) = one.cluster_rollback(None) {
        doc.notes.push(format!(
            "roll back one cluster, from `cd {}`: {how} (the checkpoint still records the cluster done)",
            rdeploy_adapters::shell_quote(ctx.stack_dir)
        ));
    }
    doc.notes.extend(inner.notes);
    doc
}

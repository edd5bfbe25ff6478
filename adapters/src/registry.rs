//! The registry of tools: which [`Tool`] a step names, the spec each tool deserializes into
//! ([`ToolSpec`]), the keys each accepts, and dispatch of the [`Adapter`] contract to them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::contract::{
    Adapter, AdapterError, DescribeContext, EventSink, Failure, FieldPath, Inspection, PriorStep, Recovered,
    RecoveryDoc, SpecProblem, StepContext, ToolInfo,
};
use crate::preview::{Preview, PreviewError};
use crate::secrets::{Marked, Registry, RegistrySink, SecretError};
use crate::{ansible, helm, kubectl, shell, terraform, yaml};

/// The tools rdeploy drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Terraform,
    Ansible,
    Helm,
    Kubectl,
    Shell,
}

impl Tool {
    pub const ALL: [Tool; 5] = [Tool::Terraform, Tool::Ansible, Tool::Helm, Tool::Kubectl, Tool::Shell];

    pub fn as_str(self) -> &'static str {
        match self {
            Tool::Terraform => "terraform",
            Tool::Ansible => "ansible",
            Tool::Helm => "helm",
            Tool::Kubectl => "kubectl",
            Tool::Shell => "shell",
        }
    }

    pub fn parse(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// What one checkpointed sub-change is for this tool, in words for reports and runbooks.
    pub fn sub_change_noun(self) -> &'static str {
        match self {
            Tool::Terraform => "resource address",
            Tool::Ansible => "host",
            Tool::Helm => "release revision",
            Tool::Kubectl => "object (kind/namespace/name)",
            Tool::Shell => "declared sub-change",
        }
    }
}

impl Tool {
    /// `1 release revision`, `2 objects`: a count of this tool's sub-changes, for reports.
    pub fn count_of(self, n: usize) -> String {
        if n != 1 {
            return format!("{n} {}", self.sub_change_plural());
        }
        let one = match self {
            Tool::Terraform => "resource address",
            Tool::Ansible => "host",
            Tool::Helm => "release revision",
            Tool::Kubectl => "object",
            Tool::Shell => "declared sub-change",
        };
        format!("1 {one}")
    }

    /// The plural of [`Tool::sub_change_noun`], for counts.
    pub fn sub_change_plural(self) -> &'static str {
        match self {
            Tool::Terraform => "resource addresses",
            Tool::Ansible => "hosts",
            Tool::Helm => "release revisions",
            Tool::Kubectl => "objects",
            Tool::Shell => "declared sub-changes",
        }
    }

    /// Whether a step of this tool can run once per cluster of a fleet (`contexts:`,
    /// `fleet:`): the tools that talk to a Kubernetes cluster.
    pub fn runs_per_cluster(self) -> bool {
        matches!(self, Tool::Helm | Tool::Kubectl)
    }
}

impl std::fmt::Display for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A step's tool-specific settings, deserialized from the stack file. The stack module hands
/// each tool's spec a node of just its own keys, so `deny_unknown_fields` names the offending key.
#[derive(Clone, Debug)]
pub enum ToolSpec {
    Terraform(terraform::TerraformSpec),
    Ansible(ansible::AnsibleSpec),
    Helm(helm::HelmSpec),
    Kubectl(kubectl::KubectlSpec),
    Shell(shell::ShellSpec),
}

/// Calls the same method on whichever tool's spec this is.
macro_rules! dispatch {
    ($self:expr, $spec:ident => $call:expr) => {
        match $self {
            ToolSpec::Terraform($spec) => $call,
            ToolSpec::Ansible($spec) => $call,
            ToolSpec::Helm($spec) => $call,
            ToolSpec::Kubectl($spec) => $call,
            ToolSpec::Shell($spec) => $call,
        }
    };
}

impl ToolSpec {
    /// The tool these settings are for.
    pub fn tool(&self) -> Tool {
        match self {
            ToolSpec::Terraform(_) => Tool::Terraform,
            ToolSpec::Ansible(_) => Tool::Ansible,
            ToolSpec::Helm(_) => Tool::Helm,
            ToolSpec::Kubectl(_) => Tool::Kubectl,
            ToolSpec::Shell(_) => Tool::Shell,
        }
    }

    /// Points a fleet cluster's tool (helm, kubectl) at a kubeconfig holding only `context`,
    /// cut from the files the step reads ([`crate::kubeconfig::one_context`]) and kept in memory
    /// behind `ctx.work_dir/kubeconfig` ([`crate::secrets::SecretFile`]: credentials never at
    /// rest) for as long as the returned value is held. A fleet's kubeconfig names every cluster,
    /// and the tool parses all of it on every start: at 400 contexts 0.9 s of CPU per
    /// `helm upgrade`. `None` (other tools, a kubeconfig the cut cannot read, a user whose
    /// legacy `auth-provider` writes refreshed tokens back into the file it read, or no memory
    /// file to be had): the tool reads the user's files, as a single-cluster step does.
    pub fn use_own_kubeconfig(&mut self, ctx: &StepContext, context: &str) -> Option<OwnKubeconfig> {
        let (kubeconfig, slot) = match self {
            ToolSpec::Helm(h) => (h.kubeconfig.clone(), &mut h.cluster_kubeconfig),
            ToolSpec::Kubectl(k) => (k.kubeconfig.clone(), &mut k.cluster_kubeconfig),
            _ => return None,
        };
        let made = crate::kubeconfig::one_context(&crate::kubeconfig::files(kubeconfig.as_deref(), ctx), context)
            .and_then(|doc| match doc["users"].get(0).and_then(|u| u["user"].get("auth-provider")) {
                Some(_) => Err("its user has an `auth-provider`, which writes refreshed tokens back".to_string()),
                None => Ok(doc),
            })
            .and_then(|doc| {
                crate::secrets::SecretFile::write(&ctx.work_dir, "kubeconfig", &doc).map_err(|e| e.to_string())
            })
            .and_then(|file| match file.in_memory() {
                true => Ok(file),
                false => Err("no memory file to hold it in".to_string()),
            });
        match made {
            Ok(file) => {
                *slot = Some(file.path().to_path_buf());
                Some(OwnKubeconfig { _file: file })
            }
            Err(why) => {
                tracing::debug!(context, %why, "the cluster's tool reads the whole kubeconfig");
                None
            }
        }
    }

    /// Reads every value the step marks secret ([`Adapter::marked_mut`]) and puts it in the
    /// values the tool gets ([`Adapter::typed_values_mut`]), registering each with `registry`.
    /// Called when the step starts, so a missing variable or file fails the step before its tool
    /// starts; the error names the key and the source.
    pub fn resolve_secrets(
        &mut self,
        stack_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
        registry: &Registry,
    ) -> Result<(), (String, SecretError)> {
        let mut resolved = Vec::new();
        // Values secret by their name are the run's secrets too, so the driver redacts them.
        if let Some((_, values)) = self.typed_values_mut() {
            registry.add_strings(crate::secrets::secret_strings(values, &BTreeMap::new()));
        }
        let Some(marked) = self.marked_mut() else { return Ok(()) };
        for (key, entry) in marked.iter_mut() {
            let secret = entry.resolve(stack_dir, env).map_err(|e| (key.clone(), e))?;
            registry.add(&secret);
            entry.value = Some(secret.clone());
            resolved.push((key.clone(), secret));
        }
        if let Some((_, values)) = self.typed_values_mut() {
            for (key, secret) in resolved {
                values.insert(key, secret.expose().clone());
            }
        }
        Ok(())
    }

    /// The entries the stack marks secret (none for a tool without typed values).
    pub fn marked(&self) -> &BTreeMap<String, Marked> {
        static NONE: BTreeMap<String, Marked> = BTreeMap::new();
        match self {
            ToolSpec::Terraform(s) => &s.marked,
            ToolSpec::Ansible(s) => &s.marked,
            ToolSpec::Helm(s) => &s.marked,
            ToolSpec::Kubectl(_) | ToolSpec::Shell(_) => &NONE,
        }
    }

    /// `up --plan`: the step applies this saved plan of its tool (terraform's `plan -out`, from
    /// the reviewed PLANFILE) instead of planning again. Tools without a saved plan ignore it.
    pub fn use_saved_plan(&mut self, file: PathBuf) {
        if let ToolSpec::Terraform(s) = self {
            s.saved_plan = Some(file);
        }
    }

    /// The keys this tool accepts on a step (besides the common ones), for suggestions.
    pub fn keys(tool: Tool) -> &'static [&'static str] {
        match tool {
            Tool::Terraform => terraform::TerraformSpec::KEYS,
            Tool::Ansible => ansible::AnsibleSpec::KEYS,
            Tool::Helm => helm::HelmSpec::KEYS,
            Tool::Kubectl => kubectl::KubectlSpec::KEYS,
            Tool::Shell => shell::ShellSpec::KEYS,
        }
    }

    /// A tool's spec from its own keys (the step's mapping without the common keys). serde
    /// reads a scalar as a number or a boolean only from a [`yaml::coercible`] node, so the
    /// caller passes one; the values as written go to [`Adapter::typed_values_mut`] afterwards.
    pub fn decode(tool: Tool, node: &yaml::Node) -> Result<ToolSpec, yaml::DecodeError> {
        match tool {
            Tool::Terraform => yaml::from_node(node).map(ToolSpec::Terraform),
            Tool::Ansible => yaml::from_node(node).map(ToolSpec::Ansible),
            Tool::Helm => yaml::from_node(node).map(ToolSpec::Helm),
            Tool::Kubectl => yaml::from_node(node).map(ToolSpec::Kubectl),
            Tool::Shell => yaml::from_node(node).map(ToolSpec::Shell),
        }
    }
}

impl Adapter for ToolSpec {
    fn problems(&self) -> Vec<SpecProblem> {
        dispatch!(self, s => s.problems())
    }

    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        dispatch!(self, s => s.referenced_paths())
    }

    fn problems_beside(&self, dir: &Path, env: &BTreeMap<String, String>) -> Vec<SpecProblem> {
        dispatch!(self, s => s.problems_beside(dir, env))
    }

    fn default_resumable(&self) -> bool {
        dispatch!(self, s => s.default_resumable())
    }

    fn typed_values_mut(&mut self) -> Option<(&'static str, &mut BTreeMap<String, serde_json::Value>)> {
        dispatch!(self, s => s.typed_values_mut())
    }

    fn typed_values_key(&self) -> Option<&'static str> {
        dispatch!(self, s => s.typed_values_key())
    }

    fn marked_mut(&mut self) -> Option<&mut BTreeMap<String, Marked>> {
        dispatch!(self, s => s.marked_mut())
    }

    fn converges_by_preview(&self) -> bool {
        dispatch!(self, s => s.converges_by_preview())
    }

    fn kube_target(&self) -> Option<crate::contract::KubeTarget<'_>> {
        dispatch!(self, s => s.kube_target())
    }

    fn target_context(&mut self, context: &str) -> bool {
        dispatch!(self, s => s.target_context(context))
    }

    fn settings(&self, stack_dir: &Path) -> Vec<(&'static str, crate::contract::Setting)> {
        dispatch!(self, s => s.settings(stack_dir))
    }

    fn workloads(&self, ctx: &StepContext) -> Option<crate::contract::Workloads> {
        dispatch!(self, s => s.workloads(ctx))
    }

    fn reapplies(&self) -> Option<&'static str> {
        dispatch!(self, s => s.reapplies())
    }

    fn cluster_rollback(&self, ctx: Option<&StepContext>) -> Option<String> {
        dispatch!(self, s => s.cluster_rollback(ctx))
    }

    fn in_place_keeps_last_outputs(&self) -> bool {
        dispatch!(self, s => s.in_place_keeps_last_outputs())
    }

    fn pinned_paths(&self, stack_dir: &Path, revert: Option<&str>) -> Vec<PathBuf> {
        dispatch!(self, s => s.pinned_paths(stack_dir, revert))
    }

    async fn preflight(&self, ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        dispatch!(self, s => s.preflight(ctx).await)
    }

    async fn preflight_for_run(&self, ctx: &StepContext) -> Result<Option<ToolInfo>, AdapterError> {
        dispatch!(self, s => s.preflight_for_run(ctx).await)
    }

    // Every tool's events, failure and inspection are redacted with the run's secrets on the way
    // out (the driver redacts again what it writes): the adapters parse the tool's output first.
    async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        let sink = RegistrySink { inner: sink, registry: &ctx.secrets };
        dispatch!(self, s => s.apply(ctx, &sink).await).map_err(|f| ctx.secrets.redact_failure(f))
    }

    async fn recover(&self, ctx: &StepContext, prior: &PriorStep, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        let sink = RegistrySink { inner: sink, registry: &ctx.secrets };
        dispatch!(self, s => s.recover(ctx, prior, &sink).await).map_err(|f| ctx.secrets.redact_failure(f))
    }

    async fn inspect(&self, ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        let redact = |lines: Vec<String>| lines.iter().map(|l| ctx.secrets.redact(l)).collect();
        match dispatch!(self, s => s.inspect(ctx, prior).await) {
            Ok(i) => Ok(Inspection { actions: redact(i.actions), remaining: redact(i.remaining) }),
            Err(f) => Err(ctx.secrets.redact_failure(f)),
        }
    }

    async fn preview(&self, ctx: &StepContext) -> Result<Preview, PreviewError> {
        dispatch!(self, s => s.preview(ctx).await)
    }

    async fn decision_preview(&self, ctx: &StepContext) -> Result<Preview, PreviewError> {
        dispatch!(self, s => s.decision_preview(ctx).await)
    }

    async fn converge(&self, ctx: &StepContext, preview: &Preview, sink: &dyn EventSink) -> Result<(), Failure> {
        let sink = RegistrySink { inner: sink, registry: &ctx.secrets };
        dispatch!(self, s => s.converge(ctx, preview, &sink).await).map_err(|f| ctx.secrets.redact_failure(f))
    }

    fn volatile_outputs(&self) -> &'static [&'static str] {
        dispatch!(self, s => s.volatile_outputs())
    }

    async fn observe(&self, ctx: &StepContext) -> Result<Vec<crate::preview::Observed>, PreviewError> {
        dispatch!(self, s => s.observe(ctx).await)
    }

    async fn read_outputs(&self, ctx: &StepContext) -> Result<Option<crate::outputs::Outputs>, Failure> {
        dispatch!(self, s => s.read_outputs(ctx).await)
    }

    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        dispatch!(self, s => s.describe_recovery(ctx, prior))
    }
    fn shell_line_keys(&self) -> &'static [&'static [&'static str]] {
        dispatch!(self, s => s.shell_line_keys())
    }

    fn declared_sub_changes(&self) -> Vec<crate::contract::DeclaredSubChange<'_>> {
        dispatch!(self, s => s.declared_sub_changes())
    }

    fn own_context(&self) -> Option<&str> {
        dispatch!(self, s => s.own_context())
    }
}

/// A fleet cluster's own kubeconfig ([`ToolSpec::use_own_kubeconfig`]), held while its tool
/// runs: its link is gone once this is dropped. The tool runs with it; its commands are shown
/// with the user's kubeconfig (helm's and kubectl's `shown` words).
#[derive(Debug)]
pub struct OwnKubeconfig {
    _file: crate::secrets::SecretFile,
}

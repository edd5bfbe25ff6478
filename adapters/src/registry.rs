//! The registry of tools: which [`Tool`] a step names, the spec each tool deserializes into
//! ([`ToolSpec`]), the keys each accepts, and dispatch of the [`Adapter`] contract to them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::contract::{
    Adapter, AdapterError, DescribeContext, EventSink, Failure, FieldPath, Inspection, PriorStep, Recovered,
    RecoveryDoc, SpecProblem, StepContext, ToolInfo,
};
use crate::preview::{Preview, PreviewError};
use crate::{ansible, helm, kubectl, shell, terraform};

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
}

impl Adapter for ToolSpec {
    fn problems(&self) -> Vec<SpecProblem> {
        dispatch!(self, s => s.problems())
    }

    fn referenced_paths(&self) -> Vec<(FieldPath, PathBuf)> {
        dispatch!(self, s => s.referenced_paths())
    }

    fn default_resumable(&self) -> bool {
        dispatch!(self, s => s.default_resumable())
    }

    fn typed_values_mut(&mut self) -> Option<(&'static str, &mut BTreeMap<String, serde_json::Value>)> {
        dispatch!(self, s => s.typed_values_mut())
    }

    async fn preflight(&self, ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        dispatch!(self, s => s.preflight(ctx).await)
    }

    async fn apply(&self, ctx: &StepContext, sink: &dyn EventSink) -> Result<(), Failure> {
        dispatch!(self, s => s.apply(ctx, sink).await)
    }

    async fn recover(&self, ctx: &StepContext, prior: &PriorStep, sink: &dyn EventSink) -> Result<Recovered, Failure> {
        dispatch!(self, s => s.recover(ctx, prior, sink).await)
    }

    async fn inspect(&self, ctx: &StepContext, prior: &PriorStep) -> Result<Inspection, Failure> {
        dispatch!(self, s => s.inspect(ctx, prior).await)
    }

    async fn preview(&self, ctx: &StepContext) -> Result<Preview, PreviewError> {
        dispatch!(self, s => s.preview(ctx).await)
    }

    fn describe_recovery(&self, ctx: &DescribeContext<'_>, prior: Option<&PriorStep>) -> RecoveryDoc {
        dispatch!(self, s => s.describe_recovery(ctx, prior))
    }
}

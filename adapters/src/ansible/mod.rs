//! The ansible adapter. Not built yet: the spec is parsed and validated so stacks that use
//! ansible are checked, but `ToolSpec::is_supported` reports it missing until its issue lands.

use serde::Deserialize;

use crate::{
    AdapterError, DescribeContext, EventSink, Failure, FieldPath, Inspection, PriorStep, RecoveryDoc, SpecProblem,
    StepContext, ToolInfo,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnsibleSpec {
    pub playbook: std::path::PathBuf,
    pub inventory: std::path::PathBuf,
    pub limit: Option<String>,
    #[serde(default)]
    pub extra_vars: std::collections::BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub tags: Vec<String>,
    pub binary: Option<String>,
    /// `limit` (default: only failed, unreachable and pending hosts) or `rerun`.
    pub recover: Option<String>,
}

impl AnsibleSpec {
    pub const KEYS: &'static [&'static str] = &["playbook", "inventory", "limit", "extra_vars", "tags", "binary", "recover"];

    pub fn problems(&self) -> Vec<SpecProblem> {
        Vec::new()
    }

    pub fn referenced_paths(&self) -> Vec<(FieldPath, std::path::PathBuf)> {
        Vec::new()
    }

    pub async fn preflight(&self, _ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        Err(AdapterError::ToolUnusable { command: "ansible".into(), detail: "the ansible adapter is not built yet".into() })
    }

    pub async fn apply(&self, _ctx: &StepContext, _sink: &dyn EventSink) -> Result<(), Failure> {
        Err(Failure::new("the ansible adapter is not built yet"))
    }

    pub async fn recover(&self, _ctx: &StepContext, _prior: &PriorStep, _sink: &dyn EventSink) -> Result<(), Failure> {
        Err(Failure::new("the ansible adapter is not built yet"))
    }

    pub async fn inspect(&self, _ctx: &StepContext, _prior: &PriorStep) -> Result<Inspection, Failure> {
        Err(Failure::new("the ansible adapter is not built yet"))
    }

    pub fn describe_recovery(&self, _ctx: &DescribeContext<'_>, _prior: Option<&PriorStep>) -> RecoveryDoc {
        RecoveryDoc::default()
    }
}

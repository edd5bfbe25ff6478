//! The terraform adapter. Not built yet: the spec is parsed and validated so stacks that use
//! terraform are checked, but `ToolSpec::is_supported` reports it missing until its issue lands.

use serde::Deserialize;

use crate::{
    AdapterError, DescribeContext, EventSink, Failure, FieldPath, Inspection, PriorStep, RecoveryDoc, SpecProblem,
    StepContext, ToolInfo,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerraformSpec {
    /// Directory of the terraform configuration, relative to the stack file.
    pub dir: std::path::PathBuf,
    #[serde(default)]
    pub vars: std::collections::BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub var_files: Vec<std::path::PathBuf>,
    pub workspace: Option<String>,
    /// `terraform` (default) or `tofu`.
    pub binary: Option<String>,
    /// Passed as `-lock-timeout`, e.g. `30s`.
    pub lock_timeout: Option<String>,
}

impl TerraformSpec {
    pub const KEYS: &'static [&'static str] = &["dir", "vars", "var_files", "workspace", "binary", "lock_timeout"];

    pub fn problems(&self) -> Vec<SpecProblem> {
        Vec::new()
    }

    pub fn referenced_paths(&self) -> Vec<(FieldPath, std::path::PathBuf)> {
        Vec::new()
    }

    pub async fn preflight(&self, _ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        Err(AdapterError::ToolUnusable { command: "terraform".into(), detail: "the terraform adapter is not built yet".into() })
    }

    pub async fn apply(&self, _ctx: &StepContext, _sink: &dyn EventSink) -> Result<(), Failure> {
        Err(Failure::new("the terraform adapter is not built yet"))
    }

    pub async fn recover(&self, _ctx: &StepContext, _prior: &PriorStep, _sink: &dyn EventSink) -> Result<(), Failure> {
        Err(Failure::new("the terraform adapter is not built yet"))
    }

    pub async fn inspect(&self, _ctx: &StepContext, _prior: &PriorStep) -> Result<Inspection, Failure> {
        Err(Failure::new("the terraform adapter is not built yet"))
    }

    pub fn describe_recovery(&self, _ctx: &DescribeContext<'_>, _prior: Option<&PriorStep>) -> RecoveryDoc {
        RecoveryDoc::default()
    }
}

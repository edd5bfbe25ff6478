//! The kubectl adapter. Not built yet: the spec is parsed and validated so stacks that use
//! kubectl are checked, but `ToolSpec::is_supported` reports it missing until its issue lands.

use serde::Deserialize;

use crate::{
    AdapterError, DescribeContext, EventSink, Failure, FieldPath, Inspection, PriorStep, RecoveryDoc, SpecProblem,
    StepContext, ToolInfo,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubectlSpec {
    pub manifests: Vec<std::path::PathBuf>,
    pub namespace: Option<String>,
    pub context: Option<String>,
    pub server_side: Option<bool>,
    pub wait: Option<bool>,
    pub binary: Option<String>,
}

impl KubectlSpec {
    pub const KEYS: &'static [&'static str] = &["manifests", "namespace", "context", "server_side", "wait", "binary"];

    pub fn problems(&self) -> Vec<SpecProblem> {
        Vec::new()
    }

    pub fn referenced_paths(&self) -> Vec<(FieldPath, std::path::PathBuf)> {
        Vec::new()
    }

    pub async fn preflight(&self, _ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        Err(AdapterError::ToolUnusable { command: "kubectl".into(), detail: "the kubectl adapter is not built yet".into() })
    }

    pub async fn apply(&self, _ctx: &StepContext, _sink: &dyn EventSink) -> Result<(), Failure> {
        Err(Failure::new("the kubectl adapter is not built yet"))
    }

    pub async fn recover(&self, _ctx: &StepContext, _prior: &PriorStep, _sink: &dyn EventSink) -> Result<(), Failure> {
        Err(Failure::new("the kubectl adapter is not built yet"))
    }

    pub async fn inspect(&self, _ctx: &StepContext, _prior: &PriorStep) -> Result<Inspection, Failure> {
        Err(Failure::new("the kubectl adapter is not built yet"))
    }

    pub fn describe_recovery(&self, _ctx: &DescribeContext<'_>, _prior: Option<&PriorStep>) -> RecoveryDoc {
        RecoveryDoc::default()
    }
}

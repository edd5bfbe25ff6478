//! The helm adapter. Not built yet: the spec is parsed and validated so stacks that use
//! helm are checked, but `ToolSpec::is_supported` reports it missing until its issue lands.

use serde::Deserialize;

use crate::{
    AdapterError, DescribeContext, EventSink, Failure, FieldPath, Inspection, PriorStep, RecoveryDoc, SpecProblem,
    StepContext, ToolInfo,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelmSpec {
    pub release: String,
    pub chart: String,
    pub namespace: Option<String>,
    #[serde(default)]
    pub values: Vec<std::path::PathBuf>,
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, serde_json::Value>,
    pub version: Option<String>,
    pub context: Option<String>,
    pub wait: Option<bool>,
    pub binary: Option<String>,
    /// `upgrade` (default) or `rollback`.
    pub recover: Option<String>,
}

impl HelmSpec {
    pub const KEYS: &'static [&'static str] = &["release", "chart", "namespace", "values", "set", "version", "context", "wait", "binary", "recover"];

    pub fn problems(&self) -> Vec<SpecProblem> {
        Vec::new()
    }

    pub fn referenced_paths(&self) -> Vec<(FieldPath, std::path::PathBuf)> {
        Vec::new()
    }

    pub async fn preflight(&self, _ctx: &StepContext) -> Result<ToolInfo, AdapterError> {
        Err(AdapterError::ToolUnusable { command: "helm".into(), detail: "the helm adapter is not built yet".into() })
    }

    pub async fn apply(&self, _ctx: &StepContext, _sink: &dyn EventSink) -> Result<(), Failure> {
        Err(Failure::new("the helm adapter is not built yet"))
    }

    pub async fn recover(&self, _ctx: &StepContext, _prior: &PriorStep, _sink: &dyn EventSink) -> Result<(), Failure> {
        Err(Failure::new("the helm adapter is not built yet"))
    }

    pub async fn inspect(&self, _ctx: &StepContext, _prior: &PriorStep) -> Result<Inspection, Failure> {
        Err(Failure::new("the helm adapter is not built yet"))
    }

    pub fn describe_recovery(&self, _ctx: &DescribeContext<'_>, _prior: Option<&PriorStep>) -> RecoveryDoc {
        RecoveryDoc::default()
    }
}

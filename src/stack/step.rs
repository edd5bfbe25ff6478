//! A step as the stack declares it ([`Step`]), and its tool's spec built from its keys.

use std::collections::BTreeMap;
use std::time::Duration;

use rdeploy_adapters::secrets::Marked;
use rdeploy_adapters::yaml::{self, Node};
use rdeploy_adapters::{Adapter, Tool, ToolSpec};
use serde::{Deserialize, Serialize};

use super::fleet::FleetStep;
use super::gates::Gate;
use super::retry::Retry;
use crate::reference::Reference;

/// `phase:`: where a step sits in an expand/migrate/contract change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Expand,
    Migrate,
    Contract,
}

/// One step of the stack, its values checked and parsed.
#[derive(Clone, Debug)]
pub struct Step {
    pub name: String,
    pub tool: Tool,
    pub needs: Vec<String>,
    pub resumable: bool,
    pub revert: Option<String>,
    pub gate: Option<Gate>,
    /// The step's `timeout`, else the stack's top-level one.
    pub timeout: Option<Duration>,
    /// `retry:`; `None` retries nothing.
    pub retry: Option<Retry>,
    pub env: BTreeMap<String, String>,
    /// `env` entries the stack marks secret (`{ from_env: NAME }`, ...), read when the step runs
    /// into the tool's environment; not in `env` until then.
    pub env_marked: BTreeMap<String, Marked>,
    pub phase: Option<Phase>,
    /// `always: true`: `up` runs the tool even for what its preview finds in place.
    pub always: bool,
    /// `contexts:` / `fleet:` on a helm or kubectl step: it runs once per cluster, in waves.
    pub fleet: Option<FleetStep>,
    pub spec: ToolSpec,
    /// Line of the step in the stack file, for messages.
    pub line: usize,
    /// Digest of the step's settings, to say which steps changed since a checkpoint.
    pub digest: String,
    /// The `${{ steps.NAME.outputs.KEY }}` it consumes, each once, in the order written.
    pub refs: Vec<Reference>,
    /// Its tool keys as written, from which `spec` is built again once references resolve.
    pub(super) own: Node,
}

/// A tool's spec from its keys: serde reads the coercible copy, and the values handed to the
/// tool keep their YAML type.
pub(super) fn build_spec(tool: Tool, own_node: &Node) -> Result<ToolSpec, yaml::DecodeError> {
    let mut spec = ToolSpec::decode(tool, &yaml::coercible(own_node.clone()))?;
    // serde sees every YAML scalar as a string; values handed to the tool keep their YAML type.
    if let Some((key, values)) = spec.typed_values_mut() {
        if let Some(node) = own_node.as_mapping().and_then(|m| m.get_mapping(key)) {
            for (k, v) in node.iter() {
                values.insert(k.as_str().to_string(), yaml::typed_json(v));
            }
        }
    }
    Ok(spec)
}

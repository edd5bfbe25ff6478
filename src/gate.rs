//! Gates: preconditions evaluated right before a step runs. The fleet inventory that answers
//! `gate.inventory` is not built yet (issue 8), so a gated step is refused rather than run on
//! an unchecked assumption: refusing is the safe answer when the fleet cannot be asked.

use std::path::Path;

use crate::stack::Gate;

/// `Ok` when the step may run; `Err` with the reason it may not.
pub async fn evaluate(gate: &Gate, _stack_dir: &Path) -> Result<(), String> {
    let inv = &gate.inventory;
    Err(format!(
        "cannot confirm that {} run {}:{} in {}: the fleet inventory is not available in this build of rdeploy",
        inv.contexts.join(", "),
        inv.image,
        inv.version,
        inv.namespace.as_deref().unwrap_or("all namespaces"),
    ))
}

//! `rdeploy validate`: check the stack file and that each tool is installed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;

use super::global::{session, Global};
use crate::exit::{Code, Refusal};
use crate::stack::StackError;
use crate::ui::Ui;
use crate::{out, stack};

#[derive(Args)]
pub struct ValidateArgs {
    /// The stack file, or a directory holding `stack.yaml`.
    #[arg(default_value = "stack.yaml")]
    pub stack: PathBuf,
    /// Machine-readable output for editors and CI: `valid`, the steps, and every problem
    /// with its file, line and column (exit codes unchanged).
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: &ValidateArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let ValidateArgs { stack, json } = args;
    if *json {
        return validate_json(stack, global, ui).await;
    }
    let s = session(stack, global, ui.clone(), 1)?;
    let steps: Vec<&stack::Step> = s.stack.ordered().collect();
    let tools = s.preflight(&steps).await?;
    outln!(ui.out(), "{}: ok, {} in this order:", stack.display(), out::count(steps.len(), "step"));
    for step in steps {
        let version = tools.get(&step.name).map(|t| t.version.as_str()).unwrap_or("");
        let resumable = if step.resumable { "resumable" } else { "not resumable" };
        outln!(ui.out(), "  {} ({} {version}, {resumable})", step.name, step.tool);
    }
    Ok(Code::Ok)
}

/// `rdeploy validate --json`: the verdict as one JSON object, as `terraform validate -json`
/// gives editors and CI: `valid`, the steps in run order with their tool's version, and every
/// problem with its place (`file`, `line`, `column`; absent for a problem outside the file).
async fn validate_json(stack: &Path, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let problems = |err: &anyhow::Error| -> (Vec<serde_json::Value>, Code) {
        if let Some(e) = err.downcast_ref::<StackError>() {
            let list = e
                .problems
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "file": p.file.display().to_string(), "line": p.line, "column": p.column,
                        "message": p.message, "hint": p.hint,
                    })
                })
                .collect();
            return (list, Code::BadInput);
        }
        let (message, hint, code) = match err.downcast_ref::<Refusal>() {
            Some(r) => (r.message.clone(), r.hint.clone(), r.code),
            None => (format!("{err:#}"), None, Code::BadInput),
        };
        (vec![serde_json::json!({ "message": message, "hint": hint })], code)
    };
    let verdict = async {
        let s = session(stack, global, ui.clone(), 1)?;
        let steps: Vec<&stack::Step> = s.stack.ordered().collect();
        let tools = s.preflight(&steps).await?;
        let steps: Vec<serde_json::Value> = steps
            .iter()
            .map(|step| {
                serde_json::json!({
                    "name": step.name, "tool": step.tool.to_string(), "line": step.line,
                    "version": tools.get(&step.name).map(|t| t.version.clone()),
                    "resumable": step.resumable,
                })
            })
            .collect();
        anyhow::Ok((s.stack.name.clone(), steps))
    }
    .await;
    let (value, code) = match verdict {
        Ok((name, steps)) => (
            serde_json::json!({ "valid": true, "file": stack.display().to_string(), "stack": name, "steps": steps, "problems": [] }),
            Code::Ok,
        ),
        Err(err) => {
            let (problems, code) = problems(&err);
            (serde_json::json!({ "valid": false, "file": stack.display().to_string(), "problems": problems }), code)
        }
    };
    ui.out().json(&value)?;
    Ok(code)
}

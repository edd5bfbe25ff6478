//! `rdeploy output [STACK] [STEP [KEY]] [--json] [--show-sensitive]`: the outputs the steps
//! recorded, from the unfinished deploy, else the last finished one. With STEP and KEY it prints
//! the bare value, for scripts. A sensitive value was never recorded: `--show-sensitive` reads
//! it again from the tool's own state (terraform), where there is one.

use std::sync::Arc;

use clap::Args;

use super::global::{session, Global};

use crate::ui::Ui;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rdeploy_adapters::outputs::value_text;
use rdeploy_adapters::Adapter;
use serde_json::Value;

use crate::checkpoint::{Deploy, StepState, StepStatus};
use crate::engine::Session;
use crate::exit::{Code, Refusal};
use crate::stack::suggest;

/// The positional words of `rdeploy output`, told apart: the first is the stack file when it
/// names one (a `.yaml`/`.yml` or an existing file), else the step of `stack.yaml`.
pub struct Target {
    pub stack: PathBuf,
    pub step: Option<String>,
    pub key: Option<String>,
}

impl Target {
    pub fn from_words(words: &[String]) -> anyhow::Result<Target> {
        let is_stack = |w: &str| w.ends_with(".yaml") || w.ends_with(".yml") || Path::new(w).is_file();
        let (stack, rest) = match words.first() {
            Some(first) if is_stack(first) => (PathBuf::from(first), &words[1..]),
            _ => (PathBuf::from("stack.yaml"), words),
        };
        if rest.len() > 2 {
            return Err(Refusal::new(
                Code::BadInput,
                format!("`rdeploy output` takes [STACK] [STEP [KEY]], not `{}`", words.join(" ")),
            )
            .with_hint("for example `rdeploy output stack.yaml infra db_url`")
            .into());
        }
        Ok(Target { stack, step: rest.first().cloned(), key: rest.get(1).cloned() })
    }
}

/// What `rdeploy output` prints. Longer than most: it reads as the command's cases in order
/// (no deploy, a step, a key; plain, JSON, sensitive values read again), each a few lines.
pub async fn render(session: &Session, target: &Target, json: bool, show_sensitive: bool) -> anyhow::Result<String> {
    let deploy = match session.store.load_unfinished()? {
        Some(d) => d,
        None => session.store.last_finished()?.filter(|d| d.stack == session.stack.name).ok_or_else(|| {
            Refusal::new(
                Code::BadInput,
                format!("no deploy of stack {} is recorded in {}", session.stack.name, session.store.location()),
            )
            .with_hint(format!("`rdeploy up {}` runs it", session.stack_arg))
        })?,
    };
    // A reverted step's outputs describe what was undone: never printed as if live.
    let reverted = |s: &StepState| s.status == StepStatus::Reverted;
    let steps: Vec<&StepState> = match &target.step {
        None => deploy
            .steps
            .iter()
            .filter(|s| !reverted(s) && (!s.outputs.is_empty() || !s.sensitive_outputs.is_empty()))
            .collect(),
        Some(name) => {
            let s = find_step(&deploy, name)?;
            if reverted(s) {
                return Err(Refusal::new(
                    Code::BadInput,
                    format!(
                        "step `{name}` was reverted in deploy {}: its outputs describe what was undone",
                        deploy.deploy_id
                    ),
                )
                .with_hint(format!("`rdeploy up {}` applies it again", session.stack_arg))
                .into());
            }
            vec![s]
        }
    };
    let mut all: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    let mut hidden: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in &steps {
        let mut values: BTreeMap<String, Value> = s.outputs.clone();
        let wanted_sensitive: Vec<&String> =
            s.sensitive_outputs.iter().filter(|k| target.key.as_ref().is_none_or(|want| want == *k)).collect();
        if show_sensitive && !wanted_sensitive.is_empty() {
            for (k, v) in read_again(session, &s.name).await? {
                if wanted_sensitive.contains(&&k) {
                    values.insert(k, v);
                }
            }
        }
        let missing: Vec<String> = s.sensitive_outputs.iter().filter(|k| !values.contains_key(*k)).cloned().collect();
        hidden.insert(s.name.clone(), missing);
        all.insert(s.name.clone(), values);
    }

    if let (Some(step), Some(key)) = (&target.step, &target.key) {
        let values = &all[step];
        if let Some(value) = values.get(key) {
            return Ok(if json {
                format!("{}\n", serde_json::to_string(value)?)
            } else {
                format!("{}\n", value_text(value))
            });
        }
        if hidden[step].contains(key) {
            let why = if show_sensitive {
                format!(
                    "output `{key}` of step `{step}` is sensitive and its tool keeps no state to read it again from"
                )
            } else {
                format!("output `{key}` of step `{step}` is sensitive: it is never recorded")
            };
            let hint = if show_sensitive {
                "only the run that produced it had the value".to_string()
            } else {
                format!(
                    "`rdeploy output {} {step} {key} --show-sensitive` reads it again from the tool's own state",
                    session.stack_arg
                )
            };
            return Err(Refusal::new(Code::BadInput, why).with_hint(hint).into());
        }
        let known: Vec<&str> =
            values.keys().map(String::as_str).chain(hidden[step].iter().map(String::as_str)).collect();
        let hint = suggest(key, &known).map(|s| format!("did you mean `{s}`?")).unwrap_or_else(|| {
            if known.is_empty() {
                format!("step `{step}` recorded no outputs")
            } else {
                format!("its outputs are {}", quoted(&known))
            }
        });
        return Err(Refusal::new(Code::BadInput, format!("step `{step}` has no output `{key}`"))
            .with_hint(hint)
            .into());
    }

    if json {
        let doc = match &target.step {
            Some(step) => serde_json::json!({ "outputs": all[step], "sensitive_outputs": hidden[step] }),
            None => {
                let steps: serde_json::Map<String, Value> = all
                    .iter()
                    .map(|(name, values)| {
                        (name.clone(), serde_json::json!({ "outputs": values, "sensitive_outputs": hidden[name] }))
                    })
                    .collect();
                serde_json::json!({ "stack": deploy.stack, "deploy_id": deploy.deploy_id, "state": deploy.state, "steps": steps })
            }
        };
        return Ok(format!("{}\n", serde_json::to_string_pretty(&doc)?));
    }
    let mut out = String::new();
    for (name, values) in &all {
        if target.step.is_none() {
            out.push_str(&format!("{name}:\n"));
        }
        let indent = if target.step.is_none() { "  " } else { "" };
        for (k, v) in values {
            out.push_str(&format!("{indent}{k}={}\n", value_text(v)));
        }
        for k in &hidden[name] {
            out.push_str(&format!("{indent}{k}=*** (sensitive; --show-sensitive reads it from the tool's state)\n"));
        }
    }
    if out.is_empty() {
        out = format!("no outputs are recorded in deploy {} of stack {}\n", deploy.deploy_id, deploy.stack);
    }
    Ok(out)
}

fn find_step<'a>(deploy: &'a Deploy, name: &str) -> anyhow::Result<&'a StepState> {
    deploy.step(name).ok_or_else(|| {
        let names: Vec<&str> = deploy.steps.iter().map(|s| s.name.as_str()).collect();
        let hint = suggest(name, &names)
            .map(|s| format!("did you mean `{s}`?"))
            .unwrap_or_else(|| format!("the steps are {}", quoted(&names)));
        Refusal::new(Code::BadInput, format!("deploy {} has no step `{name}`", deploy.deploy_id)).with_hint(hint).into()
    })
}

/// The outputs of a step, read again from its tool's own state: the caller takes those the
/// checkpoint records as sensitive (the tool's sensitive ones, and plain ones whose value held
/// one of the run's secrets, which the tool reports as plain).
async fn read_again(session: &Session, step: &str) -> anyhow::Result<BTreeMap<String, Value>> {
    let Some(spec) = session.stack.step(step) else { return Ok(BTreeMap::new()) };
    let ctx = session.context(spec, session.cancel.child_token());
    match spec.spec.read_outputs(&ctx).await {
        Ok(Some(outputs)) => Ok(outputs.into_iter().map(|(k, v)| (k, v.value().clone())).collect()),
        Ok(None) => Ok(BTreeMap::new()),
        Err(failure) => Err(Refusal::new(
            Code::BadInput,
            format!("reading the outputs of step `{step}` from {}'s state failed: {}", spec.tool, failure.summary),
        )
        .into()),
    }
}

fn quoted(words: &[&str]) -> String {
    words.iter().map(|w| format!("`{w}`")).collect::<Vec<_>>().join(", ")
}

#[derive(Args)]
pub struct OutputArgs {
    /// `[STACK] [STEP [KEY]]`: the stack file (default `stack.yaml`), a step, one of its outputs.
    #[arg(value_name = "STACK STEP KEY", num_args = 0..=3)]
    pub words: Vec<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Print sensitive values too, read again from the tool's own state (never recorded).
    #[arg(long)]
    pub show_sensitive: bool,
}

pub async fn run(args: &OutputArgs, global: &Global, ui: Arc<Ui>) -> anyhow::Result<Code> {
    let OutputArgs { words, json, show_sensitive } = args;
    let target = super::output::Target::from_words(words)?;
    let s = session(&target.stack, global, ui.clone(), 1)?;
    let text = super::output::render(&s, &target, *json, *show_sensitive).await?;
    if *show_sensitive {
        // Asked for in clear: a sensitive value that holds one of the stack's secrets (a
        // connection string with its password) is printed whole, not as `postgres://app:***@..`.
        ui.out().reveal(&text);
    } else {
        out!(ui.out(), "{text}");
    }
    Ok(Code::Ok)
}

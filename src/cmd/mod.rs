//! The commands, one per file: each owns its arguments (a clap `Args` type) and its `run`, which
//! `main.rs` dispatches to; [`global`] holds the flags every command takes and builds the
//! session. This file is the binary's side of the deploy commands (`up`, `recover`, `revert`,
//! `reset`, and `ci` through them): the engine returns a [`RunReport`]; this maps its outcome to
//! the exit code (docs/exit-codes.md) and prints it. Nothing here decides anything about the
//! deploy.

pub mod alerts;
pub mod ci;
pub mod completions;
pub mod global;
pub mod inventory;
pub mod man;
pub mod output;
pub mod plan;
pub mod recover;
pub mod reset;
pub mod revert;
pub mod runbook;
pub mod scope;
pub mod state;
pub mod status;
pub mod up;
pub mod validate;

use std::fmt::Write as _;

use crate::checkpoint::DeployState;
use crate::engine::{ApplyWhy, DryRunPlan, DryRunStep, Ended, Outcome, RunReport, Session};
use crate::exit::Code;
use crate::report;
use crate::reporter::{Finish, Finished};
use crate::ui::Paint;

/// The exit code (docs/exit-codes.md) for how a command ended.
pub fn exit_code(outcome: Outcome) -> Code {
    match outcome {
        Outcome::Complete => Code::Ok,
        Outcome::Partial => Code::Partial,
        Outcome::StepReverted => Code::Reverted,
        Outcome::Refused => Code::Refused,
        Outcome::RevertFailed => Code::RevertFailed,
        Outcome::Interrupted => Code::Interrupted,
    }
}

/// Prints what a deploy command did on stdout (and keeps the markdown report of a deploy that
/// stopped part-way in the state directory), then gives its exit code.
pub fn present(session: &Session, report: &RunReport) -> anyhow::Result<Code> {
    present_to(session, report, &[])
}

/// [`present`], then each reporter of the command's end is handed the run report, the report of
/// the deploy it left (the one the text was rendered from) and the exit code.
pub fn present_to(session: &Session, report: &RunReport, finishers: &[&dyn Finish]) -> anyhow::Result<Code> {
    // Built once: for the text of a deploy that did not complete, and for whoever reports the end.
    let status = report
        .deploy()
        .filter(|d| {
            !finishers.is_empty() || (matches!(report.ended, Ended::Ran(_)) && d.state != DeployState::Complete)
        })
        .map(|d| report::from_deploy(&session.stack, &session.state, d, &session.stack_arg, None));
    let (text, markdown) = render(session, report, status.as_ref());
    out!(session.ui.out(), "{text}");
    if let Some(markdown) = markdown {
        let markdown = session.redactor.redact_document(&markdown);
        session.state.write_atomic(&session.state.report_path(), markdown.as_bytes())?;
    }
    let code = exit_code(report.outcome);
    let end = Finished { run: report, status: status.as_ref(), code };
    for finisher in finishers {
        finisher.finished(session, &end);
    }
    Ok(code)
}

/// The text [`present`] prints, and the markdown report it keeps for a deploy that stopped
/// part-way (`status`: that deploy's report). Longer than most: one arm per way a command ends
/// ([`Ended`]), kept in one match so each ending's wording sits beside the others'.
fn render(session: &Session, run: &RunReport, status: Option<&report::Status>) -> (String, Option<String>) {
    let mut markdown = None;
    let location = session.store.location();
    let mut out = String::new();
    match &run.ended {
        Ended::NothingToRecover(last) => {
            let said = match last.as_ref().map(|d| d.state) {
                Some(DeployState::Complete) => "the last deploy completed",
                Some(DeployState::Reverted) => "the last deploy was reverted",
                _ => "no deploy is recorded",
            };
            let _ = writeln!(out, "nothing to recover: {said} ({location})");
        }
        Ended::NothingToRevert(None) => {
            let _ = writeln!(out, "nothing to revert: no completed or unfinished deploy is recorded in {location}");
        }
        Ended::NothingToRevert(Some(deploy)) => {
            let (which, kept) = match deploy.state {
                DeployState::Partial => (
                    "the unfinished deploy",
                    format!("its checkpoint is kept: `rdeploy recover {}` resumes it", session.stack_arg),
                ),
                _ => ("the last deploy", "it stays recorded as complete".to_string()),
            };
            let _ = writeln!(
                out,
                "nothing to revert: no step of {which} ({}) declares `revert`; nothing was recorded, and {kept} ({location})",
                deploy.deploy_id
            );
            let _ = writeln!(
                out,
                "  hint: `rdeploy runbook {}` says how to undo each step by hand; a step's `revert` key lets `rdeploy revert` do it",
                session.stack_arg
            );
        }
        Ended::NothingToReset => {
            let _ = writeln!(out, "nothing to reset: no unfinished deploy in {location}");
        }
        Ended::Forgot(deploy) => {
            let _ = writeln!(
                out,
                "forgot deploy {} of stack {}; its record is kept in the history of {location}; the next `rdeploy up` starts from the top",
                deploy.deploy_id, deploy.stack
            );
        }
        Ended::ForgotUnreadable { error, kept } => {
            let _ = writeln!(
                out,
                "forgot the unfinished deploy in {location}: its journal could not be read ({error}); {kept}; the next `rdeploy up` starts from the top"
            );
        }
        Ended::DryRun { deploy, plan } => {
            let _ = writeln!(
                out,
                "recover --dry-run: deploy {} of stack {} (nothing will be changed)",
                deploy.deploy_id, session.stack.name
            );
            for step in plan {
                dry_run_step(&mut out, step);
            }
        }
        Ended::Ran(deploy) if deploy.state == DeployState::Complete => {
            let summary: Vec<String> = deploy
                .steps
                .iter()
                .map(|s| {
                    let details = report::done_step_details(s);
                    std::iter::once(report::summarize_step(s))
                        .chain(details.into_iter().map(|d| format!("    {d}")))
                        .collect::<Vec<_>>()
                        .join("\n  ")
                })
                .collect();
            let _ = writeln!(out, "stack {}: deploy complete\n  {}", deploy.stack, summary.join("\n  "));
            if let Some(plan) = deploy.runs.iter().find_map(|r| r.plan.as_deref()) {
                let _ = writeln!(out, "applied from the reviewed plan {plan}");
            }
            // The checkpoint's own troubles (a journal line set aside) stay in the report of the
            // deploy they touched, complete or not.
            for w in &deploy.warnings {
                let _ = writeln!(out, "warning: {w}");
            }
        }
        Ended::Ran(deploy) => {
            // `present_to` built it for a deploy that did not complete.
            if let Some(status) = status {
                out.push_str(&report::render_text(status, Paint { enabled: false }));
                if deploy.state == DeployState::Partial {
                    markdown = Some(report::render_markdown(status));
                }
            }
        }
    }
    (out, markdown)
}

fn dry_run_step(out: &mut String, step: &DryRunStep) {
    let (name, tool) = (&step.name, step.tool);
    if let DryRunPlan::LeftAsIs = step.plan {
        let _ = writeln!(out, "\n{name} ({tool}): done, left as it is");
        return;
    }
    let _ = writeln!(out, "\n{name} ({tool}){}:", if step.changed { ", changed since the checkpoint" } else { "" });
    match &step.plan {
        DryRunPlan::LeftAsIs => {}
        DryRunPlan::RevertThenApply { revert } => {
            let _ =
                writeln!(out, "  not resumable and left half-done: run its revert, then run it again from the start");
            if let Some(revert) = revert {
                let _ = writeln!(out, "  - revert: `{}`", report::hang(revert, 4));
            }
        }
        DryRunPlan::Apply { why, actions } => {
            let why = match why {
                ApplyWhy::Reverted => "reverted: runs again from the start",
                ApplyWhy::NotStarted => "not started yet",
                ApplyWhy::NotResumable => "not resumable: runs again from the start",
            };
            let _ = writeln!(out, "  {why}");
            for a in actions {
                let _ = writeln!(out, "  - {}", report::hang(a, 4));
            }
        }
        DryRunPlan::Recover(Ok(actions)) => {
            for a in actions {
                let _ = writeln!(out, "  - {}", report::hang(a, 4));
            }
        }
        DryRunPlan::Recover(Err(why)) => {
            let _ = writeln!(out, "  could not inspect the live state: {}", report::hang(why, 4));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool's multi-line message stays inside its list item: the next item and the next step
    /// still start at their margins.
    #[test]
    fn dry_run_keeps_its_indentation_under_multi_line_errors() {
        let step = DryRunStep {
            name: "web".into(),
            tool: rdeploy_adapters::Tool::Helm,
            changed: false,
            plan: DryRunPlan::Recover(Ok(vec![
                "cannot recover now: Error: values don't meet the specifications of the schema(s):\nshop:\n- at '/replicaCount': got string, want integer\n".into(),
                "hint: fix the values".into(),
            ])),
        };
        let mut out = String::new();
        dry_run_step(&mut out, &step);
        assert_eq!(
            out,
            "\nweb (helm):\n  - cannot recover now: Error: values don't meet the specifications of the schema(s):\n    shop:\n    - at '/replicaCount': got string, want integer\n  - hint: fix the values\n"
        );
    }
}

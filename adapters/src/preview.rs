//! What `rdeploy plan` asks of an adapter: a read-only [`Preview`] of what `up` would change in
//! the tool's own terms (terraform addresses, helm and kubectl objects, ansible hosts and tasks,
//! shell sub-changes), with the diffs to review and what the preview read ([`Observed`]), so a
//! saved plan can later tell whether anything moved.

use serde::{Deserialize, Serialize};

use crate::{AdapterError, Failure};

/// Why a preview could not be made: the tool is missing or unusable (bad input: nothing could
/// be looked at), or the tool failed while looking.
#[derive(Debug)]
pub enum PreviewError {
    Tool(AdapterError),
    Failed(Failure),
}

impl From<AdapterError> for PreviewError {
    fn from(e: AdapterError) -> PreviewError {
        PreviewError::Tool(e)
    }
}

impl From<Failure> for PreviewError {
    fn from(f: Failure) -> PreviewError {
        PreviewError::Failed(f)
    }
}

/// What one item of a step would undergo.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PlanAction {
    /// It does not exist yet (terraform create, a helm or kubectl object missing).
    Create,
    /// It exists and differs (terraform update, an object that differs, an ansible host with
    /// tasks that would change).
    Update,
    /// terraform destroys and creates it again.
    Replace,
    /// It goes away (terraform destroy, an object the new helm revision no longer renders).
    Delete,
    /// A command that would run (a shell sub-change not in place, a bare `run`).
    Run,
    /// Already as asked: listed so the review sees it was looked at.
    Unchanged,
    /// Could not be checked (an unreachable ansible host, a failed check-mode task).
    Unknown,
}

impl PlanAction {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanAction::Create => "create",
            PlanAction::Update => "update",
            PlanAction::Replace => "replace",
            PlanAction::Delete => "delete",
            PlanAction::Run => "run",
            PlanAction::Unchanged => "unchanged",
            PlanAction::Unknown => "unknown",
        }
    }

    /// Whether `up` would change something for this item. An item that could not be checked
    /// counts: a plan must not claim "no changes" over what it could not see.
    pub fn is_change(self) -> bool {
        !matches!(self, PlanAction::Unchanged)
    }
}

/// One item of a step's preview.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanItem {
    /// The sub-change id as `up` would checkpoint it (`terraform_data.vpc`, `ConfigMap/shop/web`,
    /// `web3`, `users`), or the object for helm (`kind/namespace/name`).
    pub id: String,
    pub action: PlanAction,
    /// Why, in a few words (terraform's reason, "missing", "task changed", "already in place").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Lines worth reading under the item: the tasks that would change on an ansible host, the
    /// command a shell sub-change would run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// A unified diff (live against wanted), when the tool gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

impl PlanItem {
    pub fn new(id: impl Into<String>, action: PlanAction) -> PlanItem {
        PlanItem { id: id.into(), action, reason: None, details: Vec::new(), diff: None }
    }

    pub fn because(mut self, reason: impl Into<String>) -> PlanItem {
        self.reason = Some(reason.into());
        self
    }
}

/// Something the preview read whose change would make the plan stale (a helm release revision,
/// the resourceVersion of an object a diff read, terraform's state serial).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// What it is, in words a refusal can name: `helm release shop revision`,
    /// `resourceVersion of ConfigMap/shop/web`, `terraform state serial`.
    pub what: String,
    /// Its value when the plan was made (`absent` when it did not exist).
    pub value: String,
}

/// A step's read-only preview.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preview {
    /// The tool's own one-line summary ("2 to add, 0 to change, 0 to destroy").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    pub items: Vec<PlanItem>,
    /// Anything the reviewer should read (values that changed, warnings of the tool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// What the preview read, for a saved plan's staleness check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observed: Vec<Observed>,
    /// The tool's own saved plan, for `rdeploy plan -o PLANFILE` to carry and `up --plan` to
    /// apply (terraform's `plan -out` file, a zip that holds every variable's value: never
    /// printed, only written to the owner-only PLANFILE).
    #[serde(skip)]
    pub saved_plan: Option<Vec<u8>>,
}

impl Preview {
    /// How many items `up` would change.
    pub fn changes(&self) -> usize {
        self.items.iter().filter(|i| i.action.is_change()).count()
    }

    pub fn observe(&mut self, what: impl Into<String>, value: impl Into<String>) {
        self.observed.push(Observed { what: what.into(), value: value.into() });
    }
}

/// A unified diff of `before` against `after` (three lines of context), or `None` when they are
/// the same. The headers name the two sides.
pub fn unified_diff(before: &str, after: &str, before_name: &str, after_name: &str) -> Option<String> {
    if before == after {
        return None;
    }
    let diff = similar::TextDiff::from_lines(before, after);
    let text = diff.unified_diff().context_radius(3).header(before_name, after_name).to_string();
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_item_but_the_unchanged_ones() {
        let preview = Preview {
            items: vec![
                PlanItem::new("a", PlanAction::Create),
                PlanItem::new("b", PlanAction::Unchanged),
                PlanItem::new("c", PlanAction::Unknown),
            ],
            ..Preview::default()
        };
        assert_eq!(preview.changes(), 2, "an item that could not be checked is not claimed unchanged");
    }

    #[test]
    fn a_unified_diff_names_both_sides_and_only_the_changed_lines() {
        assert_eq!(unified_diff("a\nb\n", "a\nb\n", "live", "wanted"), None);
        let diff = unified_diff("a: 1\nb: 2\n", "a: 1\nb: 3\n", "live", "wanted").unwrap();
        assert!(diff.starts_with("--- live\n+++ wanted\n"), "{diff}");
        assert!(diff.contains("-b: 2\n+b: 3\n"), "{diff}");
    }
}

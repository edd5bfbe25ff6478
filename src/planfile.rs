//! A saved, reviewed plan: `rdeploy plan -o PLANFILE` writes it, `rdeploy up --plan PLANFILE`
//! (and `ci --plan`) applies it exactly as reviewed or refuses (exit 2) naming what moved.
//!
//! The PLANFILE is one JSON document (docs/plan.md "The PLANFILE"), written atomically and
//! created owner-only (0600): terraform's saved plan rides inside it, base64, because it holds
//! every variable's value (a zip terraform compresses, not encrypts). One file is what a CI
//! artifact upload, a digest and an atomic rename want; a directory or a tarball would add
//! nothing but a second place for the mode to go wrong. What it holds, per step: the digests of
//! the files the step reads, what its preview observed (helm release revisions, the
//! resourceVersion of every object a diff read, terraform's state serial and lineage), the
//! resolved output values it was previewed with (or the producers they wait on), the names of
//! its secret values (never the values, nor a digest of them: see [`SavedStep::secrets`]), and
//! terraform's saved plan; for the whole stack its name and the sha256 of its file, and the
//! rendered (redacted) plan for reviewers. Everything but terraform's own bytes (which carry a
//! timestamp) is deterministic: the same stack and world give the same file.

use std::collections::{BTreeMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use base64::Engine as _;
use rdeploy_adapters::preview::Observed;
use rdeploy_adapters::secrets::SecretSource;
use rdeploy_adapters::{Adapter, Tool};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::exit::{Code, Refusal};
use crate::plan::{Resolved, StackPlan};
use crate::stack::{Stack, Step};

pub const FORMAT: &str = "rdeploy-plan";
pub const VERSION: u32 = 1;
/// Where `up --plan` puts a step's reviewed terraform plan, in the step's work dir (0700).
pub const REVIEWED_TFPLAN: &str = "reviewed.tfplan";

/// The PLANFILE.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlanFile {
    pub format: String,
    pub version: u32,
    pub rdeploy_version: String,
    pub stack: StackId,
    /// Items that would change, over every step (as `plan --json`'s `changes`).
    pub changes: usize,
    pub steps: Vec<SavedStep>,
    /// The human plan as reviewers read it (secrets redacted).
    pub rendered: String,
}

/// Which stack the plan is of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackId {
    pub name: String,
    /// The stack file as `plan` was given it.
    pub file: String,
    /// sha256 of the stack file's bytes.
    pub digest: String,
}

/// One step's part of the PLANFILE.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SavedStep {
    pub name: String,
    pub tool: Tool,
    pub changes: usize,
    /// Whether its preview ran: not when it reads outputs known only after a producer applies.
    pub previewed: bool,
    /// Why its preview failed: such a plan cannot be applied as reviewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// sha256 of every file the step reads, by path relative to the stack file's directory.
    pub files: BTreeMap<String, String>,
    /// What its preview read whose change makes the plan stale.
    pub observed: Vec<Observed>,
    /// Each output reference it reads: the value it was previewed with, or the producer it
    /// waits on (`up --plan` checks a known one again before the step starts).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, Resolved<serde_json::Value>>,
    /// The keys whose values are secret (`vars.token`, `env.API_KEY`): neither the value nor
    /// a digest of it is stored. A digest of a short secret can be searched for offline, and a
    /// keyed one needs a key the CI runner would have to keep beside the file; a rotated secret
    /// therefore does not make a plan stale (the reviewers never saw it either).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// terraform's saved plan (`plan -out`), applied as it is by `up --plan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terraform_plan: Option<SavedTool>,
    /// Each item the preview showed and what it would undergo: `up --plan` applies those that
    /// change and reports the unchanged ones in place. Absent when the step was not previewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<SavedItem>>,
}

/// One item of a step's reviewed plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedItem {
    pub id: String,
    pub action: rdeploy_adapters::PlanAction,
}

impl SavedStep {
    /// The reviewed decision for `up --plan`: the items as the plan showed them.
    pub fn decided(&self) -> Option<rdeploy_adapters::Preview> {
        let items = self.items.as_ref().filter(|_| self.previewed && self.error.is_none())?;
        let items = items.iter().map(|i| rdeploy_adapters::PlanItem::new(i.id.clone(), i.action)).collect();
        Some(rdeploy_adapters::Preview { items, ..rdeploy_adapters::Preview::default() })
    }
}

/// A tool's own saved plan, carried in the PLANFILE.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SavedTool {
    /// sha256 of the bytes.
    pub digest: String,
    /// The bytes, base64 (standard alphabet, padded).
    pub base64: String,
}

impl SavedTool {
    pub(crate) fn bytes(&self) -> anyhow::Result<Vec<u8>> {
        base64::engine::general_purpose::STANDARD.decode(&self.base64).context("terraform's saved plan is not base64")
    }
}

/// A PLANFILE read for `up --plan`: the document, the path given and the sha256 of its bytes.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub path: PathBuf,
    pub digest: String,
    pub plan: PlanFile,
}

impl Loaded {
    pub fn step(&self, name: &str) -> Option<&SavedStep> {
        self.plan.steps.iter().find(|s| s.name == name)
    }

    /// A short form of the digest for messages.
    pub fn short(&self) -> &str {
        &self.digest[..12.min(self.digest.len())]
    }
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Builds the PLANFILE of a plan the session just made, its known inputs redacted with the
/// run's `secrets`.
pub fn build(
    stack: &Stack,
    stack_file: &str,
    shared: &Path,
    plan: &StackPlan,
    secrets: &crate::redact::Redactor,
) -> anyhow::Result<PlanFile> {
    let stack_bytes =
        fs_err::read(&stack.file).with_context(|| format!("cannot read the stack file {}", stack.file.display()))?;
    let mut steps = Vec::new();
    for step_plan in &plan.steps {
        let step = stack.step(&step_plan.name).expect("a plan's steps are the stack's");
        let inputs = step_plan
            .inputs
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Resolved::Known(value) => Resolved::Known(secrets.redact_json(value.clone())),
                    pending => pending.clone(),
                };
                (k.clone(), v)
            })
            .collect();
        let terraform_plan = step_plan.saved_plan.as_ref().map(|bytes| SavedTool {
            digest: sha256_hex(bytes),
            base64: base64::engine::general_purpose::STANDARD.encode(bytes),
        });
        steps.push(SavedStep {
            name: step.name.clone(),
            tool: step.tool,
            changes: step_plan.changes,
            previewed: step_plan.unknown_until.is_empty(),
            error: step_plan.error.clone(),
            files: step_files(stack, step, shared)?,
            observed: {
                // In a stable order, whatever order the tool listed its objects in.
                let mut observed = step_plan.observed.clone();
                observed.sort_by(|a, b| a.what.cmp(&b.what));
                observed
            },
            inputs,
            secrets: secret_keys(step),
            terraform_plan,
            items: (step_plan.unknown_until.is_empty() && step_plan.error.is_none())
                .then(|| step_plan.items.iter().map(|i| SavedItem { id: i.id.clone(), action: i.action }).collect()),
        });
    }
    Ok(PlanFile {
        format: FORMAT.into(),
        version: VERSION,
        rdeploy_version: env!("CARGO_PKG_VERSION").into(),
        stack: StackId { name: stack.name.clone(), file: stack_file.to_string(), digest: sha256_hex(&stack_bytes) },
        changes: plan.changes,
        steps,
        rendered: crate::plan::render_text(plan),
    })
}

/// Writes the PLANFILE atomically: a temporary file beside it, created 0600 (never chmod-ed
/// after), written and synced, then renamed over `path`.
pub fn write(path: &Path, plan: &PlanFile) -> anyhow::Result<String> {
    let mut text = serde_json::to_string_pretty(plan)?;
    text.push('\n');
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // tempfile creates its files with O_EXCL and mode 0600.
    let mut tmp = tempfile::Builder::new()
        .prefix(".rdeploy-plan-")
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    tmp.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", tmp.path().display()))?;
    tmp.as_file().sync_all().with_context(|| format!("cannot sync {}", tmp.path().display()))?;
    tmp.persist(path).map_err(|e| e.error).with_context(|| format!("cannot write the plan file {}", path.display()))?;
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(sha256_hex(text.as_bytes()))
}

/// `plan -o` and `up --plan`: a fleet step (`contexts:` / `fleet:`) is previewed against the
/// current kube context only, yet would apply to every cluster: the reviewed plan refuses it.
pub fn refuse_fleet_steps(stack: &Stack, command: &str) -> anyhow::Result<()> {
    let fleet: Vec<&str> = stack.ordered().filter(|s| s.fleet.is_some()).map(|s| s.name.as_str()).collect();
    if fleet.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        Code::BadInput,
        format!(
            "`{command}` refuses fleet step {}: the reviewed plan does not cover fleet steps yet (they are previewed against the current kube context only, and would apply to every cluster)",
            fleet.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
        ),
    )
    .with_hint("`rdeploy up` without --plan, or move the fleet step to its own stack")
    .into())
}

/// Reads a PLANFILE for `up --plan`; anything but a plan of this format version is bad input.
pub fn load(path: &Path) -> anyhow::Result<Loaded> {
    let bad = |message: String| -> anyhow::Error {
        Refusal::new(Code::BadInput, message)
            .with_hint(format!("make it with `rdeploy plan -o {}`", path.display()))
            .into()
    };
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read the plan file {}: {e}", path.display())))?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| bad(format!("{} is not an rdeploy plan file (not JSON: {e})", path.display())))?;
    if doc["format"] != FORMAT {
        return Err(bad(format!("{} is not an rdeploy plan file (no `format: {FORMAT}`)", path.display())));
    }
    if doc["version"] != VERSION {
        return Err(Refusal::new(
            Code::BadInput,
            format!(
                "the plan file {} is of format version {}; this rdeploy ({}) applies version {VERSION} only",
                path.display(),
                doc["version"],
                env!("CARGO_PKG_VERSION")
            ),
        )
        .with_hint(format!("plan again with this rdeploy: `rdeploy plan -o {}`", path.display()))
        .into());
    }
    let plan: PlanFile = serde_json::from_value(doc)
        .map_err(|e| bad(format!("the plan file {} cannot be read: {e}", path.display())))?;
    Ok(Loaded { path: path.to_path_buf(), digest: sha256_hex(&bytes), plan })
}

/// The keys of a step whose values are secret, as `plan` names them (values never stored).
fn secret_keys(step: &Step) -> Vec<String> {
    // Only a tool with typed values has entries marked secret among them.
    let mut out: Vec<String> = match step.spec.typed_values_key() {
        Some(key) => step.spec.marked().keys().map(|k| format!("{key}.{k}")).collect(),
        None => Vec::new(),
    };
    out.extend(step.env_marked.keys().map(|k| format!("env.{k}")));
    // `env` values secret by their name (`API_TOKEN`), which the run redacts too.
    let secret_values = rdeploy_adapters::secrets::env_secrets(&step.env);
    out.extend(step.env.iter().filter(|(_, v)| secret_values.contains(v)).map(|(k, _)| format!("env.{k}")));
    out.sort();
    out.dedup();
    out
}

/// Every file the step reads, by path relative to the stack's directory, with its sha256:
/// terraform's directory (its `.tf`, `.tfvars`, modules and templates; not its state nor
/// `.terraform/`) and var files, a local chart and values files, manifests, the playbook with
/// what playbooks read beside them (`roles/`, `group_vars/`, `host_vars/`, `tasks/`, `vars/`,
/// `templates/`, `files/`, `ansible.cfg`, ...) and the inventory, and the scripts a shell
/// step's commands name when they are files, as the step's adapter names them
/// ([`Adapter::pinned_paths`]). A kubeconfig is left out (tokens refresh in it), as is a shell
/// step's working `dir` (its scripts write there).
pub fn step_files(stack: &Stack, step: &Step, state_dir: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let roots = step.spec.pinned_paths(&stack.dir, step.revert.as_deref());
    // Never digested: a file the stack reads a secret from (its sha256 would give a guess
    // away) and the state directory (rdeploy writes there).
    let mut excluded: HashSet<PathBuf> = HashSet::new();
    for any in &stack.steps {
        for marked in any.spec.marked().values().chain(any.env_marked.values()) {
            if let SecretSource::File(path) = &marked.source {
                excluded.extend(std::fs::canonicalize(stack.dir.join(path)));
            }
        }
    }
    excluded.extend(std::fs::canonicalize(state_dir));
    let mut walker = Walker { base: &stack.dir, excluded, seen: HashSet::new(), out: BTreeMap::new() };
    for root in roots {
        let full = stack.dir.join(&root);
        let Ok(canonical) = std::fs::canonicalize(&full) else { continue };
        if walker.excluded.contains(&canonical) {
            continue;
        }
        if full.is_file() {
            walker.file(&full)?;
        } else if full.is_dir() {
            walker.walk(&full)?;
        }
    }
    Ok(walker.out)
}

struct Walker<'a> {
    base: &'a Path,
    excluded: HashSet<PathBuf>,
    /// Canonical directories walked: a symlink loop, or two roots sharing a tree, is walked once.
    seen: HashSet<PathBuf>,
    out: BTreeMap<String, String>,
}

impl Walker<'_> {
    fn file(&mut self, path: &Path) -> anyhow::Result<()> {
        let bytes = fs_err::read(path)?;
        // A PLANFILE saved in the tree (`plan -o p.plan`) is what is reviewed, not an input.
        if bytes.starts_with(format!("{{\n  \"format\": \"{FORMAT}\"").as_bytes()) {
            return Ok(());
        }
        let relative = path.strip_prefix(self.base).unwrap_or(path);
        self.out.insert(display(relative), sha256_hex(&bytes));
        Ok(())
    }

    /// Every file under `dir`, symlinked files and directories followed, but hidden ones
    /// (`.terraform/`, `.git/`; `.terraform.lock.hcl` is kept), terraform's state
    /// (`terraform.tfstate*`, `terraform.tfstate.d/`), saved plans, ansible's `*.retry` and
    /// what is excluded.
    fn walk(&mut self, dir: &Path) -> anyhow::Result<()> {
        let Ok(canonical) = std::fs::canonicalize(dir) else { return Ok(()) };
        if self.excluded.contains(&canonical) || !self.seen.insert(canonical) {
            return Ok(());
        }
        let mut entries: Vec<_> = fs_err::read_dir(dir)?.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let skipped = (name.starts_with('.') && name != ".terraform.lock.hcl")
                || name.starts_with("terraform.tfstate")
                || name.ends_with(".tfplan")
                || name.ends_with(".retry");
            if skipped {
                continue;
            }
            if path.is_dir() {
                self.walk(&path)?;
            } else if path.is_file() {
                if std::fs::canonicalize(&path).is_ok_and(|c| self.excluded.contains(&c)) {
                    continue;
                }
                self.file(&path)?;
            }
        }
        Ok(())
    }
}

fn display(path: &Path) -> String {
    let text = path.to_string_lossy().into_owned();
    text.strip_prefix("./").map(str::to_string).unwrap_or(text)
}

/// Differences between two digests of a step's files, in words.
pub(crate) fn files_moved(step: &str, then: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (path, digest) in then {
        match now.get(path) {
            None => out.push(format!("step `{step}`: file {path} was removed since the plan")),
            Some(d) if d != digest => out.push(format!("step `{step}`: file {path} changed since the plan")),
            Some(_) => {}
        }
    }
    for path in now.keys().filter(|p| !then.contains_key(*p)) {
        out.push(format!("step `{step}`: file {path} was added since the plan"));
    }
    out
}

/// What moved among a step's observations, in words naming the cause.
pub(crate) fn observed_moved(step: &str, then: &[Observed], now: &[Observed]) -> Vec<String> {
    let now: BTreeMap<&str, &str> = now.iter().map(|o| (o.what.as_str(), o.value.as_str())).collect();
    let mut out = Vec::new();
    for o in then {
        let is = now.get(o.what.as_str()).copied().unwrap_or("not observed");
        if is == o.value {
            continue;
        }
        let cause = if o.what.starts_with("resourceVersion of") {
            if is == "absent" {
                ": the object was deleted in the cluster"
            } else if o.value == "absent" {
                ": the object was created in the cluster"
            } else {
                ": the object was edited in the cluster"
            }
        } else if o.what.starts_with("revision of helm release") {
            ": the release was upgraded, rolled back or uninstalled"
        } else if o.what.starts_with("terraform state") {
            ": the state moved (another apply, an import or a state edit)"
        } else {
            ""
        };
        out.push(format!("step `{step}`: {} was {} when planned and is {is} now{cause}", o.what, o.value));
    }
    let known: std::collections::HashSet<&str> = then.iter().map(|o| o.what.as_str()).collect();
    for (what, value) in now.iter().filter(|(w, _)| !known.contains(**w)) {
        out.push(format!("step `{step}`: {what} is {value} now and was not part of the plan"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(what: &str, value: &str) -> Observed {
        Observed { what: what.into(), value: value.into() }
    }

    #[test]
    fn names_each_moved_observation_with_its_cause() {
        let then = [
            observed("resourceVersion of ConfigMap/shop/a", "10"),
            observed("resourceVersion of ConfigMap/shop/b", "absent"),
            observed("revision of helm release shop", "1"),
            observed("terraform state (serial, lineage)", "serial 3, lineage x"),
        ];
        let now = [
            observed("resourceVersion of ConfigMap/shop/a", "12"),
            observed("resourceVersion of ConfigMap/shop/b", "absent"),
            observed("revision of helm release shop", "2"),
            observed("terraform state (serial, lineage)", "serial 4, lineage x"),
        ];
        let moved = observed_moved("s", &then, &now);
        assert_eq!(moved.len(), 3, "{moved:#?}");
        assert!(moved[0].contains("ConfigMap/shop/a was 10 when planned and is 12 now: the object was edited"));
        assert!(moved[1].contains("revision of helm release shop was 1"));
        assert!(moved[2].contains("serial 3, lineage x when planned and is serial 4"));
        assert!(observed_moved("s", &then, &then).is_empty());
    }

    #[test]
    fn digests_the_files_each_step_reads_and_not_its_data_or_state() {
        let dir = tempfile::tempdir().unwrap();
        let write = |rel: &str, text: &str| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("infra/main.tf", "");
        write("infra/modules/net/main.tf", "");
        write("infra/terraform.tfstate", "{}");
        write("infra/.terraform/providers/x", "");
        write("play/site.yml", "");
        write("play/roles/web/tasks/main.yml", "");
        write("play/inventory.ini", "");
        write("seed.sh", "");
        write("out/seed.log", "");
        let text = "name: s\nsteps:\n  - name: net\n    tool: terraform\n    dir: infra\n  - name: hosts\n    tool: ansible\n    playbook: play/site.yml\n    inventory: play/inventory.ini\n  - name: seed\n    tool: shell\n    sub_changes:\n      - { name: a, run: sh seed.sh >> out/seed.log, check: grep -q a out/seed.log }\n";
        let file = dir.path().join("stack.yaml");
        std::fs::write(&file, text).unwrap();
        let stack = crate::stack::parse(&file, text).unwrap();
        let files = |name: &str| {
            step_files(&stack, stack.step(name).unwrap(), Path::new(".rdeploy"))
                .unwrap()
                .into_keys()
                .collect::<Vec<_>>()
        };
        assert_eq!(files("net"), ["infra/main.tf", "infra/modules/net/main.tf"]);
        assert_eq!(files("hosts"), ["play/inventory.ini", "play/roles/web/tasks/main.yml", "play/site.yml"]);
        assert_eq!(files("seed"), ["seed.sh"], "the script, not the file it appends to");
    }

    /// Ansible reads what a playbook imports, includes and loads beside it: the playbook's
    /// whole tree, symlinked entries followed (a loop walked once), hidden entries and `*.retry`
    /// skipped; a `from_file` secret and the state directory are never digested.
    #[test]
    fn digests_the_playbooks_whole_tree_and_never_a_secret_file_or_the_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        let write = |rel: &str, text: &str| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("play/site.yml", "");
        write("play/web.yml", "");
        write("play/setup/extra.yml", "");
        write("play/vars.yml", "");
        write("play/site.retry", "");
        write("play/.hidden/x.yml", "");
        write("play/db-password", "hunter2");
        write("play/st/journal.jsonl", "");
        write("shared/common.yml", "");
        write("inv/hosts.ini", "");
        std::os::unix::fs::symlink(dir.path().join("shared"), dir.path().join("play/shared")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("play"), dir.path().join("play/setup/loop")).unwrap();
        let text = "name: s\nsteps:\n  - name: hosts\n    tool: ansible\n    playbook: play/site.yml\n    inventory: inv/hosts.ini\n    env: { DB: { from_file: play/db-password } }\n";
        let file = dir.path().join("stack.yaml");
        std::fs::write(&file, text).unwrap();
        let stack = crate::stack::parse(&file, text).unwrap();
        let files = step_files(&stack, stack.step("hosts").unwrap(), &dir.path().join("play/st")).unwrap();
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            [
                "inv/hosts.ini",
                "play/setup/extra.yml",
                "play/shared/common.yml",
                "play/site.yml",
                "play/vars.yml",
                "play/web.yml"
            ]
        );
        assert!(!files.values().any(|d| *d == sha256_hex(b"hunter2")));
    }

    #[test]
    fn names_changed_added_and_removed_files() {
        let then = BTreeMap::from([("a.tf".to_string(), "1".to_string()), ("b.tf".to_string(), "2".to_string())]);
        let now = BTreeMap::from([("a.tf".to_string(), "9".to_string()), ("c.tf".to_string(), "3".to_string())]);
        assert_eq!(
            files_moved("net", &then, &now),
            [
                "step `net`: file a.tf changed since the plan",
                "step `net`: file b.tf was removed since the plan",
                "step `net`: file c.tf was added since the plan"
            ]
        );
    }
}

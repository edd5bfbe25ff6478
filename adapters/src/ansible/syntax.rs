//! The check a step's playbook passes before anything runs (`ansible-playbook -vv
//! --syntax-check`, a second or more of python), remembered in the state directory's cache once
//! it passed, under a digest of everything it reads: while none of it changed, the next `up`
//! takes the pass (and the version it printed) from there instead of starting ansible again.
//!
//! What it reads, and so what the digest covers: the ansible program and its interpreter, the
//! command line, the config files and environment ansible reads ([`super::settings`]); the
//! playbook's whole directory tree by content (what it imports, includes and loads: plays,
//! tasks, roles, vars; hidden entries and `*.retry` left out, as `up --plan` digests it), the
//! inventory and the `group_vars/` and `host_vars/` beside it; and, by name, size and
//! modification time, every directory ansible looks for roles, collections and modules in
//! outside that tree (the ones the check itself printed, its default role paths, and the
//! `ANSIBLE_ROLES_PATH` / `roles_path` a config names). A tree too large to read on every run
//! is never remembered: the check runs each time, as before. Whatever a change outside all of
//! that could break, ansible still refuses before any task runs when the step starts.

use std::io::Read as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::StepContext;

/// The file, in the step's directory of the cache, that holds the last pass.
const FILE: &str = "ansible-syntax-check.json";
/// Above this many files, or bytes read, a tree is not digested on every run.
const MAX_FILES: usize = 20_000;
const MAX_BYTES: u64 = 64 << 20;
/// Directories followed below a root (symbolic links included), so a loop ends.
const MAX_DEPTH: usize = 24;

/// A check that passed: the version its first line said, and the search directories it printed.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Passed {
    inputs: String,
    version: String,
    searched: Vec<PathBuf>,
    searched_digest: String,
}

/// The digest of the check's inputs that are known before it runs; `None` when a tree is too
/// large to digest on every run (then nothing is remembered).
pub fn inputs_digest(
    ctx: &StepContext,
    program: &Path,
    args: &[String],
    playbook: &Path,
    inventory: &Path,
) -> Option<String> {
    let mut digest = Digest::default();
    digest.field("settings", super::settings::inputs_digest(ctx, &[program]).as_bytes());
    for arg in args {
        digest.field("arg", arg.as_bytes());
    }
    // The step's own `env:` (a lookup in a play's keywords may read any of it); a secret's
    // value is not digested into a file, not even hashed.
    let secrets = ctx.secrets.values();
    for (key, value) in &ctx.env {
        digest.field("env", key.as_bytes());
        if crate::secrets::is_secret_name(key) || secrets.contains(value) {
            continue;
        }
        digest.field("value", value.as_bytes());
    }
    let mut budget = Budget::default();
    let playbook = ctx.resolve(playbook);
    digest.field("playbook", playbook.as_os_str().as_bytes());
    // The playbook's folder. A play that imports or names a role by a path leading out of it
    // (`import_playbook: ../common/base.yml`, `roles: [/opt/roles/web]`) is never remembered
    // ([`escapes`]): what it reads there is not digested. The state directory, when it is inside
    // (a `--state-dir` not hidden), changes on every run and is no input of the check.
    let folder = playbook.parent().map(Path::to_path_buf).unwrap_or_else(|| ctx.stack_dir.clone());
    let folder = std::path::absolute(&folder).unwrap_or(folder);
    let state = ctx.work_dir.parent().and_then(Path::parent);
    let shared = state.and_then(Path::parent);
    digest.skip = state.into_iter().chain(shared).filter(|p| !folder.starts_with(p)).map(Path::to_path_buf).collect();
    digest.tree(&folder, Contents::Bytes, &mut budget)?;
    // `host1,host2,` is an inline inventory, not a file; it is in the arguments.
    if !inventory.to_string_lossy().contains(',') {
        let inventory = ctx.resolve(inventory);
        digest.tree(&inventory, Contents::Bytes, &mut budget)?;
        if let Some(dir) = inventory.parent().filter(|_| !inventory.is_dir()) {
            for beside in ["group_vars", "host_vars"] {
                digest.tree(&dir.join(beside), Contents::Bytes, &mut budget)?;
            }
        }
    }
    Some(digest.finish())
}

/// The version of the check that last passed with exactly these inputs, if the directories it
/// searched for roles, collections and modules are as they were then.
pub fn recall(ctx: &StepContext, inputs: &str) -> Option<String> {
    let path = ctx.cache_dir.as_ref()?.join(&ctx.step).join(FILE);
    let mut text = String::new();
    crate::private::open(&path, std::fs::OpenOptions::new().read(true)).ok()?.read_to_string(&mut text).ok()?;
    let passed: Passed = serde_json::from_str(&text).ok()?;
    if passed.inputs != inputs {
        return None;
    }
    (searched_digest(&passed.searched)? == passed.searched_digest).then_some(passed.version)
}

/// Keeps a pass: `header` is the check's output (its `-vv` lines name where it searched).
pub fn remember(ctx: &StepContext, inputs: &str, version: &str, header: &[String]) {
    let Some(dir) = ctx.cache_dir.as_ref().map(|d| d.join(&ctx.step)) else { return };
    let searched = searched_dirs(ctx, header);
    let Some(searched_digest) = searched_digest(&searched) else { return };
    let passed = Passed { inputs: inputs.to_string(), version: version.to_string(), searched, searched_digest };
    let Ok(json) = serde_json::to_vec(&passed) else { return };
    if let Err(e) = super::cache::replace(&dir, FILE, &json) {
        tracing::debug!(dir = %dir.display(), error = %e, "could not remember the playbook's syntax check");
    }
}

/// Forgets the last pass (a check that failed since).
pub fn forget(ctx: &StepContext) {
    if let Some(dir) = &ctx.cache_dir {
        let _ = std::fs::remove_file(dir.join(&ctx.step).join(FILE));
    }
}

/// Where ansible looks for roles, collections and modules outside the playbook's tree: what the
/// check's `-vv` header printed (`configured module search path`, `ansible collection
/// location`, the collections installed beside the `ansible python module location`), the
/// default role paths, `ANSIBLE_ROLES_PATH`, and `roles_path` in the `config file` it named.
fn searched_dirs(ctx: &StepContext, header: &[String]) -> Vec<PathBuf> {
    let env = |key: &str| ctx.env.get(key).cloned().or_else(|| std::env::var(key).ok());
    let home = env("HOME").map(PathBuf::from);
    let expand = |p: &str| -> PathBuf {
        match (p.strip_prefix("~/"), &home) {
            (Some(rest), Some(home)) => home.join(rest),
            _ => ctx.stack_dir.join(p),
        }
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut roles = env("ANSIBLE_ROLES_PATH").unwrap_or_default();
    for line in header {
        let Some((name, value)) = line.trim().split_once(" = ") else { continue };
        let value = value.trim();
        match name.trim() {
            "configured module search path" => {
                let list = value.trim_start_matches('[').trim_end_matches(']');
                dirs.extend(list.split(',').map(|p| p.trim().trim_matches('\'')).filter(|p| !p.is_empty()).map(expand));
            }
            "ansible collection location" => dirs.extend(value.split(':').filter(|p| !p.is_empty()).map(expand)),
            "ansible python module location" => {
                if let Some(site) = Path::new(value).parent() {
                    dirs.push(site.join("ansible_collections"));
                }
            }
            "config file" if value != "None" => {
                let cfg = std::fs::read_to_string(value).unwrap_or_default();
                let base = Path::new(value).parent().unwrap_or(Path::new("/"));
                for line in cfg.lines() {
                    if let Some((key, paths)) = line.split_once('=') {
                        if key.trim() == "roles_path" && roles.is_empty() {
                            roles = paths
                                .trim()
                                .split(':')
                                .map(|p| match p.strip_prefix("~/") {
                                    Some(_) => expand(p).to_string_lossy().into_owned(),
                                    None => base.join(p).to_string_lossy().into_owned(),
                                })
                                .collect::<Vec<_>>()
                                .join(":");
                        }
                    }
                }
            }
            _ => {}
        }
    }
    dirs.extend(roles.split(':').filter(|p| !p.is_empty()).map(expand));
    for default in ["~/.ansible/roles", "/usr/share/ansible/roles", "/etc/ansible/roles"] {
        dirs.push(expand(default));
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Names, sizes and modification times under each directory; `None` when too many to read.
fn searched_digest(dirs: &[PathBuf]) -> Option<String> {
    let mut digest = Digest::default();
    let mut budget = Budget::default();
    for dir in dirs {
        digest.tree(dir, Contents::Metadata, &mut budget)?;
    }
    Some(digest.finish())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Contents {
    /// Each file's bytes.
    Bytes,
    /// Each file's size and modification time.
    Metadata,
}

/// What a digest may still read.
struct Budget {
    files: usize,
    bytes: u64,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget { files: MAX_FILES, bytes: MAX_BYTES }
    }
}

#[derive(Default)]
struct Digest {
    hash: Sha256,
    /// Directories left out of every tree (the state directory).
    skip: Vec<PathBuf>,
}

impl Digest {
    fn field(&mut self, label: &str, bytes: &[u8]) {
        self.hash.update(label.as_bytes());
        self.hash.update([0]);
        self.hash.update((bytes.len() as u64).to_le_bytes());
        self.hash.update(bytes);
    }

    fn finish(self) -> String {
        self.hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A file, or a directory's entries in name order, recursively (following symbolic links,
    /// hidden entries and `*.retry` left out); a path that is not there counts as absent.
    fn tree(&mut self, path: &Path, contents: Contents, budget: &mut Budget) -> Option<()> {
        self.walk(path, contents, budget, 0)
    }

    fn walk(&mut self, path: &Path, contents: Contents, budget: &mut Budget, depth: usize) -> Option<()> {
        if self.skip.iter().any(|s| s == path) {
            return Some(());
        }
        self.field("path", path.as_os_str().as_bytes());
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) => {
                self.field("absent", format!("{:?}", e.kind()).as_bytes());
                return Some(());
            }
        };
        if meta.is_dir() {
            if depth >= MAX_DEPTH {
                return None;
            }
            let mut names: Vec<_> =
                std::fs::read_dir(path).ok()?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
            names.sort();
            self.field("dir", &[]);
            for name in names {
                let bytes = name.as_bytes();
                if bytes.starts_with(b".") || bytes.ends_with(b".retry") {
                    continue;
                }
                self.walk(&path.join(&name), contents, budget, depth + 1)?;
            }
            return Some(());
        }
        budget.files = budget.files.checked_sub(1)?;
        if !meta.is_file() {
            // A FIFO (a secret pipe a killed run left), a socket or a device: never opened
            // (opening a FIFO waits for a writer, `/dev/zero` never ends); its kind is the input.
            self.field("special", format!("{:?}", meta.file_type()).as_bytes());
            return Some(());
        }
        match contents {
            Contents::Metadata => {
                self.field("meta", format!("{} {}.{}", meta.size(), meta.mtime(), meta.mtime_nsec()).as_bytes())
            }
            Contents::Bytes => {
                budget.bytes = budget.bytes.checked_sub(meta.len())?;
                match std::fs::read(path) {
                    Ok(bytes) if is_yaml(path) && escapes(&bytes) => return None,
                    Ok(bytes) => self.field("content", &bytes),
                    Err(e) => self.field("unread", format!("{:?}", e.kind()).as_bytes()),
                }
            }
        }
        Some(())
    }
}

fn is_yaml(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "yml" || e == "yaml")
}

/// Whether a playbook or task file imports, includes or names a role by a path that leads out of
/// its folder (`../`) or is absolute: a file the digest of the folder does not cover.
fn escapes(yaml: &[u8]) -> bool {
    static KEYED: std::sync::OnceLock<regex::bytes::Regex> = std::sync::OnceLock::new();
    let keyed = KEYED.get_or_init(|| {
        regex::bytes::Regex::new(
            r#"(?m)^\s*(?:-\s+)?(?:[\w.]+\.)?(?:import_playbook|import_tasks|include_tasks|include|include_vars|vars_files|import_role|include_role|roles|role|tasks_from|vars_from)\s*:(?:.*?\.\./|\s*['"]?/|.*?[\[,]\s*['"]?/)"#,
        )
        .expect("a valid pattern")
    });
    static LISTED: std::sync::OnceLock<regex::bytes::Regex> = std::sync::OnceLock::new();
    // A bare list item that is such a path (`roles:` / `vars_files:` written as a block list).
    let listed = LISTED.get_or_init(|| {
        regex::bytes::Regex::new(r#"(?m)^\s*-\s+['"]?(?:\.\./|/)[^\s:]*\s*['"]?\s*$"#).expect("a valid pattern")
    });
    keyed.is_match(yaml) || listed.is_match(yaml)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step_context(stack_dir: &Path) -> StepContext {
        StepContext {
            step: "hosts".into(),
            cache_dir: Some(stack_dir.join(".cache")),
            ..crate::testing::step_context(stack_dir)
        }
    }

    #[test]
    fn the_digest_moves_with_the_playbooks_tree_and_the_inventory_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("play/roles/web/tasks")).unwrap();
        std::fs::create_dir_all(root.join("inv/group_vars")).unwrap();
        std::fs::write(root.join("play/site.yml"), "- hosts: all\n  roles: [web]\n").unwrap();
        std::fs::write(root.join("play/roles/web/tasks/main.yml"), "- ansible.builtin.ping:\n").unwrap();
        std::fs::write(root.join("inv/hosts.ini"), "web1\n").unwrap();
        std::fs::write(root.join("program"), "#!/bin/sh\n").unwrap();
        let ctx = step_context(root);
        let digest = || {
            inputs_digest(
                &ctx,
                &root.join("program"),
                &["--syntax-check".into()],
                Path::new("play/site.yml"),
                Path::new("inv/hosts.ini"),
            )
            .unwrap()
        };
        let first = digest();
        // What a run leaves beside the playbook, hidden, is not read: the state dir, `.git`.
        std::fs::create_dir_all(root.join("play/.rdeploy")).unwrap();
        std::fs::write(root.join("play/.rdeploy/journal.jsonl"), "{}\n").unwrap();
        std::fs::write(root.join("play/site.retry"), "web1\n").unwrap();
        assert_eq!(digest(), first);
        std::fs::write(root.join("play/roles/web/tasks/main.yml"), "- ansible.builtin.pong:\n").unwrap();
        let role_changed = digest();
        assert_ne!(role_changed, first, "a role's task file");
        std::fs::write(root.join("inv/group_vars/all.yml"), "x: 1\n").unwrap();
        assert_ne!(digest(), role_changed, "group_vars beside the inventory");
    }

    #[test]
    fn a_pass_is_recalled_for_the_same_inputs_while_the_searched_directories_stay_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let collections = root.join("collections");
        std::fs::create_dir_all(collections.join("ns/col")).unwrap();
        let ctx = step_context(root);
        let header = vec![
            "ansible-playbook [core 2.19.14]".to_string(),
            format!("  ansible collection location = {}", collections.display()),
        ];
        remember(&ctx, "inputs", "core 2.19.14", &header);
        assert_eq!(recall(&ctx, "inputs").as_deref(), Some("core 2.19.14"));
        assert_eq!(recall(&ctx, "other inputs"), None);
        std::fs::write(collections.join("ns/col/galaxy.yml"), "version: 2\n").unwrap();
        assert_eq!(recall(&ctx, "inputs"), None, "a collection installed since");
        remember(&ctx, "inputs", "core 2.19.14", &header);
        forget(&ctx);
        assert_eq!(recall(&ctx, "inputs"), None);
    }

    #[test]
    fn a_file_the_playbook_imports_from_beside_its_folder_moves_the_digest_and_a_pipe_is_never_opened() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("ansible")).unwrap();
        std::fs::create_dir_all(root.join("common")).unwrap();
        std::fs::write(root.join("ansible/site.yml"), "- import_playbook: ../common/base.yml\n").unwrap();
        std::fs::write(root.join("common/base.yml"), "- hosts: all\n  tasks: []\n").unwrap();
        std::fs::write(root.join("hosts.ini"), "web1\n").unwrap();
        // A pipe a killed run left (a secret extra-vars pipe): opening it would wait for good.
        nix::unistd::mkfifo(&root.join("ansible/leftover.pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let ctx = step_context(root);
        let digest =
            || inputs_digest(&ctx, &root.join("program"), &[], Path::new("ansible/site.yml"), Path::new("hosts.ini"));
        assert_eq!(digest(), None, "what the play imports from beside its folder is not digested: no cache");
        std::fs::write(root.join("ansible/site.yml"), "- hosts: all\n  tasks: []\n").unwrap();
        assert!(digest().is_some(), "a play of its own folder only, the pipe beside it counted, not opened");
    }

    #[test]
    fn a_path_out_of_the_folder_is_told_from_a_task_argument() {
        for out in [
            "- import_playbook: ../common/base.yml\n",
            "- hosts: all\n  roles: [../shared/roles/web]\n",
            "- hosts: all\n  roles:\n    - /opt/roles/web\n",
            "- hosts: all\n  roles:\n    - role: '/opt/roles/web'\n",
            "- hosts: all\n  vars_files:\n    - ../vars/common.yml\n",
            "- ansible.builtin.import_tasks: ../tasks/x.yml\n",
            "- include_role:\n    name: web\n    tasks_from: /srv/x.yml\n",
        ] {
            assert!(escapes(out.as_bytes()), "{out}");
        }
        for inside in [
            "- hosts: all\n  roles: [web, db]\n",
            "- copy:\n    dest: \"{{ playbook_dir }}/../out/x\"\n    src: /etc/hosts\n",
            "- import_tasks: tasks/x.yml\n",
            "- hosts: all\n  tasks:\n    - name: a\n      command: /bin/true\n",
        ] {
            assert!(!escapes(inside.as_bytes()), "{inside}");
        }
    }

    #[test]
    fn a_tree_too_large_is_never_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let mut budget = Budget { files: 2, bytes: MAX_BYTES };
        for i in 0..3 {
            std::fs::write(dir.path().join(format!("f{i}")), "x").unwrap();
        }
        assert!(Digest::default().tree(dir.path(), Contents::Bytes, &mut budget).is_none());
    }
}

//! ansible's callback settings as `ansible-config dump` says them (the plugin directories and
//! the enabled callbacks, which a run must keep when rdeploy adds its own plugin), remembered in
//! the state directory's cache under a digest of everything that dump reads: a run where none
//! of it changed starts no `ansible-config` (a second or more of python). Anything that could
//! change the answer changes the digest, and then ansible is asked again.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::StepContext;

/// The file, in the step's directory of the cache, that holds the last answer and its digest.
const FILE: &str = "ansible-callback-settings.json";

/// ansible's `DEFAULT_CALLBACK_PLUGIN_PATH` and `CALLBACKS_ENABLED`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackSettings {
    pub paths: Vec<String>,
    pub enabled: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Remembered {
    inputs: String,
    settings: CallbackSettings,
}

/// The digest of everything `ansible-config dump` reads to say the callback settings, run as
/// rdeploy runs it (in the stack directory, with the step's `env` over rdeploy's own):
/// - the programs (`ansible-config`, `ansible-playbook`: a pip upgrade rewrites both) and the
///   interpreter each one's `#!` line names, by path and file identity (device, inode, size,
///   modification time);
/// - every config file ansible could pick, by content: `ANSIBLE_CONFIG` (a directory meaning its
///   `ansible.cfg`), `ansible.cfg` in the stack directory (with whether that directory is
///   world-writable: ansible skips it then), `~/.ansible.cfg` and `/etc/ansible/ansible.cfg`;
/// - the environment: every `ANSIBLE_*` variable, `HOME` (`~` and the default `ANSIBLE_HOME`),
///   and each variable a config file names as `$NAME` or `${NAME}` (ansible expands paths).
pub fn inputs_digest(ctx: &StepContext, programs: &[&Path]) -> String {
    let env =
        |key: &str| -> Option<OsString> { ctx.env.get(key).map(OsString::from).or_else(|| std::env::var_os(key)) };
    let mut digest = Sha256::new();
    let mut field = |label: &str, bytes: &[u8]| {
        digest.update(label.as_bytes());
        digest.update([0]);
        digest.update((bytes.len() as u64).to_le_bytes());
        digest.update(bytes);
    };
    for program in programs {
        field("program", program.as_os_str().as_bytes());
        field("file", file_identity(program).as_bytes());
        if let Some(interpreter) = interpreter(program) {
            field("interpreter", interpreter.as_os_str().as_bytes());
            field("file", file_identity(&interpreter).as_bytes());
        }
    }
    let home = env("HOME").map(PathBuf::from);
    let mut candidates = Vec::new();
    if let Some(value) = env("ANSIBLE_CONFIG") {
        let path = match (value.as_bytes().strip_prefix(b"~/"), &home) {
            (Some(rest), Some(home)) => home.join(std::ffi::OsStr::from_bytes(rest)),
            _ => ctx.stack_dir.join(&value),
        };
        candidates.push(if path.is_dir() { path.join("ansible.cfg") } else { path });
    }
    let world_writable = std::fs::metadata(&ctx.stack_dir).map(|m| m.mode() & 0o002 != 0).unwrap_or(false);
    field("cwd", ctx.stack_dir.as_os_str().as_bytes());
    field("cwd world-writable", &[u8::from(world_writable)]);
    candidates.push(ctx.stack_dir.join("ansible.cfg"));
    if let Some(home) = &home {
        candidates.push(home.join(".ansible.cfg"));
    }
    candidates.push(PathBuf::from("/etc/ansible/ansible.cfg"));
    let mut named: BTreeMap<String, Option<OsString>> = BTreeMap::new();
    for path in &candidates {
        field("config", path.as_os_str().as_bytes());
        match std::fs::read(path) {
            Ok(bytes) => {
                field("content", &bytes);
                for name in referenced_variables(&String::from_utf8_lossy(&bytes)) {
                    let value = env(&name);
                    named.insert(name, value);
                }
            }
            Err(e) => field("unread", format!("{:?}", e.kind()).as_bytes()),
        }
    }
    let mut names: Vec<OsString> = std::env::vars_os().map(|(k, _)| k).collect();
    names.extend(ctx.env.keys().map(OsString::from));
    for name in names {
        if let Some(name) = name.to_str().filter(|n| n.starts_with("ANSIBLE_") || *n == "HOME") {
            named.insert(name.to_string(), env(name));
        }
    }
    let secrets = ctx.secrets.values();
    for (name, value) in &named {
        field("env", name.as_bytes());
        match value {
            // A secret's value is not digested into a file, not even hashed.
            Some(value)
                if crate::secrets::is_secret_name(name)
                    || value.to_str().is_some_and(|v| secrets.iter().any(|s| s == v)) =>
            {
                field("secret", b"")
            }
            Some(value) => field("set", value.as_bytes()),
            None => field("unset", b""),
        }
    }
    digest.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The last answer, if it was given for exactly these inputs.
pub fn recall(ctx: &StepContext, inputs: &str) -> Option<CallbackSettings> {
    let path = ctx.cache_dir.as_ref()?.join(&ctx.step).join(FILE);
    let mut text = String::new();
    crate::private::open(&path, std::fs::OpenOptions::new().read(true)).ok()?.read_to_string(&mut text).ok()?;
    let remembered: Remembered = serde_json::from_str(&text).ok()?;
    (remembered.inputs == inputs).then_some(remembered.settings)
}

/// Keeps the answer for these inputs (written whole, then renamed over the last one). A cache
/// that cannot be written costs the next run one `ansible-config` start, nothing more.
pub fn remember(ctx: &StepContext, inputs: &str, settings: &CallbackSettings) {
    let Some(dir) = ctx.cache_dir.as_ref().map(|d| d.join(&ctx.step)) else { return };
    let remembered = Remembered { inputs: inputs.to_string(), settings: settings.clone() };
    let Ok(json) = serde_json::to_vec(&remembered) else { return };
    if let Err(e) = super::cache::replace(&dir, FILE, &json) {
        tracing::debug!(dir = %dir.display(), error = %e, "could not remember ansible's callback settings");
    }
}

/// Path, device, inode, size and modification time of the file `path` names (following links).
fn file_identity(path: &Path) -> String {
    match std::fs::metadata(path) {
        Ok(m) => format!("{} {} {} {}.{}", m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()),
        Err(e) => format!("{:?}", e.kind()),
    }
}

/// The interpreter a script's `#!` line names (`/usr/bin/env` for `#!/usr/bin/env python3`).
fn interpreter(program: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let read = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let line = head[..read].strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let word = line.split(|b| b.is_ascii_whitespace()).find(|w| !w.is_empty())?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(word)))
}

/// The variables a config text names as `$NAME` or `${NAME}`.
fn referenced_variables(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let braced = rest.strip_prefix('{');
        let body = braced.unwrap_or(rest);
        let len = body.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(body.len());
        let name = &body[..len];
        if !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()) {
            names.push(name.to_string());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step_context(stack_dir: &Path) -> StepContext {
        StepContext { step: "hosts".into(), ..crate::testing::step_context(stack_dir) }
    }

    #[test]
    fn finds_the_variables_a_config_names() {
        let text = "[defaults]\ncallback_plugins = $PLUGINS:${TEAM_DIR}/cb:~/x\nother = $1 and $ alone\n";
        assert_eq!(referenced_variables(text), vec!["PLUGINS".to_string(), "TEAM_DIR".to_string()]);
    }

    #[test]
    fn the_digest_moves_with_a_config_file_and_the_variables_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let stack = dir.path().join("stack");
        std::fs::create_dir_all(&stack).unwrap();
        let program = dir.path().join("ansible-config");
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        let ctx = step_context(&stack);
        let digest = |ctx: &StepContext| inputs_digest(ctx, &[&program]);
        let first = digest(&ctx);
        assert_eq!(digest(&ctx), first, "the same inputs, the same digest");
        std::fs::write(stack.join("ansible.cfg"), "[defaults]\ncallback_plugins = $TEAM_PLUGINS\n").unwrap();
        let with_cfg = digest(&ctx);
        assert_ne!(with_cfg, first);
        let mut named = ctx.clone();
        named.env.insert("TEAM_PLUGINS".into(), "/opt/cb".into());
        assert_ne!(digest(&named), with_cfg, "a variable the config names");
        let mut ansible_var = ctx.clone();
        ansible_var.env.insert("ANSIBLE_CALLBACKS_ENABLED".into(), "timer".into());
        assert_ne!(digest(&ansible_var), with_cfg, "an ANSIBLE_ variable");
        let mut other = ctx.clone();
        other.env.insert("UNRELATED".into(), "1".into());
        assert_eq!(digest(&other), with_cfg, "a variable nothing reads");
        std::fs::write(&program, "#!/bin/sh\n# upgraded\n").unwrap();
        assert_ne!(digest(&ctx), with_cfg, "a rewritten program");
    }

    #[test]
    fn an_answer_is_recalled_only_for_the_same_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let mut ctx = step_context(dir.path());
        let settings = CallbackSettings { paths: vec!["/a".into()], enabled: vec!["timer".into()] };
        remember(&ctx, "one", &settings);
        assert_eq!(recall(&ctx, "one"), None, "no cache directory, nothing kept");
        ctx.cache_dir = Some(dir.path().join("cache"));
        remember(&ctx, "one", &settings);
        assert_eq!(recall(&ctx, "one"), Some(settings));
        assert_eq!(recall(&ctx, "two"), None);
    }
}

//! What is secret, and the values rdeploy must never write.
//!
//! A value is secret when the stack marks it ([`Marked`]: `{ from_env: NAME }`,
//! `{ from_file: PATH }` or `{ value: V, secret: true }` in a tool key or `env`), when its name
//! says so (a word part `password`, `passwd`, `token`, `secret`, `key`, `credential`,
//! case-insensitive: [`is_secret_name`]), or when the tool treats it as sensitive (terraform
//! variables declared `sensitive = true`). Everything else prints as it is.
//!
//! The API other modules use:
//! - [`Secret`]: a secret value. Its `Debug` prints `***` and it has no `Serialize`, so it cannot
//!   reach a journal, a report or a log by accident; [`Secret::expose`] is the one way in. It
//!   lives in [`crate::redact`] with the other plain pieces (secret names, [`redact_line`]), which
//!   `outputs` and `process` use too; this module re-exports them.
//! - [`Marked`] and [`SecretSource`]: a value the stack marks secret, where it comes from, and
//!   (once [`Marked::resolve`]d when the step runs) its [`Secret`].
//! - [`Registry`]: the run's set of values never to write. Cloning it shares it. Whatever learns
//!   a secret value adds it ([`Registry::add`]); whatever writes text or records redacts with it
//!   ([`Registry::redact`], [`Registry::redact_json`], [`Registry::redact_serde`]). Adapters get
//!   the run's registry in `StepContext::secrets`; the driver redacts every journal record, log
//!   line and report with it, after the adapters parsed the tool's output.
//!
//! Only strings of one character or more are redacted: a boolean, a number or null is never
//! registered (redacting `false` or `3` everywhere would corrupt the tools' JSON and every flag).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use crate::redact::{env_secrets, is_secret_name, normalize, redact_line, Secret};
use crate::{Event, EventSink, Failure};

/// Where a value the stack marks secret comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// `{ from_env: NAME }`: rdeploy's own environment when the step runs.
    Env(String),
    /// `{ from_file: PATH }`: the file's contents (relative to the stack file), one trailing
    /// newline (`\n` or `\r\n`) trimmed.
    File(PathBuf),
    /// `{ value: V, secret: true }`: the stack file holds it.
    Inline,
    /// A value rdeploy learned is secret while running (a sensitive step output); the text says
    /// where it came from, for runbooks and messages (`output `db.password` of step `infra``).
    Derived(String),
}

impl fmt::Display for SecretSource {
    /// As the runbook and messages name it: `from_env: DB_PASSWORD`, `from_file: secrets/db`,
    /// `secret: true`, or the derived text.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Env(name) => write!(f, "from_env: {name}"),
            SecretSource::File(path) => write!(f, "from_file: {}", path.display()),
            SecretSource::Inline => f.write_str("secret: true"),
            SecretSource::Derived(what) => f.write_str(what),
        }
    }
}

/// A value the stack marks secret: its source and, once resolved, its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Marked {
    pub source: SecretSource,
    /// Set at load for [`SecretSource::Inline`] (and `Derived`), by [`Marked::resolve`] for the others.
    pub value: Option<Secret>,
}

impl Marked {
    pub fn inline(value: Value) -> Marked {
        Marked { source: SecretSource::Inline, value: Some(Secret::new(value)) }
    }

    pub fn from_env(name: impl Into<String>) -> Marked {
        Marked { source: SecretSource::Env(name.into()), value: None }
    }

    pub fn from_file(path: impl Into<PathBuf>) -> Marked {
        Marked { source: SecretSource::File(path.into()), value: None }
    }

    /// The value, read now: from `env` (rdeploy's environment) or the file (relative to
    /// `stack_dir`). An inline or already resolved value is returned as it is.
    pub fn resolve(&self, stack_dir: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Secret, SecretError> {
        if let Some(value) = &self.value {
            return Ok(value.clone());
        }
        match &self.source {
            SecretSource::Env(name) => match env(name) {
                Some(value) => Ok(Secret::new(Value::String(value))),
                None => Err(SecretError::MissingEnv { name: name.clone() }),
            },
            SecretSource::File(path) => {
                let full = stack_dir.join(path);
                let text = std::fs::read_to_string(&full)
                    .map_err(|e| SecretError::File { path: full.clone(), error: e.to_string() })?;
                let text = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
                Ok(Secret::new(Value::String(text.to_string())))
            }
            SecretSource::Inline | SecretSource::Derived(_) => {
                Err(SecretError::Unresolved { what: self.source.to_string() })
            }
        }
    }
}

/// Why a marked secret could not be read when its step started.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("the environment variable `{name}` is not set (the stack reads a secret from it with `from_env: {name}`)")]
    MissingEnv { name: String },
    #[error("cannot read the secret file {} (`from_file`): {error}", path.display())]
    File { path: PathBuf, error: String },
    #[error("the secret ({what}) has no value")]
    Unresolved { what: String },
}

impl SecretError {
    /// The next thing to do.
    pub fn hint(&self) -> String {
        match self {
            SecretError::MissingEnv { name } => {
                format!("`export {name}=...` in rdeploy's environment, then run the command again")
            }
            SecretError::File { .. } => {
                "create the file (paths are relative to the stack file), then run the command again".into()
            }
            SecretError::Unresolved { .. } => "run the command again; if it persists, report it as a bug".into(),
        }
    }
}

/// The strings to redact for a secret value: a string of one character or more, and for a map
/// or list its JSON rendering and every such string inside. Booleans, numbers and null: none.
pub fn redactable(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(s) if !s.is_empty() => out.push(s.clone()),
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            Value::Object(map) => map.values().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    if matches!(value, Value::Array(_) | Value::Object(_)) {
        out.push(value.to_string());
    }
    walk(value, &mut out);
    out
}

/// The shortest secret [`Registry::redact_document`] replaces in a whole document.
pub const DOCUMENT_MIN: usize = 4;

/// The run's values never to write. Cloning shares the set; it only grows.
#[derive(Clone, Default)]
pub struct Registry(Arc<RwLock<Vec<String>>>);

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Registry({} values)", self.read().len())
    }
}

impl Registry {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<String>> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a secret value (see [`redactable`] for which strings that is).
    pub fn add(&self, secret: &Secret) {
        self.add_strings(redactable(secret.expose()));
    }

    /// Registers strings as they are (empty ones are ignored): for values an adapter learns are
    /// secret by other rules (terraform's `sensitive`, a secret-sounding `env` name).
    pub fn add_strings<I: IntoIterator<Item = String>>(&self, strings: I) {
        let new: Vec<String> = strings.into_iter().filter(|s| !s.is_empty()).collect();
        if new.is_empty() || new.iter().all(|s| self.read().contains(s)) {
            return;
        }
        let mut all = self.0.write().unwrap_or_else(|e| e.into_inner());
        all.extend(new);
        *all = normalize(std::mem::take(&mut *all));
    }

    /// The registered strings, longest first.
    pub fn values(&self) -> Vec<String> {
        self.read().clone()
    }

    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// `text` with every registered value replaced by `***`.
    pub fn redact(&self, text: &str) -> String {
        redact_line(text, &self.read())
    }

    /// A whole rendered document (a report, a runbook, a terminal line, a JUnit file) redacted
    /// once more, as the last line of defence. Values under [`DOCUMENT_MIN`] characters are left
    /// here: in a document they would be replaced inside names and words (`a` inside
    /// `terraform_data.a1`, `status`), and the records, events and lines the document is built
    /// from were redacted of them already.
    pub fn redact_document(&self, text: &str) -> String {
        let secrets = self.read();
        let long: Vec<String> = secrets.iter().filter(|s| s.chars().count() >= DOCUMENT_MIN).cloned().collect();
        redact_line(text, &long)
    }

    /// A JSON document's string values redacted as [`Registry::redact_document`] does; keys,
    /// booleans and numbers as they are.
    pub fn redact_json_document(&self, value: Value) -> Value {
        let secrets = self.read();
        let long: Vec<String> = secrets.iter().filter(|s| s.chars().count() >= DOCUMENT_MIN).cloned().collect();
        fn walk(value: Value, secrets: &[String]) -> Value {
            match value {
                Value::String(s) => Value::String(redact_line(&s, secrets)),
                Value::Array(items) => Value::Array(items.into_iter().map(|v| walk(v, secrets)).collect()),
                Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, walk(v, secrets))).collect()),
                other => other,
            }
        }
        if long.is_empty() {
            value
        } else {
            walk(value, &long)
        }
    }

    /// Every string in `value` (map keys too) redacted; booleans and numbers as they are.
    pub fn redact_json(&self, value: Value) -> Value {
        let secrets = self.read();
        if secrets.is_empty() {
            return value;
        }
        redact_value(value, &secrets)
    }

    /// A failure with every text in it redacted.
    pub fn redact_failure(&self, failure: Failure) -> Failure {
        redact_failure(failure, &self.read())
    }

    /// A serializable value with every string in it redacted, through its JSON form, so no
    /// field can be forgotten: for journal records and reports.
    pub fn redact_serde<T: Serialize + DeserializeOwned>(&self, value: T) -> Result<T, serde_json::Error> {
        if self.is_empty() {
            return Ok(value);
        }
        serde_json::from_value(self.redact_json(serde_json::to_value(&value)?))
    }
}

/// Every string a typed value holds: the value as terraform or a tool would print it whole, and
/// each string inside a map or list, so a secret map is redacted in any rendering.
pub fn value_strings(value: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(items) => {
            out.push(value.to_string());
            items.iter().for_each(|v| out.extend(value_strings(v)));
        }
        serde_json::Value::Object(map) => {
            out.push(value.to_string());
            map.values().for_each(|v| out.extend(value_strings(v)));
        }
        other => out.push(other.to_string()),
    }
    out
}

/// Whether a helm `set` path or an ansible extra var names a secret: any dotted part does
/// (`db.password`, `auth.apiKey`).
pub fn is_secret_key(key: &str) -> bool {
    key.split('.').any(is_secret_name)
}

/// Whether one entry of a value map is secret: the stack marks it, or its key names a secret
/// and its value could be one. A boolean, number or null under a secret-sounding key
/// (`serviceAccount.automountServiceAccountToken: false`) is a setting, not a secret.
pub fn is_secret_entry(key: &str, value: &Value, marked: &BTreeMap<String, Marked>) -> bool {
    marked.contains_key(key)
        || (is_secret_key(key) && !matches!(value, Value::Bool(_) | Value::Number(_) | Value::Null))
}

/// The secret entries of a value map (see [`is_secret_entry`]).
pub fn secret_entries(values: &BTreeMap<String, Value>, marked: &BTreeMap<String, Marked>) -> BTreeMap<String, Value> {
    values.iter().filter(|(k, v)| is_secret_entry(k, v, marked)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Every string to redact for the secret entries of a value map.
pub fn secret_strings(values: &BTreeMap<String, Value>, marked: &BTreeMap<String, Marked>) -> Vec<String> {
    secret_entries(values, marked).values().flat_map(redactable).collect()
}

/// Dotted keys (`db.password`) as the nested object a values file holds.
pub fn nest_dotted(entries: &BTreeMap<String, serde_json::Value>) -> serde_json::Value {
    let mut root = serde_json::Map::new();
    for (key, value) in entries {
        let parts: Vec<&str> = key.split('.').collect();
        let mut node = &mut root;
        for part in &parts[..parts.len() - 1] {
            let child = node.entry(part.to_string()).or_insert_with(|| serde_json::Value::Object(Default::default()));
            if !child.is_object() {
                *child = serde_json::Value::Object(Default::default());
            }
            node = child.as_object_mut().expect("just made an object");
        }
        node.insert(parts[parts.len() - 1].to_string(), value.clone());
    }
    serde_json::Value::Object(root)
}

/// Secret values for a tool to read by name (helm `--values FILE`), never at rest: the JSON
/// lives in a memory file (`memfd_create`) that only this process holds, and `dir/name` is a
/// symbolic link to it (`/proc/PID/fd/N`), which the tool follows while rdeploy lives. A kill -9
/// of rdeploy frees the memory; what it leaves at `dir/name` is a dangling link that holds no
/// value (the next write replaces it). Where memory files are not to be had, the values go to a
/// 0600 file at `dir/name`, deleted when this is dropped.
#[derive(Debug)]
pub struct SecretFile {
    path: std::path::PathBuf,
    /// The memory file the link points to, held open as long as the tool may read it.
    _memory: Option<std::fs::File>,
}

impl SecretFile {
    /// Puts `value` as JSON behind `dir/name`, replacing what an earlier run left there.
    pub fn write(dir: &std::path::Path, name: &str, value: &serde_json::Value) -> std::io::Result<SecretFile> {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        crate::private::create_dir_all(dir)?;
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        if let Ok(fd) = nix::sys::memfd::memfd_create(c"rdeploy-secret", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
        {
            let mut memory = std::fs::File::from(fd);
            // Owner-only, as the file it replaces was (a memory file starts 0777).
            memory.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            memory.write_all(value.to_string().as_bytes())?;
            let target = format!("/proc/{}/fd/{}", std::process::id(), memory.as_raw_fd());
            std::os::unix::fs::symlink(&target, &path)?;
            return Ok(SecretFile { path, _memory: Some(memory) });
        }
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
        let guard = SecretFile { path, _memory: None };
        file.write_all(value.to_string().as_bytes())?;
        file.sync_all()?;
        Ok(guard)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Whether the value is held in memory (else in a 0600 file a kill -9 would leave behind).
    pub fn in_memory(&self) -> bool {
        self._memory.is_some()
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Secret values for a tool that reads a file by its real path and refuses a link into `/proc`
/// (ansible `-e @FILE` resolves the link and finds a memory file's `/memfd:... (deleted)`): a
/// named pipe at `dir/name` (0600), which a thread of rdeploy fills once, for the first reader
/// (a pipe cannot tell one reader's second read from the next reader: served again at once,
/// one read would get the values twice), then removes. One command reads it: one per command.
/// A pipe holds nothing at rest: a kill -9 of rdeploy leaves at most an empty pipe behind (the
/// next serve replaces it), never the values.
#[derive(Debug)]
pub struct SecretPipe {
    path: std::path::PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
}

impl SecretPipe {
    /// How often the server looks for a reader (a reader that opens the pipe first waits for it).
    const POLL: std::time::Duration = std::time::Duration::from_millis(5);

    pub fn serve(dir: &std::path::Path, name: &str, value: &serde_json::Value) -> std::io::Result<SecretPipe> {
        crate::private::create_dir_all(dir)?;
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR)?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let bytes = value.to_string().into_bytes();
        let server = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::Builder::new().name("rdeploy-secret-pipe".into()).spawn(move || {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Non-blocking: no reader yet is ENXIO, and the thread looks again.
                    let opened =
                        std::fs::OpenOptions::new().write(true).custom_flags(nix::libc::O_NONBLOCK).open(&path);
                    match opened {
                        Ok(mut pipe) => {
                            // Blocking from here: the reader takes it all, then sees the end.
                            let fd = std::os::fd::AsRawFd::as_raw_fd(&pipe);
                            let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()));
                            let _ = pipe.write_all(&bytes);
                            let _ = std::fs::remove_file(&path);
                            return;
                        }
                        Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => std::thread::sleep(Self::POLL),
                        // The pipe is gone (removed under us): nothing more to serve.
                        Err(_) => return,
                    }
                }
            })?
        };
        Ok(SecretPipe { path, stop, server: Some(server) })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for SecretPipe {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.path);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
    }
}

/// A file with no name on disk, for what a child writes that may hold secrets (the task
/// messages and diffs ansible's callback records): created unlinked in
/// `dir` (`O_TMPFILE` where the filesystem has it, else created and removed at once; 0600) and
/// reached by the child through this process's descriptor, `/proc/PID/fd/N`, which it opens
/// again as a file of its own while rdeploy holds it. Nothing of it outlives the two: when
/// rdeploy is killed with `kill -9` its descriptor closes and, once the child has closed its
/// own, the kernel frees the file; no run leaves it behind for the next one to delete.
#[derive(Debug)]
pub struct UnlinkedFile {
    file: std::fs::File,
    path: std::path::PathBuf,
}

impl UnlinkedFile {
    /// An empty unlinked file in `dir` (created if missing).
    pub fn new(dir: &std::path::Path) -> std::io::Result<UnlinkedFile> {
        use std::os::fd::AsRawFd;
        crate::private::create_dir_all(dir)?;
        let file = tempfile::tempfile_in(dir)?;
        let path = std::path::PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd()));
        Ok(UnlinkedFile { file, path })
    }

    /// The name a child opens it by (`/proc/PID/fd/N`), valid while this value lives.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// A descriptor of rdeploy's own to read it by (its offset shared with the others it has).
    pub fn reader(&self) -> std::io::Result<std::fs::File> {
        self.file.try_clone()
    }
}

/// Every secret in an event's text replaced by `***`. Sub-change ids are names (resource
/// addresses, hosts, objects), not values, and the checkpoint's keys: they are left as they are,
/// so a short secret cannot turn `terraform_data.a1` into another id. A plain output whose value
/// holds a secret is not redacted but becomes a sensitive one, its value whole: redacted, it
/// would reach its consumers as `postgres://app:***@db` as if that were the value.
pub fn redact_event(event: Event, secrets: &[String]) -> Event {
    let r = |s: String| redact_line(&s, secrets);
    match event {
        Event::Planned { ids } => Event::Planned { ids },
        Event::Started { id } => Event::Started { id },
        Event::Done { id, note } => Event::Done { id, note: note.map(r) },
        Event::InPlace { id, note } => Event::InPlace { id, note: note.map(r) },
        Event::Failed { id, error } => Event::Failed { id, error: r(error) },
        Event::Pending { id, reason } => Event::Pending { id, reason: r(reason) },
        Event::Moved { from, to } => Event::Moved { from, to },
        Event::Fact { key, value } => Event::Fact { key, value: redact_value(value, secrets) },
        Event::Output { stream, line } => Event::Output { stream, line: r(line) },
        Event::Warning { message } => Event::Warning { message: r(message) },
        Event::Outputs { values } => Event::Outputs {
            values: values
                .into_iter()
                .map(|(k, v)| match v {
                    crate::outputs::OutputValue::Plain(v) if redact_value(v.clone(), secrets) != v => {
                        (k, crate::outputs::OutputValue::Sensitive(Secret::new(v)))
                    }
                    other => (k, other),
                })
                .collect(),
        },
    }
}

fn redact_value(value: Value, secrets: &[String]) -> Value {
    match value {
        Value::String(s) => Value::String(redact_line(&s, secrets)),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| redact_value(v, secrets)).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (redact_line(&k, secrets), redact_value(v, secrets))).collect())
        }
        other => other,
    }
}

/// Every secret in a failure's text replaced by `***`.
pub fn redact_failure(failure: Failure, secrets: &[String]) -> Failure {
    let r = |s: String| redact_line(&s, secrets);
    Failure {
        summary: r(failure.summary),
        command: failure.command.map(r),
        stderr_tail: failure.stderr_tail.into_iter().map(r).collect(),
        hint: failure.hint.map(r),
        ..failure
    }
}

/// A sink that redacts every event with the run's registry as it is when the event comes (an
/// adapter may add secrets while it runs).
pub struct RegistrySink<'a> {
    pub inner: &'a dyn EventSink,
    pub registry: &'a Registry,
}

impl EventSink for RegistrySink<'_> {
    fn emit(&self, event: Event) {
        let event = if self.registry.is_empty() { event } else { redact_event(event, &self.registry.read()) };
        self.inner.emit(event);
    }
}

/// A sink that redacts every event before handing it on: for what an adapter reads from the
/// tool other than its output lines (ansible's callback records).
pub struct RedactingSink<'a> {
    pub inner: &'a dyn EventSink,
    pub secrets: Vec<String>,
}

impl EventSink for RedactingSink<'_> {
    fn emit(&self, event: Event) {
        self.inner.emit(redact_event(event, &self.secrets));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Adapter;

    #[test]
    fn a_boolean_or_number_under_a_secret_key_is_no_secret() {
        let values: BTreeMap<String, serde_json::Value> = [
            ("serviceAccount.automountServiceAccountToken", serde_json::json!(false)),
            ("auth.tokenTtl", serde_json::json!(60)),
            ("auth.password", serde_json::json!("hunter22")),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .into();
        assert_eq!(secret_strings(&values, &BTreeMap::new()), vec!["hunter22".to_string()]);
        // Marked, a number is secret too (it goes to the tool off the command line), but it is
        // never redacted in text.
        let marked = BTreeMap::from([("auth.tokenTtl".to_string(), Marked::inline(serde_json::json!(60)))]);
        assert!(secret_entries(&values, &marked).contains_key("auth.tokenTtl"));
        assert_eq!(secret_strings(&values, &marked), vec!["hunter22".to_string()]);
    }

    #[test]
    fn a_secret_file_is_0600_and_gone_when_dropped() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let entries = BTreeMap::from([
            ("db.password".to_string(), serde_json::json!("pw")),
            ("db.user".into(), serde_json::json!("u")),
        ]);
        let file = SecretFile::write(dir.path(), "secret.json", &nest_dotted(&entries)).unwrap();
        let meta = std::fs::metadata(file.path()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file.path()).unwrap()).unwrap();
        assert_eq!(doc, serde_json::json!({"db": {"password": "pw", "user": "u"}}));
        // Nothing at rest: the name is a link into this process's memory.
        assert!(std::fs::symlink_metadata(file.path()).unwrap().file_type().is_symlink());
        let path = file.path().to_path_buf();
        drop(file);
        assert!(std::fs::symlink_metadata(&path).is_err());
    }

    /// The pipe gives the whole document to its reader once, and holds nothing itself.
    #[test]
    fn a_secret_pipe_serves_its_reader_once_and_is_gone_after() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let value = serde_json::json!({"login": "pw"});
        let pipe = SecretPipe::serve(dir.path(), "vars.json", &value).unwrap();
        assert!(std::fs::symlink_metadata(pipe.path()).unwrap().file_type().is_fifo());
        let read: serde_json::Value = serde_json::from_slice(&std::fs::read(pipe.path()).unwrap()).unwrap();
        assert_eq!(read, value);
        let path = pipe.path().to_path_buf();
        drop(pipe);
        assert!(std::fs::symlink_metadata(&path).is_err());
    }

    #[test]
    fn the_registry_redacts_strings_of_one_character_or_more_and_never_booleans_or_numbers() {
        let registry = Registry::default();
        registry.add(&Secret::new(serde_json::json!("x")));
        registry.add(&Secret::new(serde_json::json!(false)));
        registry.add(&Secret::new(serde_json::json!(1234)));
        registry.add(&Secret::new(serde_json::json!({"user": "admin-1", "n": 3})));
        assert_eq!(registry.values(), vec![r#"{"n":3,"user":"admin-1"}"#.to_string(), "admin-1".into(), "x".into()]);
        assert_eq!(registry.redact("-input=false -var n=1234 tax admin-1"), "-input=false -var n=1234 ta*** ***");
        // A whole document keeps what is under four characters (it would be replaced inside names).
        assert_eq!(registry.redact_document("terraform_data.x1: admin-1"), "terraform_data.x1: ***");
        let doc = registry.redact_json_document(serde_json::json!({"x": "admin-1", "id": "x1", "ok": false}));
        assert_eq!(doc, serde_json::json!({"x": "***", "id": "x1", "ok": false}));
        // Clones share one set: an adapter adding a secret is seen by the driver.
        registry.clone().add_strings(["late-secret".to_string()]);
        assert_eq!(registry.redact("a late-secret"), "a ***");
        assert_eq!(format!("{:?}", Secret::new(serde_json::json!("admin-1"))), "Secret(***)");
    }

    #[test]
    fn marked_values_are_read_from_the_environment_or_a_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("login"), "line one\nline two\r\n").unwrap();
        let env = |name: &str| (name == "CI_LOGIN").then(|| "from-env".to_string());
        let read = |m: Marked| m.resolve(dir.path(), &env).map(|s| s.expose().clone());
        assert_eq!(read(Marked::from_env("CI_LOGIN")), Ok(serde_json::json!("from-env")));
        // One trailing newline goes; the rest of the file is the value.
        assert_eq!(read(Marked::from_file("login")), Ok(serde_json::json!("line one\nline two")));
        assert_eq!(read(Marked::inline(serde_json::json!(7))), Ok(serde_json::json!(7)));
        let missing = read(Marked::from_env("NOT_SET")).unwrap_err();
        assert_eq!(missing, SecretError::MissingEnv { name: "NOT_SET".into() });
        assert!(missing.to_string().contains("`NOT_SET` is not set"), "{missing}");
        assert!(missing.hint().contains("export NOT_SET="), "{}", missing.hint());
        assert!(matches!(read(Marked::from_file("nope")), Err(SecretError::File { .. })));
    }

    #[test]
    fn resolving_a_spec_puts_marked_values_in_its_tool_key_and_registers_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("key.pem"), "PEM-BODY\n").unwrap();
        let mut spec = crate::ToolSpec::Helm(
            serde_json::from_value(serde_json::json!({"release": "r", "chart": "c", "set": {"tier": "gold"}})).unwrap(),
        );
        let marked = spec.marked_mut().unwrap();
        marked.insert("tls.key".into(), Marked::from_file("key.pem"));
        marked.insert("db.pass".into(), Marked::from_env("CI_DB"));
        let registry = Registry::default();
        let env = |name: &str| (name == "CI_DB").then(|| "db-secret".to_string());
        spec.resolve_secrets(dir.path(), &env, &registry).unwrap();
        let crate::ToolSpec::Helm(helm) = &spec else { unreachable!() };
        assert_eq!(helm.set.get("tls.key"), Some(&serde_json::json!("PEM-BODY")));
        assert_eq!(helm.set.get("db.pass"), Some(&serde_json::json!("db-secret")));
        assert_eq!(registry.values(), vec!["db-secret".to_string(), "PEM-BODY".into()]);
        // Read once: a resolved spec is not read again; an unresolved one names the key.
        let none = |_: &str| None;
        spec.clone().resolve_secrets(Path::new("/nonexistent"), &none, &registry).unwrap();
        let mut fresh =
            crate::ToolSpec::Helm(serde_json::from_value(serde_json::json!({"release": "r", "chart": "c"})).unwrap());
        fresh.marked_mut().unwrap().insert("db.pass".into(), Marked::from_env("CI_DB"));
        let (key, e) = fresh.resolve_secrets(Path::new("/nonexistent"), &none, &registry).unwrap_err();
        assert_eq!((key.as_str(), e), ("db.pass", SecretError::MissingEnv { name: "CI_DB".into() }));
    }

    #[test]
    fn secret_keys_are_any_dotted_part() {
        assert!(is_secret_key("db.password") && is_secret_key("auth.apiKey") && is_secret_key("db_password"));
        assert!(!is_secret_key("image.tag") && !is_secret_key("keyboard.layout"));
    }

    #[test]
    fn map_values_are_redacted_whole_and_by_leaf() {
        let v = serde_json::json!({"user": "admin", "pass": "hunter22"});
        let strings = value_strings(&v);
        assert!(strings.contains(&"hunter22".to_string()));
        assert!(strings.contains(&v.to_string()));
    }
}

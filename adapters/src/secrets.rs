//! What is secret, and the values rdeploy must never write: the values of `env` keys whose name
//! says they are secret (a word part `password`, `passwd`, `token`, `secret`, `key`,
//! `credential`, case-insensitive), and whatever an adapter learns the tool treats as sensitive
//! (terraform variables declared `sensitive = true`). Everything else prints as it is.

use std::collections::BTreeMap;

use crate::process::redact_line;
use crate::{Event, EventSink, Failure};

/// Word parts that make a name secret on their own (`API_KEY`, `db-password`, `GITHUB_TOKEN`).
const SECRET_WORDS: &[&str] = &["password", "passwd", "pwd", "token", "secret", "key", "credential", "apikey"];
/// Word-part endings that make a name secret (`dbpassword`, `accesstoken`, `clientsecret`); `key`
/// is not one of them, so `MONKEY` and `KEYBOARD_LAYOUT` stay plain.
const SECRET_ENDINGS: &[&str] = &["password", "passwd", "token", "secret", "credential", "apikey"];

/// Whether a variable or key name says its value is secret. The name is split into word parts
/// at `_`, `-`, `.`, `/` and lower-to-upper case changes (`dbPassword`), and a part matches when
/// it is one of the secret words (or its plural) or ends with one of the long ones.
pub fn is_secret_name(name: &str) -> bool {
    word_parts(name).iter().any(|part| {
        let singular = part.strip_suffix('s').unwrap_or(part);
        SECRET_WORDS.contains(&part.as_str())
            || SECRET_WORDS.contains(&singular)
            || SECRET_ENDINGS.iter().any(|end| part.ends_with(end) || singular.ends_with(end))
    })
}

fn word_parts(name: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                parts.push(std::mem::take(&mut current));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !current.is_empty() {
            parts.push(std::mem::take(&mut current));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        parts.push(current);
    }
    parts
}

/// The values of the `env` entries whose name is secret. A name alone does not make a setting a
/// secret: a number, a boolean word or a value under four characters (`TOKEN_TTL: "60"`) is left
/// in clear, since redacting it everywhere would corrupt the tools' own output.
pub fn env_secrets(env: &BTreeMap<String, String>) -> Vec<String> {
    env.iter().filter(|(k, v)| is_secret_name(k) && plausible_secret(v)).map(|(_, v)| v.clone()).collect()
}

fn plausible_secret(value: &str) -> bool {
    let lower = value.trim().to_ascii_lowercase();
    lower.len() >= 4 && lower.parse::<f64>().is_err() && !matches!(lower.as_str(), "true" | "false" | "null")
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

/// Secrets ready for redaction: no empty ones, no duplicates, longest first so a secret that
/// contains another is replaced whole.
pub fn normalize(mut secrets: Vec<String>) -> Vec<String> {
    secrets.retain(|s| !s.is_empty());
    secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    secrets
}

/// Whether a helm `set` path or an ansible extra var names a secret: any dotted part does
/// (`db.password`, `auth.apiKey`).
pub fn is_secret_key(key: &str) -> bool {
    key.split('.').any(is_secret_name)
}

/// The entries of a value map whose key names a secret. A boolean, number or null is no secret
/// whatever its key says (`serviceAccount.automountServiceAccountToken: false`): redacting
/// `false` or `3` everywhere would only corrupt the tools' JSON output.
pub fn secret_entries(values: &BTreeMap<String, serde_json::Value>) -> BTreeMap<String, serde_json::Value> {
    values
        .iter()
        .filter(|(k, v)| {
            is_secret_key(k)
                && !matches!(v, serde_json::Value::Bool(_) | serde_json::Value::Number(_) | serde_json::Value::Null)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Every string to redact for the secret entries of a value map.
pub fn secret_strings(values: &BTreeMap<String, serde_json::Value>) -> Vec<String> {
    secret_entries(values).values().flat_map(value_strings).collect()
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

/// A file holding secret values for a tool to read (helm `--values`, ansible `-e @file`):
/// created 0600 and new (`O_EXCL` never follows a symlink), and deleted when dropped.
#[derive(Debug)]
pub struct SecretFile {
    path: std::path::PathBuf,
}

impl SecretFile {
    /// Writes `value` as JSON to `dir/name` (0600), replacing a stale file of an earlier run.
    pub fn write(dir: &std::path::Path, name: &str, value: &serde_json::Value) -> std::io::Result<SecretFile> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::create_dir_all(dir)?;
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
        let guard = SecretFile { path };
        file.write_all(value.to_string().as_bytes())?;
        file.sync_all()?;
        Ok(guard)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Every secret in an event's text replaced by `***`.
pub fn redact_event(event: Event, secrets: &[String]) -> Event {
    let r = |s: String| redact_line(&s, secrets);
    match event {
        Event::Planned { ids } => Event::Planned { ids: ids.into_iter().map(r).collect() },
        Event::Started { id } => Event::Started { id: r(id) },
        Event::Done { id, note } => Event::Done { id: r(id), note: note.map(r) },
        Event::Failed { id, error } => Event::Failed { id: r(id), error: r(error) },
        Event::Pending { id, reason } => Event::Pending { id: r(id), reason: r(reason) },
        Event::Moved { from, to } => Event::Moved { from: r(from), to: r(to) },
        Event::Fact { key, value } => Event::Fact { key, value: redact_value(value, secrets) },
        Event::Output { stream, line } => Event::Output { stream, line: r(line) },
        Event::Warning { message } => Event::Warning { message: r(message) },
    }
}

fn redact_value(value: serde_json::Value, secrets: &[String]) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(redact_line(&s, secrets)),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| redact_value(v, secrets)).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, redact_value(v, secrets))).collect()),
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

    #[test]
    fn secret_names_are_word_parts() {
        for name in [
            "API_KEY",
            "DB_PASSWORD",
            "GITHUB_TOKEN",
            "client-secret",
            "db.password",
            "dbPassword",
            "AWS_SECRET_ACCESS_KEY",
            "ssh_keys",
            "ACCESSTOKEN",
            "MYSQL_PWD",
            "credentials",
            "PGPASSWORD",
        ] {
            assert!(is_secret_name(name), "{name} should be secret");
        }
        for name in ["KEYBOARD_LAYOUT", "MONKEY", "enabled", "region", "TOKENIZER_MODE", "HOME", "replicas", "passage"]
        {
            assert!(!is_secret_name(name), "{name} should be plain");
        }
    }

    #[test]
    fn env_secrets_take_only_secret_names() {
        let env: BTreeMap<String, String> = [
            ("DB_PASSWORD", "pw-1234"),
            ("REGION", "eu"),
            ("API_KEY", "k2-abcd"),
            // Settings with a secret-sounding name: a number, a boolean, a tiny value.
            ("TOKEN_TTL", "60"),
            ("USE_TOKEN", "true"),
            ("SECRET_MODE", "on"),
        ]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
        assert_eq!(normalize(env_secrets(&env)), vec!["k2-abcd".to_string(), "pw-1234".to_string()]);
    }

    #[test]
    fn a_boolean_or_number_under_a_secret_key_is_no_secret() {
        let values: BTreeMap<String, serde_json::Value> = [
            ("serviceAccount.automountServiceAccountToken", serde_json::json!(false)),
            ("auth.tokenTtl", serde_json::json!(60)),
            ("auth.password", serde_json::json!("hunter22")),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .into();
        assert_eq!(secret_strings(&values), vec!["hunter22".to_string()]);
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
        let path = file.path().to_path_buf();
        drop(file);
        assert!(!path.exists());
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

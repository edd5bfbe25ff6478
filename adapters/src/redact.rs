//! The plain pieces of redaction that the modules handling secrets share: a secret value
//! ([`Secret`]), the names that say a value is secret ([`is_secret_name`], [`env_secrets`]), and
//! replacing values in a line ([`redact_line`], [`normalize`]). It imports no other module of
//! the crate, so `secrets` (marked values, the run's registry), `outputs` and `process` build on
//! it without importing one another in a circle.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// A secret value. `Debug` and `Display` print `***`; there is no `Serialize`.
#[derive(Clone, PartialEq)]
pub struct Secret(Value);

impl Secret {
    pub fn new(value: Value) -> Secret {
        Secret(value)
    }

    /// The value itself, for the tool (a 0600 file, its environment): never for text rdeploy writes.
    pub fn expose(&self) -> &Value {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

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

/// Secrets ready for redaction: no empty ones, no duplicates, longest first so a secret that
/// contains another is replaced whole.
pub fn normalize(mut secrets: Vec<String>) -> Vec<String> {
    secrets.retain(|s| !s.is_empty());
    secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    secrets
}

/// Replaces every secret in `line` by `***`.
pub fn redact_line(line: &str, secrets: &[String]) -> String {
    let mut out = line.to_string();
    for secret in secrets {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{env_secrets, is_secret_name, normalize, redact_line};

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

    /// Every secret is replaced, the longest first ([`normalize`]), so one that holds another
    /// is replaced whole.
    #[test]
    fn a_line_is_redacted_longest_secret_first() {
        let secrets = normalize(vec!["pw".into(), "pw-1234".into(), String::new(), "pw".into()]);
        assert_eq!(secrets, ["pw-1234", "pw"]);
        assert_eq!(redact_line("login pw-1234 then pw", &secrets), "login *** then ***");
        assert_eq!(redact_line("nothing here", &secrets), "nothing here");
    }
}

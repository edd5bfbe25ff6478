//! Step outputs: the values a step produces for later steps (`${{ steps.NAME.outputs.KEY }}`),
//! each from the tool's own mechanism (terraform's root outputs, the shell's `$RDEPLOY_OUTPUT`
//! file, the helm release, kubectl's jsonpath, ansible's `set_stats`).
//!
//! A sensitive value is held in a [`Secret`], as the stack's marked values are: it has no
//! `Serialize` and its `Debug` prints no value, so it cannot reach the journal, a report or a
//! log by accident; only [`Secret::expose`] hands the value out, to the consumer's process. The
//! driver registers it with the run's [`crate::secrets::Registry`] once it has it, so the
//! central redaction covers wherever else it shows up.

use std::collections::BTreeMap;

use serde_json::Value;

pub use crate::redact::Secret;

/// One output as its producer reported it.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputValue {
    Plain(Value),
    Sensitive(Secret),
}

impl OutputValue {
    pub fn is_sensitive(&self) -> bool {
        matches!(self, OutputValue::Sensitive(_))
    }

    /// The value, for the consumer (a sensitive one is exposed: callers redact it).
    pub fn value(&self) -> &Value {
        match self {
            OutputValue::Plain(v) => v,
            OutputValue::Sensitive(s) => s.expose(),
        }
    }
}

/// A step's outputs by key.
pub type Outputs = BTreeMap<String, OutputValue>;

/// An output value as text in a string it is substituted into: a string as it is, anything
/// else as JSON (`3`, `true`, `["a","b"]`).
pub fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether `key` can name an output: letters, digits, `_` and `-`, not starting with a digit
/// or `-` (as a `$GITHUB_OUTPUT` key and a terraform output name).
pub fn valid_key(key: &str) -> bool {
    key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Reads a `$RDEPLOY_OUTPUT` file: `KEY=VALUE` lines and `KEY<<DELIMITER` blocks (a multi-line
/// value up to a line holding only the delimiter), as GitHub Actions reads `$GITHUB_OUTPUT`.
/// Blank lines are skipped; a later line for a key replaces the earlier one.
pub fn parse_output_file(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let heredoc = line.split_once("<<").filter(|(k, _)| !k.contains('='));
        if let Some((key, delimiter)) = heredoc {
            if !valid_key(key) {
                return Err(format!("line {}: `{key}` is not an output name", n + 1));
            }
            if delimiter.is_empty() {
                return Err(format!("line {}: `{key}<<` needs a delimiter (`{key}<<EOF`)", n + 1));
            }
            let mut value: Vec<&str> = Vec::new();
            let mut closed = false;
            for (_, body) in lines.by_ref() {
                let body = body.strip_suffix('\r').unwrap_or(body);
                if body == delimiter {
                    closed = true;
                    break;
                }
                value.push(body);
            }
            if !closed {
                return Err(format!("line {}: `{key}<<{delimiter}` is never closed by a `{delimiter}` line", n + 1));
            }
            out.insert(key.to_string(), value.join("\n"));
        } else if let Some((key, value)) = line.split_once('=') {
            if !valid_key(key) {
                return Err(format!("line {}: `{key}` is not an output name", n + 1));
            }
            out.insert(key.to_string(), value.to_string());
        } else {
            return Err(format!("line {}: expected `KEY=VALUE` or `KEY<<EOF`, found `{line}`", n + 1));
        }
    }
    Ok(out)
}

/// The root module's outputs from `terraform output -json`: `{NAME: {sensitive, type, value}}`.
pub fn parse_terraform_outputs(json: &str) -> Result<Outputs, String> {
    let doc: BTreeMap<String, Value> = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let mut out = Outputs::new();
    for (name, entry) in doc {
        let sensitive = entry.get("sensitive").and_then(Value::as_bool).unwrap_or(false);
        let value = entry.get("value").cloned().unwrap_or(Value::Null);
        out.insert(
            name,
            if sensitive { OutputValue::Sensitive(Secret::new(value)) } else { OutputValue::Plain(value) },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_key_value_and_heredoc_lines() {
        let text = "url=http://db:5432/app?a=b\n\nnotes<<EOF\nline one\nline=two\nEOF\nempty=\nurl=again\n";
        let out = parse_output_file(text).unwrap();
        assert_eq!(out["url"], "again");
        assert_eq!(out["notes"], "line one\nline=two");
        assert_eq!(out["empty"], "");
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn a_bad_output_line_is_named() {
        assert_eq!(
            parse_output_file("just words\n").unwrap_err(),
            "line 1: expected `KEY=VALUE` or `KEY<<EOF`, found `just words`"
        );
        assert!(parse_output_file("k<<EOF\nno end\n").unwrap_err().contains("never closed"));
        assert!(parse_output_file("1x=3\n").unwrap_err().contains("not an output name"));
    }

    #[test]
    fn terraform_outputs_keep_their_type_and_sensitivity() {
        let json = r#"{"db_url":{"sensitive":false,"type":"string","value":"pg://db"},
                      "password":{"sensitive":true,"type":"string","value":"hunter22"},
                      "ports":{"sensitive":false,"type":["list","number"],"value":[1,2]}}"#;
        let out = parse_terraform_outputs(json).unwrap();
        assert_eq!(out["db_url"], OutputValue::Plain(Value::from("pg://db")));
        assert_eq!(out["ports"].value(), &serde_json::json!([1, 2]));
        assert!(out["password"].is_sensitive());
        assert!(!format!("{:?}", out["password"]).contains("hunter22"));
        assert_eq!(value_text(out["ports"].value()), "[1,2]");
    }
}

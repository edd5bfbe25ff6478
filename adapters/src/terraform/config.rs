//! A light read of a configuration's `variable` blocks: which are declared `sensitive`, so the
//! runbook never writes their values. Not an HCL parser; it only has to find those blocks.

use std::collections::BTreeSet;
use std::path::Path;

use regex::Regex;

/// Names of root-module variables declared `sensitive = true` in the `*.tf` files of `dir`.
pub fn declared_sensitive(dir: &Path) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeSet::new() };
    let mut names = BTreeSet::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "tf") {
            if let Ok(text) = std::fs::read_to_string(&path) {
                names.extend(sensitive_in(&text));
            }
        }
    }
    names
}

/// The sensitive variable names declared in one file's text.
pub fn sensitive_in(text: &str) -> Vec<String> {
    let header = Regex::new(r#"(?m)^\s*variable\s+"([^"]+)"\s*\{"#).expect("static regex");
    let sensitive = Regex::new(r"(?m)^\s*sensitive\s*=\s*true\b").expect("static regex");
    let mut names = Vec::new();
    for caps in header.captures_iter(text) {
        let whole = caps.get(0).expect("match");
        let body = block_body(&text[whole.end()..]);
        if sensitive.is_match(body) {
            names.push(caps[1].to_string());
        }
    }
    names
}

/// The text up to the brace that closes a block whose `{` was just consumed.
fn block_body(rest: &str) -> &str {
    let mut depth = 1usize;
    for (i, c) in rest.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &rest[..i];
                }
            }
            _ => {}
        }
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_sensitive_variable_of_the_fixture() {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/terraform/sensitive"));
        assert_eq!(declared_sensitive(dir).into_iter().collect::<Vec<_>>(), vec!["token"]);
    }

    #[test]
    fn nested_blocks_do_not_end_the_variable_early() {
        let text = r#"
variable "a" {
  validation {
    condition     = length(var.a) > 0
    error_message = "empty"
  }
  sensitive = true
}
variable "b" { default = "x" }
variable "c" {
  sensitive = false
}
"#;
        assert_eq!(sensitive_in(text), vec!["a"]);
    }
}

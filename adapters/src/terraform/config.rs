//! A light read of a configuration's `variable` blocks (which are declared `sensitive`, so the
//! runbook never writes their values) and `moved` blocks (which addresses the configuration
//! renames). Not an HCL parser; it only has to find those blocks.

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

/// The `moved { from = A  to = B }` blocks of the root module's `*.tf` files, in file order.
/// terraform says nothing of a `moved` block whose `from` is not in its state (a resource that
/// was never created): this is how rdeploy still knows the two addresses are one resource.
pub fn moved_blocks(dir: &Path) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<_> =
        entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "tf")).collect();
    files.sort();
    files.iter().filter_map(|p| std::fs::read_to_string(p).ok()).flat_map(|text| moved_in(&text)).collect()
}

/// The `(from, to)` of every `moved` block in one file's text.
pub fn moved_in(text: &str) -> Vec<(String, String)> {
    let header = Regex::new(r"(?m)^\s*moved\s*\{").expect("static regex");
    let attribute = |body: &str, name: &str| {
        let re = Regex::new(&format!(r"(?m)^\s*{name}\s*=\s*(.+?)\s*(?:#.*|//.*)?$")).expect("static regex");
        re.captures(body).map(|c| c[1].to_string())
    };
    header
        .find_iter(text)
        .filter_map(|m| {
            let body = block_body(&text[m.end()..]);
            Some((attribute(body, "from")?, attribute(body, "to")?))
        })
        .collect()
}

/// Where the `moved` blocks send a recorded address: `from` itself, one of its instances
/// (`from[0]`, `from["a"]`) or, for a module, anything in it (`from.terraform_data.x`), each
/// block in turn, as terraform chains them. `None` when no block moves it.
pub fn moved_address(blocks: &[(String, String)], addr: &str) -> Option<String> {
    let mut current = addr.to_string();
    for _ in 0..=blocks.len() {
        let next = blocks.iter().find_map(|(from, to)| {
            let rest = current.strip_prefix(from.as_str())?;
            (rest.is_empty() || rest.starts_with('[') || rest.starts_with('.')).then(|| format!("{to}{rest}"))
        });
        match next {
            Some(next) if next != current => current = next,
            _ => break,
        }
    }
    (current != addr).then_some(current)
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
    fn moved_blocks_and_where_they_send_an_address() {
        let text = r#"
resource "terraform_data" "b" {}
moved {
  from = terraform_data.a # renamed in 2.0
  to   = terraform_data.b
}
moved {
  from = module.old
  to   = module.new
}
moved {
  from = terraform_data.b
  to   = terraform_data.c
}
"#;
        let blocks = moved_in(text);
        assert_eq!(blocks[0], ("terraform_data.a".to_string(), "terraform_data.b".to_string()));
        assert_eq!(blocks.len(), 3);
        assert_eq!(moved_address(&blocks, "terraform_data.a").as_deref(), Some("terraform_data.c"));
        assert_eq!(moved_address(&blocks, r#"terraform_data.a["x"]"#).as_deref(), Some(r#"terraform_data.c["x"]"#));
        assert_eq!(
            moved_address(&blocks, "module.old[0].terraform_data.x").as_deref(),
            Some("module.new[0].terraform_data.x")
        );
        assert_eq!(moved_address(&blocks, "terraform_data.ab"), None);
        assert_eq!(moved_address(&blocks, "module.older.terraform_data.x"), None);
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

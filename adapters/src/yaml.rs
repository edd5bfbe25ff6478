//! The one YAML module: every YAML text rdeploy reads (the stack file, the fleet file, kubectl
//! manifests, helm charts' `Chart.yaml` and values files) is parsed here, so swapping a YAML
//! crate touches this file only.
//!
//! Two readings, two crates:
//! - files a person writes and rdeploy validates (the stack, the fleet file) keep a line and
//!   column on every node ([`parse_located`], [`from_node`], [`from_str_located`], through
//!   `marked_yaml`), are strict (one document, no duplicate keys) and take a UTF-8 byte-order
//!   mark as YAML does;
//! - documents rdeploy only hands on (manifests, values) become JSON values ([`documents`],
//!   [`value`], through `serde_norway`, the maintained fork of the archived `serde_yaml`).

use std::fmt;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

pub use marked_yaml::types::{
    MarkedMappingNode as MappingNode, MarkedScalarNode as ScalarNode, MarkedSequenceNode as SequenceNode,
};
pub use marked_yaml::{Marker, Node, Span, Spanned};

/// A place in a text: 1-based line and column (columns count characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl From<Marker> for Location {
    fn from(m: Marker) -> Location {
        Location { line: m.line(), column: m.column() }
    }
}

/// Why a located text could not be read, with where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LoadError {
    pub at: Option<Location>,
    /// Lower case, says what is wrong (`key `run` appears twice ...`).
    pub message: String,
}

/// Why a located node did not deserialize into a type.
#[derive(Debug)]
pub struct DecodeError {
    pub at: Option<Location>,
    /// The serde path to the value (`gate.inventory.kinds[0]`), when not the top.
    pub path: Option<String>,
    /// For an unknown field: the field and the fields the type accepts.
    pub unknown_field: Option<Box<(String, &'static [&'static str])>>,
    /// Lower case, from the deserializer.
    pub message: String,
    /// What the value may be, when the deserializer knows (`wait: yes please`: `true` or `false`).
    pub hint: Option<&'static str>,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DecodeError {}

/// The byte-order mark some editors put first; YAML allows it at the start of a stream.
const BOM: char = '\u{feff}';

/// Text from bytes: invalid UTF-8 is an error located at the first bad byte.
pub fn decode_utf8(bytes: Vec<u8>) -> Result<String, LoadError> {
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        // `valid` is valid UTF-8 by construction.
        let before = std::str::from_utf8(valid).unwrap_or_default();
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
        LoadError {
            at: Some(Location { line, column }),
            message: format!("the file is not valid UTF-8 (byte 0x{:02x})", e.as_bytes()[valid.len()]),
        }
    })
}

/// The characters YAML forbids in a stream (every C0 control but tab, line feed and carriage
/// return; DEL; the C1 controls but NEL; U+FFFE and U+FFFF), each with where it is, in order.
/// The parser stops at a NUL as if the text ended there, so a stack file cut short by one would
/// read as a shorter stack without a word: they are looked for before parsing.
pub fn forbidden_characters(text: &str) -> Vec<(Location, char)> {
    let mut found = Vec::new();
    let (mut line, mut column) = (1, 1);
    for c in text.chars() {
        let allowed = matches!(c, '\t' | '\n' | '\r' | '\u{85}' | '\u{feff}')
            || !(c.is_control() || c == '\u{fffe}' || c == '\u{ffff}');
        if !allowed {
            found.push((Location { line, column }, c));
        }
        if c == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    found
}

/// Every scalar under `node` longer than `max` bytes, with its span and length.
pub fn long_scalars(node: &Node, max: usize) -> Vec<(Span, usize)> {
    let mut found = Vec::new();
    let mut stack = vec![node];
    while let Some(node) = stack.pop() {
        match node {
            Node::Scalar(s) if s.as_str().len() > max => found.push((*s.span(), s.as_str().len())),
            Node::Scalar(_) => {}
            Node::Mapping(m) => {
                for (key, value) in m.iter() {
                    if key.as_str().len() > max {
                        found.push((*key.span(), key.as_str().len()));
                    }
                    stack.push(value);
                }
            }
            Node::Sequence(items) => stack.extend(items.iter()),
        }
    }
    found.sort_by_key(|(span, _)| span.start().map(|m| (m.line(), m.column())));
    found
}

/// The bytes of every scalar (keys included) under `node`.
pub fn scalar_bytes(node: &Node) -> usize {
    match node {
        Node::Scalar(s) => s.as_str().len(),
        Node::Mapping(m) => m.iter().map(|(k, v)| k.as_str().len() + scalar_bytes(v)).sum(),
        Node::Sequence(items) => items.iter().map(scalar_bytes).sum(),
    }
}

/// Parses one YAML document whose top is a mapping, keeping every node's position. A second
/// document, a duplicate key in any mapping, anchors and tags are errors; a leading byte-order
/// mark is skipped. Quoted scalars are marked as such: read values through [`coercible`] for
/// serde, and through [`typed_json`] where the YAML type must reach a tool.
pub fn parse_located(text: &str) -> Result<Node, LoadError> {
    let text = text.strip_prefix(BOM).unwrap_or(text);
    let options = marked_yaml::LoaderOptions::default().error_on_duplicate_keys(true).prevent_coercion(true);
    let node = marked_yaml::parse_yaml_with_options(0, text, options).map_err(|e| describe(&e))?;
    if let Some(at) = second_document(text) {
        return Err(LoadError {
            at: Some(at),
            message: "a second YAML document starts here; a stack file holds one".into(),
        });
    }
    Ok(node)
}

/// [`parse_located`] that reads on past duplicate keys: each one is in the list (at the second
/// key, naming the first's line), and the node keeps the last value written for the key, so
/// that the rest of the file can still be checked. Any other error is the `Err`.
pub fn parse_located_all(text: &str) -> Result<(Node, Vec<LoadError>), LoadError> {
    let text = text.strip_prefix(BOM).unwrap_or(text);
    let options = marked_yaml::LoaderOptions::default().error_on_duplicate_keys(false).prevent_coercion(true);
    let node = marked_yaml::parse_yaml_with_options(0, text, options).map_err(|e| describe(&e))?;
    if let Some(at) = second_document(text) {
        return Err(LoadError {
            at: Some(at),
            message: "a second YAML document starts here; a stack file holds one".into(),
        });
    }
    Ok((node, duplicate_keys(text)))
}

/// Every key written twice in one mapping of the first document, in the order they appear.
fn duplicate_keys(text: &str) -> Vec<LoadError> {
    use std::collections::HashMap;
    use yaml_rust2::parser::{Event, Parser};
    /// A collection being read: a mapping with its keys so far and whether a key comes next.
    enum Open {
        Sequence,
        Mapping { keys: HashMap<String, usize>, key_next: bool },
    }
    /// A node ended inside `open`: in a mapping, a key is followed by a value and the reverse.
    fn ended(open: &mut [Open]) {
        if let Some(Open::Mapping { key_next, .. }) = open.last_mut() {
            *key_next = !*key_next;
        }
    }
    let mut parser = Parser::new_from_str(text);
    let mut open: Vec<Open> = Vec::new();
    let mut found = Vec::new();
    loop {
        let Ok((event, mark)) = parser.next_token() else { return found };
        match event {
            Event::Scalar(value, ..) => {
                if let Some(Open::Mapping { keys, key_next: true }) = open.last_mut() {
                    let line = mark.line();
                    if let Some(first) = keys.get(&value) {
                        found.push(LoadError {
                            at: Some(Location { line, column: mark.col() + 1 }),
                            message: format!("key `{value}` appears twice in the same mapping (first on line {first})"),
                        });
                    } else {
                        keys.insert(value, line);
                    }
                }
                ended(&mut open);
            }
            Event::Alias(_) => ended(&mut open),
            Event::MappingStart(..) => open.push(Open::Mapping { keys: HashMap::new(), key_next: true }),
            Event::SequenceStart(..) => open.push(Open::Sequence),
            Event::MappingEnd | Event::SequenceEnd => {
                open.pop();
                ended(&mut open);
            }
            Event::DocumentEnd | Event::StreamEnd => return found,
            _ => {}
        }
    }
}

/// The message of a located text whose top is not a mapping.
pub const NOT_A_MAPPING: &str = "the file must be a mapping";

/// Where a second document starts, if the text has one. `marked_yaml` reads the first
/// document and ignores the rest, so the stream's events are read again up to that point.
fn second_document(text: &str) -> Option<Location> {
    use yaml_rust2::parser::{Event, Parser};
    let mut parser = Parser::new_from_str(text);
    let mut documents = 0;
    loop {
        match parser.next_token() {
            Ok((Event::DocumentStart, mark)) => {
                documents += 1;
                if documents == 2 {
                    return Some(Location { line: mark.line(), column: mark.col() + 1 });
                }
            }
            // The first document parsed, so an error here is in a later one.
            Ok((Event::StreamEnd, _)) => return None,
            Err(e) => {
                let mark = e.marker();
                return (documents >= 1).then_some(Location { line: mark.line(), column: mark.col() + 1 });
            }
            Ok(_) => {}
        }
    }
}

/// Deserializes a located node into `T` (which may hold [`Spanned`] values).
pub fn from_node<T: DeserializeOwned>(node: &Node) -> Result<T, DecodeError> {
    marked_yaml::from_node(node).map_err(|e| {
        let at = e.start_mark().map(Location::from);
        let path = e.path().filter(|p| !p.is_empty() && *p != ".").map(str::to_string);
        let unknown_field = match &*e {
            marked_yaml::Error::UnknownFieldError(field, expected, _) => Some(Box::new((field.clone(), *expected))),
            _ => None,
        };
        let hint = match &*e {
            // The words `Node::as_bool` takes, no more: `yes`/`on` are strings in YAML 1.2.
            marked_yaml::Error::NotBoolean(_) => {
                Some("write `true` or `false` (`yes`, `no`, `on` and `off` are strings in YAML 1.2)")
            }
            marked_yaml::Error::IntegerParseFailure(..) => Some("write a whole number, such as `3`"),
            marked_yaml::Error::FloatParseFailure(..) => Some("write a number, such as `0.5`"),
            _ => None,
        };
        DecodeError { at, path, unknown_field, message: lowercase_first(&e.into_inner().to_string()), hint }
    })
}

/// Parses and deserializes a located text (the fleet file) with the same strictness as
/// [`parse_located`].
pub fn from_str_located<T: DeserializeOwned>(text: &str) -> anyhow::Result<T> {
    let node = parse_located(text).map_err(|e| match e.at {
        Some(at) => anyhow::anyhow!("{}:{}: {}", at.line, at.column, e.message),
        None => anyhow::anyhow!(e),
    })?;
    from_node(&node).map_err(|e| match e.at {
        Some(at) => anyhow::anyhow!("{}:{}: {}", at.line, at.column, e.message),
        None => anyhow::anyhow!(e),
    })
}

/// Parses a multi-document YAML (or JSON) text into JSON values, skipping empty documents.
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).map_err(|e| e.to_string())?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// Every document of a YAML (or JSON) text read straight into `T`, with no tree of values in
/// between (a 4,000-context kubeconfig would be 4,000 contexts' worth of maps built and thrown
/// away). An empty text has no documents.
pub fn documents_into<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, String> {
    serde_norway::Deserializer::from_str(text).map(|doc| T::deserialize(doc).map_err(|e| e.to_string())).collect()
}

/// Like [`documents`], each value with the line its document's content starts on (1-based),
/// for messages that name a document by its place in the file. An error says where it is
/// when the parser does.
pub fn documents_located(text: &str) -> Result<Vec<(Option<usize>, Value)>, LoadError> {
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).map_err(|e| LoadError {
            at: e.location().map(|l| Location { line: l.line(), column: l.column() }),
            message: lowercase_first(&strip_location(&e.to_string())),
        })?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    // The same documents read again for where each starts; if the two readers ever disagree
    // on how many there are, no line is given rather than a wrong one.
    let lines = content_lines(text);
    if lines.len() == docs.len() {
        Ok(lines.into_iter().map(Some).zip(docs).collect())
    } else {
        Ok(docs.into_iter().map(|d| (None, d)).collect())
    }
}

/// serde_norway's ` at line L column C`, which [`LoadError::at`] carries instead.
fn strip_location(message: &str) -> String {
    static AT: std::sync::LazyLock<regex::Regex> =
        std::sync::LazyLock::new(|| regex::Regex::new(r" at line \d+ column \d+").expect("static regex"));
    AT.replace(message, "").into_owned()
}

/// The line on which each document's content starts, documents with nothing but comments left
/// out as [`documents`] leaves them out. A line scan for `---` markers at the start of a line
/// (YAML allows them nowhere else: not inside a quoted or block scalar), not a second parse:
/// a few megabytes of CRDs cost milliseconds. A document of only `null` or `~` is counted here
/// and not by [`documents`]: the counts differ and no line is given.
fn content_lines(text: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    let mut open = true; // the stream's first document needs no marker
    for (n, line) in text.lines().enumerate() {
        let line = line.strip_prefix('\u{feff}').unwrap_or(line);
        if let Some(rest) = line.strip_prefix("---") {
            if rest.is_empty() || rest.starts_with([' ', '\t']) {
                open = true;
                // `--- {a: b}`: content on the marker's line.
                let rest = rest.trim();
                if !rest.is_empty() && !rest.starts_with('#') {
                    lines.push(n + 1);
                    open = false;
                }
                continue;
            }
        }
        if line == "..." || line.starts_with("... ") {
            open = false;
            continue;
        }
        let trimmed = line.trim();
        if open && !trimmed.is_empty() && !trimmed.starts_with('#') && !line.starts_with('%') {
            lines.push(n + 1);
            open = false;
        }
    }
    lines
}

/// Parses one YAML document (a helm values file, a `Chart.yaml`) into a JSON value; an empty
/// text is an empty mapping.
pub fn value(text: &str) -> Result<Value, String> {
    match serde_norway::from_str::<Value>(text) {
        Ok(Value::Null) => Ok(Value::Object(Default::default())),
        other => other.map_err(|e| e.to_string()),
    }
}

/// A JSON value as YAML text (keys in the value's order), for diffs a person reads.
pub fn to_text(value: &Value) -> String {
    serde_norway::to_string(value).unwrap_or_else(|e| format!("# not shown as YAML: {e}\n"))
}

/// A located node as JSON, scalars kept as their text (for digests: only stability matters).
pub fn node_to_json(node: &Node) -> Value {
    match node {
        Node::Scalar(s) => Value::String(s.as_str().to_string()),
        Node::Sequence(seq) => Value::Array(seq.iter().map(node_to_json).collect()),
        Node::Mapping(map) => {
            let sorted: std::collections::BTreeMap<String, Value> =
                map.iter().map(|(k, v)| (k.as_str().to_string(), node_to_json(v))).collect();
            serde_json::to_value(sorted).unwrap_or_default()
        }
    }
}

fn describe(e: &marked_yaml::LoadError) -> LoadError {
    use marked_yaml::LoadError::*;
    let (marker, message) = match e {
        TopLevelMustBeMapping(m) => (Some(*m), NOT_A_MAPPING.into()),
        TopLevelMustBeSequence(m) => (Some(*m), "unexpected top-level sequence".into()),
        UnexpectedAnchor(m) => (Some(*m), "YAML anchors and aliases are not supported in stack files".into()),
        MappingKeyMustBeScalar(m) => (Some(*m), "mapping keys must be plain strings".into()),
        UnexpectedTag(m) => (Some(*m), "YAML tags are not supported in stack files".into()),
        ScanError(m, err) => (Some(*m), format!("invalid YAML: {}", err.info())),
        DuplicateKey(inner) => (
            inner.key.span().start().copied(),
            format!(
                "key `{}` appears twice in the same mapping (first on line {})",
                inner.key.as_str(),
                inner.prev_key.span().start().map(|m| m.line()).unwrap_or(0)
            ),
        ),
        #[allow(unreachable_patterns)]
        _ => (None, "invalid YAML".into()),
    };
    LoadError { at: marker.map(Location::from), message }
}

fn lowercase_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `node` with every scalar readable as a boolean or number, whether quoted or not, as serde
/// reads the stack's own keys (`wait: "true"` is a boolean there).
pub fn coercible(mut node: Node) -> Node {
    fn walk(node: &mut Node) {
        match node {
            Node::Scalar(s) => s.set_coerce(true),
            Node::Sequence(seq) => seq.iter_mut().for_each(walk),
            Node::Mapping(map) => map.values_mut().for_each(walk),
        }
    }
    walk(&mut node);
    node
}

/// A YAML node as JSON with its YAML type: a plain scalar is null, a boolean, an integer or a
/// float when it reads as one (YAML 1.2's core schema), a quoted scalar is always a string.
///
/// Core-schema integers include `0x1F` (31) and `0o17` (15); the tools get them as JSON numbers
/// (`--set-json 'k=31'`: helm's flag takes JSON, where `0x1F` is no number). `017` is decimal 17
/// as YAML 1.2 says, though helm's own values files (YAML 1.1) read it as octal 15; YAML 1.1's
/// `1_000`, `0b101` and `on`/`yes` stay strings. `.inf` and `.nan` are core floats JSON cannot
/// carry: they stay strings.
pub fn typed_json(node: &Node) -> serde_json::Value {
    use serde_json::Value;
    match node {
        Node::Scalar(s) if !s.may_coerce() => Value::String(s.as_str().to_string()),
        Node::Scalar(s) => {
            let text = s.as_str();
            let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
            let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
            let float_like = {
                let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
                    Some((m, e)) => (m, Some(e.strip_prefix(['-', '+']).unwrap_or(e))),
                    None => (unsigned, None),
                };
                let mantissa_ok = match mantissa.split_once('.') {
                    Some((int, frac)) => {
                        (int.is_empty() || digits(int)) && (digits(frac) || (frac.is_empty() && digits(int)))
                    }
                    None => digits(mantissa),
                };
                mantissa_ok && exponent.is_none_or(digits)
            };
            match text {
                "" | "~" | "null" | "Null" | "NULL" => Value::Null,
                "true" | "True" | "TRUE" => Value::Bool(true),
                "false" | "False" | "FALSE" => Value::Bool(false),
                _ if radix_int(text).is_some() => radix_int(text).map_or(Value::Null, Value::from),
                _ if digits(unsigned) => text
                    .trim_start_matches('+')
                    .parse::<i64>()
                    .map(Value::from)
                    .or_else(|_| text.trim_start_matches('+').parse::<u64>().map(Value::from))
                    .unwrap_or_else(|_| Value::String(text.to_string())),
                _ if float_like => text
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map_or_else(|| Value::String(text.to_string()), Value::Number),
                _ => Value::String(text.to_string()),
            }
        }
        Node::Sequence(seq) => Value::Array(seq.iter().map(typed_json).collect()),
        Node::Mapping(map) => Value::Object(map.iter().map(|(k, v)| (k.as_str().to_string(), typed_json(v))).collect()),
    }
}

/// YAML 1.2 core `0x` (hexadecimal) and `0o` (octal) integers, unsigned as the schema has them.
fn radix_int(text: &str) -> Option<u64> {
    let (digits, radix) =
        if let Some(hex) = text.strip_prefix("0x") { (hex, 16) } else { (text.strip_prefix("0o")?, 8) };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_located_say_where_each_document_starts() {
        let text = "# header\napiVersion: v1\nkind: A\n---\n---\n# only a comment\n---\n\nkind: B\n--- {kind: C}\n...\n---\nkind: D\n";
        let docs = documents_located(text).unwrap();
        let lines: Vec<Option<usize>> = docs.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [Some(2), Some(9), Some(10), Some(13)]);
        assert_eq!(docs[2].1["kind"], "C");
        // A `null` document counts for the scan, not for the parser: no line rather than a wrong one.
        let docs = documents_located("kind: A\n---\nnull\n---\nkind: B\n").unwrap();
        assert!(docs.iter().all(|(l, _)| l.is_none()) && docs.len() == 2, "{docs:?}");
        let err = documents_located("a: b\n---\nc: [d\n").unwrap_err();
        assert_eq!(err.at.map(|a| a.line), Some(4), "{err:?}");
    }

    #[test]
    fn plain_scalars_take_their_yaml_1_2_core_types() {
        let node = parse_located(
            "{hex: 0x1F, oct: 0o17, leading_zero: 017, dec: -3, float: 0.5, exp: 1e3, quoted: \"0x1F\", \
             bad_hex: 0xZZ, upper: 0X1F, signed_hex: -0x1F, underscore: 1_000, bin: 0b101, yes11: yes, \
             inf: .inf, nan: .nan, null: ~, bool: False}",
        )
        .unwrap();
        let json = typed_json(&node);
        let expected = serde_json::json!({
            "hex": 31, "oct": 15, "leading_zero": 17, "dec": -3, "float": 0.5, "exp": 1000.0,
            "quoted": "0x1F", "bad_hex": "0xZZ", "upper": "0X1F", "signed_hex": "-0x1F",
            "underscore": "1_000", "bin": "0b101", "yes11": "yes", "inf": ".inf", "nan": ".nan",
            "null": null, "bool": false,
        });
        assert_eq!(json, expected);
    }

    #[test]
    fn a_duplicate_key_names_both_lines() {
        let e = parse_located("name: s\nsteps:\n  - name: a\n    run: x\n    run: y\n").unwrap_err();
        assert_eq!(e.at, Some(Location { line: 5, column: 5 }));
        assert_eq!(e.message, "key `run` appears twice in the same mapping (first on line 4)");
    }

    #[test]
    fn every_duplicate_key_is_found_and_the_rest_still_read() {
        let text = "a: 1\nb:\n  c: [x, {d: 1, d: 2}]\n  c: 3\na: 4\ne: 5\n";
        let (node, duplicates) = parse_located_all(text).unwrap();
        let found: Vec<(usize, usize, &str)> = duplicates
            .iter()
            .map(|e| {
                let at = e.at.unwrap();
                (at.line, at.column, e.message.as_str())
            })
            .collect();
        assert_eq!(
            found,
            [
                (3, 17, "key `d` appears twice in the same mapping (first on line 3)"),
                (4, 3, "key `c` appears twice in the same mapping (first on line 3)"),
                (5, 1, "key `a` appears twice in the same mapping (first on line 1)"),
            ]
        );
        let top = node.as_mapping().unwrap();
        assert_eq!(top.get_scalar("a").unwrap().as_str(), "4", "the last value is read");
        assert_eq!(top.get_scalar("e").unwrap().as_str(), "5");
        assert!(parse_located_all("a: [1\n").is_err(), "a syntax error is still an error");
    }

    #[test]
    fn a_second_document_is_an_error_at_its_start() {
        let e = parse_located("name: s\nsteps: []\n---\nname: t\n").unwrap_err();
        assert_eq!(e.at.map(|a| a.line), Some(3));
        assert!(e.message.contains("second YAML document"), "{}", e.message);
        // A lone `---` before the one document and a final `...` are one document.
        assert!(parse_located("---\nname: s\n...\n").is_ok());
        // A broken second document is still named as a second document.
        let e = parse_located("name: s\n---\n[: :\n").unwrap_err();
        assert!(e.message.contains("second YAML document"), "{}", e.message);
        // A bare document after `...` is a second one too.
        let e = parse_located("name: s\n...\nname: t\n").unwrap_err();
        assert_eq!(e.at.map(|a| a.line), Some(3), "{}", e.message);
        // Content after the first document that is not a document at all is an error too.
        assert!(parse_located("{\"name\": \"s\"}\n{\"name\": \"t\", \"steps\": []}\n").is_err());
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        let node = parse_located("\u{feff}name: s\n").unwrap();
        assert_eq!(node.as_mapping().unwrap().get_scalar("name").unwrap().as_str(), "s");
    }

    #[test]
    fn invalid_utf8_is_located() {
        let e = decode_utf8(b"name: s\nsteps:\n  - n\xffame: a\n".to_vec()).unwrap_err();
        assert_eq!(e.at, Some(Location { line: 3, column: 6 }));
        assert!(e.message.contains("not valid UTF-8"), "{}", e.message);
        assert_eq!(decode_utf8("é: x".as_bytes().to_vec()).unwrap(), "é: x");
    }

    #[test]
    fn manifests_and_values_read_as_json() {
        assert_eq!(documents("a: 1\n---\n---\nb: [x]\n").unwrap().len(), 2);
        assert!(documents("a: [").is_err());
        assert_eq!(value("").unwrap(), serde_json::json!({}));
    }
}

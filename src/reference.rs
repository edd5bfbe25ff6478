//! References to other steps' outputs: `${{ steps.NAME.outputs.KEY }}` in any string value of
//! a step's tool keys, `env` and `revert`. Found and checked when the stack loads (each one is
//! an implicit `needs`), substituted right before the consuming step runs.

use std::sync::LazyLock;

use rdeploy_adapters::yaml::{Node, ScalarNode, Span};

/// One `${{ steps.NAME.outputs.KEY }}`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Reference {
    pub step: String,
    pub key: String,
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "${{{{ steps.{}.outputs.{} }}}}", self.step, self.key)
    }
}

/// A reference found in the stack file, with where it is.
#[derive(Clone, Debug)]
pub struct Located {
    pub reference: Reference,
    pub span: Span,
}

static EXPR: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"\$\{\{(.*?)\}\}").expect("the reference pattern compiles"));
static INNER: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^steps\.([A-Za-z0-9_-]+)\.outputs\.([A-Za-z_][A-Za-z0-9_-]*)$")
        .expect("the reference pattern compiles")
});

/// The references in one string, or what is wrong with one of them.
pub fn find(text: &str) -> Result<Vec<Reference>, String> {
    let mut found = Vec::new();
    let mut end = 0;
    for m in EXPR.captures_iter(text) {
        let whole = m.get(0).expect("group 0");
        check_no_opening(&text[end..whole.start()])?;
        end = whole.end();
        let inner = m[1].trim();
        match INNER.captures(inner) {
            Some(c) => found.push(Reference { step: c[1].to_string(), key: c[2].to_string() }),
            None => {
                return Err(format!(
                    "`{}` is not a reference: write `${{{{ steps.NAME.outputs.KEY }}}}`",
                    whole.as_str()
                ))
            }
        }
    }
    check_no_opening(&text[end..])?;
    Ok(found)
}

fn check_no_opening(rest: &str) -> Result<(), String> {
    match rest.find("${{") {
        Some(at) => Err(format!(
            "`{}` opens a reference that is never closed with `}}}}`",
            rest[at..].chars().take(40).collect::<String>()
        )),
        None => Ok(()),
    }
}

/// Every reference in a node's string values (not its keys), with the scalar's position; a
/// malformed one is reported through `bad`.
pub fn collect(node: &Node, out: &mut Vec<Located>, bad: &mut Vec<(Span, String)>) {
    match node {
        Node::Scalar(s) => match find(s.as_str()) {
            Ok(refs) => out.extend(refs.into_iter().map(|reference| Located { reference, span: *s.span() })),
            Err(e) => bad.push((*s.span(), e)),
        },
        Node::Sequence(seq) => seq.iter().for_each(|n| collect(n, out, bad)),
        Node::Mapping(map) => map.values().for_each(|n| collect(n, out, bad)),
    }
}

/// `text` with each reference replaced by `value(reference)`; the first reference without a
/// value is the error.
pub fn substitute(text: &str, value: &dyn Fn(&Reference) -> Option<String>) -> Result<String, Reference> {
    let mut out = String::with_capacity(text.len());
    let mut end = 0;
    for m in EXPR.captures_iter(text) {
        let whole = m.get(0).expect("group 0");
        let Some(c) = INNER.captures(m[1].trim()) else { continue };
        let reference = Reference { step: c[1].to_string(), key: c[2].to_string() };
        out.push_str(&text[end..whole.start()]);
        out.push_str(&value(&reference).ok_or(reference)?);
        end = whole.end();
    }
    out.push_str(&text[end..]);
    Ok(out)
}

/// `script`, a shell command line (`sh -c`), with each reference replaced by an expansion of
/// the variable `var(reference)` that the shell does not parse again: `"${VAR}"` where the
/// reference stands unquoted, `${VAR}` inside double quotes, and `'"${VAR}"'` (out of the single
/// quotes and back) inside single quotes. The caller puts each value in the command's
/// environment under that name, so an output holding `$(...)`, backquotes, `;` or quotes
/// reaches the command as data, never as code. The first reference without a value is the
/// error.
pub fn substitute_shell(
    script: &str,
    has_value: &dyn Fn(&Reference) -> bool,
    var: &dyn Fn(&Reference) -> String,
) -> Result<String, Reference> {
    let mut out = String::with_capacity(script.len());
    let mut end = 0;
    let mut quoting = ShellQuoting::default();
    for m in EXPR.captures_iter(script) {
        let whole = m.get(0).expect("group 0");
        let Some(c) = INNER.captures(m[1].trim()) else { continue };
        let reference = Reference { step: c[1].to_string(), key: c[2].to_string() };
        if !has_value(&reference) {
            return Err(reference);
        }
        let before = &script[end..whole.start()];
        quoting.read(before);
        out.push_str(before);
        let name = var(&reference);
        match quoting.at() {
            Quote::None => out.push_str(&format!("\"${{{name}}}\"")),
            Quote::Double => out.push_str(&format!("${{{name}}}")),
            Quote::Single => out.push_str(&format!("'\"${{{name}}}\"'")),
        }
        end = whole.end();
    }
    out.push_str(&script[end..]);
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quote {
    None,
    Single,
    Double,
}

/// Where a POSIX shell reading a line is, quoting-wise: nested `$(...)` and backquotes start
/// unquoted again inside double quotes, so each is a frame of its own.
#[derive(Debug)]
struct ShellQuoting {
    /// One frame per command substitution entered (the line itself is the first), with its
    /// quoting and how many `(` are open in it.
    frames: Vec<(Quote, usize, bool)>,
    /// The last character was an unquoted (or double-quoted) backslash.
    escaped: bool,
    /// The last character was a `$` that may open `$(`.
    dollar: bool,
}

impl Default for ShellQuoting {
    fn default() -> ShellQuoting {
        ShellQuoting { frames: vec![(Quote::None, 0, false)], escaped: false, dollar: false }
    }
}

impl ShellQuoting {
    fn at(&self) -> Quote {
        self.frames.last().map_or(Quote::None, |f| f.0)
    }

    fn read(&mut self, text: &str) {
        for c in text.chars() {
            let dollar = std::mem::take(&mut self.dollar);
            if std::mem::take(&mut self.escaped) {
                continue;
            }
            let top = self.frames.len() - 1;
            let (quote, parens, backquoted) = self.frames[top];
            match (quote, c) {
                (Quote::Single, '\'') => self.frames[top].0 = Quote::None,
                (Quote::Single, _) => {}
                (_, '\\') => self.escaped = true,
                (_, '$') => self.dollar = true,
                (_, '(') if dollar => self.frames.push((Quote::None, 0, false)),
                (_, '`') if backquoted && quote == Quote::None && self.frames.len() > 1 => {
                    self.frames.pop();
                }
                (_, '`') => self.frames.push((Quote::None, 0, true)),
                (Quote::Double, '"') => self.frames[top].0 = Quote::None,
                (Quote::Double, _) => {}
                (Quote::None, '\'') => self.frames[top].0 = Quote::Single,
                (Quote::None, '"') => self.frames[top].0 = Quote::Double,
                (Quote::None, '(') => self.frames[top].1 += 1,
                (Quote::None, ')') if parens > 0 => self.frames[top].1 -= 1,
                (Quote::None, ')') if self.frames.len() > 1 && !backquoted => {
                    self.frames.pop();
                }
                (Quote::None, _) => {}
            }
        }
    }
}

/// A node with the references in its string values substituted. A scalar keeps its position
/// and its quoting, so a plain `${{ ... }}` whose value reads as a number stays a number for
/// the tool (helm `set`, ansible `extra_vars`, terraform `vars`).
pub fn substitute_node(node: &Node, value: &dyn Fn(&Reference) -> Option<String>) -> Result<Node, Reference> {
    Ok(match node {
        Node::Scalar(s) if s.as_str().contains("${{") => {
            let mut new = ScalarNode::new(*s.span(), substitute(s.as_str(), value)?);
            new.set_coerce(s.may_coerce());
            Node::Scalar(new)
        }
        Node::Scalar(_) => node.clone(),
        Node::Sequence(seq) => {
            let mut seq = seq.clone();
            for item in seq.iter_mut() {
                *item = substitute_node(item, value)?;
            }
            Node::Sequence(seq)
        }
        Node::Mapping(map) => {
            let mut map = map.clone();
            for item in map.values_mut() {
                *item = substitute_node(item, value)?;
            }
            Node::Mapping(map)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(step: &str, key: &str) -> Reference {
        Reference { step: step.into(), key: key.into() }
    }

    #[test]
    fn finds_references_with_or_without_spaces() {
        assert_eq!(
            find("--url=${{ steps.db.outputs.url }}/${{steps.db.outputs.name}}").unwrap(),
            [r("db", "url"), r("db", "name")]
        );
        assert_eq!(find("plain $HOME ${HOME} {{ x }}").unwrap(), []);
    }

    #[test]
    fn bad_syntax_is_named() {
        assert!(find("${{ steps.db.output.url }}").unwrap_err().contains("is not a reference"));
        assert!(find("${{ steps.db }}").unwrap_err().contains("is not a reference"));
        assert!(find("x ${{ steps.db.outputs.url").unwrap_err().contains("never closed"));
        assert!(find("${{ steps.a.outputs.b }} ${{ steps").unwrap_err().contains("never closed"));
    }

    #[test]
    fn a_reference_in_a_shell_line_becomes_a_quoted_expansion_of_its_variable() {
        let has = |_: &Reference| true;
        let var = |r: &Reference| format!("V_{}", r.key);
        let sub = |s: &str| substitute_shell(s, &has, &var).unwrap();
        assert_eq!(sub("echo ${{ steps.a.outputs.x }} >> out"), r#"echo "${V_x}" >> out"#);
        assert_eq!(sub(r#"echo "n=${{ steps.a.outputs.x }}!""#), r#"echo "n=${V_x}!""#);
        assert_eq!(sub("echo 'n=${{ steps.a.outputs.x }}'"), r#"echo 'n='"${V_x}"''"#);
        assert_eq!(sub(r#"echo "$(cat ${{ steps.a.outputs.x }})""#), r#"echo "$(cat "${V_x}")""#);
        assert_eq!(sub(r#"echo "$(f "a(b)") ${{ steps.a.outputs.x }}""#), r#"echo "$(f "a(b)") ${V_x}""#);
        assert_eq!(sub(r#"echo \' ${{ steps.a.outputs.x }}"#), r#"echo \' "${V_x}""#);
        assert_eq!(
            sub("echo `echo ${{ steps.a.outputs.x }}` ${{ steps.a.outputs.y }}"),
            r#"echo `echo "${V_x}"` "${V_y}""#
        );
        assert_eq!(substitute_shell("${{ steps.b.outputs.z }}", &|r| r.step != "b", &var).unwrap_err(), r("b", "z"));
    }

    /// What the shell makes of the substituted line: the value as data, whatever it holds.
    #[test]
    fn a_hostile_value_reaches_the_shell_as_data() {
        let dir = tempfile::tempdir().unwrap();
        let value = r#"7$(touch PWNED)`touch PWNED2`"'; touch PWNED3; '"#;
        for script in [
            "printf '%s' ${{ steps.a.outputs.x }} > got",
            r#"printf '%s' "${{ steps.a.outputs.x }}" > got"#,
            "printf '%s' '${{ steps.a.outputs.x }}' > got",
        ] {
            let line = substitute_shell(script, &|_| true, &|_| "RDEPLOY_REF_x".to_string()).unwrap();
            let status = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(&line)
                .current_dir(dir.path())
                .env("RDEPLOY_REF_x", value)
                .status()
                .unwrap();
            assert!(status.success(), "{line}");
            assert_eq!(std::fs::read_to_string(dir.path().join("got")).unwrap(), value, "{script} -> {line}");
            for pwned in ["PWNED", "PWNED2", "PWNED3"] {
                assert!(!dir.path().join(pwned).exists(), "{script} -> {line}");
            }
        }
    }

    #[test]
    fn substitutes_each_reference() {
        let value = |r: &Reference| (r.step == "db").then(|| format!("<{}>", r.key));
        assert_eq!(substitute("a ${{ steps.db.outputs.url }} b", &value).unwrap(), "a <url> b");
        assert_eq!(substitute("${{ steps.web.outputs.url }}", &value).unwrap_err(), r("web", "url"));
        assert_eq!(r("db", "url").to_string(), "${{ steps.db.outputs.url }}");
    }
}

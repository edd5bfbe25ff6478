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
    fn substitutes_each_reference() {
        let value = |r: &Reference| (r.step == "db").then(|| format!("<{}>", r.key));
        assert_eq!(substitute("a ${{ steps.db.outputs.url }} b", &value).unwrap(), "a <url> b");
        assert_eq!(substitute("${{ steps.web.outputs.url }}", &value).unwrap_err(), r("web", "url"));
        assert_eq!(r("db", "url").to_string(), "${{ steps.db.outputs.url }}");
    }
}

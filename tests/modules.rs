//! The modules of the binary (`src/`) and of the adapters crate (`adapters/src/`) import one
//! another without a circle (STYLE.md, "Modules"): read from the `use` lines and the
//! `crate::`/`super::` paths of each crate's files, each file being a module, a module's tests
//! left out. A path through the crate root's re-exports (`crate::Event`) is not followed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file under `dir`, by its module path (`src/engine/run.rs` is `engine::run`,
/// `src/cmd/mod.rs` is `cmd`, `src/main.rs` the root).
fn modules(dir: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("cannot read {}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(dir).unwrap().with_extension("");
            let mut parts: Module = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts == ["main"] || parts == ["lib"] {
                parts.clear();
            }
            out.insert(parts, path);
        }
    }
    out
}

/// The source without comments and without its `#[cfg(test)] mod tests` (tests may import
/// whatever they check), `pub(super) mod tests` too.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let tests = text.match_indices("#[cfg(test)]\n").map(|(at, _)| at).find(|&at| {
        let next = text[at..].lines().nth(1).unwrap_or_default();
        let item = next.split_once("mod tests").map(|(before, _)| before.trim());
        item.is_some_and(|v| v.is_empty() || v.starts_with("pub"))
    });
    let text = match tests {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// The longest prefix of `path` that is a module.
fn resolve(mods: &BTreeMap<Module, PathBuf>, path: &[String]) -> Option<Module> {
    (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|m| mods.contains_key(m))
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path starting at `crate::`, `super::` or `self::` in `text` (groups `{a::B, c}`
/// expanded one level), as module paths seen from `module`.
fn paths(module: &Module, text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("::") {
        let before = &text[..at];
        let start = before.rfind(|c: char| !ident_char(c)).map_or(0, |i| i + 1);
        let base = &before[start..];
        if !matches!(base, "crate" | "super" | "self") || before[..start].ends_with("::") {
            continue;
        }
        let mut prefix: Vec<String> = match base {
            "crate" => Vec::new(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            _ => module.clone(),
        };
        let mut rest = &text[at + 2..];
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let inner = &group[..group.find('}').unwrap_or(group.len())];
                for item in inner.split(',') {
                    let segs: Vec<String> = item
                        .trim()
                        .split("::")
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty() && s.chars().all(ident_char))
                        .collect();
                    out.push(prefix.iter().cloned().chain(segs).collect());
                }
                break;
            }
            let end = rest.find(|c: char| !ident_char(c)).unwrap_or(rest.len());
            let seg = &rest[..end];
            if seg.is_empty() {
                out.push(prefix.clone());
                break;
            }
            if seg == "super" {
                prefix.pop();
            } else {
                prefix.push(seg.to_string());
            }
            match rest[end..].strip_prefix("::") {
                Some(next) => rest = next,
                None => {
                    out.push(prefix.clone());
                    break;
                }
            }
        }
    }
    // `use child::Item;` / `pub use child::Item;` inside a module with submodules.
    for line in text.lines() {
        let line = line.trim_start();
        let line = line.strip_prefix("pub ").unwrap_or(line);
        if let Some(rest) = line.strip_prefix("use ") {
            let first = &rest[..rest.find("::").unwrap_or(0)];
            if !first.is_empty() && first.chars().all(ident_char) && !matches!(first, "crate" | "super" | "self") {
                out.push(module.iter().cloned().chain([first.to_string()]).collect());
            }
        }
    }
    out
}

fn graph(dir: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mods = modules(dir);
    mods.iter()
        .map(|(module, path)| {
            let deps = paths(module, &code(path))
                .iter()
                .filter_map(|p| resolve(&mods, p))
                .filter(|m| m != module && !m.is_empty())
                .collect();
            (module.clone(), deps)
        })
        .collect()
}

/// The modules that import one another in a circle, each circle as its members (Tarjan).
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut members = Vec::new();
                while let Some(w) = self.stack.pop() {
                    members.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if members.len() > 1 {
                    members.sort();
                    self.found.push(members);
                }
            }
        }
    }
    let mut t = Tarjan { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found
}

/// The circles among the modules under `src`, each named with the imports that make it.
/// `used` is a module some other imports by a path of its own, to show the reader sees them.
fn named_circles(src: &Path, used: &str) -> Vec<String> {
    let graph = graph(src);
    assert!(
        graph.values().any(|deps| deps.contains(&vec![used.to_string()])),
        "no module of {} imports `{used}`: the `use` lines are not read",
        src.display()
    );
    circles(&graph)
        .iter()
        .map(|members| {
            let names: Vec<String> = members.iter().map(|m| m.join("::")).collect();
            let edges: Vec<String> = members
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|b| members.contains(b))
                        .map(move |b| format!("{} -> {}", a.join("::"), b.join("::")))
                })
                .collect();
            format!("{} ({})", names.join(", "), edges.join("; "))
        })
        .collect()
}

/// The `src/` of this checkout, or `DIR/src` of another with `RDEPLOY_CHECK_TREE=DIR` (an older
/// commit's, say); `RDEPLOY_CHECK_SRC=DIR` names the binary's `src/` itself, as before.
fn source_dir(crate_dir: &str) -> PathBuf {
    if crate_dir.is_empty() {
        if let Some(src) = std::env::var_os("RDEPLOY_CHECK_SRC") {
            return PathBuf::from(src);
        }
    }
    let root = std::env::var_os("RDEPLOY_CHECK_TREE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    root.join(crate_dir).join("src")
}

#[test]
fn the_binarys_modules_import_one_another_without_a_circle() {
    let src = source_dir("");
    let found = named_circles(&src, "checkpoint");
    assert!(found.is_empty(), "import circles in {}:\n  {}", src.display(), found.join("\n  "));
}

#[test]
fn the_adapters_modules_import_one_another_without_a_circle() {
    let src = source_dir("adapters");
    let found = named_circles(&src, "process");
    assert!(found.is_empty(), "import circles in {}:\n  {}", src.display(), found.join("\n  "));
}

#[test]
fn a_circle_is_found_through_crate_super_and_grouped_paths() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("main.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "pub mod x;\nuse crate::{b::Thing, exit};\n").unwrap();
    std::fs::write(src.join("a/x.rs"), "// use crate::b;\nuse super::Y;\npub fn f() {}\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct Thing;\nfn g() { crate::a::x::f() }\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n",
    )
    .unwrap();
    let module = |s: &str| s.split("::").map(str::to_string).collect::<Module>();
    assert_eq!(circles(&graph(src)), vec![vec![module("a"), module("a::x"), module("b")]]);
    // Neither a comment nor a module's tests make a circle.
    std::fs::write(src.join("b.rs"), "pub struct Thing;\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n").unwrap();
    assert!(circles(&graph(src)).is_empty());
    // Nor tests a child module shares (`pub(super) mod tests`).
    std::fs::write(src.join("b.rs"), "pub struct Thing;\n#[cfg(test)]\npub(super) mod tests {\n    use crate::a;\n}\n")
        .unwrap();
    assert!(circles(&graph(src)).is_empty());
}

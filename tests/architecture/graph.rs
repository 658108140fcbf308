//! The file graph of `src/` for `tests/architecture.rs`: every file (the
//! library, the Lambda's `main.rs` and each binary under `src/bin/`, each
//! crate its own `crate::`), an edge from a file to each file defining
//! something it names, read from the source text; and its circles.
//! Over 500 lines on purpose: one reader of Rust's module, `use` and path
//! syntax (tokens, use trees, re-exports, each crate's modules), whose
//! parts only make sense together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every `.rs` file under `src/`, by its path relative to `src/`, with its
/// text.
pub fn sources() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&src).unwrap().to_string_lossy();
                out.insert(rel.into_owned(), std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    out
}

/// `text` with comments gone and string and character literals emptied.
pub fn blank(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let at = |k: usize| b.get(k).copied().unwrap_or(' ');
        let c = b[i];
        if c == '/' && at(i + 1) == '/' {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (i == 0 || !ident(b[i - 1]) || b[i - 1] == 'b') && {
            let mut k = i + 1;
            while at(k) == '#' {
                k += 1;
            }
            at(k) == '"'
        } {
            // A raw string: r#"..."#.
            let mut hashes = 0;
            i += 1;
            while b[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < b.len() {
                if b[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A character literal (not a lifetime).
            i += 1;
            while i < b.len() && b[i] != '\'' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code` without its `#[cfg(test)]` items (a file's own tests are no edge).
pub fn without_tests(code: &str) -> String {
    const TEST: &str = "#[cfg(test)]";
    let mut out = code.to_owned();
    while let Some(at) = out.find(TEST) {
        // The item ends at its first `;`, or with the brace its first `{`
        // opens.
        let mut depth = 0;
        let mut end = out.len();
        for (k, ch) in out[at + TEST.len()..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = at + TEST.len() + k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = at + TEST.len() + k + 1;
                    break;
                }
                _ => {}
            }
        }
        out.replace_range(at..end, "");
    }
    out
}

/// Identifiers, `::`, and single punctuation characters.
pub fn tokens(code: &str) -> Vec<String> {
    let b: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push(b[start..i].iter().collect());
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// One name a `use` item brings in: `use a::b::{c, d as e, f::*}` is
/// `a::b::c` as `c`, `a::b::d` as `e` and the glob `a::b::f`.
#[derive(Debug)]
pub struct Use {
    path: Vec<String>,
    /// The name it binds (none: a glob).
    name: Option<String>,
    /// `pub use`, `pub(crate) use`, ...: a re-export.
    public: bool,
}

/// Appends the leaves of the use tree at `t[*i..]` under `prefix`.
pub fn use_tree(t: &[String], i: &mut usize, prefix: &[String], public: bool, out: &mut Vec<Use>) {
    let mut path = prefix.to_vec();
    loop {
        match t.get(*i).map(String::as_str) {
            Some("{") => {
                *i += 1;
                while t.get(*i).is_some_and(|s| s != "}") {
                    use_tree(t, i, &path, public, out);
                    if t.get(*i).is_some_and(|s| s == ",") {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some("*") => {
                *i += 1;
                out.push(Use {
                    path,
                    name: None,
                    public,
                });
                return;
            }
            Some(seg) if seg != "," && seg != "}" && seg != ";" => {
                path.push(seg.to_owned());
                *i += 1;
                if t.get(*i).is_some_and(|s| s == "::") {
                    *i += 1;
                    continue;
                }
                let mut name = path.last().unwrap().clone();
                if name == "self" {
                    path.pop();
                    name = path.last().unwrap().clone();
                }
                if t.get(*i).is_some_and(|s| s == "as") {
                    name = t[*i + 1].clone();
                    *i += 2;
                }
                out.push(Use {
                    path,
                    name: Some(name),
                    public,
                });
                return;
            }
            _ => return,
        }
    }
}

/// What a file declares and names.
#[derive(Debug, Default)]
pub struct FileInfo {
    /// Its `mod name;` children.
    mods: Vec<String>,
    /// Its `#[cfg(test)] mod name;` children (no nodes: tests).
    test_mods: Vec<String>,
    /// The names of its top-level items.
    items: BTreeSet<String>,
    /// Its `use` items, by leaf.
    uses: Vec<Use>,
    /// Its paths outside `use` items (`a::b::c`, from the first segment).
    paths: Vec<Vec<String>>,
    /// How often each identifier occurs outside `use` items.
    words: BTreeMap<String, usize>,
}

/// What the file `text` declares and names.
pub fn file_info(text: &str) -> FileInfo {
    let blanked = blank(text);
    let t = tokens(&without_tests(&blanked));
    let is_ident = |s: &str| s.starts_with(|c: char| c.is_alphabetic() || c == '_');
    let mut info = FileInfo::default();
    let all = tokens(&blanked);
    for (i, w) in all.windows(8).enumerate() {
        if w[..5] == ["cfg", "(", "test", ")", "]"] && w[5] == "mod" && w[7] == ";" {
            info.test_mods.push(all[i + 6].clone());
        }
    }
    let mut depth = 0;
    let mut i = 0;
    while i < t.len() {
        let tok = t[i].as_str();
        let next = t.get(i + 1).map_or("", String::as_str);
        match tok {
            "{" => depth += 1,
            "}" => depth -= 1,
            "use" => {
                let public = match i.checked_sub(1).map(|p| t[p].as_str()) {
                    Some("pub") => true,
                    Some(")") => t[..i]
                        .iter()
                        .rposition(|s| s == "(")
                        .is_some_and(|open| open > 0 && t[open - 1] == "pub"),
                    _ => false,
                };
                i += 1;
                use_tree(&t, &mut i, &[], public, &mut info.uses);
                while t.get(i).is_some_and(|s| s != ";") {
                    i += 1;
                }
                i += 1;
                continue;
            }
            "mod" if t.get(i + 2).is_some_and(|s| s == ";") => info.mods.push(next.to_owned()),
            "struct" | "enum" | "union" | "trait" | "type" | "const" | "static" | "fn" | "mod"
                if depth == 0 && is_ident(next) =>
            {
                let name = match next {
                    "fn" | "mut" => t.get(i + 2).map_or("", String::as_str),
                    _ => next,
                };
                info.items.insert(name.to_owned());
            }
            "macro_rules" if depth == 0 => {
                info.items.insert(t[i + 2].clone());
            }
            _ => {}
        }
        if is_ident(tok) {
            *info.words.entry(tok.to_owned()).or_default() += 1;
            let starts = i == 0 || t[i - 1] != "::";
            if starts && next == "::" {
                let mut path = vec![tok.to_owned()];
                let mut k = i + 1;
                while t.get(k).is_some_and(|s| s == "::")
                    && t.get(k + 1).is_some_and(|s| is_ident(s))
                {
                    path.push(t[k + 1].clone());
                    k += 2;
                }
                info.paths.push(path);
            }
        }
        i += 1;
    }
    info
}

/// A module: its crate's root file and its path in that crate.
pub type Module = (String, Vec<String>);

/// What a path names: a module, or an item (its file, its name).
pub enum Target {
    Module(Module),
    Item(String, String),
}

/// The crates under `src/` and their module trees.
pub struct Crates {
    infos: BTreeMap<String, FileInfo>,
    files: BTreeMap<Module, String>,
    modules: BTreeMap<String, Module>,
    /// The files of `#[cfg(test)] mod name;` modules.
    test_files: BTreeSet<String>,
}

impl Crates {
    /// Every crate of `sources`: `lib.rs`, `main.rs`, `bin/<name>.rs` and
    /// `bin/<name>/main.rs` are roots; `mod name;` in a file at `d/f.rs` is
    /// `d/f/name.rs` or `d/f/name/mod.rs` (`d/name...` when the file is a
    /// root or a `mod.rs`).
    fn new(sources: &BTreeMap<String, String>) -> Self {
        let infos: BTreeMap<String, FileInfo> = sources
            .iter()
            .map(|(rel, text)| (rel.clone(), file_info(text)))
            .collect();
        let mut crates = Self {
            infos,
            files: BTreeMap::new(),
            modules: BTreeMap::new(),
            test_files: BTreeSet::new(),
        };
        let roots = sources.keys().filter(|rel| {
            let parts: Vec<&str> = rel.split('/').collect();
            matches!(
                parts.as_slice(),
                ["lib.rs" | "main.rs"] | ["bin", _] | ["bin", _, "main.rs"]
            )
        });
        for root in roots {
            let mut stack = vec![(root.clone(), Vec::new())];
            while let Some((file, path)) = stack.pop() {
                let dir = if &file == root || file == "mod.rs" || file.ends_with("/mod.rs") {
                    file.rsplit_once('/')
                        .map_or(String::new(), |(d, _)| format!("{d}/"))
                } else {
                    format!("{}/", file.trim_end_matches(".rs"))
                };
                let child = |name: &String| {
                    [format!("{dir}{name}.rs"), format!("{dir}{name}/mod.rs")]
                        .into_iter()
                        .find(|f| sources.contains_key(f))
                };
                let info = &crates.infos[&file];
                crates
                    .test_files
                    .extend(info.test_mods.iter().filter_map(child));
                for name in &info.mods {
                    let child = child(name)
                        .unwrap_or_else(|| panic!("src/{file}: no file for `mod {name};`"));
                    let mut child_path = path.clone();
                    child_path.push(name.clone());
                    stack.push((child, child_path));
                }
                let module = (root.clone(), path);
                crates.files.insert(module.clone(), file.clone());
                crates.modules.insert(file, module);
            }
        }
        crates
    }

    fn child(&self, (root, path): &Module, name: &str) -> Option<Module> {
        let mut path = path.clone();
        path.push(name.to_owned());
        let module = (root.clone(), path);
        self.files.contains_key(&module).then_some(module)
    }

    /// What `name` means inside `module`: an item of its file, a child, a
    /// name its `use` items bind (so a re-export leads to the file that
    /// defines the item), or one its globs bring in.
    fn lookup(&self, module: &Module, name: &str, depth: usize) -> Option<Target> {
        let file = &self.files[module];
        let info = &self.infos[file];
        if info.items.contains(name) {
            return Some(Target::Item(file.clone(), name.to_owned()));
        }
        if let Some(child) = self.child(module, name) {
            return Some(Target::Module(child));
        }
        if let Some(u) = info.uses.iter().find(|u| u.name.as_deref() == Some(name)) {
            return self.resolve(module, &u.path, depth + 1);
        }
        info.uses.iter().filter(|u| u.name.is_none()).find_map(|u| {
            match self.resolve(module, &u.path, depth + 1) {
                Some(Target::Module(glob)) => self.lookup(&glob, name, depth + 1),
                _ => None,
            }
        })
    }

    /// What `path`, written in `module`, names (none: another crate's).
    fn resolve(&self, module: &Module, path: &[String], depth: usize) -> Option<Target> {
        if depth > 32 || path.is_empty() {
            return None;
        }
        let mut rest = path;
        let mut current = module.clone();
        match path[0].as_str() {
            "crate" => {
                current.1.clear();
                rest = &path[1..];
            }
            "self" => rest = &path[1..],
            "super" => {
                while rest.first().is_some_and(|s| s == "super") {
                    current.1.pop();
                    rest = &rest[1..];
                }
            }
            first => match self.lookup(module, first, depth)? {
                Target::Module(m) => {
                    current = m;
                    rest = &path[1..];
                }
                item => return Some(item),
            },
        }
        for seg in rest {
            match self.lookup(&current, seg, depth) {
                Some(Target::Module(m)) => current = m,
                Some(item) => return Some(item),
                // Defined by a macro, or not at all: the module's file.
                None => return Some(Target::Item(self.files[&current].clone(), seg.clone())),
            }
        }
        Some(Target::Module(current))
    }

    /// Each file's edges: the files defining what it names, each with one
    /// of those names. A re-export its own code does not use is no edge (a
    /// front door lists, it does not depend).
    fn edges(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (file, module) in &self.modules {
            let info = &self.infos[file];
            let mut named: Vec<&[String]> = info.paths.iter().map(Vec::as_slice).collect();
            for u in &info.uses {
                let used_here = u
                    .name
                    .as_ref()
                    .is_none_or(|n| info.words.get(n).is_some_and(|&c| c > 0));
                if !u.public || used_here {
                    named.push(&u.path);
                }
            }
            let edges = out.entry(file.clone()).or_default();
            for path in named {
                let (target, name) = match self.resolve(module, path, 0) {
                    Some(Target::Item(f, name)) => (f, name),
                    Some(Target::Module(m)) => (self.files[&m].clone(), m.1.join("::")),
                    None => continue,
                };
                if &target != file {
                    edges.entry(target).or_insert(name);
                }
            }
        }
        out
    }
}

/// The file graph of `sources` (see [`Crates`]).
pub fn file_graph(
    sources: &BTreeMap<String, String>,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let crates = Crates::new(sources);
    let lost: Vec<&String> = sources
        .keys()
        .filter(|f| !crates.modules.contains_key(*f) && !crates.test_files.contains(*f))
        .collect();
    assert!(lost.is_empty(), "files no crate declares: {lost:?}");
    crates.edges()
}

/// Each group of files that reach each other (sorted), with one circle
/// through it, the shortest from the group's first file: `a.rs -> b.rs (B)
/// -> a.rs (A)`, each file followed by the name that leads to it.
pub fn circles(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<(Vec<String>, String)> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(f) = stack.pop() {
            for to in edges.get(&f).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(to.clone()) {
                    stack.push(to.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|f| (f, reach(f))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for (file, reached) in &reaches {
        if !reached.contains(*file) || done.contains(*file) {
            continue;
        }
        // Its group: the files it reaches that reach it back.
        let group: Vec<String> = reached
            .iter()
            .filter(|g| reaches.get(g).is_some_and(|r| r.contains(*file)))
            .cloned()
            .collect();
        done.extend(group.iter().cloned());
        // The shortest way back (breadth first).
        let mut back: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([(*file).clone()]);
        'search: while let Some(f) = queue.pop_front() {
            for to in edges[&f].keys() {
                if !back.contains_key(to) {
                    back.insert(to.clone(), f.clone());
                    if to == *file {
                        break 'search;
                    }
                    queue.push_back(to.clone());
                }
            }
        }
        let mut ring = vec![(*file).clone()];
        while let Some(prev) = back.get(ring.last().unwrap()).filter(|p| *p != *file) {
            ring.push(prev.clone());
        }
        ring.push((*file).clone());
        ring.reverse();
        let mut text = ring[0].clone();
        for pair in ring.windows(2) {
            text.push_str(&format!(" -> {} ({})", pair[1], edges[&pair[0]][&pair[1]]));
        }
        out.push((group, text));
    }
    out
}

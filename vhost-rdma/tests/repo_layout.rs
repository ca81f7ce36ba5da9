//! Two rules of the repository's shape, checked by `cargo test` (they were
//! `scripts/check-module-cycles.py` and `scripts/check-repo-paths.py`):
//!
//! - **No import cycle between the top-level modules of a workspace crate**
//!   (issue 26: every arrow points down, so a newcomer can read a crate from
//!   the bottom up). A module's dependencies are the `crate::MODULE` paths it
//!   names, `use crate::{a, b}` groups included, outside comments and its
//!   `#[cfg(test)] mod tests`. Binary-only modules count like any other.
//! - **No tracked file refers to a path outside the repository.** A user's
//!   clone has nothing beside it, so code, tests and docs may not reach into
//!   a sibling directory (a `shared/` beside the checkout, say) or into the
//!   developers' workplace (`/work/...`). Checked: every relative path with
//!   leading `../` that, resolved against its file's directory, leaves the
//!   repository; and every absolute `/work/` path. `.ci/run` (CI's own
//!   configuration) is exempt, as is a line carrying the marker
//!   `repo-paths: allow`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate sits in the workspace")
        .to_path_buf()
}

fn members(root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("workspace Cargo.toml");
    let doc: toml::Table = text.parse().expect("workspace Cargo.toml parses");
    doc["workspace"]["members"]
        .as_array()
        .expect("workspace.members")
        .iter()
        .map(|m| m.as_str().expect("member names are strings").to_string())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module -> the top-level modules it names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut by_module: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("below src");
        let first = rel.components().next().expect("a file name");
        let top = first.as_os_str().to_string_lossy();
        let top = top.strip_suffix(".rs").unwrap_or(&top).to_string();
        if top != "lib" && top != "main" {
            by_module.entry(top).or_default().push(f);
        }
    }
    let tests = Regex::new(r"(?s)#\[cfg\(test\)\]\s*mod tests\s*\{.*").expect("regex");
    let comment = Regex::new(r"//.*").expect("regex");
    let path = Regex::new(r"crate::(\w+)").expect("regex");
    let group = Regex::new(r"use crate::\{([^}]*)\}").expect("regex");
    let word = Regex::new(r"\b(\w+)\b").expect("regex");
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, paths) in &by_module {
        let d = deps.entry(m.clone()).or_default();
        for p in paths {
            let code = std::fs::read_to_string(p).expect("readable source");
            let code = tests.replace(&code, "");
            let code = comment.replace_all(&code, "");
            let named = path.captures_iter(&code).map(|c| c[1].to_string()).chain(
                group.captures_iter(&code).flat_map(|g| {
                    word.captures_iter(&g[1])
                        .map(|w| w[1].to_string())
                        .collect::<Vec<_>>()
                }),
            );
            for t in named {
                if &t != m && by_module.contains_key(&t) {
                    d.insert(t);
                }
            }
        }
    }
    deps
}

/// The strongly connected components with more than one module (Tarjan).
fn cycles(deps: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        deps: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in &self.deps[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        deps,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in deps.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let root = root();
    let crates = members(&root);
    assert!(crates.len() > 10, "the workspace lists its crates");
    let found: Vec<String> = crates
        .iter()
        .flat_map(|c| {
            cycles(&module_graph(&root.join(c).join("src")))
                .into_iter()
                .map(move |cyc| format!("{c}: import cycle between modules {}", cyc.join(", ")))
        })
        .collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("b")).unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{b, c};\n").unwrap();
    std::fs::write(src.join("b/mod.rs"), "// crate::c only in a comment\n").unwrap();
    std::fs::write(src.join("b/x.rs"), "fn f() { crate::a::g() }\n").unwrap();
    std::fs::write(
        src.join("c.rs"),
        "#[cfg(test)]\nmod tests {\n use crate::a;\n}\n",
    )
    .unwrap();
    std::fs::write(src.join("lib.rs"), "use crate::a;\n").unwrap();
    let g = module_graph(src);
    assert_eq!(g["c"], BTreeSet::new(), "test modules do not count");
    assert_eq!(cycles(&g), vec![vec!["a".to_string(), "b".to_string()]]);
}

/// Files this check reads: tracked, or new and not ignored (as `git ls-files`
/// lists them).
fn repo_files(root: &Path) -> Vec<String> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .expect("git runs (the check reads the files of a git checkout)");
    assert!(
        out.status.success(),
        "git ls-files failed: not a git checkout?"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

const EXEMPT_FILES: [&str; 2] = [".ci/run", "vhost-rdma/tests/repo_layout.rs"];
const BINARY_SUFFIXES: [&str; 6] = [".pcap", ".pcapng", ".lock", ".png", ".gz", ".bin"];
const MARKER: &str = "repo-paths: allow";

fn name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-'
}

/// What in one line of a file `depth` directories below the root reaches
/// outside the repository.
fn outside_paths(line: &str, depth: usize) -> Vec<String> {
    let b = line.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 3 <= b.len() {
        // A run of `../` not glued to a preceding path component or
        // variable (`$X/..`, `a/../`), followed by a name.
        let glued = i > 0 && (name_char(b[i - 1]) || matches!(b[i - 1], b'$' | b'}' | b'/'));
        if &b[i..i + 3] != b"../" || glued {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut ups = 0;
        while j + 3 <= b.len() && &b[j..j + 3] == b"../" {
            ups += 1;
            j += 3;
        }
        let mut k = j;
        while k < b.len() && name_char(b[k]) {
            k += 1;
        }
        if k == j {
            i += 1;
            continue;
        }
        if ups > depth {
            found.push(format!("'{}' leaves the repository", &line[i..k]));
        }
        i = k;
    }
    let mut from = 0;
    while let Some(p) = line[from..].find("/work/") {
        let at = from + p;
        if at == 0 || !name_char(b[at - 1]) {
            found.push("absolute /work/ path".to_string());
            break;
        }
        from = at + 1;
    }
    found
}

#[test]
fn no_path_outside_the_repository() {
    let root = root();
    let files = repo_files(&root);
    let mut findings = Vec::new();
    for name in &files {
        if EXEMPT_FILES.contains(&name.as_str())
            || BINARY_SUFFIXES.iter().any(|s| name.ends_with(s))
        {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(name)) else {
            continue; // not UTF-8 text, or gone
        };
        let depth = name.matches('/').count();
        for (n, line) in text.lines().enumerate() {
            if line.contains(MARKER) {
                continue;
            }
            for f in outside_paths(line, depth) {
                findings.push(format!("{name}:{}: {f}", n + 1));
            }
        }
    }
    assert!(files.len() > 100, "the checkout lists its files");
    assert!(
        findings.is_empty(),
        "{} reference(s) to paths outside the repository; bring the file in, or make it an \
         option:\n{}",
        findings.len(),
        findings.join("\n")
    );
}

#[test]
fn the_path_check_sees_what_leaves() {
    let shared = ["..", "shared"].join("/");
    let work = ["", "work", "x"].join("/");
    assert_eq!(outside_paths(&format!("see {shared}/k"), 0).len(), 1);
    assert!(outside_paths(&format!("see {shared}/k"), 1).is_empty());
    assert_eq!(outside_paths(&format!("({}/{shared})", ".."), 1).len(), 1);
    assert!(outside_paths(&format!("$X/{shared}"), 0).is_empty());
    assert!(outside_paths(&format!("a/{shared}"), 0).is_empty());
    assert!(outside_paths("cd ../ && ls", 0).is_empty());
    assert_eq!(
        outside_paths(&format!("cat {work}"), 5),
        ["absolute /work/ path"]
    );
    assert!(outside_paths(&format!("my{work}"), 0).is_empty());
}

//! The module graph of every crate has no cycles (checked by this module's test, so by
//! `cargo test --workspace`): a module that uses `crate::a` depends on
//! `a`, and no two modules may reach each other. Comments, `$crate::` paths inside macros
//! and `#[cfg(test)] mod tests` bodies are left out (they are not dependencies of the code).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::root;

/// The crates whose `src` is checked.
const CRATES: &[&str] = &[
    "hicache-core",
    "hicache-posix",
    "hicache-obj",
    "hicache-gds",
    "hicache-3fs",
    "hicache-testkit",
    "hicache",
    "hicache-cli",
    "xtask",
];

/// Each top-level module of `src` and the sibling modules it names through `crate::`.
fn graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    let entries = std::fs::read_dir(src).map_err(|e| format!("{}: {e}", src.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let (name, files) = if path.is_dir() {
            let mut files = Vec::new();
            collect(&path, &mut files)?;
            (entry.file_name().to_string_lossy().into_owned(), files)
        } else if path.extension().is_some_and(|e| e == "rs") {
            let stem = path
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (stem, vec![path])
        } else {
            continue;
        };
        if name == "lib" || name == "main" {
            continue;
        }
        let text = texts.entry(name).or_default();
        for f in files {
            let body = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            text.push_str(&code_of(&body));
        }
    }
    let names: BTreeSet<String> = texts.keys().cloned().collect();
    Ok(texts
        .iter()
        .map(|(name, text)| {
            let deps = crate_paths(text)
                .into_iter()
                .filter(|d| d != name && names.contains(d))
                .collect();
            (name.clone(), deps)
        })
        .collect())
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<(), String> {
    for entry in std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
    {
        let p = entry.path();
        if p.is_dir() {
            collect(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "rs")
            && p.file_name() != Some("tests.rs".as_ref())
        {
            out.push(p);
        }
    }
    Ok(())
}

/// The source without comments and without its `#[cfg(test)] mod tests { … }` tail.
fn code_of(body: &str) -> String {
    let body = body.split("#[cfg(test)]\nmod tests").next().unwrap_or(body);
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Module names after `crate::` (not `$crate::`, which is the macro's user's crate).
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        let after = &rest[i + "crate::".len()..];
        rest = after;
        if before == Some('$') || before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

/// Pairs of modules that reach each other.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for d in g.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(m))).collect();
    let mut out = Vec::new();
    for (a, ra) in &reached {
        for b in ra {
            if a.as_str() < b.as_str() && reached.get(b).is_some_and(|rb| rb.contains(a.as_str())) {
                out.push(((*a).clone(), b.clone()));
            }
        }
    }
    out
}

/// Fails, naming them, when modules of a crate reach each other.
fn check() -> Result<(), String> {
    let mut found = Vec::new();
    for krate in CRATES {
        let src = root().join(krate).join("src");
        if !src.is_dir() {
            continue;
        }
        for (a, b) in cycles(&graph(&src)?) {
            found.push(format!("{krate}: {a} <-> {b}"));
        }
    }
    if found.is_empty() {
        println!("module graph: no cycles in {} crates", CRATES.len());
        Ok(())
    } else {
        Err(format!("module cycles: {}", found.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(edges: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        edges
            .iter()
            .map(|(m, ds)| (m.to_string(), ds.iter().map(|d| d.to_string()).collect()))
            .collect()
    }

    /// `cargo test --workspace` (so CI) runs this on the real tree.
    #[test]
    fn the_workspace_has_no_module_cycles() {
        check().unwrap();
    }

    #[test]
    fn finds_direct_and_indirect_cycles_only() {
        assert!(cycles(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &[])])).is_empty());
        assert_eq!(
            cycles(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])])).len(),
            3
        );
        assert_eq!(
            cycles(&g(&[("a", &["b"]), ("b", &["a"])])),
            [("a".to_string(), "b".to_string())]
        );
    }

    #[test]
    fn macro_paths_comments_and_tests_are_not_dependencies() {
        let text = code_of(
            "use crate::a::X;\n// crate::b\nfn f() { $crate::c::y(); my_crate::d(); }\n#[cfg(test)]\nmod tests { use crate::e; }",
        );
        assert_eq!(crate_paths(&text), BTreeSet::from(["a".to_string()]));
    }
}

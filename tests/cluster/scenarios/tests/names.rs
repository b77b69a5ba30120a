//! One source of truth for the product's condition types, reasons and host states: their names
//! live in `src/api/mod.rs` (`conditions`, `reasons`, `host_states`) and nowhere else. This
//! fails on any quoted or compared occurrence of one of them in tests/cluster/ (scripts,
//! Python, this crate). A line naming one of Kubernetes' own conditions that happens to share
//! a name (a pod's `Ready`) carries the marker `kubernetes' own`.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(3)
        .unwrap()
        .to_path_buf()
}

/// The string values of `pub const X: &str = "..."` inside `pub mod NAME { ... }`.
fn consts_of(src: &str, module: &str) -> Vec<String> {
    let start = src
        .find(&format!("pub mod {module} {{"))
        .unwrap_or_else(|| panic!("no mod {module} in src/api/mod.rs"));
    let body = &src[start..];
    let body = &body[..body.find("\n}").unwrap()];
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        .filter_map(|l| {
            l.split_once("&str = \"")
                .map(|(_, v)| v.trim_end_matches("\";").to_string())
        })
        .collect()
}

fn names() -> Vec<String> {
    let src = std::fs::read_to_string(repo().join("src/api/mod.rs")).unwrap();
    let mut all = Vec::new();
    for m in ["conditions", "reasons", "host_states"] {
        let found = consts_of(&src, m);
        assert!(
            found.len() >= 2,
            "read {} names from mod {m}: the parser lost track of src/api/mod.rs",
            found.len()
        );
        all.extend(found);
    }
    all
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if p.is_dir() {
            // Go modules (the cluster's own components) and build output are not tests.
            if !["controlplane", "agent", "nodes", "registry", "target"].contains(&name.as_str()) {
                files(&p, out);
            }
        } else if [".sh", ".py", ".rs"].iter().any(|x| name.ends_with(x)) {
            out.push(p);
        }
    }
}

/// The `(file:line, name)` pairs where a line quotes or compares a name.
fn offences(text: &str, file: &str, names: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.contains("kubernetes' own") {
            continue;
        }
        for n in names {
            let forms = [
                format!("\"{n}\""),
                format!("'{n}'"),
                format!("== {n}"),
                format!("=={n}"),
                format!("={n} "),
                format!("== \"{n}"),
            ];
            if forms.iter().any(|f| line.contains(f.as_str())) || line.ends_with(&format!("={n}")) {
                out.push(format!("{file}:{}: {n}", i + 1));
            }
        }
    }
    out
}

#[test]
fn no_condition_or_reason_name_is_written_outside_src_api() {
    let names = names();
    let root = repo();
    let mut all = Vec::new();
    files(&root.join("tests/cluster"), &mut all);
    assert!(
        all.iter().any(|p| p.ends_with("journey/control.rs")),
        "the walk missed the scenarios crate"
    );
    let mut bad = Vec::new();
    for p in &all {
        let rel = p.strip_prefix(&root).unwrap().to_string_lossy().to_string();
        if rel.ends_with("tests/names.rs") {
            continue;
        }
        bad.extend(offences(&std::fs::read_to_string(p).unwrap(), &rel, &names));
    }
    assert!(bad.is_empty(), "condition, reason or host state names written as strings (use h3_ingress::api::{{conditions, reasons, host_states}}):\n{}", bad.join("\n"));
}

#[test]
fn the_guard_catches_what_it_should() {
    let names = vec!["PortConflict".to_string(), "Ready".to_string()];
    assert_eq!(
        offences("reason == \"PortConflict\"", "f", &names),
        ["f:1: PortConflict"]
    );
    assert_eq!(
        offences("[[ $r == PortConflict ]]", "f", &names),
        ["f:1: PortConflict"]
    );
    assert_eq!(
        offences("--for=condition=Ready", "f", &names),
        ["f:1: Ready"]
    );
    assert!(offences("reasons::PORT_CONFLICT; nodes Ready", "f", &names).is_empty());
    assert!(offences(
        "c.type_ == \"Ready\" // kubernetes' own pod condition",
        "f",
        &names
    )
    .is_empty());
}

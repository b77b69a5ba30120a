//! Stamps the git commit into the binary (`h3-ingress --version`, `/status`, the build-info
//! metric) as `H3I_GIT_COMMIT`.
//!
//! The commit comes from the environment variable of the same name when set (the Dockerfile
//! passes its `REVISION` build argument, whose build context has no `.git`), else from `git`
//! in the source tree, else it is `unknown`. Nothing else enters: no time, no host, no dirty
//! flag, so the same sources and commit give the same binary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// Reruns this script when HEAD moves: the HEAD file, the branch it names and packed-refs
/// (only files that exist: cargo reruns a script on every build for a missing one).
fn watch_head(dir: &Path) {
    let resolve = |p: String| -> PathBuf {
        let p = PathBuf::from(p);
        if p.is_absolute() {
            p
        } else {
            dir.join(p)
        }
    };
    let git_dir = git(dir, &["rev-parse", "--git-dir"]).map(resolve);
    let common = git(dir, &["rev-parse", "--git-common-dir"]).map(resolve);
    let mut files = Vec::new();
    if let Some(g) = &git_dir {
        files.push(g.join("HEAD"));
    }
    if let Some(c) = &common {
        files.push(c.join("packed-refs"));
        if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
            files.push(c.join(branch));
        }
    }
    for f in files.into_iter().filter(|f| f.exists()) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=H3I_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let commit = match std::env::var("H3I_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() && c.trim() != "unknown" => c.trim().to_string(),
        _ => {
            watch_head(&dir);
            git(&dir, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    // Only a commit-like value goes into version strings and image tags, 12 digits as `git
    // rev-parse --short=12` gives (a full hash from `git rev-parse HEAD` is cut to that).
    let commit =
        if (7..=40).contains(&commit.len()) && commit.bytes().all(|b| b.is_ascii_hexdigit()) {
            commit[..commit.len().min(12)].to_ascii_lowercase()
        } else {
            "unknown".to_string()
        };
    println!("cargo:rustc-env=H3I_GIT_COMMIT={commit}");
}

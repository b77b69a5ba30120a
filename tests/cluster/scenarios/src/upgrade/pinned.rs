//! The previous release: the pinned commit's binary, built once (debug, from `git archive` of
//! the commit, its commit stamped in as build.rs reads it) into
//! `$H3I_CLUSTER_CACHE/release-<commit12>/h3-ingress` under a lock, so that two runs never build
//! it twice; and the environment the node agent needs to run it for its tag. Blocking: it runs
//! before the cluster comes up (and before the runtime starts).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use h3i_scenarios::cmd::repo;
use h3i_scenarios::{fail, info, ok, Error, Result, Run};

/// 131b96b: the first main commit with everything a roll needs to go unnoticed from the old
/// side too (the certificate mirrors and --hosts-namespace, an operator that becomes ready
/// whatever order its caches fill in, a drain that keeps every processed response); d0332e8,
/// the first with the mirrors, has an operator that at times never became ready (0/1 Available
/// after 120 s). At a release, move it to the released commit: the next run builds it once
/// into `$CACHE/release-<commit12>/`.
pub const PINNED_COMMIT: &str = "131b96b";

fn cache() -> PathBuf {
    std::env::var("H3I_CLUSTER_CACHE")
        .unwrap_or_else(|_| "/var/cache/h3-ingress".into())
        .into()
}

/// A command's stdout, or its failure with stderr.
fn capture(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| Error::Command(format!("{shown}: {e}")))?;
    if !out.status.success() {
        return Err(Error::Command(format!(
            "{shown}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn git(args: &[&str]) -> Command {
    let mut c = Command::new("git");
    c.arg("-C").arg(repo()).args(args);
    c
}

/// The image tag naming a build, `VERSION-COMMIT`, from its `--version`
/// (`h3-ingress VERSION (commit HEX)`).
pub fn tag_of_version(out: &str) -> Option<String> {
    let rest = out.trim().strip_prefix("h3-ingress ")?;
    let (version, rest) = rest.split_once(' ')?;
    let commit = rest.strip_prefix("(commit ")?.strip_suffix(')')?;
    let hex = (7..=40).contains(&commit.len())
        && commit
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
    (hex && !version.is_empty()).then(|| format!("{version}-{commit}"))
}

pub fn tag_of(bin: &Path) -> Result<String> {
    let out = capture(Command::new(bin).arg("--version"))?;
    match tag_of_version(&out) {
        Some(t) => Ok(t),
        None => fail(format!(
            "{} --version says '{out}', want 'h3-ingress VERSION (commit HEX)'",
            bin.display()
        )),
    }
}

/// Holds an exclusive lock on a file until dropped (closing the file releases it).
struct Lock {
    _held: File,
}

impl Lock {
    fn take(path: &Path) -> Result<Lock> {
        let f = File::create(path).map_err(|source| Error::Io {
            context: format!("create {}", path.display()),
            source,
        })?;
        // SAFETY: flock on a file descriptor this File owns for the Lock's lifetime.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::Io {
                context: format!("flock {}", path.display()),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Lock { _held: f })
    }
}

/// The pinned commit's binary (built when the cache lacks it) and the commit's first 12 digits.
pub fn build_pinned() -> Result<(PathBuf, String)> {
    let verify = format!("{PINNED_COMMIT}^{{commit}}");
    // A shallow clone (CI may make one) lacks the release's commit: deepen it first.
    let known = capture(&mut git(&["rev-parse", "--verify", "--quiet", &verify])).is_ok();
    if !known && capture(&mut git(&["rev-parse", "--is-shallow-repository"]))? == "true" {
        info(format!(
            "shallow clone: fetching the history to reach {PINNED_COMMIT}"
        ));
        capture(&mut git(&["fetch", "--quiet", "--unshallow"])).map_err(|e| {
            Error::Check(format!("git fetch --unshallow failed: the release {PINNED_COMMIT} is not in this clone: {e}"))
        })?;
    }
    let commit =
        capture(&mut git(&["rev-parse", "--verify", "--quiet", &verify])).map_err(|_| {
            Error::Check(format!(
                "PINNED_COMMIT={PINNED_COMMIT} is not a commit of {}",
                repo().display()
            ))
        })?;
    let c12 = commit.chars().take(12).collect::<String>();
    let dir = cache().join(format!("release-{c12}"));
    let bin = dir.join("h3-ingress");
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        context: format!("mkdir {}", dir.display()),
        source,
    })?;
    let _lock = Lock::take(&dir.join(".lock"))?;
    if bin.exists() {
        ok(format!("the release {c12} is cached: {}", bin.display()));
        return Ok((bin, c12));
    }
    let t0 = Instant::now();
    let src = h3i_scenarios::scratch_dir("h3i-release-src")?;
    let log = dir.join("build.log");
    info(format!(
        "building {c12} (cargo build --locked, debug; log {})",
        log.display()
    ));
    let script = format!(
        "git -C {repo} archive {commit} | tar -x -C {src} && cd {src} && H3I_GIT_COMMIT={c12} CARGO_TARGET_DIR={target} nice -n 10 cargo build --locked --bin h3-ingress >{log} 2>&1",
        repo = repo().display(),
        src = src.display(),
        target = dir.join("target").display(),
        log = log.display()
    );
    let built = Command::new("sh").args(["-c", &script]).status();
    let _ = std::fs::remove_dir_all(&src);
    if !built.is_ok_and(|s| s.success()) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        return fail(format!(
            "building the release {c12}: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    let tmp = dir.join("h3-ingress.tmp");
    std::fs::copy(dir.join("target/debug/h3-ingress"), &tmp)
        .and_then(|_| std::fs::rename(&tmp, &bin))
        .map_err(|source| Error::Io {
            context: format!("install {}", bin.display()),
            source,
        })?;
    // The binary is what is cached; its build tree is gigabytes (a failed build keeps it, so
    // that the next attempt resumes).
    let _ = std::fs::remove_dir_all(dir.join("target"));
    ok(format!(
        "the release {c12} built in {} s: {}",
        t0.elapsed().as_secs(),
        bin.display()
    ));
    Ok((bin, c12))
}

/// `h3i-scenarios upgrade build`: only builds (or finds) the previous release's binary; no
/// cluster, so it can run before taking the cluster's lock.
pub fn build_only() -> Result<()> {
    build_pinned().map(|_| ())
}

/// The first step, before the cluster comes up: the release built or found, its chart and
/// tag, the working tree's tag, and `H3I_TAG_BINARIES` / `H3I_BINARY` exported for the agent.
pub fn before(run: &mut Run) -> Result<()> {
    run.step(format!(
        "the previous release: commit {PINNED_COMMIT}'s binary (built once, then cached) and chart"
    ));
    let (bin, c12) = build_pinned()?;
    let pinned_tag = tag_of(&bin)?;
    // The working tree's binary: as for every cluster test, target/debug unless H3I_BINARY says.
    let work = std::env::var("H3I_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join("target/debug/h3-ingress"));
    if !work.exists() {
        return fail(format!(
            "H3I_BINARY={} does not exist (cargo build first)",
            work.display()
        ));
    }
    let work_tag = tag_of(&work)?;
    if work_tag == pinned_tag {
        return fail(format!(
            "H3I_BINARY is a build of the pinned commit ({work_tag}): nothing to upgrade"
        ));
    }
    ok(format!(
        "previous release: {pinned_tag} ({}, chart of {c12}); working tree: {work_tag} ({})",
        bin.display(),
        work.display()
    ));
    // Single-threaded here: main calls this before the runtime starts.
    std::env::set_var("H3I_BINARY", &work);
    let mapping = format!("{pinned_tag}={}", bin.display());
    std::env::set_var("H3I_TAG_BINARIES", &mapping);
    // What the cluster's agent must map: `scripts/cluster.sh env`, exported after this, repeats
    // the running agent's own mapping, which differs when the cluster was up already.
    std::env::set_var(WANT_TAG_BINARIES, mapping);
    std::env::set_var("H3I_UPGRADE_PINNED_COMMIT", &c12);
    Ok(())
}

/// The variable [`before`] leaves the mapping it asked the agent for in.
pub const WANT_TAG_BINARIES: &str = "H3I_UPGRADE_WANT_TAG_BINARIES";

/// The pinned tag and binary from `H3I_TAG_BINARIES` (as [`before`] set it and the cluster's
/// environment repeats it).
pub fn from_tag_binaries() -> (String, PathBuf) {
    let v = std::env::var("H3I_TAG_BINARIES").unwrap_or_default();
    let first = v.split(',').next().unwrap_or_default();
    let (tag, bin) = first.split_once('=').unwrap_or_default();
    (tag.to_string(), bin.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_is_version_and_commit() {
        assert_eq!(
            tag_of_version("h3-ingress 0.1.0 (commit 131b96b0a1b2)\n").as_deref(),
            Some("0.1.0-131b96b0a1b2")
        );
        assert_eq!(tag_of_version("h3-ingress 0.1.0 (commit unknown)"), None);
        assert_eq!(tag_of_version("other 0.1.0 (commit 131b96b)"), None);
        assert_eq!(tag_of_version("h3-ingress 0.1.0 (commit 131b9)"), None);
    }
}

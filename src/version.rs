//! What this build is: the crate version and the git commit `build.rs` stamped in.
//!
//! [`BUILD`] is `VERSION-COMMIT` (`0.1.0-3f2a9c1b7d4e`), the tag `scripts/release.sh` gives the
//! image and the chart's appVersion, so a node never runs a cached image of another build
//! under the same tag; a build without a known commit is plain `VERSION`.

/// The crate version (Cargo.toml).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit (12 hex digits from `git`, or what `H3I_GIT_COMMIT` said), or `unknown`.
pub const COMMIT: &str = env!("H3I_GIT_COMMIT");

/// `VERSION-COMMIT`, or `VERSION` when the commit is unknown.
pub const BUILD: &str = if const_eq(COMMIT, "unknown") {
    VERSION
} else {
    concat!(env!("CARGO_PKG_VERSION"), "-", env!("H3I_GIT_COMMIT"))
};

/// What `h3-ingress --version` prints after the program name.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("H3I_GIT_COMMIT"),
    ")"
);

const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether an image reference names one build for good: pinned by digest, or tagged
/// `VERSION-COMMIT` as [`BUILD`] is. Only such images may be pulled `IfNotPresent`; a node
/// would keep running whatever it cached under a reused tag such as `0.1.0`.
pub fn image_is_unique(image: &str) -> bool {
    if image.contains("@sha256:") {
        return true;
    }
    // The tag is after the last ':' that follows the last '/' (a registry port is not a tag).
    let name = image.rsplit('/').next().unwrap_or(image);
    let Some((_, tag)) = name.rsplit_once(':') else {
        return false;
    };
    tag.rsplit_once('-').is_some_and(|(version, commit)| {
        !version.is_empty()
            && (7..=40).contains(&commit.len())
            && commit.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// The pull policy for `image`: `IfNotPresent` only when the reference is unique.
pub fn pull_policy(image: &str) -> &'static str {
    if image_is_unique(image) {
        "IfNotPresent"
    } else {
        "Always"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_names_version_and_commit() {
        assert!(BUILD.starts_with(VERSION));
        if COMMIT == "unknown" {
            assert_eq!(BUILD, VERSION);
        } else {
            assert_eq!(BUILD, format!("{VERSION}-{COMMIT}"));
            assert!(COMMIT.bytes().all(|b| b.is_ascii_hexdigit()), "{COMMIT}");
        }
        assert_eq!(LONG, format!("{VERSION} (commit {COMMIT})"));
    }

    #[test]
    fn only_digests_and_commit_tags_are_unique() {
        for unique in [
            "ghcr.io/h3-ingress/h3-ingress:0.1.0-3f2a9c1b7d4e",
            "registry:5000/h3-ingress:1.2.3-abcdef0",
            "h3-ingress@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "ghcr.io/h3-ingress/h3-ingress:0.1.0@sha256:00",
        ] {
            assert!(image_is_unique(unique), "{unique}");
            assert_eq!(pull_policy(unique), "IfNotPresent");
        }
        for reused in [
            "ghcr.io/h3-ingress/h3-ingress:0.1.0",
            "ghcr.io/h3-ingress/h3-ingress",
            "registry:5000/h3-ingress",
            "h3-ingress:latest",
            "h3-ingress:1.0.0-rc1",
            "h3-ingress:0.1.0-nothex12",
        ] {
            assert!(!image_is_unique(reused), "{reused}");
            assert_eq!(pull_policy(reused), "Always");
        }
    }
}

//! Renders every object the operator creates and validates it, plus `crds/`, against the
//! upstream Kubernetes schemas with `kubernetes-validate --strict` (tests/manifests/validate.sh).
//! Also proves the script fails on a broken object, so a pass means something.

use std::path::{Path, PathBuf};
use std::process::Command;

use h3_ingress::operator::render::write_all;
use h3_ingress::operator::resources::Params;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn params() -> Params {
    Params {
        namespace: "h3-ingress".into(),
        default_image: h3_ingress::operator::DEFAULT_IMAGE.into(),
        hosts_namespace: "h3-ingress-hosts".into(),
    }
}

fn validate(dir: &Path) -> (bool, String) {
    let out = Command::new(repo().join("tests/manifests/validate.sh"))
        .arg(dir)
        .output()
        .expect("tests/manifests/validate.sh runs (needs bash, python3, kubernetes-validate)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn rendered_objects_and_crd_validate_against_upstream_schemas() {
    let dir = repo().join("target/rendered/operator");
    let _ = std::fs::remove_dir_all(&dir);
    let files = write_all(&dir, &params()).expect("renders");
    assert!(files.len() >= 14, "{files:?}");
    let (ok, text) = validate(&dir);
    println!("{text}");
    assert!(ok, "validation failed:\n{text}");
    // Every rendered Kubernetes object was checked, not just some.
    let checked = text.matches(" passed for resource ").count();
    let objects = files
        .iter()
        .filter(|f| {
            !f.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("http3listener-")
        })
        .count();
    assert_eq!(checked, objects + 1, "objects + the CRD:\n{text}");
    assert_eq!(
        text.matches("passed against the Http3Listener schema")
            .count(),
        2
    );
}

#[test]
fn the_validation_fails_on_a_broken_object() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_all(dir.path(), &params()).unwrap();
    let ds = files
        .iter()
        .find(|f| f.to_string_lossy().contains("daemonset-"))
        .unwrap();
    let text = std::fs::read_to_string(ds).unwrap();
    std::fs::write(
        ds,
        text.replace(
            "hostNetwork: true",
            "hostNetwork: true\n      hostNetworking: true",
        ),
    )
    .unwrap();
    let (ok, out) = validate(dir.path());
    assert!(!ok, "an unknown pod field must fail --strict:\n{out}");
    assert!(out.contains("hostNetworking"), "{out}");
}

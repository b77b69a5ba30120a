//! The binary's own subcommands, as a user runs them.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_h3-ingress"))
}

#[test]
fn demo_once_proves_http3_end_to_end() {
    let out = bin().args(["demo", "--once"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("bodies match: yes"), "{stdout}");
    assert!(
        stdout.contains("alt-svc on the HTTP/2 response: h3=\":"),
        "{stdout}"
    );
    assert!(stdout.contains("HTTP/3 works"), "{stdout}");
}

#[test]
fn validate_names_every_bad_field_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "upstream: {address: foo}\naddresses: {ipv4: '::1'}\nhosts:\n- {name: a.test, certFile: nope.pem, keyFile: nope.key}\n",
    )
    .unwrap();
    let out = bin()
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("upstream.address: \"foo\" is not host:port"),
        "{stderr}"
    );
    assert!(
        stderr.contains("addresses.ipv4: \"::1\" is not an IPv4 address"),
        "{stderr}"
    );
    assert!(stderr.contains("hosts[0].certFile:"), "{stderr}");

    std::fs::write(
        &path,
        "upstream: {address: 'a:1'}\nsocket: {recieveBufferBytes: 1}\n",
    )
    .unwrap();
    let out = bin()
        .args(["proxy", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("socket.recieveBufferBytes"), "{stderr}");
    assert!(stderr.contains("unknown field"), "{stderr}");
}

#[test]
fn check_fails_loudly_when_nothing_answers() {
    let out = bin()
        .args([
            "check",
            "https://nothing.test:9/",
            "--resolve",
            "nothing.test:9:127.0.0.1",
            "--insecure",
            "--timeout",
            "3",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(stdout.contains("HTTP/3 FAILED"), "{stdout}");
}

#[test]
fn crd_subcommand_prints_the_checked_in_crd() {
    let out = bin().arg("crd").output().unwrap();
    let on_disk = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/http3listeners.h3-ingress.dev.yaml"
    ))
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), on_disk);
}

/// Kubernetes mode needs the namespace of the certificate mirrors: from the flag or from
/// `H3I_HOSTS_NAMESPACE`, never guessed.
#[test]
fn kubernetes_mode_names_the_missing_hosts_namespace() {
    let out = bin()
        .args(["proxy", "--listener", "public"])
        .env_remove("H3I_HOSTS_NAMESPACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--hosts-namespace"), "{stderr}");
    // With the variable set, the flags parse and the proxy goes on to look for a cluster
    // (there is none here: KUBECONFIG points nowhere).
    let out = bin()
        .args(["proxy", "--listener", "public"])
        .env("H3I_HOSTS_NAMESPACE", "h3-hosts")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("--hosts-namespace"), "{stderr}");
    assert!(stderr.contains("Kubernetes API"), "{stderr}");
}

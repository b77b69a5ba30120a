//! What certificate a TLS server presents for a given SNI, asked with `openssl
//! s_client` so the answer comes from a TLS stack that is not ours.

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::error::{HarnessError, IoContext, Result};
use super::sha256_hex;

#[derive(Debug, Clone)]
pub struct TlsProbe {
    /// Hex SHA-256 of the first (leaf) certificate the server sent.
    pub leaf_der_sha256: String,
    /// Number of certificates the server sent.
    pub chain_len: usize,
    /// ALPN the server selected, if any.
    pub alpn: Option<String>,
    /// e.g. "TLSv1.3".
    pub protocol: Option<String>,
    /// s_client's full stdout, for failure messages.
    pub raw: String,
}

/// Handshakes with `addr` using `sni` (and offering `alpn`, comma-separated, if given),
/// then closes. Certificate verification is not enforced: the caller compares digests.
pub fn probe(addr: SocketAddr, sni: &str, alpn: Option<&str>) -> Result<TlsProbe> {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-showcerts", "-connect"])
        .arg(addr.to_string())
        .args(["-servername", sni]);
    if let Some(a) = alpn {
        cmd.args(["-alpn", a]);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .ctx(|| "running openssl s_client".into())?;
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(raw.as_bytes())
        .filter_map(|c| c.ok())
        .collect();
    let Some(leaf) = certs.first() else {
        return Err(HarnessError::Command {
            program: format!("openssl s_client -connect {addr} -servername {sni}"),
            status: out.status.to_string(),
            stderr: format!(
                "no certificate in output\nstdout:\n{raw}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    };
    let field = |prefix: &str| {
        raw.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|v| v.trim().to_string()))
    };
    Ok(TlsProbe {
        leaf_der_sha256: sha256_hex(leaf.as_ref()),
        chain_len: certs.len(),
        alpn: field("ALPN protocol:"),
        protocol: field("Protocol  :").or_else(|| field("Protocol :")),
        raw,
    })
}

//! The lab's test PKI: root (RSA 4096) -> intermediate (RSA 4096) -> leaf (RSA 2048, with
//! CA-issuers URL, CRL point, policy and embedded SCTs) for `lab.test` and the server
//! addresses. It is shaped like a common commercial chain on purpose: about 4.8 KB of DER, so
//! every server's first flight spans several datagrams (6 or 7 on the wire for nginx 1.26,
//! 4 TCP segments for h2), which is what makes a lost last handshake datagram possible at all
//! (docs/field-reports.md, "004 cwnd pinned after one lost handshake packet").
//!
//! Generated with the openssl CLI because ring cannot create RSA keys; kept in a cache
//! directory (4096-bit keys take seconds) and copied into each run's work directory.

use std::fs;
use std::path::{Path, PathBuf};

use crate::netns;
use crate::servers::{Work, HOST};
use crate::topology::{SERVER_V4, SERVER_V6};
use crate::LabError;

/// Bump when the certificates' shape changes, so a cached older chain is regenerated.
const PKI_VERSION: &str = "2";

/// The chain as every server in the lab uses it, in the run's work directory.
#[derive(Debug, Clone)]
pub struct Pki {
    pub root: PathBuf,
    /// Leaf, intermediate and root, in that order: what every server sends.
    pub fullchain: PathBuf,
    pub key: PathBuf,
    /// DER bytes of the three certificates, i.e. the size of the Certificate message.
    pub chain_der_bytes: usize,
}

fn io(ctx: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let ctx = ctx.into();
    move |e| LabError::io(ctx, e)
}

fn openssl(args: &[&str]) -> Result<(), LabError> {
    netns::run("openssl", args).map(|_| ())
}

/// The chain from `cache` (made there first when missing or outdated), copied into `work`.
pub fn make_pki(work: &Work, cache: &Path) -> Result<Pki, LabError> {
    fs::create_dir_all(cache).map_err(io(format!("mkdir {}", cache.display())))?;
    let current = fs::read_to_string(cache.join("VERSION")).unwrap_or_default();
    if current.trim() != PKI_VERSION || !cache.join("fullchain.pem").exists() {
        write_extensions(cache)?;
        make_chain(cache)?;
        fs::write(cache.join("VERSION"), PKI_VERSION).map_err(io("write pki VERSION"))?;
    }
    let out = work.path("pki");
    for f in ["root.pem", "fullchain.pem", "leaf.key"] {
        fs::copy(cache.join(f), out.join(f)).map_err(io(format!("copy {f}")))?;
    }
    let pem = fs::read_to_string(out.join("fullchain.pem")).map_err(io("read fullchain.pem"))?;
    Ok(Pki {
        root: out.join("root.pem"),
        fullchain: out.join("fullchain.pem"),
        key: out.join("leaf.key"),
        chain_der_bytes: pem_der_len(&pem),
    })
}

/// The openssl extension files of the intermediate (`ca.ext`) and the leaf (`leaf.ext`).
fn write_extensions(d: &Path) -> Result<(), LabError> {
    // No OCSP responder URL: Caddy would try to staple and resolve it from the lab, where no
    // DNS exists. The CA-issuers URL and CRL point keep the size realistic.
    let aia = "authorityInfoAccess=caIssuers;URI:http://pki.h3lab.test/intermediate-ca-2026.crt\ncrlDistributionPoints=URI:http://crl.h3lab.test/intermediate-ca-2026.crl\ncertificatePolicies=2.23.140.1.2.1\n";
    fs::write(
        d.join("ca.ext"),
        format!("basicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,digitalSignature,keyCertSign,cRLSign\nextendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n{aia}"),
    )
    .map_err(io("write ca.ext"))?;
    fs::write(
        d.join("leaf.ext"),
        format!(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=DNS:{HOST},DNS:www.{HOST},IP:{SERVER_V4},IP:{SERVER_V6}\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n{aia}{}\n",
            sct_extension()
        ),
    )
    .map_err(io("write leaf.ext"))
}

/// Keys and certificates of the three levels, and `fullchain.pem` (leaf first).
fn make_chain(d: &Path) -> Result<(), LabError> {
    let p = |f: &str| d.join(f).to_string_lossy().into_owned();
    openssl(&["genrsa", "-out", &p("root.key"), "4096"])?;
    openssl(&[
        "req",
        "-x509",
        "-new",
        "-key",
        &p("root.key"),
        "-sha256",
        "-days",
        "3650",
        "-subj",
        "/C=DE/O=h3-ingress lab/OU=Test PKI/CN=h3lab Root CA R1",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-out",
        &p("root.pem"),
    ])?;
    let inter_subject = "/C=DE/O=h3-ingress lab/OU=Test PKI/CN=h3lab TLS RSA Intermediate CA 2026";
    issue(
        d,
        "inter",
        4096,
        inter_subject,
        ("root", "2"),
        3650,
        "ca.ext",
    )?;
    let leaf_subject = format!("/CN={HOST}");
    issue(
        d,
        "leaf",
        2048,
        &leaf_subject,
        ("inter", "3"),
        825,
        "leaf.ext",
    )?;
    let mut chain = String::new();
    for f in ["leaf.pem", "inter.pem", "root.pem"] {
        chain.push_str(&fs::read_to_string(d.join(f)).map_err(io(format!("read {f}")))?);
    }
    fs::write(d.join("fullchain.pem"), chain).map_err(io("write fullchain.pem"))
}

/// Makes `<name>.key` (RSA of `bits`) and `<name>.pem` signed by `issuer` (`<issuer>.pem` and
/// `.key`, with the certificate's serial) with the extensions of `extfile`.
fn issue(
    d: &Path,
    name: &str,
    bits: u32,
    subject: &str,
    (issuer, serial): (&str, &str),
    days: u32,
    extfile: &str,
) -> Result<(), LabError> {
    let p = |f: String| d.join(f).to_string_lossy().into_owned();
    let (key, csr, pem) = (
        p(format!("{name}.key")),
        p(format!("{name}.csr")),
        p(format!("{name}.pem")),
    );
    openssl(&["genrsa", "-out", &key, &bits.to_string()])?;
    openssl(&["req", "-new", "-key", &key, "-subj", subject, "-out", &csr])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &p(format!("{issuer}.pem")),
        "-CAkey",
        &p(format!("{issuer}.key")),
        "-set_serial",
        serial,
        "-days",
        &days.to_string(),
        "-sha256",
        "-extfile",
        &p(extfile.to_string()),
        "-out",
        &pem,
    ])
}

/// An SCT list extension (OID 1.3.6.1.4.1.11129.2.4.2) of the size public CAs embed: three
/// signed certificate timestamps of 118 bytes. The content is filler (no client checks it in
/// the lab); the size matters, it makes the leaf as big as a real one.
fn sct_extension() -> String {
    let mut hex = String::from("0168"); // list length 360: three times 2 + 118
    for log in 0u8..3 {
        hex.push_str("0076"); // SCT length 118
        hex.push_str("00"); // v1
        for i in 0..32u8 {
            hex.push_str(&format!("{:02x}", log.wrapping_mul(31).wrapping_add(i)));
            // log id
        }
        hex.push_str("0000019a2b3c4d5e"); // timestamp
        hex.push_str("0000"); // no extensions
        hex.push_str("04030047"); // ecdsa-sha256, 71-byte signature
        hex.push_str("3045022100");
        for i in 0..32u8 {
            hex.push_str(&format!("{:02x}", i ^ 0x5a));
        }
        hex.push_str("0220");
        for i in 0..32u8 {
            hex.push_str(&format!("{:02x}", i ^ 0xa5));
        }
    }
    format!("1.3.6.1.4.1.11129.2.4.2=ASN1:FORMAT:HEX,OCTETSTRING:{hex}")
}

/// Total DER length of the PEM blocks in `pem` (base64 decoded size). Pure.
pub fn pem_der_len(pem: &str) -> usize {
    let mut total = 0;
    let mut b64 = String::new();
    let mut inside = false;
    for line in pem.lines() {
        if line.starts_with("-----BEGIN") {
            inside = true;
            b64.clear();
        } else if line.starts_with("-----END") {
            inside = false;
            let pad = b64.chars().rev().take_while(|c| *c == '=').count();
            total += b64.len() / 4 * 3 - pad;
        } else if inside {
            b64.push_str(line.trim());
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_length_of_pem() {
        // "AAAA" is 3 bytes, "AAA=" 2 bytes.
        let pem = "-----BEGIN CERTIFICATE-----\nAAAA\nAAA=\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(pem_der_len(pem), 8);
    }
}

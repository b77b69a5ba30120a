//! A throw-away PKI for a run: one CA and leaf certificates for the test hosts, written as PEM
//! files (`DIR/NAME.crt`, `DIR/NAME.key`) for nginx and the clients, with the SHA-256 of each
//! leaf's DER that the HTTP/3 clients report back.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use sha2::{Digest, Sha256};

use crate::error::IoContext;
use crate::{Error, Result};

/// The CA of a run and the directory its files go to.
pub struct Pki {
    dir: PathBuf,
    ca_params: CertificateParams,
    ca_key: KeyPair,
}

/// A leaf written by [`Pki::leaf`]: its files and the SHA-256 of its DER.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub crt: PathBuf,
    pub key: PathBuf,
    pub sha256: String,
}

fn rc(e: rcgen::Error) -> Error {
    Error::Command(format!("rcgen: {e}"))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).context(|| format!("write {}", path.display()))
}

impl Pki {
    /// A CA named `common_name`, written to `DIR/ca.crt`.
    pub fn new(dir: &Path, common_name: &str) -> Result<Pki> {
        std::fs::create_dir_all(dir).context(|| format!("mkdir {}", dir.display()))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rc)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().map_err(rc)?;
        let cert = params.self_signed(&ca_key).map_err(rc)?;
        write(&dir.join("ca.crt"), &cert.pem())?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca_params: params,
            ca_key,
        })
    }

    /// Writes the CA's key as `DIR/ca.key` (PKCS#8), for a tool that signs its own leaves.
    pub fn write_ca_key(&self) -> Result<PathBuf> {
        let path = self.dir.join("ca.key");
        write(&path, &self.ca_key.serialize_pem())?;
        Ok(path)
    }

    /// `DIR/ca.crt`.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A server certificate for `host` signed by the CA, as `DIR/NAME.crt` and `.key` (a second
    /// leaf for the same host under another name is a rotation's new certificate).
    pub fn leaf(&self, name: &str, host: &str) -> Result<Leaf> {
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(rc)?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        // Valid from now, as `openssl x509 -req` makes it: the data plane takes a certificate
        // the TCP ingress presents for a renewal only when it starts later than the one it
        // holds (rcgen's default start, 1975, is the same for every leaf).
        params.not_before = std::time::SystemTime::now().into();
        let key = KeyPair::generate().map_err(rc)?;
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer).map_err(rc)?;
        let leaf = Leaf {
            crt: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
            sha256: hex::encode(Sha256::digest(cert.der())),
        };
        write(&leaf.crt, &cert.pem())?;
        write(&leaf.key, &key.serialize_pem())?;
        Ok(leaf)
    }
}

/// SHA-256 of a byte string, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_is_signed_by_the_ca_and_its_hash_is_of_the_der() {
        let dir = std::env::temp_dir().join(format!("h3i-pki-test-{}", std::process::id()));
        let pki = Pki::new(&dir, "test-ca").unwrap();
        let leaf = pki.leaf("shop.h3i.test", "shop.h3i.test").unwrap();
        let pem = std::fs::read_to_string(&leaf.crt).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(pki.ca())
            .arg(&leaf.crt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let der = std::process::Command::new("openssl")
            .args(["x509", "-outform", "DER", "-in"])
            .arg(&leaf.crt)
            .output()
            .unwrap()
            .stdout;
        assert_eq!(sha256_hex(&der), leaf.sha256);
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}

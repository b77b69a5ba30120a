//! Test certificates, generated at run time so no key material lives in the repo.
//!
//! [`TestPki`] is a small ECDSA P-256 CA with one leaf per virtual host (each with its
//! own key), which is what the proxy and the nginx fixture share. [`RsaChain`] is a
//! root → intermediate → leaf RSA chain for the lab: RSA certificates are large, and a
//! server's first flight that exceeds the QUIC anti-amplification limit is exactly the
//! handshake shape the congestion-control scenarios need.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::error::{write_file, HarnessError, IoContext, Result};
use super::sha256_hex;

/// The virtual hosts every fixture serves unless told otherwise.
pub const DEFAULT_HOSTS: [&str; 2] = ["a.test", "b.test"];

/// A validity window in whole days relative to today (UTC). Day granularity is all the
/// tests need and keeps us independent of the `time` crate's optional features.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    pub not_before_days: i64,
    pub not_after_days: i64,
}

impl Validity {
    /// Valid now: from yesterday for 30 days.
    pub fn current() -> Self {
        Validity {
            not_before_days: -1,
            not_after_days: 30,
        }
    }

    /// Expired yesterday.
    pub fn expired() -> Self {
        Validity {
            not_before_days: -30,
            not_after_days: -1,
        }
    }

    /// Becomes valid tomorrow.
    pub fn not_yet_valid() -> Self {
        Validity {
            not_before_days: 1,
            not_after_days: 30,
        }
    }

    fn apply(self, params: &mut CertificateParams) {
        let (y, m, d) = date_from_today(self.not_before_days);
        params.not_before = rcgen::date_time_ymd(y, m, d);
        let (y, m, d) = date_from_today(self.not_after_days);
        params.not_after = rcgen::date_time_ymd(y, m, d);
    }
}

fn date_from_today(offset_days: i64) -> (i32, u8, u8) {
    let today = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
        / 86_400;
    civil_from_days(today + offset_days)
}

/// Gregorian (year, month, day) of a day count since 1970-01-01, using the era
/// decomposition (400-year cycles of 146097 days, years starting in March so the leap
/// day is last).
pub fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468; // shift the epoch to 0000-03-01
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year as i32, month as u8, day as u8)
}

/// One issued leaf certificate and where its PEM files are.
#[derive(Debug, Clone)]
pub struct LeafCert {
    /// The host this leaf was issued for (first SAN).
    pub name: String,
    pub sans: Vec<String>,
    pub cert_pem: String,
    pub key_pem: String,
    /// Leaf certificate only (the CA is the trust anchor, not sent).
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    /// Hex SHA-256 of the leaf's DER: what a client sees as "the server certificate".
    pub der_sha256: String,
}

/// An intermediate CA under a [`TestPki`]'s CA: what a public CA issues from, several under
/// one root (Let's Encrypt's R10 and R11).
pub struct Intermediate {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub cert_pem: String,
    dir: PathBuf,
}

impl Intermediate {
    /// A leaf for `sans` from this intermediate, valid from `ago` before now for 30 days (to
    /// the second, so renewals minutes apart are ordered), into `<file_stem>.crt`/`.key`.
    pub fn issue(
        &self,
        file_stem: &str,
        sans: &[&str],
        ago: std::time::Duration,
    ) -> Result<LeafCert> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970");
        let from = rcgen::date_time_ymd(1970, 1, 1) + (now - ago);
        let mut params = leaf_params(file_stem, sans)?;
        params.not_before = from;
        params.not_after = from + std::time::Duration::from_secs(30 * 86_400);
        write_leaf(&self.dir, file_stem, sans, params, &self.issuer)
    }
}

fn leaf_params(file_stem: &str, sans: &[&str]) -> Result<CertificateParams> {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(sans.clone())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(
        DnType::CommonName,
        sans.first()
            .cloned()
            .unwrap_or_else(|| file_stem.to_string()),
    );
    params.is_ca = IsCa::NoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

fn write_leaf(
    dir: &Path,
    file_stem: &str,
    sans: &[&str],
    params: CertificateParams,
    issuer: &CertifiedIssuer<'static, KeyPair>,
) -> Result<LeafCert> {
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    let cert_path = dir.join(format!("{file_stem}.crt"));
    let key_path = dir.join(format!("{file_stem}.key"));
    let cert_pem = cert.pem();
    let key_pem = key.serialize_pem();
    write_file(&cert_path, &cert_pem)?;
    write_file(&key_path, &key_pem)?;
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    Ok(LeafCert {
        name: sans.first().cloned().unwrap_or_default(),
        sans,
        cert_pem,
        key_pem,
        cert_path,
        key_path,
        der_sha256: sha256_hex(cert.der()),
    })
}

/// A throw-away CA plus one leaf per host, written as PEM files into a temp dir.
pub struct TestPki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
    pub ca_cert_pem: String,
    pub ca_cert_path: PathBuf,
    /// Hex SHA-256 of the CA certificate DER.
    pub ca_der_sha256: String,
    leaves: Vec<LeafCert>,
}

impl TestPki {
    /// CA plus leaves for `a.test` and `b.test`.
    pub fn generate() -> Result<TestPki> {
        Self::generate_for(&DEFAULT_HOSTS)
    }

    /// CA plus one leaf per name (each leaf has that single DNS SAN and its own key).
    pub fn generate_for(hosts: &[&str]) -> Result<TestPki> {
        let mut dir = tempfile::Builder::new()
            .prefix("h3i-pki-")
            .tempdir()
            .ctx(|| "creating PKI temp dir".into())?;
        if std::env::var_os(super::nginx::KEEP_ENV).is_some() {
            dir.disable_cleanup(true);
        }
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "h3-ingress test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Validity {
            not_before_days: -1,
            not_after_days: 365,
        }
        .apply(&mut params);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let ca_cert_pem = ca.pem();
        let ca_cert_path = dir.path().join("ca.crt");
        write_file(&ca_cert_path, &ca_cert_pem)?;
        let ca_der_sha256 = sha256_hex(ca.der());
        let mut pki = TestPki {
            dir,
            ca,
            ca_cert_pem,
            ca_cert_path,
            ca_der_sha256,
            leaves: Vec::new(),
        };
        for host in hosts {
            let leaf = pki.issue(host, &[host], Validity::current())?;
            pki.leaves.push(leaf);
        }
        Ok(pki)
    }

    /// Issues an extra leaf from this CA (e.g. expired, or naming the wrong host) into
    /// `<file_stem>.crt` / `<file_stem>.key`. It is not added to [`Self::leaves`].
    pub fn issue(&self, file_stem: &str, sans: &[&str], validity: Validity) -> Result<LeafCert> {
        let mut params = leaf_params(file_stem, sans)?;
        validity.apply(&mut params);
        write_leaf(self.dir.path(), file_stem, sans, params, &self.ca)
    }

    /// An intermediate CA named `cn`, signed by this CA (valid as long as it).
    pub fn intermediate(&self, cn: &str) -> Result<Intermediate> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.use_authority_key_identifier_extension = true;
        Validity {
            not_before_days: -1,
            not_after_days: 365,
        }
        .apply(&mut params);
        let issuer = CertifiedIssuer::signed_by(params, KeyPair::generate()?, &self.ca)?;
        Ok(Intermediate {
            cert_pem: issuer.pem(),
            issuer,
            dir: self.dir.path().to_path_buf(),
        })
    }

    /// The leaf for `host`; panics if this PKI was not generated for it.
    pub fn leaf(&self, host: &str) -> &LeafCert {
        self.leaves
            .iter()
            .find(|l| l.name == host)
            .unwrap_or_else(|| panic!("TestPki has no leaf for {host:?}"))
    }

    pub fn leaves(&self) -> &[LeafCert] {
        &self.leaves
    }

    pub fn hosts(&self) -> Vec<&str> {
        self.leaves.iter().map(|l| l.name.as_str()).collect()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// RSA key sizes for the three levels of [`RsaChain`].
#[derive(Debug, Clone, Copy)]
pub struct RsaChainBits {
    pub root: u32,
    pub intermediate: u32,
    pub leaf: u32,
}

impl Default for RsaChainBits {
    /// The shape of a common public chain: 4096-bit root (not sent), 2048-bit
    /// intermediate and leaf.
    fn default() -> Self {
        RsaChainBits {
            root: 4096,
            intermediate: 2048,
            leaf: 2048,
        }
    }
}

/// A root → intermediate → leaf RSA chain.
///
/// rcgen 0.14 can sign with RSA keys under ring but cannot generate them ("Ring doesn't
/// have RSA key generation", rcgen's `KeyPair::generate_for`; only its aws-lc-rs backend
/// can), and the project builds rcgen with ring only. So the keys come from
/// `openssl genpkey` (PKCS#8 PEM) and rcgen does the certificates.
#[derive(Debug, Clone)]
pub struct RsaChain {
    pub root_cert_path: PathBuf,
    pub intermediate_cert_path: PathBuf,
    pub leaf_cert_path: PathBuf,
    pub leaf_key_path: PathBuf,
    /// Leaf followed by intermediate: what a server sends.
    pub chain_path: PathBuf,
    /// Total DER bytes of leaf + intermediate, i.e. the certificate payload of the
    /// server's first flight.
    pub chain_der_len: usize,
    pub leaf_der_sha256: String,
}

impl RsaChain {
    /// Writes the chain into `dir` (created if missing) for the given leaf names.
    pub fn generate(dir: &Path, leaf_names: &[&str], bits: RsaChainBits) -> Result<RsaChain> {
        std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
        let root_key = openssl_rsa_key(&dir.join("root.key"), bits.root)?;
        let inter_key = openssl_rsa_key(&dir.join("intermediate.key"), bits.intermediate)?;
        let leaf_key_path = dir.join("leaf.key");
        let leaf_key = openssl_rsa_key(&leaf_key_path, bits.leaf)?;

        let mut root = CertificateParams::new(Vec::<String>::new())?;
        root.distinguished_name
            .push(DnType::CommonName, "h3-ingress lab RSA root");
        root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        root.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Validity {
            not_before_days: -1,
            not_after_days: 3650,
        }
        .apply(&mut root);
        let root = CertifiedIssuer::self_signed(root, root_key)?;

        let mut inter = CertificateParams::new(Vec::<String>::new())?;
        inter
            .distinguished_name
            .push(DnType::CommonName, "h3-ingress lab RSA intermediate");
        inter.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        inter.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        inter.use_authority_key_identifier_extension = true;
        Validity {
            not_before_days: -1,
            not_after_days: 1825,
        }
        .apply(&mut inter);
        let inter = CertifiedIssuer::signed_by(inter, inter_key, &root)?;

        let names: Vec<String> = leaf_names.iter().map(|s| s.to_string()).collect();
        let mut leaf = CertificateParams::new(names.clone())?;
        leaf.distinguished_name = rcgen::DistinguishedName::new();
        leaf.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        leaf.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        leaf.use_authority_key_identifier_extension = true;
        Validity::current().apply(&mut leaf);
        let leaf = leaf.signed_by(&leaf_key, &inter)?;

        let root_cert_path = dir.join("root.crt");
        let intermediate_cert_path = dir.join("intermediate.crt");
        let leaf_cert_path = dir.join("leaf.crt");
        let chain_path = dir.join("chain.crt");
        write_file(&root_cert_path, root.pem())?;
        write_file(&intermediate_cert_path, inter.pem())?;
        write_file(&leaf_cert_path, leaf.pem())?;
        write_file(&chain_path, format!("{}{}", leaf.pem(), inter.pem()))?;
        Ok(RsaChain {
            root_cert_path,
            intermediate_cert_path,
            leaf_cert_path,
            leaf_key_path,
            chain_path,
            chain_der_len: leaf.der().len() + inter.der().len(),
            leaf_der_sha256: sha256_hex(leaf.der()),
        })
    }
}

fn openssl_rsa_key(path: &Path, bits: u32) -> Result<KeyPair> {
    let out = Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt"])
        .arg(format!("rsa_keygen_bits:{bits}"))
        .arg("-out")
        .arg(path)
        .output()
        .ctx(|| "running openssl genpkey (is openssl installed? scripts/setup.sh)".into())?;
    if !out.status.success() {
        return Err(HarnessError::Command {
            program: "openssl genpkey".into(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let pem = std::fs::read_to_string(path).ctx(|| format!("reading {}", path.display()))?;
    Ok(KeyPair::from_pem(&pem)?)
}

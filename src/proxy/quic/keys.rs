//! The secrets that make a proxy's QUIC endpoint the same endpoint after a restart and on
//! every node of a listener: the stateless-reset key, the connection-ID check key and marker
//! ([`super::cid`]) and the Retry-token key, all derived from one secret.
//!
//! With random per-process keys (quinn's default) a restarted or OOM-killed proxy cannot
//! recognise its own connection IDs, so the clients of the old process get no stateless reset
//! and hang until their idle timeout; and a Retry token minted on one node is refused on the
//! next one behind the same address. With one shared secret, any process of the listener
//! answers an old connection with a reset the client accepts, and validates any Retry token.
//!
//! [`derive()`] is pure; [`load`] is the I/O around it (read the file, or create it).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use quinn::crypto::HandshakeTokenKey;
use ring::rand::{SecureRandom, SystemRandom};
use ring::{hkdf, hmac};

use super::cid::{self, SlotCids};

pub use crate::api::keys::{GENERATED_SECRET_BYTES, MAX_SECRET_BYTES, MIN_SECRET_BYTES};

/// Versioned, so a future change of the derivation cannot silently reuse old keys.
const SALT: &[u8] = b"h3-ingress quic endpoint keys v2";
const INFO_RESET: &[u8] = b"stateless reset";
const INFO_CID: &[u8] = b"connection id check";
const INFO_MARKER: &[u8] = b"connection id marker";
const INFO_TOKEN: &[u8] = b"retry token";

/// Where the keys of this process came from (logged at startup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Read from an existing file.
    File(PathBuf),
    /// No file configured: those of the process this one took the port over from.
    Inherited,
    /// The file did not exist and was created with a fresh secret.
    Generated(PathBuf),
    /// No file configured: random for this process only.
    Ephemeral,
}

/// The endpoint keys derived from one secret.
pub struct Keys {
    reset: Arc<hmac::Key>,
    cid: hmac::Key,
    marker: u16,
    token: Arc<hkdf::Prk>,
    /// Kept so a process that takes over this one's port without a keys file of its own
    /// can be the same endpoint (see [`crate::proxy::handover`]).
    secret: Vec<u8>,
    pub origin: Origin,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key material.
        f.debug_struct("Keys")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// Why the key file cannot be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("keys file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "keys file {path}: {len} bytes; it needs {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} \
         (create one with `head -c 64 /dev/urandom > FILE`)"
    )]
    Size { path: PathBuf, len: usize },
    #[error("no random numbers from the system")]
    Random,
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn expand(prk: &hkdf::Prk, info: &[u8], out: &mut [u8]) {
    prk.expand(&[info], Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("HKDF-SHA256 output of at most 32 bytes");
}

/// The three keys of `secret` (HKDF-SHA256, one label each). Pure: the same secret gives the
/// same keys in every process.
pub fn derive(secret: &[u8], origin: Origin) -> Keys {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(secret);
    let mut reset = [0u8; 32];
    expand(&prk, INFO_RESET, &mut reset);
    let mut cid = [0u8; 32];
    expand(&prk, INFO_CID, &mut cid);
    let mut marker = [0u8; 2];
    expand(&prk, INFO_MARKER, &mut marker);
    let mut token = [0u8; 32];
    expand(&prk, INFO_TOKEN, &mut token);
    Keys {
        reset: Arc::new(hmac::Key::new(hmac::HMAC_SHA256, &reset)),
        cid: hmac::Key::new(hmac::HMAC_SHA256, &cid),
        marker: cid::marker_of(marker),
        token: Arc::new(hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(&token)),
        secret: secret.to_vec(),
        origin,
    }
}

impl Keys {
    /// The endpoint configuration of the process in `slot`: stateless resets and connection
    /// IDs of that slot from these keys.
    pub fn endpoint_config(&self, slot: usize) -> quinn::EndpointConfig {
        let mut c = quinn::EndpointConfig::new(self.reset.clone());
        let (key, marker) = (self.cid.clone(), self.marker);
        c.cid_generator(move || Box::new(SlotCids::new(slot, marker, key.clone())));
        c
    }

    /// The connection-ID generator of `slot` (tests and tools).
    pub fn cids(&self, slot: usize) -> SlotCids {
        SlotCids::new(slot, self.marker, self.cid.clone())
    }

    /// The 13 marker bits of every connection ID ([`super::cid`]).
    pub fn marker(&self) -> u16 {
        self.marker
    }

    /// The secret the keys were derived from.
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// The key Retry tokens are sealed with.
    pub fn token_key(&self) -> Arc<dyn HandshakeTokenKey> {
        self.token.clone()
    }
}

/// A fresh secret of [`GENERATED_SECRET_BYTES`] random bytes.
pub fn random_secret() -> Result<[u8; GENERATED_SECRET_BYTES], KeyError> {
    let mut secret = [0u8; GENERATED_SECRET_BYTES];
    SystemRandom::new()
        .fill(&mut secret)
        .map_err(|_| KeyError::Random)?;
    Ok(secret)
}

/// Creates `path` with a fresh secret, readable by its owner only. `Ok(None)` when another
/// process created it first (the caller reads that one).
fn create(path: &Path) -> Result<Option<[u8; GENERATED_SECRET_BYTES]>, KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let secret = random_secret()?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let mut file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    file.write_all(&secret).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(Some(secret))
}

/// Whether a file with these permission bits can be read by any user (a Kubernetes Secret
/// volume is group-readable for the pod's fsGroup, which is fine).
pub fn readable_by_others(mode: u32) -> bool {
    mode & 0o004 != 0
}

/// The keys from `path`, creating the file if it does not exist; random keys without one.
pub fn load(path: Option<&Path>) -> Result<Keys, KeyError> {
    let Some(path) = path else {
        return Ok(derive(&random_secret()?, Origin::Ephemeral));
    };
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let secret = match std::fs::read(path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match create(path)? {
            Some(s) => return Ok(derive(&s, Origin::Generated(path.to_path_buf()))),
            None => std::fs::read(path).map_err(io)?,
        },
        Err(e) => return Err(io(e)),
    };
    if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&secret.len()) {
        return Err(KeyError::Size {
            path: path.to_path_buf(),
            len: secret.len(),
        });
    }
    Ok(derive(&secret, Origin::File(path.to_path_buf())))
}

/// The permission bits of `path`, to warn about a secret others can read.
pub fn mode(path: &Path) -> Option<u32> {
    std::fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o777)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn_proto::ConnectionIdGenerator;

    fn reset_tag(k: &Keys, data: &[u8]) -> Vec<u8> {
        hmac::sign(&k.reset, data).as_ref().to_vec()
    }

    /// A CID of `k` in `slot` with fixed random bytes, to compare keys.
    fn cid_of(k: &Keys, slot: usize) -> Vec<u8> {
        k.cids(slot).with_random([1, 2, 3, 4]).to_vec()
    }

    #[test]
    fn one_secret_gives_the_same_keys_and_another_gives_others() {
        let a = derive(&[7u8; 32], Origin::Ephemeral);
        let b = derive(&[7u8; 32], Origin::Ephemeral);
        let c = derive(&[8u8; 32], Origin::Ephemeral);
        assert_eq!(reset_tag(&a, b"cid"), reset_tag(&b, b"cid"));
        assert_ne!(reset_tag(&a, b"cid"), reset_tag(&c, b"cid"));
        assert_eq!((cid_of(&a, 2), a.marker()), (cid_of(&b, 2), b.marker()));
        assert_ne!(cid_of(&a, 2), cid_of(&c, 2));
        assert_eq!(a.secret(), &[7u8; 32]);
        // The three keys are independent of each other.
        assert_ne!(cid_of(&a, 0)[6..], reset_tag(&a, &cid_of(&a, 0)[..6])[..2]);
    }

    #[test]
    fn connection_ids_of_one_process_validate_in_another_with_the_same_secret() {
        let a = derive(&[1u8; 40], Origin::Ephemeral);
        let b = derive(&[1u8; 40], Origin::Ephemeral);
        let c = derive(&[2u8; 40], Origin::Ephemeral);
        let mut gen_a = a.cids(3);
        let (gen_b, gen_c) = (b.cids(0), c.cids(3));
        let mut foreign = 0;
        for _ in 0..64 {
            let cid = gen_a.generate_cid();
            assert!(gen_b.validate(&cid).is_ok());
            foreign += usize::from(gen_c.validate(&cid).is_ok());
        }
        // A different key accepts a CID only if its marker and its 16-bit check collide.
        assert_eq!(foreign, 0);
    }

    #[test]
    fn a_missing_file_is_created_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        let first = load(Some(&path)).unwrap();
        assert_eq!(first.origin, Origin::Generated(path.clone()));
        assert_eq!(std::fs::read(&path).unwrap().len(), GENERATED_SECRET_BYTES);
        assert_eq!(mode(&path), Some(0o600));
        let second = load(Some(&path)).unwrap();
        assert_eq!(second.origin, Origin::File(path.clone()));
        assert_eq!(reset_tag(&first, b"x"), reset_tag(&second, b"x"));
        assert_eq!(cid_of(&first, 1), cid_of(&second, 1));
    }

    #[test]
    fn short_unreadable_and_absent_files() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, [0u8; 31]).unwrap();
        let e = load(Some(&short)).unwrap_err().to_string();
        assert!(e.contains("31 bytes") && e.contains("short"), "{e}");
        let in_missing_dir = dir.path().join("no/such/dir/keys");
        let e = load(Some(&in_missing_dir)).unwrap_err().to_string();
        assert!(
            e.starts_with("keys file ") && e.contains("no/such/dir"),
            "{e}"
        );
        let none = load(None).unwrap();
        assert_eq!(none.origin, Origin::Ephemeral);
        assert!(readable_by_others(0o644));
        assert!(!readable_by_others(0o600));
        assert!(!readable_by_others(0o440));
    }
}

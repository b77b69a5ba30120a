//! The endpoint keys' contract between the operator and the data plane: the per-listener
//! Secret the operator creates holds one random secret under [`SECRET_DATA_KEY`], which the
//! data plane reads (mounted as a file, or `keys.file` standalone) and derives its stateless
//! reset, connection-ID and Retry keys from. No I/O here.

/// The Secret's one data key (the file name where it is mounted).
pub const SECRET_DATA_KEY: &str = "key";
/// At least 256 bits of secret material.
pub const MIN_SECRET_BYTES: usize = 32;
/// A secret file is small; anything bigger is the wrong file.
pub const MAX_SECRET_BYTES: usize = 4096;
/// What a generated secret holds (the operator's Secret, a standalone key file).
pub const GENERATED_SECRET_BYTES: usize = 64;

//! The one error type of the test harness: fixtures fail with a message that says which
//! program or file was involved, so a red test points at the fixture, not at a mystery.

use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("`{program}` failed ({status}): {stderr}")]
    Command {
        program: String,
        status: String,
        stderr: String,
    },
    #[error("{name} exited during start-up ({status}); its log:\n{log}")]
    Exited {
        name: String,
        status: ExitStatus,
        log: String,
    },
    #[error("{name} not ready after {waited:?}: {detail}")]
    NotReady {
        name: String,
        waited: Duration,
        detail: String,
    },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, HarnessError>;

/// Attaches what was being done to an io::Error.
pub trait IoContext<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| HarnessError::Io {
            what: what(),
            source,
        })
    }
}

pub(crate) fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> Result<()> {
    std::fs::write(path, contents).ctx(|| format!("writing {}", path.display()))
}

pub(crate) fn read_to_string_lossy(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

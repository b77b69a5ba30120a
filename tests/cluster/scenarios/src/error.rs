//! The one error type of the scenarios: a failed check says what it expected and what it got;
//! the rest (the API server, a command, a file) say which call failed and why.

use std::fmt::Debug;

/// Why a scenario stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A check failed: the message names what was expected and what came back.
    #[error("{0}")]
    Check(String),
    /// A polled condition did not hold before its deadline.
    #[error("{what} (not within {secs}s{})", last.as_deref().map(|l| format!("; last: {l}")).unwrap_or_default())]
    Timeout {
        what: String,
        secs: u64,
        last: Option<String>,
    },
    /// The API server refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A command could not run or exited non-zero (its stderr is in the message).
    #[error("{0}")]
    Command(String),
    /// A file or socket operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    /// A document did not parse as expected.
    #[error("{context}: {source}")]
    Json {
        context: String,
        source: serde_json::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failed check with this message.
pub fn fail<T>(message: impl Into<String>) -> Result<T> {
    Err(Error::Check(message.into()))
}

/// `what: 'got', want 'want'` unless they are equal.
pub fn expect_eq<T: PartialEq + Debug + ?Sized>(what: &str, want: &T, got: &T) -> Result<()> {
    if want == got {
        return Ok(());
    }
    fail(format!("{what}: {got:?}, want {want:?}"))
}

/// Attaches a context to an I/O error.
pub trait IoContext<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io {
            context: what(),
            source,
        })
    }
}

/// Fails the check with the formatted message unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Error::Check(format!($($msg)+)));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expect_eq_names_both_sides() {
        assert!(expect_eq("x", "a", "a").is_ok());
        let e = expect_eq("DaemonSet maxSurge", "10%", "25%").unwrap_err();
        assert_eq!(e.to_string(), "DaemonSet maxSurge: \"25%\", want \"10%\"");
    }

    #[test]
    fn timeout_says_the_last_reason() {
        let e = Error::Timeout {
            what: "pods Ready".into(),
            secs: 30,
            last: Some("1 of 2".into()),
        };
        assert_eq!(e.to_string(), "pods Ready (not within 30s; last: 1 of 2)");
        let e = Error::Timeout {
            what: "pods Ready".into(),
            secs: 30,
            last: None,
        };
        assert_eq!(e.to_string(), "pods Ready (not within 30s)");
    }
}

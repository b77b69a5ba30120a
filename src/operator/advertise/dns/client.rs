//! Sends one signed UPDATE to the user's authoritative server over TCP and says what came of
//! it. The thin I/O shell around [`super::wire`] and [`super::tsig`]: one connection per
//! message (updates are rare: changes, not traffic), bounded by a timeout.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::tsig::{self, Key, TsigError};
use super::wire::{self, rcode, Update, WireError};

/// Connecting, sending and reading the answer together.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// What the server did with an update it understood and answered with our key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// A prerequisite did not hold (YXRRSET, NXRRSET, YXDOMAIN, NXDOMAIN): nothing changed.
    Prerequisite(&'static str),
}

/// Why an update did not reach the zone.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("DNS server {server}: {source}")]
    Io {
        server: String,
        source: std::io::Error,
    },
    #[error("DNS server {0} did not answer within {TIMEOUT:?}")]
    Timeout(String),
    #[error("DNS server {server} refused the update: {rcode}")]
    Refused { server: String, rcode: &'static str },
    #[error("DNS server {server}: {source}")]
    Tsig { server: String, source: TsigError },
    #[error("DNS server {server}: {source}")]
    Wire { server: String, source: WireError },
}

/// An authoritative server and the key it takes updates with.
#[derive(Debug, Clone)]
pub struct Server {
    /// `host:port`, as the listener names it.
    pub address: String,
    pub key: Key,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Server {
    /// Sends `update` and reads the answer within [`TIMEOUT`].
    pub async fn send(&self, update: &Update) -> Result<Outcome, DnsError> {
        match tokio::time::timeout(TIMEOUT, self.exchange(update)).await {
            Ok(r) => r,
            Err(_) => Err(DnsError::Timeout(self.address.clone())),
        }
    }

    async fn exchange(&self, update: &Update) -> Result<Outcome, DnsError> {
        let server = || self.address.clone();
        let io = |source| DnsError::Io {
            server: server(),
            source,
        };
        let mut message = update.encode().map_err(|source| DnsError::Wire {
            server: server(),
            source,
        })?;
        let mac = tsig::sign(&mut message, &self.key, now());
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(&self.address)
            .await
            .map_err(io)?
            .collect();
        let first = addrs.first().ok_or_else(|| {
            io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the name has no address",
            ))
        })?;
        let mut tcp = TcpStream::connect(first).await.map_err(io)?;
        let mut framed = (message.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&message);
        tcp.write_all(&framed).await.map_err(io)?;
        let len = tcp.read_u16().await.map_err(io)? as usize;
        let mut answer = vec![0; len];
        tcp.read_exact(&mut answer).await.map_err(io)?;
        self.judge(&answer, update.id, &mac)
    }

    fn judge(&self, answer: &[u8], id: u16, mac: &[u8]) -> Result<Outcome, DnsError> {
        let wire_err = |source| DnsError::Wire {
            server: self.address.clone(),
            source,
        };
        let h = wire::header(answer).map_err(wire_err)?;
        if h.id != id || !h.is_response {
            return Err(wire_err(WireError::Malformed(
                "not the answer to our update",
            )));
        }
        tsig::verify(answer, &self.key, mac, now()).map_err(|source| DnsError::Tsig {
            server: self.address.clone(),
            source,
        })?;
        match h.rcode {
            rcode::NOERROR => Ok(Outcome::Applied),
            c @ (rcode::YXRRSET | rcode::NXRRSET | rcode::YXDOMAIN | rcode::NXDOMAIN) => {
                Ok(Outcome::Prerequisite(rcode::name(c)))
            }
            c => Err(DnsError::Refused {
                server: self.address.clone(),
                rcode: rcode::name(c),
            }),
        }
    }
}

//! Sends one signed UPDATE to the user's authoritative server over TCP and says what came of
//! it. The thin I/O shell around [`super::wire`] and [`super::tsig`]: one connection per
//! message (updates are rare: changes, not traffic), bounded by a timeout.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::tsig::{self, Key, TsigError};
use super::wire::{self, rcode, Name, Update, WireError, TYPE_SOA, TYPE_TXT};

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

/// Reads: the registry's TXT records and the zone's serial, over one TCP connection per
/// batch of questions (an authoritative server answers them in order).
pub struct Reader {
    address: String,
    tcp: TcpStream,
    next_id: u16,
}

impl Reader {
    async fn ask(&mut self, name: &Name, rtype: u16) -> Result<(Vec<u8>, u16), DnsError> {
        let address = self.address.clone();
        let io = |source| DnsError::Io {
            server: address.clone(),
            source,
        };
        self.next_id = self.next_id.wrapping_add(1);
        let q = wire::query(self.next_id, name, rtype);
        let mut framed = (q.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        self.tcp.write_all(&framed).await.map_err(io)?;
        let len = self.tcp.read_u16().await.map_err(io)? as usize;
        let mut answer = vec![0; len];
        self.tcp.read_exact(&mut answer).await.map_err(io)?;
        let h = wire::header(&answer).map_err(|source| DnsError::Wire {
            server: self.address.clone(),
            source,
        })?;
        if h.id != self.next_id {
            return Err(DnsError::Wire {
                server: self.address.clone(),
                source: WireError::Malformed("an answer to another question"),
            });
        }
        Ok((answer, h.rcode))
    }

    /// The records of `name TYPE` in the answer, as `(TTL, data)` (empty when there are
    /// none).
    pub async fn records(
        &mut self,
        name: &Name,
        rtype: u16,
    ) -> Result<Vec<(u32, Vec<u8>)>, DnsError> {
        let (answer, code) = self.ask(name, rtype).await?;
        if code != rcode::NOERROR && code != rcode::NXDOMAIN {
            return Err(DnsError::Refused {
                server: self.address.clone(),
                rcode: rcode::name(code),
            });
        }
        let records = wire::records(&answer).map_err(|source| DnsError::Wire {
            server: self.address.clone(),
            source,
        })?;
        Ok(records
            .iter()
            .filter(|r| r.section == 1 && r.rtype == rtype && &r.name == name)
            .map(|r| (r.ttl, answer[r.rdata.clone()].to_vec()))
            .collect())
    }

    /// The TXT strings at `name` (empty when there are none).
    pub async fn txt(&mut self, name: &Name) -> Result<Vec<String>, DnsError> {
        let records = self.records(name, TYPE_TXT).await?;
        records
            .iter()
            .map(|(_, data)| {
                wire::txt_text(data).map_err(|source| DnsError::Wire {
                    server: self.address.clone(),
                    source,
                })
            })
            .collect()
    }

    /// The serial of `zone`'s SOA.
    pub async fn serial(&mut self, zone: &Name) -> Result<u32, DnsError> {
        let (answer, code) = self.ask(zone, TYPE_SOA).await?;
        let wire_err = |source| DnsError::Wire {
            server: self.address.clone(),
            source,
        };
        if code != rcode::NOERROR {
            return Err(DnsError::Refused {
                server: self.address.clone(),
                rcode: rcode::name(code),
            });
        }
        let records = wire::records(&answer).map_err(wire_err)?;
        let soa = records
            .iter()
            .find(|r| r.section == 1 && r.rtype == TYPE_SOA)
            .ok_or(wire_err(WireError::Malformed("no SOA in the answer")))?;
        wire::soa_serial(&answer, soa.rdata.clone()).map_err(wire_err)
    }
}

async fn connect(address: &str) -> Result<TcpStream, DnsError> {
    let io = |source| DnsError::Io {
        server: address.to_string(),
        source,
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(address)
        .await
        .map_err(io)?
        .collect();
    let first = addrs.first().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the name has no address",
        ))
    })?;
    TcpStream::connect(first).await.map_err(io)
}

impl Server {
    /// A connection for reads, within [`TIMEOUT`].
    pub async fn reader(&self) -> Result<Reader, DnsError> {
        match tokio::time::timeout(TIMEOUT, connect(&self.address)).await {
            Ok(tcp) => Ok(Reader {
                address: self.address.clone(),
                tcp: tcp?,
                next_id: 0,
            }),
            Err(_) => Err(DnsError::Timeout(self.address.clone())),
        }
    }

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
        let mut tcp = connect(&self.address).await?;
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

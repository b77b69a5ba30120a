//! iperf-style bulk TCP transfer through the router: a sender thread in one namespace, a
//! receiver thread in the other, the receiver's byte count over its wall time is the figure.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::netns::{self, LabNames};
use super::topology;
use super::{Common, LabError};

#[derive(Args, Debug, Clone)]
pub struct ThroughputArgs {
    #[command(flatten)]
    pub common: Common,
    /// Seconds of sending.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Use the IPv6 addresses.
    #[arg(long)]
    pub ipv6: bool,
    /// Server sends, client receives (the download direction).
    #[arg(long)]
    pub reverse: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub bytes: u64,
    pub seconds: f64,
    pub mbit_per_s: f64,
    pub direction: &'static str,
    pub family: &'static str,
}

pub fn run(a: &ThroughputArgs) -> Result<(), LabError> {
    netns::require_root("lab throughput")?;
    let names = LabNames::new(&a.common.prefix)?;
    if super::router_pid(&names).is_none() {
        return Err(LabError::NotUp(names.prefix.clone()));
    }
    let r = measure(
        &names,
        Duration::from_secs_f64(a.seconds),
        a.ipv6,
        a.reverse,
    )?;
    println!(
        "{} {} through the router: {:.1} Mbit/s ({} bytes in {:.2} s)",
        r.direction, r.family, r.mbit_per_s, r.bytes, r.seconds
    );
    Ok(())
}

fn pump_out(mut s: TcpStream, dur: Duration) -> Result<(), LabError> {
    let buf = vec![0x5au8; 256 * 1024];
    let end = Instant::now() + dur;
    while Instant::now() < end {
        s.write_all(&buf)
            .map_err(|e| LabError::io("throughput send", e))?;
    }
    s.shutdown(Shutdown::Write)
        .map_err(|e| LabError::io("throughput shutdown", e))?;
    // Wait for the receiver to close, so all data is accounted for before we return.
    let mut sink = [0u8; 64];
    let _ = s.read(&mut sink);
    Ok(())
}

fn pump_in(mut s: TcpStream) -> Result<(u64, f64), LabError> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    let mut start = None;
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| LabError::io("throughput receive", e))?;
        if n == 0 {
            break;
        }
        start.get_or_insert_with(Instant::now);
        total += n as u64;
    }
    let secs = start.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
    Ok((total, secs))
}

/// One bulk transfer; `reverse` sends from the server namespace to the client namespace.
pub fn measure(
    names: &LabNames,
    dur: Duration,
    ipv6: bool,
    reverse: bool,
) -> Result<Throughput, LabError> {
    let server_ip = if ipv6 {
        IpAddr::V6(topology::SERVER_V6)
    } else {
        IpAddr::V4(topology::SERVER_V4)
    };
    let (tx, rx) = mpsc::channel::<u16>();
    let server = netns::spawn_in(&names.server_ns, move || {
        let l = TcpListener::bind(SocketAddr::new(server_ip, 0))
            .map_err(|e| LabError::io("throughput bind", e))?;
        let port = l
            .local_addr()
            .map_err(|e| LabError::io("local_addr", e))?
            .port();
        let _ = tx.send(port);
        let (s, _) = l
            .accept()
            .map_err(|e| LabError::io("throughput accept", e))?;
        if reverse {
            pump_out(s, dur)?;
            Ok(None)
        } else {
            pump_in(s).map(Some)
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| LabError::Failed("throughput server did not start".into()))?;
    let client = netns::spawn_in(&names.client_ns, move || {
        let s =
            TcpStream::connect_timeout(&SocketAddr::new(server_ip, port), Duration::from_secs(5))
                .map_err(|e| LabError::io("throughput connect", e))?;
        if reverse {
            pump_in(s).map(Some)
        } else {
            pump_out(s, dur)?;
            Ok(None)
        }
    });
    let join = |h: std::thread::JoinHandle<Result<Option<(u64, f64)>, LabError>>| {
        h.join()
            .map_err(|_| LabError::Failed("throughput thread panicked".into()))?
    };
    let c = join(client)?;
    let s = join(server)?;
    let (bytes, seconds) = c.or(s).unwrap_or((0, 0.0));
    Ok(Throughput {
        bytes,
        seconds,
        mbit_per_s: if seconds > 0.0 {
            bytes as f64 * 8.0 / seconds / 1e6
        } else {
            0.0
        },
        direction: if reverse {
            "server->client"
        } else {
            "client->server"
        },
        family: if ipv6 { "IPv6" } else { "IPv4" },
    })
}

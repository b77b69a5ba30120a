//! The kernel's UDP counters from /proc/net: host-wide receive/send buffer errors (snmp,
//! snmp6) and the drops of our own sockets (udp, udp6). Datagrams the kernel drops never reach
//! quinn, so these are the only place a full socket buffer shows up (docs/field-reports.md,
//! "002 64 KB / 208 KB brakes").
//!
//! Parsers are pure; the readers are the only code in the proxy that opens /proc/net. The
//! metrics export them at scrape time, `/status` reads them per request.

use std::sync::{Arc, Mutex};

/// Host-wide UDP counters of one family, from /proc/net/snmp or /proc/net/snmp6.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpHostCounters {
    pub receive_buffer_errors: u64,
    pub send_buffer_errors: u64,
    pub in_errors: u64,
}

/// Parses the `Udp:` header/value line pair of /proc/net/snmp.
pub fn parse_snmp(text: &str) -> Option<UdpHostCounters> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let values: Vec<&str> = lines.next()?.split_whitespace().collect();
    let get = |name: &str| -> Option<u64> {
        let i = header.iter().position(|h| *h == name)?;
        values.get(i)?.parse().ok()
    };
    Some(UdpHostCounters {
        receive_buffer_errors: get("RcvbufErrors")?,
        send_buffer_errors: get("SndbufErrors")?,
        in_errors: get("InErrors")?,
    })
}

/// Parses the `Udp6*` lines of /proc/net/snmp6.
pub fn parse_snmp6(text: &str) -> Option<UdpHostCounters> {
    let get = |name: &str| -> Option<u64> {
        text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next()? == name).then(|| it.next()?.parse().ok())?
        })
    };
    Some(UdpHostCounters {
        receive_buffer_errors: get("Udp6RcvbufErrors")?,
        send_buffer_errors: get("Udp6SndbufErrors")?,
        in_errors: get("Udp6InErrors")?,
    })
}

/// Drops of the socket with `inode` in /proc/net/udp or /proc/net/udp6 text.
pub fn parse_udp_socket_drops(text: &str, inode: u64) -> Option<u64> {
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
        if f.len() >= 13 && f[9].parse::<u64>().ok()? == inode {
            f[12].parse().ok()
        } else {
            None
        }
    })
}

/// `addr` as /proc/net/udp{,6} print a local address: the address as 32-bit words in host
/// byte order, in hex, then the port.
pub fn proc_address(addr: std::net::SocketAddr) -> String {
    let words = |b: &[u8]| {
        b.chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect::<String>()
    };
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) => words(&v4.octets()),
        std::net::IpAddr::V6(v6) => words(&v6.octets()),
    };
    format!("{ip}:{:04X}", addr.port())
}

/// How many sockets in /proc/net/udp or udp6 text are bound to exactly `local` (a
/// [`proc_address`]): the members of its SO_REUSEPORT group, ours and others'.
pub fn count_bound(text: &str, local: &str) -> usize {
    text.lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(1) == Some(local))
        .count()
}

/// The host-wide counters of each family, as the kernel has them now (`None` when its file
/// cannot be read or parsed).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostCounters {
    pub ipv4: Option<UdpHostCounters>,
    pub ipv6: Option<UdpHostCounters>,
}

impl HostCounters {
    pub fn read() -> Self {
        let read = |file: &str| std::fs::read_to_string(file).ok();
        HostCounters {
            ipv4: read("/proc/net/snmp").and_then(|t| parse_snmp(&t)),
            ipv6: read("/proc/net/snmp6").and_then(|t| parse_snmp6(&t)),
        }
    }
}

/// One read of /proc/net/udp and /proc/net/udp6, to look up several sockets in.
pub struct SocketTables {
    udp: String,
    udp6: String,
}

impl SocketTables {
    pub fn read() -> Self {
        Self {
            udp: std::fs::read_to_string("/proc/net/udp").unwrap_or_default(),
            udp6: std::fs::read_to_string("/proc/net/udp6").unwrap_or_default(),
        }
    }

    /// Sockets bound to exactly `addr` (its SO_REUSEPORT group's size).
    pub fn bound_to(&self, addr: std::net::SocketAddr) -> usize {
        let text = if addr.is_ipv6() {
            &self.udp6
        } else {
            &self.udp
        };
        count_bound(text, &proc_address(addr))
    }

    /// Drops of our socket with `inode` (an IPv6 one when `ipv6`), if the kernel lists it.
    pub fn drops(&self, ipv6: bool, inode: u64) -> Option<u64> {
        let text = if ipv6 { &self.udp6 } else { &self.udp };
        parse_udp_socket_drops(text, inode)
    }
}

/// Our sockets' inodes per family, filled in as they are bound.
pub type SocketInodes = Arc<Mutex<Vec<(&'static str, u64)>>>;

#[cfg(test)]
mod tests {
    use super::*;

    const SNMP: &str = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdp: 100 2 7 90 5 3 0 0 0\nUdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdpLite: 0 0 0 0 0 0 0 0 0\n";
    const SNMP6: &str = "Udp6InDatagrams                 \t10\nUdp6NoPorts                     \t0\nUdp6InErrors                    \t4\nUdp6OutDatagrams                \t9\nUdp6RcvbufErrors                \t2\nUdp6SndbufErrors                \t1\nUdpLite6InErrors 0\n";
    const UDP: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n  753: 00000000:01BB 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 424242 2 0000000000000000 17\n  754: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1111 2 0000000000000000 0\n";

    #[test]
    fn parses_proc_files() {
        assert_eq!(
            parse_snmp(SNMP),
            Some(UdpHostCounters {
                receive_buffer_errors: 5,
                send_buffer_errors: 3,
                in_errors: 7
            })
        );
        assert_eq!(
            parse_snmp6(SNMP6),
            Some(UdpHostCounters {
                receive_buffer_errors: 2,
                send_buffer_errors: 1,
                in_errors: 4
            })
        );
        assert_eq!(parse_udp_socket_drops(UDP, 424242), Some(17));
        assert_eq!(parse_udp_socket_drops(UDP, 1111), Some(0));
        assert_eq!(parse_udp_socket_drops(UDP, 9), None);
        assert_eq!(count_bound(UDP, "0100007F:0035"), 1);
        assert_eq!(count_bound(UDP, "00000000:01BB"), 1);
        assert_eq!(count_bound(UDP, "00000000:0035"), 0);
    }

    #[test]
    fn socket_tables_find_a_live_socket() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        use std::os::fd::AsRawFd;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap();
        // "socket:[INODE]"
        let inode: u64 = link
            .to_string_lossy()
            .trim_start_matches("socket:[")
            .trim_end_matches(']')
            .parse()
            .unwrap();
        assert_eq!(SocketTables::read().drops(false, inode), Some(0));
        assert_eq!(SocketTables::read().drops(true, inode), None);
        let host = HostCounters::read();
        assert!(host.ipv4.is_some(), "/proc/net/snmp has a Udp: line");
        let v6 = std::net::UdpSocket::bind("[::1]:0").unwrap();
        let (a4, a6) = (s.local_addr().unwrap(), v6.local_addr().unwrap());
        assert_eq!(SocketTables::read().bound_to(a4), 1);
        assert_eq!(SocketTables::read().bound_to(a6), 1);
    }
}

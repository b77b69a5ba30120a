//! UDP sockets: one per address family, never dual-stack, with DF and large buffers.
//!
//! A single `[::]` socket with `ipv6only=off` sends IPv4 datagrams without DF, so they get
//! fragmented and dropped (docs/field-reports.md, "000 dual-stack socket without DF"). We
//! therefore bind an AF_INET socket for IPv4 and an AF_INET6 socket with IPV6_V6ONLY=1 for
//! IPv6, set DF on both, and read every option back from the kernel so tests and metrics show
//! what is really in effect. Every socket is bound with SO_REUSEPORT, so the next generation
//! of the data plane on the host can share the port ([`crate::proxy::handover`]).

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use socket2::{Domain, Protocol, Socket, Type};

use crate::api::{SocketReport, RECOMMENDED_SYSCTL_BUFFER_MAX};
use crate::config::ListenConfig;

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("binding UDP {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("setting {option} on UDP {addr}: {source}")]
    Option {
        addr: SocketAddr,
        option: &'static str,
        source: io::Error,
    },
}

/// A bound socket plus what the kernel says about it.
#[derive(Debug)]
pub struct BoundSocket {
    pub socket: UdpSocket,
    pub family: &'static str,
    pub report: SocketReport,
    pub inode: u64,
    /// Why SO_RCVBUFFORCE/SO_SNDBUFFORCE were refused, when `forceBuffers` was asked for.
    pub force_refused: Option<String>,
}

/// Kernel options that matter for QUIC, read back with getsockopt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketOptions {
    pub v6only: Option<bool>,
    /// IP_MTU_DISCOVER (IPv4 socket): IP_PMTUDISC_DO (2) or IP_PMTUDISC_PROBE (3) set DF.
    pub ip_mtu_discover: Option<i32>,
    /// IPV6_MTU_DISCOVER (IPv6 socket).
    pub ipv6_mtu_discover: Option<i32>,
    /// IPV6_DONTFRAG (IPv6 socket).
    pub ipv6_dontfrag: Option<bool>,
    pub receive_buffer: usize,
    pub send_buffer: usize,
}

impl SocketOptions {
    /// True when every datagram leaves with "do not fragment": DF on IPv4, DONTFRAG on IPv6.
    pub fn df_set(&self) -> bool {
        let v4_df = |v: i32| v == libc::IP_PMTUDISC_DO || v == libc::IP_PMTUDISC_PROBE;
        match (self.ip_mtu_discover, self.ipv6_dontfrag) {
            (Some(v), None) => v4_df(v),
            (_, Some(dontfrag)) => {
                dontfrag
                    && self.ipv6_mtu_discover.is_some_and(|v| {
                        v == libc::IPV6_PMTUDISC_DO || v == libc::IPV6_PMTUDISC_PROBE
                    })
            }
            _ => false,
        }
    }
}

fn getsockopt_int(fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: fd is a live socket borrowed for the call; value/len point to valid memory of
    // the size we pass.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &mut value as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn setsockopt_int(fd: BorrowedFd<'_>, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: as above; the option value is a plain int.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads the QUIC-relevant options of a live socket.
pub fn read_options(fd: BorrowedFd<'_>, ipv6: bool) -> io::Result<SocketOptions> {
    let receive_buffer = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)? as usize;
    let send_buffer = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)? as usize;
    if ipv6 {
        Ok(SocketOptions {
            v6only: Some(getsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY)? != 0),
            ip_mtu_discover: None,
            ipv6_mtu_discover: Some(getsockopt_int(
                fd,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
            )?),
            ipv6_dontfrag: Some(getsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG)? != 0),
            receive_buffer,
            send_buffer,
        })
    } else {
        Ok(SocketOptions {
            v6only: None,
            ip_mtu_discover: Some(getsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER)?),
            ipv6_mtu_discover: None,
            ipv6_dontfrag: None,
            receive_buffer,
            send_buffer,
        })
    }
}

fn inode_of(fd: BorrowedFd<'_>) -> u64 {
    // SAFETY: fstat on a live fd into a zeroed stat struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) == 0 {
            st.st_ino
        } else {
            0
        }
    }
}

/// A new UDP socket bound to `addr` in the SO_REUSEPORT group of that address: IPv6-only for
/// IPv6 (set before the bind, the only option that must be). Every process generation sharing
/// the port adds its sockets this way ([`crate::proxy::handover`]); [`configure`] does the rest.
pub fn group_socket(addr: SocketAddr) -> Result<UdpSocket, SocketError> {
    let domain = if addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))
        .map_err(|source| SocketError::Bind { addr, source })?;
    if addr.is_ipv6() {
        socket
            .set_only_v6(true)
            .map_err(|source| SocketError::Option {
                addr,
                option: "IPV6_V6ONLY",
                source,
            })?;
    }
    socket
        .set_reuse_port(true)
        .map_err(|source| SocketError::Option {
            addr,
            option: "SO_REUSEPORT",
            source,
        })?;
    socket
        .bind(&addr.into())
        .map_err(|source| SocketError::Bind { addr, source })?;
    Ok(socket.into())
}

/// Binds one socket for `addr` with the options QUIC needs. Does not log; the caller decides.
pub fn bind(addr: SocketAddr, listen: &ListenConfig) -> Result<BoundSocket, SocketError> {
    configure(group_socket(addr)?, listen)
}

/// Sets the options QUIC needs on a bound socket this process will read (DF, buffers; again
/// on a socket another process created, whose settings may differ) and reads them back.
pub fn configure(socket: UdpSocket, listen: &ListenConfig) -> Result<BoundSocket, SocketError> {
    let addr = socket.local_addr().map_err(|source| SocketError::Bind {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let ipv6 = addr.is_ipv6();
    let opt_err = |option: &'static str| {
        move |source| SocketError::Option {
            addr,
            option,
            source,
        }
    };
    let socket = Socket::from(socket);
    if ipv6 {
        // DONTFRAG: never let the kernel fragment; PROBE: send at our size, ignore the kernel's
        // (ICMP-fed) PMTU cache, because QUIC does its own path-MTU discovery (RFC 8899).
        setsockopt_int(socket.as_fd(), libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1)
            .map_err(opt_err("IPV6_DONTFRAG"))?;
        setsockopt_int(
            socket.as_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_PROBE,
        )
        .map_err(opt_err("IPV6_MTU_DISCOVER"))?;
    } else {
        // DF on every IPv4 datagram (RFC 9000 section 14).
        setsockopt_int(
            socket.as_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_PROBE,
        )
        .map_err(opt_err("IP_MTU_DISCOVER"))?;
    }

    let mut force_refused = None;
    if listen.force_buffers {
        let rcv = setsockopt_int(
            socket.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            listen.receive_buffer_bytes as i32,
        );
        let snd = setsockopt_int(
            socket.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            listen.send_buffer_bytes as i32,
        );
        if let Some(e) = rcv.err().or(snd.err()) {
            force_refused = Some(format!(
                "SO_RCVBUFFORCE/SO_SNDBUFFORCE refused ({e}); they need CAP_NET_ADMIN"
            ));
        }
    }
    if !listen.force_buffers || force_refused.is_some() {
        socket
            .set_recv_buffer_size(listen.receive_buffer_bytes as usize)
            .map_err(opt_err("SO_RCVBUF"))?;
        socket
            .set_send_buffer_size(listen.send_buffer_bytes as usize)
            .map_err(opt_err("SO_SNDBUF"))?;
    }

    let socket: UdpSocket = socket.into();
    let local = addr;
    let opts = read_options(socket.as_fd(), ipv6).map_err(opt_err("getsockopt"))?;

    let gso_segments = quinn::udp::UdpSocketState::new(quinn::udp::UdpSockRef::from(&socket))
        .map(|s| s.max_gso_segments() as u64)
        .unwrap_or(1);
    // The kernel doubles the requested size for bookkeeping (socket(7)); anything below
    // double means it clamped the request at net.core.rmem_max/wmem_max.
    let rcv_req = listen.receive_buffer_bytes as u64;
    let snd_req = listen.send_buffer_bytes as u64;
    let clamped =
        (opts.receive_buffer as u64) < 2 * rcv_req || (opts.send_buffer as u64) < 2 * snd_req;
    let family = if ipv6 {
        crate::proxy::observe::metrics::FAMILY_IPV6
    } else {
        crate::proxy::observe::metrics::FAMILY_IPV4
    };
    let inode = inode_of(socket.as_fd());
    Ok(BoundSocket {
        report: SocketReport {
            family: family.to_string(),
            address: local.to_string(),
            bound: true,
            error: String::new(),
            receive_buffer_requested_bytes: rcv_req,
            receive_buffer_effective_bytes: opts.receive_buffer as u64,
            send_buffer_requested_bytes: snd_req,
            send_buffer_effective_bytes: opts.send_buffer as u64,
            clamped,
            gso_segments,
            drops: 0,
        },
        socket,
        family,
        inode,
        force_refused,
    })
}

/// The addresses to bind for a listen config: IPv4 first, then IPv6.
pub fn addresses(listen: &ListenConfig) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    if let Some(v4) = listen.ipv4 {
        out.push(SocketAddr::new(IpAddr::V4(v4), listen.port));
    }
    if let Some(v6) = listen.ipv6 {
        out.push(SocketAddr::new(IpAddr::V6(v6), listen.port));
    }
    out
}

/// The one warning a clamped buffer deserves: which sysctl, and what to set it to.
pub fn clamp_warning(r: &SocketReport) -> Option<String> {
    if !r.clamped {
        return None;
    }
    Some(format!(
        "UDP {} socket buffers clamped by the kernel: receive {} of {} requested, send {} of {} \
         (values read back are doubled by the kernel). Datagrams will be dropped under load \
         (docs/field-reports.md, \"002 64 KB / 208 KB brakes\"). Raise the limits: \
         sysctl -w net.core.rmem_max={max} net.core.wmem_max={max}, or set \
         socket.forceBuffers: true with CAP_NET_ADMIN",
        r.family,
        r.receive_buffer_effective_bytes / 2,
        r.receive_buffer_requested_bytes,
        r.send_buffer_effective_bytes / 2,
        r.send_buffer_requested_bytes,
        max = RECOMMENDED_SYSCTL_BUFFER_MAX,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn listen(rcv: u32) -> ListenConfig {
        ListenConfig {
            port: 0,
            ipv4: Some(Ipv4Addr::LOCALHOST),
            ipv6: Some(Ipv6Addr::LOCALHOST),
            receive_buffer_bytes: rcv,
            send_buffer_bytes: rcv,
            force_buffers: false,
        }
    }

    #[test]
    fn ipv4_socket_sets_df_and_reports_buffers() {
        let l = listen(131_072);
        let s = bind("127.0.0.1:0".parse().unwrap(), &l).unwrap();
        let o = read_options(s.socket.as_fd(), false).unwrap();
        assert_eq!(o.ip_mtu_discover, Some(libc::IP_PMTUDISC_PROBE));
        assert!(o.df_set());
        assert_eq!(
            s.report.receive_buffer_effective_bytes,
            o.receive_buffer as u64
        );
        assert_eq!(s.family, "ipv4");
        assert!(s.inode > 0);
    }

    #[test]
    fn ipv6_socket_is_v6only_with_dontfrag() {
        let l = listen(131_072);
        let s = bind("[::1]:0".parse().unwrap(), &l).unwrap();
        let o = read_options(s.socket.as_fd(), true).unwrap();
        assert_eq!(o.v6only, Some(true));
        assert_eq!(o.ipv6_dontfrag, Some(true));
        assert!(o.df_set());
        // An IPv4 client cannot reach a v6only socket through a mapped address.
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = s.socket.local_addr().unwrap().port();
        let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        // Sending succeeds or fails; what matters is the v6 socket never receives it.
        let _ = probe.send_to(b"x", v4);
        s.socket
            .set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let mut buf = [0u8; 8];
        assert!(s.socket.recv_from(&mut buf).is_err());
    }

    #[test]
    fn huge_request_is_reported_as_clamped_with_the_sysctl_named() {
        let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let want = (rmem_max + 1_000_000).min(1 << 30) as u32;
        let s = bind("127.0.0.1:0".parse().unwrap(), &listen(want)).unwrap();
        assert!(s.report.clamped, "{:?}", s.report);
        let w = clamp_warning(&s.report).unwrap();
        assert!(w.contains("net.core.rmem_max=7500000"), "{w}");
    }
}

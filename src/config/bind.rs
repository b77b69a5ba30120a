//! How an admin endpoint (metrics, health, `/status`; the data plane's and the operator's)
//! binds its TCP socket. The default address is `[::]`: one dual-stack socket that answers on
//! every IPv4 and IPv6 address, so the kubelet's probes reach it on a pod's IPv6 address as
//! well as on an IPv4 one. A host whose kernel has no IPv6 at all (booted with
//! `ipv6.disable=1`) refuses an AF_INET6 socket (`EAFNOSUPPORT`) or the address
//! (`EADDRNOTAVAIL`); then `0.0.0.0` is bound instead. Any other address is bound as given.
//!
//! (The QUIC sockets never use a dual-stack socket: IPv4 through an AF_INET6 socket cannot set
//! Don't Fragment. A TCP endpoint has no such problem.)

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// The admin port of the data plane and of the operator, on every address of both families.
pub fn any_address(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
}

/// The addresses to try for `addr`, in order: `[::]:p` and then `0.0.0.0:p` for the
/// unspecified IPv6 address, else `addr` alone.
pub fn candidates(addr: SocketAddr) -> Vec<SocketAddr> {
    match addr {
        SocketAddr::V6(v6) if v6.ip().is_unspecified() => {
            vec![addr, SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()))]
        }
        _ => vec![addr],
    }
}

/// Whether a failed bind means "this host has no IPv6", the only error the fallback covers: a
/// port already in use stays an error (IPv4 would be taken there too, or silently half-served).
pub fn means_no_ipv6(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL)
    )
}

/// Binds with `bind` at the first candidate of `addr` that works, trying the next one only
/// when the previous failed for want of IPv6. `bind` is a parameter so the fallback can be
/// tested on hosts that have IPv6.
pub fn bind_with<T>(
    addr: SocketAddr,
    mut bind: impl FnMut(SocketAddr) -> io::Result<T>,
) -> io::Result<(T, SocketAddr)> {
    let all = candidates(addr);
    let last = all.len() - 1;
    for (i, a) in all.into_iter().enumerate() {
        match bind(a) {
            Ok(t) => return Ok((t, a)),
            Err(e) if i < last && means_no_ipv6(&e) => {
                tracing::info!(address = %a, error = %e, "no IPv6 on this host; binding IPv4 only");
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("candidates() is never empty")
}

/// One listening TCP socket at exactly `addr` (dual-stack when it is `[::]`), non-blocking, for
/// `tokio::net::TcpListener::from_std`. `shared`: with SO_REUSEPORT, so a newer generation of
/// the data plane on the same host can bind it too when it gets no copy of this one.
pub fn listen_tcp(addr: SocketAddr, shared: bool) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    // A restarted process must not wait for TIME_WAIT connections of the last one.
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(shared)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Binds an admin endpoint at `addr` with the IPv4 fallback; returns the listener and the
/// address really bound.
pub fn bind_admin(addr: SocketAddr) -> io::Result<(std::net::TcpListener, SocketAddr)> {
    bind_with(addr, |a| listen_tcp(a, false))
}

/// [`bind_admin`] with SO_REUSEPORT (the data plane's, see [`listen_tcp`]).
pub fn bind_admin_shared(addr: SocketAddr) -> io::Result<(std::net::TcpListener, SocketAddr)> {
    bind_with(addr, |a| listen_tcp(a, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn err(code: i32) -> io::Error {
        io::Error::from_raw_os_error(code)
    }

    #[test]
    fn only_the_unspecified_ipv6_address_falls_back() {
        let any: SocketAddr = "[::]:9476".parse().unwrap();
        assert_eq!(any, any_address(9476));
        assert_eq!(
            candidates(any),
            [
                "[::]:9476".parse().unwrap(),
                "0.0.0.0:9476".parse().unwrap()
            ]
        );
        for exact in [
            "0.0.0.0:9476",
            "127.0.0.1:9476",
            "[::1]:9476",
            "[fd00::1]:9476",
        ] {
            let a: SocketAddr = exact.parse().unwrap();
            assert_eq!(candidates(a), [a], "{exact}");
        }
    }

    #[test]
    fn no_ipv6_falls_back_to_ipv4_and_other_errors_do_not() {
        let any = any_address(9476);
        for code in [libc::EAFNOSUPPORT, libc::EADDRNOTAVAIL] {
            let mut tried = Vec::new();
            let (t, at) = bind_with(any, |a| {
                tried.push(a);
                if a.is_ipv6() {
                    Err(err(code))
                } else {
                    Ok("v4 socket")
                }
            })
            .unwrap();
            assert_eq!((t, at.to_string().as_str()), ("v4 socket", "0.0.0.0:9476"));
            assert_eq!(tried.len(), 2);
        }
        let mut tried = 0;
        let e = bind_with(any, |_| -> io::Result<()> {
            tried += 1;
            Err(err(libc::EADDRINUSE))
        })
        .unwrap_err();
        assert_eq!((e.raw_os_error(), tried), (Some(libc::EADDRINUSE), 1));
        // An exact address has nothing to fall back to.
        let e = bind_with("[::1]:1".parse().unwrap(), |_| -> io::Result<()> {
            Err(err(libc::EADDRNOTAVAIL))
        })
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL));
    }

    fn roundtrip(listener: &std::net::TcpListener, to: SocketAddr) {
        let mut c = std::net::TcpStream::connect(to).unwrap();
        c.write_all(b"ping").unwrap();
        listener.set_nonblocking(false).unwrap();
        let (mut s, peer) = listener.accept().unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        assert_eq!(peer.ip().to_canonical(), to.ip(), "{peer}");
    }

    #[test]
    fn the_default_socket_answers_on_ipv4_and_ipv6() {
        let (l, at) = bind_admin(any_address(0)).unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(at.is_ipv6(), "this host has IPv6; {at}");
        roundtrip(&l, SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
        roundtrip(&l, SocketAddr::from((Ipv6Addr::LOCALHOST, port)));
    }
}

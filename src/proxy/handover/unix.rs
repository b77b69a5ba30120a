//! The I/O of the hand-over: abstract `SOCK_SEQPACKET` unix sockets (one message per
//! datagram, EOF when the peer process dies), messages with file descriptors attached
//! (`SCM_RIGHTS`), and the peer's credentials (`SO_PEERCRED`).
//!
//! Abstract names live in the network namespace, not the file system: every process on the
//! host's network (two hostNetwork pods, or two `proxy --config` runs) sees the same name, and
//! the kernel frees it when the listening socket closes, so a killed process leaves nothing
//! stale behind.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use socket2::{Domain, MaybeUninitSlice, MsgHdr, MsgHdrMut, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The largest message we send or accept (the biggest, a Welcome, is well under 2 KiB).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;
/// The most descriptors one message carries: every slot socket of both families and the
/// admin listener, with room to spare.
pub const MAX_FDS: usize = 32;

/// The abstract address of `name`: a leading NUL, no terminating one.
fn address(name: &str) -> io::Result<SockAddr> {
    use std::os::unix::ffi::OsStrExt;
    let mut bytes = vec![0u8];
    bytes.extend_from_slice(name.as_bytes());
    SockAddr::unix(std::ffi::OsStr::from_bytes(&bytes))
}

fn register(s: Socket) -> io::Result<AsyncFd<Socket>> {
    // SAFETY: a `Socket` owns its descriptor and returns that same one for its whole life,
    // which the AsyncFd (its owner from now on) outlives never.
    unsafe { AsyncFd::register(s) }.map_err(|e| e.into_parts().1)
}

fn seqpacket() -> io::Result<Socket> {
    let s = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// A listening abstract socket.
pub struct Listener(AsyncFd<Socket>);

impl Listener {
    /// Binds and listens on the abstract `name`; `AddrInUse` when another process holds it.
    pub fn bind(name: &str) -> io::Result<Listener> {
        let s = seqpacket()?;
        s.bind(&address(name)?)?;
        s.listen(16)?;
        Ok(Listener(register(s)?))
    }

    pub async fn accept(&self) -> io::Result<Conn> {
        loop {
            let mut guard = self.0.readable().await?;
            match guard.try_io(|s| s.get_ref().accept()) {
                Ok(Ok((s, _))) => {
                    s.set_nonblocking(true)?;
                    return Ok(Conn(register(s)?));
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

/// One end of a connection between two processes.
pub struct Conn(AsyncFd<Socket>);

/// The outcome of one connection attempt.
pub enum Connected {
    Yes(Conn),
    /// Nobody listens on the name.
    NoListener,
}

impl Conn {
    /// Connects to the abstract `name`, retrying a full backlog until `timeout`.
    pub async fn connect(name: &str, timeout: Duration) -> io::Result<Connected> {
        let addr = address(name)?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let s = seqpacket()?;
            match s.connect(&addr) {
                Ok(()) => return Ok(Connected::Yes(Conn(register(s)?))),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOENT)) => {
                    return Ok(Connected::NoListener)
                }
                // A listener whose backlog is full answers EAGAIN on a non-blocking connect.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "backlog full"));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Ends the connection for both sides now, whoever else holds this end.
    pub fn shutdown(&self) {
        let _ = self.0.get_ref().shutdown(std::net::Shutdown::Both);
    }

    /// The uid of the process at the other end.
    pub fn peer_uid(&self) -> io::Result<u32> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: a live socket; cred/len point to a ucred of the size we pass.
        let rc = unsafe {
            libc::getsockopt(
                self.0.get_ref().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                &mut cred as *mut libc::ucred as *mut libc::c_void,
                &mut len,
            )
        };
        if rc == 0 {
            Ok(cred.uid)
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Sends one message with `fds` attached.
    pub async fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if bytes.len() > MAX_MESSAGE_BYTES || fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "message too big",
            ));
        }
        let control = rights(fds);
        let bufs = [IoSlice::new(bytes)];
        loop {
            let mut guard = self.0.ready(Interest::WRITABLE).await?;
            let r = guard.try_io(|s| {
                let mut msg = MsgHdr::new().with_buffers(&bufs);
                if !fds.is_empty() {
                    msg = msg.with_control(&control);
                }
                s.get_ref().sendmsg(&msg, libc::MSG_NOSIGNAL)
            });
            match r {
                Ok(Ok(n)) if n == bytes.len() => return Ok(()),
                Ok(Ok(_)) => return Err(io::Error::new(io::ErrorKind::WriteZero, "short send")),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// The next message and its descriptors; `None` when the peer closed the connection.
    pub async fn recv(&self) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); MAX_MESSAGE_BYTES];
        let space = cmsg_space(MAX_FDS);
        let mut control = vec![std::mem::MaybeUninit::<u8>::uninit(); space];
        loop {
            let mut guard = self.0.readable().await?;
            let r = guard.try_io(|s| {
                let mut bufs = [MaybeUninitSlice::new(&mut buf)];
                let mut msg = MsgHdrMut::new()
                    .with_buffers(&mut bufs)
                    .with_control(&mut control);
                let n = s.get_ref().recvmsg(&mut msg, libc::MSG_CMSG_CLOEXEC)?;
                let truncated = msg.flags().is_truncated();
                Ok((n, msg.control_len(), truncated))
            });
            let (n, control_len, truncated) = match r {
                Ok(r) => r?,
                Err(_would_block) => continue,
            };
            // SAFETY: the kernel initialised the first `control_len` bytes of `control`.
            let control: &[u8] =
                unsafe { std::slice::from_raw_parts(control.as_ptr() as *const u8, control_len) };
            let fds = received_fds(control);
            if n == 0 && fds.is_empty() {
                return Ok(None);
            }
            if truncated {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "message truncated",
                ));
            }
            // SAFETY: recvmsg initialised the first `n` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, n) };
            return Ok(Some((bytes.to_vec(), fds)));
        }
    }
}

fn cmsg_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE((fds * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// The control bytes of one SCM_RIGHTS message carrying `fds`.
fn rights(fds: &[BorrowedFd<'_>]) -> Vec<u8> {
    if fds.is_empty() {
        return Vec::new();
    }
    let data = std::mem::size_of_val(fds);
    let mut buf = vec![0u8; cmsg_space(fds.len())];
    // SAFETY: `buf` is CMSG_SPACE(data) zeroed bytes, so the first header and its data fit;
    // the msghdr only serves the CMSG_* macros to find them.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_control = buf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = buf.len() as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(data as u32) as _;
        let p = libc::CMSG_DATA(c) as *mut RawFd;
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(p.add(i), fd.as_raw_fd());
        }
    }
    buf
}

/// The descriptors in received control bytes, owned (closed if the caller drops them).
fn received_fds(control: &[u8]) -> Vec<OwnedFd> {
    let mut out = Vec::new();
    if control.is_empty() {
        return out;
    }
    // SAFETY: `control` holds what recvmsg wrote; the CMSG_* macros stay within
    // msg_controllen, and every SCM_RIGHTS descriptor is a new one this process owns.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_control = control.as_ptr() as *mut libc::c_void;
        msg.msg_controllen = control.len() as _;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let p = libc::CMSG_DATA(c) as *const RawFd;
                for i in 0..data / std::mem::size_of::<RawFd>() {
                    out.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(p.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    out
}

/// The inode of a descriptor (to recognise one socket received twice).
pub fn inode(fd: BorrowedFd<'_>) -> u64 {
    // SAFETY: fstat on a live fd into a zeroed stat.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) == 0 {
            st.st_ino
        } else {
            0
        }
    }
}

/// This process's uid.
pub fn own_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// A duplicate of `fd` (close-on-exec).
pub fn dup(fd: &impl AsFd) -> io::Result<OwnedFd> {
    fd.as_fd().try_clone_to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_carry_descriptors_and_eof_follows_the_peer() {
        let name = format!("h3-ingress-test/unix/{}", std::process::id());
        let listener = Listener::bind(&name).unwrap();
        assert_eq!(
            Listener::bind(&name).err().map(|e| e.kind()),
            Some(io::ErrorKind::AddrInUse)
        );
        let Connected::Yes(client) = Conn::connect(&name, Duration::from_secs(1)).await.unwrap()
        else {
            panic!("listener not found")
        };
        let server = listener.accept().await.unwrap();
        assert_eq!(server.peer_uid().unwrap(), own_uid());
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let want = inode(udp.as_fd());
        client
            .send(b"hello", &[udp.as_fd(), udp.as_fd()])
            .await
            .unwrap();
        let (bytes, fds) = server.recv().await.unwrap().unwrap();
        assert_eq!(bytes, b"hello");
        assert_eq!(fds.len(), 2);
        assert!(fds.iter().all(|f| inode(f.as_fd()) == want));
        server.send(b"no fds", &[]).await.unwrap();
        assert_eq!(client.recv().await.unwrap().unwrap().0, b"no fds");
        drop(client);
        assert!(server.recv().await.unwrap().is_none());
        drop(listener);
        assert!(matches!(
            Conn::connect(&name, Duration::from_secs(1)).await.unwrap(),
            Connected::NoListener
        ));
    }
}

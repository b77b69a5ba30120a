//! A TUN device (IFF_TUN | IFF_NO_PI): one read or write moves exactly one IP packet.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

// <linux/if_tun.h>: _IOW('T', 202, int)
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// `struct ifreq` with the flags member of its union; 40 bytes on Linux.
#[repr(C)]
struct IfReqFlags {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

pub struct Tun {
    fd: OwnedFd,
    pub name: String,
}

impl Tun {
    /// Creates a non-persistent TUN device; it disappears when the router's descriptor closes,
    /// even after it was moved into another network namespace.
    pub fn create(name: &str) -> io::Result<Tun> {
        if name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name {name:?} is longer than 15 bytes"),
            ));
        }
        let path = CString::new("/dev/net/tun").expect("static path has no NUL");
        // SAFETY: plain open(2) of a NUL-terminated path; the result is checked.
        let raw = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a freshly opened descriptor we own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = IfReqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TUN | IFF_NO_PI,
            _pad: [0; 22],
        };
        for (d, s) in req.name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `req` lays out exactly.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Tun {
            fd,
            name: name.to_string(),
        })
    }

    /// Reads one packet into the spare capacity of `buf` (whose length is set to the packet).
    /// `WouldBlock` when no packet is waiting.
    pub fn read_into(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        buf.clear();
        let cap = buf.capacity();
        // SAFETY: reading at most `cap` bytes into the vector's allocation, then setting the
        // length to what the kernel wrote.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), cap) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel initialised exactly `n <= cap` bytes.
        unsafe { buf.set_len(n as usize) };
        Ok(n as usize)
    }

    pub fn write(&self, pkt: &[u8]) -> io::Result<()> {
        // SAFETY: write(2) of an initialised slice.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), pkt.as_ptr().cast(), pkt.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

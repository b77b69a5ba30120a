//! The long-running router process: two TUN devices, one thread, a poll loop around the
//! pure [`Emulator`]. One thread on purpose: the machine has two cores and the endpoints
//! (servers, clients, kernel TCP) need the other one.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::control::{Reply, Request};
use super::emu::{Dir, EmuConfig, Emulator, Out};
use super::netns::{self, LabNames};
use super::topology::{self, TUN_MTU};
use super::tun::Tun;
use super::LabError;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with a handler that only stores to an atomic; no
        // SA_RESTART so ppoll returns EINTR and the loop sees STOP promptly.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Packets read from one device per loop turn, so one busy direction cannot starve the other.
const READ_BATCH: usize = 64;

pub fn run(names: &LabNames, cfg: EmuConfig) -> Result<(), LabError> {
    netns::require_root("lab router")?;
    std::fs::create_dir_all(&names.state_dir)
        .map_err(|e| LabError::io(format!("create {}", names.state_dir.display()), e))?;
    netns::ensure_ns(&names.client_ns)?;
    netns::ensure_ns(&names.server_ns)?;

    let tun_c = Tun::create(&names.client_tun)
        .map_err(|e| LabError::io(format!("create TUN {}", names.client_tun), e))?;
    let tun_s = Tun::create(&names.server_tun)
        .map_err(|e| LabError::io(format!("create TUN {}", names.server_tun), e))?;
    netns::wire_tun(
        &tun_c.name,
        &names.client_ns,
        IpAddr::V4(topology::CLIENT_V4),
        topology::PREFIX_V4,
        IpAddr::V6(topology::CLIENT_V6),
        topology::PREFIX_V6,
        TUN_MTU,
    )?;
    netns::wire_tun(
        &tun_s.name,
        &names.server_ns,
        IpAddr::V4(topology::SERVER_V4),
        topology::PREFIX_V4,
        IpAddr::V6(topology::SERVER_V6),
        topology::PREFIX_V6,
        TUN_MTU,
    )?;

    let sock_path = names.control_socket();
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path)
        .map_err(|e| LabError::io(format!("bind {}", sock_path.display()), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| LabError::io("control socket", e))?;
    std::fs::write(names.pid_file(), std::process::id().to_string())
        .map_err(|e| LabError::io("write pid file", e))?;
    install_signal_handlers();
    // Timer slack: the default 50 us would blur sub-millisecond release times.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };

    eprintln!(
        "router up: {} <-> {}, config {}",
        names.client_ns,
        names.server_ns,
        serde_json::to_string(&cfg).unwrap_or_default()
    );
    let result = event_loop(&tun_c, &tun_s, &listener, Emulator::new(cfg));
    let _ = std::fs::remove_file(&sock_path);
    let _ = std::fs::remove_file(names.pid_file());
    eprintln!("router stopped");
    result
}

fn write_out(tun_c: &Tun, tun_s: &Tun, emu: &mut Emulator, (dir, buf): Out) {
    let dev = match dir {
        Dir::C2S => tun_s,
        Dir::S2C => tun_c,
    };
    if dev.write(&buf).is_err() {
        emu.note_write_error(dir);
    }
    emu.recycle(buf);
}

fn event_loop(
    tun_c: &Tun,
    tun_s: &Tun,
    listener: &UnixListener,
    mut emu: Emulator,
) -> Result<(), LabError> {
    let base = Instant::now();
    let now_ns = || base.elapsed().as_nanos() as u64;
    let mut immediate: Vec<Out> = Vec::new();
    let mut fds = [
        libc::pollfd {
            fd: tun_c.raw(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: tun_s.raw(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    while !STOP.load(Ordering::SeqCst) {
        let now = now_ns();
        while let Some(out) = emu.pop_due(now) {
            write_out(tun_c, tun_s, &mut emu, out);
        }
        let wait_ns = emu
            .next_release()
            .map(|t| t.saturating_sub(now_ns()))
            .unwrap_or(1_000_000_000)
            .min(1_000_000_000);
        let ts = libc::timespec {
            tv_sec: (wait_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (wait_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: ppoll on a valid array of pollfd with a timeout; no signal mask change.
        let rc = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(LabError::io("ppoll", e));
        }
        if rc == 0 {
            continue;
        }
        let now = now_ns();
        for (i, (dev, dir)) in [(tun_c, Dir::C2S), (tun_s, Dir::S2C)]
            .into_iter()
            .enumerate()
        {
            if fds[i].revents & libc::POLLIN == 0 {
                continue;
            }
            for _ in 0..READ_BATCH {
                let mut buf = emu.take_buf();
                match dev.read_into(&mut buf) {
                    Ok(_) => emu.ingress(now, dir, buf, &mut immediate),
                    Err(e) => {
                        emu.recycle(buf);
                        if e.kind() == ErrorKind::WouldBlock {
                            break;
                        }
                        return Err(LabError::io(format!("read {}", dev.name), e));
                    }
                }
                for out in immediate.drain(..) {
                    write_out(tun_c, tun_s, &mut emu, out);
                }
            }
        }
        if fds[2].revents & libc::POLLIN != 0 {
            if let Ok((stream, _)) = listener.accept() {
                if handle_control(stream, &mut emu, base) {
                    STOP.store(true, Ordering::SeqCst);
                }
            }
        }
    }
    Ok(())
}

/// Serves one control request; returns true when the router should stop.
fn handle_control(stream: UnixStream, emu: &mut Emulator, base: Instant) -> bool {
    // Our own CLI writes its request at once; a slow peer must not stall packet forwarding.
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut line = String::new();
    let mut reader = BufReader::new(&stream);
    let _ = reader.read_line(&mut line);
    let mut reply = Reply {
        ok: true,
        error: None,
        counters: None,
        config: None,
        uptime_ms: base.elapsed().as_millis() as u64,
        queued: emu.queued() as u64,
        pid: std::process::id(),
    };
    let mut stop = false;
    match serde_json::from_str::<Request>(line.trim()) {
        Ok(Request::Ping) => {}
        Ok(Request::Counters) => {
            reply.counters = Some(emu.counters().clone());
            reply.config = Some(emu.config().clone());
        }
        Ok(Request::Reset) => {
            reply.counters = Some(emu.counters().clone());
            emu.reset_counters();
        }
        Ok(Request::Get) => reply.config = Some(emu.config().clone()),
        Ok(Request::Set { config }) => {
            emu.set_config(config);
            reply.config = Some(emu.config().clone());
        }
        Ok(Request::Quit) => stop = true,
        Err(e) => {
            reply.ok = false;
            reply.error = Some(format!("bad request: {e}"));
        }
    }
    if let Ok(mut text) = serde_json::to_string(&reply) {
        text.push('\n');
        let _ = (&stream).write_all(text.as_bytes());
    }
    stop
}

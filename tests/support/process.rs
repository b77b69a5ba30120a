//! Child daemons (nginx, caddy) that must never outlive the test that started them.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use super::error::{IoContext, Result};

/// A spawned server process. Drop stops it: SIGTERM (both nginx and caddy shut down
/// cleanly on it, and nginx's master then reaps its workers), then SIGKILL for the
/// whole process tree if it has not exited after the grace period.
pub struct Daemon {
    name: String,
    child: Child,
    exit: Option<ExitStatus>,
}

/// How long a daemon gets to exit after SIGTERM before it and its children are killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

impl Daemon {
    /// Spawns `cmd`. The child gets PR_SET_PDEATHSIG=SIGTERM so that a test binary that
    /// is killed outright (SIGKILL, timeout) does not leave servers holding ports.
    ///
    /// Linux delivers the death signal when the *thread* that spawned the child exits,
    /// so create fixtures on the test's own thread (the body of `#[test]` or of a
    /// `#[tokio::test]`), never inside `spawn_blocking` or a short-lived thread.
    pub fn spawn(name: &str, mut cmd: Command) -> Result<Daemon> {
        // SAFETY: the closure runs between fork and exec and only calls prctl(2), which
        // is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().ctx(|| format!("spawning {name}: {cmd:?}"))?;
        Ok(Daemon {
            name: name.to_string(),
            child,
            exit: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The exit status if the process has exited, without blocking.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Sends `signal` to the main process (e.g. SIGHUP for an nginx reload).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// Stops the process and everything it forked; idempotent.
    pub fn stop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        // Collected before signalling: once the main process dies its children are
        // re-parented and can no longer be found through it.
        let tree = descendants(self.child.id());
        self.signal(libc::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < STOP_GRACE {
            if self.exited().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.exited().is_none() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
        for proc_id in tree {
            // A worker still alive after its master is gone is ours to kill; the start
            // time check makes sure the pid was not reused by an unrelated process.
            if proc_id.still_running() {
                // SAFETY: kill(2) on a pid verified to be the process we recorded.
                unsafe {
                    libc::kill(proc_id.pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A process identity that survives pid reuse: pid plus kernel start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcId {
    pub pid: u32,
    start_ticks: u64,
}

impl ProcId {
    pub fn still_running(&self) -> bool {
        read_stat(self.pid).is_some_and(|(_, start)| start == self.start_ticks)
    }
}

/// (ppid, starttime) of `pid` from /proc/<pid>/stat.
fn read_stat(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is parenthesised and may contain spaces; fields resume after the
    // last ')' with field 3 (state), so ppid (field 4) is index 1 and starttime
    // (field 22) index 19.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// All transitive children of `root`, from /proc.
pub fn descendants(root: u32) -> Vec<ProcId> {
    let mut children: HashMap<u32, Vec<ProcId>> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, start_ticks)) = read_stat(pid) {
            children
                .entry(ppid)
                .or_default()
                .push(ProcId { pid, start_ticks });
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        if let Some(kids) = children.get(&p) {
            for k in kids {
                out.push(*k);
                stack.push(k.pid);
            }
        }
    }
    out
}

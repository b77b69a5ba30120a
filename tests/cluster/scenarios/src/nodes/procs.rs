//! A container's process as the kernel sees it: capabilities, no-new-privileges, seccomp and
//! uid from `/proc/PID/status`, its root filesystem through `/proc/PID/root`.

use h3i_scenarios::{fail, ok, Result};

/// A field of `/proc/PID/status` (`CapEff`, `Uid`, ...): its first word.
pub fn status_field(status: &str, name: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.split_whitespace().next())
        .map(String::from)
}

/// A hexadecimal capability set of `/proc/PID/status`.
pub fn caps(status: &str, name: &str) -> u64 {
    status_field(status, name)
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(u64::MAX)
}

pub fn read_status(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default()
}

/// CapEff, CapPrm and CapBnd exactly `want`, no new privileges, a seccomp filter.
pub fn caps_check(pid: u32, want: u64, who: &str) -> Result<()> {
    let st = read_status(pid);
    let (eff, prm, bnd) = (
        caps(&st, "CapEff"),
        caps(&st, "CapPrm"),
        caps(&st, "CapBnd"),
    );
    let f = |n: &str| status_field(&st, n).unwrap_or_default();
    let (nnp, sec, uid) = (f("NoNewPrivs"), f("Seccomp"), f("Uid"));
    if eff != want || prm != want || bnd != want {
        return fail(format!(
            "{who} (pid {pid}): CapEff {eff} CapPrm {prm} CapBnd {bnd}, want {want}"
        ));
    }
    if nnp != "1" || sec != "2" {
        return fail(format!(
            "{who} (pid {pid}): NoNewPrivs {nnp} Seccomp {sec}, want 1 and 2 (filter)"
        ));
    }
    ok(format!(
        "{who} (pid {pid}, uid {uid}): CapEff=CapPrm=CapBnd=0x{eff:04x}, NoNewPrivs 1, Seccomp 2 (filter)"
    ));
    Ok(())
}

/// The container's `/` refuses a write (EROFS); with `tmp`, its `/tmp` (an emptyDir) takes one.
pub fn rootfs_check(pid: u32, who: &str, tmp: bool) -> Result<()> {
    let root = format!("/proc/{pid}/root");
    match std::fs::write(format!("{root}/h3i-write-test"), b"") {
        Ok(()) => return fail(format!("{who}: wrote to its root filesystem")),
        Err(e) if e.raw_os_error() == Some(30) => {} // EROFS
        Err(e) => {
            return fail(format!(
                "{who}: writing to / failed, but not as read-only: {e}"
            ))
        }
    }
    let mut tmp_ok = "";
    if tmp {
        let f = format!("{root}/tmp/h3i-write-test");
        if let Err(e) = std::fs::write(&f, b"") {
            return fail(format!("{who}: /tmp is not writable: {e}"));
        }
        let _ = std::fs::remove_file(&f);
        tmp_ok = ", /tmp writable";
    }
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let mount = root_mount(&mountinfo);
    ok(format!(
        "{who}: / is read-only (EROFS){tmp_ok}; mount: {mount}"
    ));
    Ok(())
}

/// The root and options fields of the mount at `/` in a mountinfo text.
fn root_mount(mountinfo: &str) -> String {
    mountinfo
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/"))
        .map(|f| format!("{} {}", f[3], f.get(5).unwrap_or(&"")))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_fields() {
        let st = "Name:\th3-ingress\nUid:\t65532\t65532\t65532\t65532\nNoNewPrivs:\t1\nSeccomp:\t2\n\
                  CapPrm:\t0000000000000400\nCapEff:\t0000000000000400\nCapBnd:\t0000000000001400\n";
        assert_eq!(status_field(st, "Uid").as_deref(), Some("65532"));
        assert_eq!(caps(st, "CapEff"), CAP);
        assert_eq!(caps(st, "CapBnd"), CAP | (1 << 12));
        assert_eq!(caps(st, "CapAmb"), u64::MAX);
        assert_eq!(status_field(st, "Seccomp").as_deref(), Some("2"));
        // `Seccomp_filters:` is another field, not `Seccomp:`.
        assert_eq!(status_field("Seccomp_filters:\t1\n", "Seccomp"), None);
    }

    const CAP: u64 = 1 << 10;

    #[test]
    fn finds_the_root_mount() {
        let mi = "1 0 0:30 / / ro,relatime - overlay overlay rw\n2 1 0:31 / /tmp rw - tmpfs t rw\n";
        assert_eq!(root_mount(mi), "/ ro,relatime");
        assert_eq!(root_mount(""), "");
    }
}

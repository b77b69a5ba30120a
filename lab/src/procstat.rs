//! Process CPU time from `/proc`: what E1 charges to a server (utime + stime of the process
//! and its descendants, so nginx's workers count for their master), independent of whatever
//! else runs on the machine.

use std::collections::HashMap;

use crate::LabError;

/// (pid, ppid, utime + stime in clock ticks) from the text of `/proc/PID/stat`. The command
/// name sits in parentheses and may itself contain spaces and parentheses, so the fields are
/// counted from the last `)`. Pure.
pub fn parse_stat(text: &str) -> Option<(u32, u32, u64)> {
    let pid = text.split_whitespace().next()?.parse().ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: state(3) ppid(4) ... utime(14) stime(15), 1-based as in proc(5).
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ppid = f.get(1)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((pid, ppid, utime + stime))
}

/// The CPU ticks of `root` and of every descendant, from a list of `parse_stat` results. Pure.
pub fn tree_ticks(procs: &[(u32, u32, u64)], root: u32) -> Option<u64> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut ticks: HashMap<u32, u64> = HashMap::new();
    for &(pid, ppid, t) in procs {
        children.entry(ppid).or_default().push(pid);
        ticks.insert(pid, t);
    }
    let mut total = *ticks.get(&root)?;
    let mut todo = children.get(&root).cloned().unwrap_or_default();
    while let Some(p) = todo.pop() {
        total += ticks.get(&p).copied().unwrap_or(0);
        todo.extend(children.get(&p).cloned().unwrap_or_default());
    }
    Some(total)
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// CPU seconds (user + system) of process `pid` and its descendants so far.
pub fn tree_cpu_seconds(pid: u32) -> Result<f64, LabError> {
    let dir = std::fs::read_dir("/proc").map_err(|e| LabError::io("read /proc", e))?;
    let procs: Vec<(u32, u32, u64)> = dir
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|t| parse_stat(&t))
        .collect();
    let ticks = tree_ticks(&procs, pid)
        .ok_or_else(|| LabError::Failed(format!("process {pid} is gone (no /proc/{pid}/stat)")))?;
    Ok(ticks as f64 / clock_ticks_per_s())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let t = "4242 (nginx: worker (x) y) S 4241 4241 1 0 -1 4194624 100 0 0 0 250 75 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat(t), Some((4242, 4241, 325)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_tree_sums_every_descendant_and_nothing_else() {
        let procs = [
            (1, 0, 5),
            (10, 1, 2),
            (11, 10, 30),
            (12, 10, 40),
            (13, 11, 1),
            (20, 1, 99),
        ];
        assert_eq!(tree_ticks(&procs, 10), Some(2 + 30 + 40 + 1));
        assert_eq!(tree_ticks(&procs, 12), Some(40));
        assert_eq!(tree_ticks(&procs, 7), None);
    }
}

//! Reading `busybox nslookup`'s output as the DNS check's clients print it: blocks headed
//! `=== NAME`, each with the server's `Address:` line and one `Name:` line per answer followed
//! by its `Address:` line.

/// The answers printed in `=== block`'s block of `log`, sorted: the `Address:` lines that
/// follow a `Name:` line (the server's own address follows `Server:`, and an answer's address
/// may end in `:53` as the server's does).
pub fn answers(log: &str, block: &str) -> Vec<String> {
    let head = format!("=== {block}");
    let (mut on, mut named) = (false, false);
    let mut out = Vec::new();
    for line in log.lines() {
        let line = line.trim_end();
        if line.starts_with("===") {
            on = line == head;
            named = false;
        } else if line.starts_with("Name:") {
            named = true;
        } else if let Some(addr) = line.strip_prefix("Address:") {
            if on && named {
                out.push(addr.trim().to_string());
            }
            named = false;
        }
    }
    sorted(out)
}

pub fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "search dns-check.svc.cluster.local svc.cluster.local cluster.local\n\
nameserver 10.96.0.10\noptions ndots:5\n===\n\
=== kubernetes.default.svc.cluster.local\nServer:\t\t10.96.0.10\nAddress:\t10.96.0.10:53\n\n\
Name:\tkubernetes.default.svc.cluster.local\nAddress: 10.96.0.1\n\n\
=== probe\nServer:\t\t10.96.0.10\nAddress:\t10.96.0.10:53\n\n\
Name:\tprobe.dns-check.svc.cluster.local\nAddress: fd77:96::53\n\n\
Name:\tprobe.dns-check.svc.cluster.local\nAddress: 10.96.140.31\n\n\
=== via fd77:96::a\nServer:\t\tfd77:96::a\nAddress:\t[fd77:96::a]:53\n\n\
Name:\tkubernetes.default.svc.cluster.local\nAddress: 10.96.0.1\n\
=== broken\nServer:\t\t10.96.0.10\nAddress:\t10.96.0.10#53\n\n** server can't find broken: NXDOMAIN\nLOOKUP-FAILED\n";

    #[test]
    fn each_block_gives_its_answers_without_the_servers_address() {
        assert_eq!(
            answers(LOG, "kubernetes.default.svc.cluster.local"),
            ["10.96.0.1"]
        );
        assert_eq!(answers(LOG, "probe"), ["10.96.140.31", "fd77:96::53"]);
        assert_eq!(answers(LOG, "via fd77:96::a"), ["10.96.0.1"]);
    }

    #[test]
    fn a_failed_or_missing_lookup_answers_nothing() {
        assert!(answers(LOG, "broken").is_empty());
        assert!(answers(LOG, "aaaa").is_empty());
        // A block's name must match whole: "probe" is not "probe.dns-check...".
        assert!(answers(LOG, "prob").is_empty());
    }
}

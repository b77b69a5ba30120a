//! `h3i-scenarios scale HOSTS [options]`: the harness's options.

/// What `h3i-scenarios scale` prints on a bad argument.
pub const USAGE: &str =
    "usage: h3i-scenarios scale HOSTS [--no-assert] [--keep] [--out FILE] [--rsa]
                       [--route-share PERCENT] [--window SECONDS] [--rounds N]
                       [--base-rounds N] [--base-restart] [--served-timeout SECONDS]
                       [--latency-timeout SECONDS] [--restart-timeout SECONDS]

  HOSTS              annotated hosts at scale (a multiple of 4, at least 8)
  --no-assert        print the table and exit 0 even when targets are missed
  --keep             leave the objects, nginx and the scratch directory in place
  --out FILE         also write the table as markdown to FILE
  --rsa              RSA-2048 keys (cert-manager's default) instead of ECDSA P-256
  --route-share P    percent of namespaces whose hosts are HTTPRoutes (default 10)
  --window S         length of each steady-state window (default 60; it runs on, at most
                     150 s more, until the data plane's upstream pool has emptied and a
                     trim has run since: the memory read at its end is the steady state)
  --rounds N         rounds of new host / rotation / removal at HOSTS (default 5)
  --base-rounds N    the same at the baseline (default 3)
  --base-restart     also delete a data-plane pod at the baseline
  --served-timeout S cap on \"every host served\" and the status, from the last create (120)
  --latency-timeout S  cap on each new-host / rotation / removal wait (30)
  --restart-timeout S  cap on the deleted pod's replacement serving every host (90)
";

/// The parsed options.
#[derive(Clone, Debug, PartialEq)]
pub struct Opts {
    pub hosts: u32,
    pub assert: bool,
    pub keep: bool,
    pub out: Option<String>,
    pub rsa: bool,
    pub route_share: u32,
    pub window: u64,
    pub rounds: u32,
    pub base_rounds: u32,
    pub base_restart: bool,
    pub served_timeout: u64,
    pub latency_timeout: u64,
    pub restart_timeout: u64,
}

fn number<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse().map_err(|_| format!("{flag}: not a number: {v}"))
}

impl Opts {
    /// The arguments after `scale`.
    pub fn parse(args: &[String]) -> Result<Opts, String> {
        let hosts: u32 = number("HOSTS", args.first())?;
        if hosts < 8 || hosts % 4 != 0 {
            return Err(format!(
                "HOSTS must be a multiple of 4, at least 8: {hosts}"
            ));
        }
        let mut o = Opts {
            hosts,
            assert: true,
            keep: false,
            out: None,
            rsa: false,
            route_share: 10,
            window: 60,
            rounds: 5,
            base_rounds: 3,
            base_restart: false,
            served_timeout: 120,
            latency_timeout: 30,
            restart_timeout: 90,
        };
        let mut it = args.iter().skip(1);
        while let Some(a) = it.next() {
            match a.as_str() {
                "--no-assert" => o.assert = false,
                "--keep" => o.keep = true,
                "--rsa" => o.rsa = true,
                "--base-restart" => o.base_restart = true,
                "--out" => {
                    let f = it.next().ok_or("--out needs a file")?;
                    let abs = std::path::absolute(f).map_err(|e| format!("--out {f}: {e}"))?;
                    o.out = Some(abs.display().to_string());
                }
                "--route-share" => o.route_share = number(a, it.next())?,
                "--window" => o.window = number(a, it.next())?,
                "--rounds" => o.rounds = number(a, it.next())?,
                "--base-rounds" => o.base_rounds = number(a, it.next())?,
                "--served-timeout" => o.served_timeout = number(a, it.next())?,
                "--latency-timeout" => o.latency_timeout = number(a, it.next())?,
                "--restart-timeout" => o.restart_timeout = number(a, it.next())?,
                other => return Err(format!("unknown option {other}")),
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_the_harness_options() {
        let o = Opts::parse(&args("1000")).unwrap();
        assert_eq!(
            (
                o.hosts,
                o.assert,
                o.window,
                o.rounds,
                o.base_rounds,
                o.route_share
            ),
            (1000, true, 60, 5, 3, 10)
        );
        let o = Opts::parse(&args(
            "16 --no-assert --rsa --window 5 --rounds 1 --base-restart --served-timeout 9",
        ))
        .unwrap();
        assert!(!o.assert && o.rsa && o.base_restart);
        assert_eq!((o.window, o.rounds, o.served_timeout), (5, 1, 9));
        assert!(Opts::parse(&args("--out x.md")).is_err());
        assert!(Opts::parse(&args("10"))
            .unwrap_err()
            .contains("multiple of 4"));
        assert!(Opts::parse(&args("4")).is_err());
        assert!(Opts::parse(&args("16 --window")).is_err());
        assert!(Opts::parse(&args("16 --bogus")).is_err());
        assert!(Opts::parse(&args("16 --out t.md"))
            .unwrap()
            .out
            .unwrap()
            .ends_with("/t.md"));
    }
}

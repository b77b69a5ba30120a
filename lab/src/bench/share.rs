//! [`Measure::Share`](crate::scenario::Measure::Share) (S6) in the bench: per run and row,
//! the row's download from the first client address beside the case's competitor from the
//! second (an HTTP/2 download, or a second download of the row itself), through the case's
//! bottleneck and drop-tail queue;
//! the router counts what each address received in the window.

use super::plan::share_timing;
use super::runner::{empty_cells, Runner};
use crate::client::Proto;
use crate::emu::{EmuConfig, RuleProto};
use crate::report::{Case, Cell};
use crate::rows::{Row, H2, ROWS};
use crate::scenario::{self, Competitor, TcpCc};
use crate::share::{self, ShareSample, Window};
use crate::topology::{CLIENT2_V4, CLIENT_V4};
use crate::LabError;

/// The router settings of an S6 case: its bottleneck both ways, its drop-tail queue, no loss.
pub fn share_emu(case: &Case, seed: u64) -> EmuConfig {
    let mut cfg = case.path().emu(RuleProto::Any, case.rate_mbit, seed);
    if let Some(q) = case.queue_bytes {
        cfg.c2s.queue_bytes = q;
        cfg.s2c.queue_bytes = q;
    }
    cfg
}

impl Runner<'_> {
    /// `case.runs` rounds of one two-flow run per row. The h2 row is the TCP CUBIC reference:
    /// the server's TCP toward the first client address runs CUBIC, toward the second the
    /// case's TCP competitor (CUBIC when the competitor is the row itself).
    pub(super) fn shares(
        &mut self,
        ci: usize,
        case: &Case,
        active: &[&Row],
    ) -> (Vec<Cell>, Option<String>) {
        let mut cells = empty_cells(case, active);
        if let Err(e) = self.prepare_share(case) {
            return (cells, Some(format!("S6 setup: {e}")));
        }
        let abort = self.share_rounds(ci, case, active, &mut cells);
        share::clear_route_cc(&self.s);
        (cells, abort)
    }

    fn prepare_share(&mut self, case: &Case) -> Result<(), LabError> {
        share::add_second_client(&self.s)?;
        let against = competitor(case)?;
        share::set_route_cc(&self.s, CLIENT_V4, TcpCc::Cubic.name())?;
        share::set_route_cc(&self.s, CLIENT2_V4, route_cc(against).name())
    }

    fn share_rounds(
        &mut self,
        ci: usize,
        case: &Case,
        active: &[&Row],
        cells: &mut [Cell],
    ) -> Option<String> {
        self.rounds(case, active, cells, |r, row, run, cell| {
            let seed = (ci as u64 + 1) * 1000 + run as u64 + 1;
            r.one_share(row, case, seed, run, cell)
        })
    }

    fn one_share(
        &mut self,
        row: &Row,
        case: &Case,
        seed: u64,
        run: usize,
        cell: &mut Cell,
    ) -> Result<(), LabError> {
        let timing = scenario::find(&case.scenario)
            .and_then(|sc| share_timing(sc, self.args.share_window_s))
            .ok_or_else(|| LabError::Config(format!("{} is no share case", case.id)))?;
        let w = Window {
            warm_up_s: timing.0,
            window_s: timing.1,
        };
        self.s.set(&share_emu(case, seed))?;
        let against = competitor(case)?;
        let other = match against {
            Competitor::Tcp(_) => ROWS
                .iter()
                .find(|r| r.id == H2)
                .ok_or_else(|| LabError::Config("no h2 row".into()))?,
            Competitor::Itself => row,
        };
        let this = &*self;
        let (mut x, row_x, _) = share::measure(
            &self.s,
            w,
            Box::new(move || this.transfer_from(row, case, None)),
            Box::new(move || this.transfer_from(other, case, Some(CLIENT2_V4))),
        )?;
        // No /metrics deltas here: the proxy records a connection when it closes, and the
        // client's time limit leaves it to the idle timeout, after the run.
        self.drain();
        check_tcp_cc(&mut x, row.proto, against, self.args.tcp_pacing);
        eprintln!(
            "[{} {} {}/{}] {:<22} share {} ({:.1} vs {:.1} Mbit/s, queue drops {}/{}, tcp {}/{}){} load {}",
            case.scenario,
            case.label,
            run + 1,
            case.runs,
            row.id,
            x.share().map_or("–".into(), |s| format!("{s:.2}")),
            x.row_mbit(),
            x.other_mbit(),
            x.row_drops,
            x.other_drops,
            if row.proto == Proto::H2 { x.row_tcp_cc.as_str() } else { "-" },
            x.other_tcp_cc,
            x.invalid.as_deref().map(|w| format!(" INVALID: {w}")).unwrap_or_default(),
            super::env::loadavg()
        );
        cell.samples.push(row_x);
        cell.shares.push(x);
        Ok(())
    }

    /// Waits (at most 2 s) until the delay line is empty so the next run starts on a quiet path.
    fn drain(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.s.snapshot().is_ok_and(|s| s.queued > 0) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

fn competitor(case: &Case) -> Result<Competitor, LabError> {
    case.competitor().ok_or_else(|| {
        LabError::Config(format!(
            "{} names no known competitor ({:?})",
            case.id, case.competitor
        ))
    })
}

/// The server's TCP controller toward the second client address: the TCP competitor's, or
/// CUBIC (the h2 row's) when the row competes with itself.
fn route_cc(against: Competitor) -> TcpCc {
    match against {
        Competitor::Tcp(cc) => cc,
        Competitor::Itself => TcpCc::Cubic,
    }
}

/// What `ss` must show for the server's TCP sockets toward the first and the second client
/// address ("" for none: an HTTP/3 flow; " paced" after the name with `--tcp-pacing`). Pure.
fn expected_tcp_cc(row: Proto, against: Competitor, paced: bool) -> (String, String) {
    let name = |cc: TcpCc| match paced {
        true => format!("{} paced", cc.name()),
        false => cc.name().to_string(),
    };
    let row_cc = match row {
        Proto::H2 => name(TcpCc::Cubic),
        Proto::H3 => String::new(),
    };
    let other_cc = match against {
        Competitor::Tcp(cc) => name(cc),
        Competitor::Itself => row_cc.clone(),
    };
    (row_cc, other_cc)
}

/// A run counts only if the server's sockets ran the controllers (and the pacing) the case
/// names (see [`expected_tcp_cc`]); an HTTP/3 row's own flow is not checked (the proxy's
/// controller is its configuration).
fn check_tcp_cc(x: &mut ShareSample, row: Proto, against: Competitor, paced: bool) {
    let (row_cc, other_cc) = expected_tcp_cc(row, against, paced);
    let mut wrong = Vec::new();
    if x.other_tcp_cc != other_cc {
        wrong.push(format!(
            "competing flow's TCP ran {:?}, not {other_cc:?}",
            x.other_tcp_cc
        ));
    }
    if row == Proto::H2 && x.row_tcp_cc != row_cc {
        wrong.push(format!(
            "the row's TCP ran {:?}, not {row_cc}",
            x.row_tcp_cc
        ));
    }
    if !wrong.is_empty() && x.invalid.is_none() {
        x.invalid = Some(wrong.join("; "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_competitor_names_the_controllers_ss_must_show() {
        let cubic = Competitor::Tcp(TcpCc::Cubic);
        let bbr = Competitor::Tcp(TcpCc::Bbr);
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(expected_tcp_cc(Proto::H2, bbr, false), pair("cubic", "bbr"));
        assert_eq!(expected_tcp_cc(Proto::H3, cubic, false), pair("", "cubic"));
        assert_eq!(
            expected_tcp_cc(Proto::H2, Competitor::Itself, false),
            pair("cubic", "cubic")
        );
        assert_eq!(
            expected_tcp_cc(Proto::H3, Competitor::Itself, false),
            pair("", "")
        );
        assert_eq!(
            expected_tcp_cc(Proto::H2, bbr, true),
            pair("cubic paced", "bbr paced")
        );
        assert_eq!(
            expected_tcp_cc(Proto::H3, cubic, true),
            pair("", "cubic paced")
        );
        assert_eq!(route_cc(Competitor::Itself), TcpCc::Cubic);
        assert_eq!(route_cc(bbr), TcpCc::Bbr);
    }

    #[test]
    fn a_run_whose_controllers_did_not_take_does_not_count() {
        let ok = |row_cc: &str, other_cc: &str| ShareSample {
            row_bytes: 1,
            other_bytes: 1,
            row_tcp_cc: row_cc.into(),
            other_tcp_cc: other_cc.into(),
            ..ShareSample::default()
        };
        let mut x = ok("", "");
        check_tcp_cc(&mut x, Proto::H3, Competitor::Itself, false);
        assert_eq!(x.invalid, None);
        // A second HTTP/3 flow that turned out to be TCP: not the cell it claims to be.
        let mut x = ok("", "cubic");
        check_tcp_cc(&mut x, Proto::H3, Competitor::Itself, false);
        assert!(x.invalid.unwrap().contains("competing flow"));
        let mut x = ok("bbr", "cubic");
        check_tcp_cc(&mut x, Proto::H2, Competitor::Tcp(TcpCc::Cubic), false);
        assert!(x.invalid.unwrap().contains("the row's TCP ran \"bbr\""));
        // --tcp-pacing whose shim did not take: the TCP flow was not paced.
        let mut x = ok("", "cubic");
        check_tcp_cc(&mut x, Proto::H3, Competitor::Tcp(TcpCc::Cubic), true);
        assert!(x.invalid.unwrap().contains("not \"cubic paced\""));
        let mut x = ok("", "cubic paced");
        check_tcp_cc(&mut x, Proto::H3, Competitor::Tcp(TcpCc::Cubic), true);
        assert_eq!(x.invalid, None);
    }
}

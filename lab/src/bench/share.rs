//! [`Measure::Share`] (S6) in the bench: per run and row, the row's download from the first
//! client address beside an HTTP/2 download from the second, through the case's bottleneck
//! and drop-tail queue; the router counts what each address received in the window.

use std::sync::atomic::Ordering;

use super::plan::share_timing;
use super::runner::Runner;
use super::INTERRUPTED;
use crate::client::Proto;
use crate::emu::{EmuConfig, RuleProto};
use crate::report::{Case, Cell};
use crate::rows::{Row, H2, ROWS};
use crate::scenario::{self, TcpCc};
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
    /// case's competitor.
    pub(super) fn shares(
        &mut self,
        ci: usize,
        case: &Case,
        active: &[&Row],
    ) -> (Vec<Cell>, Option<String>) {
        let mut cells: Vec<Cell> = active
            .iter()
            .map(|r| Cell {
                case_id: case.id.clone(),
                row: r.id.into(),
                ..Cell::default()
            })
            .collect();
        if let Err(e) = self.prepare_share(case) {
            return (cells, Some(format!("S6 setup: {e}")));
        }
        let abort = self.share_rounds(ci, case, active, &mut cells);
        share::clear_route_cc(&self.s);
        (cells, abort)
    }

    fn prepare_share(&mut self, case: &Case) -> Result<(), LabError> {
        share::add_second_client(&self.s)?;
        let against = case
            .competitor
            .as_deref()
            .ok_or_else(|| LabError::Config(format!("{} names no competitor", case.id)))?;
        share::set_route_cc(&self.s, CLIENT_V4, TcpCc::Cubic.name())?;
        share::set_route_cc(&self.s, CLIENT2_V4, against)
    }

    fn share_rounds(
        &mut self,
        ci: usize,
        case: &Case,
        active: &[&Row],
        cells: &mut [Cell],
    ) -> Option<String> {
        for run in 0..case.runs {
            let seed = (ci as u64 + 1) * 1000 + run as u64 + 1;
            for k in 0..active.len() {
                let i = (k + run) % active.len();
                if INTERRUPTED.load(Ordering::SeqCst) {
                    return Some("interrupted".into());
                }
                if let Err(e) = self.one_share(active[i], case, seed, run, &mut cells[i]) {
                    return Some(format!("lab error: {e}"));
                }
            }
            if let Some(dead) = self.s.dead_process() {
                return Some(format!("a server died: {dead}"));
            }
        }
        None
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
        let h2 = ROWS
            .iter()
            .find(|r| r.id == H2)
            .ok_or_else(|| LabError::Config("no h2 row".into()))?;
        let this = &*self;
        let (mut x, row_x, _) = share::measure(
            &self.s,
            w,
            Box::new(move || this.transfer_from(row, case, None)),
            Box::new(move || this.transfer_from(h2, case, Some(CLIENT2_V4))),
        )?;
        // No /metrics deltas here: the proxy records a connection when it closes, and the
        // client's time limit leaves it to the idle timeout, after the run.
        self.drain();
        check_tcp_cc(&mut x, row, case);
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

/// A run counts only if the server's sockets ran the controllers the case names: the
/// competitor's toward the second address, CUBIC toward the first for the h2 row.
fn check_tcp_cc(x: &mut ShareSample, row: &Row, case: &Case) {
    let against = case.competitor.as_deref().unwrap_or_default();
    let mut wrong = Vec::new();
    if x.other_tcp_cc != against {
        wrong.push(format!(
            "competing TCP ran {:?}, not {against}",
            x.other_tcp_cc
        ));
    }
    if row.proto == Proto::H2 && x.row_tcp_cc != TcpCc::Cubic.name() {
        wrong.push(format!("the row's TCP ran {:?}, not cubic", x.row_tcp_cc));
    }
    if !wrong.is_empty() && x.invalid.is_none() {
        x.invalid = Some(wrong.join("; "));
    }
}

//! Which cases a bench run measures: the selected scenarios' cases from the table
//! (`scenario::SCENARIOS`), with `--quick`, `--runs`, the rate flags and `--max-time` applied.
//! Pure.

use crate::emu::Position;
use crate::report::Case;
use crate::scenario::{self, CaseRate, CaseSpec, Measure, PathSpec, RateFlag, Scenario};
use crate::LabError;

/// The command-line settings that shape the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    pub quick: bool,
    /// Transfers per cell instead of the scenario's.
    pub runs: Option<usize>,
    /// `--rate-mbit`.
    pub rate_mbit: Option<f64>,
    /// `--s4-rate-mbit` (0 given as `None`).
    pub s4_rate_mbit: Option<f64>,
    /// `--max-time`, seconds per transfer.
    pub max_time: f64,
    /// `--cells`: keep only cases whose id contains one of these (empty: every case).
    pub cells: Vec<String>,
    /// `--share-window-s`: S6's measuring window instead of the scenario's.
    pub share_window_s: Option<f64>,
}

/// Uploads get at least this long: a 20 MB PUT through a slow path takes its time.
const UPLOAD_MIN_TIME_S: f64 = 60.0;
/// S6's flows go on this long after the window, so neither ends inside it.
pub const SHARE_TAIL_S: f64 = 2.0;

/// The cases of the selected scenarios, in the table's case order per scenario.
pub fn plan(selected: &[String], o: &PlanOptions) -> Result<Vec<Case>, LabError> {
    let mut out = Vec::new();
    for id in selected {
        let sc = scenario::find(id).ok_or_else(|| {
            LabError::Config(format!(
                "unknown scenario {:?} ({})",
                id.trim(),
                scenario::ids()
            ))
        })?;
        let specs = sc.cases.iter().filter(|c| c.quick || !o.quick);
        out.extend(specs.filter_map(|spec| case(sc, spec, o)));
    }
    if !o.cells.is_empty() {
        out.retain(|c| o.cells.iter().any(|f| c.id.contains(f.trim())));
        if out.is_empty() {
            return Err(LabError::Config(format!(
                "--cells {:?} matches no case of the selected scenarios",
                o.cells
            )));
        }
    }
    Ok(out)
}

/// The measuring window and warm-up of an S6 case, seconds: the scenario's, or
/// `--share-window-s`.
pub fn share_timing(sc: &Scenario, o_window: Option<f64>) -> Option<(f64, f64)> {
    match sc.measure {
        Measure::Share {
            warm_up_s,
            window_s,
        } => Some((warm_up_s, o_window.unwrap_or(window_s))),
        Measure::Transfers | Measure::Loopback => None,
    }
}

/// One case of the plan; `None` when it needs a bottleneck and the flags set none.
fn case(sc: &Scenario, spec: &CaseSpec, o: &PlanOptions) -> Option<Case> {
    let flag = match sc.rate_flag {
        RateFlag::Rate => o.rate_mbit,
        RateFlag::S4Rate => o.s4_rate_mbit.or(o.rate_mbit),
    };
    let loopback = sc.measure == Measure::Loopback;
    let rate_mbit = match (spec.competition, spec.rate) {
        // Loopback cases do not cross the router, so no rate flag applies to them.
        _ if loopback => None,
        (Some(k), _) => Some(k.rate_mbit),
        (None, CaseRate::Flag) => flag,
        (None, CaseRate::OnlyLimited) => Some(flag?),
        (None, CaseRate::Unlimited) => None,
    };
    let p = spec.path;
    let file = spec.transfer.file();
    let upload = spec.transfer.is_upload();
    let mut id = format!(
        "{}-{:.0}ms-{}{}",
        sc.id,
        p.rtt_ms,
        file.name.trim_end_matches(".bin"),
        id_suffix(&p)
    );
    let mut label = format!(
        "{:.0} ms, {}{}{}",
        p.rtt_ms,
        file.label,
        if upload { " upload" } else { "" },
        p.impairments()
    );
    if loopback {
        id = format!("{}-loopback-{}", sc.id, file.name.trim_end_matches(".bin"));
        label = format!("loopback, {}", file.label);
    } else if spec.rate == CaseRate::Unlimited {
        id.push_str("-unlimited");
        label.push_str(", no rate limit");
    }
    match (spec.competition, rate_mbit) {
        (Some(k), _) => {
            id = format!("{}-{:.0}ms{}", sc.id, p.rtt_ms, k.id_suffix());
            label = format!("{:.0} ms{}", p.rtt_ms, k.label(p.rtt_ms));
        }
        (None, Some(r)) => {
            id.push_str(&format!("-{r}mbit"));
            label.push_str(&format!(", {r} Mbit/s"));
        }
        (None, None) => {}
    }
    let full = spec.runs.unwrap_or(sc.runs);
    let runs = o.runs.unwrap_or(if o.quick {
        full.div_ceil(4).max(3)
    } else {
        full
    });
    let share = share_timing(sc, o.share_window_s);
    let max_time = match sc.max_time_cap_s {
        // Both flows run until the client's limit ends them, a little after the window.
        _ if share.is_some() => share.map_or(0.0, |(w, d)| w + d + SHARE_TAIL_S),
        _ if upload => o.max_time.max(UPLOAD_MIN_TIME_S),
        Some(cap) => o.max_time.min(cap),
        None => o.max_time,
    };
    Some(Case {
        scenario: sc.id.to_string(),
        id,
        label,
        rtt_ms: p.rtt_ms,
        loss: p.loss,
        mtu: p.mtu,
        icmp: p.icmp,
        rule: p.first_flight_drop,
        file: file.name.to_string(),
        bytes: file.bytes,
        upload,
        runs,
        rate_mbit,
        max_time,
        queue_bytes: spec
            .competition
            .map(|k| k.queue.bytes(k.rate_mbit, p.rtt_ms)),
        competitor: spec.competition.map(|k| k.against.name().to_string()),
    })
}

/// "-loss1", "-drop", "-drophs", "-mtu1280": what distinguishes a case's path in its id.
fn id_suffix(p: &PathSpec) -> String {
    let mut s = String::new();
    if p.loss > 0.0 {
        s.push_str(&format!("-loss{:.0}", p.loss * 100.0));
    }
    match p.first_flight_drop {
        None => {}
        Some(Position::Last) => s.push_str("-drop"),
        Some(Position::LastHandshake) => s.push_str("-drophs"),
        Some(Position::Nth(n)) => s.push_str(&format!("-drop{n}")),
    }
    if p.mtu < 1500 {
        s.push_str(&format!("-mtu{}", p.mtu));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sc(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn opts(quick: bool, runs: Option<usize>, s4: Option<f64>) -> PlanOptions {
        PlanOptions {
            quick,
            runs,
            rate_mbit: None,
            s4_rate_mbit: s4,
            max_time: 30.0,
            cells: Vec::new(),
            share_window_s: None,
        }
    }

    #[test]
    fn full_plan_matches_the_issue() {
        let p = plan(
            &sc(&["S1", "S2", "S3", "S4", "S5"]),
            &opts(false, None, Some(100.0)),
        )
        .unwrap();
        let ids: Vec<&str> = p.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                "S1-200ms-1m",
                "S1-200ms-4m",
                "S1-100ms-1m",
                "S2-200ms-1m-drop",
                "S2-100ms-1m-drop",
                "S2-200ms-1m-drophs",
                "S3-200ms-1m-loss1",
                "S3-200ms-1m-loss2",
                "S4-11ms-5.7m-100mbit",
                "S4-11ms-50m-100mbit",
                "S4-42ms-5.7m-100mbit",
                "S4-42ms-50m-100mbit",
                "S4-42ms-20m-100mbit",
                "S4-42ms-20m-unlimited",
                "S5-42ms-4m",
                "S5-42ms-4m-mtu1400",
                "S5-42ms-4m-mtu1280",
            ]
        );
        let labels: Vec<&str> = p.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels[3], "200 ms, 1 MB, first-flight drop");
        assert_eq!(labels[5], "200 ms, 1 MB, last handshake datagram dropped");
        assert_eq!(labels[6], "200 ms, 1 MB, 1 % loss");
        assert_eq!(labels[12], "42 ms, 20 MB upload, 100 Mbit/s");
        assert_eq!(labels[13], "42 ms, 20 MB upload, no rate limit");
        assert_eq!(labels[16], "42 ms, 4 MB, MTU 1280 no ICMP");
        assert!(p
            .iter()
            .filter(|c| c.scenario == "S3")
            .all(|c| c.runs == 40));
        assert!(p
            .iter()
            .filter(|c| c.scenario != "S3")
            .all(|c| c.runs >= 10));
        let up: Vec<&Case> = p.iter().filter(|c| c.upload).collect();
        assert_eq!(up.len(), 2);
        assert!(up.iter().all(|c| c.bytes == 20 << 20 && c.max_time >= 60.0));
        assert_eq!(up[0].rate_mbit, Some(100.0));
        assert_eq!(
            up[1].rate_mbit, None,
            "the buffer-stress upload has no limit"
        );
        assert!(p
            .iter()
            .filter(|c| c.scenario != "S4")
            .all(|c| c.rate_mbit.is_none()));
        assert!(p.iter().filter(|c| c.mtu < 1500).all(|c| !c.icmp));
        assert!(p
            .iter()
            .filter(|c| c.scenario == "S5")
            .all(|c| c.max_time == 10.0));
    }

    #[test]
    fn quick_plan_and_overrides() {
        let p = plan(&sc(&["s3"]), &opts(true, None, None)).unwrap();
        assert!(p.iter().all(|c| c.runs == 10));
        let p = plan(&sc(&["S1", "S4", "S5"]), &opts(true, None, Some(100.0))).unwrap();
        let ids: Vec<&str> = p.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                "S1-200ms-1m",
                "S1-100ms-1m",
                "S4-42ms-5.7m-100mbit",
                "S4-42ms-20m-100mbit",
                "S4-42ms-20m-unlimited",
                "S5-42ms-4m",
                "S5-42ms-4m-mtu1280",
            ]
        );
        assert!(p.iter().all(|c| c.runs == 3));
        let p = plan(&sc(&["S4"]), &opts(false, Some(2), Some(200.0))).unwrap();
        assert!(p.iter().all(|c| c.runs == 2));
        assert!(p
            .iter()
            .filter(|c| !c.id.ends_with("unlimited"))
            .all(|c| c.rate_mbit == Some(200.0)));
        let p = plan(&sc(&["S4"]), &opts(false, None, None)).unwrap();
        assert_eq!(p.iter().filter(|c| c.upload).count(), 1);
        assert!(p.iter().all(|c| c.rate_mbit.is_none()));
        let e = plan(&sc(&["S9"]), &opts(false, None, None)).unwrap_err();
        assert!(e.to_string().contains("S1,S2,S3,S4,S5,S6"), "{e}");
    }

    #[test]
    fn loopback_plan_has_its_own_runs_and_no_rate() {
        let p = plan(&sc(&["E1"]), &opts(false, None, Some(100.0))).unwrap();
        let got: Vec<(&str, &str, usize)> = p
            .iter()
            .map(|c| (c.id.as_str(), c.label.as_str(), c.runs))
            .collect();
        assert_eq!(
            got,
            vec![
                ("E1-loopback-256m", "loopback, 256 MB", 3),
                ("E1-loopback-1m", "loopback, 1 MB", 15),
            ]
        );
        assert!(p.iter().all(|c| c.rate_mbit.is_none() && c.rtt_ms == 0.0));
        let quick = plan(&sc(&["E1"]), &opts(true, None, None)).unwrap();
        assert_eq!(quick[1].runs, 4, "a quarter of 15, at least 3");
    }

    #[test]
    fn share_plan_cells_and_filters() {
        let p = plan(&sc(&["S6"]), &opts(false, None, None)).unwrap();
        assert_eq!(p.len(), 24);
        assert!(p.iter().all(|c| c.runs == 3));
        let c = &p[1];
        assert_eq!(c.id, "S6-50ms-20mbit-q12-cubic");
        assert_eq!(
            c.label,
            "50 ms, 20 Mbit/s, queue 12 packets (18 KB), vs TCP CUBIC"
        );
        assert_eq!(c.rate_mbit, Some(20.0));
        assert_eq!(c.queue_bytes, Some(18_000));
        assert_eq!(c.competitor.as_deref(), Some("cubic"));
        assert_eq!(c.max_time, 5.0 + 60.0 + SHARE_TAIL_S);
        let deep = p
            .iter()
            .find(|c| c.id == "S6-200ms-100mbit-bdp-bbr")
            .unwrap();
        assert_eq!(
            deep.queue_bytes,
            Some(2_500_000),
            "1 BDP at 100 Mbit/s, 200 ms"
        );
        let quick = plan(&sc(&["S6"]), &opts(true, None, None)).unwrap();
        assert_eq!(quick.len(), 6);
        assert!(quick.iter().all(|c| c.id.starts_with("S6-50ms-20mbit")));
        let own: Vec<&Case> = quick.iter().filter(|c| c.id.ends_with("-self")).collect();
        let ids: Vec<&str> = own.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["S6-50ms-20mbit-bdp-self", "S6-50ms-20mbit-q12-self"]);
        assert_eq!(
            own[1].label,
            "50 ms, 20 Mbit/s, queue 12 packets (18 KB), vs itself (a second flow of the row)"
        );
        assert_eq!(own[0].competitor(), Some(scenario::Competitor::Itself));
        assert_eq!(own[0].queue_bytes, Some(125_000));
        assert_eq!(
            p.iter().filter(|c| c.id.ends_with("-self")).count(),
            8,
            "every rate, RTT and queue of the TCP cells"
        );

        let mut o = opts(false, Some(1), None);
        o.cells = vec!["20mbit-bdp".into(), "100mbit-q12-bbr".into()];
        o.share_window_s = Some(30.0);
        let ids: Vec<String> = plan(&sc(&["S6"]), &o)
            .unwrap()
            .into_iter()
            .map(|c| {
                assert_eq!(c.max_time, 5.0 + 30.0 + SHARE_TAIL_S);
                c.id
            })
            .collect();
        assert_eq!(
            ids,
            vec![
                "S6-50ms-20mbit-bdp-cubic",
                "S6-50ms-20mbit-bdp-bbr",
                "S6-50ms-20mbit-bdp-self",
                "S6-200ms-20mbit-bdp-cubic",
                "S6-200ms-20mbit-bdp-bbr",
                "S6-200ms-20mbit-bdp-self",
                "S6-50ms-100mbit-q12-bbr",
                "S6-200ms-100mbit-q12-bbr",
            ]
        );
        o.cells = vec!["nothing".into()];
        assert!(plan(&sc(&["S6"]), &o).is_err());
    }
}

//! A run's output: timed steps, `ok:` and indented lines, and the step table that ends every
//! run (`step start took name`, then `TITLE PASSED in Ns` or, on stderr, `TITLE FAILED`).

use std::time::Instant;

/// One scenario run: its title (`JOURNEY`), its start and the steps so far.
pub struct Run {
    title: String,
    start: Instant,
    steps: Vec<(String, u64)>,
}

impl Run {
    pub fn new(title: &str) -> Self {
        Run {
            title: title.to_string(),
            start: Instant::now(),
            steps: Vec::new(),
        }
    }

    /// Whole seconds since the run started.
    pub fn secs(&self) -> u64 {
        self.start.elapsed().as_secs()
    }

    /// Starts a step: `--- [ 12s] name`.
    pub fn step(&mut self, name: impl Into<String>) {
        let name = name.into();
        let at = self.secs();
        println!("\n--- [{at:>3}s] {name}");
        self.steps.push((name, at));
    }

    /// The step list with each step's own duration (the last one runs until now).
    pub fn table(&self) -> String {
        step_table(&self.steps, self.secs())
    }

    /// The table and `TITLE PASSED in Ns`.
    pub fn passed(&self) {
        print!("{}", self.table());
        println!("{} PASSED in {}s", self.title, self.secs());
    }

    /// `TITLE FAILED at Ns: why` and the table, on stderr.
    pub fn failed(&self, why: &dyn std::fmt::Display) {
        eprintln!("\n{} FAILED at {}s: {why}", self.title, self.secs());
        eprint!("{}", self.table());
    }

    pub fn title(&self) -> &str {
        &self.title
    }
}

fn step_table(steps: &[(String, u64)], now: u64) -> String {
    if steps.is_empty() {
        return String::new();
    }
    let mut out = format!("\n{:<4} {:>6} {:>6}  {}\n", "step", "start", "took", "name");
    for (i, (name, at)) in steps.iter().enumerate() {
        let end = steps.get(i + 1).map_or(now, |s| s.1);
        let name: String = name.chars().take(110).collect();
        let (start, took) = (format!("{at}s"), format!("{}s", end - at));
        out += &format!("{:<4} {start:>6} {took:>6}  {name}\n", i + 1);
    }
    out
}

/// `    ok: message`
pub fn ok(message: impl AsRef<str>) {
    println!("    ok: {}", message.as_ref());
}

/// `    message`
pub fn info(message: impl AsRef<str>) {
    println!("    {}", message.as_ref());
}

/// Each line of a command's output as `    | line`.
pub fn indent(text: impl AsRef<str>) {
    for line in text.as_ref().lines() {
        println!("    | {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_the_one_journey_sh_printed() {
        let steps = vec![
            (
                "cluster up (scripts/cluster.sh up; warm: binaries cached)".to_string(),
                0,
            ),
            ("helm install the chart".to_string(), 2),
            ("x".repeat(130), 19),
        ];
        // bash: printf '%-4s %6s %6s  %s\n' and '%-4s %5ss %5ss  %.110s\n'
        let want = "\nstep  start   took  name\n\
                    1        0s     2s  cluster up (scripts/cluster.sh up; warm: binaries cached)\n\
                    2        2s    17s  helm install the chart\n"
            .to_string()
            + &format!("3       19s     4s  {}\n", "x".repeat(110));
        assert_eq!(step_table(&steps, 23), want);
        assert_eq!(step_table(&[], 5), "");
    }
}

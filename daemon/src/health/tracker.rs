//! One backend's state from its check results: `rise` passes in a row
//! bring a down backend up, `fall` failures in a row take an up one down
//! (hysteresis against flapping). Before its first result a backend is
//! unknown; the first result decides at once, so a new backend takes
//! traffic after one passing check, not `rise` of them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Health {
    Unknown,
    Up,
    Down,
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Health::Unknown => "unknown",
            Health::Up => "up",
            Health::Down => "down",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tracker {
    pub health: Health,
    /// Results in a row that disagree with `health`.
    streak: u32,
}

impl Tracker {
    pub(crate) fn new(health: Health) -> Self {
        Tracker { health, streak: 0 }
    }

    /// Records one result; returns the new health when it changed.
    pub(crate) fn record(&mut self, passed: bool, rise: u32, fall: u32) -> Option<Health> {
        let (agrees, needed, next) = match self.health {
            Health::Unknown => (false, 1, if passed { Health::Up } else { Health::Down }),
            Health::Up => (passed, fall, Health::Down),
            Health::Down => (!passed, rise, Health::Up),
        };
        if agrees {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak < needed {
            return None;
        }
        self.streak = 0;
        self.health = next;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: Health, results: &str, rise: u32, fall: u32) -> Vec<Health> {
        let mut t = Tracker::new(start);
        results
            .chars()
            .map(|c| {
                t.record(c == '+', rise, fall);
                t.health
            })
            .collect()
    }

    #[test]
    fn the_first_result_decides_an_unknown_backend() {
        assert_eq!(run(Health::Unknown, "+", 2, 3), [Health::Up]);
        assert_eq!(run(Health::Unknown, "-", 2, 3), [Health::Down]);
    }

    #[test]
    fn fall_failures_in_a_row_take_it_down_and_a_pass_between_resets_them() {
        use Health::*;
        assert_eq!(run(Up, "--+--", 2, 3), [Up, Up, Up, Up, Up]);
        assert_eq!(run(Up, "---", 2, 3), [Up, Up, Down]);
    }

    #[test]
    fn rise_passes_in_a_row_bring_it_back() {
        use Health::*;
        assert_eq!(run(Down, "+-++", 2, 3), [Down, Down, Down, Up]);
        assert_eq!(run(Down, "+", 1, 3), [Up]);
    }

    #[test]
    fn a_change_is_reported_once() {
        let mut t = Tracker::new(Health::Up);
        assert_eq!(t.record(false, 2, 2), None);
        assert_eq!(t.record(false, 2, 2), Some(Health::Down));
        assert_eq!(t.record(false, 2, 2), None);
    }
}

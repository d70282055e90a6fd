//! Which of a list of gateways carries traffic, from probe results alone:
//! the first live one in the list's order. A gateway is down after
//! `loss` probes in a row go unanswered and up again after `rise` answered
//! in a row; traffic leaves a gateway only when it goes down, and comes
//! back to an earlier one only with `preempt`. No state is shared with
//! anyone: every host judges from its own probes and the order in its
//! files. Pure: the prober's thread drives it, the unit tests below too.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// How probes are judged (`[gateway]` probe_loss, probe_rise, preempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    pub loss: u32,
    pub rise: u32,
    pub preempt: bool,
}

/// One gateway of a list, as its probes judge it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Target {
    pub addr: IpAddr,
    pub up: bool,
    /// Unix seconds of the last change of `up` (or of the start).
    pub since: u64,
    /// Probes unanswered in a row.
    pub missed: u32,
    /// Probes answered in a row.
    pub answered: u32,
}

/// A list of gateways in order of preference, and the one in use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Choice {
    pub targets: Vec<Target>,
    /// The gateway carrying traffic; `None` when every one is down.
    pub active: Option<IpAddr>,
    /// Unix seconds since `active` has been what it is.
    pub active_since: u64,
    /// Moves of the traffic from one gateway to another (back included).
    pub failovers: u64,
}

impl Choice {
    /// A list nobody probed yet: every gateway up, the first in use.
    pub(crate) fn new(addrs: &[IpAddr], now: u64) -> Choice {
        let targets = addrs.iter().map(|&addr| Target { addr, up: true, since: now, missed: 0, answered: 0 }).collect();
        Choice { targets, active: addrs.first().copied(), active_since: now, failovers: 0 }
    }

    /// Resumes `saved` if it judged the same list, in the same order;
    /// otherwise starts afresh. A restarted prober must not move traffic
    /// back to the first gateway only because it restarted.
    pub(crate) fn resume(addrs: &[IpAddr], saved: Option<Choice>, now: u64) -> Choice {
        match saved {
            Some(c) if c.targets.iter().map(|t| t.addr).eq(addrs.iter().copied()) => c,
            _ => Choice::new(addrs, now),
        }
    }

    /// Whether some gateway that is up has missed its last probe: the
    /// prober then probes again sooner, to judge it faster.
    pub(crate) fn falling(&self) -> bool {
        self.targets.iter().any(|t| t.up && t.missed > 0)
    }

    /// One round of probes: `answered(addr)` says whether the probe sent to
    /// `addr` was answered in time. Returns whether anything a reader
    /// sees changed (a gateway's state or the one in use).
    pub(crate) fn round(&mut self, answered: impl Fn(IpAddr) -> bool, rules: Rules, now: u64) -> bool {
        let mut changed = false;
        for t in &mut self.targets {
            if answered(t.addr) {
                t.missed = 0;
                t.answered = t.answered.saturating_add(1);
                if !t.up && t.answered >= rules.rise {
                    t.up = true;
                    t.since = now;
                    changed = true;
                }
            } else {
                t.answered = 0;
                t.missed = t.missed.saturating_add(1);
                if t.up && t.missed >= rules.loss {
                    t.up = false;
                    t.since = now;
                    changed = true;
                }
            }
        }
        let first_up = self.targets.iter().find(|t| t.up).map(|t| t.addr);
        let active_up = self.active.is_some_and(|a| self.targets.iter().any(|t| t.addr == a && t.up));
        let want = if active_up && !rules.preempt { self.active } else { first_up };
        if want != self.active {
            if want.is_some() && self.active.is_some() {
                self.failovers += 1;
            }
            self.active = want;
            self.active_since = now;
            changed = true;
        }
        changed
    }

    /// The target at `addr`.
    pub(crate) fn target(&self, addr: IpAddr) -> Option<&Target> {
        self.targets.iter().find(|t| t.addr == addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: Rules = Rules { loss: 3, rise: 2, preempt: false };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn list() -> Vec<IpAddr> {
        vec![ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.3")]
    }

    /// Runs `n` rounds in which only `live` answer; returns the rounds
    /// that reported a change (1-based).
    fn rounds(c: &mut Choice, n: u32, live: &[&str], rules: Rules) -> Vec<u32> {
        let live: Vec<IpAddr> = live.iter().map(|s| ip(s)).collect();
        (1..=n).filter(|&i| c.round(|a| live.contains(&a), rules, u64::from(i))).collect()
    }

    #[test]
    fn the_first_gateway_carries_traffic_until_it_misses_probe_loss_probes() {
        let mut c = Choice::new(&list(), 0);
        assert_eq!(c.active, Some(ip("192.0.2.1")));
        // Two misses: still in use, and the prober is told to hurry.
        assert_eq!(rounds(&mut c, 2, &["192.0.2.2", "192.0.2.3"], RULES), Vec::<u32>::new());
        assert_eq!(c.active, Some(ip("192.0.2.1")));
        assert!(c.falling());
        // The third: down, and the next in the list takes over.
        assert!(c.round(|a| a != ip("192.0.2.1"), RULES, 9));
        assert_eq!(c.active, Some(ip("192.0.2.2")));
        assert_eq!((c.active_since, c.failovers), (9, 1));
        let first = c.target(ip("192.0.2.1")).unwrap();
        assert_eq!((first.up, first.since, first.missed), (false, 9, 3));
        assert!(!c.falling(), "a gateway already down is not probed faster");
    }

    #[test]
    fn an_answer_between_misses_starts_the_count_again() {
        let mut c = Choice::new(&list(), 0);
        let all = ["192.0.2.1", "192.0.2.2", "192.0.2.3"];
        rounds(&mut c, 2, &all[1..], RULES);
        rounds(&mut c, 1, &all, RULES);
        rounds(&mut c, 2, &all[1..], RULES);
        assert_eq!(c.active, Some(ip("192.0.2.1")));
        assert_eq!(c.failovers, 0);
    }

    #[test]
    fn without_preempt_a_recovered_gateway_waits_until_the_one_in_use_fails() {
        let mut c = Choice::new(&list(), 0);
        rounds(&mut c, 3, &["192.0.2.2", "192.0.2.3"], RULES);
        assert_eq!(c.active, Some(ip("192.0.2.2")));
        // One answer is not enough to be up again; probe_rise are.
        let all = ["192.0.2.1", "192.0.2.2", "192.0.2.3"];
        assert_eq!(rounds(&mut c, 1, &all, RULES), Vec::<u32>::new());
        assert!(!c.target(ip("192.0.2.1")).unwrap().up);
        assert_eq!(rounds(&mut c, 1, &all, RULES), vec![1]);
        assert!(c.target(ip("192.0.2.1")).unwrap().up);
        assert_eq!(c.active, Some(ip("192.0.2.2")), "no preempt: traffic stays");
        assert_eq!(c.failovers, 1);
        // Only when the second fails does traffic go to the first again.
        rounds(&mut c, 3, &["192.0.2.1", "192.0.2.3"], RULES);
        assert_eq!(c.active, Some(ip("192.0.2.1")));
        assert_eq!(c.failovers, 2);
    }

    #[test]
    fn with_preempt_traffic_returns_after_probe_rise_answers() {
        let rules = Rules { preempt: true, ..RULES };
        let mut c = Choice::new(&list(), 0);
        rounds(&mut c, 3, &["192.0.2.2", "192.0.2.3"], rules);
        let all = ["192.0.2.1", "192.0.2.2", "192.0.2.3"];
        rounds(&mut c, 1, &all, rules);
        assert_eq!(c.active, Some(ip("192.0.2.2")));
        rounds(&mut c, 1, &all, rules);
        assert_eq!(c.active, Some(ip("192.0.2.1")));
        assert_eq!(c.failovers, 2, "the move back counts");
    }

    #[test]
    fn every_gateway_down_leaves_none_in_use_and_the_first_to_rise_takes_over() {
        let mut c = Choice::new(&list(), 0);
        rounds(&mut c, 3, &[], RULES);
        assert_eq!(c.active, None);
        assert_eq!(c.failovers, 0, "going nowhere is no move to another gateway");
        rounds(&mut c, 2, &["192.0.2.3"], RULES);
        assert_eq!(c.active, Some(ip("192.0.2.3")));
        assert_eq!(c.failovers, 0, "traffic resumed; it did not move from one gateway to another");
    }

    #[test]
    fn a_restart_resumes_the_saved_choice_of_the_same_list_only() {
        let mut c = Choice::new(&list(), 0);
        rounds(&mut c, 3, &["192.0.2.2", "192.0.2.3"], RULES);
        let resumed = Choice::resume(&list(), Some(c.clone()), 50);
        assert_eq!(resumed, c, "the same list: everything as saved");
        let mut other = list();
        other.swap(0, 1);
        let fresh = Choice::resume(&other, Some(c), 50);
        assert_eq!(fresh, Choice::new(&other, 50), "another order is another choice");
    }
}

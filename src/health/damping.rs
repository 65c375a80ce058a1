//! Flap damping: a GPU turns Unhealthy only after several bad samples in a row,
//! and Healthy again only after several good ones. Pure.

use serde::Serialize;

/// How many consecutive samples it takes to change state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Damping {
    pub unhealthy_after: u32,
    pub healthy_after: u32,
}

impl Default for Damping {
    /// Two samples each way: a single odd reading changes nothing. The
    /// second sample is a confirmation, taken soon after the first (see
    /// [`Tracker::confirming`]), so a problem shows within about the sample
    /// interval plus the confirmation interval.
    fn default() -> Self {
        Self {
            unhealthy_after: 2,
            healthy_after: 2,
        }
    }
}

/// One GPU's health over time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracker {
    pub healthy: bool,
    /// While unhealthy: the problems of the latest bad sample.
    pub reasons: Vec<String>,
    bad_streak: u32,
    good_streak: u32,
}

impl Default for Tracker {
    /// GPUs start healthy: the first bad samples have to prove otherwise.
    fn default() -> Self {
        Self {
            healthy: true,
            reasons: Vec::new(),
            bad_streak: 0,
            good_streak: 0,
        }
    }
}

/// What one observation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Unchanged,
    /// Still unhealthy, for other reasons.
    ReasonsChanged,
    BecameUnhealthy,
    BecameHealthy,
}

impl Tracker {
    /// Whether the latest samples disagree with the current state without
    /// having changed it yet: the next sample decides, so it is worth taking
    /// soon.
    pub fn confirming(&self) -> bool {
        if self.healthy {
            self.bad_streak > 0
        } else {
            self.good_streak > 0
        }
    }

    /// Feeds one sample's problems (empty: a good sample).
    pub fn observe(&mut self, problems: Vec<String>, damping: &Damping) -> Step {
        if problems.is_empty() {
            self.bad_streak = 0;
            self.good_streak = self.good_streak.saturating_add(1);
            if !self.healthy && self.good_streak >= damping.healthy_after.max(1) {
                self.healthy = true;
                self.reasons.clear();
                return Step::BecameHealthy;
            }
            return Step::Unchanged;
        }
        self.good_streak = 0;
        self.bad_streak = self.bad_streak.saturating_add(1);
        if self.healthy {
            if self.bad_streak >= damping.unhealthy_after.max(1) {
                self.healthy = false;
                self.reasons = problems;
                return Step::BecameUnhealthy;
            }
            return Step::Unchanged;
        }
        if self.reasons != problems {
            self.reasons = problems;
            return Step::ReasonsChanged;
        }
        Step::Unchanged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad() -> Vec<String> {
        vec!["ECC".into()]
    }

    #[test]
    fn turns_unhealthy_after_enough_bad_samples_in_a_row() {
        let damping = Damping {
            unhealthy_after: 3,
            healthy_after: 2,
        };
        let mut t = Tracker::default();
        assert_eq!(t.observe(bad(), &damping), Step::Unchanged);
        assert_eq!(t.observe(bad(), &damping), Step::Unchanged);
        // A good sample in between resets the count.
        assert_eq!(t.observe(vec![], &damping), Step::Unchanged);
        assert_eq!(t.observe(bad(), &damping), Step::Unchanged);
        assert_eq!(t.observe(bad(), &damping), Step::Unchanged);
        assert!(t.healthy);
        assert_eq!(t.observe(bad(), &damping), Step::BecameUnhealthy);
        assert!(!t.healthy);
        assert_eq!(t.reasons, bad());
    }

    #[test]
    fn recovers_after_enough_good_samples_and_tracks_reasons_meanwhile() {
        let damping = Damping {
            unhealthy_after: 1,
            healthy_after: 2,
        };
        let mut t = Tracker::default();
        assert_eq!(t.observe(bad(), &damping), Step::BecameUnhealthy);
        assert_eq!(t.observe(bad(), &damping), Step::Unchanged);
        assert_eq!(
            t.observe(vec!["hot".into()], &damping),
            Step::ReasonsChanged
        );
        assert_eq!(t.observe(vec![], &damping), Step::Unchanged);
        assert_eq!(
            t.observe(bad(), &damping),
            Step::ReasonsChanged,
            "flap back"
        );
        assert!(!t.healthy);
        assert_eq!(t.observe(vec![], &damping), Step::Unchanged);
        assert_eq!(t.observe(vec![], &damping), Step::BecameHealthy);
        assert!(t.healthy && t.reasons.is_empty());
    }

    #[test]
    fn a_streak_that_could_change_the_state_is_being_confirmed() {
        let damping = Damping {
            unhealthy_after: 3,
            healthy_after: 2,
        };
        let mut t = Tracker::default();
        assert!(!t.confirming(), "a healthy GPU with good samples");
        t.observe(bad(), &damping);
        assert!(t.confirming());
        t.observe(bad(), &damping);
        assert!(t.confirming(), "still short of 3");
        t.observe(vec![], &damping);
        assert!(!t.confirming(), "the streak broke");
        for _ in 0..3 {
            t.observe(bad(), &damping);
        }
        assert!(!t.healthy && !t.confirming(), "unhealthy and still bad");
        t.observe(vec![], &damping);
        assert!(t.confirming(), "a good sample may lead to recovery");
        t.observe(vec![], &damping);
        assert!(t.healthy && !t.confirming());
    }

    #[test]
    fn zero_means_one() {
        let damping = Damping {
            unhealthy_after: 0,
            healthy_after: 0,
        };
        let mut t = Tracker::default();
        assert_eq!(t.observe(bad(), &damping), Step::BecameUnhealthy);
        assert_eq!(t.observe(vec![], &damping), Step::BecameHealthy);
    }
}

//! Test runner figures for the metrics exporter, as plain data.
//!
//! [`TestRunnerStats`] is a snapshot: finished test cases counted by trigger,
//! recipe and outcome; the last result and duration of each trigger and recipe;
//! the GPUs under test now; and how many requests wait for their GPUs. The
//! exporter renders it; this module knows nothing about Prometheus.

use std::time::Duration;

use serde::Serialize;

use super::config::Trigger;
use super::report::Outcome;

/// Finished test cases with the same trigger, recipe and outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunCount {
    pub trigger: Trigger,
    pub recipe: String,
    pub outcome: Outcome,
    pub count: u64,
}

/// The last finished test case of a trigger and recipe.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LastRun {
    pub trigger: Trigger,
    pub recipe: String,
    pub outcome: Outcome,
    pub duration_seconds: f64,
    /// When it finished, seconds since the Unix epoch.
    pub finished_unix_seconds: f64,
    /// GPU indexes it tested.
    pub gpu_indexes: Vec<u32>,
}

/// A GPU with a test case running on it now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunningTest {
    pub gpu_index: u32,
    pub bdf: String,
    pub trigger: Trigger,
    pub recipe: String,
}

/// Everything the exporter shows about the test runner.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TestRunnerStats {
    /// Sorted by trigger, recipe, outcome.
    pub runs: Vec<RunCount>,
    /// Sorted by trigger, recipe.
    pub last: Vec<LastRun>,
    /// Sorted by GPU index.
    pub running: Vec<RunningTest>,
    /// Requests waiting for busy GPUs.
    pub queued: usize,
}

impl TestRunnerStats {
    /// Counts a finished test case.
    pub fn record(
        &mut self,
        trigger: Trigger,
        recipe: &str,
        outcome: Outcome,
        duration: Duration,
        finished_unix_seconds: f64,
        gpu_indexes: Vec<u32>,
    ) {
        match self
            .runs
            .iter_mut()
            .find(|r| r.trigger == trigger && r.recipe == recipe && r.outcome == outcome)
        {
            Some(r) => r.count += 1,
            None => self.runs.push(RunCount {
                trigger,
                recipe: recipe.to_owned(),
                outcome,
                count: 1,
            }),
        }
        self.runs.sort_by(|a, b| {
            (a.trigger, &a.recipe, a.outcome).cmp(&(b.trigger, &b.recipe, b.outcome))
        });
        let last = LastRun {
            trigger,
            recipe: recipe.to_owned(),
            outcome,
            duration_seconds: duration.as_secs_f64(),
            finished_unix_seconds,
            gpu_indexes,
        };
        match self
            .last
            .iter_mut()
            .find(|l| l.trigger == trigger && l.recipe == recipe)
        {
            Some(l) => *l = last,
            None => self.last.push(last),
        }
        self.last
            .sort_by(|a, b| (a.trigger, &a.recipe).cmp(&(b.trigger, &b.recipe)));
    }

    /// Marks GPUs as under test (`true`) or done.
    pub fn set_running(&mut self, tests: &[RunningTest], running: bool) {
        self.running.retain(|r| {
            !tests
                .iter()
                .any(|t| t.gpu_index == r.gpu_index && t.bdf == r.bdf)
        });
        if running {
            self.running.extend(tests.iter().cloned());
            self.running.sort_by_key(|r| r.gpu_index);
        }
    }

    /// How many test cases finished with `outcome`, over all triggers and recipes.
    pub fn total(&self, outcome: Outcome) -> u64 {
        self.runs
            .iter()
            .filter(|r| r.outcome == outcome)
            .map(|r| r.count)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_last_results() {
        let mut s = TestRunnerStats::default();
        s.record(
            Trigger::Manual,
            "mem",
            Outcome::Passed,
            Duration::from_secs(2),
            10.0,
            vec![0],
        );
        s.record(
            Trigger::Manual,
            "mem",
            Outcome::Passed,
            Duration::from_secs(3),
            20.0,
            vec![0],
        );
        s.record(
            Trigger::AutoUnhealthyGpuWatch,
            "gst_single",
            Outcome::Failed,
            Duration::from_secs(1),
            30.0,
            vec![1],
        );
        s.record(
            Trigger::Manual,
            "mem",
            Outcome::TimedOut,
            Duration::from_secs(9),
            40.0,
            vec![0],
        );
        assert_eq!(s.total(Outcome::Passed), 2);
        assert_eq!(s.total(Outcome::Failed), 1);
        assert_eq!(s.runs.len(), 3);
        assert_eq!(s.runs[0].trigger, Trigger::AutoUnhealthyGpuWatch);
        assert_eq!(s.last.len(), 2);
        let mem = s.last.iter().find(|l| l.recipe == "mem").unwrap();
        assert_eq!(mem.outcome, Outcome::TimedOut);
        assert_eq!(mem.duration_seconds, 9.0);
    }

    #[test]
    fn running_gpus() {
        let mut s = TestRunnerStats::default();
        let t = |i: u32| RunningTest {
            gpu_index: i,
            bdf: format!("b{i}"),
            trigger: Trigger::Manual,
            recipe: "mem".into(),
        };
        s.set_running(&[t(3), t(1)], true);
        assert_eq!(
            s.running.iter().map(|r| r.gpu_index).collect::<Vec<_>>(),
            [1, 3]
        );
        s.set_running(&[t(3)], false);
        assert_eq!(s.running, vec![t(1)]);
    }
}

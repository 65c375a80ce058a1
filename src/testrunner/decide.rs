//! Decisions, as pure functions over plain data: which test cases a trigger runs
//! on this node, whether the GPUs a request needs are free, and what a Node's
//! test-request annotation asks for.
//!
//! # One run per GPU
//!
//! A [`Request`] claims GPUs: one GPU for an unhealthy-GPU test, every GPU for
//! the other triggers. Requests whose GPUs are busy are **queued**, not
//! rejected, and start in arrival order: a request never overtakes an earlier
//! one it overlaps with, so a run covering all GPUs is not starved by a stream
//! of per-GPU runs. Disjoint requests run at the same time (two unhealthy GPUs
//! are tested in parallel). A request identical to one already queued or running
//! (same unhealthy GPU, same manual request, another periodic or pre-start run
//! while one is waiting) is dropped as a duplicate.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::config::{TestCase, TestConfig, Trigger, check_recipe};
use super::gpus::TargetGpu;

/// The Node annotation that asks for a test: its value is a recipe name.
pub const TEST_REQUEST_ANNOTATION: &str = "amd.com/gpu-test-request";

/// The Node annotation the runner sets in the same patch that removes a
/// handled request: a value unique to that handling (see [`ManualTracker`]).
pub const REQUEST_RECEIPT_ANNOTATION: &str = "testrunner.amd.com/request-handled";

/// The GPUs a request needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Every GPU of the node (as the inventory has them when the run starts).
    All,
    /// These GPUs, by PCI address.
    Gpus(BTreeSet<String>),
}

/// Something to test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub trigger: Trigger,
    pub target: Target,
    /// Run one after the other; each yields its own result.
    pub cases: Vec<TestCase>,
    /// The test-request annotation value this request answers.
    pub manual: Option<String>,
}

/// The test cases `trigger` runs on `node`; empty when the node's configuration
/// does not have that trigger.
pub fn cases_for(config: &TestConfig, node: &str, trigger: Trigger) -> Vec<TestCase> {
    config
        .trigger(node, trigger)
        .map(|t| t.test_cases.clone())
        .unwrap_or_default()
}

fn request(config: &TestConfig, node: &str, trigger: Trigger, target: Target) -> Option<Request> {
    let cases = cases_for(config, node, trigger);
    (!cases.is_empty()).then_some(Request {
        trigger,
        target,
        cases,
        manual: None,
    })
}

/// The test of a GPU the health monitor marked unhealthy.
pub fn unhealthy_request(config: &TestConfig, node: &str, bdf: &str) -> Option<Request> {
    request(
        config,
        node,
        Trigger::AutoUnhealthyGpuWatch,
        Target::Gpus([bdf.to_owned()].into()),
    )
}

/// The tests run once when the runner starts.
pub fn pre_start_request(config: &TestConfig, node: &str) -> Option<Request> {
    request(config, node, Trigger::PreStartJobCheck, Target::All)
}

/// The periodic tests.
pub fn periodic_request(config: &TestConfig, node: &str) -> Option<Request> {
    request(config, node, Trigger::Periodic, Target::All)
}

/// The test case a manual request for `recipe` runs: the node's MANUAL test case
/// of that recipe when there is one (with its iterations, timeout, arguments),
/// else the recipe with the reference's defaults.
pub fn manual_case(config: &TestConfig, node: &str, recipe: &str) -> Result<TestCase, String> {
    check_recipe(recipe)?;
    Ok(cases_for(config, node, Trigger::Manual)
        .into_iter()
        .find(|c| c.recipe == recipe)
        .unwrap_or_else(|| TestCase::new(recipe)))
}

/// The request a test-request annotation value makes.
pub fn manual_request(config: &TestConfig, node: &str, value: &str) -> Result<Request, String> {
    Ok(Request {
        trigger: Trigger::Manual,
        target: Target::All,
        cases: vec![manual_case(config, node, value)?],
        manual: Some(value.to_owned()),
    })
}

/// The GPUs one test case of a started run tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// In index order.
    pub gpus: Vec<TargetGpu>,
    /// Name the GPUs on the command line (`-i`); otherwise the tool tests every
    /// GPU itself, as the reference lets it.
    pub pass_ids: bool,
}

/// Picks the GPUs of `case` among the node's `gpus`: the request's own GPUs, or
/// for a whole-node request the case's `DeviceIDs` (all GPUs when empty). An
/// error says why nothing can be tested; it becomes a failed result, as the
/// reference reports a node without GPUs.
pub fn select_gpus(
    target: &Target,
    case: &TestCase,
    gpus: &[TargetGpu],
) -> Result<Selection, String> {
    let mut sorted: Vec<TargetGpu> = gpus.to_vec();
    sorted.sort_by_key(|g| g.index);
    match target {
        Target::Gpus(wanted) => {
            let found: Vec<TargetGpu> = sorted
                .into_iter()
                .filter(|g| wanted.contains(&g.bdf))
                .collect();
            if found.is_empty() {
                return Err(format!(
                    "GPU {} not found",
                    wanted.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
            Ok(Selection {
                gpus: found,
                pass_ids: true,
            })
        }
        Target::All if !case.device_ids.is_empty() => {
            let found: Vec<TargetGpu> = sorted
                .into_iter()
                .filter(|g| case.device_ids.contains(&g.index))
                .collect();
            if found.is_empty() {
                return Err(format!("No GPU matches DeviceIDs {:?}", case.device_ids));
            }
            Ok(Selection {
                gpus: found,
                pass_ids: true,
            })
        }
        Target::All if sorted.is_empty() => Err("No GPU detected".into()),
        Target::All => Ok(Selection {
            gpus: sorted,
            pass_ids: false,
        }),
    }
}

/// Identifies a started run.
pub type RunId = u64;

/// A request that may start now, with the GPUs it claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub id: RunId,
    pub request: Request,
    /// The claimed GPUs (for [`Target::All`], every GPU there was).
    pub gpus: BTreeSet<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Claim {
    trigger: Trigger,
    all: bool,
    gpus: BTreeSet<String>,
    manual: Option<String>,
}

impl Claim {
    fn of(request: &Request, gpus: BTreeSet<String>) -> Self {
        Self {
            trigger: request.trigger,
            all: request.target == Target::All,
            gpus,
            manual: request.manual.clone(),
        }
    }

    fn overlaps(&self, other: &Claim) -> bool {
        self.all || other.all || !self.gpus.is_disjoint(&other.gpus)
    }
}

/// What [`Scheduler::submit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitted {
    Queued,
    /// The same test is already queued or running.
    Duplicate,
}

/// Queued and running requests; enforces one run per GPU.
#[derive(Clone, Debug, Default)]
pub struct Scheduler {
    queue: VecDeque<Request>,
    running: BTreeMap<RunId, Claim>,
    next_id: RunId,
}

impl Scheduler {
    /// Queues a request unless it duplicates one queued or running.
    pub fn submit(&mut self, request: Request) -> Submitted {
        let claim = Claim::of(&request, target_gpus(&request.target));
        // (claim, is running) of everything queued or running.
        let mut existing = self
            .queue
            .iter()
            .map(|r| (Claim::of(r, target_gpus(&r.target)), false))
            .chain(self.running.values().map(|c| (c.clone(), true)));
        let duplicate = match request.trigger {
            // The same unhealthy GPU, already waiting or being tested.
            Trigger::AutoUnhealthyGpuWatch => existing
                .any(|(c, _)| c.trigger == request.trigger && !c.gpus.is_disjoint(&claim.gpus)),
            // The same annotation value, already waiting or running.
            Trigger::Manual => {
                request.manual.is_some() && existing.any(|(c, _)| c.manual == request.manual)
            }
            // One waiting run is enough; a running one does not count, so the
            // next period still gets its run.
            Trigger::Periodic | Trigger::PreStartJobCheck => {
                existing.any(|(c, running)| !running && c.trigger == request.trigger)
            }
        };
        if duplicate {
            return Submitted::Duplicate;
        }
        self.queue.push_back(request);
        Submitted::Queued
    }

    /// Starts what can start, in arrival order, given the node's GPUs now.
    pub fn start_ready(&mut self, node_gpus: &BTreeSet<String>) -> Vec<Start> {
        let mut blocked: Vec<Claim> = self.running.values().cloned().collect();
        let mut starts = Vec::new();
        let mut waiting = VecDeque::new();
        while let Some(request) = self.queue.pop_front() {
            let gpus = match &request.target {
                Target::All => node_gpus.clone(),
                Target::Gpus(gpus) => gpus.clone(),
            };
            let claim = Claim::of(&request, gpus.clone());
            if blocked.iter().any(|b| b.overlaps(&claim)) {
                // Later requests must not overtake this one on its GPUs.
                blocked.push(claim);
                waiting.push_back(request);
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            blocked.push(claim.clone());
            self.running.insert(id, claim);
            starts.push(Start { id, request, gpus });
        }
        self.queue = waiting;
        starts
    }

    /// Releases a finished run's GPUs.
    pub fn finish(&mut self, id: RunId) {
        self.running.remove(&id);
    }

    /// GPUs with a run on them now.
    pub fn busy(&self) -> BTreeSet<String> {
        self.running
            .values()
            .flat_map(|c| c.gpus.iter().cloned())
            .collect()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Annotation values whose request is queued or running.
    pub fn manual_in_flight(&self) -> BTreeSet<String> {
        self.queue
            .iter()
            .filter_map(|r| r.manual.clone())
            .chain(self.running.values().filter_map(|c| c.manual.clone()))
            .collect()
    }
}

fn target_gpus(target: &Target) -> BTreeSet<String> {
    match target {
        Target::All => BTreeSet::new(),
        Target::Gpus(gpus) => gpus.clone(),
    }
}

/// Follows the test-request annotation so that each request runs once.
///
/// After a run the runner removes the annotation (only if it still holds the
/// value that ran: a JSON Patch `test` operation guards the removal, so a newer
/// request set meanwhile is kept and runs next), and in the same patch sets
/// [`REQUEST_RECEIPT_ANNOTATION`] to a value unique to that handling. The
/// agent's Node watch keeps only the latest copy, and copies from before the
/// removal may still arrive after it: a copy still showing the old value is
/// stale while it lacks the receipt (it was written before the removal), and
/// is the same recipe requested again once it carries it. No resourceVersion
/// is compared: Kubernetes defines them as opaque.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ManualTracker {
    handled: Option<Handled>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Handled {
    value: String,
    /// The receipt written with the removal; `None` when the annotation could
    /// not be removed.
    receipt: Option<String>,
}

impl ManualTracker {
    /// Looks at a copy of the Node (the request `annotation` and the
    /// `receipt` annotation) and returns the value to request now, if any.
    pub fn observe(
        &mut self,
        annotation: Option<&str>,
        receipt: Option<&str>,
        in_flight: &BTreeSet<String>,
    ) -> Option<String> {
        // The raw value is kept: removing the annotation later tests for it.
        let Some(value) = annotation.filter(|v| !v.trim().is_empty()) else {
            self.handled = None;
            return None;
        };
        if in_flight.contains(value) {
            return None;
        }
        if let Some(handled) = &self.handled
            && handled.value == value
        {
            let after_removal = handled.receipt.is_some() && handled.receipt.as_deref() == receipt;
            if !after_removal {
                return None;
            }
        }
        self.handled = None;
        Some(value.to_owned())
    }

    /// Records that the request `value` was handled; `receipt` is what the
    /// removal wrote, if the annotation was removed.
    pub fn handled(&mut self, value: String, receipt: Option<String>) {
        self.handled = Some(Handled { value, receipt });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testrunner::config::parse_config;

    fn gpus(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn auto(bdf: &str) -> Request {
        Request {
            trigger: Trigger::AutoUnhealthyGpuWatch,
            target: Target::Gpus(gpus(&[bdf])),
            cases: vec![TestCase::new("gst_single")],
            manual: None,
        }
    }

    fn all(trigger: Trigger) -> Request {
        Request {
            trigger,
            target: Target::All,
            cases: vec![TestCase::new("babel")],
            manual: None,
        }
    }

    const NODE_GPUS: [&str; 3] = ["a", "b", "c"];

    #[test]
    fn triggers_select_the_nodes_test_cases() {
        let config = parse_config(
            r#"{"TestConfig":{"GPU_HEALTH_CHECK":{"TestLocationTrigger":{
                "global":{"TestParameters":{"AUTO_UNHEALTHY_GPU_WATCH":{"TestCases":[{"Recipe":"gst_single"}]},
                                             "MANUAL":{"TestCases":[{"Recipe":"mem","Iterations":4}]},
                                             "PRE_START_JOB_CHECK":{"TestCases":[{"Recipe":"babel"},{"Recipe":"iet_single"}]}}},
                "n2":{"TestParameters":{"PERIODIC":{"IntervalSeconds":60,"TestCases":[{"Recipe":"pebb_single"}]}}}}}}}"#,
        )
        .unwrap()
        .config;
        let r = unhealthy_request(&config, "n1", "0000:05:00.0").unwrap();
        assert_eq!(r.target, Target::Gpus(gpus(&["0000:05:00.0"])));
        assert_eq!(r.cases[0].recipe, "gst_single");
        assert_eq!(
            pre_start_request(&config, "n1")
                .unwrap()
                .cases
                .iter()
                .map(|c| c.recipe.as_str())
                .collect::<Vec<_>>(),
            ["babel", "iet_single"]
        );
        assert!(periodic_request(&config, "n1").is_none());
        // n2 has its own entry: only its periodic test.
        assert!(unhealthy_request(&config, "n2", "x").is_none());
        assert_eq!(
            periodic_request(&config, "n2").unwrap().cases[0].recipe,
            "pebb_single"
        );

        // A manual request takes the MANUAL parameters of its recipe, or defaults.
        let m = manual_request(&config, "n1", "mem").unwrap();
        assert_eq!(m.cases[0].iterations, 4);
        assert_eq!(m.manual.as_deref(), Some("mem"));
        let m = manual_request(&config, "n1", "babel").unwrap();
        assert_eq!(m.cases[0], TestCase::new("babel"));
        assert!(manual_request(&config, "n1", "../../bin/sh").is_err());
    }

    #[test]
    fn one_run_per_gpu_and_queued_in_order() {
        let mut s = Scheduler::default();
        let node = gpus(&NODE_GPUS);
        assert_eq!(s.submit(auto("a")), Submitted::Queued);
        assert_eq!(s.submit(auto("b")), Submitted::Queued);
        let started = s.start_ready(&node);
        assert_eq!(started.len(), 2, "disjoint GPUs run in parallel");
        assert_eq!(s.busy(), gpus(&["a", "b"]));

        // An all-GPU run waits for both, and a later per-GPU run on a free GPU
        // must not overtake it.
        s.submit(all(Trigger::Manual));
        s.submit(auto("c"));
        assert!(s.start_ready(&node).is_empty());
        assert_eq!(s.queued(), 2);
        s.finish(started[0].id);
        assert!(s.start_ready(&node).is_empty(), "b is still busy");
        s.finish(started[1].id);
        let next = s.start_ready(&node);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].request.trigger, Trigger::Manual);
        assert_eq!(next[0].gpus, node);
        assert!(
            s.start_ready(&node).is_empty(),
            "c waits for the all-GPU run"
        );
        s.finish(next[0].id);
        let last = s.start_ready(&node);
        assert_eq!(last[0].gpus, gpus(&["c"]));
        assert_eq!(s.running(), 1);
    }

    #[test]
    fn duplicates_are_dropped() {
        let mut s = Scheduler::default();
        let node = gpus(&NODE_GPUS);
        assert_eq!(s.submit(auto("a")), Submitted::Queued);
        assert_eq!(s.submit(auto("a")), Submitted::Duplicate);
        let started = s.start_ready(&node);
        assert_eq!(s.submit(auto("a")), Submitted::Duplicate, "already running");
        s.finish(started[0].id);
        assert_eq!(s.submit(auto("a")), Submitted::Queued, "a new episode");

        let manual = |v: &str| Request {
            manual: Some(v.to_owned()),
            ..all(Trigger::Manual)
        };
        assert_eq!(s.submit(manual("babel")), Submitted::Queued);
        assert_eq!(s.submit(manual("babel")), Submitted::Duplicate);
        assert_eq!(s.submit(manual("mem")), Submitted::Queued);
        assert_eq!(s.manual_in_flight(), gpus(&["babel", "mem"]));

        assert_eq!(s.submit(all(Trigger::Periodic)), Submitted::Queued);
        assert_eq!(s.submit(all(Trigger::Periodic)), Submitted::Duplicate);
    }

    #[test]
    fn a_running_periodic_run_does_not_swallow_the_next() {
        let mut s = Scheduler::default();
        let node = gpus(&NODE_GPUS);
        s.submit(all(Trigger::Periodic));
        let first = s.start_ready(&node);
        assert_eq!(s.submit(all(Trigger::Periodic)), Submitted::Queued);
        assert!(s.start_ready(&node).is_empty());
        s.finish(first[0].id);
        assert_eq!(s.start_ready(&node).len(), 1);
    }

    #[test]
    fn gpu_selection() {
        let target = |bdf: &str, index: u32| TargetGpu {
            bdf: bdf.into(),
            index,
            kfd_id: None,
            model: None,
        };
        let node = vec![target("b", 1), target("a", 0), target("c", 2)];
        let case = TestCase::new("gst_single");
        let all = select_gpus(&Target::All, &case, &node).unwrap();
        assert_eq!(
            all.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert!(!all.pass_ids);
        let one = select_gpus(&Target::Gpus(gpus(&["c"])), &case, &node).unwrap();
        assert_eq!(one.gpus, vec![target("c", 2)]);
        assert!(one.pass_ids);
        let picked = TestCase {
            device_ids: vec![2, 0, 7],
            ..case.clone()
        };
        let some = select_gpus(&Target::All, &picked, &node).unwrap();
        assert_eq!(
            some.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            [0, 2]
        );
        assert!(some.pass_ids);
        let none = TestCase {
            device_ids: vec![9],
            ..case.clone()
        };
        assert!(
            select_gpus(&Target::All, &none, &node)
                .unwrap_err()
                .contains("DeviceIDs")
        );
        assert_eq!(
            select_gpus(&Target::All, &case, &[]).unwrap_err(),
            "No GPU detected"
        );
        assert!(
            select_gpus(&Target::Gpus(gpus(&["z"])), &case, &node)
                .unwrap_err()
                .contains("z")
        );
    }

    #[test]
    fn manual_requests_run_once() {
        let mut t = ManualTracker::default();
        let none = BTreeSet::new();
        assert_eq!(t.observe(None, None, &none), None);
        assert_eq!(t.observe(Some("  "), None, &none), None);
        assert_eq!(
            t.observe(Some("babel"), Some("r0"), &none),
            Some("babel".into())
        );
        // While queued or running, later copies do not ask again.
        assert_eq!(
            t.observe(Some("babel"), Some("r0"), &gpus(&["babel"])),
            None
        );
        // Done; the removal wrote receipt r1. Copies from before it (an older
        // receipt, or none) are stale.
        t.handled("babel".into(), Some("r1".into()));
        assert_eq!(
            t.observe(Some("babel"), Some("r0"), &none),
            None,
            "stale copy"
        );
        assert_eq!(t.observe(Some("babel"), None, &none), None, "stale copy");
        assert_eq!(
            t.observe(Some("babel"), Some("r1"), &none),
            Some("babel".into()),
            "set again after the removal"
        );
        // Not removed (a newer request replaced it): the old value never reruns,
        // a different one does.
        t.handled("babel".into(), None);
        assert_eq!(t.observe(Some("babel"), Some("r1"), &none), None);
        assert_eq!(t.observe(Some("babel"), None, &none), None);
        assert_eq!(
            t.observe(Some("mem"), Some("r1"), &none),
            Some("mem".into())
        );
        // Seeing the annotation gone forgets the history.
        t.handled("mem".into(), None);
        assert_eq!(t.observe(None, Some("r1"), &none), None);
        assert_eq!(
            t.observe(Some("mem"), Some("r1"), &none),
            Some("mem".into())
        );
    }
}

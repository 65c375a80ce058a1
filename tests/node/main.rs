//! The node services on their own (discovery, device plugin, health monitor,
//! metrics exporter, test runner) and the simulator's CLI, in one test
//! binary: one link instead of eleven, each linking the whole crate. Nothing
//! here changes process-wide state, so the modules share a process; tests
//! that do (an rlimit, memory peaks, global counters) and those that other
//! documents name by path stay in tests/*.rs.

#[path = "../fixtures/testrunner/fake_rvs.rs"]
mod fake_rvs;
#[path = "../support/mod.rs"]
mod support;

mod discovery;
mod discovery_captures;
mod health_monitor;
mod health_plugin;
mod metrics_exporter;
mod metrics_rbac;
mod partition_cli;
mod plugin_kubelet;
mod plugin_lifecycle;
mod plugin_sharing;
mod simulate_cli;
mod testrunner_runner;
mod testrunner_service;

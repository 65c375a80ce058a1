//! Helpers shared by the integration tests: a test kubelet speaking the device
//! plugin API on unix sockets, simulated hosts, a cluster (the API emulator
//! with the CRD, namespace and Nodes), and waiting on evidence.
//!
//! Each test binary uses a different subset, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod agent_config;
pub mod bundles;
pub mod cluster;
pub mod dra_kubelet;
pub mod dra_scheduler;
pub mod fixtures;
pub mod helm;
pub mod hosts;
pub mod http;
pub mod jobs;
pub mod kubelet;
pub mod kubelet_node;
pub mod logged;
pub mod metricssvc;
pub mod node_rig;
pub mod pod_resources;
pub mod promtool;
pub mod rig;
pub mod tools;
pub mod wait;

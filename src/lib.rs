//! gpu-operator: one binary that runs AMD GPUs on Kubernetes and on bare metal.
//!
//! Every capability is a module of its own. Each module opens with a note on what
//! it owns and what it must not do. The binary (`main.rs`) only parses the command
//! line and hands over to [`cli`].

pub mod agent;
pub mod api;
pub mod cli;
pub mod cluster;
pub mod command;
pub mod counters;
pub mod detect;
pub mod device;
pub mod dra;
pub mod driver;
pub mod events;
pub mod health;
pub mod host;
pub mod labeller;
pub mod metrics;
pub mod metricssvc;
pub mod node_writer;
pub mod partition;
pub mod plugin;
pub mod pod_resources;
pub mod remediation;
pub mod service;
pub mod simulate;
pub mod telemetry;
pub mod testrunner;

//! gpu-operator: one binary that runs AMD GPUs on Kubernetes and on bare metal.
//!
//! Every capability is a module of its own. Each module opens with a note on what
//! it owns and what it must not do. The binary (`main.rs`) only parses the command
//! line and hands over to [`cli`].
//!
//! The two lowest layers are crates of their own, so that the compiler keeps
//! them from importing anything above them: [`api`] (`crates/api`, no
//! `unsafe` at all) and [`host`] (`crates/host`). They are re-exported here
//! under their module names, so `crate::api::…` and `gpu_operator::host::…`
//! read as before.

pub use gpu_operator_api as api;
pub use gpu_operator_host as host;

pub mod agent;
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

//! GPU telemetry from sysfs: what the GPUs report, sampled within deadlines,
//! and the vocabulary of AMD's device-metrics-exporter for it.
//!
//! - [`sample`]: one sample of every GPU (power, temperatures, ECC, PCIe,
//!   memory, clocks, activity), read through the host's deadline-bounded
//!   [`crate::host::reader::BoundedReader`], so a hung file costs one value;
//!   [`sysfs`]: the pure parsing of the files it reads; [`gpu_metrics`]: of
//!   the binary `gpu_metrics` table.
//! - [`devices`]: the logical GPUs (whole GPUs and partitions) a sample is
//!   reported for, with the device plugin's device IDs.
//! - [`config`]: the exporter's `config.json` (fields, labels and the
//!   `HealthThresholds` the health checks use); [`fields`]: the catalogue of
//!   fields it names.
//!
//! Both the health monitor and the metrics exporter read GPUs through this
//! module, which sits below both, so that neither imports the other. It must
//! not decide health, serve or render metrics, or talk to the Kubernetes API.

pub mod config;
pub mod devices;
pub mod fields;
pub mod gpu_metrics;
pub mod sample;
pub mod sysfs;

pub use config::ConfigError;

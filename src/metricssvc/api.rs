//! The reference exporter's health API, generated from
//! `proto/metricssvc/metricssvc.proto` by `build.rs`.
//!
//! Generated code only; [`super::rpc`] serves it.

#![allow(clippy::all, missing_docs)]

/// Messages, `metrics_service_server` and `metrics_service_client`
/// (`metricssvc.MetricsService`).
pub mod metricssvc {
    include!(concat!(env!("OUT_DIR"), "/metricssvc/metricssvc.rs"));
}

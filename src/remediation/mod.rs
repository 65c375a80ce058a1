//! Node remediation, the domain: the reference's condition-to-workflow
//! mapping ([`mapping`]), the record the leader keeps on each Node
//! ([`record`]), and the decisions ([`plan`]): which run starts, what the
//! next step of each is, when the circuit breaker holds them all. Pure.
//!
//! The leader carries the decisions out (`cluster::remediator`: taints,
//! labels, drains, Events, status); the agent reboots and runs the
//! validation tests when the record asks (`agent::remediation`). This module
//! must not do I/O or read the clock.

pub mod mapping;
pub mod plan;
pub mod record;

pub use mapping::{Entry, Mapping};
pub use plan::{Decision, NodeFacts, NodeStep, Policy};
pub use record::{Phase, RECORD_ANNOTATION, Record, Run};

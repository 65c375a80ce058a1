//! The DeviceConfig API (`amd.com/v1alpha1`, kind `DeviceConfig`): types, CRD,
//! validation and the `crd` / `validate` subcommands.
//!
//! Administrators' DeviceConfig YAML written for AMD's GPU Operator applies here
//! unchanged and means the same thing. This module owns that contract: the wire
//! format ([`types`]), what fields mean in this design ([`semantics`]), which
//! specs are acceptable ([`validate`]), the CRD ([`crd`]) and reading YAML
//! ([`yaml`]).
//!
//! Everything here is pure: no cluster access, no host access. Checks that need
//! the cluster (referenced Secrets and ConfigMaps exist) belong to the reconciler.
//!
//! It also holds what both the node agent and the leader must agree on: the
//! status annotation ([`agent_status`]), the record of a node's driver
//! upgrade ([`driver_upgrade`]) and the field-manager names
//! ([`field_manager`]). It is the bottom of the module order: a crate of
//! its own (`gpu-operator-api`, re-exported by `gpu-operator` as `api`), so
//! it cannot import the crates above it, and it has no `unsafe` code.

#![forbid(unsafe_code)]

pub mod agent_status;
pub mod cli;
pub mod crd;
pub mod driver_upgrade;
pub mod enums;
pub mod field_manager;
pub mod modprobe;
pub mod remediation_status;
pub mod semantics;
pub mod syntax;
pub mod tracked;
pub mod types;
pub mod validate;
pub mod yaml;

pub use crd::{crd, crd_yaml};
pub use enums::{DriverType, PullPolicy, ServiceType, TlsVersion, UpgradeState, UpgradeStrategy};
pub use semantics::{
    AbsentSection, NodeLabellerKind, Operand, ResourceNamingStrategy, TimeSlicing,
    selector_matches, selects_node,
};
pub use types::*;
pub use validate::{
    IgnoredField, NOT_ACTED_ON_YET, Problem, document_problems, ignored_field_notes,
    ignored_fields, validate,
};
pub use yaml::{
    Document, DocumentKind, ParseError, SpecDocument, parse_device_configs, parse_documents,
    parse_specs, to_yaml,
};

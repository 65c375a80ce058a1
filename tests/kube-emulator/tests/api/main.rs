//! The emulator's API semantics (CRUD, CRDs, eviction, field validation,
//! server-side apply, watch, admission policies) in one test binary: one
//! link instead of seven.
//! Every test starts its own emulator on its own port. `faults` (named by
//! the operator's README) and `kubectl` (run by name) keep their binaries.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod api_semantics;
mod crd;
mod eviction;
mod field_validation;
mod rbac;
mod server_side_apply;
mod watch;

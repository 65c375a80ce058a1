//! The API types, the CRD, `validate` and the `api` CLI, in one test binary:
//! one link instead of four. Nothing here changes process-wide state, so the
//! modules share a process; tests that do (rlimits, memory peaks, exact
//! global counters) have binaries of their own in tests/*.rs.

mod cli;
mod crd;
mod types;
mod validate;

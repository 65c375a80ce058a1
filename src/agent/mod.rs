//! The node agent: finds its Node, works out which DeviceConfig selects it, and
//! runs the node services that DeviceConfig enables.
pub mod supervisor;

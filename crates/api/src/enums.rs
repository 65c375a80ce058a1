//! String enums of the DeviceConfig API that keep unknown values.
//!
//! Every enum here parses any string: a value outside the known set lands in
//! `Other(..)` and is written back verbatim. That is deliberate. A DeviceConfig
//! file with a bad enum value must still parse, so that `validate` can report
//! the problem with its field path (and every other problem with it) instead of
//! stopping at the first one. The CRD schema still lists the known values, so the
//! API server rejects unknown ones exactly as it does for the reference.
//!
//! This module must not hold any other logic: meaning lives in `semantics`.

use std::fmt;

/// Declares a string enum with a catch-all `Other(String)` variant, its serde
/// impls (as a plain string), and a JSON schema that lists the known values.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value outside the known set, kept verbatim so that it round-trips.
            /// `validate` reports it.
            Other(String),
        }

        impl $name {
            /// The spellings the API accepts, in schema order.
            pub const KNOWN: &'static [&'static str] = &[$($text),+];

            /// The value as written in YAML.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $text, )+
                    Self::Other(other) => other,
                }
            }

            /// Whether the value is one of [`Self::KNOWN`].
            pub fn is_known(&self) -> bool {
                !matches!(self, Self::Other(_))
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                match text {
                    $( $text => Self::$variant, )+
                    other => Self::Other(other.to_string()),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Ok(Self::from(text.as_str()))
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "enum": [$($text),+],
                })
            }
        }
    };
}

string_enum! {
    /// Which kind of driver the node gets (`spec.driver.driverType`).
    #[derive(Default)]
    pub enum DriverType {
        /// The amdgpu kernel driver, for bare-metal GPU nodes and guest VMs.
        #[default]
        Container = "container",
        /// The MxGPU GIM driver on the host creates virtual functions, which are bound to vfio-pci.
        VfPassthrough = "vf-passthrough",
        /// Physical functions are bound to vfio-pci directly.
        PfPassthrough = "pf-passthrough",
    }
}

string_enum! {
    /// A container image pull policy (accepted and kept; ignored in this design).
    pub enum PullPolicy {
        Always = "Always",
        IfNotPresent = "IfNotPresent",
        Never = "Never",
    }
}

string_enum! {
    /// A DaemonSet update strategy (accepted and kept; ignored in this design).
    pub enum UpgradeStrategy {
        RollingUpdate = "RollingUpdate",
        OnDelete = "OnDelete",
    }
}

string_enum! {
    /// How the metrics endpoint is exposed (`spec.metricsExporter.serviceType`).
    #[derive(Default)]
    pub enum ServiceType {
        #[default]
        ClusterIP = "ClusterIP",
        NodePort = "NodePort",
    }
}

string_enum! {
    /// A TLS protocol version as the Prometheus operator spells it.
    pub enum TlsVersion {
        Tls10 = "TLS10",
        Tls11 = "TLS11",
        Tls12 = "TLS12",
        Tls13 = "TLS13",
    }
}

/// The relabel actions the Prometheus operator accepts, in both spellings.
pub const RELABEL_ACTIONS: &[&str] = &[
    "replace",
    "Replace",
    "keep",
    "Keep",
    "drop",
    "Drop",
    "hashmod",
    "HashMod",
    "labelmap",
    "LabelMap",
    "labeldrop",
    "LabelDrop",
    "labelkeep",
    "LabelKeep",
    "lowercase",
    "Lowercase",
    "uppercase",
    "Uppercase",
    "keepequal",
    "KeepEqual",
    "dropequal",
    "DropEqual",
];

/// Taint effects Kubernetes accepts.
pub const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

string_enum! {
    /// Where a node is in a driver upgrade (`status.nodeModuleStatus.*.status`).
    pub enum UpgradeState {
        NotStarted = "Upgrade-Not-Started",
        Started = "Upgrade-Started",
        InstallInProgress = "Install-In-Progress",
        InstallComplete = "Install-Complete",
        InProgress = "Upgrade-In-Progress",
        Complete = "Upgrade-Complete",
        Failed = "Upgrade-Failed",
        TimedOut = "Upgrade-Timed-Out",
        CordonFailed = "Cordon-Failed",
        UncordonFailed = "Uncordon-Failed",
        DrainFailed = "Drain-Failed",
        RebootInProgress = "Reboot-In-Progress",
        RebootFailed = "Reboot-Failed",
    }
}

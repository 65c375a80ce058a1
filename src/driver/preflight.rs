//! The preflight an administrator runs before rebooting into a new kernel:
//! is there a bundle for that kernel in the store, and does it verify?
//!
//! It owns the answer ([`Preflight`]) and the exit status it means; finding
//! and verifying bundles is [`bundle`]'s, printing is the command line's.

use serde::{Serialize, Serializer};

use super::bundle::{self, Expected, Refusal, Verified};
use crate::host::HostRoot;

/// Where bundles are kept on a host when no other directory is given: one
/// directory per bundle (e.g. `6.12.12-6.8.0-49-generic/`).
pub const DEFAULT_STORE: &str = "/var/lib/gpu-operator/drivers";

/// One bundle's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleCheck {
    pub dir: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<Verified>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<RefusalView>,
}

/// A refusal as JSON shows it: its reason and the message for a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusalView(pub Refusal);

impl Serialize for RefusalView {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde_json::json!({"reason": self.0.reason(), "message": self.0.to_string()})
            .serialize(serializer)
    }
}

/// The preflight's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preflight {
    pub kernel_release: String,
    pub store: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub signature_required: bool,
    /// Every bundle for the kernel, in directory order.
    pub bundles: Vec<BundleCheck>,
    /// Why the check failed as a whole, when no bundle verified:
    /// `BundleMissingForKernel` when there was none to verify, else the
    /// first bundle's refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<RefusalView>,
}

impl Preflight {
    /// The first bundle that verified: the one the agent would load.
    pub fn usable(&self) -> Option<&Verified> {
        self.bundles.iter().find_map(|b| b.verified.as_ref())
    }

    pub fn ok(&self) -> bool {
        self.usable().is_some()
    }
}

/// Finds and verifies every bundle for `expected.kernel_release` in `store`
/// (a host path). `Err` only when the store itself cannot be read.
pub fn preflight(host: &HostRoot, store: &str, expected: &Expected) -> Result<Preflight, Refusal> {
    let dirs = bundle::find(host, store, &expected.kernel_release)?;
    let bundles: Vec<BundleCheck> = dirs
        .into_iter()
        .map(|dir| match bundle::verify(host, &dir, expected) {
            Ok(verified) => BundleCheck {
                dir,
                verified: Some(verified),
                refused: None,
            },
            Err(refusal) => BundleCheck {
                dir,
                verified: None,
                refused: Some(RefusalView(refusal)),
            },
        })
        .collect();
    Ok(summarize(store, expected, bundles))
}

/// The whole answer from each bundle's. Pure.
pub fn summarize(store: &str, expected: &Expected, bundles: Vec<BundleCheck>) -> Preflight {
    let verified = bundles.iter().any(|b| b.verified.is_some());
    let refused = if verified {
        None
    } else {
        Some(
            bundles
                .iter()
                .find_map(|b| b.refused.clone())
                .unwrap_or_else(|| {
                    RefusalView(Refusal::BundleMissingForKernel {
                        kernel_release: expected.kernel_release.clone(),
                        searched: store.to_owned(),
                    })
                }),
        )
    };
    Preflight {
        kernel_release: expected.kernel_release.clone(),
        store: store.to_owned(),
        version: expected.version.clone(),
        signature_required: expected.signature_required,
        bundles,
        refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected() -> Expected {
        Expected {
            kernel_release: "6.8.0".into(),
            version: None,
            signature_required: false,
        }
    }

    fn verified(dir: &str) -> BundleCheck {
        BundleCheck {
            dir: dir.into(),
            verified: Some(Verified {
                dir: dir.into(),
                version: "6.12.12".into(),
                kernel_release: "6.8.0".into(),
                module: "lib/modules/6.8.0/amdgpu.ko".into(),
                files: 3,
                bytes: 10,
                signatures_checked: false,
            }),
            refused: None,
        }
    }

    fn refused(dir: &str) -> BundleCheck {
        BundleCheck {
            dir: dir.into(),
            verified: None,
            refused: Some(RefusalView(Refusal::UnsignedModule {
                path: format!("{dir}/amdgpu.ko"),
            })),
        }
    }

    #[test]
    fn one_verified_bundle_is_enough_and_none_names_the_reason() {
        let none = summarize("/s", &expected(), vec![]);
        assert!(!none.ok());
        assert_eq!(
            none.refused.as_ref().map(|r| r.0.reason()),
            Some("BundleMissingForKernel")
        );

        let bad = summarize("/s", &expected(), vec![refused("/s/a")]);
        assert!(!bad.ok());
        assert_eq!(
            bad.refused.as_ref().map(|r| r.0.reason()),
            Some("UnsignedModule")
        );

        let mixed = summarize("/s", &expected(), vec![refused("/s/a"), verified("/s/b")]);
        assert!(mixed.ok() && mixed.refused.is_none());
        assert_eq!(mixed.usable().map(|v| v.dir.as_str()), Some("/s/b"));

        let json = serde_json::to_value(&bad).unwrap();
        assert_eq!(json["refused"]["reason"], "UnsignedModule");
        assert_eq!(json["bundles"][0]["refused"]["reason"], "UnsignedModule");
        assert!(
            json["bundles"][0]["refused"]["message"]
                .as_str()
                .unwrap()
                .contains("/s/a/amdgpu.ko")
        );
    }
}

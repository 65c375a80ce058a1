//! Partition modes as the amdgpu driver names and pairs them: how many
//! partitions a compute mode makes, how many memory domains a memory mode
//! makes, and which pairs the driver accepts.
//!
//! Facts, from the kernel's MI300 partition code (`aqua_vanjaram.c`, the
//! compatible-NPS table): SPX runs only with NPS1; DPX with NPS1 or NPS2;
//! TPX, QPX and CPX with NPS1 or NPS4. A pair is possible on a given GPU
//! only when both modes are also in its `available_*_partition` lists.
//!
//! Pure; spellings are matched without regard to case, as the kernel does
//! (`SPX` and `spx` are the same mode). Both the simulated driver and the
//! partition planner use these, so that they never disagree.

/// The sysfs attribute of a GPU's PCI function holding its compute mode.
pub const COMPUTE_ATTR: &str = "current_compute_partition";
/// The sysfs attribute holding its memory mode.
pub const MEMORY_ATTR: &str = "current_memory_partition";

/// Partitions a compute mode makes of one GPU (`None` for an unknown mode).
pub fn compute_partitions(mode: &str) -> Option<u32> {
    match mode.trim().to_ascii_uppercase().as_str() {
        "SPX" => Some(1),
        "DPX" => Some(2),
        "TPX" => Some(3),
        "QPX" => Some(4),
        "CPX" => Some(8),
        _ => None,
    }
}

/// Memory domains of a memory mode (`NPS4` has four; `None` if unknown).
pub fn memory_domains(mode: &str) -> Option<u32> {
    mode.trim()
        .to_ascii_uppercase()
        .strip_prefix("NPS")
        .and_then(|n| n.parse().ok())
        .filter(|n| [1, 2, 3, 4, 6, 8].contains(n))
}

/// Whether the driver runs compute mode `compute` with memory mode `memory`.
pub fn compatible(compute: &str, memory: &str) -> bool {
    let Some(domains) = memory_domains(memory) else {
        return false;
    };
    match compute.trim().to_ascii_uppercase().as_str() {
        "SPX" => domains == 1,
        "DPX" => matches!(domains, 1 | 2),
        "TPX" | "QPX" | "CPX" => matches!(domains, 1 | 4),
        _ => false,
    }
}

/// Whether `mode` is in `available` (a GPU's `available_*_partition`
/// entries), ignoring case.
pub fn offered<S: AsRef<str>>(available: &[S], mode: &str) -> bool {
    available
        .iter()
        .any(|m| m.as_ref().eq_ignore_ascii_case(mode.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_count_partitions_and_domains_in_any_case() {
        assert_eq!(compute_partitions("cpx"), Some(8));
        assert_eq!(compute_partitions("SPX\n"), Some(1));
        assert_eq!(compute_partitions("QPX"), Some(4));
        assert_eq!(compute_partitions("XPX"), None);
        assert_eq!(memory_domains("nps4"), Some(4));
        assert_eq!(memory_domains("NPS5"), None);
        assert_eq!(memory_domains("4"), None);
    }

    #[test]
    fn pairs_follow_the_kernels_table() {
        for (compute, memory, ok) in [
            ("SPX", "NPS1", true),
            ("SPX", "NPS4", false),
            ("DPX", "NPS2", true),
            ("DPX", "NPS4", false),
            ("QPX", "NPS4", true),
            ("QPX", "NPS2", false),
            ("CPX", "NPS1", true),
            ("cpx", "nps4", true),
            ("CPX", "NPS8", false),
            ("CPX", "bogus", false),
        ] {
            assert_eq!(compatible(compute, memory), ok, "{compute}+{memory}");
        }
    }

    #[test]
    fn offered_ignores_case_and_white_space() {
        let available = vec!["SPX".to_owned(), "CPX".to_owned()];
        assert!(offered(&available, "cpx\n"));
        assert!(!offered(&available, "QPX"));
    }
}

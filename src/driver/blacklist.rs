//! `spec.driver.blacklist`: keeps the in-box amdgpu from loading at boot, so
//! that the bundle's module is the one that binds the GPUs after a reboot.
//! The file and its content are the reference's
//! (`/etc/modprobe.d/blacklist-amdgpu.conf`, `# added by gpu operator` then
//! `blacklist amdgpu`). A `blacklist` line stops alias-based loading only
//! (udev at boot), not the agent's own `modprobe --dirname <bundle> amdgpu`.
//!
//! [`blacklist_action`] is the pure rule; [`apply`] writes or removes the
//! file. A file at that path that does not carry the marker line was not
//! written by an operator and is never removed. This module must not load
//! or unload anything.

use crate::host::{HostError, HostRoot};

/// Where the blacklist goes on the host.
pub const BLACKLIST_FILE: &str = "/etc/modprobe.d/blacklist-amdgpu.conf";
/// The line that marks the file as written by an operator.
pub const MARKER: &str = "# added by gpu operator";
/// The file's whole content.
pub const BLACKLIST_TEXT: &str = "# added by gpu operator\nblacklist amdgpu\n";

/// What to do about the blacklist file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlacklistAction {
    /// Write [`BLACKLIST_TEXT`].
    Write,
    /// Remove the operator's file.
    Remove,
    /// Nothing to change.
    Leave,
}

/// From `spec.driver.blacklist` and the file's content now (`None`: absent).
/// Unset leaves the file as it is. Only a file carrying the operator's
/// marker is rewritten or removed: one a person wrote at that path is
/// theirs, and stays as it is. Pure.
pub fn blacklist_action(wanted: Option<bool>, current: Option<&str>) -> BlacklistAction {
    let ours = current.is_some_and(|text| text.lines().any(|l| l.trim() == MARKER));
    match (wanted, current) {
        (Some(true), None) => BlacklistAction::Write,
        (Some(true), Some(text)) if ours && text != BLACKLIST_TEXT => BlacklistAction::Write,
        (Some(false), Some(_)) if ours => BlacklistAction::Remove,
        _ => BlacklistAction::Leave,
    }
}

/// Brings the host's file in line with `wanted`. Returns whether the
/// in-box amdgpu is blacklisted afterwards (a blacklist line in the file,
/// whoever wrote it).
pub fn apply(host: &HostRoot, wanted: Option<bool>) -> Result<bool, HostError> {
    let current = match host.read_string(BLACKLIST_FILE) {
        Ok(text) => Some(text),
        Err(e) if e.is_not_found() => None,
        // Unset asks for nothing: an unreadable /etc blocks no load.
        Err(_) if wanted.is_none() => return Ok(false),
        Err(e) => return Err(e),
    };
    let blacklisted = |text: &str| {
        text.lines()
            .any(|l| l.split_whitespace().eq(["blacklist", "amdgpu"]))
    };
    match blacklist_action(wanted, current.as_deref()) {
        BlacklistAction::Write => {
            host.write(BLACKLIST_FILE, BLACKLIST_TEXT)?;
            tracing::info!(file = BLACKLIST_FILE, "blacklisted the in-box amdgpu");
            Ok(true)
        }
        BlacklistAction::Remove => {
            host.remove_all(BLACKLIST_FILE)?;
            tracing::info!(file = BLACKLIST_FILE, "removed the amdgpu blacklist");
            Ok(false)
        }
        BlacklistAction::Leave => Ok(current.as_deref().is_some_and(blacklisted)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_follows_the_field_and_a_persons_file_is_left_alone() {
        use BlacklistAction::*;
        let theirs = "blacklist amdgpu\n";
        let table = [
            (None, None, Leave),
            (None, Some(BLACKLIST_TEXT), Leave),
            (Some(true), None, Write),
            (Some(true), Some(BLACKLIST_TEXT), Leave),
            (Some(true), Some(theirs), Leave),
            (Some(true), Some("# added by gpu operator\n"), Write),
            (Some(false), Some(BLACKLIST_TEXT), Remove),
            (Some(false), Some(theirs), Leave),
            (Some(false), None, Leave),
        ];
        for (wanted, current, action) in table {
            assert_eq!(
                blacklist_action(wanted, current),
                action,
                "{wanted:?} {current:?}"
            );
        }
    }

    #[test]
    fn apply_writes_removes_and_says_whether_amdgpu_is_blacklisted() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        assert!(!apply(&host, None).unwrap());
        assert!(apply(&host, Some(true)).unwrap());
        assert_eq!(host.read_string(BLACKLIST_FILE).unwrap(), BLACKLIST_TEXT);
        assert!(apply(&host, None).unwrap(), "unset leaves it, blacklisted");
        assert!(!apply(&host, Some(false)).unwrap());
        assert!(host.read_string(BLACKLIST_FILE).unwrap_err().is_not_found());
        // A person's own blacklist is kept, and counts.
        host.write(BLACKLIST_FILE, "blacklist  amdgpu\n").unwrap();
        assert!(apply(&host, Some(false)).unwrap());
        assert!(host.read_string(BLACKLIST_FILE).is_ok());
    }
}

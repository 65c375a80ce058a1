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

/// Whether the in-box amdgpu is blacklisted for the next boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blacklisted {
    /// The file has a `blacklist amdgpu` line, whoever wrote it.
    Yes,
    No,
    /// A blacklist is wanted, but a file someone else wrote is at the path
    /// without a `blacklist amdgpu` line: it is theirs, so it stays, and
    /// the in-box amdgpu is not blacklisted.
    BlockedByForeignFile,
}

/// Brings the host's file in line with `wanted`, and says whether the
/// in-box amdgpu is blacklisted afterwards.
pub fn apply(host: &HostRoot, wanted: Option<bool>) -> Result<Blacklisted, HostError> {
    let current = match host.read_string(BLACKLIST_FILE) {
        Ok(text) => Some(text),
        Err(e) if e.is_not_found() => None,
        // Unset asks for nothing: an unreadable /etc blocks no load.
        Err(_) if wanted.is_none() => return Ok(Blacklisted::No),
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
            Ok(Blacklisted::Yes)
        }
        BlacklistAction::Remove => {
            host.remove_all(BLACKLIST_FILE)?;
            tracing::info!(file = BLACKLIST_FILE, "removed the amdgpu blacklist");
            Ok(Blacklisted::No)
        }
        BlacklistAction::Leave => Ok(match current.as_deref() {
            Some(text) if blacklisted(text) => Blacklisted::Yes,
            Some(_) if wanted == Some(true) => {
                tracing::warn!(
                    file = BLACKLIST_FILE,
                    "driver.blacklist is set, but the file there was not written by an operator \
                     and has no `blacklist amdgpu` line: left as it is"
                );
                Blacklisted::BlockedByForeignFile
            }
            _ => Blacklisted::No,
        }),
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
        use Blacklisted::*;
        assert_eq!(apply(&host, None).unwrap(), No);
        assert_eq!(apply(&host, Some(true)).unwrap(), Yes);
        assert_eq!(host.read_string(BLACKLIST_FILE).unwrap(), BLACKLIST_TEXT);
        assert_eq!(apply(&host, None).unwrap(), Yes, "unset leaves it");
        assert_eq!(apply(&host, Some(false)).unwrap(), No);
        assert!(host.read_string(BLACKLIST_FILE).unwrap_err().is_not_found());
        // A person's own blacklist is kept, and counts.
        host.write(BLACKLIST_FILE, "blacklist  amdgpu\n").unwrap();
        assert_eq!(apply(&host, Some(false)).unwrap(), Yes);
        assert!(host.read_string(BLACKLIST_FILE).is_ok());
        // A person's file without the line is kept too, and blocks the
        // blacklist that is asked for; unasked, it is just not one.
        let theirs = "options amdgpu ppfeaturemask=0xffffffff\n";
        host.write(BLACKLIST_FILE, theirs).unwrap();
        assert_eq!(apply(&host, Some(true)).unwrap(), BlockedByForeignFile);
        assert_eq!(host.read_string(BLACKLIST_FILE).unwrap(), theirs);
        assert_eq!(apply(&host, None).unwrap(), No);
    }
}

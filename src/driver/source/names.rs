//! Names: a driver image's tag, a bundle's directory, sha256 text. Pure.
//!
//! It owns reading and checking these names; it must not touch the host or
//! the store.

use crate::driver::bundle::{is_plain_name, is_sha256_hex};

/// What a driver image's tag says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageTag {
    pub os: String,
    pub os_version: String,
    pub kernel_release: String,
    pub version: String,
}

/// Parses a driver image's tag, `<os>-<osver>-<kernel>-<version>` (e.g.
/// `ubuntu-22.04-6.8.0-49-generic-6.12.12`), or a whole image reference
/// that ends in one (`registry/amdgpu-driver:<tag>`). The version is the
/// last `-` component, the kernel what sits between `<os>-<osver>-` and
/// `-<version>`. Pure.
pub fn parse_image_tag(text: &str) -> Result<ImageTag, String> {
    let bad = |why: &str| {
        format!(
            "image tag {text:?}: {why}; expected <os>-<osver>-<kernel>-<version>, e.g. ubuntu-22.04-6.8.0-49-generic-6.12.12"
        )
    };
    if text.contains('@') {
        return Err(bad("a digest names no kernel, give the tag"));
    }
    // `host:port/name:tag`: the tag is after the last `:`, past the last `/`.
    let tag = match text.rsplit_once(':') {
        Some((_, tag)) if !tag.contains('/') => tag,
        _ if text.contains('/') => return Err(bad("an image reference without a tag")),
        _ => text,
    };
    let tag_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if tag.is_empty()
        || tag.len() > 128
        || !tag.chars().all(tag_chars)
        || tag.starts_with(['.', '-'])
    {
        return Err(bad(
            "not a tag (letters, digits, `_`, `.`, `-`, at most 128)",
        ));
    }
    let parts: Vec<&str> = tag.split('-').collect();
    if parts.len() < 4 || parts.iter().any(|p| p.is_empty()) {
        return Err(bad("too few `-`-separated parts, or an empty one"));
    }
    let (os, os_version, version) = (parts[0], parts[1], parts[parts.len() - 1]);
    let kernel_release = parts[2..parts.len() - 1].join("-");
    let starts_with_digit = |s: &str| s.starts_with(|c: char| c.is_ascii_digit());
    if !os.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(bad(&format!("the OS {os:?} does not start with a letter")));
    }
    if !starts_with_digit(os_version) {
        return Err(bad(&format!(
            "the OS version {os_version:?} is not a number"
        )));
    }
    if !starts_with_digit(&kernel_release) {
        return Err(bad(&format!(
            "the kernel {kernel_release:?} does not start with a digit"
        )));
    }
    if !starts_with_digit(version) {
        return Err(bad(&format!(
            "the driver version {version:?} does not start with a digit"
        )));
    }
    Ok(ImageTag {
        os: os.to_owned(),
        os_version: os_version.to_owned(),
        kernel_release,
        version: version.to_owned(),
    })
}

/// The directory name of a bundle in the store, `<version>-<kernel>`, when
/// both make a safe name: one path component, not hidden (work in
/// progress is), printable. Pure.
pub fn bundle_name(version: &str, kernel_release: &str) -> Result<String, String> {
    let printable = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | '~'))
    };
    if version.is_empty() || version.starts_with('.') || !printable(version) {
        return Err(format!(
            "driver version {version:?} cannot name a directory (letters, digits, `.`, `_`, `-`, `+`, `~`; not starting with `.`)"
        ));
    }
    if !is_plain_name(kernel_release) || !printable(kernel_release) {
        return Err(format!(
            "kernel release {kernel_release:?} cannot name a directory"
        ));
    }
    Ok(format!("{version}-{kernel_release}"))
}

/// A sha256 as 64 hex digits (either case), in lowercase. Pure.
pub fn parse_sha256(text: &str) -> Result<String, String> {
    let lower = text.trim().to_ascii_lowercase();
    if is_sha256_hex(&lower) {
        Ok(lower)
    } else {
        Err(format!("sha256 {text:?} is not 64 hexadecimal digits"))
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: &str = "6.8.0-49-generic";

    #[test]
    fn tags_name_os_kernel_and_version() {
        let tag = parse_image_tag("ubuntu-22.04-6.8.0-49-generic-6.12.12").unwrap();
        assert_eq!(
            tag,
            ImageTag {
                os: "ubuntu".into(),
                os_version: "22.04".into(),
                kernel_release: KERNEL.into(),
                version: "6.12.12".into(),
            }
        );
        let rhel = parse_image_tag(
            "registry.local:5000/amd/amdgpu-driver:rhel-9.4-5.14.0-427.13.1.el9_4.x86_64-6.2.2",
        )
        .unwrap();
        assert_eq!(rhel.kernel_release, "5.14.0-427.13.1.el9_4.x86_64");
        assert_eq!(rhel.version, "6.2.2");
        assert_eq!(
            parse_image_tag("ubuntu-24.04-6.8.0-6.3")
                .unwrap()
                .kernel_release,
            "6.8.0"
        );
    }

    #[test]
    fn malformed_tags_say_what_is_wrong() {
        for (tag, says) in [
            ("ubuntu-22.04-6.12.12", "too few"),
            ("ubuntu-22.04--6.12.12", "too few"),
            ("22.04-ubuntu-6.8.0-6.12.12", "OS"),
            ("ubuntu-jammy-6.8.0-6.12.12", "OS version"),
            ("ubuntu-22.04-generic-6.12.12", "kernel"),
            ("ubuntu-22.04-6.8.0-generic-latest", "driver version"),
            ("ubuntu-22.04-6.8.0 x-6.12.12", "not a tag"),
            ("ubuntu-22.04-6.8.0/../x-6.12.12", "without a tag"),
            ("amd/amdgpu-driver", "without a tag"),
            ("amd/amdgpu-driver@sha256:abcd", "digest"),
            ("", "not a tag"),
        ] {
            let why = parse_image_tag(tag).unwrap_err();
            assert!(why.contains(says), "{tag:?}: {why}");
            assert!(
                why.contains("expected <os>-<osver>-<kernel>-<version>"),
                "{why}"
            );
        }
    }

    #[test]
    fn bundle_names_are_one_safe_component() {
        assert_eq!(
            bundle_name("6.12.12", KERNEL).unwrap(),
            "6.12.12-6.8.0-49-generic"
        );
        for (version, kernel) in [
            ("../x", KERNEL),
            (".hidden", KERNEL),
            ("6.12 12", KERNEL),
            ("", KERNEL),
            ("6.12.12", "a/b"),
            ("6.12.12", ".."),
        ] {
            assert!(
                bundle_name(version, kernel).is_err(),
                "{version:?} {kernel:?}"
            );
        }
    }

    #[test]
    fn sha256_text_is_64_hex_digits_in_either_case() {
        let upper = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
        assert_eq!(parse_sha256(upper).unwrap(), upper.to_ascii_lowercase());
        assert!(parse_sha256("abc").is_err());
        assert!(parse_sha256(&"g".repeat(64)).is_err());
    }
}

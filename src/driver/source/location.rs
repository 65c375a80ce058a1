//! Where a tarball is and how much fetching it may take: parsing and
//! redacting its location, following a redirect, and the limits of a
//! fetch. Pure; below [`super::tarball`], [`super::http`] and
//! [`super::unpack`], which all use it, and it must not import them.

use std::time::Duration;

use super::SourceError;
use crate::driver::bundle::{MAX_FILES, Refusal};

/// How much a fetch may download, unpack and wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchLimits {
    /// The tarball as downloaded (compressed).
    pub max_tarball_bytes: u64,
    /// The files it unpacks to, added up.
    pub max_unpacked_bytes: u64,
    /// What the work directory may hold at once: the tarball, its
    /// decompressed copy and the unpacked files together. The compressed
    /// tarball goes once it is decompressed, the decompressed copy once it is
    /// unpacked.
    pub max_total_bytes: u64,
    /// Free space the fetch must leave on the store's filesystem, checked
    /// before each stage and while writing.
    pub min_free_bytes: u64,
    /// Its entries, directories included.
    pub max_entries: usize,
    pub connect_timeout: Duration,
    /// For the whole download, redirects included.
    pub timeout: Duration,
    pub max_redirects: usize,
}

impl Default for FetchLimits {
    fn default() -> Self {
        Self {
            // A bundle is amdgpu's modules for one kernel and its firmware:
            // well under 1 GiB.
            max_tarball_bytes: 2 << 30,
            max_unpacked_bytes: 2 << 30,
            max_total_bytes: 4 << 30,
            min_free_bytes: 1 << 30,
            // The files a bundle may list, and as many directories.
            max_entries: 2 * MAX_FILES,
            connect_timeout: Duration::from_secs(30),
            timeout: Duration::from_secs(30 * 60),
            max_redirects: 5,
        }
    }
}

/// Where a tarball is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Url(hyper::Uri),
    /// A host path.
    Path(String),
}

/// An `http(s)://` URL or an absolute path. Pure.
pub fn parse_location(text: &str) -> Result<Location, String> {
    let scheme = text.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("http" | "https") => {
            let uri: hyper::Uri = text
                .parse()
                .map_err(|e| format!("{}: not a URL: {e}", redact(text)))?;
            if uri.host().is_none_or(str::is_empty) {
                return Err(format!("{}: no host", redact(text)));
            }
            Ok(Location::Url(uri))
        }
        Some(other) => Err(format!(
            "{}: {other}:// is not supported, only http://, https:// or a file",
            redact(text)
        )),
        None if text.starts_with('/') => Ok(Location::Path(text.to_owned())),
        None => Err(format!(
            "{text:?}: a tarball is an absolute path or an http(s) URL"
        )),
    }
}

/// A source as it may be logged, printed and recorded: a URL without user
/// name, password or query (signed URLs carry their token there). Pure.
pub fn redact(source: &str) -> String {
    let Some((scheme, rest)) = source.split_once("://") else {
        return source.to_owned();
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    format!("{scheme}://{authority}{path}")
}

/// The URL a redirect's `Location` names, from the URL that answered. Pure.
pub fn resolve_redirect(from: &hyper::Uri, location: &str) -> Result<hyper::Uri, String> {
    let scheme = from.scheme_str().unwrap_or("http");
    let authority = from.authority().map(|a| a.as_str()).unwrap_or_default();
    let absolute = if location.contains("://") {
        location.to_owned()
    } else if let Some(rest) = location.strip_prefix("//") {
        format!("{scheme}://{rest}")
    } else if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else {
        let dir = from.path().rsplit_once('/').map_or("", |(dir, _)| dir);
        format!("{scheme}://{authority}{dir}/{location}")
    };
    match parse_location(&absolute)? {
        Location::Url(uri) => Ok(uri),
        Location::Path(_) => Err(format!("redirect to {location:?}")),
    }
}

pub(super) fn too_big(source: &str, max: u64) -> SourceError {
    SourceError::Refused(Refusal::UnsafeTarball {
        tarball: redact(source),
        why: format!("larger than the {max} bytes allowed"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn locations_are_http_urls_or_absolute_paths() {
        assert!(matches!(
            parse_location("https://mirror.example/b.tar.zst"),
            Ok(Location::Url(_))
        ));
        assert!(matches!(
            parse_location("HTTP://h/b.tar"),
            Ok(Location::Url(_))
        ));
        assert_eq!(
            parse_location("/srv/b.tar.gz"),
            Ok(Location::Path("/srv/b.tar.gz".into()))
        );
        assert!(
            parse_location("ftp://h/b.tar")
                .unwrap_err()
                .contains("ftp://")
        );
        assert!(parse_location("b.tar").is_err());
        assert!(parse_location("http:///b.tar").is_err());
    }

    #[test]
    fn shown_sources_carry_no_credentials_or_query() {
        assert_eq!(
            redact("https://user:secret@mirror.example:8443/b.tar.gz?X-Amz-Signature=abc#f"),
            "https://mirror.example:8443/b.tar.gz"
        );
        assert_eq!(redact("/srv/b.tar"), "/srv/b.tar");
    }

    #[test]
    fn redirects_resolve_against_the_url_that_answered() {
        let from: hyper::Uri = "http://127.0.0.1:8080/a/b/old.tar".parse().unwrap();
        for (location, to) in [
            ("/new.tar", "http://127.0.0.1:8080/new.tar"),
            ("new.tar", "http://127.0.0.1:8080/a/b/new.tar"),
            ("//other:81/x.tar", "http://other:81/x.tar"),
            ("https://cdn.example/x.tar", "https://cdn.example/x.tar"),
        ] {
            assert_eq!(resolve_redirect(&from, location).unwrap().to_string(), to);
        }
        assert!(resolve_redirect(&from, "file:///etc/passwd").is_err());
    }
}

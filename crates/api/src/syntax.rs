//! Syntax checks for the string formats the DeviceConfig API uses: Kubernetes
//! label keys and values, Go-style durations, Prometheus intervals, int-or-percent
//! values, absolute paths and positive seconds.
//!
//! Each check is a pure function that returns `Err(reason)` with a sentence a
//! person can act on. This module must not know about DeviceConfig fields; the
//! field paths are added by `validate`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

const MAX_NAME_LEN: usize = 63;
const MAX_PREFIX_LEN: usize = 253;

/// The longest span [`positive_seconds`] accepts: about 136 years, as far as
/// a `u32` of seconds goes (every bound this project takes is far shorter).
pub const MAX_SECONDS: f64 = u32::MAX as f64;

/// A positive, finite number of seconds (fractions allowed), at most
/// [`MAX_SECONDS`]: the one check for every seconds value the project reads,
/// from the command line or a config file.
pub fn positive_seconds(seconds: f64) -> Result<Duration, String> {
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!(
            "must be a positive number of seconds (more than 0), found {seconds}"
        ));
    }
    if seconds > MAX_SECONDS {
        return Err(format!("{seconds} seconds is too large"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Checks a Kubernetes label (or annotation, or taint) key: an optional DNS
/// subdomain prefix and `/`, then a name of at most 63 characters made of
/// alphanumerics, `-`, `_` and `.`, starting and ending with an alphanumeric.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_dns_subdomain(prefix).map_err(|why| format!("prefix {prefix:?} {why}"))?;
    }
    check_name(name)
}

/// Checks a Kubernetes label value: empty, or a name of at most 63 characters.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value)
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("must be at most {MAX_NAME_LEN} characters"));
    }
    let bytes = name.as_bytes();
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    if !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return Err("must start and end with a letter or digit".into());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "must consist of letters, digits, '-', '_' or '.' (found {bad:?})"
        ));
    }
    Ok(())
}

fn check_dns_subdomain(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    if text.len() > MAX_PREFIX_LEN {
        return Err(format!("must be at most {MAX_PREFIX_LEN} characters"));
    }
    for part in text.split('.') {
        let bytes = part.as_bytes();
        let ok = !bytes.is_empty()
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-';
        if !ok {
            return Err("must be a lowercase DNS subdomain (e.g. example.com)".into());
        }
    }
    Ok(())
}

/// Parses a duration the way the reference CRD's pattern allows it: one or more
/// `<number>[.<fraction>]<unit>` parts with units `ns`, `us`, `µs`, `ms`, `s`,
/// `m`, `h` (e.g. `24h`, `1h30m`, `1.5s`). Signs, spaces and a bare `0` are
/// rejected, as the CRD rejects them.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const HINT: &str = "is not a duration such as \"30s\", \"15m\", \"24h\" or \"1h30m\"";
    if text.is_empty() {
        return Err(format!("{text:?} {HINT}"));
    }
    let mut rest = text;
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let digits_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits_end == 0 {
            return Err(format!("{text:?} {HINT}"));
        }
        let whole: u128 = rest[..digits_end]
            .parse()
            .map_err(|_| format!("{text:?} {HINT}"))?;
        rest = &rest[digits_end..];
        // Fractions are kept as numerator/denominator so that "1.5s" is exact.
        let (mut frac_num, mut frac_den) = (0u128, 1u128);
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_end = after_dot
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after_dot.len());
            if frac_end == 0 {
                return Err(format!("{text:?} {HINT}"));
            }
            for digit in after_dot[..frac_end].bytes().take(18) {
                frac_num = frac_num * 10 + u128::from(digit - b'0');
                frac_den *= 10;
            }
            rest = &after_dot[frac_end..];
        }
        let (unit_nanos, unit_len) = [
            ("ns", 1u128),
            ("us", 1_000),
            ("µs", 1_000),
            ("ms", 1_000_000),
            ("s", 1_000_000_000),
            ("m", 60_000_000_000),
            ("h", 3_600_000_000_000),
        ]
        .iter()
        .find(|(unit, _)| rest.starts_with(unit) && !(*unit == "m" && rest.starts_with("ms")))
        .map(|(unit, nanos)| (*nanos, unit.len()))
        .ok_or_else(|| format!("{text:?} {HINT}"))?;
        rest = &rest[unit_len..];
        total_nanos = whole
            .checked_mul(unit_nanos)
            .and_then(|n| n.checked_add(frac_num * unit_nanos / frac_den))
            .and_then(|n| total_nanos.checked_add(n))
            .ok_or_else(|| format!("{text:?} is too long a duration"))?;
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000)
        .map_err(|_| format!("{text:?} is too long a duration"))?;
    // The remainder of a division by 1e9 always fits in u32.
    let nanos = (total_nanos % 1_000_000_000) as u32;
    Ok(Duration::new(secs, nanos))
}

/// Parses a Prometheus scrape interval: digits and exactly one unit of `ms`,
/// `s`, `m` or `h` (pattern `^\d+(ms|s|m|h)$`).
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let err = || format!("{text:?} is not an interval such as \"30s\", \"1m\" or \"500ms\"");
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits_end == 0 {
        return Err(err());
    }
    let count: u64 = text[..digits_end].parse().map_err(|_| err())?;
    let unit_ms = match &text[digits_end..] {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(err()),
    };
    count
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(err)
}

/// An integer count or a percentage, as in `maxUnavailableNodes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountOrPercent {
    /// An absolute number.
    Count(u32),
    /// A percentage between 0 and 100.
    Percent(u32),
}

impl CountOrPercent {
    /// The absolute number for `total` items; percentages round up, as the
    /// reference does for `maxUnavailableNodes`.
    pub fn resolve(self, total: u32) -> u32 {
        match self {
            Self::Count(count) => count,
            Self::Percent(percent) => {
                let scaled = u64::from(total) * u64::from(percent);
                // percent <= 100, so the result is at most `total` and fits.
                scaled.div_ceil(100) as u32
            }
        }
    }
}

/// Parses an int-or-string value that must be a non-negative integer or a
/// percentage string between `0%` and `100%`.
pub fn parse_count_or_percent(value: &IntOrString) -> Result<CountOrPercent, String> {
    match value {
        IntOrString::Int(count) => u32::try_from(*count)
            .map(CountOrPercent::Count)
            .map_err(|_| format!("{count} is negative; use a count of 0 or more or a percentage")),
        IntOrString::String(text) => {
            let Some(number) = text.strip_suffix('%') else {
                return Err(format!(
                    "{text:?} is neither an integer nor a percentage; write a number without quotes or a value like \"25%\""
                ));
            };
            match number.parse::<u32>() {
                Ok(percent) if percent <= 100 && number.bytes().all(|b| b.is_ascii_digit()) => {
                    Ok(CountOrPercent::Percent(percent))
                }
                _ => Err(format!("{text:?} is not a percentage between 0% and 100%")),
            }
        }
    }
}

/// Checks that a path is absolute, as the reference's path pattern requires
/// (`^(/[^/\0]+)*(/)?$`: no empty components, no NUL).
pub fn check_absolute_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} is not an absolute path"));
    }
    if path.contains('\0') {
        return Err(format!("{path:?} contains a NUL character"));
    }
    let inner = path.strip_suffix('/').unwrap_or(path);
    if !inner.is_empty() && inner[1..].split('/').any(str::is_empty) {
        return Err(format!("{path:?} has an empty component (\"//\")"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_must_be_positive_finite_and_bounded() {
        assert_eq!(positive_seconds(1.5), Ok(Duration::from_millis(1500)));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let why = positive_seconds(bad).unwrap_err();
            assert!(why.contains("more than 0"), "{bad}: {why}");
        }
        assert!(
            positive_seconds(MAX_SECONDS * 2.0)
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn label_keys() {
        for ok in [
            "a",
            "feature.node.kubernetes.io/amd-gpu",
            "amd.com/gpu.family",
            "A_b-c.d",
            "x/y",
        ] {
            assert_eq!(check_label_key(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a b",
            "Upper.Case/x",
            "a/",
            "/a",
            &"a".repeat(64),
            "a//b",
        ] {
            assert!(check_label_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_values() {
        assert_eq!(check_label_value(""), Ok(()));
        assert_eq!(check_label_value("true"), Ok(()));
        assert!(check_label_value("has space").is_err());
        assert!(check_label_value(&"v".repeat(64)).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("3µs"), Ok(Duration::from_micros(3)));
        for bad in [
            "", "0", "24", "h", "1d", "-1h", "1h ", "1.h", "1.5", "one hour",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("99999999999999999999999999999999999999h").is_err());
    }

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("2h"), Ok(Duration::from_secs(7_200)));
        for bad in ["", "30", "1m30s", "1.5s", "s", "30 s", "30us"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn count_or_percent() {
        let s = |t: &str| IntOrString::String(t.into());
        assert_eq!(
            parse_count_or_percent(&IntOrString::Int(2)),
            Ok(CountOrPercent::Count(2))
        );
        assert_eq!(
            parse_count_or_percent(&s("25%")),
            Ok(CountOrPercent::Percent(25))
        );
        assert_eq!(
            parse_count_or_percent(&s("100%")),
            Ok(CountOrPercent::Percent(100))
        );
        for bad in ["130%", "-5%", "x%", "%", "2", "25 %", "+5%"] {
            assert!(parse_count_or_percent(&s(bad)).is_err(), "{bad}");
        }
        assert!(parse_count_or_percent(&IntOrString::Int(-1)).is_err());
        assert_eq!(CountOrPercent::Percent(25).resolve(10), 3);
        assert_eq!(CountOrPercent::Percent(0).resolve(10), 0);
        assert_eq!(CountOrPercent::Percent(100).resolve(7), 7);
        assert_eq!(CountOrPercent::Count(4).resolve(2), 4);
    }

    #[test]
    fn absolute_paths() {
        for ok in [
            "/",
            "/var/lib/kubelet/pod-resources",
            "/var/snap/microk8s/common/var/lib/kubelet/pod-resources/",
        ] {
            assert_eq!(check_absolute_path(ok), Ok(()), "{ok}");
        }
        for bad in ["", "var/lib", "/var//lib", "./x"] {
            assert!(check_absolute_path(bad).is_err(), "{bad}");
        }
    }
}

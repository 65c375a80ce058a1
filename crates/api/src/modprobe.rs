//! What `driver.kernelModuleConfig` may hand to `modprobe`, read the way
//! kmod's `modprobe` reads its command line.
//!
//! The agent runs `modprobe --dirname <bundle> ${loadArgs} amdgpu
//! ${parameters}` and `modprobe -r ${unloadArgs} amdgpu` as root. An option
//! that names another configuration (`--config`: its `install` lines run
//! commands), another module directory (`--dirname`: no bundle check), or that
//! forces a module in, would defeat every check of the bundle. kmod parses
//! its options with glibc's `getopt_long`, which accepts any unambiguous
//! abbreviation of a long option (`--conf=` is `--config`) and clusters of
//! short options (`-vC/x` is `-v -C /x`). So these rules are an allow-list,
//! matched after resolving each word the way `getopt_long` does against
//! kmod's whole option table: only the few options that change how modprobe
//! reports or waits get through.
//!
//! One rule for every reader: `gpu-operator validate` and the leader's status
//! ([`super::validate`]), the CRD's item patterns ([`LOAD_ARG_PATTERN`],
//! [`UNLOAD_ARG_PATTERN`], [`PARAMETER_PATTERN`]; a test checks that each
//! accepts exactly what the functions accept) and the agent before it runs
//! anything (`crate::driver::load`). Pure; it must not run anything.

/// Whether a long option takes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Takes {
    Nothing,
    Value,
}

/// One entry of kmod's option table (`cmdopts` in kmod's `tools/modprobe.c`).
struct OptionSpec {
    long: &'static str,
    /// The short option with the same meaning, which is also its identity:
    /// `getopt_long` takes a prefix shared by entries of one meaning (such as
    /// `--ignore-` for `--ignore-install` and `--ignore-remove`) as that
    /// meaning.
    short: Option<char>,
    takes: Takes,
}

const fn opt(long: &'static str, short: Option<char>, takes: Takes) -> OptionSpec {
    OptionSpec { long, short, takes }
}

/// kmod's long options: every name current kmod knows and the names older
/// releases had (`resolve-alias`, `showconfig`, `dump-modversions`). A
/// prefix accepted here is unambiguous in every one of those tables, so it
/// resolves to the same option whichever kmod the node runs.
const LONG_OPTIONS: &[OptionSpec] = &[
    opt("all", Some('a'), Takes::Nothing),
    opt("remove", Some('r'), Takes::Nothing),
    opt("remove-dependencies", None, Takes::Nothing),
    opt("remove-holders", None, Takes::Nothing),
    opt("wait", Some('w'), Takes::Value),
    opt("resolve-alias", None, Takes::Nothing),
    opt("show-alias", Some('R'), Takes::Nothing),
    opt("first-time", None, Takes::Nothing),
    opt("ignore-install", Some('i'), Takes::Nothing),
    opt("ignore-remove", Some('i'), Takes::Nothing),
    opt("use-blacklist", Some('b'), Takes::Nothing),
    opt("force", Some('f'), Takes::Nothing),
    opt("force-modversion", None, Takes::Nothing),
    opt("force-vermagic", None, Takes::Nothing),
    opt("show-depends", Some('D'), Takes::Nothing),
    opt("showconfig", None, Takes::Nothing),
    opt("show-config", Some('c'), Takes::Nothing),
    opt("show-modversions", None, Takes::Nothing),
    opt("dump-modversions", None, Takes::Nothing),
    opt("show-exports", None, Takes::Nothing),
    opt("dry-run", Some('n'), Takes::Nothing),
    opt("show", None, Takes::Nothing),
    opt("config", Some('C'), Takes::Value),
    opt("dirname", Some('d'), Takes::Value),
    opt("set-version", Some('S'), Takes::Value),
    opt("syslog", Some('s'), Takes::Nothing),
    opt("quiet", Some('q'), Takes::Nothing),
    opt("verbose", Some('v'), Takes::Nothing),
    opt("version", Some('V'), Takes::Nothing),
    opt("help", Some('h'), Takes::Nothing),
];

/// Options that only change what modprobe reports: allowed when loading a
/// verified bundle and when unloading.
const REPORTING: &[&str] = &["verbose", "quiet", "syslog"];
/// Unloading may also wait for the module's users to go (`--wait=MSEC`).
const UNLOADING: &[&str] = &["verbose", "quiet", "syslog", "wait"];

/// The CRD's pattern for each `loadArgs` entry: exactly the spellings
/// [`load_arg_problem`] accepts (`-v`, `-q`, `-s` and clusters of them; the
/// unambiguous abbreviations of `--verbose`, `--quiet` and `--syslog`).
pub const LOAD_ARG_PATTERN: &str =
    r"^(-[qsv]+|--(verb(o(se?)?)?|q(u(i(et?)?)?)?|sy(s(l(og?)?)?)?))$";
/// The CRD's pattern for each `unloadArgs` entry: those of
/// [`LOAD_ARG_PATTERN`] and a wait in milliseconds given in the same entry
/// (`--wait=MSEC`, `-wMSEC`, after `-v`, `-q` or `-s` in a cluster).
pub const UNLOAD_ARG_PATTERN: &str = r"^(-[qsv]+|-[qsv]*w[0-9]+|--(verb(o(se?)?)?|q(u(i(et?)?)?)?|sy(s(l(og?)?)?)?|w(a(it?)?)?=[0-9]+))$";
/// The CRD's pattern for each `parameters` entry: `name` or `name=value`, the
/// name not starting with `-` (modprobe would read it as an option), the
/// value without control characters: those `char::is_control` refuses, the
/// ASCII ones (`[:cntrl:]`) and the C1 controls U+0080 to U+009F, which
/// `[:cntrl:]` does not cover. `\x{hhhh}` because it names the code point in
/// both Go's RE2 (the API server) and the `regex` crate (our test); RE2 has
/// no `\u`.
pub const PARAMETER_PATTERN: &str = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(=[^[:cntrl:]\x{80}-\x{9F}]*)?$";

/// One option as `getopt_long` resolves a word.
struct Resolved<'a> {
    /// The long name of the option the word means.
    long: &'static str,
    value: Option<&'a str>,
}

/// The options one command-line word means to kmod's `modprobe`, or why it
/// means none that can be judged.
fn resolve(word: &str) -> Result<Vec<Resolved<'_>>, String> {
    if word == "--" {
        return Err("ends modprobe's options, which is the agent's to do".to_owned());
    }
    if let Some(long) = word.strip_prefix("--") {
        let (name, value) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (long, None),
        };
        return resolve_long(name).map(|long| vec![Resolved { long, value }]);
    }
    let Some(cluster) = word.strip_prefix('-').filter(|c| !c.is_empty()) else {
        return Err("not an option; module parameters go in parameters".to_owned());
    };
    let mut options = Vec::new();
    for (at, c) in cluster.char_indices() {
        let Some(spec) = LONG_OPTIONS.iter().find(|o| o.short == Some(c)) else {
            return Err(format!("-{c} is not a modprobe option"));
        };
        if spec.takes == Takes::Value {
            // The rest of the cluster is the value; with none, getopt takes
            // the next word, which is the agent's.
            let rest = &cluster[at + c.len_utf8()..];
            options.push(Resolved {
                long: spec.long,
                value: Some(rest).filter(|r| !r.is_empty()),
            });
            return Ok(options);
        }
        options.push(Resolved {
            long: spec.long,
            value: None,
        });
    }
    Ok(options)
}

/// The option `--name` means: an exact name, or a prefix of the names of one
/// option only.
fn resolve_long(name: &str) -> Result<&'static str, String> {
    if let Some(exact) = LONG_OPTIONS.iter().find(|o| o.long == name) {
        return Ok(exact.long);
    }
    let matches: Vec<&OptionSpec> = LONG_OPTIONS
        .iter()
        .filter(|o| o.long.starts_with(name))
        .collect();
    let Some(first) = matches.first() else {
        return Err(format!("--{name} is not a modprobe option"));
    };
    let one_meaning = matches
        .iter()
        .all(|o| o.short.is_some() && o.short == first.short);
    if matches.len() == 1 || one_meaning {
        return Ok(first.long);
    }
    let names: Vec<String> = matches.iter().map(|o| format!("--{}", o.long)).collect();
    Err(format!("--{name} is ambiguous ({})", names.join(", ")))
}

/// Why `word` may not be given to modprobe, if it may not, with `allowed`
/// the long names of the options it may mean.
fn arg_problem(word: &str, allowed: &[&str]) -> Option<String> {
    let allowed_list = || {
        allowed
            .iter()
            .map(|long| match spec(long).and_then(|s| s.short) {
                Some(short) => format!("-{short}/--{long}"),
                None => format!("--{long}"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let options = match resolve(word) {
        Ok(options) => options,
        Err(why) => return Some(format!("{why} (allowed: {})", allowed_list())),
    };
    for option in options {
        let spelled = if word.starts_with("--") {
            format!(
                "{} means --{}",
                word.split('=').next().unwrap_or(word),
                option.long
            )
        } else {
            format!("it means --{}", option.long)
        };
        if !allowed.contains(&option.long) {
            return Some(format!(
                "{spelled}, which is not allowed: the agent owns the module directory, \
                 the configuration and how the module is loaded (allowed: {})",
                allowed_list()
            ));
        }
        let takes = spec(option.long).map_or(Takes::Nothing, |s| s.takes);
        match (takes, option.value) {
            (Takes::Nothing, Some(_)) => {
                return Some(format!("{spelled}, which takes no value"));
            }
            (Takes::Value, None) => {
                return Some(format!(
                    "{spelled}, which needs its value in the same entry (--{}=VALUE)",
                    option.long
                ));
            }
            (Takes::Value, Some(value)) if option.long == "wait" && !is_decimal(value) => {
                return Some(format!(
                    "{spelled}, whose value is a number of milliseconds, not {value:?}"
                ));
            }
            _ => {}
        }
    }
    None
}

fn spec(long: &str) -> Option<&'static OptionSpec> {
    LONG_OPTIONS.iter().find(|o| o.long == long)
}

fn is_decimal(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Why one `loadArgs` entry may not be given to `modprobe`, if it may not.
pub fn load_arg_problem(word: &str) -> Option<String> {
    arg_problem(word, REPORTING)
}

/// Why one `unloadArgs` entry may not be given to `modprobe -r`, if it may not.
pub fn unload_arg_problem(word: &str) -> Option<String> {
    arg_problem(word, UNLOADING)
}

/// Why one `parameters` entry is not `name` or `name=value`, if it is not.
pub fn parameter_problem(parameter: &str) -> Option<String> {
    let (name, value) = match parameter.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (parameter, None),
    };
    // A leading `-` would make modprobe read it as an option.
    let valid_name = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if !valid_name {
        return Some("expected name or name=value, the name of letters, digits, _, - and ., not starting with -".to_owned());
    }
    if value.is_some_and(|v| v.chars().any(char::is_control)) {
        return Some("the value has a control character".to_owned());
    }
    None
}

/// The rule one field's entries are judged by.
type EntryRule = fn(&str) -> Option<String>;

/// Every entry of `loadArgs`, `unloadArgs` and `parameters` that cannot be
/// used, as (field and index, the entry, why): for example
/// (`loadArgs[0]`, `--conf=/x`, `--conf means --config, which is not allowed…`).
pub fn module_config_problems(
    load_args: &[String],
    unload_args: &[String],
    parameters: &[String],
) -> Vec<(String, String, String)> {
    let fields: [(&str, &[String], EntryRule); 3] = [
        ("loadArgs", load_args, load_arg_problem),
        ("unloadArgs", unload_args, unload_arg_problem),
        ("parameters", parameters, parameter_problem),
    ];
    fields
        .into_iter()
        .flat_map(|(field, entries, problem)| {
            entries.iter().enumerate().filter_map(move |(i, entry)| {
                problem(entry).map(|why| (format!("{field}[{i}]"), entry.clone(), why))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex::Regex;

    /// Every abbreviation `getopt_long` accepts for each long option, as
    /// kmod's table makes it: each prefix unique to it (or shared only with
    /// entries of the same meaning), and the whole name.
    fn spellings() -> Vec<(String, &'static str)> {
        let mut out = Vec::new();
        for spec in LONG_OPTIONS {
            for end in 1..=spec.long.len() {
                let prefix = &spec.long[..end];
                if let Ok(long) = resolve_long(prefix) {
                    out.push((format!("--{prefix}"), long));
                }
            }
        }
        out
    }

    #[test]
    fn every_abbreviation_of_a_dangerous_option_is_refused() {
        // The review's findings first, then every spelling of every option
        // that is not a reporting one.
        for word in [
            "--conf=/tmp/x/evil.conf",
            "--con=/x",
            "--c=/x",
            "--co=/x",
            "--di=/tmp/x/unverified",
            "--dir=/x",
            "--ignore-i",
            "--ignore-",
            "--set=6.1.0",
            "--force-v",
            "--fo",
            "--remove-h",
            "-C/x",
            "-vC/x",
            "-vd",
            "-vfq",
            "-i",
            "-a",
            "--all",
            "--",
            "-",
            "",
            "amdgpu",
            "--verbose=1",
            "--ver",
            "--v",
            "--s",
            "--",
        ] {
            assert!(load_arg_problem(word).is_some(), "{word:?} was let through");
        }
        let spellings = spellings();
        for (word, long) in &spellings {
            let allowed = REPORTING.contains(long);
            assert_eq!(
                load_arg_problem(word).is_none(),
                allowed,
                "{word} ({long}): {:?}",
                load_arg_problem(word)
            );
            // With a value glued on, as a value-taking option reads it.
            let with_value = format!("{word}=/tmp/x");
            assert!(load_arg_problem(&with_value).is_some(), "{with_value}");
        }
        // The dangerous ones, by every spelling kmod accepts.
        for long in [
            "config",
            "dirname",
            "ignore-install",
            "set-version",
            "force",
        ] {
            let count = spellings.iter().filter(|(_, l)| *l == long).count();
            assert!(count >= 3, "{long}: {count} spellings");
        }
    }

    /// What kmod's `modprobe` makes of a word, for [`kmods_reading_decides_each_spelling`].
    #[derive(Debug)]
    enum Kmod {
        /// It means this long option, one of the reporting ones: allowed.
        Allows,
        /// It means this long option (for a cluster, the one not allowed).
        Means(&'static str),
        /// `getopt_long` refuses it as ambiguous: the prefix is shared by
        /// options of different meanings.
        Ambiguous,
    }

    /// Spellings and what kmod reads them as, written out by hand from kmod's
    /// option table (`cmdopts` and `cmdopts_s` in `tools/modprobe.c`, kmod
    /// 84fa569b2eb3) and glibc's `getopt_long` rules (an exact name wins; a
    /// prefix of several entries is ambiguous unless they have the same
    /// `has_arg`, `flag` and `val`; short options cluster, and one that takes
    /// a value takes the rest of the word). Independent of [`resolve_long`]
    /// and [`LONG_OPTIONS`], so that a resolver wrong in the same way as a
    /// table derived from it still fails here.
    #[test]
    fn kmods_reading_decides_each_spelling() {
        use Kmod::{Allows, Ambiguous, Means};
        let table: &[(&str, Kmod)] = &[
            // No other long option starts with `c` (`show-config` starts
            // with `s`), so even `--c` is `--config` to getopt_long, not
            // ambiguous.
            ("--conf=/x", Means("config")),
            ("--con=/x", Means("config")),
            ("--c=/x", Means("config")),
            ("--config=/x", Means("config")),
            // `--d` is ambiguous (dirname, dry-run, dump-modversions); from
            // `--di` on it is dirname.
            ("--di=/x", Means("dirname")),
            ("--dir=/x", Means("dirname")),
            ("--dirname=/x", Means("dirname")),
            ("--d=/x", Ambiguous),
            // ignore-install and ignore-remove are both `no_argument, 0, 'i'`:
            // a prefix of both, `--ignore-`, is not ambiguous either.
            ("--ignore-i", Means("ignore-install")),
            ("--ignore-inst", Means("ignore-install")),
            ("--ignore-", Means("ignore-install")),
            ("--set=1", Means("set-version")),
            ("--set-v=1", Means("set-version")),
            // remove-dependencies (7) and remove-holders (5) differ in `val`.
            ("--remove-", Ambiguous),
            // An exact name wins over the longer names it starts.
            ("--remove", Means("remove")),
            ("--show", Means("show")),
            ("--force", Means("force")),
            ("--fo", Ambiguous),
            ("--s", Ambiguous),
            ("--v", Ambiguous),
            ("--ver", Ambiguous),
            // Short options, alone and clustered; C, d, S and w take a value.
            ("-C/x", Means("config")),
            ("-d/x", Means("dirname")),
            ("-vC/x", Means("config")),
            ("-qd/x", Means("dirname")),
            ("-i", Means("ignore-install")),
            ("-S1", Means("set-version")),
            ("-f", Means("force")),
            ("-vf", Means("force")),
            // The reporting options, in every form.
            ("-v", Allows),
            ("-q", Allows),
            ("-s", Allows),
            ("-vq", Allows),
            ("-vvq", Allows),
            ("--verb", Allows),
            ("--verbo", Allows),
            ("--verbose", Allows),
            ("--q", Allows),
            ("--qui", Allows),
            ("--quiet", Allows),
            ("--sy", Allows),
            ("--syslog", Allows),
        ];
        for (word, kmod) in table {
            let problem = load_arg_problem(word);
            match (kmod, &problem) {
                (Allows, None) => {}
                (Means(long), Some(why)) if why.contains(&format!("means --{long},")) => {}
                (Ambiguous, Some(why)) if why.contains("is ambiguous") => {}
                _ => panic!("{word}: kmod reads it as {kmod:?}, the rule says {problem:?}"),
            }
        }
    }

    #[test]
    fn refusals_name_the_entry_and_what_kmod_reads() {
        let why = load_arg_problem("--conf=/x").unwrap_or_default();
        assert!(why.contains("--conf means --config"), "{why}");
        assert!(why.contains("-v/--verbose"), "{why}");
        let why = load_arg_problem("-vd/x").unwrap_or_default();
        assert!(why.contains("--dirname"), "{why}");
        let why = load_arg_problem("--ver").unwrap_or_default();
        assert!(
            why.contains("ambiguous") && why.contains("--version"),
            "{why}"
        );
        let why = unload_arg_problem("--wait").unwrap_or_default();
        assert!(why.contains("same entry"), "{why}");
        let problems =
            module_config_problems(&["-v".into(), "--di=/x".into()], &[], &["-x".into()]);
        let at: Vec<&str> = problems.iter().map(|(f, _, _)| f.as_str()).collect();
        assert_eq!(at, ["loadArgs[1]", "parameters[0]"]);
        assert_eq!(problems[0].1, "--di=/x");
    }

    #[test]
    fn reporting_options_pass_in_every_spelling() {
        for word in [
            "-v",
            "-q",
            "-s",
            "-vq",
            "-qsv",
            "--verbose",
            "--verb",
            "--quiet",
            "--q",
            "--sy",
            "--syslog",
        ] {
            assert_eq!(load_arg_problem(word), None, "{word}");
            assert_eq!(unload_arg_problem(word), None, "{word}");
        }
        for word in ["--wait=5000", "--wa=1", "--w=0", "-w100", "-vw100"] {
            assert_eq!(unload_arg_problem(word), None, "{word}");
            assert!(load_arg_problem(word).is_some(), "{word}");
        }
        for word in [
            "--wait",
            "-w",
            "--wait=",
            "--wait=5s",
            "-wx",
            "-rv",
            "--force",
        ] {
            assert!(unload_arg_problem(word).is_some(), "{word}");
        }
    }

    #[test]
    fn parameters_are_names_with_values() {
        for ok in [
            "ras_enable=1",
            "noretry",
            "amdgpu.x=1",
            "a=--config=/x",
            "x=1,2",
        ] {
            assert_eq!(parameter_problem(ok), None, "{ok}");
        }
        for bad in [
            "-x",
            "--config=/x",
            "a b=1",
            "=1",
            "",
            "x=1\n",
            "x=\u{7f}",
            "x=\u{80}",
            "x=a\u{9f}b",
        ] {
            assert!(parameter_problem(bad).is_some(), "{bad:?}");
        }
    }

    /// Every word the tests above try, plus every short cluster of up to
    /// three of kmod's short options and every long spelling with and
    /// without a value.
    fn candidate_words() -> Vec<String> {
        let shorts: Vec<char> = "arwRibfDcnCdSsqvVhxz".chars().collect();
        let mut words = vec![String::new(), "-".into(), "--".into(), "amdgpu".into()];
        for a in &shorts {
            words.push(format!("-{a}"));
            words.push(format!("-{a}100"));
            for b in &shorts {
                words.push(format!("-{a}{b}"));
                words.push(format!("-{a}{b}100"));
                for c in &shorts {
                    words.push(format!("-{a}{b}{c}"));
                }
            }
        }
        for spec in LONG_OPTIONS {
            for end in 1..=spec.long.len() {
                let prefix = &spec.long[..end];
                for suffix in ["", "=", "=1", "=5000", "=/x", "=a b"] {
                    words.push(format!("--{prefix}{suffix}"));
                }
            }
        }
        words
    }

    #[test]
    fn the_crd_patterns_accept_exactly_what_the_rules_accept() {
        let load = Regex::new(LOAD_ARG_PATTERN).expect("load pattern compiles");
        let unload = Regex::new(UNLOAD_ARG_PATTERN).expect("unload pattern compiles");
        for word in candidate_words() {
            assert_eq!(
                load.is_match(&word),
                load_arg_problem(&word).is_none(),
                "loadArgs {word:?}"
            );
            assert_eq!(
                unload.is_match(&word),
                unload_arg_problem(&word).is_none(),
                "unloadArgs {word:?}"
            );
        }
        let parameter = Regex::new(PARAMETER_PATTERN).expect("parameter pattern compiles");
        for word in [
            "ras_enable=1",
            "noretry",
            "amdgpu.x=1",
            "-x",
            "=1",
            "",
            "a b",
            "x=1\n",
            "x=a b",
            "_x",
            ".x",
            // The C1 controls, which `[:cntrl:]` alone lets through, and the
            // characters just outside them.
            "x=\u{80}",
            "x=a\u{85}b",
            "x=\u{9f}",
            "x=\u{7e}",
            "x=\u{a0}",
            "x=é",
        ] {
            assert_eq!(
                parameter.is_match(word),
                parameter_problem(word).is_none(),
                "parameters {word:?}"
            );
        }
        // Every value of one character up to U+00FF and a few beyond (a line
        // separator, a format character, an emoji): the pattern and the rule
        // agree on each, controls and all.
        let beyond = ['\u{2028}', '\u{200b}', '\u{feff}', '\u{1f600}'];
        for c in ('\0'..='\u{ff}').chain(beyond) {
            let word = format!("x={c}");
            assert_eq!(
                parameter.is_match(&word),
                parameter_problem(&word).is_none(),
                "parameters {word:?}"
            );
        }
    }
}

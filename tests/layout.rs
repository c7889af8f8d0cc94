//! The shape of `src/`, checked: files and functions small enough to read at once, and
//! module dependencies that point one way (ARCHITECTURE.md, "The picture").
//!
//! Rules:
//! - A file has at most `FILE_LINES_MAX` lines before its `mod tests` (the whole file
//!   counts where it has none, test-only files included).
//! - A function has at most `FN_LINES_MAX` lines, from `fn` to its closing brace, tests
//!   included. A function may stay longer only with a comment just above it that starts
//!   `// Kept whole:` and says why.
//! - A module imports only the modules below it (`LAYERS`), and nothing from the crate
//!   root: `lib.rs` re-exports, it defines nothing a lower module needs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FILE_LINES_MAX: usize = 800;
const FN_LINES_MAX: usize = 80;
const KEPT_WHOLE: &str = "// Kept whole:";

/// Each top-level module and the crate modules it may name (`crate::<module>`).
/// Modules not listed here may not exist: a new one gets its row and its place.
const LAYERS: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("fault", &[]),
    ("parked", &[]),
    ("names", &["error"]),
    ("format", &["error"]),
    ("io", &["error", "fault"]),
    ("options", &["error", "names"]),
    ("log", &["error", "fault", "format", "io", "parked"]),
    ("journal", &["error", "format", "io", "log", "names"]),
    ("catalog", &["error", "io", "parked"]),
    (
        "queue",
        &[
            "catalog", "error", "fault", "format", "io", "journal", "log", "names", "options",
            "parked",
        ],
    ),
    (
        "admin",
        &["error", "format", "io", "names", "options", "queue"],
    ),
    (
        "runtime",
        &[
            "admin", "error", "fault", "format", "io", "journal", "log", "options", "parked",
            "queue",
        ],
    ),
    (
        "kafka",
        &["error", "fault", "format", "names", "options", "queue"],
    ),
    ("backend", &["error", "io", "kafka", "options", "runtime"]),
    (
        "delivery",
        &["backend", "error", "format", "queue", "runtime"],
    ),
    ("consumer", &["backend", "delivery", "error", "spool"]),
    (
        "spool",
        &[
            "backend", "consumer", "error", "format", "io", "options", "queue",
        ],
    ),
    (
        "blocking",
        &[
            "consumer", "delivery", "error", "format", "options", "queue", "spool",
        ],
    ),
    ("fuzzing", &["error", "format", "io", "log", "options"]),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every `.rs` file under `src/`, with its path relative to `src/` and its lines.
fn sources() -> Vec<(String, Vec<String>)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(src())
                .expect("under src")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&p).expect("read source");
            (rel, text.lines().map(str::to_owned).collect())
        })
        .collect()
}

/// Lines before the file's `mod tests` (and the `#[cfg(test)]` above it).
fn lines_before_tests(lines: &[String]) -> usize {
    let at = lines
        .iter()
        .position(|l| l.starts_with("mod tests") || l.starts_with("pub(crate) mod tests"));
    match at {
        Some(i) if i > 0 && lines[i - 1].trim() == "#[cfg(test)]" => i - 1,
        Some(i) => i,
        None => lines.len(),
    }
}

/// `(name, first line, length)` of every function with a body, and whether a
/// `// Kept whole:` comment stands just above it.
fn functions(lines: &[String]) -> Vec<(String, usize, usize, bool)> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        if line.trim_end().ends_with(';') {
            continue; // A declaration without a body.
        }
        let indent = &line[..line.len() - line.trim_start().len()];
        let close = format!("{indent}}}");
        let Some(len) = lines[i..].iter().position(|l| *l == close) else {
            continue; // A one-line body (`fn f() {}`) or a closure-like layout.
        };
        let kept = lines[..i]
            .iter()
            .rev()
            .take_while(|l| {
                let t = l.trim_start();
                t.starts_with("//") || t.starts_with("#[")
            })
            .any(|l| l.trim_start().starts_with(KEPT_WHOLE));
        out.push((name, i + 1, len + 1, kept));
    }
    out
}

/// The name of the function this line starts, if it starts one.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

#[test]
fn no_file_is_too_long_to_read_at_once() {
    let long: Vec<String> = sources()
        .iter()
        .map(|(f, lines)| (f, lines_before_tests(lines)))
        .filter(|(_, n)| *n > FILE_LINES_MAX)
        .map(|(f, n)| format!("src/{f}: {n} lines before its tests"))
        .collect();
    assert!(
        long.is_empty(),
        "split these by role (at most {FILE_LINES_MAX} lines):\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_is_longer_than_a_screen_unless_it_says_why() {
    let mut long = Vec::new();
    for (f, lines) in sources() {
        for (name, at, len, kept) in functions(&lines) {
            if len > FN_LINES_MAX && !kept {
                long.push(format!("src/{f}:{at} {name}: {len} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these into steps, or put `{KEPT_WHOLE} <why>` above them:\n{}",
        long.join("\n")
    );
}

/// The crate modules named by `crate::<name>` in `text` (including in `use crate::{..}`).
fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
        } else {
            out.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    out
}

#[test]
fn modules_depend_only_on_the_layers_below_them() {
    let layers: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();
    let mut wrong = Vec::new();
    for (f, lines) in sources() {
        if f == "lib.rs" || f == "main.rs" || f.starts_with("bin/") {
            continue;
        }
        let module = f
            .split(['/', '.'])
            .next()
            .expect("a file has a name")
            .to_owned();
        let Some(allowed) = layers.get(module.as_str()) else {
            wrong.push(format!("src/{f}: module `{module}` has no row in LAYERS"));
            continue;
        };
        for (i, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for used in crate_paths(line) {
                if used == module || allowed.contains(&used.as_str()) {
                    continue;
                }
                let why = if layers.contains_key(used.as_str()) {
                    "a module at or above this one"
                } else {
                    "the crate root (lib.rs only re-exports)"
                };
                wrong.push(format!("src/{f}:{}: `crate::{used}` is {why}", i + 1));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_check() {
    // The parsers above on known shapes, so that a check cannot pass by seeing nothing.
    let lines: Vec<String> = [
        "fn a() {",
        "    x();",
        "}",
        "// Kept whole: one loop over shared state.",
        "pub(crate) fn b(",
        ") {",
        "}",
        "#[cfg(test)]",
        "mod tests {",
        "}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let f = functions(&lines);
    assert_eq!(f.len(), 2);
    assert_eq!((f[0].0.as_str(), f[0].2, f[0].3), ("a", 3, false));
    assert_eq!((f[1].0.as_str(), f[1].2, f[1].3), ("b", 3, true));
    assert_eq!(lines_before_tests(&lines), 7);
    assert_eq!(
        crate_paths("use crate::{error::Error, io::Fs}; crate::log::x"),
        ["error", "io", "log"]
    );
    assert!(sources().iter().any(|(f, _)| f == "lib.rs"));
}

//! CLI.md's bad input: each case exits with its documented code (1: the command failed,
//! with one `spool: ` line; 2: a usage error) and changes nothing stored.

mod common_cli;

use common_cli::{Run, expect_code, fingerprint, prepare, spool, spool_raw};

fn failed(run: &Run, mentions: &str) {
    expect_code(run, 1);
    assert!(run.stderr.starts_with("spool: "), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(mentions),
        "{mentions:?} not in {}",
        run.stderr
    );
}

#[test]
fn bad_names_and_malformed_values_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    prepare(d);
    let before = fingerprint(d);
    for args in [
        &["tail", "no/slash"][..],
        &["groups", "--topic", ".."],
        &[
            "reset",
            "--topic",
            "orders",
            "--group",
            "bad group",
            "--to-earliest",
            "--execute",
        ],
        &["publish", "a:b", "x"],
        &["delete-group", "orders", "bad*", "--execute"],
        &["delete-records", "bad*", "--before", "3", "--execute"],
        &[
            "dlq",
            "replay",
            "orders.dlq",
            "--to",
            "bad/target",
            "--execute",
        ],
        &["verify", "--topic", "bad/name"],
    ] {
        failed(&spool(d, args), "invalid topic or group name");
    }
    for args in [
        &[
            "reset",
            "--topic",
            "orders",
            "--group",
            "g",
            "--to-offset",
            "abc",
        ][..],
        &[
            "reset",
            "--topic",
            "orders",
            "--group",
            "g",
            "--by-duration",
            "15",
        ],
        &[
            "reset",
            "--topic",
            "orders",
            "--group",
            "g",
            "--to-datetime",
            "yesterday",
        ],
        &["reset", "--topic", "orders", "--group", "g"],
        &[
            "reset",
            "--topic",
            "orders",
            "--group",
            "g",
            "--to-earliest",
            "--to-latest",
        ],
        &["delete-records", "orders", "--before", "-1"],
        &["tail", "orders", "--max", "many"],
        &["publish", "orders", "--header", "novalue", "x"],
        &["--output", "xml", "topics"],
        &["no-such-command"],
        &["dlq", "replay", "orders.dlq"],
    ] {
        let run = spool(d, args);
        expect_code(&run, 2);
    }
    assert_eq!(fingerprint(d), before);
}

#[test]
fn data_that_is_not_an_instance_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a directory").expect("write");
    for cmd in [&["topics"][..], &["publish", "t", "x"]] {
        failed(&spool(&file, cmd), "is a file");
    }
    let other = dir.path().join("photos");
    std::fs::create_dir(&other).expect("mkdir");
    std::fs::write(other.join("cat.jpg"), b"meow").expect("write");
    for cmd in [&["topics"][..], &["publish", "t", "x"]] {
        failed(&spool(&other, cmd), "not a spool data directory");
    }
    assert_eq!(
        std::fs::read_dir(&other).expect("ls").count(),
        1,
        "something was written"
    );
    // A directory that does not exist: an error for all but publish, and not created.
    let missing = dir.path().join("typo");
    for cmd in [
        &["topics"][..],
        &["groups"],
        &["verify"],
        &["dlq", "list"],
        &["tail", "t"],
    ] {
        failed(&spool(&missing, cmd), "does not exist");
    }
    assert!(!missing.exists());
    expect_code(&spool(&missing, &["publish", "t", "x"]), 0);
    assert!(missing.join("catalog.redb").exists());
}

#[test]
fn connection_strings_are_checked_and_a_held_directory_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    prepare(d);
    let before = fingerprint(d);
    let conn = format!("Data Source={};Bogus Key=1", d.display());
    failed(&spool_raw(&["--data", &conn, "topics"]), "Bogus Key");
    let conn = format!("Data Source={};Mode=Cluster", d.display());
    expect_code(&spool_raw(&["--data", &conn, "topics"]), 1);
    let conn = format!("Data Source={};Dead Letter Suffix=.dlq", d.display());
    let run = spool_raw(&["--data", &conn, "--output", "json", "dlq", "list"]);
    expect_code(&run, 0);
    assert_eq!(run.json()[0]["topic"], "orders.dlq");
    // No --data at all.
    failed(&spool_raw(&["topics"]), "SPOOL_DATA");
    assert_eq!(fingerprint(d), before);

    // An owner holds the directory and serves no endpoint (`Admin=Off`).
    let no_admin = spool::Options {
        admin: false,
        ..spool::Options::new(d)
    };
    let owner = spool::blocking::Spool::open_with(no_admin).expect("open");
    failed(&spool(d, &["topics"]), "open in another process");
    failed(
        &spool(
            d,
            &[
                "reset",
                "--topic",
                "orders",
                "--group",
                "workers",
                "--to-earliest",
                "--execute",
            ],
        ),
        "open in another process",
    );
    owner.close().expect("close");
    assert_eq!(fingerprint(d), before);
}

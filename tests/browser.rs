//! The dashboard of `spool serve` (issue 29) in a real browser: headless Chromium, driven
//! over WebDriver, shows the figures `group_info` reports, moves the lag without a reload
//! as the owner publishes, and filters the dead-letter browser by reason. Saves a
//! screenshot to `target/dashboard.png` (and to `docs/dashboard.png` with
//! `SPOOL_UPDATE_SCREENSHOT=1`).
//!
//! Needs `chromium` and `chromedriver` (Debian: `apt-get install chromium
//! chromium-driver`), found on `PATH` or named by `SPOOL_CHROMIUM` and
//! `SPOOL_CHROMEDRIVER`. Without them it passes, saying on stderr that it skipped;
//! `SPOOL_REQUIRE_BROWSER=1` (set by `.ci/run`) makes that a failure instead.

mod common_cli;
mod common_serve;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common_cli::prepare;
use common_serve::Served;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use spool::{GroupInfo, Headers};

/// How long the browser gets to show something: generous, for a loaded machine. Every
/// wait polls and stops as soon as the page is right; none is a fixed sleep.
const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// A bound on the whole test, so that a browser that hangs fails it instead of CI.
const WHOLE: Duration = Duration::from_secs(300);

/// The figure cells of group `workers` on `orders` (app.js gives each cell these).
const WORKERS: &str = r#"[data-topic="orders"][data-group="workers"]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_owners_figures_live_and_filters_dead_letters() {
    let Some((driver_path, browser_path)) = browser_or_skip() else {
        return;
    };
    let run = tokio::time::timeout(WHOLE, the_page(driver_path, browser_path)).await;
    run.unwrap_or_else(|_| panic!("the browser test took over {WHOLE:?}"));
}

/// The test itself. Each process it starts has a guard that ends it when dropped: on
/// success, on a panic, and when `WHOLE` runs out.
async fn the_page(driver_path: PathBuf, browser_path: PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_owned();
    let prepared = d.clone(); // With the blocking API, which must not run on the runtime.
    tokio::task::spawn_blocking(move || prepare(&prepared))
        .await
        .expect("join");
    // The application holds the directory; `spool serve` goes through its admin endpoint.
    let mq = spool::Spool::open(&format!("Data Source={}", d.display())).expect("open");
    let served = tokio::task::spawn_blocking(move || Served::start(&d, &[]))
        .await
        .expect("join");
    let driver = tokio::task::spawn_blocking(move || Driver::start(&driver_path))
        .await
        .expect("join");
    let page = browse(&driver, &browser_path).await;
    page.goto(&format!("{}/", served.base))
        .await
        .expect("open the page");

    let info = mq.group_info("orders", "workers").expect("group_info");
    assert_eq!((info.cursor, info.lag), (3, 3), "the prepared state");
    until(
        "the figures of orders/workers",
        || figures(&page),
        |shown| shows(shown, &info),
    )
    .await;

    // More publishes; the page polls and redraws on its own. A mark left on the window
    // would be gone after a reload.
    page.execute("window.spoolNotReloaded = true;", vec![])
        .await
        .expect("mark the window");
    for i in 6..11 {
        mq.publish("orders", format!("m{i}").into_bytes(), &Headers::new())
            .await
            .expect("publish");
    }
    let info = mq.group_info("orders", "workers").expect("group_info");
    assert_eq!((info.next, info.lag), (11, 8));
    until(
        "the lag after 5 more publishes",
        || figures(&page),
        |shown| shows(shown, &info),
    )
    .await;
    let mark = page
        .execute("return window.spoolNotReloaded === true;", vec![])
        .await;
    assert_eq!(
        mark.expect("read the mark"),
        json!(true),
        "the page reloaded"
    );

    dead_letters_by_reason(&page).await;
    screenshot(&page).await;

    page.close().await.expect("end the browser session");
    let code = tokio::task::spawn_blocking(move || served.stop()).await;
    assert_eq!(code.expect("join"), 0, "Ctrl-C stops spool serve cleanly");
    mq.close().await.expect("close");
    drop(driver);
}

/// The dead-letter browser lists `orders.dlq`'s two records, then only the one whose
/// `x-dead-letter-reason` contains the text typed into the filter.
async fn dead_letters_by_reason(page: &Client) {
    // On load the page shows the first dead-letter topic unfiltered; wait for that to
    // finish, so that its answer cannot land after the filtered one.
    until(
        "both dead letters, unfiltered",
        || dlq_rows(page),
        |rows| reasons(rows) == ["validation failed", "upstream 503"],
    )
    .await;
    let find = |css: &'static str| page.find(Locator::Css(css));
    let topic = find("#dlq-topic").await.expect("the topic list");
    topic.select_by_value("orders.dlq").await.expect("select");
    let filter = find("#dlq-reason").await.expect("the reason filter");
    filter.send_keys("503").await.expect("type the reason");
    let show = find("#dlq-form button[type=submit]").await.expect("Show");
    show.click().await.expect("click Show");
    let rows = until(
        "the dead letter with reason 503",
        || dlq_rows(page),
        |rows| reasons(rows) == ["upstream 503"],
    )
    .await;
    assert_eq!(rows[0]["payload"], "m2", "{rows:?}");
    let headers = rows[0]["headers"].as_str().unwrap_or_default();
    assert!(
        headers.contains("x-dead-letter-reason: upstream 503"),
        "{headers}"
    );
}

/// Saves what the browser shows: `target/dashboard.png`, and `docs/dashboard.png` (the
/// README's picture) only when `SPOOL_UPDATE_SCREENSHOT=1`, so that the suite leaves
/// the tree as it found it.
async fn screenshot(page: &Client) {
    let png = page.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // The test binary is `<target>/<profile>/deps/browser-<hash>`.
    let exe = std::env::current_exe().expect("the test binary");
    let target = exe.ancestors().nth(3).expect("under the target directory");
    let saved = target.join("dashboard.png");
    std::fs::write(&saved, &png).expect("write target/dashboard.png");
    if std::env::var_os("SPOOL_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/dashboard.png");
        std::fs::write(&docs, &png).expect("write docs/dashboard.png");
    }
}

/// `group_info`'s figures as the page prints them, each in its cell.
fn shows(shown: &BTreeMap<String, String>, info: &GroupInfo) -> bool {
    let want = [
        ("cursor", info.cursor.to_string()),
        ("next", info.next.to_string()),
        ("lag", info.lag.to_string()),
        ("in_flight", info.in_flight.to_string()),
        ("dead_lettered", info.dead_lettered.to_string()),
    ];
    want.iter()
        .all(|(field, value)| shown.get(*field) == Some(value))
}

/// The text on screen of each figure cell of `orders`/`workers`, by `data-field`. One
/// script reads them all, so they come from the same redraw.
async fn figures(page: &Client) -> BTreeMap<String, String> {
    let script = "const out = {};
        for (const e of document.querySelectorAll(arguments[0])) out[e.dataset.field] = e.innerText;
        return out;";
    let v = page.execute(script, vec![json!(WORKERS)]).await;
    serde_json::from_value(v.expect("read the figures")).expect("field -> text")
}

/// Each row of the dead-letter table: its reason, headers and payload cells as shown.
async fn dlq_rows(page: &Client) -> Vec<Value> {
    let script = r##"return Array.from(document.querySelectorAll("#dlq tbody tr[data-offset]"), (tr) => ({
        reason: tr.querySelector('[data-field="x-dead-letter-reason"]').innerText,
        headers: tr.querySelector(".headers").innerText,
        payload: tr.querySelector('[data-field="payload"]').innerText,
    }));"##;
    let v = page.execute(script, vec![]).await.expect("read the rows");
    serde_json::from_value(v).expect("rows")
}

fn reasons(rows: &[Value]) -> Vec<&str> {
    rows.iter()
        .map(|r| r["reason"].as_str().unwrap_or_default())
        .collect()
}

/// Reads with `read` until `done` holds, for at most `WAIT`; fails with the last reading.
async fn until<T: std::fmt::Debug>(
    what: &str,
    read: impl AsyncFn() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let start = Instant::now();
    loop {
        let seen = read().await;
        if done(&seen) {
            return seen;
        }
        assert!(
            start.elapsed() < WAIT,
            "the page did not show {what} within {WAIT:?}; it shows {seen:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The driver and the browser, or `None` after saying on stderr why the test skips.
fn browser_or_skip() -> Option<(PathBuf, PathBuf)> {
    let driver = find("SPOOL_CHROMEDRIVER", &["chromedriver"]);
    let browser = find(
        "SPOOL_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
    );
    let missing = match (driver, browser) {
        (Ok(d), Ok(b)) => return Some((d, b)),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => e,
        (Err(d), Err(b)) => format!("{d}; {b}"),
    };
    let why = format!(
        "the browser test needs chromium and chromedriver (Debian: apt-get install \
         chromium chromium-driver): {missing}"
    );
    if std::env::var_os("SPOOL_REQUIRE_BROWSER").is_some_and(|v| v == "1") {
        panic!("SPOOL_REQUIRE_BROWSER=1, but {why}");
    }
    // Straight to stderr: `eprintln!` in a passing test is captured and never shown.
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
    None
}

/// The executable that `var` names if set, else the first of `names` on `PATH`; or what
/// was looked for in vain.
fn find(var: &str, names: &[&str]) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let runs = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if let Some(named) = std::env::var_os(var) {
        let p = PathBuf::from(named);
        return if runs(&p) {
            Ok(p)
        } else {
            Err(format!("{var}={:?} is not an executable file", p.display()))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| runs(p))
        .ok_or_else(|| format!("no {} on PATH", names.join(" or ")))
}

/// A headless browser session on `driver`, at a fixed window size.
async fn browse(driver: &Driver, browser: &Path) -> Client {
    let mut args = vec!["--headless=new", "--disable-gpu", "--window-size=1080,680"];
    if rustix::process::geteuid().is_root() {
        args.push("--no-sandbox"); // Chromium's sandbox refuses to start as root.
    }
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {"binary": browser, "args": args},
    });
    let Value::Object(caps) = caps else {
        unreachable!("an object")
    };
    ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .unwrap_or_else(|e| panic!("a headless Chromium session through {}: {e}", driver.url))
}

/// A chromedriver on a free loopback port, in its own process group: dropping this
/// kills the group, the browsers it started with it, also when the test panics.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start(path: &Path) -> Driver {
        let mut child = Command::new(path)
            .arg("--port=0")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", path.display()));
        let out = child.stdout.take().expect("stdout");
        let mut driver = Driver {
            child,
            url: String::new(),
        };
        // "ChromeDriver was started successfully on port 39239." Read on a thread, which
        // keeps reading so that the pipe never fills; the wait for the line is bounded.
        let (said, port) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let Some((_, rest)) = line.split_once("started successfully on port ") else {
                    continue;
                };
                let _ = said.send(rest.trim_end_matches('.').parse::<u16>());
            }
        });
        let port = port
            .recv_timeout(WAIT)
            .expect("chromedriver did not say its port")
            .expect("a port number");
        driver.url = format!("http://127.0.0.1:{port}");
        driver
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

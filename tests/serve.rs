//! `spool serve` (issue 29) driven as a user would: the binary started on a real data
//! directory, asked over HTTP. What the JSON and `/metrics` say equals what the library
//! says; unknown names are 404s, malformed parameters 400s, and nothing changes state.
//! (The page itself in a real browser is the browser test's.)

mod common_cli;
mod common_serve;

use std::time::Duration;

use common_cli::{expect_code, fingerprint, prepare, spool};
use common_serve::Served;
use serde_json::Value;

#[test]
fn the_api_and_metrics_say_what_the_library_says_and_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    prepare(d);
    let before = fingerprint(d);
    let served = Served::start(d, &[]);

    // Topics and groups as the command line prints them (it goes through the server's
    // own admin endpoint while the server holds the directory).
    let topics = served.json("/api/topics");
    assert_eq!(topics, spool(d, &["topics", "--output", "json"]).json());
    let groups = served.json("/api/topics/orders/groups");
    let cli = spool(d, &["groups", "--output", "json"]).json();
    for field in [
        "cursor",
        "next",
        "lag",
        "in_flight",
        "dead_lettered",
        "skipped",
        "pending",
    ] {
        assert_eq!(groups[0][field], cli[0][field], "{field}");
    }
    let one = served.json("/api/topics/orders/groups/workers");
    assert_eq!(
        (one["cursor"].as_u64(), one["lag"].as_u64()),
        (Some(3), Some(3))
    );
    let overview = served.json("/api/overview");
    assert_eq!(overview["topics"], topics);
    assert_eq!(overview["groups"][0]["group"], "workers");

    // Dead letters, filtered by reason.
    let list = served.json("/api/dlq");
    assert_eq!(list, spool(d, &["dlq", "list", "--output", "json"]).json());
    let shown = served.json("/api/dlq/orders.dlq?reason=503");
    assert_eq!(shown.as_array().map(Vec::len), Some(1));
    assert_eq!(shown[0]["headers"]["x-dead-letter-reason"], "upstream 503");
    assert_eq!(shown[0]["payload"], "m2");

    prometheus_and_the_page(&served);
    bad_requests_are_answered_and_change_nothing(&served);
    assert_eq!(served.stop(), 0, "Ctrl-C stops it cleanly");
    assert_eq!(fingerprint(d), before, "serving changed something");
}

/// `/metrics` holds the figures the JSON does; the page and its assets are in the binary.
fn prometheus_and_the_page(served: &Served) {
    // Prometheus.
    let (status, text) = served.ask("GET", "/metrics");
    assert_eq!(status, 200);
    for line in [
        "spool_published_total{topic=\"orders\"} 6",
        "spool_dead_lettered_total{topic=\"orders\",group=\"workers\"} 2",
        "spool_lag{topic=\"orders\",group=\"workers\"} 3",
        "spool_in_flight{topic=\"orders\",group=\"workers\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(
        text.contains("# TYPE spool_fsync_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("spool_fsync_seconds_bucket{le=\"+Inf\"}"),
        "{text}"
    );

    // The page and its assets are in the binary.
    let (status, page) = served.ask("GET", "/");
    assert_eq!(status, 200);
    assert!(page.contains("<script src=\"/app.js\">"), "{page}");
    assert_eq!(served.ask("GET", "/app.js").0, 200);
    assert_eq!(served.ask("GET", "/style.css").0, 200);
}

/// 404 for unknown names and paths, 400 for malformed parameters, 405 for every request
/// that would change something: the server is read-only.
fn bad_requests_are_answered_and_change_nothing(served: &Served) {
    for (path, status) in [
        ("/api/topics/nope", 404),
        ("/api/topics/a%2Fb", 404),
        ("/api/topics/orders/groups/nobody", 404),
        ("/api/topics/nope/groups", 404),
        ("/api/dlq/nope", 404),
        ("/nothing/here", 404),
        ("/api/dlq/orders.dlq?max=abc", 400),
        ("/api/dlq/orders.dlq?from=-1", 400),
        ("/api/dlq/orders.dlq?max=1000000", 400),
    ] {
        let (got, body) = served.ask("GET", path);
        assert_eq!(got, status, "{path}: {body}");
        let error: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert!(error["error"].is_string(), "{path}: {body}");
    }
    for (method, path) in [
        ("POST", "/api/topics"),
        ("PUT", "/api/topics/orders"),
        ("DELETE", "/api/topics/orders/groups/workers"),
        ("POST", "/api/dlq/orders.dlq"),
    ] {
        let (got, body) = served.ask(method, path);
        assert_eq!(got, 405, "{method} {path}: {body}");
    }
}

/// Through a running application: the lag on the server moves as the application
/// publishes, without restarting anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_owners_figures_move_on_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_owned();
    let mq = spool::Spool::open(&format!("Data Source={}", d.display())).expect("open");
    let mut c = mq
        .consumer("jobs", "w")
        .manual_ack()
        .build()
        .expect("consumer");
    mq.publish("jobs", b"a".to_vec(), &spool::Headers::new())
        .await
        .expect("publish");
    c.recv().await.expect("recv").ack().await.expect("ack");
    let served = {
        let d = d.clone();
        tokio::task::spawn_blocking(move || Served::start(&d, &[]))
            .await
            .expect("join")
    };
    let lag = |served: Served| {
        tokio::task::spawn_blocking(move || {
            let g = served.json("/api/topics/jobs/groups/w");
            (g["lag"].as_u64(), served)
        })
    };
    let (before, served) = lag(served).await.expect("join");
    assert_eq!(before, Some(0));
    for _ in 0..3 {
        mq.publish("jobs", b"b".to_vec(), &spool::Headers::new())
            .await
            .expect("publish");
    }
    let (after, served) = lag(served).await.expect("join");
    assert_eq!(
        after,
        Some(3),
        "the owner's state, through its admin endpoint"
    );
    let code = tokio::task::spawn_blocking(move || served.stop()).await;
    assert_eq!(code.expect("join"), 0);
    drop(c);
    mq.close().await.expect("close");
}

#[test]
fn a_non_loopback_address_needs_allow_remote() {
    let dir = tempfile::tempdir().expect("tempdir");
    prepare(dir.path());
    let run = spool(dir.path(), &["serve", "--listen", "0.0.0.0:0"]);
    expect_code(&run, 1);
    assert!(run.stderr.contains("--allow-remote"), "{}", run.stderr);
    let run = spool(dir.path(), &["serve", "--listen", "not-an-address"]);
    expect_code(&run, 2);
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// `POST path` with a JSON `body` and `headers`: `(status, body)`.
fn post(served: &Served, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut r = agent().post(format!("{}{path}", served.base));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let mut answer = r
        .content_type("application/json")
        .send(body)
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let status = answer.status().as_u16();
    (status, answer.body_mut().read_to_string().expect("body"))
}

/// Opens the printed link as a browser would: the session cookie it sets (`k=v`).
fn open_link(served: &Served, token: &str) -> Option<String> {
    let r = agent()
        .get(format!("{}/?token={token}", served.base))
        .call()
        .expect("GET the link");
    if r.status().as_u16() != 303 {
        return None;
    }
    let cookie = r.headers().get("set-cookie")?.to_str().ok()?;
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    Some(cookie.split(';').next()?.to_owned())
}

/// Changes from the page: refused without `--allow-writes`, without the session of the
/// printed link, from another origin, or through another host name (403, nothing
/// changed); bad bodies are 400s and unknown names 404s.
#[test]
fn changes_need_allow_writes_the_session_and_the_same_origin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    prepare(d);
    let before = fingerprint(d);
    let reset = r#"{"topic":"orders","group":"workers","to_earliest":true,"execute":true}"#;
    let replay = r#"{"to":"orders.retry","execute":true}"#;

    let read_only = Served::start(d, &[]);
    assert_eq!(read_only.token, None);
    for (path, body) in [
        ("/api/reset", reset),
        ("/api/dlq/orders.dlq/replay", replay),
    ] {
        let (status, answer) = post(&read_only, path, &[("cookie", "spool-session=x")], body);
        assert_eq!(status, 403, "{path}: {answer}");
    }
    assert_eq!(read_only.stop(), 0);

    let served = Served::start(d, &["--allow-writes"]);
    let token = served.token.clone().expect("a link with a token");
    assert_eq!(
        open_link(&served, "0123"),
        None,
        "a wrong link opens no session"
    );
    let cookie = open_link(&served, &token).expect("the link opens a session");
    let own = served.base.clone();
    let port = own.rsplit(':').next().expect("port").to_owned();
    let evil_host = format!("evil.example:{port}");
    for (headers, why) in [
        (vec![], "no session"),
        (vec![("cookie", "spool-session=0123")], "a wrong session"),
        (
            vec![
                ("cookie", cookie.as_str()),
                ("origin", "http://evil.example"),
            ],
            "another origin",
        ),
        (
            vec![
                ("cookie", cookie.as_str()),
                ("sec-fetch-site", "cross-site"),
            ],
            "cross-site",
        ),
        (
            vec![("cookie", cookie.as_str()), ("host", evil_host.as_str())],
            "DNS rebinding",
        ),
    ] {
        let (status, answer) = post(&served, "/api/reset", &headers, reset);
        assert_eq!(status, 403, "{why}: {answer}");
    }
    let good = [("cookie", cookie.as_str()), ("origin", own.as_str())];
    for (path, body, status) in [
        ("/api/reset", r#"{"topic":"orders","group":"workers"}"#, 400),
        (
            "/api/reset",
            r#"{"topic":"orders","group":"workers","to_datetime":"soon"}"#,
            400,
        ),
        ("/api/reset", "not json", 400),
        (
            "/api/reset",
            r#"{"topic":"orders","group":"nobody","to_latest":true}"#,
            404,
        ),
        ("/api/dlq/orders.dlq/replay", r#"{"to":"a/b"}"#, 400),
        ("/api/dlq/orders.dlq/replay", r#"{"to":"orders.dlq"}"#, 400),
        ("/api/dlq/orders/replay", r#"{"to":"x"}"#, 404),
    ] {
        let (got, answer) = post(&served, path, &good, body);
        assert_eq!(got, status, "{path} {body}: {answer}");
    }
    assert_eq!(served.stop(), 0);
    assert_eq!(fingerprint(d), before, "a refused change changed something");
}

/// With the session, a dry run changes nothing and an execute does what the command
/// line's would.
#[test]
fn a_change_from_the_page_is_a_dry_run_until_executed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    prepare(d);
    let served = Served::start(d, &["--allow-writes"]);
    let token = served.token.clone().expect("token");
    let cookie = open_link(&served, &token).expect("session");
    let good = [("cookie", cookie.as_str())];
    let reset = r#"{"topic":"orders","group":"workers","to_earliest":true,"execute":false}"#;
    let (status, answer) = post(&served, "/api/reset", &good, reset);
    assert_eq!(status, 200, "{answer}");
    let row: Value = serde_json::from_str(&answer).expect("json");
    assert_eq!(
        (row[0]["old"].as_u64(), row[0]["new"].as_u64()),
        (Some(3), Some(0))
    );
    assert_eq!(row[0]["executed"], false);
    let replay = r#"{"to":"orders.retry","execute":false}"#;
    let (status, answer) = post(&served, "/api/dlq/orders.dlq/replay", &good, replay);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        serde_json::from_str::<Value>(&answer).expect("json")["replayed"],
        2
    );
    // Nothing changed: the cursor stays, the target topic is not made.
    assert_eq!(
        served.json("/api/topics/orders/groups/workers")["cursor"],
        3
    );
    assert_eq!(served.ask("GET", "/api/topics/orders.retry").0, 404);

    let (status, answer) = post(
        &served,
        "/api/reset",
        &good,
        &reset.replace("false", "true"),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = post(
        &served,
        "/api/dlq/orders.dlq/replay",
        &good,
        &replay.replace("false", "true"),
    );
    assert_eq!(status, 200, "{answer}");
    let cursor = served.json("/api/topics/orders/groups/workers")["cursor"].as_u64();
    assert_eq!(cursor, Some(0));
    assert_eq!(served.json("/api/topics/orders.retry")["messages"], 2);
    assert_eq!(served.stop(), 0);
}

/// Every answer refuses to be framed or sniffed and sends no referrer; a request through
/// another host name (a DNS-rebinding page) is refused, reads included; the dead-letter
/// browser shows only dead-letter topics.
#[test]
fn answers_carry_safety_headers_and_foreign_hosts_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    prepare(dir.path());
    let served = Served::start(dir.path(), &[]);
    let r = agent()
        .get(format!("{}/", served.base))
        .call()
        .expect("GET /");
    let h = r.headers();
    let header = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(header("content-security-policy").contains("frame-ancestors 'none'"));
    assert_eq!(header("x-frame-options"), "DENY");
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert_eq!(header("referrer-policy"), "no-referrer");
    let port = served.base.rsplit(':').next().expect("port").to_owned();
    for host in [format!("evil.example:{port}"), "127.0.0.1:1".to_owned()] {
        let r = agent()
            .get(format!("{}/api/dlq/orders.dlq", served.base))
            .header("host", host.as_str())
            .call()
            .expect("GET");
        assert_eq!(r.status().as_u16(), 403, "{host}");
    }
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let r = agent()
            .get(format!("{}/api/topics", served.base))
            .header("host", host.as_str());
        assert_eq!(r.call().expect("GET").status().as_u16(), 200, "{host}");
    }
    let (status, body) = served.ask("GET", "/api/dlq/orders");
    assert_eq!(status, 404, "not a dead-letter topic: {body}");
    let (status, body) = served.ask("GET", "/api/topics/%FF");
    assert_eq!(status, 400, "{body}");
    assert!(
        serde_json::from_str::<Value>(&body).is_ok_and(|v| v["error"].is_string()),
        "{body}"
    );
    assert_eq!(served.stop(), 0);
    let both = [
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--allow-remote",
        "--allow-writes",
    ];
    let run = spool(dir.path(), &both);
    expect_code(&run, 1);
    assert!(run.stderr.contains("--allow-writes"), "{}", run.stderr);
}

//! A running `spool serve` for the tests that drive it (`serve.rs`, `browser.rs`): the
//! binary started on a data directory, the address and link it printed, HTTP requests
//! to it, and a stop as Ctrl-C makes one.
#![allow(
    dead_code,
    reason = "each test file uses a different subset of the helpers"
)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// A running `spool serve`, the address it printed, and (with `--allow-writes`) the
/// token of the link it printed.
pub struct Served {
    child: Child,
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub base: String,
    /// The token of the printed link (with `--allow-writes`).
    pub token: Option<String>,
}

impl Served {
    pub fn start(data: &Path, extra: &[&str]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_spool"))
            .args(["--data", data.to_str().expect("utf-8")])
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env_remove("SPOOL_DATA")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start spool serve");
        let mut line = String::new();
        let out = child.stdout.take().expect("stdout");
        BufReader::new(out)
            .read_line(&mut line)
            .expect("first line");
        let link = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        let (base, token) = match link.split_once("/?token=") {
            Some((base, token)) => (base.to_owned(), Some(token.to_owned())),
            None => (link.trim_end_matches('/').to_owned(), None),
        };
        Served { child, base, token }
    }

    /// `(status, body)` of a request with `method` to `path`.
    pub fn ask(&self, method: &str, path: &str) -> (u16, String) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let url = format!("{}{path}", self.base);
        let r = match method {
            "GET" => agent.get(&url).call(),
            "POST" => agent.post(&url).send_empty(),
            "PUT" => agent.put(&url).send_empty(),
            "DELETE" => agent.delete(&url).call(),
            other => panic!("{other}"),
        };
        let mut r = r.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = r.status().as_u16();
        (status, r.body_mut().read_to_string().expect("body"))
    }

    pub fn json(&self, path: &str) -> Value {
        let (status, body) = self.ask("GET", path);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// Stops it as Ctrl-C does, and says how it ended.
    pub fn stop(mut self) -> i32 {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT");
        let status = self.child.wait().expect("wait");
        status.code().unwrap_or(-1)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Guards the admin endpoint of a live instance (issue 28 point 2): the owner answers
//! reads and makes changes through its socket (a reset reaches a consumer running there
//! on its next `recv`), `Admin=Off` serves nothing, a second open is still `Locked`, a
//! data directory too long for a socket address still serves (through a pointer), a dead
//! owner's socket does not stop the next owner, and no hostile client stalls the owner.

mod common_core;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common_core::{open_at, publish_n};
use spool::admin::Client;
use spool::{Error, Headers, OffsetReset, Spool};

fn connect(dir: &Path) -> Client {
    Client::connect(dir)
        .expect("connect")
        .expect("a live instance serves its directory")
}

#[tokio::test]
async fn a_live_instance_answers_and_changes_through_the_client() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open_at(tmp.path(), "");
    publish_n(&mq, "orders", 3).await;
    let mut c = mq
        .consumer("orders", "billing")
        .manual_ack()
        .build()
        .expect("consumer");
    c.recv().await.expect("recv").ack().await.expect("ack");

    let sock = tmp.path().join("admin.sock");
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "owner-only socket");

    let client = connect(tmp.path());
    assert_eq!(
        client.socket_path(),
        sock.canonicalize().expect("canonical")
    );
    assert_eq!(client.topics().expect("topics"), ["orders"]);
    assert_eq!(
        client.topic_info("orders").expect("info"),
        mq.topic_info("orders").expect("info")
    );
    assert_eq!(client.groups("orders").expect("groups"), ["billing"]);
    let g = client.group_info("orders", "billing").expect("group");
    assert_eq!((g.cursor, g.next, g.lag), (1, 3, 2));
    let records = client.fetch("orders", 1, 10).expect("fetch");
    let got: Vec<(u64, &[u8])> = records
        .iter()
        .map(|r| (r.offset(), &r.payload()[..]))
        .collect();
    assert_eq!(got, [(1, &b"m1"[..]), (2, &b"m2"[..])]);

    // Changes are made by the owner: it sees them at once.
    let mut h = Headers::new();
    h.insert("message-id".into(), "id-1".into());
    assert_eq!(
        client
            .publish("orders", b"via admin".to_vec(), &h)
            .expect("publish"),
        3
    );
    assert_eq!(
        client
            .publish("orders", b"again".to_vec(), &h)
            .expect("dedup"),
        3
    );
    let batch = vec![
        (b"a".to_vec(), Headers::new()),
        (b"b".to_vec(), Headers::new()),
    ];
    assert_eq!(
        client.publish_batch("orders", batch).expect("batch"),
        [4, 5]
    );
    assert_eq!(mq.topic_info("orders").expect("info").next, 6);
    assert_eq!(
        client.delete_records_before("orders", 1).expect("delete"),
        1
    );
    assert_eq!(mq.topic_info("orders").expect("info").earliest, 1);
    client.apply_retention().expect("retention");
    let snap = tmp.path().with_extension("snap");
    let info = client.snapshot(&snap).expect("snapshot");
    assert_eq!(info.topics, 1);

    // The owner's errors come back as themselves.
    assert!(matches!(
        client.delete_group("orders", "billing"),
        Err(Error::GroupInUse { .. })
    ));
    assert!(matches!(
        client.topic_info("no/such"),
        Err(Error::InvalidTopicName { .. })
    ));
    assert!(matches!(
        client.snapshot(&snap),
        Err(Error::SnapshotDestination { .. })
    ));
    drop(c);
    client
        .delete_group("orders", "billing")
        .expect("delete group");
    assert!(mq.groups("orders").expect("groups").is_empty());

    mq.close().await.expect("close");
    assert!(!sock.exists(), "close removes the socket");
    assert!(Client::connect(tmp.path()).expect("connect").is_none());
    assert!(client.topics().is_err(), "a client of a closed owner fails");
    let copy = open_at(&snap, "Admin=Off");
    assert_eq!(copy.topic_info("orders").expect("info").next, 6);
    copy.close().await.expect("close copy");
    std::fs::remove_dir_all(&snap).expect("cleanup");
}

#[tokio::test]
async fn a_reset_through_the_client_reaches_a_running_consumer() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open_at(tmp.path(), "");
    publish_n(&mq, "t", 5).await;
    let mut c = mq
        .consumer("t", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    for want in 0..3 {
        let d = c.recv().await.expect("recv");
        assert_eq!(d.offset(), want);
        d.ack().await.expect("ack");
    }
    let client = connect(tmp.path());
    let at =
        tokio::task::spawn_blocking(move || client.reset_offset("t", "g", OffsetReset::Earliest))
            .await
            .expect("join")
            .expect("reset");
    assert_eq!(at, 0);
    let d = c.recv().await.expect("recv after the reset");
    assert_eq!(
        d.offset(),
        0,
        "the running consumer sees the reset on its next recv"
    );
    d.ack().await.expect("ack");
    assert_eq!(mq.group_info("t", "g").expect("group").cursor, 1);
    drop(c);
    mq.close().await.expect("close");
}

#[tokio::test]
async fn admin_off_serves_nothing_and_a_second_open_is_still_locked() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open_at(tmp.path(), "Admin=Off");
    assert!(Client::connect(tmp.path()).expect("connect").is_none());
    assert!(!tmp.path().join("admin.sock").exists());
    mq.close().await.expect("close");

    let mq = open_at(tmp.path(), "Admin=On");
    assert!(Client::connect(tmp.path()).expect("connect").is_some());
    let second = Spool::open(&format!("Data Source={}", tmp.path().display()));
    assert!(matches!(second, Err(Error::Locked { .. })), "{second:?}");
    // The refused open left the owner's endpoint alone.
    assert_eq!(
        connect(tmp.path()).topics().expect("topics"),
        Vec::<String>::new()
    );
    mq.close().await.expect("close");
    assert!(Client::connect(tmp.path()).expect("connect").is_none());
    assert!(
        Client::connect(tmp.path().join("missing"))
            .expect("connect")
            .is_none()
    );
}

#[tokio::test]
async fn a_directory_too_long_for_a_socket_address_serves_through_a_pointer() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("d".repeat(60)).join("e".repeat(60));
    let mq = open_at(&dir, "");
    publish_n(&mq, "t", 2).await;
    let pointer = dir.join("admin.sock.path");
    let target = PathBuf::from(
        std::fs::read_to_string(&pointer)
            .expect("pointer")
            .trim_end(),
    );
    assert!(target.as_os_str().len() <= 107, "{}", target.display());
    assert!(!dir.join("admin.sock").exists());
    let client = connect(&dir);
    assert_eq!(client.socket_path(), target);
    assert_eq!(client.topic_info("t").expect("info").next, 2);
    mq.close().await.expect("close");
    assert!(
        !pointer.exists() && !target.exists(),
        "close removes the pointer and the socket"
    );
    assert!(Client::connect(&dir).expect("connect").is_none());
}

// ---- bounds: hostile clients ----------------------------------------------------------

/// Reads what the owner says to a misbehaving client, until it closes: `Some(first body
/// byte)` of a frame, `None` if it closed without one.
fn owner_answer(mut s: UnixStream) -> Option<u8> {
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let mut all = Vec::new();
    match s.read_to_end(&mut all) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the owner neither answered nor closed: {e}"),
    }
    (all.len() > 4).then(|| all[4])
}

/// The owner still publishes, delivers and serves another client while `bad` is open.
async fn owner_is_not_stalled(mq: &Spool, dir: &Path, round: u64) {
    let off = mq
        .publish("live", b"x".to_vec(), &Headers::new())
        .await
        .expect("publish");
    let mut c = mq.consumer("live", "g").build().expect("consumer");
    let d = tokio::time::timeout(Duration::from_secs(10), c.recv())
        .await
        .expect("recv not stalled")
        .expect("recv");
    assert_eq!((d.offset(), off), (round, round));
    drop(d);
    drop(c);
    let dir = dir.to_owned();
    let topics = tokio::task::spawn_blocking(move || connect(&dir).topics())
        .await
        .expect("join")
        .expect("another client is served");
    assert!(topics.contains(&"live".to_owned()));
}

/// A hello frame: `Hello { magic: b"SPAD", version: 1 }` in postcard (4 magic bytes,
/// varint 1) after its length.
const HELLO: [u8; 9] = [5, 0, 0, 0, b'S', b'P', b'A', b'D', 1];

/// 0 is `Response::Hello`'s variant, 1 `Response::Error`'s: the first body byte.
const ERROR_VARIANT: u8 = 1;

#[tokio::test]
async fn garbage_huge_frames_and_silence_get_an_error_or_a_close_and_stall_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open_at(tmp.path(), "");
    let sock = tmp.path().join("admin.sock");

    // Garbage instead of a hello.
    let mut bad = UnixStream::connect(&sock).expect("connect");
    bad.write_all(&[5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff])
        .expect("write");
    owner_is_not_stalled(&mq, tmp.path(), 0).await;
    let answer = tokio::task::spawn_blocking(move || owner_answer(bad))
        .await
        .expect("join");
    assert!(matches!(answer, Some(ERROR_VARIANT) | None), "{answer:?}");

    // A huge length prefix: refused before it is read (nothing else is ever sent).
    let mut bad = UnixStream::connect(&sock).expect("connect");
    bad.write_all(&u32::MAX.to_le_bytes()).expect("write");
    owner_is_not_stalled(&mq, tmp.path(), 1).await;
    let answer = tokio::task::spawn_blocking(move || owner_answer(bad))
        .await
        .expect("join");
    assert_eq!(
        answer,
        Some(ERROR_VARIANT),
        "a huge frame is answered with an error"
    );

    // Nothing at all: timed out (the hello is due within seconds).
    let silent = UnixStream::connect(&sock).expect("connect");
    owner_is_not_stalled(&mq, tmp.path(), 2).await;
    let started = Instant::now();
    let answer = tokio::task::spawn_blocking(move || owner_answer(silent))
        .await
        .expect("join");
    assert!(matches!(answer, Some(ERROR_VARIANT) | None), "{answer:?}");
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "the silent client was timed out"
    );

    // Connections past the bound are told so; the owner goes on, and serves again once
    // they are gone.
    let held: Vec<UnixStream> = (0..16)
        .map(|_| {
            // Each says hello, so it is held for the idle time-out, not the hello's.
            let mut s = UnixStream::connect(&sock).expect("connect");
            s.write_all(&HELLO).expect("hello");
            s
        })
        .collect();
    let busy = Client::connect(tmp.path());
    assert!(matches!(busy, Err(Error::Unsupported { .. })), "{busy:?}");
    let off = mq
        .publish("live", b"x".to_vec(), &Headers::new())
        .await
        .expect("publish");
    assert_eq!(off, 3);
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Client::connect(tmp.path()).is_err() {
        assert!(
            Instant::now() < deadline,
            "served again once the others closed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    mq.close().await.expect("close");
}

#[tokio::test]
async fn garbage_after_the_hello_is_answered_and_closed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open_at(tmp.path(), "");
    let client = connect(tmp.path());
    // A valid hello through a real client first, then a raw one that follows it with a
    // request no version has (variant 200).
    assert!(client.topics().expect("topics").is_empty());
    let mut raw = UnixStream::connect(tmp.path().join("admin.sock")).expect("connect");
    // Hello { magic: b"SPAD", version: 1 } in postcard: 4 magic bytes, varint 1.
    raw.write_all(&[5, 0, 0, 0, b'S', b'P', b'A', b'D', 1])
        .expect("hello");
    raw.write_all(&[1, 0, 0, 0, 200]).expect("garbage");
    let mut hello_len = [0u8; 4];
    raw.read_exact(&mut hello_len).expect("hello answer");
    let mut hello = vec![0u8; u32::from_le_bytes(hello_len) as usize];
    raw.read_exact(&mut hello).expect("hello body");
    assert_eq!(hello[0], 0, "Response::Hello");
    assert_eq!(owner_answer(raw), Some(ERROR_VARIANT));
    assert!(client.topics().expect("still served").is_empty());
    mq.close().await.expect("close");
}

/// A varint as postcard writes it (7 bits a byte, low first).
fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Sends a 1 MiB frame's length (never its body) until the owner answers "busy" rather
/// than waiting for the body; returns that answer's text.
fn busy_answer(sock: &Path) -> String {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let mut large = said_hello(sock);
        large.write_all(&(1u32 << 20).to_le_bytes()).expect("len");
        large
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let mut answer = Vec::new();
        match large.read_to_end(&mut answer) {
            Ok(_) if answer.len() > 4 && answer[4] == ERROR_VARIANT => {
                return String::from_utf8_lossy(&answer[5..]).into_owned();
            }
            _ => assert!(Instant::now() < until, "never told busy"),
        }
        drop(large);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connection holding `len` bytes of the owner's budget: a frame's length and the
/// start of its body. The budget a request just answered still holds is given back only
/// after its answer is written: a holder told "busy" by that race tries again.
fn holder(sock: &Path, len: usize) -> UnixStream {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let mut s = said_hello(sock);
        s.write_all(&(len as u32).to_le_bytes()).expect("len");
        s.write_all(&[6, 4]).expect("a start");
        s.set_read_timeout(Some(Duration::from_secs(1)))
            .expect("timeout");
        let mut answer = [0u8; 1];
        match s.read(&mut answer) {
            // Nothing said: the owner holds the budget and waits for the body.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return s;
            }
            _ => assert!(Instant::now() < until, "never admitted"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A raw connection past its hello (the owner's answer read).
fn said_hello(sock: &Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).expect("connect");
    s.write_all(&HELLO).expect("hello");
    let mut len = [0u8; 4];
    s.read_exact(&mut len).expect("hello answer");
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).expect("hello body");
    assert_eq!(body[0], 0, "Response::Hello");
    s
}

/// Requests that would cost the owner much memory are refused before they do: a publish
/// of more messages than one request carries (each two bytes on the wire, sixty in
/// memory), and large frames past the budget for all connections. Small requests go on
/// being served meanwhile, and nothing is appended.
#[tokio::test]
async fn requests_that_would_cost_the_owner_much_memory_are_refused() {
    use spool::admin::limits::{MAX_BATCH_ITEMS, MAX_FRAME_BYTES, MAX_INFLIGHT_BYTES};
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open_at(tmp.path(), "");
    owner_is_not_stalled(&mq, tmp.path(), 0).await;
    let sock = tmp.path().join("admin.sock");

    // `PublishBatch` (variant 6) to "live" of MAX_BATCH_ITEMS + 1 empty messages.
    let mut body = vec![6];
    varint(4, &mut body);
    body.extend_from_slice(b"live");
    varint(MAX_BATCH_ITEMS as u64 + 1, &mut body);
    body.extend(std::iter::repeat_n([0u8, 0u8], MAX_BATCH_ITEMS + 1).flatten());
    let mut raw = said_hello(&sock);
    raw.write_all(&(body.len() as u32).to_le_bytes())
        .expect("len");
    raw.write_all(&body).expect("body");
    let answer = tokio::task::spawn_blocking(move || owner_answer(raw));
    assert_eq!(answer.await.expect("join"), Some(ERROR_VARIANT));
    // The client refuses such a batch itself, before sending anything.
    let client = connect(tmp.path());
    let many = vec![(Vec::<u8>::new(), Headers::new()); MAX_BATCH_ITEMS + 1];
    let refused = client.publish_batch("live", many);
    assert!(matches!(refused, Err(Error::Io { .. })), "{refused:?}");
    assert_eq!(
        client.topic_info("live").expect("info").next,
        1,
        "nothing appended"
    );

    // Frames of the largest size, their bodies never sent, fill the budget...
    let fill = MAX_INFLIGHT_BYTES / (2 * MAX_FRAME_BYTES);
    let holding: Vec<UnixStream> = (0..fill).map(|_| holder(&sock, MAX_FRAME_BYTES)).collect();
    // ...so the next large one is told the owner is busy, before its body is read. (The
    // holders' threads may not have read their lengths yet on a loaded machine: a large
    // frame admitted meanwhile waits for its body, so it is closed and tried again.)
    let sock2 = sock.clone();
    let busy = tokio::task::spawn_blocking(move || busy_answer(&sock2));
    let text = busy.await.expect("join");
    assert!(text.contains("busy"), "{text}");
    // ...while small requests, publishers and consumers go on.
    owner_is_not_stalled(&mq, tmp.path(), 1).await;
    drop(holding);
    // Once they are gone, a large publish goes through the owner again (the budget is
    // given back when the reader of a frame ends, which may take a moment).
    let big = vec![(vec![7u8; 1 << 20], Headers::new())];
    let deadline = Instant::now() + Duration::from_secs(10);
    let client = connect(tmp.path());
    loop {
        match client.publish_batch("live", big.clone()) {
            Ok(offsets) => break assert_eq!(offsets, vec![2]),
            Err(e) => assert!(Instant::now() < deadline, "never served again: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    mq.close().await.expect("close");
}

// ---- a dead owner's socket ------------------------------------------------------------

const CHILD_DIR_ENV: &str = "SPOOL_TEST_ADMIN_CHILD_DIR";
const CHILD_TEST: &str = "child_owner_opens_the_directory_and_waits_to_be_killed";

/// Not a test of its own: runs only in the child process that
/// `a_killed_owners_socket_does_not_stop_the_next_owner` spawns and kills.
#[test]
fn child_owner_opens_the_directory_and_waits_to_be_killed() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let _mq = Spool::open(&format!("Data Source={dir}")).expect("child open");
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nCHILD-READY").expect("stdout");
    out.flush().expect("flush");
    std::thread::sleep(Duration::from_secs(60));
}

#[tokio::test]
async fn a_killed_owners_socket_does_not_stop_the_next_owner() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut out = child.stdout.take().expect("stdout");
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains("CHILD-READY") {
        let n = out.read(&mut buf).expect("read child");
        assert!(n > 0, "the child ended before it was ready: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    // The child serves its directory from another process.
    assert!(connect(tmp.path()).topics().expect("topics").is_empty());
    child.kill().expect("kill");
    child.wait().expect("wait");

    let sock = tmp.path().join("admin.sock");
    assert!(sock.exists(), "a killed owner leaves its socket");
    assert!(
        Client::connect(tmp.path()).expect("connect").is_none(),
        "nobody listens"
    );
    let mq = open_at(tmp.path(), "");
    publish_n(&mq, "t", 1).await;
    assert_eq!(connect(tmp.path()).topic_info("t").expect("info").next, 1);
    mq.close().await.expect("close");
}

// ---- another user ---------------------------------------------------------------------

const PEER_SOCKET_ENV: &str = "SPOOL_TEST_ADMIN_PEER_SOCKET";
const PEER_TEST: &str = "child_of_another_user_says_hello";

/// Not a test of its own: runs only in the child, of another user, that
/// `another_users_connection_is_refused_even_when_the_mode_lets_it_in` spawns. Prints the
/// first body byte of the owner's answer to a hello.
#[test]
fn child_of_another_user_says_hello() {
    let Ok(sock) = std::env::var(PEER_SOCKET_ENV) else {
        return;
    };
    // The first frame's first body byte: the owner keeps a served connection open.
    let first = |mut s: UnixStream| -> std::io::Result<u8> {
        s.set_read_timeout(Some(Duration::from_secs(15)))?;
        // A refusal may come, and the owner close, before the hello is written: the
        // answer is still there to read (as the real client does).
        match s.write_all(&HELLO) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e),
            _ => {}
        }
        let mut frame = [0u8; 5];
        s.read_exact(&mut frame)?;
        Ok(frame[4])
    };
    let answer = match UnixStream::connect(&sock).and_then(first) {
        Ok(b) => b.to_string(),
        Err(e) => format!("failed: {e}"),
    };
    println!("\nANSWER={answer}");
}

/// The socket is owner-only; should its mode be opened (by hand, by a umask, by a copy),
/// the owner still serves no other user: it asks the kernel who connected.
/// Needs root, to run the child as `nobody`; skipped otherwise, and says so.
#[tokio::test]
async fn another_users_connection_is_refused_even_when_the_mode_lets_it_in() {
    use std::os::unix::process::CommandExt;
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: running a child as another user needs root");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let open_mode = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    open_mode(tmp.path(), 0o755);
    // The child runs a copy of this binary that `nobody` may read (the build's may sit in
    // a private directory).
    let exe = tmp.path().join("child");
    std::fs::copy(std::env::current_exe().expect("current exe"), &exe).expect("copy");
    open_mode(&exe, 0o755);
    let data = tmp.path().join("data");
    let mq = open_at(&data, "");
    let sock = data.join("admin.sock");
    open_mode(&data, 0o755);
    open_mode(&sock, 0o666);

    let home = tmp.path().to_owned();
    let ask = move |uid: Option<u32>| {
        let mut child = Command::new(&exe);
        child
            .args([PEER_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(PEER_SOCKET_ENV, &sock)
            .current_dir(&home);
        if let Some(uid) = uid {
            child.uid(uid).gid(uid);
        }
        let out = child.output().expect("run child");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let answer = text.lines().find_map(|l| l.strip_prefix("ANSWER="));
        let err = String::from_utf8_lossy(&out.stderr);
        answer
            .unwrap_or_else(|| panic!("no answer from the child: {text}\n{err}"))
            .to_owned()
    };
    let answers = tokio::task::spawn_blocking(move || (ask(Some(65534)), ask(None)));
    let (nobody, owner) = answers.await.expect("join");
    assert_eq!(nobody, ERROR_VARIANT.to_string(), "another user is refused");
    assert_eq!(owner, "0", "the owner's user is served (Response::Hello)");
    mq.close().await.expect("close");
}

/// A client whose owner went away and came back (a restart of the application) serves
/// again: the call that finds the old connection dead fails, the next one reconnects.
#[tokio::test]
async fn a_client_reconnects_after_its_owner_restarted() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open_at(tmp.path(), "");
    publish_n(&mq, "t", 1).await;
    let client = connect(tmp.path());
    assert_eq!(client.topic_info("t").expect("info").next, 1);
    mq.close().await.expect("close");
    let mq = open_at(tmp.path(), "");
    publish_n(&mq, "t", 1).await;
    let first = client.topic_info("t");
    let next = match first {
        Ok(info) => info.next,
        Err(_) => client.topic_info("t").expect("reconnected").next,
    };
    assert_eq!(next, 2, "the new owner's state");
    mq.close().await.expect("close");
}

/// A `fetch` through the owner answers at most about 8 MiB (but always its first record),
/// so that no answer holds much of the owner's memory; a reader asks again for the rest.
#[tokio::test]
async fn a_fetch_answer_stays_small_and_the_rest_comes_by_asking_again() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open_at(tmp.path(), "Max Message Bytes=16777216");
    for i in 0..3u8 {
        mq.publish("big", vec![i; 5 << 20], &Headers::new())
            .await
            .expect("publish");
    }
    let dir = tmp.path().to_owned();
    let got = tokio::task::spawn_blocking(move || {
        let client = connect(&dir);
        let mut sizes = Vec::new();
        let mut from = 0;
        while from < 3 {
            let records = client.fetch("big", from, 10).expect("fetch");
            sizes.push(records.len());
            from = records.last().expect("a record").offset() + 1;
        }
        sizes
    });
    assert_eq!(
        got.await.expect("join"),
        [1, 1, 1],
        "5 MiB each: one an answer"
    );
    mq.close().await.expect("close");
}

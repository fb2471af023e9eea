//! The live cluster's broker against misbehaving clients: garbage, truncated and oversized
//! messages (some with fds), clients that never send or never read, clients that die
//! mid-request, a flood of connections, and running out of file descriptors. After each, the
//! cluster has not restarted (same postmaster start time, same broker pid), segments work, and
//! the broker's fd count is back where it was.
//!
//! The broker serves only processes of the cluster's uid, so the abuse that must reach it runs
//! in a forked child that takes the data directory's owner's uid (the tests run as root in CI,
//! the cluster as `postgres`; as the owner, the child keeps its uid). The protocol's bytes are
//! written here by hand, on purpose: the test crate does not link the extension.

use pg_uvm_share_tests::*;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

// --- the protocol (see crates/uvm_core/src/broker/protocol.rs) ---------------------------------------------------

const OP_PUT: u16 = 1;
const OP_GET: u16 = 2;
const OP_STATS: u16 = 4;
const OK: u16 = 0;
const BAD_REQUEST: u16 = 3;
const VERSION_MISMATCH: u16 = 5;
const TOO_MANY_CLIENTS: u16 = 7;
const OUT_OF_RESOURCES: u16 = 8;

fn request(op: u16, epoch: u64, chunk: u64) -> Vec<u8> {
    let mut b = b"UVMB".to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&op.to_le_bytes());
    b.extend_from_slice(&16u32.to_le_bytes());
    b.extend_from_slice(&epoch.to_le_bytes());
    b.extend_from_slice(&chunk.to_le_bytes());
    b
}

/// The status of a response.
fn status_of(reply: &[u8]) -> u16 {
    assert_eq!(reply.len(), 20, "a response is 20 bytes: {reply:?}");
    assert_eq!(&reply[..4], b"UVMB");
    u16::from_le_bytes([reply[6], reply[7]])
}

fn cvt(rc: isize) -> io::Result<isize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn socket_path() -> PathBuf {
    PathBuf::from(env_var("UVM_PGDATA")).join("pg_uvm_share.sock")
}

/// A blocking connection to the broker with 5 s send/receive timeouts (also bounding connect).
fn connect_broker() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the fd is owned right away.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) } as isize)?;
    // SAFETY: a fresh fd owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let tv = libc::timeval { tv_sec: 5, tv_usec: 0 };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: setsockopt reads a timeval from a live local.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
    let path = socket_path();
    let bytes = path.as_os_str().as_encoded_bytes();
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long: {path:?}");
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_un of `len` bytes.
    cvt(unsafe { libc::connect(sock.as_raw_fd(), &addr as *const _ as *const libc::sockaddr, len) } as isize)?;
    Ok(sock)
}

/// Sends one message with `fds` in SCM_RIGHTS; `nonblocking` uses MSG_DONTWAIT.
fn send(sock: &OwnedFd, msg: &[u8], fds: &[RawFd], nonblocking: bool) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: msg.as_ptr() as *mut libc::c_void, iov_len: msg.len() };
    let mut cbuf = [0u64; 64];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if !fds.is_empty() {
        let data_len = std::mem::size_of_val(fds) as u32;
        hdr.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE is arithmetic.
        hdr.msg_controllen = unsafe { libc::CMSG_SPACE(data_len) } as usize;
        assert!(hdr.msg_controllen <= std::mem::size_of_val(&cbuf));
        // SAFETY: the control buffer holds one header and `fds`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&hdr);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data_len) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut RawFd, fds.len());
        }
    }
    let flags = libc::MSG_NOSIGNAL | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: hdr references live buffers for the duration of the call.
    cvt(unsafe { libc::sendmsg(sock.as_raw_fd(), &hdr, flags) }).map(|_| ())
}

/// Receives one message (closing any fd that came with it); Ok(None) at end of file.
fn recv(sock: &OwnedFd, nonblocking: bool) -> io::Result<Option<Vec<u8>>> {
    let mut buf = [0u8; 64];
    let flags = libc::MSG_CMSG_CLOEXEC | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    hdr.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: hdr references live buffers for the duration of the call.
    let n = cvt(unsafe { libc::recvmsg(sock.as_raw_fd(), &mut hdr, flags) })? as usize;
    // SAFETY: walking the control messages the kernel wrote; received fds are ours to close.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            if (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    libc::close(std::ptr::read_unaligned((libc::CMSG_DATA(c) as *const RawFd).add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
    }
    Ok(if n == 0 { None } else { Some(buf[..n].to_vec()) })
}

/// One exchange: the reply's status, or None when the broker closed the connection (with no
/// notice left to read). A 5 s silence is an error.
fn exchange(sock: &OwnedFd, msg: &[u8], fds: &[RawFd]) -> Result<Option<u16>, String> {
    let gone = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET));
    if let Err(e) = send(sock, msg, fds, false) {
        if !gone(&e) {
            return Err(format!("send: {e}"));
        }
        return Ok(recv(sock, true).ok().flatten().map(|r| status_of(&r)));
    }
    loop {
        match recv(sock, false) {
            Ok(r) => return Ok(r.map(|r| status_of(&r))),
            Err(e) if gone(&e) => continue, // ECONNRESET first, then whatever is still queued
            Err(e) => return Err(format!("no reply: {e}")),
        }
    }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array on success.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds are new and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Whether every copy of the pipe's write end is closed, waiting up to 2 s.
fn writers_closed(read_end: &OwnedFd) -> bool {
    let mut p = libc::pollfd { fd: read_end.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll on one live pollfd.
    let n = unsafe { libc::poll(&mut p, 1, 2000) };
    n == 1 && p.revents & libc::POLLHUP != 0
}

/// Raises this process's soft open-file limit to the hard one (the flood holds 1,000 sockets).
fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit read and write a live local.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// Runs `f` as the cluster's OS user: in a forked child that takes the data directory's owner's
/// uid and gid (or in this process, when it is that user). The child's error comes back through
/// a pipe.
fn as_cluster_owner(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    let meta = std::fs::metadata(env_var("UVM_PGDATA")).expect("stat the data directory");
    let (uid, gid) = (meta.uid(), meta.gid());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == uid {
        raise_nofile();
        return f();
    }
    let (read_end, write_end) = pipe();
    // SAFETY: the tests run one at a time (--test-threads=1): no other thread holds a lock the
    // child could need; glibc's malloc is fork-safe. The child leaves by _exit, running no
    // destructor of the parent's objects.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        drop(read_end);
        let r = (|| {
            raise_nofile();
            // SAFETY: plain credential calls of this (child) process.
            unsafe {
                if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                    return Err(format!("cannot become uid {uid}: {}", io::Error::last_os_error()));
                }
            }
            f()
        })();
        let code = match r {
            Ok(()) => 0,
            Err(msg) => {
                // SAFETY: writing a local buffer to our pipe.
                unsafe { libc::write(write_end.as_raw_fd(), msg.as_ptr() as *const libc::c_void, msg.len()) };
                1
            }
        };
        // SAFETY: ends the child at once, without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    drop(write_end);
    let mut msg = Vec::new();
    {
        use std::io::Read;
        let mut f = std::fs::File::from(read_end);
        let _ = f.read_to_end(&mut msg);
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(format!("child (uid {uid}) failed with status {status:#x}: {}", String::from_utf8_lossy(&msg)))
    }
}

/// The cluster as it was: postmaster start time, broker pid, broker fd count.
struct Before {
    started: String,
    broker: i32,
    fds: usize,
}

fn before(c: &mut Client) -> Before {
    // Warm this backend's broker connection first, so that it is part of the baseline.
    check_segments(c, "warm");
    let broker = wait_broker(c, Duration::from_secs(30));
    let started: String = c.query_one("SELECT pg_postmaster_start_time()::text", &[]).unwrap().get(0);
    Before { started, broker, fds: fd_count(broker) }
}

/// Creates, writes, reads back and drops a segment.
fn check_segments(c: &mut Client, tag: &str) {
    let name = unique_name(tag);
    let _guard = SegmentGuard::with(&[&name]);
    create_segment(c, &name, 4 * MIB as i64);
    let data = pattern(MIB, 77);
    write_segment(c, &name, 12345, &data);
    assert_bytes_eq(&read_segment(c, &name, 12345, MIB as i32), &data, "segment read back");
    drop_segment(c, &name);
}

/// The cluster did not restart, segments work, and the broker's fds are back to `b.fds`.
fn assert_survived(b: &Before) {
    let mut c = connect();
    let started: String = c.query_one("SELECT pg_postmaster_start_time()::text", &[]).unwrap().get(0);
    assert_eq!(started, b.started, "the cluster restarted");
    assert_eq!(broker_pid(&mut c), Some(b.broker), "the broker changed");
    assert!(process_alive(b.broker));
    check_segments(&mut c, "after");
    check_segments(&mut connect(), "after_new");
    drop(c);
    let back = wait_until(Duration::from_secs(15), || fd_count(b.broker) == b.fds);
    assert!(back, "the broker holds {} fds, {} before:\n  {}", fd_count(b.broker), b.fds, fd_listing(b.broker));
}

fn epoch(c: &mut Client) -> u64 {
    let e = device_info(c).into_iter().find(|(k, _)| k == "epoch").expect("device_info has the epoch").1;
    u64::from_str_radix(&e, 16).unwrap_or_else(|_| panic!("epoch {e:?} is not hex"))
}

#[test]
fn broker_survives_garbage_idle_greedy_and_dying_clients() {
    let mut admin = connect();
    let b = before(&mut admin);
    let epoch = epoch(&mut admin);
    let r = as_cluster_owner(|| {
        let stats = request(OP_STATS, epoch, 0);
        // Clients that connect and never send, held all along.
        let idle: Vec<OwnedFd> = (0..20).map(|_| connect_broker()).collect::<Result<_, _>>().map_err(|e| format!("idle: {e}"))?;

        // Garbage, truncated and oversized messages: refused, and the connection still works.
        let c = connect_broker().map_err(|e| format!("connect: {e}"))?;
        let mut v7 = stats.clone();
        v7[4] = 7;
        let garbage: Vec<(&str, Vec<u8>, u16)> = vec![
            ("one byte", vec![1], BAD_REQUEST),
            ("a header", stats[..12].to_vec(), BAD_REQUEST),
            ("one short", stats[..27].to_vec(), BAD_REQUEST),
            ("one long", [&stats[..], &[0]].concat(), BAD_REQUEST),
            ("bad op", request(99, epoch, 0), BAD_REQUEST),
            ("another version", v7, VERSION_MISMATCH),
            ("oversized", vec![0xee; 4000], BAD_REQUEST),
            ("noise", pattern(28, 5), BAD_REQUEST),
        ];
        for (what, msg, want) in &garbage {
            let got = exchange(&c, msg, &[])?;
            if got != Some(*want) {
                return Err(format!("{what}: got {got:?}, want {want}"));
            }
        }
        // Fds that come with refused messages are closed by the broker.
        let fd_cases: Vec<(&str, Vec<u8>, usize)> = vec![
            ("garbage + fd", pattern(40, 6), 1),
            ("oversized + fd", vec![1; 300], 1),
            ("GET + fd", request(OP_GET, epoch, 1), 1),
            ("PUT + 2 fds", request(OP_PUT, epoch, 1 << 40), 2),
            ("PUT + 30 fds", request(OP_PUT, epoch, 1 << 40), 30),
        ];
        for (what, msg, n) in fd_cases {
            let (read_end, write_end) = pipe();
            let copies: Vec<OwnedFd> = (0..n).map(|_| write_end.try_clone().unwrap()).collect();
            drop(write_end);
            let raw: Vec<RawFd> = copies.iter().map(|f| f.as_raw_fd()).collect();
            let got = exchange(&c, &msg, &raw)?;
            if got != Some(BAD_REQUEST) {
                return Err(format!("{what}: got {got:?}"));
            }
            drop(copies);
            if !writers_closed(&read_end) {
                return Err(format!("{what}: the broker kept an fd it refused"));
            }
        }
        if exchange(&c, &stats, &[])? != Some(OK) {
            return Err("the garbage client is no longer served".into());
        }

        // A client that sends without ever reading its replies is dropped; others are served.
        let greedy = connect_broker().map_err(|e| format!("connect: {e}"))?;
        let start = Instant::now();
        let mut sent = 0;
        loop {
            match send(&greedy, &stats, &[], true) {
                Ok(()) => sent += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET)) => break,
                Err(e) => return Err(format!("greedy: {e}")),
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err(format!("the broker answered {sent} unread requests and never dropped their sender"));
            }
        }
        let polite = connect_broker().map_err(|e| format!("connect: {e}"))?;
        let t = Instant::now();
        if exchange(&polite, &stats, &[])? != Some(OK) || t.elapsed() > Duration::from_secs(1) {
            return Err(format!("a polite client was not served at once ({:?})", t.elapsed()));
        }

        // Clients that die mid-request.
        for _ in 0..100 {
            let d = connect_broker().map_err(|e| format!("connect: {e}"))?;
            for _ in 0..3 {
                let _ = send(&d, &stats, &[], true);
            }
            drop(d);
        }
        for (i, c) in idle.iter().enumerate().take(3) {
            if exchange(c, &stats, &[])? != Some(OK) {
                return Err(format!("idle client {i} is no longer served"));
            }
        }
        if exchange(&polite, &stats, &[])? != Some(OK) {
            return Err("the polite client is no longer served".into());
        }
        Ok(())
    });
    r.unwrap();
    assert_survived(&b);
}

#[test]
fn broker_survives_a_flood_of_connections() {
    let mut admin = connect();
    let b = before(&mut admin);
    let epoch = epoch(&mut admin);
    // The broker serves MaxBackends + 64 connections (src/broker/worker.rs). PostgreSQL 18
    // counts autovacuum_worker_slots where earlier versions count autovacuum_max_workers.
    let max_backends: i64 = admin
        .query_one(
            "SELECT (current_setting('max_connections')::int \
                  + coalesce(current_setting('autovacuum_worker_slots', true), current_setting('autovacuum_max_workers'))::int + 1 \
                  + current_setting('max_worker_processes')::int + current_setting('max_wal_senders')::int)::bigint",
            &[],
        )
        .unwrap()
        .get(0);
    let cap = max_backends as usize + 64;
    let flood = 1000;
    assert!(flood > cap + 100, "the flood ({flood}) must exceed the broker's cap ({cap})");
    let r = as_cluster_owner(|| {
        let stats = request(OP_STATS, epoch, 0);
        let conns: Vec<OwnedFd> =
            (0..flood).map(|_| connect_broker()).collect::<Result<_, _>>().map_err(|e| format!("flood connect: {e}"))?;
        let (mut served, mut refused) = (0, 0);
        for c in &conns {
            match exchange(c, &stats, &[])? {
                Some(OK) => served += 1,
                Some(TOO_MANY_CLIENTS) | None => refused += 1,
                Some(s) => return Err(format!("unexpected status {s}")),
            }
        }
        if served > cap || refused < flood - cap {
            return Err(format!("{served} served and {refused} refused of {flood}, with a cap of {cap}"));
        }
        if served == 0 {
            return Err("no connection of the flood was served".into());
        }
        Ok(())
    });
    r.unwrap();
    assert_survived(&b);
}

/// Issue 25, point 6: 500 connections from a process that is not the cluster's (this test)
/// held open, and a new session still creates a segment within a second: foreign connections
/// keep to the broker's margin (64) and are refused past it, so the cluster's processes never
/// wait for one to be evicted as idle (10 s before).
#[test]
fn a_flood_of_foreign_connections_does_not_lock_out_a_new_session() {
    use std::io::Read;
    let mut admin = connect();
    let b = before(&mut admin);
    let epoch = epoch(&mut admin);
    let (ready_r, ready_w) = pipe();
    let (release_r, release_w) = pipe();
    // The flood lives in a thread (as the cluster's owner: a process forked for it, when this
    // test runs as another user) until this test has done its part. A forked child inherits
    // this process's end of the release pipe and closes it, so that it sees the pipe close.
    let (release_w_fd, me) = (release_w.as_raw_fd(), std::process::id());
    let flood = std::thread::spawn(move || {
        as_cluster_owner(move || {
            if std::process::id() != me {
                // SAFETY: the forked child's inherited copy, which nothing in it owns.
                unsafe { libc::close(release_w_fd) };
            }
            let stats = request(OP_STATS, epoch, 0);
            let conns: Vec<OwnedFd> =
                (0..500).map(|_| connect_broker()).collect::<Result<_, _>>().map_err(|e| format!("flood connect: {e}"))?;
            let mut served = 0;
            for c in &conns {
                match exchange(c, &stats, &[])? {
                    Some(OK) => served += 1,
                    Some(TOO_MANY_CLIENTS) | None => {}
                    Some(s) => return Err(format!("unexpected status {s}")),
                }
            }
            if served > 64 {
                return Err(format!("{served} of the flood's 500 connections served, more than the margin of 64"));
            }
            // SAFETY: writing one byte from a live local to our pipe.
            unsafe { libc::write(ready_w.as_raw_fd(), b"r".as_ptr() as *const libc::c_void, 1) };
            let mut f = std::fs::File::from(release_r);
            let _ = f.read(&mut [0u8; 1]); // returns when the test closes its end
            drop(conns);
            Ok(())
        })
    });
    let mut ready = [0u8; 1];
    let got = std::fs::File::from(ready_r).read(&mut ready).unwrap_or(0);
    if got == 1 {
        let mut c = connect();
        let name = unique_name("after_flood");
        let _guard = SegmentGuard::with(&[&name]);
        let t = Instant::now();
        let r = c.query_one("SELECT uvm.create_segment($1, 1048576)", &[&name]);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        drop(release_w);
        r.expect("create_segment during the flood");
        eprintln!("create_segment in a new session during a flood of 500 foreign connections: {ms:.1} ms");
        assert!(ms < 1000.0, "create_segment took {ms:.0} ms during the flood");
    } else {
        drop(release_w);
    }
    flood.join().unwrap().unwrap();
    assert_eq!(got, 1, "the flood never got ready");
    assert_survived(&b);
}

/// The soft and hard open-file limits of a process, from /proc/<pid>/limits.
fn nofile_limits(pid: i32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read /proc/<pid>/limits");
    let line = text.lines().find(|l| l.starts_with("Max open files")).expect("a 'Max open files' line");
    let v: Vec<u64> = line["Max open files".len()..].split_whitespace().take(2).map(|x| x.parse().unwrap()).collect();
    (v[0], v[1])
}

/// Sets a process's soft open-file limit. prlimit(2) on another process needs its uid (or
/// CAP_SYS_RESOURCE, which a container's root may lack): done as the cluster's owner.
fn set_nofile(pid: i32, soft: u64, hard: u64) -> Result<(), String> {
    as_cluster_owner(|| {
        let lim = libc::rlimit { rlim_cur: soft as libc::rlim_t, rlim_max: hard as libc::rlim_t };
        // SAFETY: prlimit on a process of the cluster, reading a live local.
        match unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) } {
            0 => Ok(()),
            _ => Err(format!("prlimit({pid}, {soft}): {}", io::Error::last_os_error())),
        }
    })
}

/// Restores the broker's open-file limit on scope exit (a failing test must not leave the
/// broker crippled for the tests that follow).
struct LimitGuard {
    pid: i32,
    old: (u64, u64),
}

impl Drop for LimitGuard {
    fn drop(&mut self) {
        if let Err(e) = set_nofile(self.pid, self.old.0, self.old.1) {
            eprintln!("could not restore the broker's open-file limit: {e}");
        }
    }
}

#[test]
fn broker_survives_running_out_of_fds() {
    let mut admin = connect();
    let b = before(&mut admin);
    // The lowest fd number the broker has free: with the soft limit there, it can open none.
    let open: std::collections::HashSet<u64> = std::fs::read_dir(format!("/proc/{}/fd", b.broker))
        .expect("list the broker's fds (the tests run as root or as the cluster's owner)")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let lowest_free = (0..).find(|fd| !open.contains(fd)).unwrap();
    let old = nofile_limits(b.broker);
    let guard = LimitGuard { pid: b.broker, old };
    set_nofile(b.broker, lowest_free, old.1).unwrap();

    // A new session needs a new broker connection: refused, with a clear error.
    let mut fresh = connect();
    let name = unique_name("nofds");
    let _g = SegmentGuard::with(&[&name]);
    expect_sqlstate(
        fresh.query_one("SELECT uvm.create_segment($1, $2)::bigint", &[&name, &(4 * MIB as i64)]),
        "53400",
        "create_segment while the broker has no fd left",
    );
    // An existing connection is still served, but a chunk's fd cannot be received.
    expect_sqlstate(
        admin.query_one("SELECT uvm.create_segment($1, $2)::bigint", &[&name, &(4 * MIB as i64)]),
        "53400",
        "create_segment on a connected session while the broker has no fd left",
    );
    // Raw connections (any uid: the refusal comes before the uid check) get a notice.
    for i in 0..5 {
        let c = connect_broker().expect("connect");
        let got = exchange(&c, &request(OP_STATS, 0, 0), &[]).unwrap();
        assert!(matches!(got, Some(OUT_OF_RESOURCES) | None), "connection {i}: {got:?}");
    }
    drop(guard); // the broker may open fds again
    drop(fresh);
    assert_survived(&b);
}

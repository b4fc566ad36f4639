//! A private `redis-server` on a free port of 127.0.0.1, killed on drop, so
//! that a test can kill and restart it (never the system's one).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::ChildServer;

/// A `redis-server` child process, empty and keeping nothing on disk.
///
/// # Example
///
/// ```no_run
/// let mut redis = resilience_testkit::redis::RedisServer::start();
/// assert!(redis.pong());
/// redis.kill();
/// assert!(!redis.pong());
/// redis.restart(); // the same port, empty again
/// assert!(redis.url().starts_with("redis://127.0.0.1:"));
/// ```
#[derive(Debug)]
pub struct RedisServer(ChildServer);

impl RedisServer {
    /// Starts one on a free port and waits until it answers.
    ///
    /// # Panics
    ///
    /// When `redis-server` cannot be started or does not answer within
    /// 10 s: check for it first where a test may skip (see
    /// `tower_breaker_conformance::server_found`).
    pub fn start() -> Self {
        Self(ChildServer::start("redis-server", command, pong))
    }

    /// [`start`](Self::start), with what went wrong as an error (for a
    /// program that reports it, such as a demo that starts its own).
    ///
    /// # Errors
    ///
    /// When `redis-server` cannot be started or does not answer within
    /// 10 s.
    pub fn try_start() -> Result<Self, String> {
        ChildServer::try_start("redis-server", command, pong).map(Self)
    }

    /// Whether a `redis-server` is on the `PATH` (it answers `--version`).
    pub fn installed() -> bool {
        Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.0.port()
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// Kills it (SIGKILL: no goodbye to the clients).
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Starts it (again) on the same port, empty, and waits until it
    /// answers.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn restart(&mut self) {
        self.0.restart();
    }

    /// [`restart`](Self::restart), with what went wrong as an error.
    ///
    /// # Errors
    ///
    /// As [`try_start`](Self::try_start).
    pub fn try_restart(&mut self) -> Result<(), String> {
        self.0.try_restart()
    }

    /// Whether it answers a `PING` now (within a second).
    pub fn pong(&self) -> bool {
        pong(self.port())
    }
}

fn command(port: u16) -> Command {
    let mut command = Command::new("redis-server");
    command
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--enable-debug-command", "local"])
        .stdin(Stdio::null())
        .arg("--dir")
        .arg(std::env::temp_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

fn pong(port: u16) -> bool {
    let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let mut answer = [0; 5];
    c.set_read_timeout(Some(Duration::from_secs(1))).is_ok()
        && c.write_all(b"PING\r\n").is_ok()
        && c.read_exact(&mut answer).is_ok()
        && &answer == b"+PONG"
}

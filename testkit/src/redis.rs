//! A private `redis-server` on a free port of 127.0.0.1, killed on drop, so
//! that a test can kill and restart it (never the system's one).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers.
    ///
    /// # Panics
    ///
    /// When `redis-server` cannot be started or does not answer within
    /// 10 s: check for it first where a test may skip (see
    /// `tower_breaker_conformance::server_found`).
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Self { child: None, port };
        server.restart();
        server
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL: no goodbye to the clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it (again) on the same port, empty, and waits until it
    /// answers.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (`.ci/run` installs it)");
        self.child = Some(child);
        for _ in 0..1000 {
            if self.pong() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// Whether it answers a `PING` now (within a second).
    pub fn pong(&self) -> bool {
        let Ok(mut c) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let mut answer = [0; 5];
        c.set_read_timeout(Some(Duration::from_secs(1))).is_ok()
            && c.write_all(b"PING\r\n").is_ok()
            && c.read_exact(&mut answer).is_ok()
            && &answer == b"+PONG"
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

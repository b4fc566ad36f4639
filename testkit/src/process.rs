//! A server the tests start as a child process on a free port of
//! 127.0.0.1, kill and restart on the same port, and kill on drop.

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::Duration;

/// A child-process server on a port of 127.0.0.1 of its own.
///
/// # Example
///
/// ```
/// use std::process::Command;
/// use resilience_testkit::process::ChildServer;
///
/// // A "server" that is ready at once and lives 60 s (or until killed).
/// let mut server = ChildServer::start(
///     "sleep",
///     |_port| {
///         let mut command = Command::new("sleep");
///         command.arg("60");
///         command
///     },
///     |_port| true,
/// );
/// let pid = server.pid();
/// server.restart();
/// assert_ne!(server.pid(), pid);
/// ```
pub struct ChildServer {
    name: &'static str,
    command: Box<dyn Fn(u16) -> Command + Send + Sync>,
    ready: fn(u16) -> bool,
    child: Option<Child>,
    port: u16,
}

impl std::fmt::Debug for ChildServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildServer")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("pid", &self.child.as_ref().map(Child::id))
            .finish_non_exhaustive()
    }
}

impl ChildServer {
    /// Picks a free port, spawns `command(port)` and waits until
    /// `ready(port)`.
    ///
    /// # Panics
    ///
    /// When the command cannot be spawned or is not ready within 10 s
    /// (`name` says which server).
    pub fn start(
        name: &'static str,
        command: impl Fn(u16) -> Command + Send + Sync + 'static,
        ready: fn(u16) -> bool,
    ) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Self {
            name,
            command: Box::new(command),
            ready,
            child: None,
            port,
        };
        server.restart();
        server
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id (to stop and continue it).
    ///
    /// # Panics
    ///
    /// When it was killed and not restarted.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Kills it (SIGKILL: no goodbye to the clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it (again) on the same port and waits until it is ready.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn restart(&mut self) {
        self.kill();
        let child = (self.command)(self.port).spawn().unwrap_or_else(|e| {
            panic!(
                "{} must be installed (`.ci/run` installs it): {e}",
                self.name
            )
        });
        self.child = Some(child);
        for _ in 0..1000 {
            if (self.ready)(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{} on port {} did not start", self.name, self.port);
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.kill();
    }
}

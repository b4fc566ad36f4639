//! A server the tests start as a child process on a free port of
//! 127.0.0.1, kill and restart on the same port, and kill on drop.

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::Duration;

/// Waits, off the runtime's threads, for a child process the test started
/// (a member of a fleet, say) to exit successfully, and returns what it
/// printed after `tag` on the first line of its standard output that
/// holds `tag`. Panics if it failed or printed no such line.
///
/// # Example
///
/// ```
/// use std::process::{Command, Stdio};
/// use resilience_testkit::process::result_line;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let child = Command::new("echo")
///     .arg("member-result calls=3")
///     .stdout(Stdio::piped())
///     .spawn()
///     .unwrap();
/// assert_eq!(result_line(child, "member-result ").await, "calls=3");
/// # }
/// ```
pub async fn result_line(child: Child, tag: &str) -> String {
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("the wait's task")
        .expect("the child's output");
    assert!(out.status.success(), "the child failed: {}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.split_once(tag).map(|(_, r)| r.to_owned()))
        .unwrap_or_else(|| panic!("no {tag:?} in {stdout:?}"))
}

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
    /// (`name` says which server); [`try_start`](Self::try_start) says so
    /// as an error instead.
    pub fn start(
        name: &'static str,
        command: impl Fn(u16) -> Command + Send + Sync + 'static,
        ready: fn(u16) -> bool,
    ) -> Self {
        Self::try_start(name, command, ready).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start`](Self::start), with what went wrong as an error (for a
    /// program that reports it rather than a test that fails).
    ///
    /// # Errors
    ///
    /// No free port, the command could not be spawned, it exited at once,
    /// or it was not ready within 10 s.
    pub fn try_start(
        name: &'static str,
        command: impl Fn(u16) -> Command + Send + Sync + 'static,
        ready: fn(u16) -> bool,
    ) -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port on 127.0.0.1 for {name}: {e}"))?
            .port();
        let mut server = Self {
            name,
            command: Box::new(command),
            ready,
            child: None,
            port,
        };
        server.try_restart()?;
        Ok(server)
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
        if let Err(e) = self.try_restart() {
            panic!("{e}");
        }
    }

    /// [`restart`](Self::restart), with what went wrong as an error.
    ///
    /// # Errors
    ///
    /// As [`try_start`](Self::try_start).
    pub fn try_restart(&mut self) -> Result<(), String> {
        self.kill();
        let (name, port) = (self.name, self.port);
        let child = (self.command)(port)
            .spawn()
            .map_err(|e| format!("{name} must be installed (`.ci/run` installs it): {e}"))?;
        let child = self.child.insert(child);
        for _ in 0..1000 {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(format!("{name} on port {port} exited at once ({status})"));
            }
            if (self.ready)(port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err(format!("{name} on port {port} was not ready within 10 s"))
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_an_error_that_names_it() {
        let e = ChildServer::try_start(
            "no-such-server",
            |_port| Command::new("/nonexistent/no-such-server"),
            |_port| true,
        )
        .unwrap_err();
        assert!(e.starts_with("no-such-server must be installed"), "{e}");
    }

    #[test]
    fn a_program_that_exits_at_once_is_said_to_have_exited() {
        // Not "was not ready within 10 s": the wait notices the exit.
        let e = ChildServer::try_start("false", |_port| Command::new("false"), |_port| false)
            .unwrap_err();
        assert!(e.contains("exited at once"), "{e}");
    }

    #[test]
    #[should_panic(expected = "no-such-server must be installed")]
    fn start_panics_with_the_error() {
        ChildServer::start(
            "no-such-server",
            |_port| Command::new("/nonexistent/no-such-server"),
            |_port| true,
        );
    }
}

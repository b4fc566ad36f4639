//! An instance frozen between invocations, as AWS Lambda freezes one as
//! soon as its handler returns, for a store's OS-process tests: the test
//! binary runs itself again in an instance role ([`serve`]), and the
//! parent drives it ([`Instance`]): one invocation per line it sends,
//! `SIGSTOP` after each one has returned, `SIGCONT` before the next. Unix
//! only (it signals with the `kill` command).
//!
//! # Example
//!
//! ```no_run
//! use tower_breaker_conformance::frozen::{serve, Instance};
//!
//! // The instance role: a test that does nothing unless its variable is set.
//! # async fn instance_role() {
//! if std::env::var("MY_INSTANCE").is_ok() {
//!     serve(async || { /* one invocation: calls through the breaker */ }).await;
//!     println!("flushed"); // after its last flush
//! }
//! # }
//! // The parent.
//! let mut instance = Instance::spawn("instance_role", "MY_INSTANCE", "redis://...");
//! instance.invoke();
//! instance.freeze();
//! instance.thaw();
//! let took = instance.exit("flushed");
//! ```

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The parent's handle of an instance process.
#[derive(Debug)]
pub struct Instance {
    child: Child,
    stdin: ChildStdin,
    out: Lines<BufReader<ChildStdout>>,
    took: Vec<u64>,
}

impl Instance {
    /// Runs the test `role` of this test binary (alone, output not
    /// captured) with `var` set to `value`.
    ///
    /// # Panics
    ///
    /// When the process cannot be started.
    #[must_use]
    pub fn spawn(role: &str, var: &str, value: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", role, "--nocapture", "--test-threads=1"])
            .env(var, value)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the instance process");
        let stdin = child.stdin.take().expect("piped");
        let out = BufReader::new(child.stdout.take().expect("piped")).lines();
        Self {
            child,
            stdin,
            out,
            took: Vec::new(),
        }
    }

    /// One invocation: returns once the instance's handler has returned.
    ///
    /// # Panics
    ///
    /// When the instance ended early.
    pub fn invoke(&mut self) {
        writeln!(self.stdin, "go").expect("write to the instance");
        self.wait_for("returned");
    }

    /// Freezes the instance (`SIGSTOP`).
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Thaws it (`SIGCONT`).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// Tells the instance to end, waits until it printed `last` and exited
    /// with success; returns the median time an invocation took, in
    /// microseconds, as the instance measured it.
    ///
    /// # Panics
    ///
    /// When the instance ended early or failed.
    pub fn exit(mut self, last: &str) -> u64 {
        writeln!(self.stdin, "exit").expect("write to the instance");
        self.wait_for(last);
        assert!(self.child.wait().expect("the instance").success());
        self.took.sort_unstable();
        self.took.get(self.took.len() / 2).copied().unwrap_or(0)
    }

    fn wait_for(&mut self, word: &str) {
        loop {
            let line = self
                .out
                .next()
                .expect("the instance ended early")
                .expect("read the instance's output");
            // The first may follow the test harness's "test ... " on its line.
            if line.ends_with(word) {
                if let Some(us) = line.split("took ").nth(1) {
                    if let Some(Ok(us)) = us.split(' ').next().map(str::parse) {
                        self.took.push(us);
                    }
                }
                return;
            }
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal}");
    }
}

/// The instance's side: for each `go` line on stdin, awaits `invocation`
/// and prints how long it took and `returned`; returns at `exit` or at the
/// end of stdin.
pub async fn serve(mut invocation: impl AsyncFnMut()) {
    let mut lines = BufReader::new(std::io::stdin()).lines();
    while let Some(Ok(line)) = lines.next() {
        if line == "exit" {
            break;
        }
        let started = tokio::time::Instant::now();
        invocation().await;
        println!("took {} returned", started.elapsed().as_micros());
        std::io::stdout().flush().expect("write to the parent");
    }
}

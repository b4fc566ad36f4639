//! Small helpers the example binaries share: serving an axum app on a free
//! port of 127.0.0.1, and reporting what an example checked.

use std::net::SocketAddr;

/// Serves `app` on a free port of 127.0.0.1 in a background task and
/// returns its address.
///
/// # Panics
///
/// If no port of 127.0.0.1 can be bound: the examples cannot run at all.
pub async fn serve_local(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Prints `ok: what` or `FAILED: what`, and remembers the failures so the
/// example can exit non-zero at the end.
///
/// # Example
///
/// ```
/// let mut failures = Vec::new();
/// examples::demo::check(1 + 1 == 2, "arithmetic works", &mut failures);
/// assert!(failures.is_empty());
/// ```
pub fn check(ok: bool, what: &str, failures: &mut Vec<String>) {
    println!("   {} {what}", if ok { "ok:" } else { "FAILED:" });
    if !ok {
        failures.push(what.to_owned());
    }
}

/// A demo's parsed arguments, or its exit: an empty error message (asked
/// for `--help`) prints `usage` and exits 0; any other prints the message
/// and `usage` to stderr and exits 2.
///
/// # Example
///
/// ```
/// let rate: u32 = examples::demo::args_or_exit("100".parse().map_err(|_| "bad rate".to_owned()), "usage: demo RATE");
/// assert_eq!(rate, 100);
/// ```
pub fn args_or_exit<T>(parsed: Result<T, String>, usage: &str) -> T {
    match parsed {
        Ok(args) => args,
        Err(message) if message.is_empty() => {
            println!("{usage}");
            std::process::exit(0);
        }
        Err(message) => {
            eprintln!("{message}\n\n{usage}");
            std::process::exit(2);
        }
    }
}

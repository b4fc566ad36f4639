//! A TCP proxy in front of a local server that can stop forwarding
//! without closing anything (a partition without FIN or RST: the
//! connections stay open, nothing gets through) and heal.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The proxy; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Connections are closed at once (a server that is down).
    down: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    /// The pumps of the connections forwarded so far.
    pumps: Arc<Mutex<Vec<JoinHandle<()>>>>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free port of 127.0.0.1 to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let down = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let pumps = Arc::new(Mutex::new(Vec::new()));
        let (c, d, a, p) = (cut.clone(), down.clone(), accepted.clone(), pumps.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                a.fetch_add(1, SeqCst);
                if d.load(SeqCst) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let mut pumps = p.lock().unwrap();
                pumps.push(tokio::spawn(pump(cr, sw, c.clone())));
                pumps.push(tokio::spawn(pump(sr, cw, c.clone())));
            }
        });
        Self {
            addr,
            cut,
            down,
            accepted,
            pumps,
            task,
        }
    }

    /// The proxy's address as a `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Stops forwarding, in both directions, on every connection (old and
    /// new ones), without closing any.
    pub fn partition(&self) {
        self.cut.store(true, SeqCst);
    }

    /// Forwards again (what was held back goes through, late).
    pub fn heal(&self) {
        self.cut.store(false, SeqCst);
    }

    /// Closes every connection and closes new ones at once, as a server
    /// that went down: clients see their connections end.
    pub fn go_down(&self) {
        self.down.store(true, SeqCst);
        for pump in self.pumps.lock().unwrap().drain(..) {
            pump.abort();
        }
    }

    /// Forwards new connections again, as a server that came back.
    pub fn come_up(&self) {
        self.down.store(false, SeqCst);
    }

    /// The connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while cut.load(SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while cut.load(SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

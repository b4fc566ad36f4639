//! A TCP proxy in front of a local server that can stop forwarding
//! without closing anything (a partition without FIN or RST: the
//! connections stay open, nothing gets through) and heal.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The proxy; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free port of 127.0.0.1 to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let (c, a) = (cut.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                a.fetch_add(1, SeqCst);
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, c.clone()));
                tokio::spawn(pump(sr, cw, c.clone()));
            }
        });
        Self {
            addr,
            cut,
            accepted,
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

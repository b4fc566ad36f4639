//! TLS settings of a [`RedisTarget`] (feature `tls`): rustls, with
//! `ring` as its crypto provider.

use std::fmt;

use redis::{ClientTlsConfig, TlsCertificates};

use super::RedisTarget;

/// The PEM files of a target: the CAs it trusts and its client identity.
#[derive(Clone, Default)]
pub(super) struct TlsFiles {
    ca_pem: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

// === impl TlsFiles ===

impl TlsFiles {
    pub(super) fn is_set(&self) -> bool {
        self.ca_pem.is_some() || self.client.is_some()
    }

    /// What the `redis` crate takes (`None`: the system's roots, no client
    /// certificate).
    pub(super) fn certificates(&self) -> Option<TlsCertificates> {
        if !self.is_set() {
            return None;
        }
        Some(TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca_pem.clone(),
        })
    }
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca_pem.is_some())
            .field(
                "client_identity",
                &self.client.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

// === impl RedisTarget ===

impl RedisTarget {
    /// Trusts only the certificate authorities in `pem` (one or more PEM
    /// certificates) instead of the system's, and uses TLS for every data
    /// node of the target, whatever its URL's scheme.
    ///
    /// Without it, `rediss://` URLs trust the system's roots (which is
    /// what a managed service with a public CA, such as ElastiCache's
    /// in-transit encryption, needs). A server whose certificate does not
    /// chain to a trusted CA, or does not name the host (or IP address)
    /// connected to, is refused: [`RedisStore::connect_with`] fails with
    /// the reason, and a lazy store's calls fail (the breakers fail open
    /// and count it).
    ///
    /// The PEM is parsed when the store is built: a bad one is a
    /// [`ConnectError`] then.
    ///
    /// # Crypto provider
    ///
    /// TLS uses rustls with the `ring` provider. Before its first TLS
    /// connection the store installs `ring` as rustls's process-wide
    /// default provider, unless the process installed one already (then
    /// that one is used).
    ///
    /// [`RedisStore::connect_with`]: crate::RedisStore::connect_with
    /// [`ConnectError`]: crate::ConnectError
    ///
    /// # Example
    ///
    /// ```no_run
    /// use tower_breaker_redis::{RedisOptions, RedisStore, RedisTarget};
    ///
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), tower_breaker::BoxError> {
    /// let ca = std::fs::read("/etc/redis/ca.pem")?;
    /// let target = RedisTarget::node("rediss://10.0.0.5:6380")?
    ///     .tls_ca_pem(ca)
    ///     .user("breaker", std::env::var("REDIS_PASSWORD")?);
    /// let store = RedisStore::connect_with(target, RedisOptions::new()).await?;
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// Presents the client certificate `cert_pem` (with its chain) and its
    /// private key `key_pem` to servers that ask for one (mutual TLS,
    /// `tls-auth-clients yes`), and uses TLS for every data node of the
    /// target. The key never appears in `Debug` output or errors.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use tower_breaker_redis::RedisTarget;
    ///
    /// # fn main() -> Result<(), tower_breaker::BoxError> {
    /// let target = RedisTarget::node("rediss://10.0.0.5:6380")?
    ///     .tls_ca_pem(std::fs::read("/etc/redis/ca.pem")?)
    ///     .tls_client_cert_pem(
    ///         std::fs::read("/etc/breaker/client.pem")?,
    ///         std::fs::read("/etc/breaker/client.key")?,
    ///     );
    /// # let _ = target;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_cert_pem(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }
}

/// Makes `ring` rustls's process-wide provider, unless one is installed:
/// the `redis` crate builds its TLS configurations with the default
/// provider, and would panic if it had to choose between two.
pub(super) fn install_provider() {
    // An error means a provider is installed already: keep it.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

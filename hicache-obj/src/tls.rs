//! The TLS crypto provider of the object_store S3 client.
//!
//! reqwest is built without a provider of its own (`rustls-no-provider`), so it uses the
//! process's default rustls provider. This makes ring that default unless the application
//! installed one first: an application that chose aws-lc-rs (or a FIPS build) keeps it.

/// Installs ring as the default rustls provider when none is installed yet.
pub(crate) fn ensure_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one in between; whichever won is then the default,
        // which is all reqwest needs.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A one-connection server on loopback for the TLS tests: it keeps the first bytes a client
/// sends and answers plain HTTP, so an https client gets an error.
#[cfg(test)]
pub(crate) struct FirstBytes {
    port: u16,
    server: std::thread::JoinHandle<[u8; 3]>,
}

#[cfg(test)]
impl FirstBytes {
    pub(crate) fn listen() -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut first = [0u8; 3];
            conn.read_exact(&mut first).unwrap();
            let _ = conn.write_all(b"HTTP/1.1 400 not tls\r\n\r\n");
            first
        });
        FirstBytes { port, server }
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Fails unless the client's first bytes were a TLS ClientHello: a record of type
    /// handshake (0x16), TLS 1.x (0x03 ..).
    pub(crate) fn assert_client_hello(self) {
        // Had the client never connected, this empty connection ends the server's wait,
        // and its read fails the test instead of hanging it.
        drop(std::net::TcpStream::connect(("127.0.0.1", self.port)));
        let first = self.server.join().unwrap();
        assert_eq!(&first[..2], &[0x16, 0x03], "{first:?}");
    }
}

#[cfg(test)]
mod tests {
    use object_store::aws::AmazonS3Builder;
    use object_store::path::Path;
    use object_store::{ClientOptions, ObjectStoreExt, RetryConfig};

    use super::FirstBytes;

    /// An https endpoint gets a real TLS ClientHello from the ring-backed client, and a
    /// server that answers garbage is an error, not a panic (reqwest panics when it builds
    /// a TLS client without a provider).
    #[test]
    fn https_requests_speak_tls_through_ring() {
        super::ensure_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());

        let server = FirstBytes::listen();
        let store = AmazonS3Builder::new()
            .with_bucket_name("bucket")
            .with_region("us-east-1")
            .with_endpoint(server.endpoint())
            .with_access_key_id("id")
            .with_secret_access_key("secret")
            .with_client_options(
                ClientOptions::new().with_timeout(std::time::Duration::from_secs(5)),
            )
            .with_retry(RetryConfig {
                max_retries: 0,
                ..Default::default()
            })
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = runtime.block_on(store.head(&Path::from("page")));
        assert!(result.is_err(), "{result:?}");
        server.assert_client_hello();
    }
}

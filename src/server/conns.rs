//! Client connections and their limits, so that no local process can
//! exhaust the proxy: every node agent reaches it from 127.0.0.1, so
//! limits go by client identity (a verified certificate's user, a bearer
//! token's digest, or "anonymous"), not by address.
//!
//! - `maxConnections` in all and `maxConnectionsPerClient` per identity:
//!   past either, the connection that has been idle longest (no request in
//!   flight; a watch keeps its connection busy) in that scope is closed to
//!   make room; when none is idle the new connection is refused. Idle
//!   connections are what a flood is made of, and a real client's
//!   connection is idle only between requests, so a flood no longer locks
//!   kubelet out.
//! - `maxRequestsInFlightPerClient`: requests of one identity waiting for
//!   their response headers (a watch counts until it is established, as
//!   kube-apiserver's max-in-flight filter exempts long-running requests);
//!   past it, `429` with `Retry-After: 1` and kube-apiserver's text
//!   (`staging/src/k8s.io/apiserver/pkg/server/filters/maxinflight.go`).
//! - Idle connections are closed like kube-apiserver's: an HTTP/1.1 one
//!   that has not sent a request's headers within 32 s
//!   (`ReadHeaderTimeout`), an HTTP/2 one without a stream for 90 s
//!   (`IdleTimeout`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

/// HTTP/2 connections without a stream for this long are closed, as
/// kube-apiserver's `IdleTimeout`.
pub const H2_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Limits on connections and requests.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    pub max_requests_in_flight_per_client: usize,
}

/// Why a request or connection was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No room, and no idle connection to close.
    Connections,
    /// The client has `maxRequestsInFlightPerClient` requests waiting.
    InFlight,
}

#[derive(Debug)]
struct Conn {
    client: Arc<str>,
    /// Requests (streams) in flight, including open watches.
    active: usize,
    /// Since when nothing was in flight.
    idle_since: Instant,
    /// Cancelled to close the connection (gracefully).
    close: CancellationToken,
}

#[derive(Debug, Default)]
struct Client {
    conns: usize,
    waiting: usize,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    conns: HashMap<u64, Conn>,
    clients: HashMap<Arc<str>, Client>,
}

/// Every client connection.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Mutex<Inner>>,
    limits: Limits,
}

/// One connection's membership; dropping it removes the connection.
#[derive(Debug)]
pub struct ConnHandle {
    registry: Registry,
    id: u64,
    close: CancellationToken,
}

/// A request in flight on a connection; dropping it ends it.
#[derive(Debug)]
pub struct Active {
    registry: Registry,
    id: u64,
}

/// A request waiting for its response headers.
#[derive(Debug)]
pub struct Waiting {
    registry: Registry,
    client: Arc<str>,
}

/// The identity key of a request without a verified certificate: a digest
/// of its bearer token (never the token), or anonymous.
pub fn token_client(token: Option<&str>) -> Arc<str> {
    match token {
        Some(t) => {
            let d = Sha256::digest(t.as_bytes());
            let hex: String = d[..12].iter().map(|b| format!("{b:02x}")).collect();
            Arc::from(format!("token:{hex}"))
        }
        None => Arc::from("anonymous"),
    }
}

impl Inner {
    fn client(&mut self, key: &Arc<str>) -> &mut Client {
        self.clients.entry(key.clone()).or_default()
    }

    fn release_client(&mut self, key: &Arc<str>) {
        if let Some(c) = self.clients.get(key)
            && c.conns == 0
            && c.waiting == 0
        {
            self.clients.remove(key);
        }
    }

    /// Closes the connection idle longest among those `of` selects.
    fn evict_idle(&mut self, of: impl Fn(&Conn) -> bool) -> bool {
        let victim = self
            .conns
            .iter()
            .filter(|(_, c)| c.active == 0 && !c.close.is_cancelled() && of(c))
            .min_by_key(|(_, c)| c.idle_since)
            .map(|(id, _)| *id);
        match victim.and_then(|id| self.conns.get(&id)) {
            Some(c) => {
                c.close.cancel();
                true
            }
            None => false,
        }
    }

    fn open(&self) -> usize {
        self.conns
            .values()
            .filter(|c| !c.close.is_cancelled())
            .count()
    }
}

// === impl Registry ===

impl Registry {
    /// An empty registry with `limits`.
    pub fn new(limits: Limits) -> Registry {
        Registry {
            inner: Arc::new(Mutex::new(Inner::default())),
            limits,
        }
    }

    /// Admits a new connection of `client`, closing the idle connection
    /// idle longest if that is what makes room.
    ///
    /// # Errors
    /// [`Refused::Connections`] when there is no room.
    pub fn admit(&self, client: Arc<str>) -> Result<ConnHandle, Refused> {
        let mut inner = self.inner.lock();
        self.make_room(&mut inner, &client)?;
        inner.next_id += 1;
        let id = inner.next_id;
        let close = CancellationToken::new();
        inner.client(&client).conns += 1;
        inner.conns.insert(
            id,
            Conn {
                client,
                active: 0,
                idle_since: Instant::now(),
                close: close.clone(),
            },
        );
        Ok(ConnHandle {
            registry: self.clone(),
            id,
            close,
        })
    }

    fn make_room(&self, inner: &mut Inner, client: &Arc<str>) -> Result<(), Refused> {
        let per_client = inner.clients.get(client).map_or(0, |c| c.conns);
        if per_client >= self.limits.max_connections_per_client
            && !inner.evict_idle(|c| c.client == *client)
        {
            return Err(Refused::Connections);
        }
        if inner.open() >= self.limits.max_connections && !inner.evict_idle(|_| true) {
            return Err(Refused::Connections);
        }
        Ok(())
    }

    /// Connections open (not being closed).
    pub fn open(&self) -> usize {
        self.inner.lock().open()
    }
}

// === impl ConnHandle ===

impl ConnHandle {
    /// Cancelled when the connection should close (evicted for another).
    pub fn closed(&self) -> &CancellationToken {
        &self.close
    }

    /// Moves the connection to `client` (known once its first request
    /// shows a bearer token), within that client's connection limit.
    ///
    /// # Errors
    /// [`Refused::Connections`] when `client` has no room.
    pub fn identify(&self, client: &Arc<str>) -> Result<(), Refused> {
        let mut inner = self.registry.inner.lock();
        let Some(current) = inner.conns.get(&self.id).map(|c| c.client.clone()) else {
            return Ok(());
        };
        if current == *client {
            return Ok(());
        }
        let per_client = inner.clients.get(client).map_or(0, |c| c.conns);
        if per_client >= self.registry.limits.max_connections_per_client
            && !inner.evict_idle(|c| c.client == *client)
        {
            return Err(Refused::Connections);
        }
        inner.client(&current).conns -= 1;
        inner.release_client(&current);
        inner.client(client).conns += 1;
        if let Some(c) = inner.conns.get_mut(&self.id) {
            c.client = client.clone();
        }
        Ok(())
    }

    /// The connection's client.
    pub fn client(&self) -> Arc<str> {
        self.registry
            .inner
            .lock()
            .conns
            .get(&self.id)
            .map_or_else(|| Arc::from(""), |c| c.client.clone())
    }

    /// A request starts: the connection is busy until the returned guard
    /// (held until the response body ends) is dropped.
    pub fn active(&self) -> Active {
        if let Some(c) = self.registry.inner.lock().conns.get_mut(&self.id) {
            c.active += 1;
        }
        Active {
            registry: self.registry.clone(),
            id: self.id,
        }
    }

    /// A request of the connection's client waits for its response
    /// headers, within `maxRequestsInFlightPerClient`.
    ///
    /// # Errors
    /// [`Refused::InFlight`] past the limit.
    pub fn waiting(&self) -> Result<Waiting, Refused> {
        let mut inner = self.registry.inner.lock();
        let Some(client) = inner.conns.get(&self.id).map(|c| c.client.clone()) else {
            return Err(Refused::InFlight);
        };
        let limit = self.registry.limits.max_requests_in_flight_per_client;
        let c = inner.client(&client);
        if c.waiting >= limit {
            return Err(Refused::InFlight);
        }
        c.waiting += 1;
        Ok(Waiting {
            registry: self.registry.clone(),
            client,
        })
    }

    /// Since when the connection has had nothing in flight, if it has not.
    pub fn idle_since(&self) -> Option<Instant> {
        self.registry
            .inner
            .lock()
            .conns
            .get(&self.id)
            .filter(|c| c.active == 0)
            .map(|c| c.idle_since)
    }
}

impl Drop for ConnHandle {
    fn drop(&mut self) {
        let mut inner = self.registry.inner.lock();
        if let Some(c) = inner.conns.remove(&self.id) {
            inner.client(&c.client).conns -= 1;
            inner.release_client(&c.client);
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if let Some(c) = self.registry.inner.lock().conns.get_mut(&self.id) {
            c.active = c.active.saturating_sub(1);
            if c.active == 0 {
                c.idle_since = Instant::now();
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut inner = self.registry.inner.lock();
        if let Some(c) = inner.clients.get_mut(&self.client) {
            c.waiting = c.waiting.saturating_sub(1);
        }
        inner.release_client(&self.client);
    }
}

/// kube-apiserver's answer past its in-flight limit: `429`, plain text,
/// `Retry-After: 1` (`tooManyRequests` in `filters/maxinflight.go`).
pub fn too_many_requests() -> http::Response<apimachinery::body::Body> {
    let mut resp = http::Response::new(apimachinery::body::full(
        "Too many requests, please try again later.\n",
    ));
    *resp.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    h.insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(total: usize, per_client: usize, in_flight: usize) -> Registry {
        Registry::new(Limits {
            max_connections: total,
            max_connections_per_client: per_client,
            max_requests_in_flight_per_client: in_flight,
        })
    }

    #[test]
    fn a_full_registry_closes_the_longest_idle_connection_never_a_busy_one() {
        let r = registry(3, 10, 10);
        let kubelet = r.admit("cert:kubelet".into()).unwrap();
        let _watch = kubelet.active();
        let idle1 = r.admit("anonymous".into()).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let idle2 = r.admit("anonymous".into()).unwrap();
        // Full: the oldest idle one makes room.
        let third = r.admit("anonymous".into()).unwrap();
        assert!(idle1.closed().is_cancelled());
        assert!(!idle2.closed().is_cancelled() && !kubelet.closed().is_cancelled());
        drop(idle1);
        // Full of busy connections: a new one is refused.
        let _a = idle2.active();
        let _b = third.active();
        assert_eq!(r.admit("x".into()).unwrap_err(), Refused::Connections);
        assert!(!kubelet.closed().is_cancelled());
    }

    #[test]
    fn per_client_limits_leave_other_clients_alone() {
        let r = registry(100, 2, 1);
        let a1 = r.admit("anonymous".into()).unwrap();
        let a2 = r.admit("anonymous".into()).unwrap();
        let k = r.admit("cert:kubelet".into()).unwrap();
        let a3 = r.admit("anonymous".into()).unwrap();
        assert!(a1.closed().is_cancelled() && !a2.closed().is_cancelled());
        assert!(!k.closed().is_cancelled() && !a3.closed().is_cancelled());
        // A connection that turns out to carry a token moves to its client.
        let token = token_client(Some("secret"));
        assert!(!token.contains("secret"));
        a3.identify(&token).unwrap();
        assert_eq!(a3.client(), token);
        // One request of a client waiting for headers at a time here.
        let w = k.waiting().unwrap();
        assert_eq!(k.waiting().unwrap_err(), Refused::InFlight);
        assert!(a2.waiting().is_ok());
        drop(w);
        assert!(k.waiting().is_ok());
    }

    #[test]
    fn idleness_follows_requests() {
        let r = registry(10, 10, 10);
        let c = r.admit("a".into()).unwrap();
        assert!(c.idle_since().is_some());
        let a = c.active();
        assert!(c.idle_since().is_none());
        drop(a);
        assert!(c.idle_since().is_some());
        drop(c);
        assert_eq!(r.open(), 0);
        assert!(r.inner.lock().clients.is_empty());
    }
}

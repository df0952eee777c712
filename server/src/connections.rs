//! What one client may hold of the server: its open connections, capped in all and per client
//! address, so that one client cannot take every socket and task the server has; its sessions
//! at once and how often it may join, so that one client cannot take every session or keep the
//! server building pipelines; and whether the server still takes new connections (it stops on
//! SIGTERM or SIGINT).
//!
//! A client is its IPv4 address, or its IPv6 address's /64: one host or subscriber is given a
//! whole /64, and could otherwise take a new address from it for every connection. Behind a
//! proxy the operator names (`--trusted-proxy`), a client is the address the proxy says it
//! forwards for (`X-Forwarded-For`); anyone else's header is ignored.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A client as the caps count it (see the module's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client(IpAddr);

impl Client {
    pub fn of(address: IpAddr) -> Self {
        match address.to_canonical() {
            IpAddr::V4(v4) => Self(IpAddr::V4(v4)),
            IpAddr::V6(v6) => Self(IpAddr::V6(Ipv6Addr::from_bits(
                v6.to_bits() & !u128::from(u64::MAX),
            ))),
        }
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// The proxies whose `X-Forwarded-For` names the client (`--trusted-proxy`).
#[derive(Debug, Default, Clone)]
pub struct TrustedProxies(Vec<IpAddr>);

impl fmt::Display for TrustedProxies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listed: Vec<String> = self.0.iter().map(IpAddr::to_string).collect();
        f.write_str(&listed.join(", "))
    }
}

/// The most entries of `X-Forwarded-For` read, right to left: a chain of proxies is short.
const MOST_FORWARDED: usize = 32;

impl TrustedProxies {
    pub fn new(addresses: &[IpAddr]) -> Self {
        Self(addresses.iter().map(IpAddr::to_canonical).collect())
    }

    pub fn trusts(&self, address: IpAddr) -> bool {
        self.0.contains(&address.to_canonical())
    }

    /// The client a request from the trusted proxy `peer` comes for: of the addresses its
    /// `X-Forwarded-For` headers list (`forwarded`, in order), the right-most that is not itself
    /// a trusted proxy (each proxy appends the address it was reached from, and only those to
    /// its right are trusted to have told the truth); the left-most where all are, and `peer`
    /// where there are none (the proxy's own request). An entry that is no address is refused:
    /// the proxy is misconfigured.
    pub fn client<'a>(
        &self,
        peer: IpAddr,
        forwarded: impl IntoIterator<Item = &'a str>,
    ) -> Result<IpAddr, String> {
        let entries: Vec<&str> = forwarded
            .into_iter()
            .flat_map(|header| header.split(','))
            .map(str::trim)
            .collect();
        let mut client = peer;
        for entry in entries.iter().rev().take(MOST_FORWARDED) {
            client = forwarded_address(entry).ok_or_else(|| {
                let shown: String = entry.chars().take(64).collect();
                format!("X-Forwarded-For from the trusted proxy {peer} names {shown:?}, not an address")
            })?;
            if !self.trusts(client) {
                break;
            }
        }
        Ok(client)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An `X-Forwarded-For` entry's address: `192.0.2.1`, `2001:db8::1`, or either with a port
/// (`192.0.2.1:5000`, `[2001:db8::1]:5000`), or an IPv6 address in brackets.
fn forwarded_address(entry: &str) -> Option<IpAddr> {
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|address| address.ip()))
        .or_else(|| {
            entry
                .strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|inner| inner.parse::<Ipv6Addr>().ok())
                .map(IpAddr::V6)
        })
        .map(|address| address.to_canonical())
}

/// How many of something each client holds.
#[derive(Default)]
struct PerClient(HashMap<Client, usize>);

impl PerClient {
    /// Counts one more for `client` unless it holds `most` already.
    fn add(&mut self, client: Client, most: usize) -> bool {
        let held = self.0.entry(client).or_default();
        if *held >= most {
            return false;
        }
        *held += 1;
        true
    }

    fn remove(&mut self, client: Client) {
        if let Some(held) = self.0.get_mut(&client) {
            *held -= 1;
            if *held == 0 {
                self.0.remove(&client);
            }
        }
    }
}

pub struct Connections {
    max: usize,
    max_per_client: usize,
    open: Mutex<Open>,
    closed: Condvar,
    stopping: AtomicBool,
}

#[derive(Default)]
struct Open {
    all: usize,
    by_client: PerClient,
}

/// An admitted connection; counted until dropped. A trusted proxy's counts against its client's
/// cap once its request names the client ([`Admitted::forwarded_for`]).
pub struct Admitted {
    connections: Arc<Connections>,
    client: Mutex<Option<Client>>,
}

impl Connections {
    pub fn new(max: usize, max_per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            max_per_client,
            open: Mutex::default(),
            closed: Condvar::new(),
            stopping: AtomicBool::new(false),
        })
    }

    /// Counts a new connection from `address`, or says why it is refused. A trusted proxy's
    /// (`proxy`) counts in all alone until its request names its client.
    pub fn admit(self: &Arc<Self>, address: IpAddr, proxy: bool) -> Result<Admitted, String> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err("the server is shutting down".into());
        }
        let client = (!proxy).then(|| Client::of(address));
        let mut open = self.open.lock().unwrap();
        if open.all >= self.max {
            return Err(format!("the server has its most connections ({})", self.max));
        }
        if let Some(client) = client
            && !open.by_client.add(client, self.max_per_client)
        {
            return Err(self.client_refusal(client));
        }
        open.all += 1;
        Ok(Admitted {
            connections: self.clone(),
            client: Mutex::new(client),
        })
    }

    fn client_refusal(&self, client: Client) -> String {
        format!("{client} has its most connections ({})", self.max_per_client)
    }

    /// Takes no new connection from now on.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Waits until every connection has ended, up to `patience`; the connections still open.
    pub fn wait_for_all(&self, patience: Duration) -> usize {
        let open = self.open.lock().unwrap();
        let (open, _) = self
            .closed
            .wait_timeout_while(open, patience, |open| open.all > 0)
            .unwrap();
        open.all
    }
}

impl Admitted {
    /// Counts a trusted proxy's connection against the cap of the client it forwards for
    /// (`address`), or says why it is refused; once.
    pub fn forwarded_for(&self, address: IpAddr) -> Result<(), String> {
        let mut counted = self.client.lock().unwrap();
        if counted.is_some() {
            return Ok(());
        }
        let client = Client::of(address);
        let connections = &self.connections;
        if !connections
            .open
            .lock()
            .unwrap()
            .by_client
            .add(client, connections.max_per_client)
        {
            return Err(connections.client_refusal(client));
        }
        *counted = Some(client);
        Ok(())
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.connections.open.lock().unwrap();
        open.all -= 1;
        if let Some(client) = *self.client.lock().unwrap() {
            open.by_client.remove(client);
        }
        self.connections.closed.notify_all();
    }
}

/// The sessions each client has open at once, at most `max` (0: no cap).
pub struct SessionsPerClient {
    max: usize,
    open: Mutex<PerClient>,
}

/// A client's place for one session; given back when dropped.
pub struct SessionPlace {
    owner: Arc<SessionsPerClient>,
    client: Client,
}

impl SessionsPerClient {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            open: Mutex::default(),
        })
    }

    /// A place for one more session of `client`, or why there is none.
    pub fn take(self: &Arc<Self>, client: Client) -> Result<SessionPlace, String> {
        let most = if self.max == 0 { usize::MAX } else { self.max };
        if !self.open.lock().unwrap().add(client, most) {
            return Err(format!("{client} has its most sessions ({})", self.max));
        }
        Ok(SessionPlace {
            owner: self.clone(),
            client,
        })
    }
}

impl Drop for SessionPlace {
    fn drop(&mut self) {
        self.owner.open.lock().unwrap().remove(self.client);
    }
}

/// How often each client may join: a bucket of `per_minute` joins that refills at that rate,
/// so that a burst of a page's reloads passes and a flood does not (0: no limit).
pub struct JoinRate {
    per_minute: u32,
    buckets: Mutex<HashMap<Client, Bucket>>,
}

struct Bucket {
    joins_left: f64,
    at: Instant,
}

/// Buckets kept before the full ones (clients that have not joined for a while) are dropped.
const BUCKETS_KEPT: usize = 1024;

impl JoinRate {
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            buckets: Mutex::default(),
        }
    }

    /// Counts a join of `client` at `now`, or says why it is refused.
    pub fn join(&self, client: Client, now: Instant) -> Result<(), String> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let most = f64::from(self.per_minute);
        let per_second = most / 60.0;
        let refilled = |bucket: &Bucket| {
            let seconds = now.saturating_duration_since(bucket.at).as_secs_f64();
            (bucket.joins_left + seconds * per_second).min(most)
        };
        let mut buckets = self.buckets.lock().unwrap();
        if buckets.len() >= BUCKETS_KEPT {
            buckets.retain(|_, bucket| refilled(bucket) < most);
        }
        let bucket = buckets.entry(client).or_insert(Bucket {
            joins_left: most,
            at: now,
        });
        let joins_left = refilled(bucket);
        // A refused join takes nothing: a client that waits gets its joins back.
        let allowed = joins_left >= 1.0;
        *bucket = Bucket {
            joins_left: if allowed { joins_left - 1.0 } else { joins_left },
            at: now,
        };
        if !allowed {
            return Err(format!(
                "{client} joins too often (at most {} a minute)",
                self.per_minute
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_ipv6_client_is_its_64_and_a_mapped_ipv4_one_its_ipv4_address() {
        assert_eq!(
            Client::of(address("2001:db8:1:2:aaaa::1")),
            Client::of(address("2001:db8:1:2:ffff:1:2:3"))
        );
        assert_ne!(
            Client::of(address("2001:db8:1:2::1")),
            Client::of(address("2001:db8:1:3::1"))
        );
        assert_eq!(
            Client::of(address("::ffff:192.0.2.7")),
            Client::of(address("192.0.2.7"))
        );
        assert_ne!(Client::of(address("192.0.2.7")), Client::of(address("192.0.2.8")));
        assert_eq!(
            Client::of(address("2001:db8:1:2:aaaa::1")).to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(Client::of(address("::ffff:192.0.2.7")).to_string(), "192.0.2.7");
    }

    #[test]
    fn connections_are_capped_per_64_and_in_all_and_given_back_when_dropped() {
        let connections = Connections::new(3, 2);
        let first = connections.admit(address("2001:db8::1"), false).unwrap();
        let _second = connections.admit(address("2001:db8::ffff:2"), false).unwrap();
        let refused = connections.admit(address("2001:db8::3"), false).err().unwrap();
        assert_eq!(refused, "2001:db8::/64 has its most connections (2)");
        let _elsewhere = connections.admit(address("2001:db8:0:1::1"), false).unwrap();
        let refused = connections.admit(address("192.0.2.1"), false).err().unwrap();
        assert_eq!(refused, "the server has its most connections (3)");
        drop(first);
        let _again = connections.admit(address("2001:db8::4"), false).unwrap();
        assert_eq!(connections.wait_for_all(Duration::ZERO), 3);
        connections.stop();
        assert!(
            connections
                .admit(address("192.0.2.1"), false)
                .err()
                .unwrap()
                .contains("shutting down")
        );
    }

    #[test]
    fn a_client_that_gave_a_connection_back_is_still_held_to_its_most() {
        let connections = Connections::new(10, 2);
        let first = connections.admit(address("192.0.2.1"), false).unwrap();
        let _second = connections.admit(address("192.0.2.1"), false).unwrap();
        drop(first);
        let _third = connections.admit(address("192.0.2.1"), false).unwrap();
        assert_eq!(
            connections.admit(address("192.0.2.1"), false).err().unwrap(),
            "192.0.2.1 has its most connections (2)"
        );
    }

    /// The drain waits for the last connection to end. Its end comes a little after the wait
    /// began (a wait that returned at once would still see it open), but the count alone is
    /// asserted: the wait's patience is far longer than the pause.
    #[test]
    fn the_drain_waits_for_the_last_connection_to_end() {
        let connections = Connections::new(10, 10);
        let last = connections.admit(address("192.0.2.1"), false).unwrap();
        let ending = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(last);
        });
        assert_eq!(connections.wait_for_all(Duration::from_secs(60)), 0);
        ending.join().unwrap();
    }

    #[test]
    fn sessions_are_capped_per_client_and_given_back_when_dropped() {
        let sessions = SessionsPerClient::new(2);
        let client = Client::of(address("192.0.2.1"));
        let first = sessions.take(client).unwrap();
        let _second = sessions.take(client).unwrap();
        assert_eq!(
            sessions.take(client).err().unwrap(),
            "192.0.2.1 has its most sessions (2)"
        );
        assert!(
            sessions.take(Client::of(address("192.0.2.2"))).is_ok(),
            "another client"
        );
        drop(first);
        assert!(sessions.take(client).is_ok());
        let uncapped = SessionsPerClient::new(0);
        let places: Vec<_> = (0..100).map(|_| uncapped.take(client).unwrap()).collect();
        assert_eq!(places.len(), 100);
    }

    #[test]
    fn joins_past_the_rate_are_refused_until_the_bucket_refills() {
        let rate = JoinRate::new(3);
        let client = Client::of(address("2001:db8::1"));
        let start = Instant::now();
        for _ in 0..3 {
            rate.join(client, start).unwrap();
        }
        assert_eq!(
            rate.join(client, start).unwrap_err(),
            "2001:db8::/64 joins too often (at most 3 a minute)"
        );
        assert!(
            rate.join(Client::of(address("2001:db8:0:1::1")), start).is_ok(),
            "another /64"
        );
        // Three a minute: one more every 20 s, and a refused join takes none of it.
        assert!(rate.join(client, start + Duration::from_secs(19)).is_err());
        let later = start + Duration::from_secs(40);
        assert!(rate.join(client, later).is_ok());
        assert!(rate.join(client, later).is_ok());
        assert!(rate.join(client, later).is_err());
        let unlimited = JoinRate::new(0);
        assert!((0..1000).all(|_| unlimited.join(client, start).is_ok()));
    }

    #[test]
    fn the_buckets_of_clients_gone_quiet_are_dropped() {
        let rate = JoinRate::new(60);
        let start = Instant::now();
        for n in 0..BUCKETS_KEPT as u32 {
            rate.join(Client::of(IpAddr::from(n.to_be_bytes())), start)
                .unwrap();
        }
        // The first client's bucket is used up: 2 s later it has refilled by 2 joins only.
        let busy = Client::of(IpAddr::from(0u32.to_be_bytes()));
        for _ in 1..60 {
            rate.join(busy, start).unwrap();
        }
        let later = start + Duration::from_secs(2);
        rate.join(Client::of(address("192.0.2.1")), later).unwrap();
        assert_eq!(
            rate.buckets.lock().unwrap().len(),
            2,
            "the new one's, the busy one's"
        );
        rate.join(busy, later).unwrap();
        rate.join(busy, later).unwrap();
        assert!(rate.join(busy, later).is_err(), "a full table lets no one off");
    }

    #[test]
    fn a_trusted_proxys_header_names_the_right_most_address_not_a_trusted_proxy() {
        let proxies = TrustedProxies::new(&[address("198.51.100.1"), address("2001:db8::9")]);
        let proxy = address("198.51.100.1");
        let client = |headers: &[&str]| proxies.client(proxy, headers.iter().copied());
        assert_eq!(client(&["203.0.113.7"]), Ok(address("203.0.113.7")));
        // What the client wrote itself is left of what the proxy appended.
        assert_eq!(client(&["192.0.2.66, 203.0.113.7"]), Ok(address("203.0.113.7")));
        // A chain of trusted proxies; headers on several lines read as one list.
        assert_eq!(
            client(&["192.0.2.66, 203.0.113.7", "[2001:db8::9]:4000, 198.51.100.1"]),
            Ok(address("203.0.113.7"))
        );
        assert_eq!(
            client(&["2001:db8::9, 198.51.100.1"]),
            Ok(address("2001:db8::9")),
            "all trusted: the left-most"
        );
        assert_eq!(client(&[]), Ok(proxy), "no header: the proxy's own request");
        assert_eq!(client(&["203.0.113.7:5000"]), Ok(address("203.0.113.7")));
        assert_eq!(client(&["[2001:db8::1]"]), Ok(address("2001:db8::1")));
        assert_eq!(client(&["::ffff:203.0.113.7"]), Ok(address("203.0.113.7")));
        let refused = client(&["203.0.113.7, unknown"]).unwrap_err();
        assert_eq!(
            refused,
            "X-Forwarded-For from the trusted proxy 198.51.100.1 names \"unknown\", not an address"
        );
        assert!(client(&["192.0.2.1, ,"]).is_err(), "an empty entry");
        assert!(proxies.trusts(address("::ffff:198.51.100.1")));
        assert!(!proxies.trusts(address("198.51.100.2")));
        // What the start's log line says of them, and whether it says anything.
        assert_eq!(proxies.to_string(), "198.51.100.1, 2001:db8::9");
        assert!(!proxies.is_empty());
        assert!(TrustedProxies::new(&[]).is_empty());
    }

    #[test]
    fn a_trusted_proxys_connections_count_against_the_clients_they_forward_for() {
        let connections = Connections::new(10, 1);
        let proxy = address("198.51.100.1");
        let first = connections.admit(proxy, true).unwrap();
        let second = connections.admit(proxy, true).unwrap();
        first.forwarded_for(address("203.0.113.7")).unwrap();
        assert_eq!(
            second.forwarded_for(address("203.0.113.7")).unwrap_err(),
            "203.0.113.7 has its most connections (1)"
        );
        second.forwarded_for(address("203.0.113.8")).unwrap();
        // An untrusted peer is its own client, whatever it forwards.
        let direct = connections.admit(address("203.0.113.8"), false);
        assert_eq!(direct.err().unwrap(), "203.0.113.8 has its most connections (1)");
        drop(first);
        let third = connections.admit(proxy, true).unwrap();
        third.forwarded_for(address("203.0.113.7")).unwrap();
        assert_eq!(
            connections.wait_for_all(Duration::ZERO),
            2,
            "the second and the third"
        );
    }
}

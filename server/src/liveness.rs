//! Peers that vanish: a browser or a TTS sender gone without a word (its tab frozen, its link
//! down, its process killed or stopped) must not hold its session. Two watches say when a peer
//! is gone: the server pings each WebSocket peer and gives it `--peer-timeout` to be heard from
//! ([`Heartbeat`]), and a session's WebRTC peer must connect within `--connect-timeout` and may
//! not stay disconnected past `--peer-timeout` ([`IceWatch`], on webrtcbin's ICE connection
//! state). Both are plain timing, checked by the connection's own task.

use std::time::{Duration, Instant};

use futures_util::SinkExt;
use tungstenite::Message;

use crate::http::{self, Received, SHORT_WRITE, Socket};

/// The times of the watches (`--ping-interval`, `--peer-timeout`, `--connect-timeout`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerTimes {
    /// How often the server pings a WebSocket peer.
    pub ping_interval: Duration,
    /// How long a WebSocket peer may stay unheard, and a peer connection disconnected.
    pub peer_timeout: Duration,
    /// How long a session's peer connection may take to connect.
    pub connect_timeout: Duration,
}

impl PeerTimes {
    /// The times from seconds. A peer gets at least one ping to answer before it is judged.
    pub fn from_seconds(ping_interval: f64, peer_timeout: f64, connect_timeout: f64) -> Result<Self, String> {
        for (name, seconds) in [
            ("--ping-interval", ping_interval),
            ("--peer-timeout", peer_timeout),
            ("--connect-timeout", connect_timeout),
        ] {
            if !seconds.is_finite() || seconds <= 0.0 {
                return Err(format!("{name} must be above 0"));
            }
        }
        if peer_timeout <= ping_interval {
            return Err(format!(
                "--peer-timeout ({peer_timeout} s) must be longer than --ping-interval ({ping_interval} s): \
                 a peer needs a ping to answer"
            ));
        }
        Ok(Self {
            ping_interval: Duration::from_secs_f64(ping_interval),
            peer_timeout: Duration::from_secs_f64(peer_timeout),
            connect_timeout: Duration::from_secs_f64(connect_timeout),
        })
    }
}

/// Why a peer is taken for gone: a label for the metrics and a reason for the log and the
/// close frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    /// `timeout`, `ice_failed`, `ice_disconnected` or `never_connected`.
    pub label: &'static str,
    pub reason: String,
}

/// What is due on a WebSocket peer's connection.
#[derive(Debug, PartialEq, Eq)]
enum Beat {
    Wait,
    Ping,
    Gone,
}

/// The server's pings to one WebSocket peer, and when it was last heard from (any frame: a
/// message, a pong, a ping of its own).
pub struct Heartbeat {
    times: PeerTimes,
    heard: Instant,
    pinged: Instant,
}

impl Heartbeat {
    /// A peer heard from just now (its connection opened) and not yet pinged.
    pub fn new(times: PeerTimes) -> Self {
        let now = Instant::now();
        Self {
            times,
            heard: now,
            pinged: now,
        }
    }

    /// What `socket` gave (see [`http::received`]), noting any frame as the peer's sign of life.
    pub async fn received(
        &mut self,
        socket: &mut Socket,
        next: Option<Result<Message, tungstenite::Error>>,
    ) -> Received {
        let received = http::received(socket, next).await;
        if matches!(received, Received::Message(_)) {
            self.heard_at(Instant::now());
        }
        received
    }

    /// The peer showed it was there at `at` other than on its socket (an RTP sender's packets).
    pub fn heard_at(&mut self, at: Instant) {
        self.heard = self.heard.max(at);
    }

    /// When [`Heartbeat::beat`] has something to do next: a ping, or the verdict that the peer
    /// is gone.
    pub fn next_due(&self) -> Instant {
        (self.heard + self.times.peer_timeout).min(self.pinged + self.times.ping_interval)
    }

    fn due(&self, now: Instant) -> Beat {
        if now.saturating_duration_since(self.heard) >= self.times.peer_timeout {
            Beat::Gone
        } else if now.saturating_duration_since(self.pinged) >= self.times.ping_interval {
            Beat::Ping
        } else {
            Beat::Wait
        }
    }

    /// Pings the peer when a ping is due; the peer is gone once it has not been heard from for
    /// the peer timeout.
    pub async fn beat(&mut self, socket: &mut Socket) -> Result<(), Gone> {
        let now = Instant::now();
        match self.due(now) {
            Beat::Wait => Ok(()),
            Beat::Gone => Err(Gone {
                label: "timeout",
                reason: format!("answered no ping within {}", seconds(self.times.peer_timeout)),
            }),
            Beat::Ping => {
                self.pinged = now;
                // A ping that cannot leave yet (the peer reads nothing, its window is full)
                // stays queued in the socket, and a broken connection shows at the next read:
                // either way what is read decides.
                let _ =
                    tokio::time::timeout(SHORT_WRITE, socket.send(Message::Ping(Default::default()))).await;
                Ok(())
            }
        }
    }
}

/// webrtcbin's ICE connection state (`GstWebRTCICEConnectionState`), by its nick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IceState {
    New,
    Checking,
    Connected,
    Completed,
    Failed,
    Disconnected,
    Closed,
}

impl IceState {
    pub fn from_nick(nick: &str) -> Option<Self> {
        Some(match nick {
            "new" => Self::New,
            "checking" => Self::Checking,
            "connected" => Self::Connected,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "disconnected" => Self::Disconnected,
            "closed" => Self::Closed,
            _ => return None,
        })
    }
}

/// A session's peer connection as its ICE state tells it: whether it ever connected, and how
/// long it has been in its state.
#[derive(Debug)]
pub struct IceWatch {
    started: Instant,
    state: IceState,
    since: Instant,
    connected: bool,
}

impl IceWatch {
    /// A peer connection made at `now`, not yet connected.
    pub fn new(now: Instant) -> Self {
        Self {
            started: now,
            state: IceState::New,
            since: now,
            connected: false,
        }
    }

    pub fn observe(&mut self, state: IceState, now: Instant) {
        if state != self.state {
            self.state = state;
            self.since = now;
        }
        self.connected |= matches!(state, IceState::Connected | IceState::Completed);
    }

    /// When [`IceWatch::verdict`] may next change with no new state: the end of a disconnection's
    /// grace, or of the time to connect; now once ICE failed.
    pub fn next_verdict(&self, times: &PeerTimes) -> Option<Instant> {
        let disconnected = (self.state == IceState::Disconnected).then(|| self.since + times.peer_timeout);
        let connecting = (!self.connected).then(|| self.started + times.connect_timeout);
        let failed = (self.state == IceState::Failed).then_some(self.since);
        [disconnected, connecting, failed].into_iter().flatten().min()
    }

    /// Whether the peer is gone at `now`: its ICE failed, it was disconnected for the peer
    /// timeout, or it never connected within the connect timeout.
    pub fn verdict(&self, times: &PeerTimes, now: Instant) -> Option<Gone> {
        match self.state {
            IceState::Failed => Some(Gone {
                label: "ice_failed",
                reason: "its peer connection failed (ICE)".into(),
            }),
            IceState::Disconnected if now.saturating_duration_since(self.since) >= times.peer_timeout => {
                Some(Gone {
                    label: "ice_disconnected",
                    reason: format!(
                        "its peer connection was disconnected for {}",
                        seconds(times.peer_timeout)
                    ),
                })
            }
            _ if !self.connected && now.saturating_duration_since(self.started) >= times.connect_timeout => {
                Some(Gone {
                    label: "never_connected",
                    reason: format!(
                        "its peer connection did not connect within {}",
                        seconds(times.connect_timeout)
                    ),
                })
            }
            _ => None,
        }
    }
}

/// `2 s`, `1.5 s`: a time as the options give it.
fn seconds(time: Duration) -> String {
    format!("{} s", time.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times() -> PeerTimes {
        PeerTimes::from_seconds(1.0, 3.0, 5.0).unwrap()
    }

    fn after(start: Instant, seconds: f64) -> Instant {
        start + Duration::from_secs_f64(seconds)
    }

    #[test]
    fn the_times_are_checked() {
        assert_eq!(
            PeerTimes::from_seconds(5.0, 15.0, 20.0).unwrap(),
            PeerTimes {
                ping_interval: Duration::from_secs(5),
                peer_timeout: Duration::from_secs(15),
                connect_timeout: Duration::from_secs(20),
            }
        );
        for (ping, peer, connect) in [(0.0, 15.0, 20.0), (5.0, f64::NAN, 20.0), (5.0, 15.0, -1.0)] {
            let err = PeerTimes::from_seconds(ping, peer, connect).unwrap_err();
            assert!(err.contains("must be above 0"), "{err}");
        }
        let err = PeerTimes::from_seconds(5.0, 5.0, 20.0).unwrap_err();
        assert!(err.contains("longer than --ping-interval"), "{err}");
    }

    #[test]
    fn a_peer_is_pinged_every_interval_and_gone_after_the_timeout_unheard() {
        let mut heartbeat = Heartbeat::new(times());
        let start = heartbeat.heard;
        assert_eq!(heartbeat.due(after(start, 0.5)), Beat::Wait);
        assert_eq!(heartbeat.due(after(start, 1.0)), Beat::Ping);
        heartbeat.pinged = after(start, 1.0);
        assert_eq!(heartbeat.due(after(start, 1.5)), Beat::Wait);
        assert_eq!(heartbeat.due(after(start, 2.0)), Beat::Ping);
        // Heard from (its pong): the timeout counts from then.
        heartbeat.pinged = after(start, 2.0);
        heartbeat.heard = after(start, 2.1);
        assert_eq!(heartbeat.due(after(start, 4.9)), Beat::Ping);
        heartbeat.pinged = after(start, 4.9);
        assert_eq!(heartbeat.due(after(start, 5.0)), Beat::Wait);
        assert_eq!(heartbeat.due(after(start, 5.1)), Beat::Gone);
    }

    /// On the socket, by the clock: each wait is longer than the time it waits out.
    #[tokio::test]
    async fn a_due_ping_is_sent_and_a_peer_unheard_past_the_timeout_is_gone() {
        use futures_util::StreamExt;
        let (mut server, mut peer) = http::loopback().await;
        let mut heartbeat = Heartbeat::new(PeerTimes::from_seconds(0.001, 60.0, 60.0).unwrap());
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(heartbeat.beat(&mut server).await, Ok(()));
        let read = tokio::time::timeout(Duration::from_secs(10), peer.next()).await;
        assert!(matches!(read, Ok(Some(Ok(Message::Ping(_))))), "{read:?}");

        let mut heartbeat = Heartbeat::new(PeerTimes::from_seconds(0.001, 0.002, 60.0).unwrap());
        std::thread::sleep(Duration::from_millis(5));
        let before = heartbeat.heard;
        heartbeat.heard_at(Instant::now());
        assert!(heartbeat.heard > before, "heard from just now");
        std::thread::sleep(Duration::from_millis(5));
        let gone = heartbeat.beat(&mut server).await.unwrap_err();
        assert_eq!(
            (gone.label, gone.reason.as_str()),
            ("timeout", "answered no ping within 0.002 s")
        );
    }

    /// What the connection's task sleeps until: the next ping, or the verdict if it comes first;
    /// a sign of life older than the last one changes nothing.
    #[test]
    fn a_heartbeat_is_next_due_at_its_next_ping_or_its_verdict() {
        let mut heartbeat = Heartbeat::new(times());
        let start = heartbeat.heard;
        assert_eq!(heartbeat.next_due(), after(start, 1.0));
        heartbeat.pinged = after(start, 2.5);
        assert_eq!(heartbeat.next_due(), after(start, 3.0));
        assert_eq!(heartbeat.due(heartbeat.next_due()), Beat::Gone);
        heartbeat.heard_at(after(start, 2.0));
        assert_eq!(heartbeat.next_due(), after(start, 3.5));
        assert_eq!(heartbeat.due(heartbeat.next_due()), Beat::Ping);
        heartbeat.heard_at(after(start, 1.0));
        assert_eq!(
            heartbeat.heard,
            after(start, 2.0),
            "an older sign of life is not newer news"
        );
    }

    /// A peer connection's verdict is due when its grace ends, and comes then.
    #[test]
    fn an_ice_verdict_is_due_when_its_grace_ends() {
        let start = Instant::now();
        let mut watch = IceWatch::new(start);
        let due = watch.next_verdict(&times()).unwrap();
        assert_eq!(due, after(start, 5.0), "the connect timeout");
        assert_eq!(watch.verdict(&times(), due).unwrap().label, "never_connected");
        watch.observe(IceState::Connected, after(start, 1.0));
        assert_eq!(watch.next_verdict(&times()), None, "connected: nothing due");
        watch.observe(IceState::Disconnected, after(start, 10.0));
        let due = watch.next_verdict(&times()).unwrap();
        assert_eq!(due, after(start, 13.0), "the peer timeout");
        assert_eq!(watch.verdict(&times(), due).unwrap().label, "ice_disconnected");
        watch.observe(IceState::Failed, after(start, 11.0));
        assert_eq!(watch.next_verdict(&times()), Some(after(start, 11.0)), "at once");
    }

    #[test]
    fn a_peer_connection_that_connects_and_stays_is_kept() {
        let start = Instant::now();
        let mut watch = IceWatch::new(start);
        assert_eq!(watch.verdict(&times(), after(start, 4.9)), None);
        watch.observe(IceState::Checking, after(start, 1.0));
        watch.observe(IceState::Connected, after(start, 2.0));
        watch.observe(IceState::Completed, after(start, 2.5));
        assert_eq!(watch.verdict(&times(), after(start, 100.0)), None);
        // Disconnected for less than the peer timeout, then back.
        watch.observe(IceState::Disconnected, after(start, 100.0));
        assert_eq!(watch.verdict(&times(), after(start, 102.9)), None);
        watch.observe(IceState::Connected, after(start, 102.9));
        assert_eq!(watch.verdict(&times(), after(start, 200.0)), None);
    }

    #[test]
    fn a_peer_connection_is_gone_when_it_fails_stays_disconnected_or_never_connects() {
        let start = Instant::now();
        let label =
            |watch: &IceWatch, at: f64| watch.verdict(&times(), after(start, at)).map(|gone| gone.label);

        let mut never = IceWatch::new(start);
        never.observe(IceState::Checking, after(start, 1.0));
        assert_eq!(label(&never, 4.9), None);
        assert_eq!(label(&never, 5.0), Some("never_connected"));

        let mut failed = IceWatch::new(start);
        failed.observe(IceState::Connected, after(start, 1.0));
        failed.observe(IceState::Failed, after(start, 10.0));
        assert_eq!(label(&failed, 10.0), Some("ice_failed"));

        let mut disconnected = IceWatch::new(start);
        disconnected.observe(IceState::Connected, after(start, 1.0));
        disconnected.observe(IceState::Disconnected, after(start, 10.0));
        // A repeated notification of the same state does not restart its clock.
        disconnected.observe(IceState::Disconnected, after(start, 12.0));
        assert_eq!(label(&disconnected, 12.9), None);
        assert_eq!(label(&disconnected, 13.0), Some("ice_disconnected"));
        let gone = disconnected.verdict(&times(), after(start, 13.0)).unwrap();
        assert_eq!(gone.reason, "its peer connection was disconnected for 3 s");
    }

    #[test]
    fn ice_states_are_read_by_their_nicks() {
        for (nick, state) in [
            ("new", IceState::New),
            ("checking", IceState::Checking),
            ("connected", IceState::Connected),
            ("completed", IceState::Completed),
            ("failed", IceState::Failed),
            ("disconnected", IceState::Disconnected),
            ("closed", IceState::Closed),
        ] {
            assert_eq!(IceState::from_nick(nick), Some(state), "{nick}");
        }
        assert_eq!(IceState::from_nick("lost"), None);
    }
}

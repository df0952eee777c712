//! Which packets a port of one sender's takes. The port is told the sender's address (where its
//! control connection came from); the first packet from there that the port accepts locks it to
//! that packet's source port and SSRC, and from then on every other is dropped. A packet from
//! the same address (a shared NAT, a spoofed source) then cannot speak into the stream, nor start
//! an utterance, which a new SSRC would.

use std::net::{IpAddr, SocketAddr};

/// Why a packet is not the sender's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stranger {
    /// From another address than the sender's (or one not known).
    Address,
    /// From the sender's address, another port than the one locked.
    Port,
    /// From the sender's address and port, another SSRC than the one locked.
    Ssrc,
    /// Not an RTP packet (version 2, a whole fixed header): it has no SSRC to lock to.
    NotRtp,
}

impl Stranger {
    /// A word for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Stranger::Address => "address",
            Stranger::Port => "port",
            Stranger::Ssrc => "ssrc",
            Stranger::NotRtp => "not-rtp",
        }
    }
}

/// The SSRC of an RTP packet (version 2, at least its 12-byte fixed header); SRTP's header is
/// RTP's, in the clear.
pub fn ssrc_of(packet: &[u8]) -> Option<u32> {
    if packet.len() < 12 || packet[0] >> 6 != 2 {
        return None;
    }
    Some(u32::from_be_bytes([packet[8], packet[9], packet[10], packet[11]]))
}

/// One sender's lock: its address, and once a packet was taken, that packet's port and SSRC.
#[derive(Debug, Clone)]
pub struct SourceLock {
    sender: IpAddr,
    locked: Option<(u16, u32)>,
}

impl SourceLock {
    /// A lock that takes the first packet from `sender` (IPv4-mapped IPv6 addresses are IPv4's).
    pub fn new(sender: IpAddr) -> Self {
        Self {
            sender: sender.to_canonical(),
            locked: None,
        }
    }

    /// The source port and SSRC locked to, once a packet was taken.
    pub fn locked(&self) -> Option<(u16, u32)> {
        self.locked
    }

    /// Whether `packet` from `source` may go on, without locking: from the sender's address,
    /// and from the port and of the SSRC locked to, if locked. Its SSRC when it may.
    pub fn check(&self, source: Option<SocketAddr>, packet: &[u8]) -> Result<u32, Stranger> {
        let source = source
            .filter(|source| source.ip().to_canonical() == self.sender)
            .ok_or(Stranger::Address)?;
        let ssrc = ssrc_of(packet).ok_or(Stranger::NotRtp)?;
        match self.locked {
            Some((port, _)) if port != source.port() => Err(Stranger::Port),
            Some((_, locked)) if locked != ssrc => Err(Stranger::Ssrc),
            _ => Ok(ssrc),
        }
    }

    /// As `check`, and the first packet taken locks the port and SSRC.
    pub fn admit(&mut self, source: Option<SocketAddr>, packet: &[u8]) -> Result<(), Stranger> {
        let ssrc = self.check(source, packet)?;
        if let Some(source) = source {
            self.locked.get_or_insert((source.port(), ssrc));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RTP header of `ssrc`, and a byte of payload.
    fn packet(ssrc: u32) -> Vec<u8> {
        let mut packet = vec![0x80, 96, 0, 1, 0, 0, 0, 0];
        packet.extend(ssrc.to_be_bytes());
        packet.push(0x40);
        packet
    }

    fn at(text: &str) -> Option<SocketAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn the_first_packet_from_the_senders_address_locks_its_port_and_ssrc() {
        let mut lock = SourceLock::new("198.51.100.2".parse().unwrap());
        assert_eq!(
            lock.admit(at("198.51.100.3:5000"), &packet(1)),
            Err(Stranger::Address)
        );
        assert_eq!(lock.admit(None, &packet(1)), Err(Stranger::Address));
        assert_eq!(
            lock.admit(at("198.51.100.2:5000"), &[0x80, 96, 0]),
            Err(Stranger::NotRtp)
        );
        // Version 1 is no RTP.
        let mut old = packet(1);
        old[0] = 0x40;
        assert_eq!(lock.admit(at("198.51.100.2:5000"), &old), Err(Stranger::NotRtp));
        assert_eq!(lock.locked(), None, "nothing taken yet");
        // A check alone does not lock.
        assert_eq!(lock.check(at("198.51.100.2:5000"), &packet(1)), Ok(1));
        assert_eq!(lock.locked(), None);

        assert_eq!(lock.admit(at("198.51.100.2:5000"), &packet(1)), Ok(()));
        assert_eq!(lock.locked(), Some((5000, 1)));
        assert_eq!(lock.admit(at("198.51.100.2:5000"), &packet(1)), Ok(()));
        assert_eq!(
            lock.admit(at("198.51.100.2:5001"), &packet(1)),
            Err(Stranger::Port)
        );
        assert_eq!(
            lock.admit(at("198.51.100.2:5000"), &packet(2)),
            Err(Stranger::Ssrc)
        );
        assert_eq!(
            lock.check(at("198.51.100.9:5000"), &packet(1)),
            Err(Stranger::Address)
        );
        assert_eq!(lock.locked(), Some((5000, 1)), "strangers move nothing");
    }

    #[test]
    fn an_ipv4_sender_is_its_ipv4_mapped_address_too() {
        let mut lock = SourceLock::new("::ffff:127.0.0.1".parse().unwrap());
        assert_eq!(lock.admit(at("127.0.0.1:4000"), &packet(9)), Ok(()));
        assert_eq!(lock.admit(at("[::ffff:127.0.0.1]:4000"), &packet(9)), Ok(()));
        assert_eq!(lock.locked(), Some((4000, 9)));
    }

    #[test]
    fn the_ssrc_is_read_from_an_rtp_header_alone() {
        assert_eq!(ssrc_of(&packet(0xdead_beef)), Some(0xdead_beef));
        assert_eq!(ssrc_of(&packet(7)[..12]), Some(7));
        assert_eq!(ssrc_of(&packet(7)[..11]), None);
        assert_eq!(ssrc_of(&[]), None);
    }
}

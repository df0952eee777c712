//! What a receiver makes of one stream's packets, in the order they come: the packets lost
//! (sequence numbers that never came, and bad packets), the frames they took where the RTP time
//! counts them, and where an utterance starts (the receiver's first packet, a marker, another
//! utterance number or SSRC). The depayloader turns that into DISCONT, RESYNC and GAPs.

use crate::payload::{BadPacket, Layout, MAX_FRAMES, Packet};

/// The fields of an RTP packet that a receiver reads.
#[derive(Debug, Clone, Copy)]
pub struct RtpPacket<'a> {
    pub seq: u16,
    pub timestamp: u32,
    pub ssrc: u32,
    pub marker: bool,
    pub payload: &'a [u8],
}

/// What a receiver counted since it started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Good packets.
    pub packets: u64,
    pub frames: u64,
    /// Sequence numbers that never came.
    pub packets_lost: u64,
    /// Frames of the packets lost and bad, where the RTP time counts them.
    pub frames_lost: u64,
    pub packets_bad: u64,
    pub utterances: u64,
}

/// A good packet, as the stream goes on with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub packet: Packet,
    pub frames: usize,
    /// It starts an utterance: the decoder starts fresh.
    pub starts: bool,
    /// Packets missing since the last good one: sequence numbers skipped, and bad packets.
    pub missing_packets: u64,
    /// The frames those packets held, where the RTP time counts them (`None`: it does not, or
    /// the packet starts an utterance, after which nothing is missing).
    pub missing_frames: Option<u64>,
}

impl Received {
    /// Whether the packet's frames do not follow the last good packet's.
    pub fn discont(&self) -> bool {
        self.starts || self.missing_packets > 0
    }
}

/// The last good packet: where the stream it belongs to is.
#[derive(Debug, Clone, Copy)]
struct Last {
    /// The RTP time just after its frames: where the next packet starts if none was lost.
    next_rtp_time: u32,
    utterance: u8,
    ssrc: u32,
}

/// One stream's receiver, for the layout and frame length of its caps.
#[derive(Debug, Clone)]
pub struct Receiver {
    layout: Layout,
    samples_per_frame: u32,
    last: Option<Last>,
    /// The sequence number after the last packet, good or bad.
    next_seq: Option<u16>,
    /// Packets missing since the last good one, lost or bad: the next good packet's
    /// `missing_packets`.
    missing_since_good: u64,
    stats: Stats,
}

impl Receiver {
    /// A receiver of packets of `layout` whose frames last `samples_per_frame` RTP clock ticks,
    /// counting on from `stats` (a stream's new caps keep what it counted).
    pub fn new(layout: Layout, samples_per_frame: u32, stats: Stats) -> Self {
        Self {
            layout,
            samples_per_frame,
            last: None,
            next_seq: None,
            missing_since_good: 0,
            stats,
        }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// A new position (a flush): nothing before the next packet is lost, and it starts an
    /// utterance.
    pub fn forget_position(&mut self) {
        self.last = None;
        self.next_seq = None;
        self.missing_since_good = 0;
    }

    /// The next packet: its frames and what came before them, or why it was refused (its frames
    /// then count as lost before the next good packet).
    pub fn receive(&mut self, rtp: RtpPacket) -> Result<Received, BadPacket> {
        // Sequence numbers missing before this packet. Behind is none missing: a late packet
        // dropped upstream, or a sender that restarted.
        let seq_gap = self.next_seq.map(|next| rtp.seq.wrapping_sub(next) as i16);
        self.next_seq = Some(rtp.seq.wrapping_add(1));
        let lost_packets = seq_gap.map_or(0, |gap| gap.max(0) as u64);
        self.stats.packets_lost += lost_packets;
        self.missing_since_good += lost_packets;
        let packet = match self.layout.unpack(rtp.payload) {
            Ok(packet) => packet,
            Err(why) => {
                self.stats.packets_bad += 1;
                self.missing_since_good += 1;
                return Err(why);
            }
        };
        let frames = packet.codes.len() / self.layout.codebooks;
        let missing_packets = std::mem::take(&mut self.missing_since_good);
        let starts = match &self.last {
            None => true,
            Some(last) => rtp.marker || last.utterance != packet.utterance || last.ssrc != rtp.ssrc,
        };
        let missing_frames = match &self.last {
            Some(last) if !starts => {
                frames_missing(last, rtp.timestamp, self.samples_per_frame, missing_packets)
            }
            _ => None,
        };
        self.last = Some(Last {
            next_rtp_time: rtp
                .timestamp
                .wrapping_add(self.samples_per_frame.wrapping_mul(frames as u32)),
            utterance: packet.utterance,
            ssrc: rtp.ssrc,
        });
        self.stats.packets += 1;
        self.stats.frames += frames as u64;
        self.stats.frames_lost += missing_frames.unwrap_or(0);
        self.stats.utterances += u64::from(starts);
        Ok(Received {
            packet,
            frames,
            starts,
            missing_packets,
            missing_frames,
        })
    }
}

/// What a good packet after `last` continues: how many frames went missing before it, if the
/// RTP time tells (`None`: loss of unknown length; `Some(0)`: none lost).
fn frames_missing(last: &Last, rtp_time: u32, samples_per_frame: u32, missing_packets: u64) -> Option<u64> {
    if missing_packets == 0 {
        // The sequence numbers go on: a jump in RTP time is the sender's, not loss.
        return Some(0);
    }
    let ahead = rtp_time.wrapping_sub(last.next_rtp_time);
    if !ahead.is_multiple_of(samples_per_frame) {
        return None;
    }
    // Each missing packet held 1 to MAX_FRAMES frames; anything else (a sender whose timestamps
    // went back or restarted) says nothing of the frames lost.
    let frames = u64::from(ahead / samples_per_frame);
    (missing_packets..=missing_packets * MAX_FRAMES as u64)
        .contains(&frames)
        .then_some(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: Layout = Layout {
        codebooks: 2,
        codebook_size: 1000,
    };
    const SPF: u32 = 1920;

    /// A packet of `frames` frames of utterance `utterance`.
    fn payload(utterance: u8, frames: usize) -> Vec<u8> {
        let codes: Vec<i16> = (0..frames * LAYOUT.codebooks)
            .map(|i| (i * 37 % 1000) as i16)
            .collect();
        LAYOUT.pack(utterance, &codes)
    }

    fn rtp(seq: u16, timestamp: u32, marker: bool, payload: &[u8]) -> RtpPacket<'_> {
        RtpPacket {
            seq,
            timestamp,
            ssrc: 7,
            marker,
            payload,
        }
    }

    #[test]
    fn packets_in_order_lose_nothing_and_the_first_starts_an_utterance() {
        let mut receiver = Receiver::new(LAYOUT, SPF, Stats::default());
        let two = payload(0, 2);
        let first = receiver.receive(rtp(10, 0, true, &two)).unwrap();
        assert!(first.starts && first.discont());
        assert_eq!(
            (first.frames, first.missing_packets, first.missing_frames),
            (2, 0, None)
        );
        let next = receiver.receive(rtp(11, 2 * SPF, false, &two)).unwrap();
        assert!(!next.starts && !next.discont());
        assert_eq!(next.missing_frames, Some(0));
        assert_eq!(
            receiver.stats(),
            Stats {
                packets: 2,
                frames: 4,
                utterances: 1,
                ..Stats::default()
            }
        );
    }

    #[test]
    fn lost_and_bad_packets_count_the_frames_the_rtp_time_says() {
        let mut receiver = Receiver::new(LAYOUT, SPF, Stats::default());
        let one = payload(3, 1);
        receiver.receive(rtp(65535, 0, true, &one)).unwrap();
        // 0 and 1 lost (the sequence numbers wrap), 2 bad: three packets, five frames.
        assert!(
            receiver
                .receive(rtp(2, 3 * SPF, false, &one[..one.len() - 1]))
                .is_err()
        );
        let after = receiver.receive(rtp(3, 6 * SPF, false, &one)).unwrap();
        assert!(after.discont() && !after.starts);
        assert_eq!((after.missing_packets, after.missing_frames), (3, Some(5)));
        let stats = receiver.stats();
        assert_eq!(
            (stats.packets_lost, stats.packets_bad, stats.frames_lost),
            (2, 1, 5)
        );
        // RTP time that went back, or more frames than three packets can hold: not counted.
        let behind = receiver.receive(rtp(5, 0, false, &one)).unwrap();
        assert_eq!((behind.missing_packets, behind.missing_frames), (1, None));
        let far = receiver.receive(rtp(7, 66 * SPF, false, &one)).unwrap();
        assert_eq!((far.missing_packets, far.missing_frames), (1, None));
        assert_eq!(receiver.stats().frames_lost, 5);
    }

    #[test]
    fn a_marker_another_utterance_number_or_ssrc_starts_an_utterance() {
        let mut receiver = Receiver::new(LAYOUT, SPF, Stats::default());
        receiver.receive(rtp(0, 0, true, &payload(1, 1))).unwrap();
        assert!(
            receiver
                .receive(rtp(1, SPF, true, &payload(1, 1)))
                .unwrap()
                .starts
        );
        // The marked packet lost: the number tells, and nothing is counted missing after it.
        let renumbered = receiver.receive(rtp(3, 3 * SPF, false, &payload(2, 1))).unwrap();
        assert!(renumbered.starts);
        assert_eq!((renumbered.missing_packets, renumbered.missing_frames), (1, None));
        let other = payload(2, 1);
        let mut packet = rtp(4, 4 * SPF, false, &other);
        packet.ssrc = 8;
        assert!(receiver.receive(packet).unwrap().starts);
        assert_eq!(receiver.stats().utterances, 4);
        // A flush: the next packet starts again, with nothing lost before it.
        receiver.forget_position();
        let fresh = receiver.receive(rtp(100, 0, false, &other)).unwrap();
        assert!(fresh.starts);
        assert_eq!(fresh.missing_packets, 0);
    }

    #[test]
    fn a_late_packet_loses_nothing() {
        let mut receiver = Receiver::new(LAYOUT, SPF, Stats::default());
        let one = payload(0, 1);
        receiver.receive(rtp(10, 0, true, &one)).unwrap();
        let late = receiver.receive(rtp(9, 0, false, &one)).unwrap();
        assert_eq!(late.missing_packets, 0);
        assert_eq!(receiver.stats().packets_lost, 0);
    }
}

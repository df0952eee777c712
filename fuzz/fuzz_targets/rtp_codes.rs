//! What a codes-over-RTP receiver takes from anyone (the depayloader's packet path, the server's
//! RTP ingress): a stream of packets, each refused with a reason or taken as whole frames of codes
//! inside the codebook that pack back to the same codes, and loss counted within what the packets
//! could hold; never a panic. The server's port lock sees the same packets, from sources the
//! fields choose: whatever it takes after its first is of that first's port and SSRC, and from
//! the sender's address alone. The first 4 bytes choose the layout and frame length, then each
//! packet is 8 bytes of RTP fields (sequence step, timestamp, SSRC, marker, source port and
//! address choice, payload length) and its payload.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use libfuzzer_sys::fuzz_target;

use qwencodec_rtp_codes::{
    Layout, MAX_CODEBOOK_SIZE, MAX_FRAMES, Receiver, RtpPacket, SourceLock, Stats, Stranger,
};

const SENDER: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 2));

fuzz_target!(|data: &[u8]| {
    let Some((head, mut rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let layout = Layout {
        codebooks: 1 + head[0] as usize % 32,
        codebook_size: 2 + u32::from(u16::from_le_bytes([head[1], head[2]])) % (MAX_CODEBOOK_SIZE - 1),
    };
    let samples_per_frame = u32::from(head[3]).max(1) * 240;
    let mut receiver = Receiver::new(layout, samples_per_frame, Stats::default());
    let mut lock = SourceLock::new(SENDER);
    let (mut seq, mut packets, mut good, mut frames) = (0u16, 0u64, 0u64, 0u64);
    while let Some((fields, after)) = rest.split_first_chunk::<8>() {
        let length = usize::from(u16::from_le_bytes([fields[6], fields[7]])).min(after.len());
        let (payload, after) = after.split_at(length);
        rest = after;
        seq = seq.wrapping_add(u16::from(fields[0]) % 8);
        let rtp = RtpPacket {
            seq,
            timestamp: u32::from_le_bytes([fields[1], fields[2], fields[3], fields[4]]),
            ssrc: u32::from(fields[5] & 3),
            marker: fields[5] & 4 != 0,
            payload,
        };
        packets += 1;
        let source = SocketAddr::new(
            if fields[5] & 32 == 0 {
                SENDER
            } else {
                IpAddr::V4(Ipv4Addr::new(198, 51, 100, 3))
            },
            5000 + u16::from((fields[5] >> 3) & 3),
        );
        let mut header = [0x80, 96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        header[2..4].copy_from_slice(&seq.to_be_bytes());
        header[4..8].copy_from_slice(&rtp.timestamp.to_be_bytes());
        header[8..12].copy_from_slice(&rtp.ssrc.to_be_bytes());
        let first = lock.locked();
        match lock.admit(Some(source), &header) {
            Ok(()) => {
                assert_eq!(source.ip(), SENDER);
                assert_eq!(lock.locked(), Some((source.port(), rtp.ssrc)));
            }
            Err(Stranger::Address) => assert_ne!(source.ip(), SENDER),
            Err(why) => {
                assert!(matches!(why, Stranger::Port | Stranger::Ssrc), "{why:?}");
                assert!(first.is_some() && first != Some((source.port(), rtp.ssrc)));
            }
        }
        assert!(first.is_none() || lock.locked() == first, "a lock never moves");
        let Ok(received) = receiver.receive(rtp) else {
            continue;
        };
        good += 1;
        frames += received.frames as u64;
        let codes = &received.packet.codes;
        assert!((1..=MAX_FRAMES).contains(&received.frames));
        assert_eq!(codes.len(), received.frames * layout.codebooks);
        assert_eq!(payload.len(), layout.payload_len(received.frames));
        assert!(
            codes
                .iter()
                .all(|&code| (0..layout.codebook_size as i64).contains(&i64::from(code)))
        );
        assert_eq!(
            layout.unpack(&layout.pack(received.packet.utterance, codes)),
            Ok(received.packet.clone())
        );
        if let Some(missing) = received.missing_frames {
            assert!(!received.starts);
            let packets = received.missing_packets;
            assert!(
                missing == 0 && packets == 0 || (packets..=packets * MAX_FRAMES as u64).contains(&missing)
            );
        }
        assert_eq!(
            received.discont(),
            received.starts || received.missing_packets > 0
        );
    }
    let stats = receiver.stats();
    assert_eq!((stats.packets, stats.frames), (good, frames));
    assert_eq!(stats.packets + stats.packets_bad, packets);
    assert!(stats.utterances <= stats.packets);
});

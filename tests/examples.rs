//! The RTP pipelines and the examples, run as a user runs them, over the loopback interface.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::load_fixture;

/// Frames of the release-tiny fixture the tests send: 2 s of speech at 12.5 frames a second.
const FRAMES: usize = 25;
const FRAME_SECONDS: f64 = 0.08;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The first `FRAMES` frames of the release-tiny fixture's codes, in a file.
fn short_codes(dir: &Path) -> PathBuf {
    let fixture = load_fixture("release-tiny");
    let bytes: Vec<u8> = fixture.codes[..FRAMES * fixture.codebooks]
        .iter()
        .flat_map(|code| code.to_le_bytes())
        .collect();
    let path = dir.join("codes.raw");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// RMS of the fixture's reference audio for those frames: what the sender sends.
fn sent_rms() -> f64 {
    let fixture = load_fixture("release-tiny");
    let audio = &fixture.audio[..FRAMES * fixture.samples_per_frame];
    (audio.iter().map(|&s| (s as f64).powi(2)).sum::<f64>() / audio.len() as f64).sqrt()
}

fn run(command: &mut Command) -> Output {
    let output = command.stderr(Stdio::inherit()).output().unwrap();
    print!("{}", String::from_utf8_lossy(&output.stdout));
    assert!(output.status.success(), "{command:?} failed: {}", output.status);
    output
}

/// A UDP port that nothing uses now.
fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether a UDP socket is bound to `port` (read from the kernel's table: binding the port to
/// find out would race with the receiver binding it).
fn udp_port_bound(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/udp").unwrap();
    let wanted = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1))
        .any(|local_address| local_address.ends_with(&wanted))
}

/// Sample rate, channels, and the 16-bit samples of a PCM WAV file as -1..1.
fn read_wav(path: &Path) -> (u32, u16, Vec<f64>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"RIFF", "{} is not a WAV file", path.display());
    let (mut format, mut data) = (None, None);
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let size = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let body = &bytes[at + 8..(at + 8 + size).min(bytes.len())];
        match &bytes[at..at + 4] {
            b"fmt " => format = Some(body),
            b"data" => data = Some(body),
            _ => (),
        }
        at += 8 + size + size % 2;
    }
    let format = format.expect("a fmt chunk");
    assert_eq!(
        u16::from_le_bytes([format[14], format[15]]),
        16,
        "bits per sample"
    );
    let channels = u16::from_le_bytes([format[2], format[3]]);
    let rate = u32::from_le_bytes(format[4..8].try_into().unwrap());
    let samples = data
        .expect("a data chunk")
        .chunks_exact(2)
        .map(|pair| i16::from_le_bytes([pair[0], pair[1]]) as f64 / 32768.0)
        .collect();
    (rate, channels, samples)
}

fn rms(samples: &[f64]) -> f64 {
    (samples.iter().map(|s| s * s).sum::<f64>() / samples.len().max(1) as f64).sqrt()
}

#[test]
fn rtp_receiver_gets_what_the_sender_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let codes = short_codes(dir.path());
    let wav = dir.path().join("received.wav");
    let port = free_udp_port().to_string();

    let mut receiver = Command::new("bash")
        .arg(root().join("pipelines/rtp-receive.sh"))
        .arg(&wav)
        .envs([
            ("PORT", port.as_str()),
            ("IDLE_TIMEOUT", "1"),
            ("WAIT_TIMEOUT", "60"),
        ])
        .spawn()
        .unwrap();
    let listening = Instant::now();
    while !udp_port_bound(port.parse().unwrap()) {
        assert!(
            receiver.try_wait().unwrap().is_none(),
            "the receiver ended before listening"
        );
        assert!(
            listening.elapsed() < Duration::from_secs(20),
            "the receiver does not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    run(Command::new("bash")
        .arg(root().join("pipelines/rtp-send.sh"))
        .arg(&codes)
        .arg(root().join("tests/fixtures/release-tiny"))
        .envs([("PORT", port.as_str()), ("DEVICE", "cpu")]));

    let sent_at = Instant::now();
    let status = loop {
        if let Some(status) = receiver.try_wait().unwrap() {
            break status;
        }
        if sent_at.elapsed() > Duration::from_secs(30) {
            receiver.kill().unwrap();
            panic!("the receiver did not end by itself");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "rtp-receive.sh failed: {status}");

    let (rate, channels, samples) = read_wav(&wav);
    assert_eq!(channels, 1);
    let received_seconds = samples.len() as f64 / rate as f64;
    let sent_seconds = FRAMES as f64 * FRAME_SECONDS;
    let (received_rms, sent_rms) = (rms(&samples), sent_rms());
    println!(
        "RTP: received {received_seconds:.3} s at {rate} Hz of {sent_seconds:.3} s sent; RMS {received_rms:.4} \
         (sent {sent_rms:.4})"
    );
    // Opus codes 20 ms frames and flushes its 6.5 ms look-ahead at the end.
    assert!(
        (received_seconds - sent_seconds).abs() <= 0.05,
        "received {received_seconds} s of {sent_seconds} s"
    );
    assert!(
        received_rms > 0.5 * sent_rms && received_rms < 2.0 * sent_rms,
        "received RMS {received_rms}, sent {sent_rms}"
    );
}

//! Text in, speech out: the talker (`python -m qwencodec_talker`, upstream's Qwen3-TTS generate
//! streaming its frames, docs/talker.md) sends a tiny random talker's codes to the server's
//! `/codes` as it makes them, and Chromium hears as much speech as the talker made frames; a
//! SIGINT to the talker (its barge-in) silences the page and stops the talker.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gst::prelude::*;

use super::common;
use super::server::{self, Server, TOKEN, epoch_ms};
use super::webdriver::Browser;
use super::{LEAD_IN_S, Measure, OPUS_PACKET_S, SOUND_SHARE, connect_page_with_threshold, wait_ms};

/// A SIGINT's silence in the page, for good: about twice the most measured (docs/testing.md).
/// More than [`super::CANCEL_MS`]: the tiny talker is slower than real time here, so the
/// browser's jitter buffer has grown on late frames, and a frame sent just before the SIGINT
/// still plays. A talker that goes on is caught anyway: the page would still hear it 2.5 s later.
const SIGINT_MS: f64 = 750.0;
const TEXT: &str = "Hello there. This is a test of speech streamed as it is made.";
/// Frames at the talker's rate: 80 ms each (the tiny decoder's 1920 samples at 24 kHz).
const FRAME_S: f64 = 0.08;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn venv_python() -> PathBuf {
    let cache = std::env::var_os("QWENCODEC_CACHE").unwrap_or_else(|| "/var/cache/qwencodec".into());
    PathBuf::from(cache).join("venv/bin/python")
}

/// `python -m qwencodec_talker` on the tiny talker in `model` with `args` after the run's own
/// (the same seed, so the same frames, whatever the destination).
fn talker(model: &Path, seed: u32, max_frames: u32, args: &[&str]) -> Command {
    let mut command = Command::new(venv_python());
    command
        .current_dir(repository())
        .env("PYTHONPATH", repository().join("python"))
        .args(["-m", "qwencodec_talker", "--model"])
        .arg(model)
        .args(["--text", TEXT, "--speaker", "vivian", "--seed", &seed.to_string()])
        .args(["--max-new-tokens", &max_frames.to_string()])
        .args(args);
    command
}

fn succeeded(what: &str, output: Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{what}: {}\n{stderr}", output.status);
    stderr
}

/// The frame count the talker's last line names ("sent N frames", "cancelled after N frames").
fn frames_reported(stderr: &str) -> usize {
    let line = stderr
        .lines()
        .rev()
        .find(|line| line.starts_with("qwencodec_talker: "))
        .unwrap_or_else(|| panic!("the talker said nothing of its frames:\n{stderr}"));
    line.split_whitespace().rev().nth(1).unwrap().parse().unwrap()
}

/// RMS of `codes` decoded by `qwencodecdec` with the server's checkpoint: the level the page
/// should hear.
fn decoded_rms(codes: &Path) -> f64 {
    common::init();
    let pipeline = gst::parse::launch(&format!(
        "filesrc location={} ! audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2 \
         ! qwencodecdec device=cpu model-path={} ! appsink name=out sync=false",
        codes.display(),
        common::fixture_dir("release-tiny").display()
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    let sink = pipeline
        .by_name("out")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    pipeline.set_state(gst::State::Playing).unwrap();
    let mut audio = Vec::new();
    while let Ok(sample) = sink.pull_sample() {
        audio.extend(common::samples(sample.buffer().unwrap()));
    }
    pipeline.set_state(gst::State::Null).unwrap();
    assert!(!audio.is_empty(), "the talker's codes decoded to nothing");
    (audio.iter().map(|&s| (s as f64).powi(2)).sum::<f64>() / audio.len() as f64).sqrt()
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits until the page has heard `seconds` of sound since `from` (epoch ms).
fn await_sound(browser: &Browser, from: f64, seconds: f64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let heard = Measure::take(browser).sound_seconds(from, epoch_ms());
        if heard >= seconds {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the page heard {heard:.3} s of sound, not {seconds} s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn await_exit(child: &mut Child, within: Duration) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
            return (status, stderr);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the talker did not stop within {within:?} of its SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An utterance of the talker heard for as long as its frames (every packet of their audio), at
/// their level; a long one
/// interrupted by SIGINT: silence within [`SIGINT_MS`], nothing after, the talker gone at once,
/// and the server given only the frames the talker says it sent.
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "network namespaces are Linux's")]
fn the_talkers_speech_is_heard_as_it_is_made_and_a_sigint_stops_it() {
    if !server::in_own_network("talker::the_talkers_speech_is_heard_as_it_is_made_and_a_sigint_stops_it") {
        return;
    }
    let temp = TempDir(std::env::temp_dir().join(format!("qwencodec-talker-{}", std::process::id())));
    let model = temp.0.join("custom_voice");
    let made = Command::new(venv_python())
        .current_dir(repository())
        .args(["tools/make_talker_fixture.py", "--kind", "custom_voice", "--out"])
        .arg(&model)
        .output()
        .unwrap();
    succeeded("tools/make_talker_fixture.py", made);

    // The utterance's codes to a file first: their decode sets what the page counts as sound.
    let codes = temp.0.join("codes.raw");
    let to_file = talker(&model, 1, 60, &["--out"]).arg(&codes).output().unwrap();
    let made_frames = frames_reported(&succeeded("the talker to a file", to_file));
    assert_eq!(
        std::fs::metadata(&codes).unwrap().len() as usize,
        made_frames * 32
    );
    assert!(made_frames >= 5, "the talker made {made_frames} frames");
    let threshold = SOUND_SHARE * decoded_rms(&codes);

    let server = Server::start(&[]);
    let browser = Browser::start();
    let session = connect_page_with_threshold(&browser, &server.url(), threshold);
    let codes_url = format!("ws://{}/codes?session={session}", server.address);

    // The same utterance to the server, as it is made.
    let before = Measure::take(&browser);
    let started = epoch_ms();
    let to_server = talker(&model, 1, 60, &["--server", &codes_url, "--token", TOKEN])
        .output()
        .unwrap();
    let sent = frames_reported(&succeeded("the talker to the server", to_server));
    assert_eq!(sent, made_frames, "frames to the server and to a file, same seed");
    wait_ms(1500.0);
    let after = Measure::take(&browser);
    let spoken = sent as f64 * FRAME_S;
    let sound = after.sound_seconds(started, epoch_ms());
    let energy = after.energy_since(&before) / spoken;
    let packets = after.number("packets") - before.number("packets");
    let changes: Vec<String> = after
        .changes()
        .iter()
        .filter(|(at, _)| *at >= started)
        .map(|(at, sound)| format!("{:.0} {}", at - started, if *sound { "sound" } else { "silence" }))
        .collect();
    println!(
        "the talker's {sent} frames: {packets} packets, sound {sound:.3} s of {spoken:.3} s, \
         mean energy {energy:.2e}; changes (ms after the talker started) {changes:?}"
    );
    // The count that tells the length: every packet comes (the lead-in's and the speech's). The
    // page's sound lasts longer where a frame came late (the talker is slower than real time
    // here, and the browser stretches what it has), never shorter.
    assert_eq!(
        packets,
        ((LEAD_IN_S + spoken) / OPUS_PACKET_S).round(),
        "packets of the lead-in and the talker's {sent} frames"
    );
    assert!(
        sound >= 0.9 * spoken,
        "the page heard {sound:.3} s of {spoken:.3} s"
    );
    assert!(energy > threshold.powi(2), "mean energy {energy:.2e}: silence");

    // A long utterance (up to 2000 frames), interrupted once the page has heard a second of it.
    // The tiny talker ends this text at 41 frames, which our own loop makes in under a second:
    // upstream's loop, several times slower, is still generating when the SIGINT comes.
    let started = epoch_ms();
    let mut long = talker(
        &model,
        2,
        2000,
        &["--server", &codes_url, "--token", TOKEN, "--loop", "upstream"],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    await_sound(&browser, started, 1.0, Duration::from_secs(60));
    let cancelled_at = epoch_ms();
    let signalled = Command::new("kill")
        .args(["-INT", &long.id().to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    let (status, stderr) = await_exit(&mut long, Duration::from_secs(10));
    assert!(status.success(), "the talker after SIGINT: {status}\n{stderr}");
    assert!(stderr.contains("cancelled after"), "{stderr}");
    let cancelled_frames = frames_reported(&stderr);
    assert!(
        (1..2000).contains(&cancelled_frames),
        "the interrupted talker sent {cancelled_frames} frames"
    );

    wait_ms(2500.0);
    let after = Measure::take(&browser);
    // The talker is slower than real time here, so the page may fall silent between two
    // frames before the cancel as well, and a frame sent just before the SIGINT still plays:
    // what is asserted is when the page went silent for good.
    let cancel_ms = after.silent_for_good_since(cancelled_at) - cancelled_at;
    println!("SIGINT after {cancelled_frames} frames sent: silent for good {cancel_ms:.0} ms after it");
    assert!(
        cancel_ms < SIGINT_MS,
        "silent for good {cancel_ms:.0} ms after the SIGINT"
    );
    // Every frame the talker sent reached the session, and no other.
    let metrics = server.get("/metrics").1;
    assert_eq!(
        super::hardening::sample(&metrics, "qwencodec_frames_in_total"),
        (sent + cancelled_frames) as f64
    );
}

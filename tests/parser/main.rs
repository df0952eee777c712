//! qwencodecparse and the .npy typefinder: alone, before qwencodecdec, and in decodebin and
//! playbin. The .npy files are written here, header bytes and all.

use qwencodec_testing as common;
mod errors;
mod framing;
mod playback;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{Fixture, describe, errors_and_warnings, init, load_fixture};
use gst::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Every integer type string the parser takes, with byte orders.
const DTYPES: [&str; 16] = [
    "|i1", "|u1", "<i2", ">i2", "<u2", ">u2", "<i4", ">i4", "<u4", ">u4", "<i8", ">i8", "<u8", ">u8", "=i2",
    "=u8",
];

/// A .npy file as numpy writes it: magic, version, header length (u16 for version 1, u32
/// after), the dict padded with spaces and a newline to a multiple of 64 bytes, the data.
fn npy_file(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let length_bytes = if version == 1 { 2 } else { 4 };
    let unpadded = 8 + length_bytes + dict.len() + 1;
    let text = format!("{dict}{}\n", " ".repeat(unpadded.next_multiple_of(64) - unpadded));
    let mut bytes = b"\x93NUMPY".to_vec();
    bytes.extend([version, 0]);
    bytes.extend(&(text.len() as u32).to_le_bytes()[..length_bytes]);
    bytes.extend(text.as_bytes());
    bytes.extend(data);
    bytes
}

fn dict(descr: &str, shape: &str) -> String {
    format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}")
}

/// `codes` stored as `descr` says.
fn encode(codes: &[i16], descr: &str) -> Vec<u8> {
    let size: usize = descr[2..].parse().unwrap();
    let big_endian = descr.starts_with('>') || (descr.starts_with('=') && cfg!(target_endian = "big"));
    codes
        .iter()
        .flat_map(|&code| {
            let mut item = (code as i64).to_le_bytes()[..size].to_vec();
            if big_endian {
                item.reverse();
            }
            item
        })
        .collect()
}

/// Frame-major `codes` of `codebooks` each as a .npy file of `descr`, shaped (T, Q) or, with
/// `with_batch`, (1, T, Q).
fn codes_npy(codes: &[i16], codebooks: usize, version: u8, descr: &str, with_batch: bool) -> Vec<u8> {
    let frames = codes.len() / codebooks;
    let shape = if with_batch {
        format!("(1, {frames}, {codebooks})")
    } else {
        format!("({frames}, {codebooks})")
    };
    npy_file(version, &dict(descr, &shape), &encode(codes, descr))
}

fn fixture_npy(fixture: &Fixture, version: u8, descr: &str, with_batch: bool) -> Vec<u8> {
    codes_npy(&fixture.codes, fixture.codebooks, version, descr, with_batch)
}

fn temp_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// What a pipeline ending in `appsink name=sink` gave.
#[derive(Default)]
struct Run {
    buffers: Vec<gst::Buffer>,
    caps: Option<gst::Caps>,
    errors: Vec<String>,
    warnings: Vec<String>,
}

impl Run {
    fn codes(&self) -> Vec<i16> {
        self.buffers
            .iter()
            .flat_map(|buffer| {
                let map = buffer.map_readable().unwrap();
                map.chunks_exact(2)
                    .map(|pair| i16::from_le_bytes([pair[0], pair[1]]))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn audio(&self) -> Vec<f32> {
        self.buffers
            .iter()
            .flat_map(|buffer| {
                let map = buffer.map_readable().unwrap();
                map.chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn errors(&self) -> String {
        self.errors.join("\n")
    }

    fn warnings(&self) -> String {
        self.warnings.join("\n")
    }
}

/// Runs a gst-launch description ending in `appsink name=sink` to EOS or an error. With a
/// seek target, prerolls, seeks there (flushing) and plays from there.
fn run_pipeline(description: &str, seek: Option<gst::ClockTime>) -> Run {
    init();
    let pipeline = gst::parse::launch(description)
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
    run_built(&pipeline, seek)
}

/// What `run_pipeline` does, on a pipeline already made.
fn run_built(pipeline: &gst::Pipeline, seek: Option<gst::ClockTime>) -> Run {
    let sink = pipeline
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    sink.set_sync(false);
    let collected = Arc::new(Mutex::new(Run::default()));
    let into = collected.clone();
    sink.set_callbacks(
        gst_app::AppSinkCallbacks::builder()
            .new_sample(move |sink| {
                let sample = sink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
                let mut run = into.lock().unwrap();
                run.buffers.push(sample.buffer_owned().unwrap());
                run.caps = sample.caps_owned();
                Ok(gst::FlowSuccess::Ok)
            })
            .build(),
    );
    let bus = pipeline.bus().unwrap();
    let mut messages = Vec::new();
    if let Some(target) = seek {
        pipeline.set_state(gst::State::Paused).unwrap();
        let (prerolled, _, _) = pipeline.state(gst::ClockTime::from_seconds(60));
        assert!(prerolled.is_ok(), "preroll: {prerolled:?}");
        pipeline.seek_simple(gst::SeekFlags::FLUSH, target).expect("seek");
        pipeline.state(gst::ClockTime::from_seconds(60)).0.unwrap();
    }
    pipeline.set_state(gst::State::Playing).unwrap();
    while let Some(message) = bus.timed_pop_filtered(
        gst::ClockTime::from_seconds(120),
        &[
            gst::MessageType::Eos,
            gst::MessageType::Error,
            gst::MessageType::Warning,
        ],
    ) {
        match message.view() {
            gst::MessageView::Warning(_) => messages.extend(describe(&message).map(|text| (false, text))),
            gst::MessageView::Error(_) => {
                messages.extend(describe(&message).map(|text| (true, text)));
                break;
            }
            _ => break,
        }
    }
    pipeline.set_state(gst::State::Null).unwrap();
    let mut run = std::mem::take(&mut *collected.lock().unwrap());
    for (error, text) in messages {
        if error {
            run.errors.push(text)
        } else {
            run.warnings.push(text)
        }
    }
    run
}

/// `filesrc ! [queue !] qwencodecparse PROPERTIES ! appsink`: pull mode, or push mode with the
/// queue.
fn parse_file(path: &Path, push_mode: bool, properties: &str) -> Run {
    let queue = if push_mode { "queue !" } else { "" };
    run_pipeline(
        &format!(
            "filesrc location=\"{}\" ! {queue} qwencodecparse {properties} ! appsink name=sink",
            path.display()
        ),
        None,
    )
}

fn decode_file(path: &Path, fixture: &Fixture, properties: &str, seek: Option<gst::ClockTime>) -> Run {
    run_pipeline(
        &format!(
            "filesrc location=\"{}\" ! qwencodecparse {properties} ! qwencodecdec model-path=\"{}\" device=cpu \
             ! appsink name=sink",
            path.display(),
            fixture.dir.display()
        ),
        seek,
    )
}

fn assert_codes_caps(run: &Run, codebooks: i32, framerate: gst::Fraction) {
    let caps = run.caps.as_ref().expect("output caps");
    let s = caps.structure(0).unwrap();
    assert_eq!(s.name(), "audio/x-qwen3-tts-codes");
    assert_eq!(s.get::<i32>("codebooks").unwrap(), codebooks);
    assert_eq!(s.get::<gst::Fraction>("framerate").unwrap(), framerate);
    assert!(s.get::<bool>("parsed").unwrap());
}

/// Buffers start where the previous ended, at frame k / framerate exactly, and hold whole
/// frames, `per_buffer` of them but the last.
fn assert_timestamps(run: &Run, frames: u64, codebooks: usize, framerate: gst::Fraction, per_buffer: u64) {
    let time = |frame: u64| {
        gst::ClockTime::SECOND
            .mul_div_floor(frame * framerate.denom() as u64, framerate.numer() as u64)
            .unwrap()
    };
    let mut frame = 0;
    for (index, buffer) in run.buffers.iter().enumerate() {
        let count = (buffer.size() / (2 * codebooks)) as u64;
        assert_eq!(buffer.size() % (2 * codebooks), 0, "buffer {index} cuts a frame");
        assert!(
            count == per_buffer || frame + count == frames,
            "buffer {index}: {count} frames"
        );
        assert_eq!(buffer.pts(), Some(time(frame)), "buffer {index}");
        assert_eq!(
            buffer.duration(),
            Some(time(frame + count) - time(frame)),
            "buffer {index}"
        );
        frame += count;
    }
    assert_eq!(frame, frames);
}

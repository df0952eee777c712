//! What the examples share: command-line options, the codes' caps from the model, and an
//! `appsrc` fed the way a TTS model feeds it (a few frames at a time, live, timestamped).
#![allow(dead_code)] // each example uses a different part

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gst::prelude::*;
use gstqwencodec::model::{CheckpointFiles, DecoderConfig};
use qwencodec_common::Options;

/// The bundled test checkpoint (random weights: noise, but every part of the pipeline is real):
/// under `QWENCODEC_FIXTURES` when set (a binary run from a bundle unpacked elsewhere), else in
/// the source tree.
pub fn default_model() -> PathBuf {
    std::env::var_os("QWENCODEC_FIXTURES")
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
            PathBuf::from,
        )
        .join("release-tiny")
}

/// `--model DIR` and `--codes FILE`, by default the bundled test checkpoint and its codes.
pub fn take_model_and_codes(options: &mut Options) -> Result<(PathBuf, PathBuf), String> {
    let model = options.take("--model")?.map_or_else(default_model, PathBuf::from);
    let codes = options
        .take("--codes")?
        .map_or_else(|| default_model().join("codes.raw"), PathBuf::from);
    Ok((model, codes))
}

/// Codec frames to send, with the caps that describe them to `qwencodecdec`.
pub struct Codes {
    pub caps: gst::Caps,
    /// Frames per second, as in the caps.
    pub framerate: gst::Fraction,
    pub frame_bytes: usize,
    /// Whole frames only: Q little-endian int16 codes each.
    pub bytes: Vec<u8>,
}

impl Codes {
    /// Reads a raw codes file; the codebooks and frame rate come from the model's config.json.
    pub fn load(codes: &Path, model: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(codes).map_err(|err| format!("{}: {err}", codes.display()))?;
        Self::from_bytes(bytes, model).map_err(|err| format!("{}: {err}", codes.display()))
    }

    /// Raw codes (little-endian int16, frame-major) for the model in `model`; a partial frame at
    /// the end is dropped.
    pub fn from_bytes(mut bytes: Vec<u8>, model: &Path) -> Result<Self, String> {
        let config = CheckpointFiles::locate(model)
            .and_then(|files| DecoderConfig::from_file(&files.config))
            .map_err(|err| err.to_string())?;
        let (num, den) = config.frame_rate();
        let framerate = gst::Fraction::new(num as i32, den as i32);
        let caps = gst::Caps::builder("audio/x-qwen3-tts-codes")
            .field("codebooks", config.num_quantizers as i32)
            .field("framerate", framerate)
            .build();
        let frame_bytes = 2 * config.num_quantizers;
        bytes.truncate(bytes.len() / frame_bytes * frame_bytes);
        if bytes.is_empty() {
            return Err("not one whole frame in it".into());
        }
        Ok(Self {
            caps,
            framerate,
            frame_bytes,
            bytes,
        })
    }

    pub fn frames(&self) -> usize {
        self.bytes.len() / self.frame_bytes
    }

    /// Where frame `index` starts, from the first frame: exact, no drift.
    pub fn offset(&self, index: usize) -> gst::ClockTime {
        gst::ClockTime::SECOND
            .mul_div_floor(
                index as u64 * self.framerate.denom() as u64,
                self.framerate.numer() as u64,
            )
            .unwrap()
    }

    pub fn duration(&self) -> gst::ClockTime {
        self.offset(self.frames())
    }

    /// A live `appsrc` in time format for these codes.
    pub fn appsrc(&self) -> gst_app::AppSrc {
        gst_app::AppSrc::builder()
            .name("codes")
            .caps(&self.caps)
            .format(gst::Format::Time)
            .is_live(true)
            .build()
    }

    /// Pushes the frames `frames_per_push` at a time in real time, as a TTS model that keeps up
    /// with playback hands them over, then ends the stream. Each buffer is stamped with the
    /// running time it is pushed at, so a synchronised sink plays it at once. `pushed` is told
    /// each buffer's timestamp and the wall-clock time it was pushed.
    pub fn push_live(
        &self,
        appsrc: &gst_app::AppSrc,
        frames_per_push: usize,
        mut pushed: impl FnMut(gst::ClockTime, Instant),
    ) -> Result<(), gst::FlowError> {
        let start_running_time = appsrc.current_running_time().unwrap_or(gst::ClockTime::ZERO);
        let start = Instant::now();
        let frames_per_push = frames_per_push.max(1);
        for first in (0..self.frames()).step_by(frames_per_push) {
            let end = (first + frames_per_push).min(self.frames());
            // Frames are handed over once their time has come: wait for it.
            let due = start + Duration::from(self.offset(first));
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let mut buffer = gst::Buffer::from_slice(
                self.bytes[first * self.frame_bytes..end * self.frame_bytes].to_vec(),
            );
            let pts = start_running_time + self.offset(first);
            {
                let buffer = buffer.get_mut().unwrap();
                buffer.set_pts(pts);
                buffer.set_duration(self.offset(end) - self.offset(first));
            }
            pushed(pts, Instant::now());
            appsrc.push_buffer(buffer)?;
        }
        appsrc.end_of_stream()?;
        Ok(())
    }
}

/// A pipeline set to NULL however the example ends, as GStreamer wants before it is freed.
pub struct StopOnDrop(pub gst::Pipeline);

impl std::ops::Deref for StopOnDrop {
    type Target = gst::Pipeline;

    fn deref(&self) -> &gst::Pipeline {
        &self.0
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = self.0.set_state(gst::State::Null);
    }
}

/// An example's exit status: on an error, the error after the example's name, and failure.
pub fn exit_status(example: &str, result: Result<(), Box<dyn std::error::Error>>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{example}: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Milliseconds, for reports.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

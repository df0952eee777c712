//! Soak: opens, feeds and closes many streams in one process, as a media server does for weeks,
//! and watches the memory. Every stream decodes the first frames of a fixture's codes, cut into
//! buffers at random, and its audio must be upstream's float64 decode of those frames (the
//! fixture's expected audio) within the fixture tolerance, and equal to the first stream's; the
//! resident memory (and the GPU memory, where the decoder runs on CUDA) must stay flat once
//! warmed up.
//!
//! ```text
//! cargo run --release --example soak -- [--streams 10000] [--mode both|elements|reuse]
//!     [--frames 48] [--chunk-frames 2] [--model FIXTURE_DIR] [--device cpu|cuda|cuda:N|auto]
//!     [--warm-up STREAMS] [--max-growth-mib 16] [--max-kib-per-stream 2] [--report-every 1000]
//!     [--seed 1]
//! ```
//!
//! `--model` is a fixture folder made by `tools/make_fixtures.py`: the checkpoint and its
//! `expected.safetensors` (codes, upstream's float64 audio, upstream's float32 error), by default
//! the bundled `release-tiny` (under `QWENCODEC_FIXTURES` when set). The network is causal, so
//! the decode of the first N frames is the first N frames' samples of the full decode.
//!
//! `elements`: a new `appsrc ! qwencodecdec ! appsink` pipeline per stream, torn down after its
//! EOS (so the shared model is loaded and freed with it). `reuse`: one decoder that stays
//! playing; each stream ends with EOS, then a flush starts the next. `both` alternates them.
//! Exits with failure when a stream's audio is off, or the memory grew more than allowed after
//! warm-up: in all (`--max-growth-mib`), or per stream (`--max-kib-per-stream`: the slope of a
//! line fitted to the resident memory after each stream, which a leak of a few KiB per stream
//! raises where the growth in all lets it through; bounded over 100 streams after warm-up or
//! more, where page-sized steps of the memory do not set it); on CUDA also when
//! `nvidia-smi` cannot see this process's GPU memory.

mod common;

use std::error::Error;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use common::{Codes, StopOnDrop};
use gst::prelude::*;
use qwencodec_common::Options;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use safetensors::{Dtype, SafeTensors};

/// The fewest streams after warm-up over which the per-stream slope is bounded. The resident
/// memory moves in steps of pages and allocator blocks, some 100 KiB, whatever the streams do:
/// over a few streams those steps are the slope (`--streams 6` read 72 KiB per stream with 0.3
/// MiB grown in all), over a hundred they are below a KiB.
const SLOPE_STREAMS: usize = 100;

/// How far a stream may be from the first stream's audio: the same decoder on the same codes,
/// in steps of the same size (`max-step-frames` is held at `chunk-frames`, so that frames that
/// arrive together in one buffer do not join into larger steps, whose last bits differ).
const MAX_DIFFERENCE_FROM_FIRST: f64 = 1e-6;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Elements,
    Reuse,
    Both,
}

struct Soak {
    codes: Codes,
    model: String,
    device: String,
    chunk_frames: u32,
    rng: StdRng,
    /// The one decoder of the `reuse` streams, made on first use.
    reused: Option<gst_check::Harness>,
}

fn main() -> ExitCode {
    common::exit_status("soak", run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut options = Options::from_env();
    let model = options
        .take("--model")?
        .map_or_else(common::default_model, Into::into);
    let streams: usize = options.take_parsed("--streams", 10_000)?;
    let mode = match options.take("--mode")?.as_deref().unwrap_or("both") {
        "elements" => Mode::Elements,
        "reuse" => Mode::Reuse,
        "both" => Mode::Both,
        other => return Err(format!("--mode: {other:?} is not elements, reuse or both").into()),
    };
    let frames: usize = options.take_parsed("--frames", 48)?;
    let chunk_frames: u32 = options.take_parsed("--chunk-frames", 2)?;
    let device = options.take("--device")?.unwrap_or_else(|| "cpu".into());
    let warm_up: usize = options.take_parsed("--warm-up", (streams / 4).min(100))?;
    let max_growth_mib: f64 = options.take_parsed("--max-growth-mib", 16.0)?;
    let max_kib_per_stream: f64 = options.take_parsed("--max-kib-per-stream", 2.0)?;
    let report_every: usize = options.take_parsed("--report-every", 1000)?;
    let seed: u64 = options.take_parsed("--seed", 1)?;
    options.finish()?;
    if streams <= warm_up {
        return Err(format!("--streams {streams} leaves nothing after --warm-up {warm_up}").into());
    }
    let on_gpu = gstqwencodec::model::parse_device(&device)?.is_cuda();

    let expected = Expected::load(&model, frames)?;
    gst::init()?;
    gstqwencodec::plugin_register_static()?;
    let codes = Codes::from_bytes(expected.code_bytes(), &model)?;

    let mut soak = Soak {
        codes,
        model: model.to_str().ok_or("the model path is not UTF-8")?.to_owned(),
        device,
        chunk_frames,
        rng: StdRng::seed_from_u64(seed),
        reused: None,
    };
    println!(
        "soak: {streams} streams of {frames} frames, chunk-frames {chunk_frames}, device {}, model {}, \
         each within {:.2e} of upstream's float64 decode",
        soak.device, soak.model, expected.tolerance
    );

    let start = Instant::now();
    let mut first_audio: Option<Vec<f32>> = None;
    let (mut worst_error, mut worst_difference) = (0.0f64, 0.0f64);
    let mut baseline = None;
    let mut peak_rss = 0.0f64;
    // (stream, RSS in MiB) after each stream after warm-up.
    let mut after_warm_up = Vec::new();
    let mut last_report = (0, start);
    for index in 0..streams {
        let reuse = match mode {
            Mode::Elements => false,
            Mode::Reuse => true,
            Mode::Both => index % 2 == 1,
        };
        let audio = if reuse {
            soak.reused_stream()?
        } else {
            soak.pipeline_stream()?
        };
        let error = expected
            .error(&audio)
            .map_err(|err| format!("stream {index}: {err}"))?;
        worst_error = worst_error.max(error);
        match &first_audio {
            None => {
                first_audio = Some(audio);
                // Fail now rather than after the warm-up if the GPU memory cannot be read.
                if on_gpu {
                    gpu_mib()?;
                }
            }
            Some(first) => {
                // Same length as the first: both passed the length check above.
                let difference = relative_l2(&audio, first);
                worst_difference = worst_difference.max(difference);
                if difference > MAX_DIFFERENCE_FROM_FIRST {
                    return Err(format!(
                        "stream {index}: audio differs from the first stream's by {difference:.2e}"
                    )
                    .into());
                }
            }
        }

        let rss = rss_mib()?;
        peak_rss = peak_rss.max(rss);
        if index + 1 == warm_up {
            baseline = Some((rss, if on_gpu { Some(gpu_mib()?) } else { None }));
        }
        if index + 1 >= warm_up {
            after_warm_up.push((index as f64, rss));
        }
        if (index + 1) % report_every == 0 || index + 1 == streams {
            let since = baseline.map_or(String::new(), |(base, _)| {
                format!(" ({:+.1} since warm-up)", rss - base)
            });
            let gpu = if on_gpu {
                format!(", GPU {} MiB", gpu_mib()?)
            } else {
                String::new()
            };
            // The rate since the last report: a decode that slows down with age shows here.
            let (last_count, last_time) = last_report;
            println!(
                "  {:>6} streams: RSS {rss:.1} MiB{since}{gpu}, {:.1} streams/s",
                index + 1,
                (index + 1 - last_count) as f64 / last_time.elapsed().as_secs_f64()
            );
            last_report = (index + 1, Instant::now());
        }
    }
    drop(soak);

    let (base_rss, base_gpu) = baseline.ok_or("no baseline")?;
    let end_rss = rss_mib()?;
    let growth = end_rss - base_rss;
    let kib_per_stream = slope(&after_warm_up) * 1024.0;
    let end_gpu = if on_gpu { Some(gpu_mib()?) } else { None };
    let gpu = match (base_gpu, end_gpu) {
        (Some(base), Some(end)) => format!("; GPU {base} -> {end} MiB"),
        _ => String::new(),
    };
    println!(
        "soak: {streams} streams in {:.1} s, each within {:.2e} of upstream's float64 decode (worst relative L2 \
         {worst_error:.2e}) and equal to the first stream (worst {worst_difference:.1e}); RSS after {warm_up} \
         warm-up streams {base_rss:.1} MiB, at the end {end_rss:.1} MiB ({growth:+.1} MiB, a line's slope \
         {kib_per_stream:+.2} KiB per stream), peak {peak_rss:.1} MiB{gpu}",
        start.elapsed().as_secs_f64(),
        expected.tolerance
    );
    if growth > max_growth_mib {
        return Err(
            format!("RSS grew by {growth:.1} MiB after warm-up, more than {max_growth_mib} MiB").into(),
        );
    }
    if after_warm_up.len() < SLOPE_STREAMS {
        println!(
            "soak: {} streams after warm-up, fewer than {SLOPE_STREAMS}: the slope is not bounded, only \
             the growth in all",
            after_warm_up.len()
        );
    } else if kib_per_stream > max_kib_per_stream {
        return Err(format!(
            "RSS grew by {kib_per_stream:.2} KiB per stream after warm-up, more than {max_kib_per_stream} KiB"
        )
        .into());
    }
    if let (Some(base), Some(end)) = (base_gpu, end_gpu)
        && end as f64 - base as f64 > max_growth_mib
    {
        return Err(format!("GPU memory grew from {base} to {end} MiB after warm-up").into());
    }
    Ok(())
}

/// What every stream must decode to: the first frames of a fixture's codes, and upstream's
/// float64 decode of them.
struct Expected {
    /// Frame-major, `codebooks` codes a frame.
    codes: Vec<i16>,
    audio: Vec<f32>,
    /// Five times upstream's own float32 error, as the tests allow.
    tolerance: f64,
}

impl Expected {
    /// The first `frames` frames of the fixture in `dir` (its `expected.safetensors`).
    fn load(dir: &Path, frames: usize) -> Result<Self, String> {
        let path = dir.join("expected.safetensors");
        let bytes = std::fs::read(&path).map_err(|err| {
            format!(
                "{}: {err}: the soak checks every stream against upstream's decode, so --model must be a \
                 fixture folder made by tools/make_fixtures.py (the checkpoint and its expected.safetensors), \
                 such as tests/fixtures/release-tiny",
                path.display()
            )
        })?;
        let what = |err: &dyn std::fmt::Display| format!("{}: {err}", path.display());
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|err| what(&err))?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let number = |key: &str| {
            metadata
                .get(key)
                .and_then(|value| value.parse::<f64>().ok())
                .ok_or_else(|| what(&format!("no number {key:?} in the metadata")))
        };
        let samples_per_frame = number("samples_per_frame")? as usize;
        // About the tests' parity bound: twice the most they measure (crates/testing/src/lib.rs).
        let tolerance = 2.4 * number("upstream_f32_rel_l2")?;

        let tensors = SafeTensors::deserialize(&bytes).map_err(|err| what(&err))?;
        let codes = tensors.tensor("codes").map_err(|err| what(&err))?;
        let &[available, _codebooks] = codes.shape() else {
            return Err(what(&format!(
                "codes of shape {:?}, not [frames, codebooks]",
                codes.shape()
            )));
        };
        if codes.dtype() != Dtype::I32 {
            return Err(what(&format!("codes of dtype {:?}, not I32", codes.dtype())));
        }
        if frames == 0 || frames > available {
            return Err(format!(
                "--frames {frames}: the fixture holds 1 to {available} frames"
            ));
        }
        let codes = codes
            .data()
            .chunks_exact(4)
            .take(frames * codes.shape()[1])
            .map(|bytes| i16::try_from(i32::from_le_bytes(bytes.try_into().unwrap())))
            .collect::<Result<_, _>>()
            .map_err(|err| what(&err))?;
        let audio = tensors.tensor("audio").map_err(|err| what(&err))?;
        if audio.dtype() != Dtype::F32 || audio.shape() != [available * samples_per_frame] {
            return Err(what(&format!(
                "audio of dtype {:?} and shape {:?}, not F32 [{}]",
                audio.dtype(),
                audio.shape(),
                available * samples_per_frame
            )));
        }
        // The decoder is causal: N frames decode to the first N frames' samples of the whole.
        let audio: Vec<f32> = audio
            .data()
            .chunks_exact(4)
            .take(frames * samples_per_frame)
            .map(|bytes| f32::from_le_bytes(bytes.try_into().unwrap()))
            .collect();
        if audio.iter().all(|&sample| sample == 0.0) {
            return Err(what(&"the expected audio is silence: nothing to compare with"));
        }
        Ok(Self {
            codes,
            audio,
            tolerance,
        })
    }

    fn code_bytes(&self) -> Vec<u8> {
        self.codes.iter().flat_map(|code| code.to_le_bytes()).collect()
    }

    /// The relative L2 error of a stream's audio, or why it is not the expected audio.
    fn error(&self, audio: &[f32]) -> Result<f64, String> {
        if audio.len() != self.audio.len() {
            return Err(format!(
                "{} samples of audio, upstream's decode has {}",
                audio.len(),
                self.audio.len()
            ));
        }
        let error = relative_l2(audio, &self.audio);
        if error > self.tolerance {
            return Err(format!(
                "relative L2 error {error:.3e} against upstream's float64 decode, above {:.3e} (2.4x upstream \
                 float32's)",
                self.tolerance
            ));
        }
        Ok(error)
    }
}

impl Soak {
    fn decoder(&self) -> Result<gst::Element, Box<dyn Error>> {
        Ok(gst::ElementFactory::make("qwencodecdec")
            .property("model-path", &self.model)
            .property("device", &self.device)
            .property("chunk-frames", self.chunk_frames)
            .property("max-step-frames", self.chunk_frames)
            .build()?)
    }

    /// The codes cut at random byte offsets (frames cut across buffers, some buffers empty).
    fn random_buffers(&mut self) -> Vec<gst::Buffer> {
        let bytes = &self.codes.bytes;
        let mut buffers = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let size = self
                .rng
                .random_range(0..=3 * self.codes.frame_bytes)
                .min(bytes.len() - at);
            buffers.push(gst::Buffer::from_slice(bytes[at..at + size].to_vec()));
            at += size;
        }
        buffers
    }

    /// One stream through a pipeline made for it and torn down after.
    fn pipeline_stream(&mut self) -> Result<Vec<f32>, Box<dyn Error>> {
        let src = gst_app::AppSrc::builder()
            .caps(&self.codes.caps)
            .format(gst::Format::Time)
            .build();
        let decoder = self.decoder()?;
        let sink = gst_app::AppSink::builder().sync(false).build();
        let pipeline = StopOnDrop(gst::Pipeline::new());
        pipeline.add_many([src.upcast_ref(), &decoder, sink.upcast_ref()])?;
        gst::Element::link_many([src.upcast_ref(), &decoder, sink.upcast_ref()])?;
        pipeline.set_state(gst::State::Playing)?;
        for buffer in self.random_buffers() {
            src.push_buffer(buffer)?;
        }
        src.end_of_stream()?;
        let mut audio = Vec::new();
        while let Ok(sample) = sink.pull_sample() {
            audio.extend(samples(sample.buffer().ok_or("a sample without a buffer")?));
        }
        let bus = pipeline.bus().ok_or("no bus")?;
        if let Some(message) = bus.pop_filtered(&[gst::MessageType::Error])
            && let gst::MessageView::Error(error) = message.view()
        {
            return Err(format!("pipeline error: {} ({:?})", error.error(), error.debug()).into());
        }
        pipeline.set_state(gst::State::Null)?;
        Ok(audio)
    }

    /// One stream through the decoder that stays playing: EOS, then a flush for the next one.
    fn reused_stream(&mut self) -> Result<Vec<f32>, Box<dyn Error>> {
        if self.reused.is_none() {
            let mut harness = gst_check::Harness::with_element(&self.decoder()?, Some("sink"), Some("src"));
            harness.set_src_caps(self.codes.caps.clone());
            harness.play();
            self.reused = Some(harness);
        }
        let buffers = self.random_buffers();
        let harness = self.reused.as_mut().unwrap();
        for buffer in buffers {
            harness.push(buffer)?;
        }
        if !harness.push_event(gst::event::Eos::new()) {
            return Err("the decoder refused EOS".into());
        }
        // The decoder drains on EOS in this thread: its audio is all queued by now.
        let audio = std::iter::from_fn(|| harness.try_pull())
            .flat_map(|buffer| samples(&buffer))
            .collect();
        harness.push_event(gst::event::FlushStart::new());
        harness.push_event(gst::event::FlushStop::new(true));
        harness.push_event(gst::event::Segment::new(
            &gst::FormattedSegment::<gst::ClockTime>::new(),
        ));
        // The harness keeps every event it sees: let them go too.
        while harness.try_pull_event().is_some() {}
        while harness.try_pull_upstream_event().is_some() {}
        Ok(audio)
    }
}

fn samples(buffer: &gst::BufferRef) -> Vec<f32> {
    let map = buffer.map_readable().expect("a readable buffer");
    map.chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// ||actual - expected|| / ||expected||, in float64, of audio of the same length; `expected`
/// is never silence (checked where it comes from).
fn relative_l2(actual: &[f32], expected: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&a, &e) in actual.iter().zip(expected) {
        diff += (a as f64 - e as f64).powi(2);
        norm += (e as f64).powi(2);
    }
    (diff / norm).sqrt()
}

/// This process's resident memory.
/// The least-squares slope of `points` (x, y): y's growth per unit of x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let count = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / count;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / count;
    let covariance: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let variance: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    covariance / variance
}

fn rss_mib() -> Result<f64, Box<dyn Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmRSS in /proc/self/status")?;
    Ok(kib / 1024.0)
}

/// This process's GPU memory as nvidia-smi lists it, or why it cannot be read: then the soak
/// fails, as a GPU memory check that cannot look would pass whatever happens.
fn gpu_mib() -> Result<u64, String> {
    let cannot = |why: String| format!("cannot check the GPU memory: {why}");
    let output = std::process::Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .map_err(|err| cannot(format!("nvidia-smi does not run: {err}")))?;
    if !output.status.success() {
        return Err(cannot(format!(
            "nvidia-smi failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let pid = std::process::id().to_string();
    let listed = String::from_utf8_lossy(&output.stdout);
    let used = listed
        .lines()
        .find_map(|line| {
            let (line_pid, mib) = line.split_once(',')?;
            (line_pid.trim() == pid).then(|| mib.trim().to_owned())
        })
        .ok_or_else(|| {
            cannot(format!(
                "nvidia-smi lists no GPU memory for this process (pid {pid}; in a container with a PID \
                 namespace of its own it shows the host's pids or none): it lists {:?}",
                listed.trim()
            ))
        })?;
    used.parse()
        .map_err(|_| cannot(format!("nvidia-smi gives this process's GPU memory as {used:?}")))
}

//! Soak: opens, feeds and closes many streams in one process, as a media server does for weeks,
//! and watches the memory. Every stream decodes the same codes, cut into buffers at random, so
//! every stream's audio must equal the first one's; the resident memory (and the GPU memory,
//! where the decoder runs on CUDA) must stay flat once warmed up.
//!
//! ```text
//! cargo run --release --example soak -- [--streams 10000] [--mode both|elements|reuse]
//!     [--frames 48] [--chunk-frames 2] [--model DIR] [--codes FILE] [--device cpu|cuda]
//!     [--warm-up STREAMS] [--max-growth-mib 16] [--report-every 1000] [--seed 1]
//! ```
//!
//! `elements`: a new `appsrc ! qwencodecdec ! appsink` pipeline per stream, torn down after its
//! EOS (so the shared model is loaded and freed with it). `reuse`: one decoder that stays
//! playing; each stream ends with EOS, then a flush starts the next. `both` alternates them.
//! Exits with failure when a stream's audio differs or the memory grew more than allowed.

mod common;

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use common::{Codes, Options, StopOnDrop};
use gst::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
    let (model, codes_path) = options.take_model_and_codes()?;
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
    let report_every: usize = options.take_parsed("--report-every", 1000)?;
    let seed: u64 = options.take_parsed("--seed", 1)?;
    options.finish()?;
    if streams <= warm_up {
        return Err(format!("--streams {streams} leaves nothing after --warm-up {warm_up}").into());
    }

    gst::init()?;
    gstqwencodec::plugin_register_static()?;
    let mut codes = Codes::load(&codes_path, &model)?;
    codes.bytes.truncate(frames.max(1) * codes.frame_bytes);

    let mut soak = Soak {
        codes,
        model: model.to_str().ok_or("the model path is not UTF-8")?.to_owned(),
        device,
        chunk_frames,
        rng: StdRng::seed_from_u64(seed),
        reused: None,
    };
    println!(
        "soak: {streams} streams of {} frames, chunk-frames {chunk_frames}, device {}, model {}",
        soak.codes.frames(),
        soak.device,
        soak.model
    );

    let start = Instant::now();
    let mut first_audio: Option<Vec<f32>> = None;
    let mut worst_error = 0.0f64;
    let mut baseline = None;
    let mut peak_rss = 0.0f64;
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
        match &first_audio {
            None => first_audio = Some(audio),
            Some(first) => {
                let error = relative_l2(&audio, first)
                    .ok_or_else(|| format!("stream {index}: {} samples, not {}", audio.len(), first.len()))?;
                worst_error = worst_error.max(error);
                if error > 1e-6 {
                    return Err(format!(
                        "stream {index}: audio differs from the first stream's by {error:.2e}"
                    )
                    .into());
                }
            }
        }

        let rss = rss_mib()?;
        peak_rss = peak_rss.max(rss);
        if index + 1 == warm_up {
            baseline = Some((rss, gpu_mib()));
        }
        if (index + 1) % report_every == 0 || index + 1 == streams {
            let since = baseline.map_or(String::new(), |(base, _)| {
                format!(" ({:+.1} since warm-up)", rss - base)
            });
            // The rate since the last report: a decode that slows down with age shows here.
            let (last_count, last_time) = last_report;
            println!(
                "  {:>6} streams: RSS {rss:.1} MiB{since}, GPU {}, {:.1} streams/s",
                index + 1,
                gpu_mib().map_or("n/a".into(), |mib| format!("{mib} MiB")),
                (index + 1 - last_count) as f64 / last_time.elapsed().as_secs_f64()
            );
            last_report = (index + 1, Instant::now());
        }
    }
    drop(soak);

    let (base_rss, base_gpu) = baseline.ok_or("no baseline")?;
    let end_rss = rss_mib()?;
    let growth = end_rss - base_rss;
    let gpu = match (base_gpu, gpu_mib()) {
        (Some(base), Some(end)) => format!("GPU {base} -> {end} MiB"),
        _ => "GPU memory n/a".into(),
    };
    println!(
        "soak: {streams} streams in {:.1} s, each equal to the first (worst relative L2 {worst_error:.1e}); \
         RSS after {warm_up} warm-up streams {base_rss:.1} MiB, at the end {end_rss:.1} MiB ({growth:+.1} MiB), \
         peak {peak_rss:.1} MiB; {gpu}",
        start.elapsed().as_secs_f64()
    );
    if growth > max_growth_mib {
        return Err(
            format!("RSS grew by {growth:.1} MiB after warm-up, more than {max_growth_mib} MiB").into(),
        );
    }
    if let (Some(base), Some(end)) = (base_gpu, gpu_mib())
        && end as f64 - base as f64 > max_growth_mib
    {
        return Err(format!("GPU memory grew from {base} to {end} MiB after warm-up").into());
    }
    Ok(())
}

impl Soak {
    fn decoder(&self) -> Result<gst::Element, Box<dyn Error>> {
        Ok(gst::ElementFactory::make("qwencodecdec")
            .property("model-path", &self.model)
            .property("device", &self.device)
            .property("chunk-frames", self.chunk_frames)
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

fn relative_l2(actual: &[f32], expected: &[f32]) -> Option<f64> {
    if actual.len() != expected.len() {
        return None;
    }
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&a, &e) in actual.iter().zip(expected) {
        diff += (a as f64 - e as f64).powi(2);
        norm += (e as f64).powi(2);
    }
    Some((diff / norm.max(f64::MIN_POSITIVE)).sqrt())
}

/// This process's resident memory.
fn rss_mib() -> Result<f64, Box<dyn Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmRSS in /proc/self/status")?;
    Ok(kib / 1024.0)
}

/// This process's GPU memory as nvidia-smi reports it; None without a GPU or nvidia-smi.
fn gpu_mib() -> Option<u64> {
    let output = std::process::Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()?;
    let pid = std::process::id().to_string();
    String::from_utf8_lossy(&output.stdout).lines().find_map(|line| {
        let (line_pid, mib) = line.split_once(',')?;
        (line_pid.trim() == pid).then(|| mib.trim().parse().ok())?
    })
}

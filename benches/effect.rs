//! `make bench`, time to effect: what a player feels when it seeks or stops while a file plays
//! in real time through qwencodecdec (not a test: it asserts nothing). Written to
//! `measurements/results/<cpu>/effect-<device>-<dtype>.{md,json}`.
//!
//! cargo bench --bench effect -- --model DIR [--out measurements/results] [--seconds 40] [--runs 10]
//!     [--play-ms 3000] [--chunk-frames 1] [--seek-context-frames 25] [--device cpu] [--dtype f32]
//!
//! Each run plays `filesrc ! capsfilter ! qwencodecparse ! qwencodecdec ! audioconvert !
//! fakesink sync=true` on a file of random codes (`--seconds` long), as a player would, and
//! after `--play-ms`:
//! - **seek**: a flushing, accurate seek to the file's 75 %: the time the seek call takes to
//!   return, and the time from the call to the first audio after it at the sink (the parser's
//!   `seek-context-frames` before the target, 25 by default, are decoded first);
//! - **stop**: in a fresh run, PLAYING→NULL: the time the call takes.
//!
//! A clock is what is measured here (the tests count decode steps instead), so each figure is
//! given over `--runs` runs: min, median, max; with the decoder's mean step time beside them.

use qwencodec_testing::bench as common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{machine, percentile};
use gst::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

struct Args {
    model: PathBuf,
    out: PathBuf,
    seconds: usize,
    runs: usize,
    play: Duration,
    chunk_frames: u32,
    seek_context_frames: u32,
    device: String,
    dtype: String,
}

/// One playing pipeline and what its sink saw.
struct Player {
    pipeline: gst::Pipeline,
    decoder: gst::Element,
    /// The instant of each buffer the sink got after a flush-stop (the first only is sent).
    after_flush: mpsc::Receiver<Instant>,
}

impl Player {
    fn start(args: &Args, file: &std::path::Path, codebooks: usize, rate: gst::Fraction) -> Self {
        let pipeline = gst::parse::launch(&format!(
            "filesrc location={} ! audio/x-qwen3-tts-codes,codebooks={codebooks},framerate={}/{} ! qwencodecparse seek-context-frames={} \
             ! qwencodecdec name=decoder model-path={} device={} dtype={} chunk-frames={} \
             ! audioconvert ! fakesink name=sink sync=true",
            file.display(),
            rate.numer(),
            rate.denom(),
            args.seek_context_frames,
            args.model.display(),
            args.device,
            args.dtype,
            args.chunk_frames
        ))
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
        let decoder = pipeline.by_name("decoder").unwrap();
        let (sender, after_flush) = mpsc::channel();
        let flushed = AtomicBool::new(false);
        pipeline
            .by_name("sink")
            .unwrap()
            .static_pad("sink")
            .unwrap()
            .add_probe(
                gst::PadProbeType::BUFFER | gst::PadProbeType::EVENT_FLUSH,
                move |_, info| {
                    match &info.data {
                        Some(gst::PadProbeData::Event(event))
                            if event.type_() == gst::EventType::FlushStop =>
                        {
                            flushed.store(true, Ordering::Relaxed)
                        }
                        Some(gst::PadProbeData::Buffer(_)) if flushed.swap(false, Ordering::Relaxed) => {
                            let _ = sender.send(Instant::now());
                        }
                        _ => (),
                    }
                    gst::PadProbeReturn::Ok
                },
            );
        pipeline.set_state(gst::State::Playing).unwrap();
        Self {
            pipeline,
            decoder,
            after_flush,
        }
    }

    fn play_until(&self, position: gst::ClockTime) {
        while self.pipeline.query_position::<gst::ClockTime>() < Some(position) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn mean_step_ms(&self) -> f64 {
        self.decoder
            .property::<gst::Structure>("stats")
            .get("mean-step-ms")
            .unwrap()
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn summary(values: &[f64]) -> Value {
    json!({
        "min": percentile(values, 0.0),
        "median": percentile(values, 0.5),
        "max": percentile(values, 1.0),
        "runs": values,
    })
}

fn main() {
    // Every option read before any work (see `common::read_options`).
    let args = common::read_options(|options| {
        Ok(Args {
            model: options.take_required("--model")?.into(),
            out: options
                .take("--out")?
                .map_or_else(|| "measurements/results".into(), PathBuf::from),
            seconds: options.take_parsed("--seconds", 40)?,
            runs: options.take_parsed("--runs", 10)?,
            play: Duration::from_millis(options.take_parsed("--play-ms", 3000)?),
            chunk_frames: options.take_parsed("--chunk-frames", 1)?,
            seek_context_frames: options.take_parsed("--seek-context-frames", 25)?,
            device: options.take("--device")?.unwrap_or_else(|| "cpu".into()),
            dtype: options.take("--dtype")?.unwrap_or_else(|| "f32".into()),
        })
    });
    gst::init().unwrap();
    gstqwencodec::plugin_register_static().unwrap();
    let config = gstqwencodec::model::DecoderConfig::from_file(&args.model.join("config.json")).unwrap();
    let (num, den) = config.frame_rate();
    let rate = gst::Fraction::new(num as i32, den as i32);
    let frames = args.seconds * num as usize / den as usize;
    let mut rng = StdRng::seed_from_u64(30);
    let codes: Vec<u8> = (0..frames * config.num_quantizers)
        .flat_map(|_| (rng.random_range(0..config.codebook_size) as i16).to_le_bytes())
        .collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), codes).unwrap();
    let target = gst::ClockTime::from_seconds(args.seconds as u64 * 3 / 4);
    let at = gst::ClockTime::from_nseconds(args.play.as_nanos() as u64);

    let (mut seek_returns, mut first_audio, mut stops, mut step_ms) = (vec![], vec![], vec![], vec![]);
    for run in 0..args.runs {
        let player = Player::start(&args, file.path(), config.num_quantizers, rate);
        player.play_until(at);
        let seek = Instant::now();
        player
            .pipeline
            .seek_simple(gst::SeekFlags::FLUSH | gst::SeekFlags::ACCURATE, target)
            .unwrap();
        seek_returns.push(ms(seek.elapsed()));
        let audio = player.after_flush.recv_timeout(Duration::from_secs(120)).unwrap();
        first_audio.push(ms(audio - seek));
        step_ms.push(player.mean_step_ms());
        player.pipeline.set_state(gst::State::Null).unwrap();

        let player = Player::start(&args, file.path(), config.num_quantizers, rate);
        player.play_until(at);
        let stop = Instant::now();
        player.pipeline.set_state(gst::State::Null).unwrap();
        stops.push(ms(stop.elapsed()));
        eprintln!(
            "run {run}: seek returned in {:.1} ms, first audio after {:.1} ms; stop {:.1} ms",
            seek_returns[run], first_audio[run], stops[run]
        );
    }

    let machine = machine();
    let date = common::date();
    let report = json!({
        "date": date,
        "machine": machine,
        "device": args.device,
        "dtype": args.dtype,
        "model": args.model.file_name().unwrap().to_string_lossy(),
        "file_seconds": args.seconds,
        "played_ms": ms(args.play),
        "seek_target_s": target.seconds(),
        "chunk_frames": args.chunk_frames,
        "seek_context_frames": args.seek_context_frames,
        "seek_returns_ms": summary(&seek_returns),
        "seek_first_audio_ms": summary(&first_audio),
        "stop_ms": summary(&stops),
        "mean_step_ms": summary(&step_ms),
    });
    let md = markdown(&report);
    common::write_result(
        &args.out,
        &format!("effect-{}-{}", args.device, args.dtype),
        &report,
        &md,
    );
    print!("{md}");
}

fn markdown(report: &Value) -> String {
    let m = &report["machine"];
    let row = |name: &str, key: &str| {
        let s = &report[key];
        format!(
            "| {name} | {:.1} | {:.1} | {:.1} |\n",
            s["min"].as_f64().unwrap(),
            s["median"].as_f64().unwrap(),
            s["max"].as_f64().unwrap()
        )
    };
    format!(
        "# Time to effect: seek and stop during playback\n\n\
         {} on {} ({}), {} cores; code {}; model `{}`, {} on {}.\n\n\
         A {} s file of random codes plays through `filesrc ! qwencodecparse ! qwencodecdec \
         chunk-frames={} ! audioconvert ! fakesink sync=true`; {} ms into playback, a flushing \
         accurate seek to {} s (the parser's `seek-context-frames={}`: frames before the target \
         decoded for the state, their audio clipped), or in another run PLAYING→NULL. {} runs each, in ms:\n\n\
         | what | min | median | max |\n| --- | ---: | ---: | ---: |\n{}{}{}{}",
        report["date"].as_str().unwrap(),
        m["cpu"].as_str().unwrap_or("unknown"),
        common::flags(m),
        m["cores"],
        common::code(m),
        report["model"].as_str().unwrap(),
        report["dtype"].as_str().unwrap(),
        report["device"].as_str().unwrap(),
        report["file_seconds"],
        report["chunk_frames"],
        report["played_ms"],
        report["seek_target_s"],
        report["seek_context_frames"],
        report["seek_returns_ms"]["runs"].as_array().unwrap().len(),
        row("seek call returns", "seek_returns_ms"),
        row("seek call to first audio after it", "seek_first_audio_ms"),
        row("PLAYING→NULL returns", "stop_ms"),
        row("decoder's mean step (the seek runs)", "mean_step_ms"),
    )
}

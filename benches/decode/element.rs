//! The element's side: `qwencodecdec` in a pipeline, fed one frame per buffer.

use std::time::Instant;

use gst::prelude::*;
use gstqwencodec::model::Model;
use serde_json::{Value, json};

use crate::common::percentile;
use crate::common::relative_l2;
use crate::{Args, Run, frame_period, row};

/// One run of the element in a fresh pipeline, fed one frame per buffer as fast as it takes
/// them: the run, and the element's own mean and longest step (its `stats`).
fn element_run(
    args: &Args,
    model: &Model,
    codes: &[i16],
    chunk_frames: usize,
    reference: &[f32],
) -> (Run, f64, f64, bool) {
    let config = model.config();
    let (num, den) = config.frame_rate();
    let caps = gst::Caps::builder("audio/x-qwen3-tts-codes")
        .field("codebooks", config.num_quantizers as i32)
        .field("framerate", gst::Fraction::new(num as i32, den as i32))
        .build();
    let pipeline = gst::Pipeline::new();
    let src = gst_app::AppSrc::builder()
        .caps(&caps)
        .format(gst::Format::Time)
        .build();
    let decoder = gst::ElementFactory::make("qwencodecdec")
        .property("model-path", args.model.to_str().unwrap())
        .property("device", &args.device)
        .property("chunk-frames", chunk_frames as u32)
        // Steps of chunk-frames, as the core's rows run (the frames come faster than a talker's:
        // by default they would join into larger steps).
        .property("max-step-frames", chunk_frames as u32)
        .build()
        .unwrap();
    decoder.set_property_from_str("dtype", &args.dtype.to_string());
    let sink = gst_app::AppSink::builder().sync(false).build();
    pipeline
        .add_many([src.upcast_ref(), &decoder, sink.upcast_ref()])
        .unwrap();
    gst::Element::link_many([src.upcast_ref(), &decoder, sink.upcast_ref()]).unwrap();
    // The element loads (the model is already loaded and shared) and warms up in here.
    pipeline.set_state(gst::State::Playing).unwrap();

    let started = Instant::now();
    let feeder = {
        let (src, codes, codebooks) = (src.clone(), codes.to_vec(), config.num_quantizers);
        std::thread::spawn(move || {
            let mut step_filled = None;
            for (index, frame) in codes.chunks(codebooks).enumerate() {
                let bytes: Vec<u8> = frame.iter().flat_map(|c| c.to_le_bytes()).collect();
                if index + 1 == chunk_frames {
                    step_filled = Some(Instant::now());
                }
                src.push_buffer(gst::Buffer::from_slice(bytes)).unwrap();
            }
            src.end_of_stream().unwrap();
            step_filled.expect("the codes fill at least one step")
        })
    };
    let mut first_audio = None;
    let mut audio = Vec::with_capacity(reference.len());
    while let Ok(sample) = sink.pull_sample() {
        first_audio.get_or_insert_with(Instant::now);
        let map = sample.buffer().unwrap().map_readable().unwrap();
        audio.extend(
            map.chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap())),
        );
    }
    let total = started.elapsed().as_secs_f64();
    let step_filled = feeder.join().unwrap();
    let stats = decoder.property::<gst::Structure>("stats");
    pipeline.set_state(gst::State::Null).unwrap();

    let to_first_audio = first_audio.expect("audio came out").duration_since(step_filled);
    let run = Run {
        seconds_per_audio_second: total / (audio.len() as f64 / model.sample_rate() as f64),
        first_audio_ms: (chunk_frames - 1) as f64 * frame_period(model) * 1e3
            + to_first_audio.as_secs_f64() * 1e3,
        error: relative_l2(&audio, reference),
    };
    (
        run,
        stats.get::<f64>("mean-step-ms").unwrap(),
        stats.get::<f64>("max-step-ms").unwrap(),
        stats.get::<bool>("cuda-graph").unwrap(),
    )
}

/// The element in a pipeline, a fresh pipeline per run. Its step columns are the element's
/// own figures: the median of the runs' mean step and the longest step of all runs.
#[derive(Default)]
pub(crate) struct ElementBench {
    runs: Vec<Run>,
    mean_step_ms: Vec<f64>,
    max_step_ms: f64,
    cuda_graph: bool,
}

impl ElementBench {
    /// One run, kept unless it is the warm-up.
    pub(crate) fn run(
        &mut self,
        args: &Args,
        model: &Model,
        codes: &[i16],
        chunk_frames: usize,
        reference: &[f32],
        warm_up: bool,
    ) {
        let (timed, mean_step_ms, max_step_ms, cuda_graph) =
            element_run(args, model, codes, chunk_frames, reference);
        if warm_up {
            return;
        }
        self.runs.push(timed);
        self.mean_step_ms.push(mean_step_ms);
        self.max_step_ms = self.max_step_ms.max(max_step_ms);
        self.cuda_graph = cuda_graph;
    }

    pub(crate) fn row(&self, chunk_frames: usize) -> Value {
        let graph = if self.cuda_graph { " + CUDA graph" } else { "" };
        row(
            &format!("qwencodecdec in a pipeline{graph}, chunk-frames {chunk_frames}"),
            json!(tch::get_num_threads()),
            &self.runs,
            json!({"mean": percentile(&self.mean_step_ms, 0.5), "max": self.max_step_ms}),
        )
    }
}

//! The decoder on CUDA, run on a GPU host by tools/gpu-check.sh (`--ignored`). Without a GPU
//! the CUDA tests are ignored; run with `--ignored` there, they fail.
//!
//! The CPU tests come first in that script: they decode the fixtures of the bundle (found through
//! `QWENCODEC_FIXTURES`) with the bundled binary's libtorch and GStreamer before any GPU time is
//! spent, so that a bundle that cannot find or decode its fixtures fails there, not halfway
//! through the GPU steps.

use qwencodec_testing as common;

use std::sync::Arc;

use common::{FIXTURES, batching, load_fixture, relative_l2};
use gstqwencodec::model::{Dtype, MAX_GRAPHS, Model, StepLimits, StreamDecoder, TailStrategy};
use tch::Device;

/// The first CUDA device; a test that needs it fails without it.
fn cuda() -> Device {
    assert!(
        tch::Cuda::is_available(),
        "libtorch sees no CUDA device: this test needs one"
    );
    Device::Cuda(0)
}

/// Eager steps, without CUDA graphs.
fn decode(fixture: &common::Fixture, device: Device, dtype: Dtype, chunk_frames: usize) -> Vec<f32> {
    let model = Arc::new(Model::load(&fixture.dir, device, dtype).unwrap());
    let mut decoder = decoder_with_graphs(&model, chunk_frames, false);
    decode_stream(&mut decoder, &fixture.codes)
}

/// All of `codes`, a frame per push as a live source gives them, then the tail.
fn decode_stream(decoder: &mut StreamDecoder, codes: &[i16]) -> Vec<f32> {
    let codebooks = decoder.model().config().num_quantizers;
    let mut audio = Vec::new();
    for frame in codes.chunks(codebooks) {
        audio.extend(decoder.push(frame).unwrap());
    }
    audio.extend(decoder.finish().unwrap());
    audio
}

#[test]
fn every_fixture_decodes_on_the_cpu() {
    println!("fixtures from {}", common::fixtures_root().display());
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let audio = decode(&fixture, Device::Cpu, Dtype::F32, 3);
        fixture.assert_matches(&audio, "cpu f32, chunk 3");
    }
}

/// Every frame of `fixture` in one buffer through a started harness, then EOS: the audio.
fn decode_in_harness(h: &mut gst_check::Harness, fixture: &common::Fixture) -> Vec<f32> {
    h.push(gst::Buffer::from_slice(common::code_bytes(&fixture.codes)))
        .unwrap();
    h.push_event(gst::event::Eos::new());
    common::pull_all(h)
        .iter()
        .flat_map(|buffer| common::samples(buffer))
        .collect()
}

#[test]
fn the_element_decodes_on_the_cpu() {
    let fixture = load_fixture("release-tiny");
    let mut h = common::harness(&fixture, &[("device", &"cpu"), ("chunk-frames", &2u32)]);
    let audio = decode_in_harness(&mut h, &fixture);
    fixture.assert_matches(&audio, "qwencodecdec on the cpu");
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_float32_matches_upstream() {
    let device = cuda();
    for name in FIXTURES {
        let fixture = load_fixture(name);
        for chunk_frames in [1, 3, 4] {
            let audio = decode(&fixture, device, Dtype::F32, chunk_frames);
            fixture.assert_matches(&audio, &format!("cuda f32, chunk {chunk_frames}"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_half_precision_stays_close() {
    let device = cuda();
    for name in FIXTURES {
        let fixture = load_fixture(name);
        for (dtype, bound) in [
            (Dtype::F16, fixture.upstream_f16_error.min(2e-2)),
            (Dtype::Bf16, fixture.upstream_bf16_error),
        ] {
            let error = common::relative_l2(&decode(&fixture, device, dtype, 2), &fixture.audio);
            assert!(
                error <= bound,
                "{name} on cuda in {dtype}: {error:.3e} above {bound:.3e}"
            );
        }
    }
}

/// A decoder that may replay the model's graphs, or may not.
fn decoder_with_graphs(model: &Arc<Model>, chunk_frames: usize, cuda_graphs: bool) -> StreamDecoder {
    let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();
    decoder.set_limits(StepLimits {
        cuda_graphs,
        ..decoder.limits()
    });
    decoder
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_graph_steps_match_eager_steps_and_survive_reset() {
    let device = cuda();
    for name in FIXTURES {
        let fixture = load_fixture(name);
        // F16 with graphs is what device=auto ships on a GPU.
        for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            let model = Arc::new(Model::load(&fixture.dir, device, dtype).unwrap());
            // 3 leaves a tail of one-frame steps (the fixtures' frame counts are not multiples).
            for chunk_frames in [1, 3, 4] {
                let what = format!("{name}, cuda {dtype} graph, chunk {chunk_frames}");
                let mut eager = decoder_with_graphs(&model, chunk_frames, false);
                let expected = decode_stream(&mut eager, &fixture.codes);
                assert_eq!(eager.graph_steps(), 0, "{what}: graphs off");

                let mut decoder = decoder_with_graphs(&model, chunk_frames, true);
                for round in 0..2 {
                    let audio = decode_stream(&mut decoder, &fixture.codes);
                    assert_eq!(
                        decoder.graph_steps(),
                        decoder.steps(),
                        "{what}: every step a graph"
                    );
                    let error = relative_l2(&audio, &expected);
                    assert!(
                        error <= 1e-6,
                        "{what}, round {round}: {error:.3e} from eager steps"
                    );
                    match dtype {
                        Dtype::F32 => fixture.assert_matches(&audio, &what),
                        Dtype::F16 => {
                            let bound = fixture.upstream_f16_error.min(2e-2);
                            let error = relative_l2(&audio, &fixture.audio);
                            assert!(error <= bound, "{what}: {error:.3e} above {bound:.3e}");
                        }
                        Dtype::Bf16 => (),
                    }
                    decoder.reset().unwrap();
                }
            }
            let report = model.cuda_graphs();
            assert_eq!(report.failure, None);
            assert!(report.graphs > 0 && report.graphs <= MAX_GRAPHS, "{report:?}");
            println!("{name} {dtype}: {report:?}");
        }
    }
}

/// Streams of every age, length, chunk size and start, batched into graphs of padded buckets,
/// each against its eager solo decode and upstream.
#[test]
#[ignore = "needs a CUDA device"]
fn graph_batched_streams_match_eager_solo_decodes() {
    let device = cuda();
    for (name, seed) in [("release-tiny", 1), ("gqa-bias", 2)] {
        let fixture = load_fixture(name);
        let model = Arc::new(Model::load(&fixture.dir, device, Dtype::F32).unwrap());
        // 13 streams: batches of every size up to 13, most padded up to their bucket.
        let plans = batching::plans(&fixture, 13, seed);
        let outcomes = batching::decode_together(&model, &plans, fixture.codebooks);
        let most = outcomes.iter().map(|o| o.max_rows).max().unwrap();
        // Batches of several rows by count, not timing.
        batching::three_streams_in_one_batch(&fixture, &model);
        let graph_steps: u64 = outcomes.iter().map(|o| o.graph_steps).sum();
        assert!(graph_steps > 0, "{name}: no step replayed a graph");
        batching::check(&fixture, &model, &plans, &outcomes);
        let report = model.cuda_graphs();
        println!("{name}: largest batch {most}, {graph_steps} graph steps, {report:?}");
        assert_eq!(report.failure, None);
        assert!(report.graphs <= MAX_GRAPHS, "{report:?}");
    }
}

/// Graphs address the state arena: when streams that start later grow it, the graphs recorded
/// before are dropped and recorded again, and no stream hears another's audio.
#[test]
#[ignore = "needs a CUDA device"]
fn streams_that_grow_the_arena_keep_their_audio() {
    let device = cuda();
    let fixture = load_fixture("release-tiny");
    let model = Arc::new(Model::load(&fixture.dir, device, Dtype::F32).unwrap());
    let codebooks = fixture.codebooks;
    let mut decoders: Vec<StreamDecoder> = Vec::new();
    let mut audio: Vec<Vec<f32>> = Vec::new();
    // A new stream every frame (the arena grows from 4 rows to 16), each pushed a frame a step.
    let streams = 12;
    for frame in 0..fixture.frames + streams {
        if decoders.len() < streams {
            decoders.push(decoder_with_graphs(&model, 1, true));
            audio.push(Vec::new());
        }
        for (index, decoder) in decoders.iter_mut().enumerate() {
            if let Some(at) = frame.checked_sub(index).filter(|&at| at < fixture.frames) {
                audio[index].extend(
                    decoder
                        .push(&fixture.codes[at * codebooks..(at + 1) * codebooks])
                        .unwrap(),
                );
            }
        }
    }
    for (index, decoder) in decoders.iter_mut().enumerate() {
        audio[index].extend(decoder.finish().unwrap());
        assert!(decoder.graph_steps() > 0);
        fixture.assert_matches(&audio[index], &format!("stream {index} started at frame {index}"));
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_element_replays_a_cuda_graph() {
    use gst::prelude::*;
    cuda();
    let fixture = load_fixture("release-tiny");
    let mut h = common::harness(&fixture, &[("device", &"cuda"), ("chunk-frames", &2u32)]);
    let audio = decode_in_harness(&mut h, &fixture);
    let stats = h.element().unwrap().property::<gst::Structure>("stats");
    assert!(stats.get::<bool>("cuda-graph").unwrap(), "{stats}");
    fixture.assert_matches(&audio, "qwencodecdec on cuda with a graph");
}

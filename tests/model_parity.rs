//! The streaming decoder against upstream's full-sequence decode.

use qwencodec_testing as common;

use std::sync::Arc;

use common::{FIXTURES, Fixture, load_fixture, relative_l2};
use gstqwencodec::model::{
    CpuKernels, Dtype, KERNELS_ENV, Kernel, Model, OpProfiler, StepLimits, StreamDecoder, TailStrategy,
    cpu_kernels, widest_kernels,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tch::Device;

fn load_model(fixture: &Fixture) -> Arc<Model> {
    Arc::new(Model::load(&fixture.dir, Device::Cpu, Dtype::F32).expect("fixture model loads"))
}

/// Pushes `codes` in calls of the given frame counts, then finishes.
fn decode_in_calls(decoder: &mut StreamDecoder, codes: &[i16], calls: &[usize]) -> Vec<f32> {
    let codebooks = decoder.model().config().num_quantizers;
    let mut audio = Vec::new();
    let mut start = 0;
    for &frames in calls {
        let end = start + frames * codebooks;
        let chunk = decoder.push(&codes[start..end]).unwrap();
        let decodable = (decoder.frames_in() as usize / decoder.chunk_frames()) * decoder.chunk_frames();
        assert_eq!(
            audio.len() + chunk.len(),
            decodable * decoder.model().samples_per_frame(),
            "audio of every complete step comes out at once"
        );
        audio.extend(chunk);
        start = end;
    }
    assert_eq!(start, codes.len());
    audio.extend(decoder.finish().unwrap());
    audio
}

/// Every chunk size 1-8 with every tail it can leave (0 to chunk - 1 frames), both strategies.
/// The fixtures' lengths are multiples of 4, so the tails come from prefixes, each long enough
/// for the attention window to have filled and moved on by a full step before the tail.
#[test]
fn every_chunk_size_tail_and_strategy_matches_upstream() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let model = load_model(&fixture);
        assert_eq!(model.samples_per_frame(), fixture.samples_per_frame);
        assert_eq!(model.sample_rate(), fixture.sample_rate);
        let window = model.config().sliding_window;
        for chunk_frames in 1..=8 {
            for frames in fixture.tail_lengths(chunk_frames, window + chunk_frames) {
                for tail in [TailStrategy::Eager, TailStrategy::Pad] {
                    let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, tail).unwrap();
                    // Steps of chunk-frames only (frames that wait would join into larger ones).
                    decoder.set_limits(StepLimits {
                        max_step_frames: chunk_frames,
                        ..StepLimits::default()
                    });
                    let audio = decode_in_calls(&mut decoder, fixture.prefix_codes(frames), &[frames]);
                    let tail_frames = frames % chunk_frames;
                    let tail_steps = match tail {
                        TailStrategy::Eager => tail_frames,
                        TailStrategy::Pad => usize::from(tail_frames > 0),
                    };
                    assert_eq!(
                        decoder.steps() as usize,
                        frames / chunk_frames + tail_steps,
                        "{name}: chunk {chunk_frames}, {frames} frames, {tail:?} tail: decode steps"
                    );
                    fixture.assert_prefix_matches(
                        &audio,
                        frames,
                        &format!("chunk {chunk_frames}, tail of {tail_frames}, {tail:?}"),
                    );
                }
            }
        }
    }
}

#[test]
fn random_splits_into_calls_match_upstream() {
    let mut rng = StdRng::seed_from_u64(7);
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let model = load_model(&fixture);
        for round in 0..4 {
            let chunk_frames = rng.random_range(1..=4);
            let tail = if round % 2 == 0 {
                TailStrategy::Eager
            } else {
                TailStrategy::Pad
            };
            let mut calls = Vec::new();
            let mut left = fixture.frames;
            while left > 0 {
                let frames = rng.random_range(0..=left.min(9));
                calls.push(frames);
                left -= frames;
            }
            let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, tail).unwrap();
            let audio = decode_in_calls(&mut decoder, &fixture.codes, &calls);
            fixture.assert_matches(
                &audio,
                &format!("chunk {chunk_frames}, {tail:?} tail, calls {calls:?}"),
            );
        }
    }
}

#[test]
fn reset_gives_a_fresh_stream() {
    let fixture = load_fixture("gqa-bias");
    let mut decoder = StreamDecoder::new(load_model(&fixture), 3, TailStrategy::Eager).unwrap();
    let first = decode_in_calls(&mut decoder, &fixture.codes, &[fixture.frames]);
    fixture.assert_matches(&first, "before a reset");
    decoder.reset().unwrap();
    assert_eq!(decoder.frames_in(), 0);
    let second = decode_in_calls(&mut decoder, &fixture.codes, &[fixture.frames]);
    assert_eq!(first, second);

    // A reset in the middle of a stream drops what was pending too.
    decoder.reset().unwrap();
    decoder.push(&fixture.codes[..5 * fixture.codebooks]).unwrap();
    decoder.reset().unwrap();
    assert_eq!(decoder.pending_frames(), 0);
    let third = decode_in_calls(&mut decoder, &fixture.codes, &[fixture.frames]);
    assert_eq!(first, third);
}

#[test]
fn interleaved_streams_on_shared_weights_are_independent() {
    let fixture = load_fixture("gqa-bias");
    let model = load_model(&fixture);
    let other_codes: Vec<i16> = fixture.codes.iter().rev().copied().collect();
    // Alone with the same calls as interleaved below, so that the steps are the same (frames
    // that wait join into larger steps): then the audio must be the same to the bit.
    assert_eq!(fixture.frames % 3, 0);
    let calls = vec![3; fixture.frames / 3];
    let alone = |codes: &[i16]| {
        let mut decoder = StreamDecoder::new(model.clone(), 2, TailStrategy::Eager).unwrap();
        decode_in_calls(&mut decoder, codes, &calls)
    };
    let (alone_a, alone_b) = (alone(&fixture.codes), alone(&other_codes));
    fixture.assert_matches(&alone_a, "alone");

    let mut a = StreamDecoder::new(model.clone(), 2, TailStrategy::Eager).unwrap();
    let mut b = StreamDecoder::new(model.clone(), 2, TailStrategy::Eager).unwrap();
    let (mut audio_a, mut audio_b) = (Vec::new(), Vec::new());
    for (frames_a, frames_b) in fixture
        .codes
        .chunks(3 * fixture.codebooks)
        .zip(other_codes.chunks(3 * fixture.codebooks))
    {
        audio_a.extend(a.push(frames_a).unwrap());
        audio_b.extend(b.push(frames_b).unwrap());
    }
    audio_a.extend(a.finish().unwrap());
    audio_b.extend(b.finish().unwrap());
    assert_eq!(audio_a, alone_a);
    assert_eq!(audio_b, alone_b);
}

#[test]
fn streams_on_several_threads_share_one_model() {
    let fixture = Arc::new(load_fixture("gqa-bias"));
    let model = load_model(&fixture);
    let workers: Vec<_> = (1..=3)
        .map(|chunk_frames| {
            let (model, fixture) = (model.clone(), fixture.clone());
            std::thread::spawn(move || {
                let mut decoder = StreamDecoder::new(model, chunk_frames, TailStrategy::Eager).unwrap();
                decode_in_calls(&mut decoder, &fixture.codes, &[fixture.frames])
            })
        })
        .collect();
    for worker in workers {
        fixture.assert_matches(&worker.join().unwrap(), "decoded on another thread");
    }
}

/// The network's receptive field is finite, so after a long stream a context + probe must
/// decode as on a fresh stream; only position drift in attention could tell them apart.
#[test]
fn accuracy_does_not_depend_on_stream_length() {
    let fixture = load_fixture("gqa-bias");
    let model = load_model(&fixture);
    let codebooks = fixture.codebooks;
    let codebook_size = model.config().codebook_size as i16;
    let mut rng = StdRng::seed_from_u64(11);
    let mut random_frames = |frames: usize| -> Vec<i16> {
        (0..frames * codebooks)
            .map(|_| rng.random_range(0..codebook_size))
            .collect()
    };
    let context_and_probe = random_frames(96);
    let probe_samples = 32 * model.samples_per_frame();

    let chunk_frames = 8;
    let mut long = StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();
    let history = random_frames(20_000);
    for block in history.chunks(500 * codebooks) {
        long.push(block).unwrap();
    }
    assert_eq!(long.frames_in(), 20_000);
    let settled_state = long.state_bytes();
    let long_audio = long.push(&context_and_probe).unwrap();

    let mut fresh = StreamDecoder::new(model, chunk_frames, TailStrategy::Eager).unwrap();
    let fresh_audio = fresh.push(&context_and_probe).unwrap();

    let probe = |audio: &[f32]| audio[audio.len() - probe_samples..].to_vec();
    let error = relative_l2(&probe(&long_audio), &probe(&fresh_audio));
    assert!(
        error < 1e-5,
        "probe after 20,000 frames differs from a fresh stream: {error:.3e}"
    );
    assert_eq!(
        long.state_bytes(),
        settled_state,
        "state stops growing once the window is full"
    );
}

#[test]
fn state_is_reported_and_bounded() {
    let fixture = load_fixture("release-tiny");
    let model = load_model(&fixture);
    let mut decoder = StreamDecoder::new(model, 4, TailStrategy::Eager).unwrap();
    // Every state tensor is allocated at its full size from the start: the KV window too.
    let empty = decoder.state_bytes();
    let c = decoder.model().config().clone();
    let kv_bytes = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * (c.sliding_window - 1) * 4;
    assert!(empty > kv_bytes, "conv contexts come on top of the KV window");
    decoder.push(&fixture.codes).unwrap();
    let pending_bytes = decoder.pending_frames() * c.num_quantizers * 8;
    assert_eq!(decoder.state_bytes(), empty + pending_bytes);
}

#[test]
fn one_model_per_checkpoint_device_and_dtype_is_shared_then_freed() {
    let dir = common::fixture_dir("gqa-bias");
    let first = Model::shared(&dir, Device::Cpu, Dtype::F32).unwrap();
    let again = Model::shared(&dir.join("."), Device::Cpu, Dtype::F32).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "the same folder by another spelling");
    let other_dtype = Model::shared(&dir, Device::Cpu, Dtype::Bf16).unwrap();
    assert!(!Arc::ptr_eq(&first, &other_dtype));

    let weak = Arc::downgrade(&first);
    drop((first, again));
    assert!(weak.upgrade().is_none(), "freed with its last user");
    let reloaded = Model::shared(&dir, Device::Cpu, Dtype::F32).unwrap();
    assert_eq!(reloaded.config(), other_dtype.config());
}

/// dtype f16 on the CPU rounds only the weights of the products bound by their bytes (kept in
/// float16): activations, accumulation and the other weights stay float32. Where
/// the checkpoint is stored in float16 or bfloat16 (exact in float16) nothing is rounded at
/// these fixtures' widths (too narrow for Winograd tiles, whose 16-bit transformed weights
/// would round), so the decode matches at the float32 tolerance, which any rounding of
/// activations would exceed; from float32 weights it stays under half of upstream's own float16 decode, which
/// rounds every activation too.
#[test]
fn f16_on_cpu_rounds_only_the_weights() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let model = Arc::new(Model::load(&fixture.dir, Device::Cpu, Dtype::F16).unwrap());
        let mut decoder = StreamDecoder::new(model, 1, TailStrategy::Eager).unwrap();
        let audio = decode_in_calls(&mut decoder, &fixture.codes, &[fixture.frames]);
        let error = relative_l2(&audio, &fixture.audio);
        let bound = fixture.f16_bound();
        println!("measured {name} f16 {error:.4e} (the core)");
        assert!(
            error <= bound,
            "{name} in f16 on the CPU: relative L2 error {error:.3e} above {bound:.3e}"
        );
    }
}

/// bfloat16 weights and products (activations stay float32 between products): no worse than
/// upstream's own bfloat16 forward, and within twice the most measured. (These random-weight fixtures magnify rounding about
/// 50-fold, so bfloat16's 8-bit mantissa lands at 2-7e-2 here, upstream's at 4-10e-2.)
#[test]
fn bf16_compute_stays_within_upstreams_bf16() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let model = Arc::new(Model::load(&fixture.dir, Device::Cpu, Dtype::Bf16).unwrap());
        let mut decoder = StreamDecoder::new(model, 2, TailStrategy::Eager).unwrap();
        let audio = decode_in_calls(&mut decoder, &fixture.codes, &[fixture.frames]);
        let error = relative_l2(&audio, &fixture.audio);
        let bound = fixture.bf16_bound();
        println!("measured {name} bf16 {error:.4e} (the core)");
        assert!(
            error <= bound,
            "{name} in bf16: relative L2 error {error:.3e} above {bound:.3e}"
        );
    }
}

/// Our CPU kernels run in the widest instruction set the CPU has (AVX2 or AVX-512; `pointwise`
/// in AVX-512 only), unless the environment holds them back
/// (`QWENCODEC_CPU_KERNELS=avx2` or `off`, and kernels by name: `on,-snake_beta`). make test runs
/// this file again with each, so that the parity above holds on the paths other CPUs take too:
/// a step's ops say which path ran.
#[test]
fn the_cpu_kernels_run_as_the_cpu_and_environment_allow() {
    let value = std::env::var(KERNELS_ENV).unwrap_or_default();
    let mut parts = value.split(',').map(str::trim).peekable();
    let allowed = match parts.next_if(|part| !part.starts_with('-')) {
        Some("off") => CpuKernels::Off,
        Some("avx2") => CpuKernels::Avx2,
        _ => CpuKernels::Avx512,
    };
    let held_back: Vec<&str> = parts.filter_map(|part| part.strip_prefix('-')).collect();
    let expected = widest_kernels().min(allowed);
    assert_eq!(cpu_kernels(), expected);

    let fixture = load_fixture("release-tiny");
    let mut decoder = StreamDecoder::new(load_model(&fixture), 1, TailStrategy::Eager).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.tsv");
    let profiler = OpProfiler::start(Device::Cpu).unwrap();
    let audio = decoder.push(fixture.prefix_codes(1)).unwrap();
    profiler.finish(&events).unwrap();
    assert_eq!(audio.len(), fixture.samples_per_frame);
    let ops = std::fs::read_to_string(&events).unwrap();
    assert!(ops.contains("aten::"), "the step's ops were recorded");
    // Other tests of this file may run at the same time, on the same path. Off: none of ours
    // at all, so that the path CUDA takes (libtorch's ops everywhere) runs here.
    if expected == CpuKernels::Off {
        let ours: Vec<&str> = ops.lines().filter(|line| line.contains("qwencodec::")).collect();
        assert!(
            ours.is_empty(),
            "kernels of ours ran with {KERNELS_ENV}=off: {ours:?}"
        );
    }
    for (kernel, runs) in [
        ("snake_beta", expected >= CpuKernels::Avx2),
        ("direct_conv", expected >= CpuKernels::Avx2),
        ("overlap_add", expected >= CpuKernels::Avx2),
        ("skinny_gemm", expected >= CpuKernels::Avx2),
        ("attention", expected >= CpuKernels::Avx2),
        ("rms_norm", expected >= CpuKernels::Avx2),
        // AVX-512 where MKL's products run without it (AMD's CPUs).
        ("pointwise", Kernel::Pointwise.runs_in(expected)),
    ] {
        let runs = runs && !held_back.contains(&kernel);
        assert_eq!(
            ops.contains(&format!("qwencodec::{kernel}")),
            runs,
            "{kernel} ran: expected {runs} ({value:?})"
        );
    }
}

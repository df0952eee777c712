//! Steps of many streams computed together: each stream's audio is what it gets alone, and what
//! upstream's full decode gives, whoever it was batched with.

mod common;

use std::sync::{Arc, Barrier};

use common::{Fixture, load_fixture, relative_l2};
use gstqwencodec::model::{Dtype, Model, StepLimits, StreamDecoder, TailStrategy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tch::Device;

/// A stream's audio against its solo decode: batching may change the last bits of a product
/// (another matrix shape), nothing more.
const BATCHED_VS_SOLO: f64 = 1e-5;

/// One stream of a run: what it decodes and how.
#[derive(Clone)]
struct Plan {
    codes: Vec<i16>,
    chunk_frames: usize,
    tail: TailStrategy,
    /// Frames per push, in order; they add up to the codes' frames.
    calls: Vec<usize>,
    /// Pushes made by the other streams before this one starts (a later start).
    start_after: usize,
    /// Reset after this many pushes and decode everything again (the second pass is kept).
    reset_after: Option<usize>,
    max_batch: usize,
}

/// What a stream gave and the batches it ran in.
struct Outcome {
    audio: Vec<f32>,
    max_rows: usize,
}

fn random_calls(frames: usize, rng: &mut StdRng) -> Vec<usize> {
    let mut calls = Vec::new();
    let mut left = frames;
    while left > 0 {
        let n = rng.random_range(0..=left.min(6));
        calls.push(n);
        left -= n;
    }
    calls
}

fn decode(model: &Arc<Model>, plan: &Plan, codebooks: usize) -> Outcome {
    let mut decoder = StreamDecoder::new(model.clone(), plan.chunk_frames, plan.tail).unwrap();
    decoder.set_limits(StepLimits {
        max_batch: plan.max_batch,
        ..StepLimits::default()
    });
    let run = |decoder: &mut StreamDecoder, stop_after: Option<usize>| {
        let mut audio = Vec::new();
        let mut at = 0;
        for (index, &frames) in plan.calls.iter().enumerate() {
            if Some(index) == stop_after {
                return audio;
            }
            let end = at + frames * codebooks;
            audio.extend(decoder.push(&plan.codes[at..end]).unwrap());
            at = end;
        }
        audio.extend(decoder.finish().unwrap());
        audio
    };
    if plan.reset_after.is_some() {
        run(&mut decoder, plan.reset_after);
        decoder.reset().unwrap();
    }
    let audio = run(&mut decoder, None);
    Outcome {
        audio,
        max_rows: decoder.batch_rows().1,
    }
}

/// Every plan on a thread of its own, all on `model`, the later starts held back by a count
/// of the pushes made so far.
fn decode_together(model: &Arc<Model>, plans: &[Plan], codebooks: usize) -> Vec<Outcome> {
    let barrier = Arc::new(Barrier::new(plans.len()));
    let workers: Vec<_> = plans
        .iter()
        .map(|plan| {
            let (model, plan, barrier) = (model.clone(), plan.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                // A later start: a few other streams' steps' worth of time.
                for _ in 0..plan.start_after {
                    std::thread::yield_now();
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                decode(&model, &plan, codebooks)
            })
        })
        .collect();
    workers.into_iter().map(|w| w.join().unwrap()).collect()
}

/// Plans of every kind for `fixture`: prefixes of its codes (checked against upstream) and
/// reversed codes (checked against their solo decode), chunk sizes 1-4, both tails, random
/// splits, later starts, a reset mid-stream.
fn plans(fixture: &Fixture, streams: usize, seed: u64) -> Vec<Plan> {
    let mut rng = StdRng::seed_from_u64(seed);
    let codebooks = fixture.codebooks;
    (0..streams)
        .map(|index| {
            let frames = rng.random_range(fixture.frames / 3..=fixture.frames);
            let codes = if index % 2 == 0 {
                fixture.codes[..frames * codebooks].to_vec()
            } else {
                let mut reversed: Vec<i16> =
                    fixture.codes.chunks(codebooks).rev().flatten().copied().collect();
                reversed.truncate(frames * codebooks);
                reversed
            };
            Plan {
                calls: random_calls(frames, &mut rng),
                codes,
                chunk_frames: 1 + index % 4,
                tail: if index % 3 == 0 {
                    TailStrategy::Pad
                } else {
                    TailStrategy::Eager
                },
                start_after: rng.random_range(0..4),
                reset_after: (index % 5 == 4).then(|| rng.random_range(1..4)),
                max_batch: 16,
            }
        })
        .collect()
}

fn check(fixture: &Fixture, model: &Arc<Model>, plans: &[Plan], outcomes: &[Outcome]) {
    for (index, (plan, outcome)) in plans.iter().zip(outcomes).enumerate() {
        let what = format!(
            "{} stream {index} (chunk {}, {:?}, {} frames)",
            fixture.name,
            plan.chunk_frames,
            plan.tail,
            plan.codes.len() / fixture.codebooks
        );
        let solo = decode(
            model,
            &Plan {
                max_batch: 1,
                ..plan.clone()
            },
            fixture.codebooks,
        );
        assert_eq!(solo.max_rows, 1, "{what}: max_batch 1 runs alone");
        let error = relative_l2(&outcome.audio, &solo.audio);
        assert!(
            error <= BATCHED_VS_SOLO,
            "{what}: {error:.3e} from its solo decode"
        );
        if index % 2 == 0 {
            fixture.assert_prefix_matches(&outcome.audio, plan.codes.len() / fixture.codebooks, &what);
        }
    }
}

fn load(fixture: &Fixture) -> Arc<Model> {
    Arc::new(Model::load(&fixture.dir, Device::Cpu, Dtype::F32).unwrap())
}

#[test]
fn streams_of_every_age_length_and_chunk_size_batched_together_stay_exact() {
    for (name, seed) in [("release-tiny", 1), ("gqa-bias", 2)] {
        let fixture = load_fixture(name);
        let model = load(&fixture);
        let plans = plans(&fixture, 12, seed);
        let outcomes = decode_together(&model, &plans, fixture.codebooks);
        let most = outcomes.iter().map(|o| o.max_rows).max().unwrap();
        assert!(most > 1, "{name}: twelve busy streams never shared a step");
        check(&fixture, &model, &plans, &outcomes);
    }
}

#[test]
fn two_models_in_one_process_batch_their_own_streams() {
    let fixtures = [load_fixture("release-tiny"), load_fixture("gqa-bias")];
    let models: Vec<_> = fixtures.iter().map(load).collect();
    let plans: Vec<Vec<Plan>> = fixtures.iter().map(|f| plans(f, 6, 3)).collect();
    let outcomes: Vec<Vec<Outcome>> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..2)
            .map(|i| {
                let (model, plans, codebooks) = (&models[i], &plans[i], fixtures[i].codebooks);
                scope.spawn(move || decode_together(model, plans, codebooks))
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    });
    for i in 0..2 {
        check(&fixtures[i], &models[i], &plans[i], &outcomes[i]);
    }
}

#[test]
fn max_batch_one_keeps_a_stream_alone_among_batched_ones() {
    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    let mut plans = plans(&fixture, 6, 4);
    plans[0].max_batch = 1;
    plans[1].max_batch = 2;
    let outcomes = decode_together(&model, &plans, fixture.codebooks);
    assert_eq!(outcomes[0].max_rows, 1);
    assert!(outcomes[1].max_rows <= 2, "{}", outcomes[1].max_rows);
    check(&fixture, &model, &plans, &outcomes);
}

/// Frames that wait (one push of many) run in steps of chunk-frames times a power of two, up
/// to the limit: fewer steps, the same audio.
#[test]
fn waiting_frames_join_into_larger_steps_up_to_the_limit() {
    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    let frames = 100;
    let codes = &fixture.codes[..frames * fixture.codebooks];
    for (chunk_frames, max_step_frames, steps) in [
        // 100 = 12 x 8 + 4
        (1, 8, 13),
        (1, 1, 100),
        // 25 chunks of 4 = 3 x 8 + 1 chunks: steps of 32 frames, then one of 4
        (4, 32, 4),
        // a limit below chunk-frames counts as chunk-frames
        (4, 2, 25),
        // 33 chunks of 3, the last frame a tail: 16 + 16 + 1 chunks, then the tail
        (3, 64, 4),
    ] {
        let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();
        decoder.set_limits(StepLimits {
            max_step_frames,
            ..StepLimits::default()
        });
        let mut audio = decoder.push(codes).unwrap();
        audio.extend(decoder.finish().unwrap());
        assert_eq!(
            decoder.steps(),
            steps,
            "chunk {chunk_frames}, up to {max_step_frames} frames a step"
        );
        fixture.assert_prefix_matches(
            &audio,
            frames,
            &format!("chunk {chunk_frames}, up to {max_step_frames} frames a step"),
        );
    }
}

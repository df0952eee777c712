//! Many streams on one model, each on a thread of its own, batched by the model's engine; each
//! stream checked against its solo eager decode and upstream's (tests/batching.rs on the CPU,
//! tests/cuda.rs with CUDA graphs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use gstqwencodec::model::{Model, StepLimits, StreamDecoder, TailStrategy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Fixture, relative_l2};

/// A stream's audio against its solo decode: batching may change the last bits of a product
/// (another matrix shape), nothing more. Twice the most measured per fixture, kernels on, avx2
/// and off alike, on an AMD EPYC with AVX-512: release-tiny 3.25e-6 and gqa-bias 2.3e-6,
/// full-release-80 3.6e-5 (its widths take Winograd tiles and oneDNN's transposed convolutions,
/// whose sums another batch shape orders otherwise: as far from the solo decode as upstream's own
/// float32 decode is from float64).
pub fn batched_vs_solo_bound(fixture: &Fixture) -> f64 {
    match fixture.name {
        "release-tiny" => 6.5e-6,
        "gqa-bias" => 4.6e-6,
        super::RELEASED_FIXTURE => 7.2e-5,
        other => panic!("{other}: no batched figure measured"),
    }
}

/// One stream of a run: what it decodes and how.
#[derive(Clone)]
pub struct Plan {
    pub codes: Vec<i16>,
    pub chunk_frames: usize,
    pub tail: TailStrategy,
    /// Frames per push, in order; they add up to the codes' frames.
    pub calls: Vec<usize>,
    /// Pushes made by the other streams before this one starts (a later start).
    pub start_after: usize,
    /// Reset after this many pushes and decode everything again (the second pass is kept).
    pub reset_after: Option<usize>,
    pub max_batch: usize,
    /// On CUDA, whether its steps may replay the model's graphs.
    pub cuda_graphs: bool,
}

/// What a stream gave and the batches it ran in.
pub struct Outcome {
    pub audio: Vec<f32>,
    pub max_rows: usize,
    pub graph_steps: u64,
}

pub fn random_calls(frames: usize, rng: &mut StdRng) -> Vec<usize> {
    let mut calls = Vec::new();
    let mut left = frames;
    while left > 0 {
        let n = rng.random_range(0..=left.min(6));
        calls.push(n);
        left -= n;
    }
    calls
}

pub fn decode(model: &Arc<Model>, plan: &Plan, codebooks: usize) -> Outcome {
    let mut decoder = StreamDecoder::new(model.clone(), plan.chunk_frames, plan.tail).unwrap();
    decoder.set_limits(StepLimits {
        max_batch: plan.max_batch,
        cuda_graphs: plan.cuda_graphs,
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
        graph_steps: decoder.graph_steps(),
    }
}

/// Every plan on a thread of its own, all on `model`, the later starts held back by a count
/// of the pushes made so far.
pub fn decode_together(model: &Arc<Model>, plans: &[Plan], codebooks: usize) -> Vec<Outcome> {
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

/// Plans of every kind for `fixture`: prefixes of its codes of random lengths (so every stream
/// is checked against upstream; two rows that hold the same codes at the same age hold the
/// same state, so only a mix-up that changes nothing escapes), chunk sizes 1-4, both tails,
/// random splits, later starts, a reset mid-stream.
pub fn plans(fixture: &Fixture, streams: usize, seed: u64) -> Vec<Plan> {
    let mut rng = StdRng::seed_from_u64(seed);
    let codebooks = fixture.codebooks;
    (0..streams)
        .map(|index| {
            let frames = rng.random_range(fixture.frames / 3..=fixture.frames);
            let codes = fixture.codes[..frames * codebooks].to_vec();
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
                cuda_graphs: true,
            }
        })
        .collect()
}

pub fn check(fixture: &Fixture, model: &Arc<Model>, plans: &[Plan], outcomes: &[Outcome]) {
    for (index, (plan, outcome)) in plans.iter().zip(outcomes).enumerate() {
        let what = format!(
            "{} stream {index} (chunk {}, {:?}, {} frames)",
            fixture.name,
            plan.chunk_frames,
            plan.tail,
            plan.codes.len() / fixture.codebooks
        );
        let solo = solo(model, plan, fixture.codebooks);
        assert_eq!(solo.max_rows, 1, "{what}: max_batch 1 runs alone");
        let error = relative_l2(&outcome.audio, &solo.audio);
        println!("{what}: {error:.3e} from its solo decode");
        assert!(
            error <= batched_vs_solo_bound(fixture),
            "{what}: {error:.3e} from its solo decode"
        );
        fixture.assert_prefix_matches(&outcome.audio, plan.codes.len() / fixture.codebooks, &what);
    }
}

/// `plan` decoded alone (a batch of one, no CUDA graphs): what a batched stream is held to.
pub fn solo(model: &Arc<Model>, plan: &Plan, codebooks: usize) -> Outcome {
    decode(
        model,
        &Plan {
            max_batch: 1,
            cuda_graphs: false,
            ..plan.clone()
        },
        codebooks,
    )
}

/// `count` streams of the same shape: `fixture`'s first `frames` frames pushed `chunk_frames` at
/// a time with chunk-frames `chunk_frames`, so that every step of every one of them is
/// `chunk_frames` frames and any of their steps that wait together run as one batch.
pub fn equal_plans(fixture: &Fixture, count: usize, frames: usize, chunk_frames: usize) -> Vec<Plan> {
    assert_eq!(frames % chunk_frames, 0, "whole chunks");
    let plan = Plan {
        codes: fixture.codes[..frames * fixture.codebooks].to_vec(),
        chunk_frames,
        tail: TailStrategy::Eager,
        calls: vec![chunk_frames; frames / chunk_frames],
        start_after: 0,
        reset_after: None,
        max_batch: 16,
        cuda_graphs: true,
    };
    vec![plan; count]
}

/// Three streams of the same shape whose steps are held back to run together: batches of three
/// rows by count, not timing (on the graph path a bucket of four padded with the scratch row).
/// Asserts that every step of theirs ran in one, through a graph, and that each stream is its
/// solo decode and upstream's.
pub fn three_streams_in_one_batch(fixture: &Fixture, model: &Arc<Model>) {
    let three = equal_plans(fixture, 3, 24, 2);
    let gathered = gather_next_batch(model, 3);
    let outcomes = decode_together(model, &three, fixture.codebooks);
    assert!(
        gathered.load(Ordering::SeqCst),
        "{}: the model never counted the other two steps waiting",
        fixture.name
    );
    let rows: Vec<usize> = outcomes.iter().map(|o| o.max_rows).collect();
    assert_eq!(
        rows,
        [3, 3, 3],
        "{}: three streams' steps held back run as one batch",
        fixture.name
    );
    // 24 frames in steps of 2: at most 12 steps replayed a graph.
    let graph_steps: Vec<u64> = outcomes.iter().map(|o| o.graph_steps).collect();
    assert!(
        graph_steps.iter().all(|steps| (1..=12).contains(steps)),
        "{}: every stream replayed a graph, in at most its 12 steps: {graph_steps:?}",
        fixture.name
    );
    check(fixture, model, &three, &outcomes);
}

/// Holds `model`'s next batch back, once, until it can take `steps` steps together, whatever
/// the machine's speed: batches of several rows form by count, not by timing. The model's
/// observer runs after each batch on the thread that ran it, with the queue open to new steps:
/// that thread's stream hands over its next step only after the observer, so the wait is for
/// the other `steps - 1`, and the next batch takes the last within its rejoin grace. (It waited
/// for `steps`, which never came: 10 s lost per call.) A wait of over 10 s gives up; the flag
/// returned says whether the model counted the others waiting (its `steps_waiting`, which a
/// server's metrics report).
pub fn gather_next_batch(model: &Arc<Model>, steps: usize) -> Arc<AtomicBool> {
    let model_ref = Arc::downgrade(model);
    let armed = AtomicBool::new(true);
    let gathered = Arc::new(AtomicBool::new(false));
    model.observe_batches({
        let gathered = gathered.clone();
        move |_| {
            if !armed.swap(false, Ordering::SeqCst) {
                return;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while let Some(model) = model_ref.upgrade()
                && Instant::now() < deadline
            {
                if model.steps_waiting() == steps - 1 {
                    gathered.store(true, Ordering::SeqCst);
                    return;
                }
                drop(model);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    gathered
}

/// Three streams of different ages and codes in batches of three, their arena rows out of
/// order: the oldest (`ages[0]` frames decoded alone first) holds row 2, the next row 1, the
/// youngest (starting with the batch) row 3, and their first batch takes them in the order
/// youngest, middle, oldest: rows [3, 1, 2]. A fourth stream's step holds the queue while the
/// three hand over their steps one at a time, so that batch forms by count; a rejoin grace of
/// a second keeps the later batches whole until the oldest ends. Each stream decodes the
/// fixture to its end in steps of 2 frames, so each batch holds three different frames of
/// three different states: a row read or written back in another's place changes the audio.
/// Returns each stream's outcome with its plan; the caller checks them (see [`check`]).
pub fn three_streams_of_different_ages(fixture: &Fixture, model: &Arc<Model>) -> (Vec<Plan>, Vec<Outcome>) {
    const CHUNK: usize = 2;
    let ages = [40, 18, 0];
    assert!(
        fixture.frames >= ages[0] + 4 * CHUNK,
        "{}: too short",
        fixture.name
    );
    let codebooks = fixture.codebooks;
    let plans: Vec<Plan> = ages
        .iter()
        .map(|&age| {
            let mut calls = vec![age];
            calls.extend(std::iter::repeat_n(CHUNK, (fixture.frames - age) / CHUNK));
            calls.push((fixture.frames - age) % CHUNK);
            Plan {
                codes: fixture.codes.clone(),
                chunk_frames: CHUNK,
                tail: TailStrategy::Eager,
                calls,
                start_after: 0,
                reset_after: None,
                max_batch: 16,
                cuda_graphs: true,
            }
        })
        .collect();
    let open = || StreamDecoder::new(model.clone(), CHUNK, TailStrategy::Eager).unwrap();
    // Rows are handed out lowest first: the middle stream takes 1, the oldest 2, the youngest 3,
    // the holder 4.
    let (mut middle, mut oldest, youngest, mut holder) = (open(), open(), open(), open());
    let mut prefixes = [
        oldest.push(fixture.prefix_codes(ages[0])).unwrap(),
        middle.push(fixture.prefix_codes(ages[1])).unwrap(),
        Vec::new(),
    ];

    model.set_rejoin_grace(Duration::from_secs(1));
    let batches = Arc::new(Mutex::new(Vec::new()));
    model.observe_batches({
        let batches = batches.clone();
        move |run| batches.lock().unwrap().push(run.arena_rows.clone())
    });
    let hold = StepHold::on(model);
    hold.arm();
    let outcomes = std::thread::scope(|scope| {
        let holding_step = scope.spawn(|| holder.push(fixture.prefix_codes(CHUNK)).unwrap());
        hold.wait_held("the holder's step");
        // Handed over youngest first, each once the one before waits.
        let streams = [(2, youngest), (1, middle), (0, oldest)];
        let mut workers = Vec::new();
        for (handed_over, (index, mut decoder)) in streams.into_iter().enumerate() {
            let plan = &plans[index];
            workers.push((
                index,
                scope.spawn(move || {
                    let mut audio = Vec::new();
                    let mut at = plan.calls[0];
                    for &frames in &plan.calls[1..] {
                        audio.extend(
                            decoder
                                .push(&plan.codes[at * codebooks..(at + frames) * codebooks])
                                .unwrap(),
                        );
                        at += frames;
                    }
                    audio.extend(decoder.finish().unwrap());
                    (audio, decoder.batch_rows().1)
                }),
            ));
            let deadline = Instant::now() + Duration::from_secs(60);
            while model.steps_waiting() <= handed_over {
                assert!(Instant::now() < deadline, "a step was never handed over");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        hold.release();
        holding_step.join().unwrap();
        let mut outcomes: Vec<Option<Outcome>> = (0..3).map(|_| None).collect();
        for (index, worker) in workers {
            let (audio, max_rows) = worker.join().unwrap();
            let mut whole = std::mem::take(&mut prefixes[index]);
            whole.extend(audio);
            outcomes[index] = Some(Outcome {
                audio: whole,
                max_rows,
                graph_steps: 0,
            });
        }
        outcomes.into_iter().map(Option::unwrap).collect::<Vec<_>>()
    });
    drop(holder);
    let batches = batches.lock().unwrap().clone();
    assert_eq!(
        &batches[..2],
        [vec![4], vec![3, 1, 2]],
        "{}: the holder's step alone (row 4), then the three streams' steps as one batch, the \
         youngest's row first: {batches:?}",
        fixture.name
    );
    // The oldest stream's steps after its prefix, all in batches of three.
    let oldest_steps = plans[0].calls[1..]
        .iter()
        .filter(|&&frames| frames == CHUNK)
        .count();
    let of_three = batches.iter().filter(|rows| rows.len() == 3).count();
    println!(
        "{}: {of_three} batches of three rows, the oldest stream's {oldest_steps} steps among them",
        fixture.name
    );
    assert!(of_three >= oldest_steps, "{}: {batches:?}", fixture.name);
    (plans, outcomes)
}

/// Longer than any held step waits here: past it, something hangs.
const HOLD_PATIENCE: Duration = Duration::from_secs(120);

/// Holds a step of a model in flight on request: the model's next batch after [`StepHold::arm`],
/// its compute done, waits in the model's batch observer until [`StepHold::release`], its
/// stream's step thread waiting for it meanwhile.
pub struct StepHold {
    pub armed: Arc<AtomicBool>,
    entered: std::sync::mpsc::Receiver<()>,
    resume: std::sync::mpsc::Sender<()>,
}

impl StepHold {
    pub fn on(model: &Model) -> Self {
        let armed = Arc::new(AtomicBool::new(false));
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (resume, resumed) = std::sync::mpsc::channel();
        let resumed = Mutex::new(resumed);
        model.observe_batches({
            let armed = armed.clone();
            move |_| {
                if armed.swap(false, Ordering::SeqCst) {
                    entered_tx.send(()).unwrap();
                    _ = resumed.lock().unwrap().recv_timeout(HOLD_PATIENCE);
                }
            }
        });
        Self {
            armed,
            entered,
            resume,
        }
    }

    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Until a step is held.
    pub fn wait_held(&self, what: &str) {
        self.entered
            .recv_timeout(HOLD_PATIENCE)
            .unwrap_or_else(|_| panic!("{what}: no decode step ran"));
    }

    pub fn release(&self) {
        self.resume.send(()).unwrap();
    }
}

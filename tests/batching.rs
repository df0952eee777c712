//! Steps of many streams computed together: each stream's audio is what it gets alone, and what
//! upstream's full decode gives, whoever it was batched with.

use qwencodec_testing as common;

use std::sync::Arc;

use common::batching::{
    Outcome, Plan, check, decode_together, equal_plans, plans, three_streams_in_one_batch,
    three_streams_of_different_ages,
};
use common::{Fixture, load_fixture};
use gstqwencodec::model::{Dtype, Model, StepLimits, StreamDecoder, TailStrategy};
use tch::Device;

fn load(fixture: &Fixture) -> Arc<Model> {
    Arc::new(Model::load(&fixture.dir, Device::Cpu, Dtype::F32).unwrap())
}

/// Every stream against its solo decode and upstream. Which steps share a batch here is the
/// machine's timing; that batches of several rows form at all is asserted by count in
/// `the_graph_path_runs_its_bookkeeping_on_the_cpu`.
#[test]
fn streams_of_every_age_length_and_chunk_size_batched_together_stay_exact() {
    for (name, seed) in [("release-tiny", 1), ("gqa-bias", 2)] {
        let fixture = load_fixture(name);
        let model = load(&fixture);
        let plans = plans(&fixture, 12, seed);
        let outcomes = decode_together(&model, &plans, fixture.codebooks);
        let rows: Vec<usize> = outcomes.iter().map(|o| o.max_rows).collect();
        println!("{name}: the most rows each stream's steps ran in: {rows:?}");
        check(&fixture, &model, &plans, &outcomes);
    }
}

/// A batch formed by count of three streams of different ages and codes, their arena rows out
/// of order, eagerly and through the graphs' stand-in: each stream is its solo decode and
/// upstream's. (Every other batch here holds streams of the same codes at the same age, where
/// rows swapped would give the same audio.)
#[test]
fn streams_of_different_ages_batched_with_their_rows_out_of_order_stay_exact() {
    for name in ["release-tiny", "gqa-bias"] {
        for graphs in [false, true] {
            let fixture = load_fixture(name);
            let model = load(&fixture);
            if graphs {
                model.replay_graphs_eagerly();
            }
            let (plans, outcomes) = three_streams_of_different_ages(&fixture, &model);
            check(&fixture, &model, &plans, &outcomes);
        }
    }
}

/// The bookkeeping around CUDA graphs, run on the CPU with a stand-in for the graphs (each
/// replay runs the recorded step eagerly on the graph's own input and output tensors): buckets
/// of rows padded with the scratch row, the rows as a tensor of arena indices, graphs recorded
/// per bucket and step size and dropped as the arena grows. Streams of every age and size,
/// against their solo decodes and upstream, as tests/cuda.rs checks on a GPU. Each event is
/// made to happen by count: a stream alone records graphs on the first arena, streams opened
/// beside it grow the arena, and three streams' steps held back to run together fill a bucket
/// of four with the scratch row.
#[test]
fn the_graph_path_runs_its_bookkeeping_on_the_cpu() {
    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    model.replay_graphs_eagerly();
    let alone = equal_plans(&fixture, 1, 12, 2);
    let alone_outcomes = decode_together(&model, &alone, fixture.codebooks);
    let recorded = model.cuda_graphs();
    assert!(recorded.graphs > 0 && recorded.dropped == 0, "{recorded:?}");

    // The arena's 4 rows hold the scratch row and 3 streams: a fifth grows it.
    let opened: Vec<StreamDecoder> = (0..4)
        .map(|_| StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap())
        .collect();
    three_streams_in_one_batch(&fixture, &model);
    drop(opened);
    let report = model.cuda_graphs();
    assert!(
        report.dropped >= recorded.graphs,
        "the graphs recorded on the first arena are dropped as it grows: {report:?}"
    );

    let plans = plans(&fixture, 12, 5);
    let outcomes = decode_together(&model, &plans, fixture.codebooks);
    let report = model.cuda_graphs();
    let replayed: u64 = [&alone_outcomes, &outcomes]
        .into_iter()
        .flatten()
        .map(|o| o.graph_steps)
        .sum();
    println!("{replayed} steps replayed a stand-in graph, {report:?}");
    assert!(report.failure.is_none(), "{report:?}");
    check(&fixture, &model, &alone, &alone_outcomes);
    check(&fixture, &model, &plans, &outcomes);
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
/// to the limit, ramping up from one chunk at the start (the first audio after the smallest
/// step): fewer steps, the same audio.
#[test]
fn waiting_frames_join_into_larger_steps_up_to_the_limit() {
    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    let frames = 100;
    let codes = &fixture.codes[..frames * fixture.codebooks];
    for (chunk_frames, max_step_frames, steps) in [
        // 100 = 1 + 2 + 4 + 11 x 8 + 4 + 1
        (1, 8, 16),
        (1, 1, 100),
        // 25 chunks of 4 = 1 + 2 + 4 + 2 x 8 + 2 chunks: steps up to 32 frames
        (4, 32, 6),
        // a limit below chunk-frames counts as chunk-frames
        (4, 2, 25),
        // 33 chunks of 3, the last frame a tail: 1 + 2 + 4 + 8 + 16 + 2 chunks, then the tail
        (3, 64, 7),
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

/// The arena grows with the streams open and shrinks as they end, the streams left keeping
/// their state: the rows in use gather at the bottom, as rows are handed out lowest first.
#[test]
fn the_state_arena_shrinks_as_streams_end() {
    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    let frame = |index: usize| &fixture.codes[index * fixture.codebooks..][..fixture.codebooks];
    let mut first = StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap();
    let mut audio = first.push(frame(0)).unwrap();
    let others: Vec<StreamDecoder> = (0..40)
        .map(|_| StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap())
        .collect();
    assert_eq!(
        model.state_rows(),
        64,
        "41 streams and the scratch row, doubling from 4"
    );
    audio.extend(first.push(frame(1)).unwrap());
    drop(others);
    assert_eq!(model.state_rows(), 4, "one stream left");
    for index in 2..fixture.frames {
        audio.extend(first.push(frame(index)).unwrap());
    }
    fixture.assert_matches(&audio, "a stream through its arena's growth and shrink");
}

/// The arena shrinks only once the rows in use would all lie in its lowest quarter (a row that
/// would be at the quarter's edge keeps it: a stream ending there would otherwise halve it and
/// the next regrow it), and never below 4 rows. A stream that ends without a shrink leaves the arena where it
/// is, and the CUDA graphs recorded on it stay; a shrink moves it, and they go, also when it
/// grows back before the next step.
#[test]
fn the_state_arena_halves_below_a_quarter_and_keeps_four_rows() {
    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    model.replay_graphs_eagerly();
    let open = || StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap();
    let mut first = open();
    let mut frames = fixture.codes.chunks(fixture.codebooks);
    // A step of `first` (through a stand-in graph); the graphs dropped so far.
    let mut step = |first: &mut StreamDecoder| {
        first.push(frames.next().unwrap()).unwrap();
        model.cuda_graphs().dropped
    };
    // Rows 2 to 4 beside the first stream's and the scratch row, handed out lowest first.
    let mut others: Vec<StreamDecoder> = (0..3).map(|_| open()).collect();
    assert_eq!(model.state_rows(), 8);
    assert_eq!(
        others[2].state_bytes(),
        first.state_bytes(),
        "a row's bytes, whatever the size of the arena it was taken from"
    );
    let dropped = step(&mut first);
    assert!(model.cuda_graphs().graphs > 0, "{:?}", model.cuda_graphs());
    others.truncate(1);
    assert_eq!(
        model.state_rows(),
        8,
        "row 2 in use: at a quarter of 8, not below it"
    );
    assert_eq!(
        step(&mut first),
        dropped,
        "streams ended, the arena stayed: its graphs too"
    );
    others.clear();
    assert_eq!(model.state_rows(), 4, "row 1 in use: halved");
    let dropped = step(&mut first);
    assert!(dropped > 0, "the arena moved as it shrank: its graphs go");

    others = (0..3).map(|_| open()).collect();
    let dropped = step(&mut first);
    others.clear();
    others = (0..3).map(|_| open()).collect();
    assert_eq!(model.state_rows(), 8);
    assert!(
        step(&mut first) > dropped,
        "shrunk and grown back between two steps, the arena moved: its graphs go"
    );
    drop(others);
    drop(first);
    assert_eq!(model.state_rows(), 4, "no stream: the fewest rows");
}

/// A shrink is not held back by a stream at a high row: the rows held above the rows kept move
/// down, their state with them, also while their streams' steps wait in the queue (the steps
/// read their rows when their batch runs). Twelve streams take rows 1 to 12 of 16; all but
/// the first and the last two end while the last two's steps wait behind a batch held back, so
/// the arena halves to 8 and moves rows 11 and 12 down to 2 and 3. Each stream that stays has
/// decoded a prefix of another length, so that swapped rows would not decode the same audio,
/// and goes on to match upstream, through the stand-in graphs.
#[test]
fn the_state_arena_moves_the_rows_above_down_as_it_shrinks() {
    use std::sync::mpsc::channel;
    use std::sync::{Mutex, atomic::AtomicBool, atomic::Ordering};
    use std::time::{Duration, Instant};

    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    model.replay_graphs_eagerly();
    let codebooks = fixture.codebooks;
    let frames = |from: usize, to: usize| &fixture.codes[from * codebooks..to * codebooks];
    let mut streams: Vec<StreamDecoder> = (0..12)
        .map(|_| StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap())
        .collect();
    assert_eq!(model.state_rows(), 16);
    let mut last = streams.pop().unwrap();
    let mut second_last = streams.pop().unwrap();
    let mut first = streams.remove(0);
    // Frames decoded by each that stays: the first, the second last, the last.
    let decoded = [2, 3, 5];
    let mut audio = [
        first.push(frames(0, decoded[0])).unwrap(),
        second_last.push(frames(0, decoded[1])).unwrap(),
        last.push(frames(0, decoded[2])).unwrap(),
    ];
    for stream in &mut streams {
        stream.push(frames(0, 1)).unwrap();
    }
    let dropped = model.cuda_graphs().dropped;

    // The next batch (the first stream's step) holds the queue, as a long batch in flight does,
    // until the others have ended.
    let (entered, batch_held) = channel();
    let (resume, held) = channel::<()>();
    let held = Mutex::new(held);
    let armed = AtomicBool::new(true);
    model.observe_batches(move |_| {
        if armed.swap(false, Ordering::SeqCst) {
            entered.send(()).unwrap();
            _ = held.lock().unwrap().recv_timeout(Duration::from_secs(60));
        }
    });
    let [first_audio, second_last_audio, last_audio] = &mut audio;
    let waited = std::thread::scope(|scope| {
        let first_step = scope.spawn(|| first.push(frames(decoded[0], decoded[0] + 1)).unwrap());
        batch_held.recv_timeout(Duration::from_secs(60)).unwrap();
        let second_last_step = scope.spawn(|| second_last.push(frames(decoded[1], decoded[1] + 1)).unwrap());
        let last_step = scope.spawn(|| last.push(frames(decoded[2], decoded[2] + 1)).unwrap());
        let deadline = Instant::now() + Duration::from_secs(60);
        while model.steps_waiting() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let waited = model.steps_waiting();
        // Rows 2 to 10: three streams left, below a quarter of 16.
        streams.clear();
        resume.send(()).unwrap();
        first_audio.extend(first_step.join().unwrap());
        second_last_audio.extend(second_last_step.join().unwrap());
        last_audio.extend(last_step.join().unwrap());
        waited
    });
    assert_eq!(
        waited, 2,
        "the last two streams' steps waited while the others ended"
    );
    assert_eq!(
        model.state_rows(),
        8,
        "three streams, two of them at rows 11 and 12 of 16: halved, those two moved down"
    );
    assert!(
        model.cuda_graphs().dropped > dropped,
        "the arena moved: its graphs go, {:?}",
        model.cuda_graphs()
    );
    for (stream, (audio, decoded)) in [first, second_last, last]
        .iter_mut()
        .zip(audio.iter_mut().zip(decoded))
    {
        audio.extend(stream.push(frames(decoded + 1, fixture.frames)).unwrap());
        audio.extend(stream.finish().unwrap());
        fixture.assert_matches(audio, &format!("the stream that had decoded {decoded} frames"));
    }
}

/// A stream that starts while others decode backlogs gets its first audio after the batch in
/// flight and its own step, counted from its start: it takes a free row without waiting for the
/// compute thread (its first step clears the row there), its first step goes ahead of the
/// waiting ones, and no batch computes more frames than the cap (so the batch in flight is
/// short). Counted in batches, not timed.
#[test]
fn a_starting_stream_waits_for_one_batch_at_most() {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    let batches = Arc::new(Mutex::new(Vec::new()));
    model.observe_batches({
        let batches = batches.clone();
        move |run| batches.lock().unwrap().push(run.clone())
    });
    let stop = Arc::new(AtomicBool::new(false));
    let backlog = &fixture.codes[..8 * fixture.codebooks];
    let load: Vec<_> = (0..8)
        .map(|_| {
            let (model, stop, backlog) = (model.clone(), stop.clone(), backlog.to_vec());
            std::thread::spawn(move || {
                let mut decoder = StreamDecoder::new(model, 1, TailStrategy::Eager).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    decoder.push(&backlog).unwrap();
                }
            })
        })
        .collect();
    // The load under way first: counted in its batches, not a wait (on a loaded machine 300 ms
    // held 18 of them, once).
    let started = std::time::Instant::now();
    while batches.lock().unwrap().len() < 20 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the load ran {} batches in 60 s",
            batches.lock().unwrap().len()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for probe in 0..5 {
        // From the stream's start. Each probe takes the row the last one left (8 streams and the
        // scratch row in 16 rows): its first step must clear it.
        let before = batches.lock().unwrap().len();
        let mut decoder = StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap();
        let audio = decoder.push(fixture.prefix_codes(1)).unwrap();
        let ran = batches.lock().unwrap().len() - before;
        assert!(
            ran <= 2,
            "probe {probe}: {ran} batches ran before its first audio"
        );
        fixture.assert_prefix_matches(&audio, 1, "a stream starting into load");
    }
    stop.store(true, Ordering::Relaxed);
    for thread in load {
        thread.join().unwrap();
    }
    let batches = batches.lock().unwrap();
    let cap = gstqwencodec::model::max_batch_frames(Device::Cpu);
    assert!(
        batches.iter().any(|run| run.rows > 2),
        "the load's streams never batched together"
    );
    for run in batches.iter() {
        assert!(
            run.rows * run.frames <= cap,
            "a batch of {} rows of {} frames",
            run.rows,
            run.frames
        );
    }
}

/// Limits below the least count as the least: a batch of one, steps of the stream's chunk.
#[test]
fn limits_below_the_least_count_as_the_least() {
    let model = load(&load_fixture("release-tiny"));
    let mut decoder = StreamDecoder::new(model, 3, TailStrategy::Eager).unwrap();
    decoder.set_limits(StepLimits {
        max_batch: 0,
        max_step_frames: 2,
        cuda_graphs: false,
    });
    assert_eq!(
        decoder.limits(),
        StepLimits {
            max_batch: 1,
            max_step_frames: 3,
            cuda_graphs: false,
        }
    );
    decoder.set_limits(StepLimits {
        max_batch: 5,
        max_step_frames: 12,
        cuda_graphs: true,
    });
    assert_eq!(
        decoder.limits(),
        StepLimits {
            max_batch: 5,
            max_step_frames: 12,
            cuda_graphs: true,
        }
    );
}

/// What a stream reports of itself (the element's statistics and backlog read it): frames
/// waiting for a full step, the steps run and their times, the batches' rows, CUDA graph steps.
#[test]
fn a_stream_counts_its_waiting_frames_steps_and_times() {
    let fixture = load_fixture("release-tiny");
    let mut decoder = StreamDecoder::new(load(&fixture), 3, TailStrategy::Eager).unwrap();
    decoder.set_limits(StepLimits {
        max_batch: 1,
        max_step_frames: 3,
        cuda_graphs: false,
    });
    let state_bytes = decoder.state_bytes();
    assert!(state_bytes > 0, "a stream holds its row");
    assert!(decoder.push(fixture.prefix_codes(2)).unwrap().is_empty());
    assert_eq!((decoder.pending_frames(), decoder.steps()), (2, 0));
    assert_eq!(
        decoder.state_bytes(),
        state_bytes + 2 * fixture.codebooks * 2,
        "and the waiting codes"
    );
    assert_eq!(decoder.step_times(), Default::default());
    let audio = decoder
        .push(&fixture.codes[2 * fixture.codebooks..7 * fixture.codebooks])
        .unwrap();
    assert_eq!(audio.len(), 6 * fixture.samples_per_frame);
    assert_eq!(
        (decoder.pending_frames(), decoder.steps(), decoder.frames_in()),
        (1, 2, 7)
    );
    let (total, longest) = decoder.step_times();
    assert!(
        longest > std::time::Duration::ZERO && longest <= total,
        "{total:?}, {longest:?}"
    );
    assert_eq!(decoder.batch_rows(), (2, 1));
    assert_eq!(decoder.graph_steps(), 0, "no graph on the CPU");
}

/// The warm step time that admission and latency rest on: a step takes time, and each shape is
/// measured once, so that every stream of the model sees the same figure.
#[test]
fn a_warm_step_is_timed_once_per_shape() {
    let model = load(&load_fixture("release-tiny"));
    let one = model.warm_step_time(1, 1, false).unwrap();
    assert!(one > std::time::Duration::ZERO, "a warm step took {one:?}");
    assert_eq!(model.warm_step_time(1, 1, false).unwrap(), one, "measured again");
    let two = model.warm_step_time(2, 4, false).unwrap();
    assert!(
        two > std::time::Duration::ZERO,
        "a warm step of 2 rows took {two:?}"
    );
    assert_eq!(model.warm_step_time(2, 4, false).unwrap(), two, "measured again");
}

/// A thread that panics while it leads a batch (here in an observer, the one place a panic is
/// not caught) fails its own step and leaves the engine to the others: a stream that steps next
/// gets upstream's audio rather than waiting for ever on a batch that never ends. The wait for
/// it is bounded only to fail rather than hang.
#[test]
fn a_panic_while_leading_a_batch_leaves_the_engine_to_the_others() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    let armed = AtomicBool::new(true);
    model.observe_batches(move |_| {
        if armed.swap(false, Ordering::SeqCst) {
            panic!("an observer's panic");
        }
    });
    let mut first = StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap();
    let codes = fixture.prefix_codes(1).to_vec();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| first.push(&codes)));
    assert!(
        panicked.is_err(),
        "the observer's panic reaches the stream that led the batch"
    );
    drop(first);

    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn({
        let model = model.clone();
        move || {
            let mut next = StreamDecoder::new(model, 1, TailStrategy::Eager).unwrap();
            sender.send(next.push(&codes).unwrap()).unwrap();
        }
    });
    let audio = receiver
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the next stream's step never ran: the engine stayed taken by the panicked batch");
    fixture.assert_prefix_matches(&audio, 1, "the stream after a panicked batch");
}

/// As above in a batch of two rows: the other stream's step, which the panicking thread took
/// into its batch, gets an error naming the panic rather than waiting for ever. The batch forms
/// by count (`gather_next_batch`, the rejoin grace); which of the two leads it is the machine's
/// timing, so each stream may be either. Only a batch of two panics, so a panic at all shows it
/// formed.
#[test]
fn a_panic_while_leading_a_batch_of_two_fails_the_other_rows_step() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    model.set_rejoin_grace(std::time::Duration::from_secs(1));
    common::batching::gather_next_batch(&model, 2);
    let armed = AtomicBool::new(true);
    model.observe_batches(move |run| {
        if run.rows == 2 && armed.swap(false, Ordering::SeqCst) {
            panic!("an observer's panic");
        }
    });
    let (sender, receiver) = std::sync::mpsc::channel();
    for stream in 0..2 {
        let (model, sender) = (model.clone(), sender.clone());
        let codebooks = fixture.codebooks;
        let codes = fixture.prefix_codes(3).to_vec();
        std::thread::spawn(move || {
            let mut decoder = StreamDecoder::new(model, 1, TailStrategy::Eager).unwrap();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<(), String> {
                for frame in codes.chunks(codebooks) {
                    decoder.push(frame).map_err(|err| err.to_string())?;
                }
                Ok(())
            }));
            sender.send((stream, outcome.map_err(|_| "panicked")))
        });
    }
    let mut outcomes: Vec<_> = (0..2)
        .map(|_| {
            receiver
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("a stream never finished: its step waits on a batch that panicked")
        })
        .collect();
    outcomes.sort_by_key(|(stream, _)| *stream);
    let panicked = outcomes
        .iter()
        .filter(|(_, outcome)| outcome == &Err("panicked"))
        .count();
    let failed: Vec<_> = outcomes
        .iter()
        .filter_map(|(_, outcome)| match outcome {
            Ok(Err(err)) => Some(err.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(panicked, 1, "the leader's panic: {outcomes:?}");
    assert_eq!(failed.len(), 1, "the other row's step: {outcomes:?}");
    assert!(
        failed[0].contains("the thread running this batch panicked"),
        "{}",
        failed[0]
    );
}

/// The next batch waits, up to the rejoin grace, for the streams of the batch before to hand over
/// their next steps, so that a batch stays whole instead of splitting into the first stream's
/// step alone and the rest. Counted, not timed: with a grace of a second, three streams held
/// back once into one batch run every later step in batches of three, none started by the grace
/// running out, but for the last (the stream that was a step ahead has ended: its two
/// companions wait out the grace). Without the wait, the first stream to hand over a step runs
/// it at once, alone.
#[test]
fn the_streams_of_a_batch_rejoin_it_within_the_grace() {
    use std::sync::Mutex;

    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    model.set_rejoin_grace(std::time::Duration::from_secs(1));
    let batches = Arc::new(Mutex::new(Vec::new()));
    model.observe_batches({
        let batches = batches.clone();
        move |run| batches.lock().unwrap().push(run.clone())
    });
    let three = equal_plans(&fixture, 3, 24, 2);
    let gathered = common::batching::gather_next_batch(&model, 3);
    let outcomes = decode_together(&model, &three, fixture.codebooks);
    assert!(gathered.load(std::sync::atomic::Ordering::SeqCst));
    // The three streams' batches, before `check`'s solo decodes add theirs.
    let batches = batches.lock().unwrap().clone();
    check(&fixture, &model, &three, &outcomes);
    let first = batches
        .iter()
        .position(|run| run.rows == 3)
        .unwrap_or_else(|| panic!("no batch of three: {batches:?}"));
    let (last, whole) = batches[first..].split_last().unwrap();
    assert!(
        whole.len() >= 10 && whole.iter().all(|run| run.rows == 3 && !run.grace_ran_out),
        "after the held-back batch, every batch but the last has the three streams, none \
         started by the grace running out: {:?}",
        &batches[first..]
    );
    assert_eq!(
        (last.rows, last.grace_ran_out),
        (2, true),
        "the last: the two streams a step behind, after the grace"
    );
}

/// What the element asks before it hands waiting frames over: how many of them the next step
/// would take, none while they do not complete a chunk. Handing over just that many runs one
/// step that takes every pending frame, whatever the chunk size, the frames pending before and
/// the frames waiting (the steps growing with them).
#[test]
fn the_frames_a_stream_names_for_its_next_step_run_as_one_step() {
    let fixture = load_fixture("release-tiny");
    let model = load(&fixture);
    let codebooks = fixture.codebooks;
    for chunk_frames in [1, 2, 3] {
        let mut decoder = StreamDecoder::new(model.clone(), chunk_frames, TailStrategy::Eager).unwrap();
        let mut at = 0;
        let mut push = |decoder: &mut StreamDecoder, frames: usize| {
            decoder
                .push(&fixture.codes[at * codebooks..(at + frames) * codebooks])
                .unwrap();
            at += frames;
        };
        // A frame short of a chunk pending.
        push(&mut decoder, chunk_frames - 1);
        assert_eq!(
            decoder.frames_for_next_step(0),
            None,
            "chunk {chunk_frames}: nothing waits"
        );
        for waiting in [1, 2, 5, 8, 13] {
            let pending = decoder.pending_frames();
            let named = decoder.frames_for_next_step(waiting);
            let what = format!("chunk {chunk_frames}, {pending} pending, {waiting} waiting");
            if pending + waiting < chunk_frames {
                assert_eq!(named, None, "{what}: no chunk completes");
                continue;
            }
            let frames = named.unwrap_or_else(|| panic!("{what}: a chunk completes"));
            assert!((1..=waiting).contains(&frames), "{what}: {frames} frames");
            let steps = decoder.steps();
            push(&mut decoder, frames);
            assert_eq!(
                (decoder.steps(), decoder.pending_frames()),
                (steps + 1, 0),
                "{what}: the {frames} frames named run one step that takes every pending frame"
            );
        }
    }
}

/// Live streams hand over their steps at phases of their own. With a hold (what their latency
/// allows for a batch in flight, `StreamDecoder::set_batch_hold`), each batch waits for the
/// others: after their first steps, which go at once, every batch holds all three. Counted, not
/// timed: a frame every 300 ms, the phases 100 ms apart, the hold 2 s. Without a hold each step
/// runs as it comes, alone.
#[test]
fn live_streams_at_phases_of_their_own_fall_into_one_batch_within_their_hold() {
    use std::sync::Mutex;
    use std::time::Duration;

    let fixture = load_fixture("release-tiny");
    let codebooks = fixture.codebooks;
    let batches_with = |hold: Duration| {
        let model = load(&fixture);
        let batches = Arc::new(Mutex::new(Vec::new()));
        model.observe_batches({
            let batches = batches.clone();
            move |run| batches.lock().unwrap().push(run.clone())
        });
        let start = std::time::Instant::now();
        std::thread::scope(|scope| {
            for phase in 0..3u32 {
                let model = model.clone();
                let codes = &fixture.codes;
                scope.spawn(move || {
                    let mut decoder = StreamDecoder::new(model, 1, TailStrategy::Eager).unwrap();
                    decoder.set_batch_hold(hold);
                    for frame in 0..6 {
                        let due = start
                            + Duration::from_millis(300) * frame as u32
                            + Duration::from_millis(100) * phase;
                        std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
                        let audio = decoder
                            .push(&codes[frame * codebooks..(frame + 1) * codebooks])
                            .unwrap();
                        assert!(!audio.is_empty());
                    }
                });
            }
        });
        batches
            .lock()
            .unwrap()
            .iter()
            .map(|run| {
                let mut rows = run.arena_rows.clone();
                rows.sort_unstable();
                rows
            })
            .collect::<Vec<_>>()
    };

    // The arena rows the batches stepped: the three streams hold rows 1 to 3.
    let held = batches_with(Duration::from_secs(2));
    let (firsts, rest) = held.split_at(held.len() - 5);
    assert_eq!(
        rest,
        vec![vec![1, 2, 3]; 5],
        "every step after the first steps in a batch of all three streams' rows (first steps: \
         {firsts:?})"
    );
    assert_eq!(
        firsts
            .iter()
            .flatten()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [1, 2, 3].into(),
        "the first steps, one of each stream: {held:?}"
    );
    assert_eq!(
        firsts.iter().map(Vec::len).sum::<usize>(),
        3,
        "the first steps: {held:?}"
    );

    let at_once = batches_with(Duration::ZERO);
    assert!(
        at_once.iter().filter(|rows| rows.len() == 3).count() < 3,
        "without a hold, steps 100 ms apart run as they come: {at_once:?}"
    );
}

/// A hold is bounded: a stream that stepped and went quiet is waited for until the hold runs
/// out, not longer; a stream's first step is never held; a stream that ended is not waited for.
/// Lower bounds of time only (a wait cannot end before its hold unless every stream is there)
/// and a hold of a second against waits of nothing.
#[test]
fn a_hold_waits_for_a_quiet_stream_until_it_runs_out_and_never_for_an_ended_one() {
    use std::sync::Mutex;
    use std::time::Duration;

    let fixture = load_fixture("release-tiny");
    let codebooks = fixture.codebooks;
    let frame = |index: usize| &fixture.codes[index * codebooks..(index + 1) * codebooks];
    let model = load(&fixture);
    let batches = Arc::new(Mutex::new(Vec::new()));
    model.observe_batches({
        let batches = batches.clone();
        move |run| batches.lock().unwrap().push(run.clone())
    });
    let last_batch = || batches.lock().unwrap().last().unwrap().clone();
    let hold = Duration::from_secs(1);
    let half = hold / 2;

    let mut quiet = StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap();
    quiet.set_batch_hold(hold);
    quiet.push(frame(0)).unwrap();

    let mut live = StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap();
    live.set_batch_hold(hold);
    live.push(frame(0)).unwrap();
    let first = last_batch();
    assert!(
        first.rows == 1 && first.held < half,
        "a first step goes at once: {first:?}"
    );
    live.push(frame(1)).unwrap();
    let waited = last_batch();
    assert!(
        waited.rows == 1 && waited.held >= half,
        "held for the quiet stream until the hold ran out: {waited:?}"
    );

    drop(quiet);
    live.push(frame(2)).unwrap();
    let alone = last_batch();
    assert!(
        alone.rows == 1 && alone.held < half,
        "the quiet stream ended: nothing to wait for: {alone:?}"
    );
}

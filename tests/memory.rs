//! Memory follows the streams open: the state arena that holds every stream's state shrinks as
//! streams end, whichever rows the streams left hold, and the process gives the memory back. On
//! the released geometry at full widths (about 5.2 MB of state a stream), in a binary of its own
//! so that no other test's memory moves the figures.

use qwencodec_testing as common;

use std::sync::Arc;

use common::{Fixture, released_fixture};
use gstqwencodec::model::{Dtype, Model, StreamDecoder, TailStrategy};

/// Resident memory of this process, in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap();
    kib * 1024
}

/// What stays resident of the ended streams' state may be at most this part of it (26 MB of
/// 522). Measured on a 2-core EPYC: 38 MB less than before them (the arena trims the
/// allocator's heaps when it shrinks; without that, 67-172 MB stayed; without the shrink, all).
const KEPT_AT_MOST: f64 = 0.05;

/// The streams that start together in each case: the one that stays and a hundred that end.
const STREAMS: usize = 101;

/// Both cases in one test, one after the other: tests of one binary run side by side, and each
/// case's figures must be its own. The stream that stays started first (row 1, below the rows
/// left after the shrink) or last (row 101 of 128: the arena moves it down to shrink).
#[test]
fn memory_comes_back_when_a_hundred_streams_end_whichever_row_the_one_left_holds() {
    let fixture = released_fixture();
    let model = Model::shared(&fixture.dir, tch::Device::Cpu, Dtype::F32).unwrap();
    // A step first, so that its working memory is in every baseline.
    StreamDecoder::new(model.clone(), 1, TailStrategy::Eager)
        .unwrap()
        .push(&fixture.codes[..fixture.codebooks])
        .unwrap();
    for (stays, what) in [(0, "started first"), (STREAMS - 1, "started last")] {
        hundred_streams_end_beside_one(&fixture, &model, stays, what);
    }
}

/// Starts `STREAMS` streams, each decoding a frame, and ends all but the one started `stays`-th:
/// the arena is back to its fewest rows, the memory of the hundred is given back, and the
/// stream that stayed goes on decoding exactly.
fn hundred_streams_end_beside_one(fixture: &Fixture, model: &Arc<Model>, stays: usize, what: &str) {
    let one_frame = &fixture.codes[..fixture.codebooks];
    let baseline = resident_bytes();
    let mut streams: Vec<StreamDecoder> = (0..STREAMS)
        .map(|_| StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap())
        .collect();
    let mut audios: Vec<Vec<f32>> = streams
        .iter_mut()
        .map(|stream| stream.push(one_frame).unwrap())
        .collect();
    let mut audio = audios.swap_remove(stays);
    let mut left = streams.remove(stays);
    let state = (STREAMS - 1) as u64 * left.state_bytes() as u64;
    let with_them = resident_bytes();
    assert!(
        model.state_rows() > STREAMS,
        "the stream {what}: {} rows for {STREAMS} streams",
        model.state_rows()
    );
    drop(streams);
    let after = resident_bytes();
    let mb = |bytes: u64| bytes as f64 / 1e6;
    eprintln!(
        "the stream {what}: resident {:.0} MB before, {:.0} MB with {STREAMS} streams ({:.0} MB of state \
         in the {} that end), {:.0} MB once they ended",
        mb(baseline),
        mb(with_them),
        mb(state),
        STREAMS - 1,
        mb(after)
    );
    assert!(
        model.state_rows() <= 4,
        "the stream {what}: the arena kept {} rows for it",
        model.state_rows()
    );
    let kept = after.saturating_sub(baseline);
    assert!(
        kept as f64 <= KEPT_AT_MOST * state as f64,
        "the stream {what}: {:.0} MB more resident than before the streams, over {:.0} % of the {:.0} MB \
         of state of those that ended",
        mb(kept),
        KEPT_AT_MOST * 100.0,
        mb(state)
    );
    // The stream that stayed kept its state through the shrink (and the move down of its row,
    // if it held a high one): its audio goes on exactly.
    audio.extend(left.push(&fixture.codes[fixture.codebooks..]).unwrap());
    audio.extend(left.finish().unwrap());
    fixture.assert_matches(&audio, &format!("the stream {what}, across the arena's shrink"));
}

//! Memory follows the streams open: the state arena that holds every stream's state shrinks as
//! streams end, and the process gives the memory back. On the released geometry at full
//! widths (about 5.2 MB of state a stream), in a binary of its own so that no other test's
//! memory moves the figures.

mod common;

use common::released_fixture;
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

#[test]
fn memory_comes_back_when_a_hundred_streams_end() {
    let fixture = released_fixture();
    let model = Model::shared(&fixture.dir, tch::Device::Cpu, Dtype::F32).unwrap();
    let one_frame = &fixture.codes[..fixture.codebooks];
    let mut first = StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap();
    let mut audio = first.push(one_frame).unwrap();
    let baseline = resident_bytes();

    let mut streams: Vec<StreamDecoder> = (0..100)
        .map(|_| StreamDecoder::new(model.clone(), 1, TailStrategy::Eager).unwrap())
        .collect();
    for stream in &mut streams {
        stream.push(one_frame).unwrap();
    }
    let state = 100 * first.state_bytes() as u64;
    let with_them = resident_bytes();
    assert!(
        model.state_rows() > 100,
        "{} rows for 101 streams",
        model.state_rows()
    );
    drop(streams);
    let after = resident_bytes();
    let mb = |bytes: u64| bytes as f64 / 1e6;
    eprintln!(
        "resident: {:.0} MB with one stream, {:.0} MB with 100 more ({:.0} MB of state), {:.0} MB once they ended",
        mb(baseline),
        mb(with_them),
        mb(state),
        mb(after)
    );
    assert!(
        model.state_rows() <= 4,
        "the arena kept {} rows for one stream",
        model.state_rows()
    );
    let kept = after.saturating_sub(baseline);
    assert!(
        kept as f64 <= KEPT_AT_MOST * state as f64,
        "{:.0} MB more resident than before the 100 streams, over {:.0} % of their {:.0} MB of state",
        mb(kept),
        KEPT_AT_MOST * 100.0,
        mb(state)
    );
    // The stream that stayed kept its state through the shrink: its audio goes on exactly.
    audio.extend(first.push(&fixture.codes[fixture.codebooks..]).unwrap());
    audio.extend(first.finish().unwrap());
    fixture.assert_matches(&audio, "a stream across the arena's shrink");
}

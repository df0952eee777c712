//! How many sessions this machine serves in real time: measured at start from the decoder's
//! own steps, so that a session past that is refused (4429) instead of every session falling
//! behind together.
//!
//! A live session at `--chunk-frames` C hands the decoder C frames every C frame durations; N
//! sessions speaking at once are one batched step of N rows. N are served while that step,
//! measured alone, takes at most [`STEP_BUDGET`] of the C frames' time: the rest goes to Opus,
//! RTP and the server's threads, and to what they cost the decoder's threads on shared cores
//! (on a 2-core AMD EPYC at the released widths, a warm one-row f16 step took 29 ms alone and
//! 51 ms, median, beside two sessions' pipelines; with 80 % the server took two sessions and
//! both fell seconds behind: `bench/results/2026-12-02-amd-epyc-avx512-tts-server-load.md`).

use std::time::Duration;

use gstqwencodec::model::{DecodeError, Model};

/// The part of its frames' time that a step of every session may take.
pub const STEP_BUDGET: f64 = 0.5;

/// The sessions served in real time (at least 1, at most `most`), and the warm step time of
/// each batch size measured on the way.
pub fn real_time_capacity(
    model: &Model,
    chunk_frames: usize,
    frame: Duration,
    most: usize,
) -> Result<(usize, Vec<Duration>), DecodeError> {
    let budget = frame.mul_f64(chunk_frames as f64 * STEP_BUDGET);
    let mut steps = Vec::new();
    for rows in 1..=most {
        let step = model.warm_step_time(rows, chunk_frames, true)?;
        steps.push(step);
        if step > budget {
            break;
        }
    }
    let served = steps.iter().take_while(|&&step| step <= budget).count();
    Ok((served.max(1), steps))
}

//! The decoder on CUDA. Skipped (with a message) where libtorch sees no GPU; run on a GPU host
//! by scripts/gpu-check.sh.

mod common;

use std::sync::Arc;

use common::{FIXTURES, load_fixture};
use gstqwencodec::model::{Dtype, Model, StreamDecoder, TailStrategy};
use tch::Device;

fn cuda() -> Option<Device> {
    if tch::Cuda::is_available() {
        Some(Device::Cuda(0))
    } else {
        eprintln!("skipped: libtorch sees no CUDA device");
        None
    }
}

fn decode(fixture: &common::Fixture, device: Device, dtype: Dtype, chunk_frames: usize) -> Vec<f32> {
    let model = Arc::new(Model::load(&fixture.dir, device, dtype).unwrap());
    let mut decoder = StreamDecoder::new(model, chunk_frames, TailStrategy::Eager).unwrap();
    let mut audio = decoder.push(&fixture.codes).unwrap();
    audio.extend(decoder.finish().unwrap());
    audio
}

#[test]
fn cuda_float32_matches_upstream() {
    let Some(device) = cuda() else { return };
    for name in FIXTURES {
        let fixture = load_fixture(name);
        for chunk_frames in [1, 3, 4] {
            let audio = decode(&fixture, device, Dtype::F32, chunk_frames);
            fixture.assert_matches(&audio, &format!("cuda f32, chunk {chunk_frames}"));
        }
    }
}

#[test]
fn cuda_half_precision_stays_close() {
    let Some(device) = cuda() else { return };
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

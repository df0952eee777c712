//! What the plugin's tests, the server's tests and the benchmarks share: the reference fixtures
//! made by `tools/make_fixtures.py` with the upstream decoder, the element in a harness, and
//! the benchmarks' helpers ([`bench`]).

pub mod batching;
pub mod bench;

use std::path::{Path, PathBuf};
use std::sync::Once;

use safetensors::SafeTensors;

/// GStreamer initialised and the plugin registered, once per test binary.
pub fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        gst::init().unwrap();
        gstqwencodec::plugin_register_static().unwrap();
    });
}

/// The decoder's sink caps for codes of `codebooks` at `framerate`.
pub fn codes_caps(codebooks: i32, framerate: gst::Fraction) -> gst::Caps {
    gst::Caps::builder("audio/x-qwen3-tts-codes")
        .field("codebooks", codebooks)
        .field("framerate", framerate)
        .build()
}

/// A `qwencodecdec` on the CPU for the checkpoint in `model`, with `properties` set.
pub fn decoder(model: &Path, properties: &[(&str, &dyn gst::prelude::ToValue)]) -> gst::Element {
    use gst::prelude::*;
    let element = gst::ElementFactory::make("qwencodecdec")
        .property("model-path", model.to_str().unwrap())
        .property("device", "cpu")
        .build()
        .unwrap();
    for (name, value) in properties {
        element.set_property_from_value(name, &value.to_value());
    }
    element
}

/// A `qwencodecdec` for `fixture`'s checkpoint (on the CPU unless `properties` say otherwise)
/// in a playing harness, its input caps set.
pub fn harness(fixture: &Fixture, properties: &[(&str, &dyn gst::prelude::ToValue)]) -> gst_check::Harness {
    init();
    let element = decoder(&fixture.dir, properties);
    let mut h = gst_check::Harness::with_element(&element, Some("sink"), Some("src"));
    h.set_src_caps(fixture.caps());
    h.play();
    h
}

/// Every buffer the harness has got so far.
pub fn pull_all(h: &mut gst_check::Harness) -> Vec<gst::Buffer> {
    std::iter::from_fn(|| h.try_pull()).collect()
}

/// Bytes cut at random offsets into buffers of up to three frames: frames cut across buffers,
/// some buffers empty.
pub fn random_buffers(bytes: &[u8], frame_bytes: usize, rng: &mut rand::rngs::StdRng) -> Vec<gst::Buffer> {
    use rand::Rng;
    let mut buffers = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let size = rng.random_range(0..=3 * frame_bytes).min(bytes.len() - at);
        buffers.push(gst::Buffer::from_slice(bytes[at..at + size].to_vec()));
        at += size;
    }
    buffers
}

/// An error, warning or info message as text: the error and its debug string.
pub fn describe(message: &gst::Message) -> Option<String> {
    match message.view() {
        gst::MessageView::Error(e) => Some(format!("{} ({:?})", e.error(), e.debug())),
        gst::MessageView::Warning(w) => Some(format!("{} ({:?})", w.error(), w.debug())),
        gst::MessageView::Info(i) => Some(format!("{} ({:?})", i.error(), i.debug())),
        _ => None,
    }
}

/// The messages of one type waiting on a bus, as text. The others are dropped: for errors and
/// warnings both, see [`errors_and_warnings`].
pub fn messages(bus: &gst::Bus, kind: gst::MessageType) -> Vec<String> {
    std::iter::from_fn(|| bus.pop_filtered(&[kind]))
        .filter_map(|message| describe(&message))
        .collect()
}

/// The error and the warning messages waiting on a bus, as text, in one pass (the others are
/// dropped).
pub fn errors_and_warnings(bus: &gst::Bus) -> (Vec<String>, Vec<String>) {
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    while let Some(message) = bus.pop() {
        match message.view() {
            gst::MessageView::Error(_) => errors.extend(describe(&message)),
            gst::MessageView::Warning(_) => warnings.extend(describe(&message)),
            _ => (),
        }
    }
    (errors, warnings)
}

/// A buffer of `bytes`, stamped with `pts`.
pub fn buffer(bytes: &[u8], pts: Option<gst::ClockTime>) -> gst::Buffer {
    let mut buffer = gst::Buffer::from_slice(bytes.to_vec());
    buffer.get_mut().unwrap().set_pts(pts);
    buffer
}

/// The samples of output buffers, in order.
pub fn audio_of(buffers: &[gst::Buffer]) -> Vec<f32> {
    buffers.iter().flat_map(|b| samples(b)).collect()
}

/// The input buffers the decoder's base class still holds, waiting for their audio (its
/// `delay`).
pub fn unclosed_input_buffers(element: &gst::Element) -> i32 {
    use gst::prelude::*;
    use gst_audio::prelude::AudioDecoderExt;
    element.downcast_ref::<gst_audio::AudioDecoder>().unwrap().delay()
}

/// Collects the element's messages on a bus of its own.
pub fn bus_for(element: &gst::Element) -> gst::Bus {
    use gst::prelude::*;
    let bus = gst::Bus::new();
    element.set_bus(Some(&bus));
    bus
}

/// The `fmt ` and `data` chunks of a WAV file's bytes (wavenc writes a LIST chunk of tags after
/// the data).
pub fn wav_chunks(bytes: &[u8]) -> (&[u8], &[u8]) {
    assert_eq!(&bytes[..4], b"RIFF", "not a WAV file");
    let (mut format, mut data) = (None, None);
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let size = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let body = &bytes[at + 8..(at + 8 + size).min(bytes.len())];
        match &bytes[at..at + 4] {
            b"fmt " => format = Some(body),
            b"data" => data = Some(body),
            _ => (),
        }
        at += 8 + size + size % 2;
    }
    (format.expect("a fmt chunk"), data.expect("a data chunk"))
}

/// The samples of a float WAV file's data chunk.
pub fn wav_f32_samples(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    wav_chunks(&bytes)
        .1
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Codes as the decoder takes them: little-endian int16.
pub fn code_bytes(codes: &[i16]) -> Vec<u8> {
    codes.iter().flat_map(|c| c.to_le_bytes()).collect()
}

/// The samples of an F32LE audio buffer.
pub fn samples(buffer: &gst::BufferRef) -> Vec<f32> {
    let map = buffer.map_readable().unwrap();
    map.chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

pub struct Fixture {
    pub name: &'static str,
    pub dir: PathBuf,
    pub codebooks: usize,
    pub frames: usize,
    pub samples_per_frame: usize,
    pub sample_rate: u32,
    /// Codes, frame-major: `frames * codebooks` of them.
    pub codes: Vec<i16>,
    /// Upstream's full-sequence decode in float64.
    pub audio: Vec<f32>,
    /// Relative L2 error of upstream's own float32 decode against `audio`.
    pub upstream_f32_error: f64,
    /// The same for upstream's bfloat16 and float16 forwards.
    pub upstream_bf16_error: f64,
    pub upstream_f16_error: f64,
    /// How the checkpoint stores its weights: float32, bfloat16 or float16.
    pub storage_dtype: String,
}

/// Every committed fixture, each a different geometry.
pub const FIXTURES: [&str; 4] = ["release-tiny", "gqa-bias", "bf16-weights", "f16-weights"];

/// The repository's root (this crate is two folders below it).
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The folder of the committed fixtures: `QWENCODEC_FIXTURES` when set (a test binary run from
/// a bundle unpacked elsewhere, as tools/gpu-check.sh does), else the source tree's.
pub fn fixtures_root() -> PathBuf {
    std::env::var_os("QWENCODEC_FIXTURES").map_or_else(|| repo_root().join("tests/fixtures"), PathBuf::from)
}

pub fn fixture_dir(name: &str) -> PathBuf {
    fixtures_root().join(name)
}

pub fn load_fixture(name: &'static str) -> Fixture {
    load_fixture_in(name, fixture_dir(name))
}

/// A fixture made by `tools/make_fixtures.py` in any folder (`name` only labels messages).
pub fn load_fixture_in(name: &'static str, dir: PathBuf) -> Fixture {
    let bytes = std::fs::read(dir.join("expected.safetensors")).expect("fixture expected.safetensors");
    let (_, metadata) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = metadata.metadata().clone().expect("fixture metadata");
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let codes = tensors.tensor("codes").unwrap();
    let [frames, codebooks] = codes.shape().try_into().unwrap();
    let codes = codes
        .data()
        .chunks_exact(4)
        .map(|b| i16::try_from(i32::from_le_bytes(b.try_into().unwrap())).unwrap())
        .collect();
    let audio = tensors
        .tensor("audio")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let number = |key: &str| meta[key].parse::<f64>().unwrap();
    Fixture {
        name,
        dir,
        codebooks,
        frames,
        samples_per_frame: number("samples_per_frame") as usize,
        sample_rate: number("sample_rate") as u32,
        codes,
        audio,
        upstream_f32_error: number("upstream_f32_rel_l2"),
        upstream_bf16_error: number("upstream_bf16_rel_l2"),
        upstream_f16_error: number("upstream_f16_rel_l2"),
        storage_dtype: meta["storage_dtype"].clone(),
    }
}

/// ||actual - expected|| / ||expected||, in float64.
pub fn relative_l2(actual: &[f32], expected: &[f32]) -> f64 {
    assert_eq!(actual.len(), expected.len(), "audio length");
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&a, &e) in actual.iter().zip(expected) {
        diff += (a as f64 - e as f64).powi(2);
        norm += (e as f64).powi(2);
    }
    (diff / norm).sqrt()
}

impl Fixture {
    /// The caps of this fixture's codes.
    pub fn caps(&self) -> gst::Caps {
        let rate = gst::Fraction::new(self.sample_rate as i32, self.samples_per_frame as i32);
        // gst::Fraction::new reduces.
        codes_caps(self.codebooks as i32, rate)
    }

    /// What was measured of this fixture's decodes (see [`MEASURED`]).
    pub fn measured(&self) -> &'static Measured {
        MEASURED
            .iter()
            .find(|(name, _)| *name == self.name)
            .map(|(_, measured)| measured)
            .unwrap_or_else(|| panic!("{}: no figures measured: add them to MEASURED", self.name))
    }

    /// The parity bound: twice the most measured of this fixture, as a multiple of upstream's
    /// own float32 error. One bound for every path and step size of a fixture: their errors
    /// differ only by the order of float32 sums.
    pub fn tolerance(&self) -> f64 {
        2.0 * self.measured().f32_ratio * self.upstream_f32_error
    }

    /// The bound of a decode in dtype f16 on the CPU, through the core or the element alike:
    /// twice the most measured, within what the dtype promises: where the checkpoint is stored
    /// in float16 or bfloat16 (exact in float16) nothing is rounded at these fixtures' widths,
    /// so the float32 bound; from float32 weights half of upstream's own float16 decode (which
    /// rounds every activation too), at most 2e-2.
    pub fn f16_bound(&self) -> f64 {
        let promised = if self.storage_dtype != "float32" {
            self.tolerance()
        } else {
            (self.upstream_f16_error / 2.0).min(2e-2)
        };
        (2.0 * self.measured().f16).min(promised)
    }

    /// The bound of a decode in dtype bf16: twice the most measured, and no worse than
    /// upstream's own bfloat16 forward.
    pub fn bf16_bound(&self) -> f64 {
        let measured = self
            .measured()
            .bf16
            .unwrap_or_else(|| panic!("{}: no bf16 figure measured", self.name));
        (2.0 * measured).min(self.upstream_bf16_error)
    }

    pub fn assert_matches(&self, audio: &[f32], what: &str) {
        self.assert_prefix_matches(audio, self.frames, what);
    }

    /// The codes of the first `frames` frames.
    pub fn prefix_codes(&self, frames: usize) -> &[i16] {
        &self.codes[..frames * self.codebooks]
    }

    /// Prefix lengths, one for each tail that steps of `chunk_frames` can leave (0 to
    /// `chunk_frames - 1` frames), the shortest `start` frames long where the fixture is long
    /// enough, else the fixture's last `chunk_frames` lengths.
    pub fn tail_lengths(&self, chunk_frames: usize, start: usize) -> std::ops::Range<usize> {
        let start = start.min(self.frames + 1 - chunk_frames);
        start..start + chunk_frames
    }

    /// Asserts that `audio` is the decode of the first `frames` frames, at the fixture
    /// tolerance. The network is causal, so that decode is the first `frames` frames' samples
    /// of upstream's full decode.
    pub fn assert_prefix_matches(&self, audio: &[f32], frames: usize, what: &str) {
        let expected = &self.audio[..frames * self.samples_per_frame];
        assert_eq!(
            audio.len(),
            expected.len(),
            "{}: {what}: audio length of {frames} frames",
            self.name
        );
        let error = relative_l2(audio, expected);
        // What MEASURED records, collected from a run with --nocapture.
        println!(
            "measured {} f32 {:.4} ({what})",
            self.name,
            error / self.upstream_f32_error
        );
        assert!(
            error <= self.tolerance(),
            "{}: {what}: {frames} frames: relative L2 error {error:.3e} above {:.3e} (upstream float32's \
             {:.3e} times {})",
            self.name,
            self.tolerance(),
            self.upstream_f32_error,
            2.0 * self.measured().f32_ratio
        );
    }
}

/// What was measured of our decodes of a fixture on the CPU: the most over every test's paths
/// (the core and the element, batches, steps of 1 to 20 frames, tails, flushes) and every
/// instruction set `make test` runs (`QWENCODEC_CPU_KERNELS` unset, avx2, off). Each bound is
/// twice its fixture's own figure. `cargo test -- --nocapture` prints every figure as `measured
/// <fixture> <dtype> <figure>`; docs/testing.md has the runs. CUDA is held to the same figures.
pub struct Measured {
    /// float32: the relative L2 error against upstream's float64 decode as a multiple of
    /// upstream's own float32 error (the fixture's `upstream_f32_rel_l2`).
    pub f32_ratio: f64,
    /// dtype f16 on the CPU: the relative L2 error against the float64 decode.
    pub f16: f64,
    /// dtype bf16, the same (None: no test decodes the fixture in bf16).
    pub bf16: Option<f64>,
}

/// The most measured on the CPUs the bounds rest on: an AMD EPYC with AVX-512 (and held to AVX2,
/// the path of CPUs without it) and an Intel Xeon with AMX-BF16, each with the bfloat16 products
/// its kernels take in dtype bf16: the Winograd tiles' bfloat16 pairs (AVX512_BF16; at widths of
/// 96 channels and more, so only `full-release-80`), the 1x1 convolutions' at any width, and
/// AMX's tiles for the weights kept in bfloat16 from 2 columns a frame
/// (`skinny_gemm_bf16`; full-release-80 would be at 1.57e-1 if the transformer's took them too).
/// An AMD EPYC without AVX-512 stays below the float32 figures (at most 1.20, f16-weights).
/// In bf16 the other CPUs measure below these: the small fixtures within 3 % of them on an AMD
/// EPYC with AVX512_BF16 (kernels on, avx2 and off alike: their widths take no bfloat16
/// products), full-release-80 1.39e-1 with its bfloat16 pairs and 1.02-1.07e-1 without (avx2,
/// off). Its bound is upstream's own bfloat16 error (2.0e-1) on every CPU.
pub const MEASURED: [(&str, Measured); 5] = [
    (
        "release-tiny",
        Measured {
            f32_ratio: 0.961,
            f16: 3.84e-3,
            bf16: Some(3.67e-2),
        },
    ),
    (
        "gqa-bias",
        Measured {
            f32_ratio: 1.324,
            f16: 2.52e-3,
            bf16: Some(2.19e-2),
        },
    ),
    (
        "bf16-weights",
        Measured {
            f32_ratio: 0.918,
            f16: 1.60e-6,
            bf16: Some(1.52e-6),
        },
    ),
    (
        "f16-weights",
        Measured {
            f32_ratio: 1.338,
            f16: 9.30e-7,
            bf16: Some(1.24e-2),
        },
    ),
    (
        RELEASED_FIXTURE,
        Measured {
            f32_ratio: 1.174,
            f16: 1.75e-2,
            bf16: Some(1.48e-1),
        },
    ),
];

/// The released geometry at its full widths with random weights (tests/released_geometry.rs,
/// tests/memory.rs): the folder tools/released-fixture.sh makes under `$QWENCODEC_CACHE/fixtures`: 80 frames,
/// more than the attention window of 72, so that the KV window fills and then slides.
pub const RELEASED_FIXTURE: &str = "full-release-80";

/// tools/make_fixtures.py refuses to write expectations above this float32 error for the
/// full-release preset (about 3e-5 is measured); checked again here, as the parity bound
/// scales with it.
const RELEASED_F32_ERROR_CEILING: f64 = 1e-4;

pub fn released_fixture() -> Fixture {
    let cache = std::env::var_os("QWENCODEC_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/qwencodec"), PathBuf::from);
    let dir = cache.join("fixtures").join(RELEASED_FIXTURE);
    assert!(
        dir.join("expected.safetensors").is_file(),
        "no released-geometry checkpoint in {}: run `make released-fixture` to make it (`make test` does)",
        dir.display()
    );
    let fixture = load_fixture_in(RELEASED_FIXTURE, dir);
    assert!(
        fixture.upstream_f32_error > 0.0 && fixture.upstream_f32_error <= RELEASED_F32_ERROR_CEILING,
        "{RELEASED_FIXTURE}: upstream's float32 error {:.3e} is outside (0, {RELEASED_F32_ERROR_CEILING:.0e}]: \
         remake it with `make released-fixture`",
        fixture.upstream_f32_error
    );
    fixture
}

/// Runs one of the repository's shell scripts; it must succeed.
pub fn run_script(script: &str, args: &[&Path], env: &[(&str, &str)]) {
    let root = repo_root();
    let status = std::process::Command::new("bash")
        .arg(root.join(script))
        .args(args)
        .envs(env.iter().copied())
        .status()
        .unwrap();
    assert!(status.success(), "{script} failed");
}

/// target/<profile>, where the plugin (and the examples) are built beside the test binary's
/// deps/ folder: for child processes.
/// The built example `name`, refused when older than any of `sources` (files, or folders whose
/// files all count; relative to the repository): it would not be what is tested.
pub fn built_example(name: &str, sources: &[&str]) -> PathBuf {
    let binary = build_dir().join("examples").join(name);
    let built = std::fs::metadata(&binary)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: a plain cargo test builds it, or cargo build --release --examples",
                binary.display()
            )
        });
    let root = repo_root();
    for source in sources.iter().map(|source| root.join(source)) {
        let files: Vec<PathBuf> = if source.is_dir() {
            std::fs::read_dir(&source)
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .filter(|path| path.is_file())
                .collect()
        } else {
            vec![source]
        };
        for file in files {
            let changed = std::fs::metadata(&file).unwrap().modified().unwrap();
            assert!(
                changed <= built,
                "{} is older than {}: rebuild the examples (cargo build --release --examples)",
                binary.display(),
                file.display()
            );
        }
    }
    binary
}

pub fn build_dir() -> PathBuf {
    let dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    assert!(
        dir.join("libgstqwencodec.so").exists(),
        "no plugin in {}",
        dir.display()
    );
    dir
}

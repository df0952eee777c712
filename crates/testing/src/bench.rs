//! What the benchmarks share: options, the machine they ran on, statistics.

use std::path::Path;
use std::time::Instant;

use gstqwencodec::model::StreamDecoder;

use serde_json::{Value, json};

/// The examples' parser, the one for every program here that takes options.
pub use qwencodec_common::Options;

/// The benchmark's options, all read by `read` before it does any work: an unknown or misspelled
/// option, a missing one or one that cannot be read ends the run here, with the error and exit
/// status 2, before anything is measured or a result written.
pub fn read_options<T>(read: impl FnOnce(&mut Options) -> Result<T, String>) -> T {
    let mut options = Options::from_env();
    let args = read(&mut options);
    // First: with --help it lists the options and exits, whatever `read` made of them.
    match options.finish().and(args) {
        Ok(args) => args,
        Err(err) => {
            eprintln!("{}: {err}", program());
            std::process::exit(2);
        }
    }
}

/// The benchmark's name: its binary's, less the hash cargo adds (`decode-0123456789abcdef`).
fn program() -> String {
    program_of(&std::env::args().next().unwrap_or_default())
}

fn program_of(binary: &str) -> String {
    let stem = Path::new(binary)
        .file_stem()
        .map_or_else(String::new, |stem| stem.to_string_lossy().into_owned());
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_owned()
        }
        _ => stem,
    }
}

/// Codes as int16 from a raw file.
pub fn read_codes(path: &Path) -> Vec<i16> {
    std::fs::read(path)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect()
}

/// `steps` steps of the decoder's `chunk_frames` frames of the checkpoint's codes (repeated as needed),
/// each step's wall time in ms.
pub fn run_steps(decoder: &mut StreamDecoder, codes: &[i16], codebooks: usize, steps: usize) -> Vec<f64> {
    let step_codes = codebooks * decoder.chunk_frames();
    let mut frames = codes
        .chunks(step_codes)
        .filter(|step| step.len() == step_codes)
        .cycle();
    (0..steps)
        .map(|_| {
            let started = Instant::now();
            let audio = decoder.push(frames.next().unwrap()).unwrap();
            assert!(!audio.is_empty(), "a step gives audio");
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

/// ||actual - expected|| / ||expected||, in float64, of audio of the same length.
pub fn relative_l2(actual: &[f32], expected: &[f32]) -> f64 {
    assert_eq!(actual.len(), expected.len());
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&a, &e) in actual.iter().zip(expected) {
        diff += (a as f64 - e as f64).powi(2);
        norm += (e as f64).powi(2);
    }
    (diff / norm).sqrt()
}

pub fn sorted(values: &[f64]) -> Vec<f64> {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    values
}

pub fn percentile(values: &[f64], p: f64) -> f64 {
    let sorted = sorted(values);
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// The CPU flags that decide which kernels libtorch and ours run.
const TELLING_FLAGS: [&str; 8] = [
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_bf16",
    "amx_tile",
];

/// The environment variables that keep libtorch's kernels (ATen, MKL, oneDNN) or ours from the
/// CPU's widest instructions: set, they make an AVX-512 CPU stand in for one without it, and
/// a result must say so.
const LIMITING_ENV: [&str; 4] = [
    gstqwencodec::model::KERNELS_ENV,
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
];

/// `NAME=value` of each of [`LIMITING_ENV`] that is set.
fn limits() -> Vec<String> {
    LIMITING_ENV
        .into_iter()
        .filter_map(|name| Some(format!("{name}={}", std::env::var(name).ok()?)))
        .collect()
}

/// The CPU's model name and which of [`TELLING_FLAGS`] it has.
fn cpu() -> (String, Vec<&'static str>) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_owned())
        })
    };
    let model = field("model name").unwrap_or_else(|| "unknown CPU".into());
    let flags = field("flags").unwrap_or_default();
    let has = |flag: &&str| flags.split_whitespace().any(|f| f == *flag);
    (model, TELLING_FLAGS.into_iter().filter(has).collect())
}

/// The commit the benchmark runs, and whether the code (not results or docs) had uncommitted
/// changes: a result names the code it measured.
fn code_version() -> String {
    let git = |args: &[&str]| {
        let output = std::process::Command::new("git")
            .args(args)
            .current_dir(crate::repo_root())
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let Some(commit) = git(&["rev-parse", "--short=7", "HEAD"]) else {
        return "unknown (not a git checkout)".into();
    };
    let code = ["src", "benches", "build.rs", "Cargo.toml", "Cargo.lock"];
    match git(&[&["status", "--porcelain", "--"][..], &code].concat()) {
        Some(changes) if !changes.is_empty() => format!("{commit} with uncommitted changes"),
        _ => commit,
    }
}

/// The machine a benchmark ran on: CPU model, AVX-512 and the flags that matter, what limited
/// their use, cores, torch's threads, CUDA; and the code it ran.
pub fn machine() -> Value {
    let (cpu, flags) = cpu();
    json!({
        "code": code_version(),
        "cpu": cpu,
        "avx512": flags.contains(&"avx512f"),
        "cpu_flags": flags,
        "limits": limits(),
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "torch_threads": tch::get_num_threads(),
        "cuda": tch::Cuda::is_available(),
    })
}

/// The code [`machine`] recorded, for a report.
pub fn code(machine: &Value) -> &str {
    machine["code"].as_str().unwrap_or("unknown")
}

/// [`machine`]'s list of strings under `key` (`cpu_flags`, `limits`).
fn strings<'a>(machine: &'a Value, key: &str) -> Vec<&'a str> {
    machine[key]
        .as_array()
        .map(|values| values.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The flags of [`machine`]'s CPU for a report, and what limited their use: `avx2, fma,
/// avx512f` or `avx2, fma, avx512f; limited by ATEN_CPU_CAPABILITY=avx2`.
pub fn flags(machine: &Value) -> String {
    let flags = strings(machine, "cpu_flags");
    let mut text = if flags.is_empty() {
        "none of avx2, fma, avx512".into()
    } else {
        flags.join(", ")
    };
    let limits = strings(machine, "limits");
    if !limits.is_empty() {
        text += &format!("; limited by {}", limits.join(", "));
    }
    text
}

/// The machine's CPU as its results' folder names it: `Intel(R) Xeon(R) Platinum 8480+` with
/// AVX-512 becomes `intel-xeon-platinum-8480-avx512`; limited to AVX2 (`ATEN_CPU_CAPABILITY=avx2`)
/// with our kernels off, `intel-xeon-platinum-8480-as-avx2-no-kernels` (held to AVX2:
/// `-avx2-kernels`). benches/tools/results.py's `cpu_slug` is the same for the Python tools.
pub fn slug(machine: &Value) -> String {
    let model = machine["cpu"].as_str().unwrap_or("unknown");
    let model = model.split(" @ ").next().unwrap().to_lowercase();
    let mut words: Vec<String> = model
        .replace("(r)", " ")
        .replace("(tm)", " ")
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|word| !word.is_empty() && *word != "cpu" && *word != "processor")
        .map(str::to_owned)
        .collect();
    let limited = |name: &str| {
        strings(machine, "limits")
            .into_iter()
            .find_map(|limit| limit.strip_prefix(name)?.strip_prefix('='))
    };
    match limited("ATEN_CPU_CAPABILITY") {
        Some(capability) => words.push(format!("as-{}", capability.to_lowercase())),
        None if machine["avx512"].as_bool() == Some(true) => words.push("avx512".into()),
        None => {}
    }
    match limited(gstqwencodec::model::KERNELS_ENV) {
        Some("off") => words.push("no-kernels".into()),
        Some("avx2") => words.push("avx2-kernels".into()),
        _ => {}
    }
    words.join("-")
}

/// A result's name under `measurements/results/`: `<cpu>/<benchmark>`, `<cpu>` the machine's
/// [`slug`], `<benchmark>` one of the kinds benches/tools/results.py lists (`decode-cpu-f32`; a
/// device's `:` dropped, `cuda:0` as `cuda0`). No date: a re-run replaces the result, git keeps
/// the one before.
pub fn result_name(machine: &Value, benchmark: &str) -> String {
    format!("{}/{}", slug(machine), benchmark.replace(':', ""))
}

/// Writes `report` (with its `machine`) and its markdown to `<results>/<cpu>/<benchmark>.json`
/// and `.md` ([`result_name`]), the folder made.
pub fn write_result(results: &Path, benchmark: &str, report: &Value, markdown: &str) {
    let stem = results.join(result_name(&report["machine"], benchmark));
    std::fs::create_dir_all(stem.parent().unwrap()).unwrap();
    let json = stem.with_extension("json");
    std::fs::write(&json, serde_json::to_string_pretty(report).unwrap())
        .unwrap_or_else(|err| panic!("{}: {err}", json.display()));
    std::fs::write(stem.with_extension("md"), markdown).unwrap();
    eprintln!("written: {}.{{md,json}}", stem.display());
}

/// The date a result records, YYYY-MM-DD, as `date` gives it.
pub fn date() -> String {
    let output = std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .expect("date");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_benchmark_is_named_by_its_binary_less_cargos_hash() {
        assert_eq!(
            super::program_of("target/release/deps/decode-0123456789abcdef"),
            "decode"
        );
        assert_eq!(
            super::program_of("target/release/deps/kernels_ab-fedcba9876543210"),
            "kernels_ab"
        );
        assert_eq!(super::program_of("/usr/bin/rtp-codes"), "rtp-codes");
        assert_eq!(super::program_of(""), "");
    }
}

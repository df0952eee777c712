//! Every error of the decoder core, with its message.

use qwencodec_testing as common;

use std::path::Path;
use std::sync::Arc;

use common::{fixture_dir, load_fixture};
use gstqwencodec::model::{
    DecodeError, Dtype, GraphReport, Model, ModelError, StreamDecoder, TailStrategy, parse_device,
};
use safetensors::tensor::TensorView;
use safetensors::{Dtype as StoredDtype, SafeTensors};
use tch::Device;

/// A copy of a fixture checkpoint whose files a test may spoil.
fn checkpoint_copy(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_dir(name).join(file), dir.path().join(file)).unwrap();
    }
    dir
}

fn load(path: &Path) -> Result<Model, ModelError> {
    Model::load(path, Device::Cpu, Dtype::F32)
}

fn load_error(path: &Path) -> String {
    match load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(err) => err.to_string(),
    }
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(path, config.to_string()).unwrap();
}

fn assert_contains(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{message:?} does not mention {part:?}");
    }
}

#[test]
fn missing_folder_and_files_are_named() {
    let message = load_error(Path::new("/nonexistent/checkpoint"));
    assert_contains(&message, &["/nonexistent/checkpoint", "not a directory"]);

    let dir = checkpoint_copy("gqa-bias");
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    assert_contains(&load_error(dir.path()), &["model.safetensors", "is missing"]);

    let dir = checkpoint_copy("gqa-bias");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    assert_contains(&load_error(dir.path()), &["config.json", "is missing"]);
}

#[test]
fn full_qwen3_tts_checkpoint_root_uses_its_speech_tokenizer() {
    let root = tempfile::tempdir().unwrap();
    // The talker's own files at the root must not be taken for the tokenizer's.
    std::fs::write(root.path().join("config.json"), r#"{"model_type": "qwen3_tts"}"#).unwrap();
    let tokenizer = root.path().join("speech_tokenizer");
    std::fs::create_dir(&tokenizer).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_dir("gqa-bias").join(file), tokenizer.join(file)).unwrap();
    }
    let model = load(root.path()).unwrap();
    assert_eq!(model.config().num_quantizers, load_fixture("gqa-bias").codebooks);
}

#[test]
fn bad_json_and_inconsistent_configs_are_explained() {
    let dir = checkpoint_copy("gqa-bias");
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert_contains(
        &load_error(dir.path()),
        &["config.json", "not a Qwen3-TTS tokenizer config"],
    );

    let dir = checkpoint_copy("gqa-bias");
    edit_config(dir.path(), |c| c["decode_upsample_rate"] = 1000.into());
    assert_contains(
        &load_error(dir.path()),
        &["decode_upsample_rate 1000", "upsample_rates [5, 4]", "(40)"],
    );

    let dir = checkpoint_copy("gqa-bias");
    edit_config(dir.path(), |c| {
        c["decoder_config"]["num_key_value_heads"] = 3.into()
    });
    assert_contains(
        &load_error(dir.path()),
        &["num_attention_heads 4", "num_key_value_heads 3"],
    );

    let dir = checkpoint_copy("gqa-bias");
    edit_config(dir.path(), |c| c["decoder_config"]["hidden_act"] = "relu".into());
    assert_contains(&load_error(dir.path()), &["hidden_act", "relu"]);

    let dir = checkpoint_copy("gqa-bias");
    edit_config(dir.path(), |c| {
        c["decoder_config"]
            .as_object_mut()
            .unwrap()
            .remove("codebook_dim");
    });
    assert_contains(&load_error(dir.path()), &["codebook_dim"]);
}

#[test]
fn missing_tensor_and_wrong_shape_name_the_tensor() {
    let dir = checkpoint_copy("gqa-bias");
    edit_config(dir.path(), |c| {
        c["decoder_config"]["num_hidden_layers"] = 4.into()
    });
    assert_contains(
        &load_error(dir.path()),
        &[
            "decoder.pre_transformer.layers.3.",
            "is missing",
            "model.safetensors",
        ],
    );

    let dir = checkpoint_copy("gqa-bias");
    edit_config(dir.path(), |c| c["decoder_config"]["latent_dim"] = 20.into());
    assert_contains(
        &load_error(dir.path()),
        &["decoder.pre_conv.conv.weight", "[24, 12, 3]", "[20, 12, 3]"],
    );
}

#[test]
fn truncated_and_foreign_weight_files_are_refused() {
    let dir = checkpoint_copy("gqa-bias");
    let weights = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() - 100]).unwrap();
    assert_contains(
        &load_error(dir.path()),
        &["model.safetensors", "not a valid safetensors file"],
    );

    std::fs::write(&weights, b"hello").unwrap();
    assert_contains(&load_error(dir.path()), &["not a valid safetensors file"]);

    // The same bytes relabelled as int32: a dtype the decoder does not take.
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let views: Vec<(String, TensorView)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let dtype = if name == "decoder.pre_conv.conv.weight" {
                StoredDtype::I32
            } else {
                view.dtype()
            };
            let view = TensorView::new(dtype, view.shape().to_vec(), view.data()).unwrap();
            (name, view)
        })
        .collect();
    std::fs::write(&weights, safetensors::serialize(views, None).unwrap()).unwrap();
    assert_contains(&load_error(dir.path()), &["decoder.pre_conv.conv.weight", "I32"]);
}

#[test]
fn bad_devices_are_refused() {
    let message = parse_device("tpu").unwrap_err().to_string();
    assert_contains(&message, &["\"tpu\"", "cpu, cuda, cuda:N or auto"]);
    assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
    if tch::Cuda::is_available() {
        let message = parse_device("cuda:99").unwrap_err().to_string();
        assert_contains(&message, &["cuda:99", "CUDA device"]);
    } else {
        assert_eq!(parse_device("auto").unwrap(), Device::Cpu);
        let message = parse_device("cuda").unwrap_err().to_string();
        assert_contains(&message, &["cuda", "no CUDA device"]);
    }
}

#[test]
fn off_cuda_graphs_are_not_recorded_and_steps_run_eagerly() {
    let fixture = load_fixture("gqa-bias");
    let model = Arc::new(load(&fixture.dir).unwrap());
    let mut decoder = StreamDecoder::new(model.clone(), 2, TailStrategy::Eager).unwrap();
    assert!(decoder.limits().cuda_graphs, "graphs allowed by default");
    let audio = decoder.push(&fixture.codes[..2 * fixture.codebooks]).unwrap();
    assert_eq!(audio.len(), 2 * fixture.samples_per_frame);
    assert_eq!(decoder.graph_steps(), 0);
    assert_eq!(model.cuda_graphs(), GraphReport::default());
}

#[test]
fn bad_codes_are_refused_and_the_stream_goes_on() {
    let fixture = load_fixture("gqa-bias");
    let model = Arc::new(load(&fixture.dir).unwrap());
    let q = fixture.codebooks;
    let mut decoder = StreamDecoder::new(model, 2, TailStrategy::Eager).unwrap();
    let mut audio = decoder.push(&fixture.codes[..3 * q]).unwrap();

    let err = decoder.push(&fixture.codes[..q + 1]).unwrap_err();
    assert!(matches!(err, DecodeError::PartialFrame { .. }));
    assert_contains(
        &err.to_string(),
        &[&format!("{} codes", q + 1), &format!("{q} codes")],
    );

    for (bad, value) in [(2, 64), (5, -1)] {
        let mut codes = fixture.codes[3 * q..6 * q].to_vec();
        codes[q + bad] = value;
        let err = decoder.push(&codes).unwrap_err();
        assert_contains(
            &err.to_string(),
            &[
                "frame 4",
                &format!("codebook {bad}"),
                &format!("code {value}"),
                "0..64",
            ],
        );
    }

    audio.extend(decoder.push(&fixture.codes[3 * q..]).unwrap());
    audio.extend(decoder.finish().unwrap());
    fixture.assert_matches(&audio, "after refused pushes");

    let err = decoder.push(&fixture.codes[..q]).unwrap_err();
    assert!(matches!(err, DecodeError::Finished), "{err}");
    assert!(decoder.finish().unwrap().is_empty());
}

//! The decoder geometry, read from the checkpoint's published `config.json`.

use std::path::Path;

use serde::Deserialize;

use super::error::ModelError;

/// Top level of the tokenizer's `config.json`; only what the decoder needs.
#[derive(Debug, Deserialize)]
struct TokenizerConfig {
    output_sample_rate: u32,
    decode_upsample_rate: usize,
    decoder_config: RawDecoderConfig,
}

/// `decoder_config` as published. Missing keys take upstream's defaults
/// (`Qwen3TTSTokenizerV2DecoderConfig`), except `codebook_dim`, which has none.
#[derive(Debug, Deserialize)]
struct RawDecoderConfig {
    #[serde(default = "default_codebook_size")]
    codebook_size: usize,
    codebook_dim: usize,
    #[serde(default = "default_hidden_size")]
    hidden_size: usize,
    #[serde(default = "default_hidden_size")]
    latent_dim: usize,
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    #[serde(default = "default_heads")]
    num_attention_heads: usize,
    #[serde(default = "default_heads")]
    num_key_value_heads: usize,
    head_dim: Option<usize>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default = "default_sliding_window")]
    sliding_window: usize,
    #[serde(default = "default_intermediate_size")]
    intermediate_size: usize,
    #[serde(default = "default_hidden_act")]
    hidden_act: String,
    #[serde(default = "default_rms_norm_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_layers")]
    num_hidden_layers: usize,
    #[serde(default = "default_heads")]
    num_quantizers: usize,
    #[serde(default = "default_upsample_rates")]
    upsample_rates: Vec<usize>,
    #[serde(default = "default_upsampling_ratios")]
    upsampling_ratios: Vec<usize>,
    #[serde(default = "default_decoder_dim")]
    decoder_dim: usize,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    partial_rotary_factor: Option<f64>,
}

fn default_codebook_size() -> usize {
    2048
}
fn default_hidden_size() -> usize {
    1024
}
fn default_rope_theta() -> f64 {
    10000.0
}
fn default_heads() -> usize {
    16
}
fn default_sliding_window() -> usize {
    72
}
fn default_intermediate_size() -> usize {
    3072
}
fn default_hidden_act() -> String {
    "silu".to_owned()
}
fn default_rms_norm_eps() -> f64 {
    1e-5
}
fn default_layers() -> usize {
    8
}
fn default_upsample_rates() -> Vec<usize> {
    vec![8, 5, 4, 3]
}
fn default_upsampling_ratios() -> Vec<usize> {
    vec![2, 2]
}
fn default_decoder_dim() -> usize {
    1536
}

/// Validated decoder geometry. Every size of the network comes from here.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub sample_rate: u32,
    pub codebook_size: usize,
    /// Number of codebooks (codes per frame).
    pub num_quantizers: usize,
    /// Width of the RVQ output (the quantizer works at half of it).
    pub codebook_dim: usize,
    pub latent_dim: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    pub sliding_window: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub num_hidden_layers: usize,
    pub upsampling_ratios: Vec<usize>,
    pub upsample_rates: Vec<usize>,
    pub decoder_dim: usize,
}

impl DecoderConfig {
    /// Reads and checks a tokenizer `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json(&text).map_err(|err| match err {
            ModelError::Config(message) => ModelError::Config(format!("{}: {message}", path.display())),
            other => other,
        })
    }

    /// Parses and checks the text of a tokenizer `config.json`.
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let raw: TokenizerConfig = serde_json::from_str(text)
            .map_err(|err| ModelError::Config(format!("not a Qwen3-TTS tokenizer config: {err}")))?;
        let d = raw.decoder_config;
        let config_error = |message: String| Err(ModelError::Config(message));

        if d.hidden_act != "silu" {
            return config_error(format!(
                "decoder_config.hidden_act {:?} is not supported (only \"silu\")",
                d.hidden_act
            ));
        }
        if let Some(scaling) = &d.rope_scaling {
            let kind = scaling
                .get("rope_type")
                .or_else(|| scaling.get("type"))
                .and_then(|v| v.as_str());
            if !scaling.is_null() && kind != Some("default") {
                return config_error(format!(
                    "decoder_config.rope_scaling {scaling} is not supported (only default RoPE)"
                ));
            }
        }
        if d.partial_rotary_factor.is_some_and(|f| f != 1.0) {
            return config_error(
                "decoder_config.partial_rotary_factor other than 1.0 is not supported".into(),
            );
        }
        for (name, value) in [
            ("codebook_size", d.codebook_size),
            ("codebook_dim", d.codebook_dim),
            ("hidden_size", d.hidden_size),
            ("latent_dim", d.latent_dim),
            ("num_attention_heads", d.num_attention_heads),
            ("num_key_value_heads", d.num_key_value_heads),
            ("sliding_window", d.sliding_window),
            ("intermediate_size", d.intermediate_size),
            ("num_hidden_layers", d.num_hidden_layers),
            ("decoder_dim", d.decoder_dim),
        ] {
            if value == 0 {
                return config_error(format!("decoder_config.{name} must be positive"));
            }
        }
        if raw.output_sample_rate == 0 {
            return config_error("output_sample_rate must be positive".into());
        }
        if d.codebook_size > 1 << 15 {
            return config_error(format!(
                "decoder_config.codebook_size {} does not fit the 16-bit codes of a frame",
                d.codebook_size
            ));
        }
        // Codebook 0 has its own quantizer group; the rest share the second one.
        if d.num_quantizers < 2 {
            return config_error(format!(
                "decoder_config.num_quantizers is {}, it must be at least 2",
                d.num_quantizers
            ));
        }
        if !d.codebook_dim.is_multiple_of(2) {
            return config_error(format!(
                "decoder_config.codebook_dim {} must be even (the quantizer works at half of it)",
                d.codebook_dim
            ));
        }
        if !d.num_attention_heads.is_multiple_of(d.num_key_value_heads) {
            return config_error(format!(
                "decoder_config.num_attention_heads {} is not a multiple of num_key_value_heads {}",
                d.num_attention_heads, d.num_key_value_heads
            ));
        }
        let head_dim = match d.head_dim {
            Some(0) => return config_error("decoder_config.head_dim must be positive".into()),
            Some(head_dim) => head_dim,
            None if d.hidden_size.is_multiple_of(d.num_attention_heads) => {
                d.hidden_size / d.num_attention_heads
            }
            None => {
                return config_error(format!(
                    "decoder_config has no head_dim and hidden_size {} is not a multiple of num_attention_heads {}",
                    d.hidden_size, d.num_attention_heads
                ));
            }
        };
        if head_dim % 2 != 0 {
            return config_error(format!(
                "decoder_config.head_dim {head_dim} must be even for RoPE"
            ));
        }
        if d.upsample_rates.is_empty() || d.upsample_rates.contains(&0) || d.upsampling_ratios.contains(&0) {
            return config_error(format!(
                "decoder_config.upsample_rates {:?} and upsampling_ratios {:?} must be positive (and rates non-empty)",
                d.upsample_rates, d.upsampling_ratios
            ));
        }
        let halvings = d.upsample_rates.len() as u32;
        if halvings >= usize::BITS || !d.decoder_dim.is_multiple_of(1 << halvings) {
            return config_error(format!(
                "decoder_config.decoder_dim {} cannot be halved once per upsample rate ({} times)",
                d.decoder_dim, halvings
            ));
        }
        let samples_per_frame: usize = d.upsample_rates.iter().chain(&d.upsampling_ratios).product();
        if raw.decode_upsample_rate != samples_per_frame {
            return config_error(format!(
                "decode_upsample_rate {} differs from the product of upsampling_ratios {:?} and upsample_rates {:?} ({})",
                raw.decode_upsample_rate, d.upsampling_ratios, d.upsample_rates, samples_per_frame
            ));
        }

        Ok(Self {
            sample_rate: raw.output_sample_rate,
            codebook_size: d.codebook_size,
            num_quantizers: d.num_quantizers,
            codebook_dim: d.codebook_dim,
            latent_dim: d.latent_dim,
            hidden_size: d.hidden_size,
            num_attention_heads: d.num_attention_heads,
            num_key_value_heads: d.num_key_value_heads,
            head_dim,
            attention_bias: d.attention_bias,
            sliding_window: d.sliding_window,
            intermediate_size: d.intermediate_size,
            rms_norm_eps: d.rms_norm_eps,
            rope_theta: d.rope_theta,
            num_hidden_layers: d.num_hidden_layers,
            upsampling_ratios: d.upsampling_ratios,
            upsample_rates: d.upsample_rates,
            decoder_dim: d.decoder_dim,
        })
    }

    /// Audio samples produced per codec frame.
    pub fn samples_per_frame(&self) -> usize {
        self.upsampling_ratios
            .iter()
            .chain(&self.upsample_rates)
            .product()
    }

    /// Frames per second as a reduced fraction (numerator, denominator): 25/2 for the release.
    pub fn frame_rate(&self) -> (u32, u32) {
        let (num, den) = (self.sample_rate as u64, self.samples_per_frame() as u64);
        let divisor = gcd(num, den);
        ((num / divisor) as u32, (den / divisor) as u32)
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

//! `squeeze eval` end to end on synthetic models: FP8 vs INT4 perplexity, --tokens/--data inputs, --json,
//! --save-logits, and bad inputs.

use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::common::{path_str, squeeze, synth};

/// INT4 group-32 routed experts on a random tiny model move perplexity by a few percent; a factor of 1.5 either way
/// means the INT4 weights are wrong (bad unpacking, scales, or experts left out), not merely quantized.
const MAX_PPL_RATIO: f64 = 1.5;

/// Writes a safetensors file holding one I64 tensor `input_ids` `[rows, ctx]`.
fn write_tokens(path: &Path, name: &str, rows: usize, ctx: usize, vocab: u64) {
    let ids: Vec<i64> = (0..rows * ctx).map(|i| ((i as u64 * 2654435761 + 17) % vocab) as i64).collect();
    let bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut header =
        serde_json::json!({ name: { "dtype": "I64", "shape": [rows, ctx], "data_offsets": [0, bytes.len()] } })
            .to_string()
            .into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(&bytes);
    fs::write(path, file).unwrap();
}

fn eval_json(model: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["eval", path_str(model), "--json"];
    args.extend_from_slice(extra);
    squeeze(&args).ok().json()
}

#[test]
fn int4_perplexity_is_finite_and_close_to_its_fp8_source() {
    let dir = tempfile::tempdir().unwrap();
    let fp8 = synth(dir.path(), "fp8", "glm5", &[]);
    let int4 = dir.path().join("int4");
    squeeze(&["quantize", path_str(&fp8), path_str(&int4)]).ok();
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, "input_ids", 3, 40, 384);
    let reference = eval_json(&fp8, &["--tokens", path_str(&tokens)]);
    let candidate = eval_json(&int4, &["--tokens", path_str(&tokens)]);
    for report in [&reference, &candidate] {
        for key in ["ppl", "mean_nll", "tokens", "seconds"] {
            assert!(report.get(key).is_some(), "--json lacks `{key}`: {report}");
        }
        assert_eq!(report["tokens"], 3 * 39);
        assert!(report["ppl"].as_f64().unwrap().is_finite());
    }
    let ratio = candidate["ppl"].as_f64().unwrap() / reference["ppl"].as_f64().unwrap();
    assert!(
        (1.0 / MAX_PPL_RATIO..=MAX_PPL_RATIO).contains(&ratio),
        "INT4/FP8 perplexity ratio {ratio}: {reference} vs {candidate}"
    );
}

#[test]
fn text_input_through_kimi_tiktoken_and_saved_logits() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "kimi", "kimi-k2", &[]);
    assert!(model.join("tiktoken.model").exists());
    let text = dir.path().join("text.txt");
    fs::write(&text, "The quick brown fox jumps over the lazy dog. 中文English混合 ".repeat(20)).unwrap();
    let logits = dir.path().join("logits.safetensors");
    let report = eval_json(
        &model,
        &["--data", path_str(&text), "--ctx", "48", "--chunks", "2", "--save-logits", path_str(&logits)],
    );
    assert_eq!(report["chunks"], 2);
    assert_eq!(report["tokens"], 2 * 47);
    let bytes = fs::read(&logits).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    assert_eq!(header["logits"]["dtype"], "F32");
    assert_eq!(header["logits"]["shape"], serde_json::json!([2, 48, 384]));
    assert_eq!(bytes.len(), 8 + header_len + 2 * 48 * 384 * 4);
}

#[test]
fn bad_token_files_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm45", "glm45", &[]);
    let outside = dir.path().join("outside.safetensors");
    write_tokens(&outside, "input_ids", 1, 8, 100_000);
    let run = squeeze(&["eval", path_str(&model), "--tokens", path_str(&outside)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("outside the model's vocabulary"), "{}", run.stderr);
    let unnamed = dir.path().join("unnamed.safetensors");
    write_tokens(&unnamed, "ids", 1, 8, 100);
    let run = squeeze(&["eval", path_str(&model), "--tokens", path_str(&unnamed)]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("input_ids"), "{}", run.stderr);
}

/// transformers' `Glm4MoeForCausalLM` (5.24.0, eager attention, f32, the checkpoint dequantized exactly) on the
/// committed GLM-4.5-shaped trained model over the held-out play, 256-byte chunks: mean NLL in nats/byte, from
/// `scripts/oracle/eval-ppl.py` (eval/TINY-SHAKESPEARE.md).
const GLM45_TRAINED_TRANSFORMERS_NLL: f64 = 2.408756431;

#[test]
fn the_trained_glm45_model_scores_the_held_out_play_as_transformers_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = root.join("eval/tiny-shakespeare-glm45-fp8");
    let data = root.join("eval/shakespeare-heldout.txt");
    let report = eval_json(&model, &["--data", path_str(&data), "--ctx", "256"]);
    let nll = report["mean_nll"].as_f64().unwrap();
    assert_eq!(report["tokens"].as_u64(), Some(97_920), "{report}");
    // Measured 5.2e-9 apart; 1e-6 leaves room for another summation order, not for a wrong layer.
    assert!((nll - GLM45_TRAINED_TRANSFORMERS_NLL).abs() <= 1e-6, "squeeze {nll} vs transformers");
}

/// transformers' `GlmMoeDsaForCausalLM` (5.19.0, eager attention, f32, the checkpoint dequantized exactly) on the
/// committed GLM-5-shaped trained model (DSA index_topk 64, so from position 64 on every layer attends to the keys
/// its indexer picks) over the held-out play, 256-byte chunks: mean NLL in nats/byte from `scripts/oracle/eval-ppl.py
/// --dsa-ties lower`, which breaks exact ties in the indexer's top-k toward the lower key as squeeze does (the ReLU
/// indexer scores many keys exactly 0; with torch.topk's own tie order transformers gives 2.390973766, 1.2e-5 apart).
const GLM5_TRAINED_TRANSFORMERS_NLL: f64 = 2.390985729;

#[test]
fn the_trained_glm5_model_scores_the_held_out_play_as_transformers_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = root.join("eval/tiny-shakespeare-glm5-fp8");
    let data = root.join("eval/shakespeare-heldout.txt");
    let report = eval_json(&model, &["--data", path_str(&data), "--ctx", "256"]);
    let nll = report["mean_nll"].as_f64().unwrap();
    assert_eq!(report["tokens"].as_u64(), Some(97_920), "{report}");
    // Measured 3.1e-8 apart; 1e-6 leaves room for another summation order, not for a wrong layer or selection.
    assert!((nll - GLM5_TRAINED_TRANSFORMERS_NLL).abs() <= 1e-6, "squeeze {nll} vs transformers");
}

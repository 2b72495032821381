//! `squeeze eval --reference REF --candidate CAND`: CAND = REF gives KLD 0 and same-top 100 % in the modes without
//! FP8 KV; a candidate with one expert zeroed per MoE layer fails the default gates with exit 1 naming the gate;
//! --json keys and --plot.

use std::fs;

use crate::calibrate::{edit_tensor, write_tokens};
use crate::common::{path_str, squeeze, synth};

#[test]
fn candidate_equal_to_reference_is_exact_without_fp8_kv() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "glm5", "glm5", &[]);
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 3, 32, 384);
    let plot = dir.path().join("parity.svg");
    let run = squeeze(&[
        "eval",
        "--reference",
        path_str(&model),
        "--candidate",
        path_str(&model),
        "--tokens",
        path_str(&tokens),
        "--json",
        "--plot",
        path_str(&plot),
        "--kv-scales",
        "calibrated",
        "--min-same-top",
        "0",
        "--max-mean-kld",
        "10",
        "--max-ppl-ratio",
        "10",
    ])
    .ok();
    assert!(run.stderr.contains("no FP8 KV-cache scales"), "the missing scales are reported: {}", run.stderr);
    let report = run.json();
    let modes = &report["modes"];
    for mode in ["reference", "kv", "weights", "split"] {
        for key in ["ppl", "mean_kld", "same_top", "ppl_ratio", "kld_percentiles", "layers"] {
            assert!(modes[mode].get(key).is_some(), "modes.{mode} lacks {key}: {}", modes[mode]);
        }
        assert_eq!(modes[mode]["tokens"], 3 * 15);
        assert_eq!(modes[mode]["layers"].as_array().unwrap().len(), 3);
    }
    for mode in ["reference", "weights"] {
        assert_eq!(modes[mode]["mean_kld"].as_f64().unwrap(), 0.0, "{mode}");
        assert_eq!(modes[mode]["same_top"].as_f64().unwrap(), 100.0, "{mode}");
        assert_eq!(modes[mode]["ppl_ratio"].as_f64().unwrap(), 1.0, "{mode}");
        for layer in modes[mode]["layers"].as_array().unwrap() {
            assert_eq!(layer["hidden_rel_l2"].as_f64().unwrap(), 0.0, "{mode}: {layer}");
            if let Some(agreement) = layer["expert_agreement"].as_f64() {
                assert_eq!(agreement, 1.0);
            }
        }
    }
    for mode in ["kv", "split"] {
        let kld = modes[mode]["mean_kld"].as_f64().unwrap();
        assert!(kld > 0.0 && kld.is_finite(), "FP8 KV moves {mode} a little: {kld}");
    }
    let svg = fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("split") && svg.contains("</svg>"), "{svg}");
}

/// A random synthetic model predicts an almost flat distribution (PPL ≈ vocabulary), so its top-1 flips under any
/// perturbation and same-top says nothing; and INT4 noise on random weights (hidden-state error 0.2–0.4 by the last
/// layer, KLD ≈ 0.012) is as large as one zeroed expert's effect. So the damaged candidate is the reference itself
/// with expert 0 of every MoE layer zeroed: the intact copy gives KLD exactly 0 and passes any KLD gate, the
/// damaged one must exceed this one.
const DAMAGE_KLD_GATE: &str = "1e-4";

#[test]
fn a_zeroed_expert_fails_the_gates_with_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let reference = synth(dir.path(), "ref", "glm45", &[]);
    let tokens = dir.path().join("tokens.safetensors");
    write_tokens(&tokens, 4, 40, 384);
    let run = |candidate: &std::path::Path| {
        squeeze(&[
            "eval",
            "--reference",
            path_str(&reference),
            "--candidate",
            path_str(candidate),
            "--tokens",
            path_str(&tokens),
            "--json",
            "--modes",
            "weights",
            "--max-mean-kld",
            DAMAGE_KLD_GATE,
        ])
    };
    let damaged = dir.path().join("damaged");
    fs::create_dir(&damaged).unwrap();
    for entry in fs::read_dir(&reference).unwrap() {
        let entry = entry.unwrap();
        fs::copy(entry.path(), damaged.join(entry.file_name())).unwrap();
    }
    let intact = run(&damaged).ok().json();
    assert_eq!(intact["modes"]["weights"]["mean_kld"].as_f64().unwrap(), 0.0);
    for layer in 1..3 {
        for projection in ["gate_proj", "up_proj", "down_proj"] {
            edit_tensor(
                &damaged,
                &format!("model.layers.{layer}.mlp.experts.0.{projection}.weight"),
                |bytes, dtype| {
                    assert_eq!(dtype, "F8_E4M3");
                    bytes.fill(0)
                },
            );
        }
    }
    let failed = run(&damaged);
    assert_eq!(failed.code, 1, "stdout:\n{}\nstderr:\n{}", failed.stdout, failed.stderr);
    assert!(failed.stderr.contains("gate max-mean-kld failed: mode weights"), "{}", failed.stderr);
    let report = failed.json();
    let weights = &report["modes"]["weights"];
    assert!(weights["mean_kld"].as_f64().unwrap() > 1e-4, "{weights}");
    assert_eq!(report["failures"][0]["gate"], "max-mean-kld");
    let layers = weights["layers"].as_array().unwrap();
    assert_eq!(layers[0]["hidden_rel_l2"].as_f64().unwrap(), 0.0, "layer 0 is dense and untouched");
    assert!(layers[2]["hidden_rel_l2"].as_f64().unwrap() > 0.0, "{layers:?}");
    eprintln!("damaged: {weights}");
}

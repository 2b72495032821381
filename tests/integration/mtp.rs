//! `eval --mtp`: the MTP layer's draft acceptance on a GLM model, the same in an INT4 output as the layer is kept,
//! and the bad input around it (a model without MTP, a missing MTP tensor, --mtp with --part).

use std::fs;

use crate::common::{expect_exit_2, path_str, squeeze, synth};

const SONNETS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/eval/sonnets.txt");

fn eval_mtp(model: &std::path::Path) -> serde_json::Value {
    let args = ["eval", path_str(model), "--data", SONNETS, "--ctx", "48", "--chunks", "2", "--mtp", "--json"];
    squeeze(&args).ok().json()
}

#[test]
fn eval_mtp_reports_draft_acceptance_for_fp8_and_int4() {
    let temp = tempfile::tempdir().unwrap();
    for arch in ["glm45", "glm5"] {
        let fp8 = synth(temp.path(), arch, arch, &[]);
        let report = eval_mtp(&fp8);
        let mtp = &report["mtp"];
        assert_eq!(mtp["layer"], 3, "{arch}: the MTP layer follows the 3 decoder layers: {mtp}");
        // 2 chunks × (48 − 2) positions with a token t + 2.
        assert_eq!(mtp["positions"], 2 * 46, "{arch}: {mtp}");
        let acceptance = mtp["acceptance"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&acceptance), "{arch}: {mtp}");
        assert_eq!(mtp["mean_accepted_length"].as_f64().unwrap(), 1.0 + acceptance / 100.0);
        assert!(mtp["mean_kld"].as_f64().unwrap() > 0.0, "{arch}: random MTP weights draft differently: {mtp}");
        // The main model's perplexity on tokens t + 2 is the eval's own perplexity over those positions: finite.
        assert!(mtp["main_ppl"].as_f64().unwrap().is_finite() && mtp["draft_ppl"].as_f64().unwrap().is_finite());

        let int4 = temp.path().join(format!("{arch}-int4"));
        squeeze(&["quantize", path_str(&fp8), path_str(&int4)]).ok();
        let quantized = eval_mtp(&int4);
        assert_eq!(quantized["mtp"]["positions"], mtp["positions"], "{arch}");
        assert_ne!(quantized["mtp"]["mean_kld"], mtp["mean_kld"], "{arch}: INT4 experts move the drafts");
    }
}

#[test]
fn eval_mtp_bad_input_exits_2_naming_the_flag_or_tensor() {
    let temp = tempfile::tempdir().unwrap();
    let kimi = synth(temp.path(), "kimi", "kimi-k2", &[]);
    let run = squeeze(&["eval", path_str(&kimi), "--data", SONNETS, "--ctx", "32", "--chunks", "1", "--mtp"]);
    expect_exit_2(&run, &["no MTP layer", "num_nextn_predict_layers"]);

    let glm = synth(temp.path(), "glm45", "glm45", &[]);
    let stats = temp.path().join("part.safetensors");
    let args = ["eval", path_str(&glm), "--data", SONNETS, "--ctx", "32", "--part", "1/2", "--save-stats"];
    let mut with_part = args.to_vec();
    with_part.extend([path_str(&stats), "--mtp"]);
    expect_exit_2(&squeeze(&with_part), &["--mtp", "--part"]);
    assert!(!stats.exists(), "nothing written");

    // An MTP layer without its eh_proj: the tensor is named.
    let index = glm.join("model.safetensors.index.json");
    let mut map: serde_json::Value = serde_json::from_str(&fs::read_to_string(&index).unwrap()).unwrap();
    map["weight_map"].as_object_mut().unwrap().remove("model.layers.3.eh_proj.weight");
    fs::write(&index, serde_json::to_string(&map).unwrap()).unwrap();
    let run = squeeze(&["eval", path_str(&glm), "--data", SONNETS, "--ctx", "32", "--chunks", "1", "--mtp"]);
    expect_exit_2(&run, &["model.layers.3.eh_proj.weight"]);
}

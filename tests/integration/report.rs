//! `squeeze report`: the numbers the issue asks to reproduce, sizes equal to what `quantize` writes, and bad input.

use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::common::{expect_exit_2, path_str, squeeze, synth, Run};

const GIB: f64 = (1u64 << 30) as f64;
/// How close the GLM-5 preset must land to the published 705 GiB / 421 GiB (the tolerance).
const PUBLISHED_SIZE_TOLERANCE: f64 = 0.015;

fn report(args: &[&str]) -> Run {
    let mut all = vec!["report"];
    all.extend_from_slice(args);
    squeeze(&all)
}

fn number(json: &Value, pointer: &str) -> u64 {
    json.pointer(pointer).and_then(Value::as_u64).unwrap_or_else(|| panic!("no number at {pointer} in {json}"))
}

fn shard_file_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "safetensors"))
        .map(|path| fs::metadata(path).unwrap().len())
        .sum()
}

#[test]
fn kimi_k2_fp8_kv_doubles_capacity_and_concurrency() {
    // A ≈ 48 GB pool per GPU and 21,400-token requests: 686 K → 1.37 M tokens, 32 → 64 requests.
    let json = report(&["kimi-k2", "--kv-pool", "48.2GB", "--context", "21400", "--json"]).ok().json();
    assert_eq!(number(&json, "/prefill/kv_bytes_per_token"), 61 * 576 * 2);
    assert_eq!(number(&json, "/prefill/kv_bytes_per_token"), 70_272);
    assert_eq!(number(&json, "/decode/kv_bytes_per_token"), 35_136);
    assert_eq!(number(&json, "/prefill/kv_bytes_per_token_per_layer"), 1152);
    assert_eq!(number(&json, "/prefill/kv_capacity_tokens"), 685_906);
    assert_eq!(number(&json, "/decode/kv_capacity_tokens"), 1_371_812);
    assert_eq!(number(&json, "/decode/kv_capacity_tokens"), 2 * number(&json, "/prefill/kv_capacity_tokens"));
    assert_eq!(number(&json, "/prefill/max_concurrency"), 32);
    assert_eq!(number(&json, "/decode/max_concurrency"), 64);
    assert_eq!(json["prefill"]["kv_dtype"], "bf16");
    assert_eq!(json["decode"]["kv_dtype"], "fp8");
}

#[test]
fn computed_pool_is_memory_share_less_weights_and_reserve() {
    let json = report(&["kimi-k2", "--gpu-memory", "h200-141g", "--json"]).ok().json();
    let usable = (143_771u64 << 20) as f64 * 0.9;
    let reserve = 4u64 << 30;
    for node in ["prefill", "decode"] {
        let weights = number(&json, &format!("/{node}/weight_bytes_per_gpu"));
        let pool = number(&json, &format!("/{node}/kv_pool_bytes_per_gpu"));
        assert_eq!(pool, usable.floor() as u64 - reserve - weights, "{node}");
        let per_token = number(&json, &format!("/{node}/kv_bytes_per_token"));
        assert_eq!(number(&json, &format!("/{node}/kv_capacity_tokens")), pool / per_token, "{node}");
        assert_eq!(number(&json, &format!("/{node}/max_concurrency")), pool / per_token / 8192, "{node}");
    }
    // Prefill holds the FP8 source, decode the INT4 output, each split over tp 8.
    assert_eq!(
        number(&json, "/prefill/weight_bytes_per_gpu"),
        number(&json, "/sizes/source_tensors/bytes").div_ceil(8)
    );
    assert_eq!(number(&json, "/decode/weight_bytes_per_gpu"), number(&json, "/sizes/output_tensors/bytes").div_ceil(8));
}

#[test]
fn dp_attention_multiplies_mla_capacity_by_the_ranks() {
    let plain = report(&["kimi-k2", "--kv-pool", "10GB", "--json"]).ok().json();
    let dp = report(&["kimi-k2", "--kv-pool", "10GB", "--dp-attention", "--json"]).ok().json();
    assert_eq!(
        number(&dp, "/decode/kv_bytes_per_token"),
        number(&plain, "/decode/kv_bytes_per_token"),
        "the latent row is whole on every rank"
    );
    assert_eq!(number(&dp, "/decode/kv_capacity_tokens"), 8 * number(&plain, "/decode/kv_capacity_tokens"));
}

#[test]
fn glm45_gqa_kv_is_sharded_by_tp() {
    let tp8 = report(&["glm-4.5", "--kv-pool", "10GB", "--json"]).ok().json();
    let tp4 = report(&["glm-4.5", "--kv-pool", "10GB", "--tp", "4", "--json"]).ok().json();
    assert_eq!(number(&tp8, "/prefill/kv_bytes_per_token"), 92 * 2 * 128 * 2, "8 KV heads over 8 ranks: one head each");
    assert_eq!(number(&tp4, "/prefill/kv_bytes_per_token"), 92 * 2 * 2 * 128 * 2);
    assert_eq!(tp8["kv"]["attention"], "gqa");
}

#[test]
fn glm5_preset_lands_on_the_published_sizes() {
    let json = report(&["glm-5", "--json"]).ok().json();
    assert_eq!(json["recipe"], "glm5-int4");
    assert_eq!(json["exact"], false);
    let source_gib = number(&json, "/source_bytes") as f64 / GIB;
    let output_gib = number(&json, "/output_bytes") as f64 / GIB;
    assert!(
        (source_gib / 705.0 - 1.0).abs() < PUBLISHED_SIZE_TOLERANCE,
        "FP8 source {source_gib:.2} GiB, published 705 GiB"
    );
    assert!(
        (output_gib / 421.0 - 1.0).abs() < PUBLISHED_SIZE_TOLERANCE,
        "glm5-int4 output {output_gib:.2} GiB, published 421 GiB"
    );
    // 744 B parameters without the MTP layer (zai-org/GLM-5 README).
    let parameters = number(&json, "/parameters") - number(&json, "/sizes/classes/mtp/parameters");
    assert!((parameters as f64 / 744e9 - 1.0).abs() < 0.005, "{parameters}");
    for class in
        ["routed_experts", "shared_experts", "attention", "indexer", "dense_mlp", "embeddings", "norms_router", "mtp"]
    {
        assert!(json["sizes"]["classes"].get(class).is_some(), "class {class} missing");
    }
}

#[test]
fn output_bytes_from_weights_equal_what_quantize_writes() {
    for (arch, shard_size) in [("kimi-k2", "5GB"), ("glm45", "1MB"), ("glm5", "700kB")] {
        let dir = tempfile::tempdir().unwrap();
        let source = synth(dir.path(), "fp8", arch, &["--shards", "2"]);
        let reported =
            report(&[path_str(&source), "--max-shard-size", shard_size, "--kv-pool", "1GB", "--json"]).ok().json();
        assert_eq!(reported["exact"], true, "{arch}");
        assert_eq!(reported["input"], "checkpoint", "{arch}");
        let out = dir.path().join("int4");
        let written =
            squeeze(&["quantize", path_str(&source), path_str(&out), "--max-shard-size", shard_size, "--json"])
                .ok()
                .json();
        assert_eq!(number(&reported, "/output_bytes"), number(&written, "/output_bytes"), "{arch}: report vs quantize");
        assert_eq!(number(&reported, "/output_bytes"), shard_file_bytes(&out), "{arch}: report vs files on disk");
        assert_eq!(number(&reported, "/source_bytes"), shard_file_bytes(&source), "{arch}: source files");
        assert_eq!(number(&reported, "/source_bytes"), number(&written, "/input_bytes"), "{arch}");
    }
}

#[test]
fn the_bf16_line_is_what_a_dequantizing_recipe_writes_and_bf16_folders_report() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "glm5", &[]);
    let all_bf16 = dir.path().join("bf16.toml");
    fs::write(&all_bf16, "name = \"all-bf16\"\nunselected = \"bf16\"\n").unwrap();
    let reported =
        report(&[path_str(&source), "--recipe", path_str(&all_bf16), "--kv-pool", "1GB", "--json"]).ok().json();
    assert_eq!(number(&reported, "/bf16_bytes"), number(&reported, "/sizes/output_tensors/bytes"));
    assert_eq!(reported["prefill"]["weights"], "fp8 source");
    let bf16 = dir.path().join("bf16");
    squeeze(&["quantize", path_str(&source), path_str(&bf16), "--recipe", path_str(&all_bf16)]).ok();
    assert_eq!(number(&reported, "/output_bytes"), shard_file_bytes(&bf16));
    // The BF16 folder as a source: no FP8 left, and the default recipe's output still matches quantize.
    let from_bf16 = report(&[path_str(&bf16), "--kv-pool", "1GB", "--json"]).ok().json();
    assert_eq!(from_bf16["prefill"]["weights"], "source");
    assert_eq!(number(&from_bf16, "/bf16_bytes"), number(&from_bf16, "/sizes/source_tensors/bytes"));
    let int4 = dir.path().join("int4");
    let written = squeeze(&["quantize", path_str(&bf16), path_str(&int4), "--json"]).ok().json();
    assert_eq!(number(&from_bf16, "/output_bytes"), number(&written, "/output_bytes"));
}

#[test]
fn a_config_alone_gives_the_same_tensor_bytes_as_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    let source = synth(dir.path(), "fp8", "kimi-k2", &[]);
    let config_only = dir.path().join("config-only");
    fs::create_dir(&config_only).unwrap();
    fs::copy(source.join("config.json"), config_only.join("config.json")).unwrap();
    let from_weights = report(&[path_str(&source), "--kv-pool", "1GB", "--json"]).ok().json();
    let from_folder = report(&[path_str(&config_only), "--kv-pool", "1GB", "--json"]).ok().json();
    let from_file = report(&[path_str(&config_only.join("config.json")), "--kv-pool", "1GB", "--json"]).ok().json();
    assert_eq!(from_folder["input"], "config");
    assert_eq!(from_folder["exact"], false);
    for pointer in ["/sizes/source_tensors/bytes", "/sizes/output_tensors/bytes", "/sizes/bf16/bytes", "/parameters"] {
        assert_eq!(number(&from_folder, pointer), number(&from_weights, pointer), "{pointer}");
        assert_eq!(number(&from_file, pointer), number(&from_weights, pointer), "{pointer}");
    }
}

#[test]
fn human_report_shows_sizes_and_both_nodes() {
    let run = report(&["glm-5"]).ok();
    for needle in [
        "prefill node",
        "decode node",
        "GiB",
        "GB",
        "routed_experts",
        "glm5-int4",
        "KV tokens per node",
        "requests of 8,192",
    ] {
        assert!(run.stdout.contains(needle), "stdout should contain `{needle}`:\n{}", run.stdout);
    }
}

#[test]
fn unknown_preset_lists_the_known_ones() {
    let run = report(&["glm-6"]);
    expect_exit_2(&run, &["glm-6", "kimi-k2", "glm-5", "glm-4.5"]);
}

#[test]
fn config_missing_a_key_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/model/presets/kimi-k2.json")).unwrap();
    let mut config: Value = serde_json::from_str(&text).unwrap();
    config.as_object_mut().unwrap().remove("kv_lora_rank");
    let path = dir.path().join("config.json");
    fs::write(&path, config.to_string()).unwrap();
    expect_exit_2(&report(&[path_str(&path)]), &["kv_lora_rank", "config.json"]);
    expect_exit_2(&report(&[path_str(dir.path())]), &["kv_lora_rank"]);
}

#[test]
fn weights_that_do_not_fit_say_by_how_much() {
    // Kimi K2's FP8 source (≈ 1.03 TB) over 8 × H100 80 GB.
    let sizes = report(&["kimi-k2", "--kv-pool", "1GB", "--json"]).ok().json();
    let per_gpu = number(&sizes, "/sizes/source_tensors/bytes").div_ceil(8);
    let available = ((81_559u64 << 20) as f64 * 0.9).floor() as u64 - (4u64 << 30);
    let short = per_gpu - available;
    let run = report(&["kimi-k2", "--gpu-memory", "h100-80g"]);
    let expected = format!("short by {:.2} GB ({:.2} GiB) per GPU", short as f64 / 1e9, short as f64 / GIB);
    expect_exit_2(&run, &["prefill node", "do not fit", &expected, "--gpus"]);
    assert!(run.stdout.is_empty(), "nothing on stdout on error: {}", run.stdout);
}

#[test]
fn bad_layouts_are_refused() {
    expect_exit_2(&report(&["kimi-k2", "--tp", "3"]), &["--tp 3", "--gpus 8"]);
    expect_exit_2(&report(&["kimi-k2", "--mem-fraction", "1.5"]), &["--mem-fraction"]);
    let run = report(&["kimi-k2", "--gpu-memory", "a100"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("h200-141g"), "{}", run.stderr);
}

#[test]
fn the_conversion_estimate_takes_the_slowest_of_disk_and_compute_and_caps_the_parts() {
    let base = ["glm-5", "--read-speed", "2GB", "--write-speed", "1GB", "--cores", "64", "--json"];
    let one = report(&base).ok().json();
    let conversion = &one["conversion"];
    let output = number(&one, "/output_bytes") as f64;
    // 64 cores of ct-minmax keep up with the disk: writing the output at 1 GB/s sets the time.
    assert_eq!(conversion["bound_by"], "write", "{conversion}");
    let seconds = conversion["seconds_per_part"].as_f64().unwrap();
    assert!((seconds - output / 1e9).abs() < 1e-6, "{seconds}");
    let shards = number(&one, "/sizes/shards");
    assert_eq!(number(&one, "/conversion/max_parts"), shards);
    // mse on 2 cores is compute-bound; eight parts take an eighth of the time or a little more (whole shards).
    let mse = report(&["glm-5", "--scale-rule", "mse", "--cores", "2", "--json"]).ok().json();
    assert_eq!(mse["conversion"]["bound_by"], "compute");
    let eight: Vec<&str> = base.iter().copied().chain(["--parts", "8"]).collect();
    let split = report(&eight).ok().json();
    let per_part = split["conversion"]["seconds_per_part"].as_f64().unwrap();
    assert!(per_part >= seconds / 8.0 && per_part < seconds / 8.0 * 1.1, "{per_part} vs {seconds}");
    // More parts than shards: capped at one shard each, and said so.
    let many = format!("{}", shards + 5);
    let capped = report(&["glm-5", "--parts", &many, "--json"]).ok().json();
    assert_eq!(number(&capped, "/conversion/machine/parts"), shards);
    assert_eq!(capped["conversion"]["capped"], true);
    let human = report(&["glm-5", "--parts", "4"]).ok();
    assert!(human.stdout.contains("conversion in 4 part(s)") && human.stdout.contains("bound by"), "{}", human.stdout);
}

/// `--formats`: one row per format recipe of the architecture, each equal to the report its `--recipe` gives; the
/// smaller formats hold more KV; a layout too small for the decode weights says so per row.
#[test]
fn formats_side_by_side_equal_one_report_per_recipe() {
    let comparison = report(&["glm-5.2", "--gpu-memory", "b200-180g", "--formats", "--json"]).ok().json();
    let rows = comparison["formats"].as_array().unwrap();
    let recipes: Vec<&str> = rows.iter().map(|row| row["recipe"].as_str().unwrap()).collect();
    assert_eq!(recipes, ["glm5-int4", "glm5-nvfp4", "glm5-nvfp4-w4a4", "glm5-mxfp4", "glm5-w4a8"]);
    for row in rows {
        let recipe = row["recipe"].as_str().unwrap();
        let one = report(&["glm-5.2", "--gpu-memory", "b200-180g", "--recipe", recipe, "--json"]).ok().json();
        assert_eq!(row["output_bytes"], one["output_bytes"], "{recipe}");
        assert_eq!(row["decode"], one["decode"], "{recipe}");
    }
    let output = |index: usize| number(&rows[index], "/output_bytes");
    // W4A8 g128 (4.125 bits) < MXFP4 (4.25) < INT4 g32 (4.5) ≤ NVFP4 (4.5, FP8 scales) < W4A4 (+ input scales).
    assert!(output(4) < output(3) && output(3) < output(0) && output(1) < output(2), "{comparison}");
    assert!(number(&rows[4], "/decode/kv_capacity_tokens") > number(&rows[0], "/decode/kv_capacity_tokens"));

    let small = report(&["kimi-k2", "--gpus", "4", "--gpu-memory", "h100-80g", "--formats"]).ok();
    assert_eq!(small.stdout.matches("does not fit").count(), 5, "{}", small.stdout);
    assert!(small.stdout.contains("kimi-k2-w4a8: decode node: weights do not fit"), "{}", small.stdout);
    expect_exit_2(&report(&["glm-5.2", "--formats", "--recipe", "glm5-int4"]), &["--formats", "--recipe"]);
}

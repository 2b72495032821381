//! The model card every output carries (issue 31, item 5): README.md with the Hugging Face front matter of a
//! quantized release after `quantize` (INT4, NVFP4, W4A8), the source's README kept as README.source.md, the same
//! card from a merge of parts, accuracy from `squeeze eval --json` reports through `squeeze card`, kept across
//! rewrites and `--resume`, and a README.md squeeze did not write never overwritten.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{expect_exit_2, path_str, read_json, squeeze, squeeze_in, synth, Run};

/// The source's own card: front matter with a license the card must carry over.
const SOURCE_README: &str = "---\nlicense: other\nlicense_name: modified-mit\nlicense_link: LICENSE\n\
                             library_name: transformers\n---\n# Tiny Kimi\n\nThe source's own card.\n";

/// The eval text (the tests run in the crate folder).
const TEXT: &str = "eval/sonnets.txt";

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary folder")
}

/// A synthetic Kimi K2 named `name` in `dir` with SOURCE_README as its README.md.
fn source(dir: &Path, name: &str) -> PathBuf {
    let source = synth(dir, name, "kimi-k2", &[]);
    fs::write(source.join("README.md"), SOURCE_README).unwrap();
    source
}

fn quantize(source: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["quantize", path_str(source), path_str(out)];
    args.extend_from_slice(extra);
    squeeze(&args)
}

/// The card's YAML front matter, parsed by hand: `key: value` lines (double-quoted values unquoted) and the
/// `- item` lists under a `key:` line; and the text after it.
struct Card {
    fields: BTreeMap<String, String>,
    lists: BTreeMap<String, Vec<String>>,
    body: String,
}

fn read_card(dir: &Path) -> Card {
    let text = fs::read_to_string(dir.join("README.md")).expect("the folder has a README.md");
    let rest = text.strip_prefix("---\n").unwrap_or_else(|| panic!("no front matter:\n{text}"));
    let (yaml, body) = rest.split_once("\n---\n").unwrap_or_else(|| panic!("front matter not closed:\n{text}"));
    let (mut fields, mut lists) = (BTreeMap::new(), BTreeMap::<String, Vec<String>>::new());
    let mut list_key: Option<String> = None;
    for line in yaml.lines() {
        if let Some(item) = line.strip_prefix("- ") {
            let key = list_key.clone().unwrap_or_else(|| panic!("list item outside a list: {line}"));
            lists.entry(key).or_default().push(item.to_string());
            continue;
        }
        let (key, value) = line.split_once(':').unwrap_or_else(|| panic!("not `key: value`: {line}"));
        let value = value.trim();
        if value.is_empty() {
            list_key = Some(key.to_string());
        } else {
            let value = if value.starts_with('"') { serde_json::from_str(value).unwrap() } else { value.to_string() };
            assert!(fields.insert(key.to_string(), value).is_none(), "{key} twice");
            list_key = None;
        }
    }
    Card { fields, lists, body: body.to_string() }
}

impl Card {
    fn field(&self, key: &str) -> &str {
        self.fields.get(key).unwrap_or_else(|| panic!("front matter lacks {key}: {:?}", self.fields))
    }

    fn tags(&self) -> Vec<&str> {
        self.lists.get("tags").map(|tags| tags.iter().map(String::as_str).collect()).unwrap_or_default()
    }

    fn assert_mentions(&self, needles: &[&str]) {
        for needle in needles {
            assert!(self.body.contains(needle), "the card lacks `{needle}`:\n{}", self.body);
        }
    }
}

#[test]
fn int4_nvfp4_and_w4a8_outputs_carry_a_card_with_the_hub_front_matter() {
    let dir = tmp();
    let source = source(dir.path(), "Kimi-K2-Tiny");

    let int4 = dir.path().join("int4");
    quantize(&source, &int4, &["--base-model", "moonshotai/Kimi-K2-Instruct"]).ok();
    let card = read_card(&int4);
    assert_eq!(card.field("base_model"), "moonshotai/Kimi-K2-Instruct");
    assert_eq!(card.field("base_model_relation"), "quantized");
    assert_eq!(card.field("library_name"), "transformers");
    assert_eq!(card.field("pipeline_tag"), "text-generation");
    assert_eq!(card.field("license"), "other", "the source card's license is carried");
    assert_eq!(card.field("license_name"), "modified-mit");
    assert_eq!(card.field("license_link"), "LICENSE");
    assert_eq!(card.tags(), ["compressed-tensors", "quantized", "int4", "w4a16", "squeeze"]);
    // The source's README is kept byte for byte; the card links it.
    assert_eq!(fs::read_to_string(int4.join("README.source.md")).unwrap(), SOURCE_README);
    let manifest = read_json(&int4.join("squeeze-manifest.json"));
    assert_eq!(manifest["card"]["base_model"], "moonshotai/Kimi-K2-Instruct");
    let text = |value: &Value| value.as_str().unwrap().to_string();
    let version = format!("squeeze {}", env!("CARGO_PKG_VERSION"));
    card.assert_mentions(&[
        "# Kimi-K2-Instruct — INT4 W4A16 (compressed-tensors)",
        "[moonshotai/Kimi-K2-Instruct](https://huggingface.co/moonshotai/Kimi-K2-Instruct)",
        "[README.source.md](README.source.md)",
        &version,
        "| recipe | `kimi-k2-int4` (SHA-256 `",
        &text(&manifest["recipe"]["sha256"]),
        &text(&manifest["plan_sha256"]),
        text(&manifest["recipe"]["text"]).trim_end(),
        "| group_0 | `pack-quantized` | 4-bit int, group 32, symmetric, observer `minmax` | 16-bit (not quantized) |",
        "| routed_experts | 48 | int4 × 48 |",
        "| method | `rtn`: round to nearest",
        "| calibration data | none",
        "vllm serve \"$MODEL\" --tensor-parallel-size 1\n",
        "python -m sglang.launch_server --model-path \"$MODEL\" --tp 1\n",
    ]);
    assert!(!card.body.contains("## Accuracy"), "no eval results yet");
    assert!(!card.body.contains(path_str(dir.path())), "the card holds no absolute path:\n{}", card.body);
    // The card breaks nothing verify checks.
    let verified = squeeze(&["verify", path_str(&int4), "--source", path_str(&source), "--json"]).ok().json();
    assert_eq!(verified["passed"], true);

    // NVFP4 without --base-model from a local folder: no `base_model` (the Hub would read the folder's name as a repo
    // id), the card says the weights came from that folder; the manifest is the one a plain run always wrote (no
    // `card` record).
    let nvfp4 = dir.path().join("nvfp4");
    // vLLM's rules: SGLang's NVFP4 MoE refuses the tiny shapes (fp4-moe-engine).
    quantize(&source, &nvfp4, &["--recipe", "kimi-k2-nvfp4", "--engine", "vllm"]).ok();
    let card = read_card(&nvfp4);
    assert!(!card.fields.contains_key("base_model"), "{:?}", card.fields);
    assert!(!card.fields.contains_key("base_model_relation"), "{:?}", card.fields);
    assert_eq!(card.tags(), ["compressed-tensors", "quantized", "nvfp4", "fp4", "squeeze"]);
    card.assert_mentions(&[
        "# Kimi-K2-Tiny — NVFP4 (compressed-tensors)",
        "A quantized version of the weights of the local folder `Kimi-K2-Tiny`, converted by",
        "gives no `base_model`",
        "--base-model ORG/NAME",
        "| group_0 | `nvfp4-pack-quantized` | 4-bit float, group 16",
        "| routed_experts | 48 | nvfp4 × 48 |",
        "Blackwell",
    ]);
    assert!(read_json(&nvfp4.join("squeeze-manifest.json")).get("card").is_none());
    squeeze(&["verify", path_str(&nvfp4), "--source", path_str(&source)]).ok();

    // W4A8 (on shapes the engines take at tp 2: hidden % 256, moe_intermediate / tp % 256), --tp recorded for the
    // card's serve commands.
    let shaped = synth(dir.path(), "shaped", "kimi-k2", &["--hidden", "256", "--moe-intermediate", "512"]);
    let w4a8 = dir.path().join("w4a8");
    quantize(&shaped, &w4a8, &["--recipe", "kimi-k2-w4a8", "--tp", "2"]).ok();
    let card = read_card(&w4a8);
    assert_eq!(card.tags(), ["compressed-tensors", "quantized", "int4", "w4a8", "squeeze"]);
    assert_eq!(read_json(&w4a8.join("squeeze-manifest.json"))["card"]["tp"], 2);
    card.assert_mentions(&[
        "# shaped — W4A8-FP8 (compressed-tensors)",
        "| 4-bit int, group 128, symmetric, observer `minmax` | 8-bit float, per token, dynamic, symmetric |",
        "--tensor-parallel-size 2",
        "--tp 2",
        "the size `quantize --tp` checked the load rules against",
    ]);
}

#[test]
fn the_base_model_comes_from_the_hub_cache_or_the_config_name() {
    let dir = tmp();
    let (cache, _) = crate::hub::fake_cache(dir.path());
    let out = dir.path().join("from-cache");
    squeeze_in(dir.path(), &[("HF_HUB_CACHE", &cache)], &["quantize", "org/tiny", path_str(&out)]).ok();
    assert_eq!(read_card(&out).field("base_model"), "org/tiny");

    // `_name_or_path` wins when it is a repo id; a local path there is not one, and a local folder's name is no
    // `base_model` (the Hub would read `base_model: named` as a repo id).
    let named = synth(dir.path(), "named", "kimi-k2", &[]);
    let mut config = read_json(&named.join("config.json"));
    for (name_or_path, expected) in
        [("/data/models/kimi", None), ("moonshotai/Kimi-K2-Base", Some("moonshotai/Kimi-K2-Base"))]
    {
        config["_name_or_path"] = Value::from(name_or_path);
        fs::write(named.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        let out = dir.path().join(format!("out-{}", expected.unwrap_or("folder")).replace('/', "-"));
        quantize(&named, &out, &[]).ok();
        let card = read_card(&out);
        assert_eq!(card.fields.get("base_model").map(String::as_str), expected, "_name_or_path {name_or_path}");
        if expected.is_none() {
            card.assert_mentions(&["the local folder `named`"]);
            let report = squeeze(&["card", path_str(&out), "--json"]).ok().json();
            assert_eq!(report["base_model"], Value::Null);
            assert_eq!(report["base_model_from"], "folder-name");
            squeeze(&["card", path_str(&out), "--base-model", "org/named"]).ok();
            assert_eq!(read_card(&out).field("base_model"), "org/named");
        }
    }
}

#[test]
fn merged_parts_write_the_card_one_run_writes() {
    let dir = tmp();
    let source = source(dir.path(), "fp8");
    let flags = ["--max-shard-size", "300kB", "--base-model", "org/kimi-tiny"];
    let single = dir.path().join("single");
    quantize(&source, &single, &flags).ok();
    let parts: Vec<PathBuf> = (1..=2)
        .map(|index| {
            let out = dir.path().join(format!("part{index}"));
            let mut args = flags.to_vec();
            let part = format!("{index}/2");
            args.extend(["--part", &part]);
            quantize(&source, &out, &args).ok();
            assert!(!out.join("README.md").exists(), "a part writes no card; merge does");
            out
        })
        .collect();
    assert_eq!(fs::read_to_string(parts[0].join("README.source.md")).unwrap(), SOURCE_README, "part 1 carries it");
    let merged = dir.path().join("merged");
    squeeze(&["merge", path_str(&merged), path_str(&parts[0]), path_str(&parts[1])]).ok();
    for name in ["README.md", "README.source.md", "squeeze-manifest.json"] {
        assert!(fs::read(single.join(name)).unwrap() == fs::read(merged.join(name)).unwrap(), "{name} differs");
    }
    assert_eq!(read_card(&merged).field("base_model"), "org/kimi-tiny");

    // A part run with another --base-model is refused by the merge, naming the flag.
    let other = dir.path().join("other");
    quantize(&source, &other, &["--max-shard-size", "300kB", "--base-model", "org/else", "--part", "2/2"]).ok();
    let run = squeeze(&["merge", path_str(&dir.path().join("m2")), path_str(&parts[0]), path_str(&other)]);
    expect_exit_2(&run, &["--base-model org/else", "--base-model org/kimi-tiny", "part 2/2"]);
}

/// Runs `squeeze eval ARGS --json` (a parity report exits 1 when a gate fails: random weights) into `file`.
fn eval_report(file: &Path, args: &[&str]) -> Value {
    let mut all = vec!["eval", "--data", TEXT, "--ctx", "32", "--chunks", "2", "--json"];
    all.extend_from_slice(args);
    let run = squeeze(&all);
    assert!(run.code == 0 || run.code == 1, "eval failed\n{}", run.stderr);
    fs::write(file, &run.stdout).unwrap();
    run.json()
}

#[test]
fn eval_reports_fill_the_accuracy_section_and_survive_rewrites_and_resume() {
    let dir = tmp();
    let source = source(dir.path(), "fp8");
    let out = dir.path().join("int4");
    quantize(&source, &out, &[]).ok();
    let parity_file = dir.path().join("parity.json");
    let parity = eval_report(&parity_file, &["--reference", path_str(&source), "--candidate", path_str(&out)]);
    let (ppl_out_file, ppl_src_file) = (dir.path().join("ppl-int4.json"), dir.path().join("ppl-fp8.json"));
    let ppl_out = eval_report(&ppl_out_file, &[path_str(&out)]);
    let ppl_src = eval_report(&ppl_src_file, &[path_str(&source)]);

    let evals = [path_str(&parity_file), path_str(&ppl_out_file), path_str(&ppl_src_file)];
    let report =
        squeeze(&["card", path_str(&out), "--eval", evals[0], "--eval", evals[1], "--eval", evals[2], "--json"])
            .ok()
            .json();
    assert_eq!(report["evals"], serde_json::json!(["parity.json", "ppl-int4.json", "ppl-fp8.json"]));
    assert_eq!(report["manifest_updated"], true);
    let shown = read_card(&out);
    shown.assert_mentions(&["## Accuracy", "### Parity against fp8 (`parity.json`)", "2 chunks of 32 tokens"]);
    let number = |value: &Value, key: &str| value[key].as_f64().unwrap();
    for (mode, summary) in parity["modes"].as_object().unwrap() {
        let row = format!(
            "| {mode} | {} | {:.5} ± {:.5} | {:.2} ± {:.2} % | {:.4} ± {:.4} | {:.4} ± {:.4} |",
            match mode.as_str() {
                "reference" => "reference, BF16 KV",
                "kv" => "reference, FP8 KV",
                "weights" => "this model, BF16 KV",
                _ => "reference prefill (BF16 KV) → this model decodes (FP8 KV)",
            },
            number(summary, "mean_kld"),
            number(summary, "mean_kld_stderr"),
            number(summary, "same_top"),
            number(summary, "same_top_stderr"),
            number(summary, "ppl"),
            number(summary, "ppl_stderr"),
            number(summary, "ppl_ratio"),
            number(summary, "ppl_ratio_stderr"),
        );
        shown.assert_mentions(&[&row]);
    }
    let failures = parity["failures"].as_array().unwrap();
    shown.assert_mentions(&["Gates: mean KLD ≤ 0.05, same top-1 ≥ 90 %, PPL ratio ≤ 1.05: "]);
    if let Some(first) = failures.first() {
        shown.assert_mentions(&[&format!("{} ({})", first["gate"].as_str().unwrap(), first["mode"].as_str().unwrap())]);
    } else {
        shown.assert_mentions(&["all passed"]);
    }
    for (name, report, file) in [("this model", &ppl_out, "ppl-int4.json"), ("fp8", &ppl_src, "ppl-fp8.json")] {
        let row = format!(
            "| {name} | `{file}` | 2 × 32 | {} | {:.4} ± {:.4} | {:.5} ± {:.5} |",
            report["tokens"],
            number(report, "ppl"),
            number(report, "ppl_stderr"),
            number(report, "mean_nll"),
            number(report, "mean_nll_stderr")
        );
        shown.assert_mentions(&[&row]);
    }

    // Rewriting without --eval, and resuming the finished conversion (the same weights), keep the results.
    let with_results = fs::read(out.join("README.md")).unwrap();
    let again = squeeze(&["card", path_str(&out), "--json"]).ok().json();
    assert_eq!(again["manifest_updated"], false);
    assert!(fs::read(out.join("README.md")).unwrap() == with_results, "a rewrite changed the card");
    quantize(&source, &out, &["--resume"]).ok();
    assert!(fs::read(out.join("README.md")).unwrap() == with_results, "--resume lost the results");

    // After calibrate-kv the rewritten card serves with an FP8 KV cache, results still there.
    read_card(&out).assert_mentions(&["holds no calibrated KV-cache scales", "then `squeeze card DIR`"]);
    squeeze(&["calibrate-kv", path_str(&out), "--data", TEXT, "--samples", "2", "--seq-len", "32"]).ok();
    squeeze(&["card", path_str(&out)]).ok();
    read_card(&out).assert_mentions(&[
        "--tensor-parallel-size 1 --kv-cache-dtype fp8\n",
        "--tp 1 --kv-cache-dtype fp8_e4m3\n",
        "calibrated FP8 KV-cache scales",
        "- vLLM 0.32: ignores the checkpoint's scales",
        "## Accuracy",
    ]);
    assert!(!read_card(&out).body.contains("holds no calibrated KV-cache scales"));
    squeeze(&["verify", path_str(&out)]).ok();

    // --no-eval drops them; a new conversion (--force) starts without.
    squeeze(&["card", path_str(&out), "--eval", evals[0]]).ok();
    squeeze(&["card", path_str(&out), "--no-eval"]).ok();
    assert!(!read_card(&out).body.contains("## Accuracy"));
    squeeze(&["card", path_str(&out), "--eval", evals[1]]).ok();
    quantize(&source, &out, &["--force"]).ok();
    assert!(!read_card(&out).body.contains("## Accuracy"));
    assert!(read_json(&out.join("squeeze-manifest.json")).get("card").is_none());

    // A parity report of another candidate, and a file that is no eval report, are refused naming them.
    let other = dir.path().join("other");
    quantize(&source, &other, &["--scale-rule", "mse"]).ok();
    let before = fs::read(other.join("README.md")).unwrap();
    let run = squeeze(&["card", path_str(&other), "--eval", evals[0]]);
    expect_exit_2(&run, &["parity.json", "is the parity of", path_str(&out), "--candidate"]);
    let manifest = other.join("squeeze-manifest.json");
    let run = squeeze(&["card", path_str(&other), "--eval", path_str(&manifest)]);
    expect_exit_2(&run, &["neither a parity report"]);
    assert!(fs::read(other.join("README.md")).unwrap() == before, "a refused card changed the folder");
}

#[test]
fn a_readme_squeeze_did_not_write_is_never_overwritten() {
    let dir = tmp();
    let source = source(dir.path(), "fp8");
    let out = dir.path().join("int4");
    quantize(&source, &out, &[]).ok();

    // A card of one's own in the output folder: quantize --force/--resume and squeeze card refuse before writing.
    let own = "# My own card\n";
    fs::write(out.join("README.md"), own).unwrap();
    let manifest = fs::read(out.join("squeeze-manifest.json")).unwrap();
    for flag in ["--force", "--resume"] {
        let run = quantize(&source, &out, &[flag]);
        expect_exit_2(&run, &["README.md", "not a squeeze model card", "move it away"]);
    }
    expect_exit_2(&squeeze(&["card", path_str(&out)]), &["README.md", "move it away"]);
    assert_eq!(fs::read_to_string(out.join("README.md")).unwrap(), own);
    assert!(fs::read(out.join("squeeze-manifest.json")).unwrap() == manifest, "a refused run wrote the manifest");

    // A folder an older squeeze wrote: README.md is the source's copy and there is no README.source.md.
    fs::write(out.join("README.md"), SOURCE_README).unwrap();
    fs::remove_file(out.join("README.source.md")).unwrap();
    let report = squeeze(&["card", path_str(&out), "--json"]).ok().json();
    assert_eq!(report["moved_source_readme"], true);
    assert_eq!(fs::read_to_string(out.join("README.source.md")).unwrap(), SOURCE_README);
    read_card(&out).assert_mentions(&["[README.source.md](README.source.md)"]);
    // …and resumed or redone: the source's copy is replaced by the card, the source's README kept.
    fs::write(out.join("README.md"), SOURCE_README).unwrap();
    quantize(&source, &out, &["--resume"]).ok();
    read_card(&out).assert_mentions(&["A quantized version of the weights of the local folder `fp8`"]);
    assert_eq!(fs::read_to_string(out.join("README.source.md")).unwrap(), SOURCE_README);

    // Only a squeeze conversion gets a card: a source folder is refused and left alone.
    let run = squeeze(&["card", path_str(&source)]);
    expect_exit_2(&run, &["squeeze-manifest.json", "not written by `squeeze quantize`"]);
    assert_eq!(fs::read_to_string(source.join("README.md")).unwrap(), SOURCE_README);
    assert!(!source.join(".squeeze.lock").exists() && !out.join(".squeeze.lock").exists());
}

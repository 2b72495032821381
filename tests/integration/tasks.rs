//! `eval --task` (issue 51): the shipped task file on the trained tiny Shakespeare model gives lm-evaluation-harness's
//! own per-item results (golden from `scripts/oracle/lmeval/make-task-golden.py`: the harness's HF backend on the
//! same model dequantized to float32, the same JSONL as local tasks) at 0 and 2 shots; two models paired per item
//! with their flips and gates; bad task files exit 2 naming the line and field.

use std::path::Path;

use crate::common::{expect_exit_2, path_str, read_json, squeeze, synth};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn at(relative: &str) -> String {
    Path::new(ROOT).join(relative).display().to_string()
}

#[test]
fn tasks_score_as_lm_evaluation_harness_scores_them() {
    let golden = read_json(&Path::new(ROOT).join("tests/golden/lmeval/tempest-tasks.json"));
    let (model, tasks) = (at("eval/tiny-shakespeare-fp8"), at("eval/tempest-tasks.jsonl"));
    for run in golden["runs"].as_array().unwrap() {
        let shots = run["num_fewshot"].to_string();
        let args = ["eval", &model, "--task", &tasks, "--num-fewshot", &shots, "--json"];
        let ours = squeeze(&args).ok().json();
        let (mut worst, mut items) = (0.0f64, 0);
        for (want, got) in run["tasks"].as_array().unwrap().iter().zip(ours["tasks"].as_array().unwrap()) {
            let task = want["task"].as_str().unwrap();
            assert_eq!(got["task"], task);
            // Every item: the same choice (acc, acc_norm) and greedy flags, or the same completion and answer.
            for (want, got) in want["items"].as_array().unwrap().iter().zip(got["items"].as_array().unwrap()) {
                let what = format!("{shots}-shot {task} line {}", want["line"]);
                assert_eq!(want["line"], got["line"], "{what}");
                let correct = |index: usize| got["metrics"][index]["correct"].as_bool().unwrap() as u8 as f64;
                if let Some(lls) = want["loglikelihoods"].as_array() {
                    let ours = got["loglikelihoods"].as_array().unwrap();
                    for (a, b) in lls.iter().zip(ours) {
                        worst = worst.max((a.as_f64().unwrap() - b.as_f64().unwrap()).abs());
                    }
                    assert_eq!(want["greedy"], got["greedy"], "{what}");
                    assert_eq!(
                        (want["acc"].as_f64().unwrap(), want["acc_norm"].as_f64().unwrap()),
                        (correct(0), correct(1)),
                        "{what}"
                    );
                } else {
                    assert_eq!(want["completion"], got["completion"], "{what}");
                    assert_eq!(want["answer"], got["metrics"][0]["prediction"], "{what}");
                    assert_eq!(want["exact_match"].as_f64().unwrap(), correct(0), "{what}");
                }
                items += 1;
            }
            // The task's metrics and the harness's standard errors (sample variance over n − 1).
            for metric in got["metrics"].as_array().unwrap() {
                let name = metric["metric"].as_str().unwrap();
                let value = want["metrics"][name].as_f64().unwrap();
                let stderr = want["metrics"][format!("{name}_stderr")].as_f64().unwrap();
                assert!((metric["value"].as_f64().unwrap() - value).abs() < 1e-12, "{task} {name}");
                assert!((metric["stderr"].as_f64().unwrap() - stderr).abs() < 1e-12, "{task} {name} stderr");
            }
        }
        assert_eq!(items, 84, "{shots}-shot: every scored item compared");
        // The runtime's logits equal transformers' to ~3e-7; summed over a continuation's tokens, 4e-5 measured.
        assert!(worst < 2e-4, "{shots}-shot: log-likelihoods differ from the harness's by up to {worst}");
    }
}

#[test]
fn two_models_pair_per_item_with_flips_mcnemar_and_gates() {
    let tasks = at("eval/tempest-tasks.jsonl");
    let (reference, candidate) = (at("eval/tiny-shakespeare-fp8"), at("eval/tiny-shakespeare-glm45-fp8"));
    let args = ["eval", "--reference", &reference, "--candidate", &candidate, "--task", &tasks, "--json"];
    let report = squeeze(&args).ok().json();
    // The flips and agreement follow from the two models' own per-item results.
    let (ours, theirs) = (&report["reference"]["tasks"], &report["candidate"]["tasks"]);
    let mut flipped = 0;
    for row in report["comparison"].as_array().unwrap() {
        let task = ours.as_array().unwrap().iter().position(|t| t["task"] == row["task"]).unwrap();
        let metric =
            ours[task]["metrics"].as_array().unwrap().iter().position(|m| m["metric"] == row["metric"]).unwrap();
        let items = |side: &serde_json::Value| side[task]["items"].as_array().unwrap().clone();
        let (a, b) = (items(ours), items(theirs));
        let outcome = |item: &serde_json::Value| item["metrics"][metric].clone();
        let right_to_wrong =
            a.iter().zip(&b).filter(|(x, y)| outcome(x)["correct"] == true && outcome(y)["correct"] == false).count();
        let wrong_to_right =
            a.iter().zip(&b).filter(|(x, y)| outcome(x)["correct"] == false && outcome(y)["correct"] == true).count();
        let same = a.iter().zip(&b).filter(|(x, y)| outcome(x)["prediction"] == outcome(y)["prediction"]).count();
        assert_eq!(
            (row["right_to_wrong"].as_u64().unwrap() as usize, row["wrong_to_right"].as_u64().unwrap() as usize),
            (right_to_wrong, wrong_to_right),
            "{row}"
        );
        assert!((row["agreement"].as_f64().unwrap() - same as f64 / a.len() as f64).abs() < 1e-12, "{row}");
        flipped += right_to_wrong + wrong_to_right;
    }
    assert!(flipped > 0, "two different models flip some items: {report}");
    // Gates: exit 1 naming the task and metric; none without gates.
    assert!(report["failures"].as_array().unwrap().is_empty());
    let gated = squeeze(&[&args[..7], &["--max-flips", "0", "--max-acc-drop", "100"]].concat());
    assert_eq!(gated.code, 1, "{}", gated.stderr);
    assert!(gated.stderr.contains("gate max-flips failed: task tempest-"), "{}", gated.stderr);
    assert!(!gated.stderr.contains("max-acc-drop failed"), "{}", gated.stderr);
}

#[test]
fn bad_task_files_exit_2_naming_the_line_and_field() {
    let temp = tempfile::tempdir().unwrap();
    let model = at("eval/tiny-shakespeare-fp8");
    let write = |name: &str, text: &str| {
        let path = temp.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let good = r#"{"task": "t", "context": "A", "choices": ["b", "c"], "gold": 0}"#;
    let cases = [
        (
            "gold.jsonl",
            format!("{good}\n{}", r#"{"task": "t", "context": "A", "choices": ["b", "c"], "gold": 5}"#),
            "line 2, field `gold`",
        ),
        ("array.jsonl", "[1]".to_string(), "line 1: not a JSON object"),
        (
            "regex.jsonl",
            r#"{"task": "g", "context": "A", "target": "1", "regex": "(["}"#.to_string(),
            "line 1, field `regex`",
        ),
        (
            "empty.jsonl",
            r#"{"task": "t", "context": "A", "choices": ["b", ""], "gold": 0}"#.to_string(),
            "field `choices`",
        ),
        ("missing.jsonl", r#"{"task": "t", "choices": ["b", "c"], "gold": 0}"#.to_string(), "line 1, field `context`"),
    ];
    for (name, text, needle) in cases {
        let path = write(name, &text);
        expect_exit_2(&squeeze(&["eval", &model, "--task", path_str(&path)]), &[name, needle]);
    }
    // A prompt of whitespace only: nothing left to condition on once it moves to the continuation.
    let path = write("blank.jsonl", r#"{"task": "t", "context": "\n", "choices": ["b", "c"], "gold": 0}"#);
    expect_exit_2(&squeeze(&["eval", &model, "--task", path_str(&path)]), &["blank.jsonl: line 1", "only whitespace"]);
    // A prompt past the model's context window (4,096 positions).
    let long = format!(r#"{{"task": "t", "context": "{}", "choices": ["b", "c"], "gold": 0}}"#, "a".repeat(5000));
    let path = write("long.jsonl", &long);
    let run = squeeze(&["eval", &model, "--task", path_str(&path)]);
    expect_exit_2(&run, &["long.jsonl: line 1, choice 0", "context window"]);
    // More few-shot examples than the task has.
    let path = write("few.jsonl", good);
    expect_exit_2(
        &squeeze(&["eval", &model, "--task", path_str(&path), "--num-fewshot", "1"]),
        &["few.jsonl", "--num-fewshot 1", "task `t` has 0"],
    );
}

#[test]
fn the_model_card_carries_the_task_comparison() {
    let temp = tempfile::tempdir().unwrap();
    let (source, tasks) = (at("eval/tiny-shakespeare-fp8"), at("eval/tempest-tasks.jsonl"));
    let int4 = temp.path().join("int4");
    squeeze(&["quantize", &source, path_str(&int4)]).ok();
    let args = ["eval", "--reference", &source, "--candidate", path_str(&int4), "--task", &tasks, "--json"];
    let report = temp.path().join("tasks.json");
    std::fs::write(&report, squeeze(&args).ok().stdout).unwrap();
    squeeze(&["card", path_str(&int4), "--eval", path_str(&report)]).ok();
    let card = std::fs::read_to_string(int4.join("README.md")).unwrap();
    assert!(card.contains("### Tasks against tiny-shakespeare-fp8 (`tasks.json`)"), "{card}");
    assert!(card.contains("| tempest-next-word | acc | 38 |"), "{card}");
    // A comparison whose candidate is another folder is refused, naming both.
    let other = temp.path().join("other");
    squeeze(&["quantize", &source, path_str(&other)]).ok();
    let run = squeeze(&["card", path_str(&other), "--eval", path_str(&report)]);
    expect_exit_2(&run, &["tasks.json", "compares", "--task FILE --json"]);
}

/// `--split`: the candidate's generations are prefilled on the reference and decoded on the candidate — the tokens
/// serve-test's split deployment decodes greedily from the same prompts (f32 KV, the same handover). Two random
/// models of one architecture (seeds 1 and 0), so that the handover shows in the tokens.
#[test]
fn split_generation_decodes_what_serve_tests_split_deployment_decodes() {
    let temp = tempfile::tempdir().unwrap();
    let reference = synth(temp.path(), "reference", "glm45", &["--seed", "1"]);
    let candidate = synth(temp.path(), "candidate", "glm45", &[]);
    let (reference, candidate) = (path_str(&reference), path_str(&candidate));
    let contexts =
        ["PROSPERO.\nThy mother was a piece of virtue, and", "MIRANDA.\nO, the heavens!", "CALIBAN.\nI say,"];
    let items: Vec<String> = contexts
        .iter()
        .map(|context| {
            serde_json::json!({"task": "say", "context": context, "target": "x", "until": ["\n"], "max_tokens": 24})
                .to_string()
        })
        .collect();
    let tasks = temp.path().join("say.jsonl");
    std::fs::write(&tasks, items.join("\n")).unwrap();
    let args = ["eval", "--reference", reference, "--candidate", candidate, "--task", path_str(&tasks), "--json"];
    let completions = |report: &serde_json::Value| -> Vec<String> {
        let items = report["candidate"]["tasks"][0]["items"].as_array().unwrap().clone();
        items.iter().map(|item| item["completion"].as_str().unwrap().to_string()).collect()
    };
    let own = completions(&squeeze(&args).ok().json());
    let report = squeeze(&[&args[..], &["--split"]].concat()).ok().json();
    assert_eq!(report["split"], true);
    let split = completions(&report);
    assert_ne!(own, split, "prefilled on another model, the candidate decodes other tokens");
    let mut serve = vec!["serve-test", candidate, "--prefill-model", reference, "--kv-dtype", "f32"];
    serve.extend(["--max-new-tokens", "24", "--json"]);
    for context in contexts {
        serve.extend(["--prompt", context]);
    }
    let served = squeeze(&serve).ok().json();
    for (completion, request) in split.iter().zip(served["requests"].as_array().unwrap()) {
        let decoded = request["text"].as_str().unwrap();
        assert_eq!(completion, decoded.split('\n').next().unwrap(), "{}", request["prompt"]);
    }
}

/// `--part I/N --save-stats` scores a share of the items; `merge-eval` joins the parts into the report one run gives
/// (the same choices, completions, metrics, flips and gates; log-likelihoods to the last bits, as a pass's batch
/// differs), and refuses a missing part.
#[test]
fn task_parts_merge_into_the_report_one_run_gives() {
    let temp = tempfile::tempdir().unwrap();
    let tasks = at("eval/tempest-tasks.jsonl");
    let (reference, candidate) = (at("eval/tiny-shakespeare-fp8"), at("eval/tiny-shakespeare-glm45-fp8"));
    let base = ["eval", "--reference", &reference, "--candidate", &candidate, "--task", &tasks, "--max-flips", "5"];
    let whole = squeeze(&[&base[..], &["--json"]].concat());
    assert_eq!(whole.code, 1, "the gate fails on the whole: {}", whole.stderr);
    let mut files = Vec::new();
    for part in 1..=3 {
        let file = temp.path().join(format!("part{part}.safetensors"));
        let share = format!("{part}/3");
        let run = squeeze(&[&base[..], &["--part", &share, "--save-stats", path_str(&file), "--json"]].concat());
        assert_eq!(run.code, 0, "a part applies no gate: {}", run.stderr);
        files.push(file);
    }
    let mut merge = vec!["merge-eval", "--json"];
    merge.extend(files.iter().rev().map(|file| path_str(file)));
    let merged = squeeze(&merge);
    assert_eq!(merged.code, 1, "merge-eval applies the gates: {}", merged.stderr);
    let (mut merged, mut whole) = (merged.json(), whole.json());
    fn strip(value: &mut serde_json::Value, worst: &mut f64, other: &serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                for key in ["seconds", "items_per_second", "tokens_per_second"] {
                    map.remove(key);
                }
                for (key, child) in map.iter_mut() {
                    if key == "loglikelihoods" {
                        for (a, b) in child.as_array_mut().unwrap().iter_mut().zip(other[key].as_array().unwrap()) {
                            let (x, y) = (a.as_f64().unwrap(), b.as_f64().unwrap());
                            *worst = worst.max((x - y).abs() / y.abs());
                            *a = b.clone();
                        }
                    } else {
                        strip(child, worst, &other[key]);
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for (index, child) in items.iter_mut().enumerate() {
                    strip(child, worst, &other[index]);
                }
            }
            _ => {}
        }
    }
    let mut worst = 0.0;
    let reference_whole = whole.clone();
    strip(&mut merged, &mut worst, &reference_whole);
    strip(&mut whole, &mut 0.0, &reference_whole);
    assert_eq!(merged, whole);
    assert!(worst < 1e-12, "log-likelihoods differ by {worst} relative");
    let missing = squeeze(&["merge-eval", path_str(&files[0]), path_str(&files[2])]);
    expect_exit_2(&missing, &["part 2/3 is missing"]);
}

/// The device path (`--device emulated`: the CUDA kernels compiled for the host, the launch checks a GPU makes) scores
/// as the CPU does: shared contexts through the device's paged attention, generation through its paged decode. Four
/// items of the shipped file (a next-line, two next-word, an arithmetic) keep it to about 25 s on 2 cores.
#[test]
fn tasks_on_the_device_score_as_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<&str> = include_str!("../../eval/tempest-tasks.jsonl").lines().collect();
    let subset = dir.path().join("subset.jsonl");
    let picked: Vec<&str> = [4, 47, 48, 87].iter().map(|&line| lines[line - 1]).collect();
    std::fs::write(&subset, picked.join("\n") + "\n").unwrap();
    let model = at("eval/tiny-shakespeare-fp8");
    let run = |device: &str| {
        squeeze(&["eval", &model, "--task", path_str(&subset), "--device", device, "--json"]).ok().json()
    };
    let (cpu, device) = (run("cpu"), run("emulated"));
    assert!(device["backend"].as_str().unwrap().contains("emulated"), "{}", device["backend"]);
    let mut worst = 0.0f64;
    for (want, got) in cpu["tasks"].as_array().unwrap().iter().zip(device["tasks"].as_array().unwrap()) {
        for (want, got) in want["items"].as_array().unwrap().iter().zip(got["items"].as_array().unwrap()) {
            let line = &want["line"];
            assert_eq!(want["metrics"], got["metrics"], "line {line}: the same predictions");
            assert_eq!(want["greedy"], got["greedy"], "line {line}");
            assert_eq!(want["completion"], got["completion"], "line {line}");
            let (a, b) = (want["loglikelihoods"].as_array(), got["loglikelihoods"].as_array());
            for (a, b) in a.into_iter().flatten().zip(b.into_iter().flatten()) {
                worst = worst.max((a.as_f64().unwrap() - b.as_f64().unwrap()).abs());
            }
        }
    }
    assert_eq!(device["items"], 4);
    // The device's BF16-split matmuls and its own reduction order: 5.6e-5 seen on these items.
    assert!(worst < 5e-4, "log-likelihoods differ from the CPU's by up to {worst}");
}

//! squeeze's tokenizers against the Python ones (`scripts/oracle/make-tokenizer-golden.py`): a tiny byte-level
//! BPE `tokenizer.json` (Python `tokenizers` 0.23.3 and transformers 5.24 `AutoTokenizer`) and the same vocabulary
//! as a Kimi-style `tiktoken.model` + `tokenizer_config.json` (Python `tiktoken` 0.14 with Kimi's `pat_str`).
//! The fixed text mixes scripts, emoji, digits, whitespace runs, CR LF and special tokens; ids must be identical
//! and decoding must give the text back.

use std::path::{Path, PathBuf};

use squeeze::model::tokenizer::Tokenizer;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/tokenizer").join(name)
}

/// `ids.json` of a golden folder: the text and the ids Python produced for it.
fn expected(dir: &Path) -> (String, Vec<u32>) {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ids.json")).expect("ids.json")).expect("valid json");
    let text = json["text"].as_str().expect("text").to_string();
    let ids = json["ids"].as_array().expect("ids").iter().map(|id| id.as_u64().expect("id") as u32).collect();
    (text, ids)
}

fn decode(tokenizer: &Tokenizer, ids: &[u32]) -> String {
    match tokenizer {
        Tokenizer::HuggingFace(t) => t.decode(ids, false).expect("decode"),
        Tokenizer::TikToken(bpe) => bpe.decode(ids).expect("decode"),
    }
}

/// Index and a window of context around the first difference, for a readable failure.
fn first_difference(ours: &[u32], theirs: &[u32]) -> String {
    let at = ours.iter().zip(theirs).position(|(a, b)| a != b).unwrap_or(ours.len().min(theirs.len()));
    let window = |ids: &[u32]| ids[at.saturating_sub(3)..(at + 4).min(ids.len())].to_vec();
    format!(
        "lengths {} vs {}; first difference at {at}: squeeze {:?} vs python {:?}",
        ours.len(),
        theirs.len(),
        window(ours),
        window(theirs)
    )
}

fn check(name: &str, kind: fn(&Tokenizer) -> bool) {
    let dir = golden(name);
    let tokenizer = Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(kind(&tokenizer), "{name}: wrong tokenizer kind picked by from_dir");
    let (text, ids) = expected(&dir);
    let ours = tokenizer.encode(&text).expect("encode");
    assert!(ours == ids, "{name}: ids differ from Python's: {}", first_difference(&ours, &ids));
    assert_eq!(decode(&tokenizer, &ours), text, "{name}: decoding does not round-trip");
}

#[test]
fn tokenizer_json_matches_python_tokenizers() {
    check("hf", |t| matches!(t, Tokenizer::HuggingFace(_)));
}

#[test]
fn kimi_tiktoken_matches_python_tiktoken() {
    check("kimi", |t| matches!(t, Tokenizer::TikToken(_)));
}

#[test]
fn kimi_specials_come_from_tokenizer_config() {
    // 597 mergeable ranks; Kimi's specials sit at fixed offsets past them, the rest are reserved names.
    let tokenizer = Tokenizer::from_dir(&golden("kimi")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tokenizer.encode("[BOS]").unwrap(), [597]);
    assert_eq!(tokenizer.encode("<|im_end|>").unwrap(), [599]);
    assert_eq!(tokenizer.encode("<|im_middle|>").unwrap(), [597 + 17]);
    assert_eq!(tokenizer.encode("[PAD]").unwrap(), [597 + 255]);
    assert_eq!(tokenizer.encode("<|reserved_token_602|>").unwrap(), [602]);
}

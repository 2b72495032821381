//! A working byte-level tokenizer for synthetic models: `tokenizer.json` (HF tokenizers BPE over the 256 bytes plus
//! specials) for every architecture, and Kimi's `tiktoken.model` + `tokenizer_config.json` for kimi-k2.

use std::path::Path;

use serde_json::json;

use crate::io::atomic::{write_file, write_json};
use crate::io::IoError;

use super::config::{SynthArch, EOS_ID};

/// GPT-2's printable stand-in for each byte, as byte-level BPE vocabularies store them.
fn byte_to_unicode(byte: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if printable(byte) {
        return byte as char;
    }
    let offset = (0..byte).filter(|b| !printable(*b)).count() as u32;
    char::from_u32(256 + offset).unwrap_or('?')
}

pub fn write(out: &Path, arch: SynthArch, vocab_size: usize) -> Result<(), IoError> {
    let mut vocab = serde_json::Map::new();
    for byte in 0..=255u8 {
        vocab.insert(byte_to_unicode(byte).to_string(), json!(byte as usize));
    }
    let specials = ["<|begin_of_text|>", "<|end_of_text|>"];
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, content)| json!({ "id": 256 + i, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true }))
        .collect();
    debug_assert_eq!(EOS_ID, 257);
    debug_assert!(vocab_size >= 258);
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true },
        "post_processor": null,
        "decoder": { "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true },
        "model": { "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                   "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": [] }
    });
    write_json(&out.join("tokenizer.json"), &tokenizer)?;
    let mut decoder = serde_json::Map::new();
    for (i, content) in specials.iter().enumerate() {
        decoder.insert((256 + i).to_string(), json!({ "content": content, "special": true, "lstrip": false, "rstrip": false, "normalized": false, "single_word": false }));
    }
    write_json(
        &out.join("tokenizer_config.json"),
        &json!({ "bos_token": specials[0], "eos_token": specials[1], "added_tokens_decoder": decoder, "model_max_length": 4096,
                 "tokenizer_class": if arch == SynthArch::KimiK2 { "TikTokenTokenizer" } else { "PreTrainedTokenizerFast" } }),
    )?;
    if arch == SynthArch::KimiK2 {
        // tiktoken's format: one `base64(bytes) rank` line per mergeable token.
        let mut text = String::new();
        for byte in 0..=255u8 {
            text.push_str(&format!("{} {byte}\n", base64(&[byte])));
        }
        write_file(&out.join("tiktoken.model"), text.as_bytes())?;
    }
    Ok(())
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

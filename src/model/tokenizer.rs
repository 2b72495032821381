//! Tokenizers of the supported checkpoints: `tokenizer.json` through the HF `tokenizers` crate (pure-Rust regex),
//! and Kimi's `tiktoken.model` (+ `tokenizer_config.json` specials) through `tiktoken-rs`.

use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;

/// Kimi K2's pre-tokenizer pattern (`pat_str` of `tokenization_kimi.py`): Han runs split from letter runs by
/// class intersection (`&&[^\p{Han}]`).
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);
/// Kimi reserves this many special-token ids after the mergeable ranks.
const KIMI_RESERVED_SPECIALS: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{}: has neither tokenizer.json nor tiktoken.model; copy the tokenizer files next to the weights or pass --tokens", .0.display())]
    Missing(PathBuf),
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

/// A loaded tokenizer.
pub enum Tokenizer {
    HuggingFace(Box<tokenizers::Tokenizer>),
    TikToken(Box<tiktoken_rs::CoreBPE>),
}

impl Tokenizer {
    /// Loads the tokenizer of a model folder: `tiktoken.model` when present (Kimi), else `tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let tiktoken = dir.join("tiktoken.model");
        if tiktoken.exists() {
            return Self::tiktoken(&tiktoken, &dir.join("tokenizer_config.json"));
        }
        let json = dir.join("tokenizer.json");
        if json.exists() {
            let tokenizer = tokenizers::Tokenizer::from_file(&json)
                .map_err(|e| TokenizerError::Invalid { path: json.clone(), reason: e.to_string() })?;
            return Ok(Tokenizer::HuggingFace(Box::new(tokenizer)));
        }
        Err(TokenizerError::Missing(dir.to_path_buf()))
    }

    /// Kimi's tiktoken format: `base64(bytes) rank` lines; specials from `tokenizer_config.json`'s
    /// `added_tokens_decoder`, the rest of the 256 reserved ids named `<|reserved_token_N|>`.
    pub fn tiktoken(model: &Path, config: &Path) -> Result<Self, TokenizerError> {
        let invalid = |path: &Path, reason: String| TokenizerError::Invalid { path: path.to_path_buf(), reason };
        let text = std::fs::read_to_string(model).map_err(|e| invalid(model, e.to_string()))?;
        let mut ranks: FxHashMap<Vec<u8>, u32> = FxHashMap::default();
        for (number, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
            let mut fields = line.split_whitespace();
            let (Some(token), Some(rank)) = (fields.next(), fields.next()) else {
                return Err(invalid(model, format!("line {}: expected `base64 rank`", number + 1)));
            };
            let bytes = base64_decode(token)
                .ok_or_else(|| invalid(model, format!("line {}: invalid base64 {token:?}", number + 1)))?;
            let rank =
                rank.parse().map_err(|_| invalid(model, format!("line {}: invalid rank {rank:?}", number + 1)))?;
            ranks.insert(bytes, rank);
        }
        let base = ranks.values().copied().max().map_or(0, |m| m + 1);
        let mut specials: FxHashMap<String, u32> = FxHashMap::default();
        if config.exists() {
            let json: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(config).map_err(|e| invalid(config, e.to_string()))?)
                    .map_err(|e| invalid(config, e.to_string()))?;
            if let Some(decoder) = json.get("added_tokens_decoder").and_then(|d| d.as_object()) {
                for (id, entry) in decoder {
                    if let (Ok(id), Some(content)) = (id.parse::<u32>(), entry.get("content").and_then(|c| c.as_str()))
                    {
                        specials.insert(content.to_string(), id);
                    }
                }
            }
        }
        let taken: std::collections::HashSet<u32> = specials.values().copied().collect();
        for id in base..base + KIMI_RESERVED_SPECIALS {
            if !taken.contains(&id) {
                specials.insert(format!("<|reserved_token_{id}|>"), id);
            }
        }
        let bpe =
            tiktoken_rs::CoreBPE::new(ranks, specials, KIMI_PATTERN).map_err(|e| invalid(model, e.to_string()))?;
        Ok(Tokenizer::TikToken(Box::new(bpe)))
    }

    /// Token ids of `text`, special-token strings recognized, nothing added (no BOS).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match self {
            Tokenizer::HuggingFace(tokenizer) => tokenizer
                .encode(text, false)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|e| TokenizerError::Invalid { path: PathBuf::from("tokenizer.json"), reason: e.to_string() }),
            Tokenizer::TikToken(bpe) => Ok(bpe.encode_with_special_tokens(text)),
        }
    }

    /// The text of `ids` (special tokens written out; bytes that are not UTF-8 replaced).
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            Tokenizer::HuggingFace(tokenizer) => tokenizer.decode(ids, false).unwrap_or_default(),
            Tokenizer::TikToken(bpe) => {
                bpe.decode_bytes(ids).map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default()
            }
        }
    }
}

/// Standard base64 (with or without padding).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut bits = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            bits |= value(c)? << (18 - 6 * i);
        }
        let bytes = [(bits >> 16) as u8, (bits >> 8) as u8, bits as u8];
        out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_tiktoken_tokens() {
        assert_eq!(base64_decode("IQ==").unwrap(), b"!");
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("IGFi").unwrap(), b" ab");
    }

    #[test]
    fn kimi_pattern_splits_han_from_latin() {
        let regex = fancy_regex::Regex::new(KIMI_PATTERN).unwrap();
        let pieces: Vec<&str> = regex.find_iter("中文English混合 it's 12345").map(|m| m.unwrap().as_str()).collect();
        assert_eq!(pieces, ["中文", "English", "混合", " it's", " ", "123", "45"]);
    }
}

//! Hugging Face repo ids (`ORG/NAME[@REV]`) resolved to snapshot folders of the local hub cache, laid out as
//! `huggingface_hub` writes it (`models--ORG--NAME/refs/BRANCH` holding a commit, `snapshots/COMMIT/` the files);
//! never the network. The cache folder is chosen as `huggingface_hub` chooses it: `$HF_HUB_CACHE`, else the
//! legacy `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
//! `~/.cache/huggingface/hub` (a leading `~` expanded; an empty variable counts as unset).

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};

/// The branch a repo id without `@REV` means.
pub const DEFAULT_REVISION: &str = "main";

/// The longest NAME the Hub accepts.
const MAX_NAME_LEN: usize = 96;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The text is not `ORG/NAME[@REV]` (the caller treats it as a plain path).
    #[error("`{text}` is not a Hugging Face repo id (ORG/NAME[@REV]): {reason}")]
    NotRepoId { text: String, reason: String },
    #[error(
        "no Hugging Face cache folder: none of HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME, XDG_CACHE_HOME or \
         HOME is set; set HF_HUB_CACHE to the folder that holds models--ORG--NAME"
    )]
    NoCache,
    #[error(
        "repo `{id}` is not in the local Hugging Face cache: {} does not exist (cache {}, {chosen_by}){}; \
         download it with `{}` (or `{}`), or point HF_HUB_CACHE at the cache that holds it",
        looked.display(),
        cache.display(),
        similar_note(similar),
        id.download_command("hf download"),
        id.download_command("huggingface-cli download")
    )]
    NotCached { id: Box<RepoId>, looked: PathBuf, cache: PathBuf, chosen_by: CacheSource, similar: Option<String> },
    #[error(
        "revision `{revision}` of `{}` is not in the local Hugging Face cache: neither {} nor {} exists{}; \
         download it with `{}`",
        id.without_revision(),
        repo.join("refs").join(revision).display(),
        repo.join("snapshots").join(revision).display(),
        snapshots_note(id, snapshots),
        id.download_command("hf download")
    )]
    UnknownRevision { id: Box<RepoId>, revision: String, repo: PathBuf, snapshots: Vec<String> },
    #[error(
        "{} holds `{content}`, not a commit hash; download `{id}` again with `{}`",
        reference.display(),
        id.download_command("hf download")
    )]
    BadRef { id: Box<RepoId>, reference: PathBuf, content: String },
    #[error(
        "`{id}`: {} names commit {commit}, but {} does not exist (a deleted or unfinished download); download it \
         again with `{}`",
        reference.display(),
        snapshot.display(),
        id.download_command("hf download")
    )]
    MissingSnapshot { id: Box<RepoId>, reference: PathBuf, commit: String, snapshot: PathBuf },
    #[error("{}: {error}; check the Hugging Face cache's permissions", path.display())]
    Read { path: PathBuf, error: std::io::Error },
}

/// `; the cache holds `Org/Name`…` when a cached repo differs from the one asked for only in letter case.
fn similar_note(similar: &Option<String>) -> String {
    match similar {
        Some(name) => format!("; the cache holds `{name}`, and ids are matched as written"),
        None => String::new(),
    }
}

/// ` (cached snapshots: …)` when the repo has any.
fn snapshots_note(id: &RepoId, snapshots: &[String]) -> String {
    if snapshots.is_empty() {
        return String::new();
    }
    format!(" (cached snapshots: {}; name one as {}@COMMIT)", snapshots.join(", "), id.without_revision())
}

/// A repo id as users write it: `ORG/NAME`, optionally `@REV` (a branch, a tag or a full commit hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoId {
    pub org: String,
    pub name: String,
    pub revision: Option<String>,
}

impl RepoId {
    /// Parses `ORG/NAME[@REV]` with the Hub's rules: each part letters, digits, `-`, `_` and `.`, starting and
    /// ending with a letter, digit or `_`, without `--` or `..`; NAME at most 96 characters. REV may hold `/`
    /// (`refs/pr/1`) but no empty, `.` or `..` component.
    pub fn parse(text: &str) -> Result<Self, HubError> {
        let not = |reason: String| HubError::NotRepoId { text: text.into(), reason };
        let (id, revision) = match text.split_once('@') {
            Some((id, revision)) => (id, Some(revision)),
            None => (text, None),
        };
        let mut parts = id.split('/');
        let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(not(if id.contains('/') {
                "more than one `/`".into()
            } else {
                "no `/` between ORG and NAME".into()
            }));
        };
        check_part("ORG", org).map_err(&not)?;
        check_part("NAME", name).map_err(&not)?;
        if name.len() > MAX_NAME_LEN {
            return Err(not(format!("NAME is longer than {MAX_NAME_LEN} characters")));
        }
        if let Some(revision) = revision {
            check_revision(revision).map_err(&not)?;
        }
        Ok(Self { org: org.into(), name: name.into(), revision: revision.map(String::from) })
    }

    /// The repo's folder in the cache: `models--ORG--NAME`.
    pub fn folder_name(&self) -> String {
        format!("models--{}--{}", self.org, self.name)
    }

    /// The revision asked for, `main` when none was.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }

    /// `ORG/NAME` without the revision.
    pub fn without_revision(&self) -> String {
        format!("{}/{}", self.org, self.name)
    }

    /// `TOOL ORG/NAME [--revision REV]`: the command that puts this repo into the cache.
    pub fn download_command(&self, tool: &str) -> String {
        match &self.revision {
            Some(revision) => format!("{tool} {} --revision {revision}", self.without_revision()),
            None => format!("{tool} {}", self.without_revision()),
        }
    }
}

impl fmt::Display for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.revision {
            Some(revision) => write!(f, "{}/{}@{revision}", self.org, self.name),
            None => write!(f, "{}/{}", self.org, self.name),
        }
    }
}

/// One part of a repo id (ORG or NAME) as the Hub accepts it.
fn check_part(label: &str, part: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if part.is_empty() {
        return Err(format!("{label} is empty"));
    }
    if let Some(bad) = part.chars().find(|&c| !(word(c) || c == '-' || c == '.')) {
        return Err(format!(
            "{label} `{part}` holds `{bad}`; only ASCII letters, digits, `-`, `_` and `.` are allowed"
        ));
    }
    if !part.starts_with(word) || !part.ends_with(word) {
        return Err(format!("{label} `{part}` must start and end with a letter, a digit or `_`"));
    }
    if part.contains("--") || part.contains("..") {
        return Err(format!("{label} `{part}` holds `--` or `..`"));
    }
    Ok(())
}

/// A revision: a branch, a tag or a commit hash; it becomes a path under `refs/` or `snapshots/`, so no component
/// may be empty, `.` or `..`.
fn check_revision(revision: &str) -> Result<(), String> {
    if revision.is_empty() {
        return Err("the revision after `@` is empty".into());
    }
    if revision.contains(['\\', '\0']) || revision.split('/').any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!("revision `{revision}` is not a branch, tag or commit name"));
    }
    Ok(())
}

/// Which setting chose the cache folder (named in errors: "cache DIR, from HF_HUB_CACHE").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSource {
    HfHubCache,
    HuggingfaceHubCache,
    HfHome,
    XdgCacheHome,
    Home,
}

impl fmt::Display for CacheSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheSource::HfHubCache => "from HF_HUB_CACHE",
            CacheSource::HuggingfaceHubCache => "from HUGGINGFACE_HUB_CACHE",
            CacheSource::HfHome => "from HF_HOME",
            CacheSource::XdgCacheHome => "from XDG_CACHE_HOME; HF_HUB_CACHE and HF_HOME are unset",
            CacheSource::Home => "the default; HF_HUB_CACHE and HF_HOME are unset",
        })
    }
}

/// The environment variables that choose the cache folder, passed explicitly so that tests need not touch the
/// process environment.
#[derive(Debug, Clone, Default)]
pub struct CacheEnv {
    pub hf_hub_cache: Option<OsString>,
    pub huggingface_hub_cache: Option<OsString>,
    pub hf_home: Option<OsString>,
    pub xdg_cache_home: Option<OsString>,
    pub home: Option<OsString>,
}

impl CacheEnv {
    /// This process's variables.
    pub fn from_process() -> Self {
        let var = |name: &str| std::env::var_os(name);
        Self {
            hf_hub_cache: var("HF_HUB_CACHE"),
            huggingface_hub_cache: var("HUGGINGFACE_HUB_CACHE"),
            hf_home: var("HF_HOME"),
            xdg_cache_home: var("XDG_CACHE_HOME"),
            home: var("HOME"),
        }
    }
}

/// The hub cache folder and the setting that chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    pub root: PathBuf,
    pub chosen_by: CacheSource,
}

impl Cache {
    /// The cache folder `huggingface_hub` would use under `env`.
    pub fn locate(env: &CacheEnv) -> Result<Self, HubError> {
        fn set(value: &Option<OsString>) -> Option<&OsStr> {
            value.as_deref().filter(|value| !value.is_empty())
        }
        let home = set(&env.home).map(Path::new);
        let expand = |value: &OsStr| expand_home(Path::new(value), home);
        let (root, chosen_by) = if let Some(dir) = set(&env.hf_hub_cache) {
            (expand(dir), CacheSource::HfHubCache)
        } else if let Some(dir) = set(&env.huggingface_hub_cache) {
            (expand(dir), CacheSource::HuggingfaceHubCache)
        } else if let Some(dir) = set(&env.hf_home) {
            (expand(dir).join("hub"), CacheSource::HfHome)
        } else if let Some(dir) = set(&env.xdg_cache_home) {
            (expand(dir).join("huggingface").join("hub"), CacheSource::XdgCacheHome)
        } else if let Some(home) = home {
            (home.join(".cache").join("huggingface").join("hub"), CacheSource::Home)
        } else {
            return Err(HubError::NoCache);
        };
        Ok(Self { root, chosen_by })
    }

    /// The snapshot folder of `id`: `models--ORG--NAME/snapshots/COMMIT`, the commit read from `refs/REV` when
    /// that file exists (a branch or tag), else REV itself (a commit hash), as `huggingface_hub` looks it up.
    pub fn snapshot(&self, id: &RepoId) -> Result<PathBuf, HubError> {
        let repo = self.root.join(id.folder_name());
        if !repo.is_dir() {
            return Err(HubError::NotCached {
                id: Box::new(id.clone()),
                looked: repo,
                cache: self.root.clone(),
                chosen_by: self.chosen_by,
                similar: self.same_but_case(id),
            });
        }
        let revision = id.revision();
        let reference = repo.join("refs").join(revision);
        if reference.is_file() {
            let text = std::fs::read_to_string(&reference)
                .map_err(|error| HubError::Read { path: reference.clone(), error })?;
            let commit = text.trim();
            if commit.is_empty() || !commit.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(HubError::BadRef { id: Box::new(id.clone()), reference, content: commit.into() });
            }
            let snapshot = repo.join("snapshots").join(commit);
            if !snapshot.is_dir() {
                return Err(HubError::MissingSnapshot {
                    id: Box::new(id.clone()),
                    reference,
                    commit: commit.into(),
                    snapshot,
                });
            }
            return Ok(snapshot);
        }
        let snapshot = repo.join("snapshots").join(revision);
        if !revision.contains('/') && snapshot.is_dir() {
            return Ok(snapshot);
        }
        Err(HubError::UnknownRevision {
            id: Box::new(id.clone()),
            revision: revision.into(),
            snapshots: folder_names(&repo.join("snapshots")),
            repo,
        })
    }

    /// The `ORG/NAME` of a cached repo whose folder differs from `id`'s only in letter case.
    fn same_but_case(&self, id: &RepoId) -> Option<String> {
        let wanted = id.folder_name().to_ascii_lowercase();
        let found = folder_names(&self.root).into_iter().find(|name| name.to_ascii_lowercase() == wanted)?;
        let (org, name) = found.strip_prefix("models--")?.split_once("--")?;
        Some(format!("{org}/{name}"))
    }
}

/// The sorted names of the folders in `dir` (none when it cannot be read).
fn folder_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.path().is_dir())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// `~` and `~/rest` under `home`, as Python's `os.path.expanduser` does; other paths unchanged.
fn expand_home(path: &Path, home: Option<&Path>) -> PathBuf {
    match (path.strip_prefix("~"), home) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => path.to_path_buf(),
    }
}

/// `ORG/NAME[@REV]` resolved to its snapshot folder in the cache `env` chooses.
pub fn resolve_in(text: &str, env: &CacheEnv) -> Result<PathBuf, HubError> {
    let id = RepoId::parse(text)?;
    Cache::locate(env)?.snapshot(&id)
}

/// Whether `path` is (inside) a snapshot of a Hugging Face cache: `…/models--ORG--NAME/snapshots/REV[/…]`, whose
/// files are links into blobs that other snapshots share, so a writer must not edit it in place.
pub fn in_snapshot(path: &Path) -> bool {
    let parts: Vec<_> = path.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    parts.windows(3).any(|w| w[0].starts_with("models--") && w[1] == "snapshots" && !w[2].is_empty())
}

/// `ORG/NAME[@REV]` resolved to its snapshot folder in the cache this process's environment chooses.
pub fn resolve(text: &str) -> Result<PathBuf, HubError> {
    resolve_in(text, &CacheEnv::from_process())
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn a_snapshot_folder_is_recognized_and_a_plain_folder_is_not() {
        assert!(in_snapshot(Path::new("/c/hub/models--zai-org--GLM-5.2-FP8/snapshots/abc")));
        assert!(in_snapshot(Path::new("hub/models--a--b/snapshots/abc/config.json")));
        assert!(!in_snapshot(Path::new("/data/models--a--b/GLM-5.2-FP8")));
        assert!(!in_snapshot(Path::new("/data/snapshots/abc")));
    }
    const OTHER: &str = "fedcba9876543210fedcba9876543210fedcba98";

    /// A cache at `root` holding `models--org--tiny` with snapshots COMMIT (refs/main) and OTHER (refs/v2 and
    /// refs/refs/pr/1).
    fn cache(root: &Path) -> PathBuf {
        let repo = root.join("models--org--tiny");
        for commit in [COMMIT, OTHER] {
            std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        }
        std::fs::create_dir_all(repo.join("refs/refs/pr")).unwrap();
        std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
        std::fs::write(repo.join("refs/v2"), format!("{OTHER}\n")).unwrap();
        std::fs::write(repo.join("refs/refs/pr/1"), OTHER).unwrap();
        repo
    }

    fn env_at(root: &Path) -> CacheEnv {
        CacheEnv { hf_hub_cache: Some(root.into()), ..CacheEnv::default() }
    }

    #[test]
    fn refs_main_branch_tag_and_commit_resolve_to_their_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let repo = cache(dir.path());
        let env = env_at(dir.path());
        assert_eq!(resolve_in("org/tiny", &env).unwrap(), repo.join("snapshots").join(COMMIT));
        assert_eq!(resolve_in("org/tiny@main", &env).unwrap(), repo.join("snapshots").join(COMMIT));
        assert_eq!(resolve_in("org/tiny@v2", &env).unwrap(), repo.join("snapshots").join(OTHER));
        assert_eq!(resolve_in("org/tiny@refs/pr/1", &env).unwrap(), repo.join("snapshots").join(OTHER));
        assert_eq!(resolve_in(&format!("org/tiny@{OTHER}"), &env).unwrap(), repo.join("snapshots").join(OTHER));
    }

    #[test]
    fn a_missing_repo_names_the_folder_the_variable_and_the_download() {
        let dir = tempfile::tempdir().unwrap();
        cache(dir.path());
        let error = resolve_in("org/missing@v1", &env_at(dir.path())).unwrap_err();
        assert!(matches!(error, HubError::NotCached { chosen_by: CacheSource::HfHubCache, .. }), "{error:?}");
        let message = error.to_string();
        let looked = dir.path().join("models--org--missing");
        assert!(message.contains(&format!("{} does not exist", looked.display())), "{message}");
        assert!(message.contains(&format!("(cache {}, from HF_HUB_CACHE)", dir.path().display())), "{message}");
        assert!(message.contains("`hf download org/missing --revision v1`"), "{message}");
        assert!(message.contains("`huggingface-cli download org/missing --revision v1`"), "{message}");
    }

    #[test]
    fn a_repo_cached_under_other_letter_case_is_named() {
        let dir = tempfile::tempdir().unwrap();
        cache(dir.path());
        if dir.path().join("models--Org--Tiny").is_dir() {
            return; // a case-insensitive filesystem finds the repo under either spelling
        }
        let message = resolve_in("Org/Tiny", &env_at(dir.path())).unwrap_err().to_string();
        assert!(message.contains("the cache holds `org/tiny`"), "{message}");
    }

    #[test]
    fn an_unknown_revision_lists_the_cached_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        cache(dir.path());
        let error = resolve_in("org/tiny@nope", &env_at(dir.path())).unwrap_err();
        let HubError::UnknownRevision { revision, snapshots, .. } = &error else { panic!("{error:?}") };
        assert_eq!(revision, "nope");
        assert_eq!(snapshots, &[COMMIT.to_string(), OTHER.to_string()]);
        let message = error.to_string();
        assert!(message.contains("hf download org/tiny --revision nope"), "{message}");
        // A short hash is not a snapshot name: huggingface_hub's cache has only full ones.
        assert!(resolve_in("org/tiny@0123456", &env_at(dir.path())).is_err());
    }

    #[test]
    fn a_ref_to_a_missing_snapshot_or_holding_no_hash_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let repo = cache(dir.path());
        std::fs::remove_dir(repo.join("snapshots").join(COMMIT)).unwrap();
        let error = resolve_in("org/tiny", &env_at(dir.path())).unwrap_err();
        let HubError::MissingSnapshot { commit, snapshot, .. } = &error else { panic!("{error:?}") };
        assert_eq!(commit, COMMIT);
        assert_eq!(snapshot, &repo.join("snapshots").join(COMMIT));
        assert!(error.to_string().contains("hf download org/tiny"), "{error}");

        std::fs::write(repo.join("refs/main"), "../../elsewhere").unwrap();
        let error = resolve_in("org/tiny", &env_at(dir.path())).unwrap_err();
        assert!(matches!(&error, HubError::BadRef { content, .. } if content == "../../elsewhere"), "{error:?}");
    }

    #[test]
    fn no_refs_main_lists_what_is_cached() {
        let dir = tempfile::tempdir().unwrap();
        let repo = cache(dir.path());
        std::fs::remove_file(repo.join("refs/main")).unwrap();
        let error = resolve_in("org/tiny", &env_at(dir.path())).unwrap_err();
        let message = error.to_string();
        assert!(matches!(&error, HubError::UnknownRevision { revision, .. } if revision == "main"), "{error:?}");
        assert!(message.contains(COMMIT) && message.contains("org/tiny@COMMIT"), "{message}");
        assert!(message.contains("`hf download org/tiny`"), "{message}");
    }

    #[test]
    fn the_cache_folder_is_chosen_as_huggingface_hub_chooses_it() {
        let os = |text: &str| Some(OsString::from(text));
        let all = CacheEnv {
            hf_hub_cache: os("/hub-cache"),
            huggingface_hub_cache: os("/legacy"),
            hf_home: os("/hf-home"),
            xdg_cache_home: os("/xdg"),
            home: os("/home/u"),
        };
        let located = |env: &CacheEnv| Cache::locate(env).map(|cache| (cache.root, cache.chosen_by)).ok();
        assert_eq!(located(&all), Some(("/hub-cache".into(), CacheSource::HfHubCache)));
        let env = CacheEnv { hf_hub_cache: os(""), ..all.clone() };
        assert_eq!(located(&env), Some(("/legacy".into(), CacheSource::HuggingfaceHubCache)));
        let env = CacheEnv { huggingface_hub_cache: None, ..env };
        assert_eq!(located(&env), Some(("/hf-home/hub".into(), CacheSource::HfHome)));
        let env = CacheEnv { hf_home: None, ..env };
        assert_eq!(located(&env), Some(("/xdg/huggingface/hub".into(), CacheSource::XdgCacheHome)));
        let env = CacheEnv { xdg_cache_home: None, ..env };
        assert_eq!(located(&env), Some(("/home/u/.cache/huggingface/hub".into(), CacheSource::Home)));
        let env = CacheEnv { home: None, ..env };
        assert!(matches!(Cache::locate(&env), Err(HubError::NoCache)));
        let env = CacheEnv { hf_home: os("~/hf"), home: os("/home/u"), ..CacheEnv::default() };
        assert_eq!(located(&env), Some(("/home/u/hf/hub".into(), CacheSource::HfHome)));
    }

    #[test]
    fn hf_hub_cache_wins_over_hf_home_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let hub_cache = dir.path().join("hub-cache");
        let hf_home = dir.path().join("hf-home");
        cache(&hub_cache);
        let in_home = cache(&hf_home.join("hub"));
        let both = CacheEnv {
            hf_hub_cache: Some(hub_cache.clone().into()),
            hf_home: Some(hf_home.clone().into()),
            ..CacheEnv::default()
        };
        assert!(resolve_in("org/tiny", &both).unwrap().starts_with(&hub_cache));
        let home_only = CacheEnv { hf_home: Some(hf_home.into()), ..CacheEnv::default() };
        assert_eq!(resolve_in("org/tiny", &home_only).unwrap(), in_home.join("snapshots").join(COMMIT));
    }

    #[test]
    fn malformed_ids_are_not_repo_ids() {
        for (text, reason) in [
            ("a/b/c", "more than one `/`"),
            ("./org/name", "more than one `/`"),
            ("tiny", "no `/`"),
            ("/tiny", "ORG is empty"),
            ("org/", "NAME is empty"),
            ("org/na me", "holds ` `"),
            ("org/näme", "holds `ä`"),
            ("org/-name", "start and end"),
            ("org/name.", "start and end"),
            ("org/na--me", "`--` or `..`"),
            ("org/na..me", "`--` or `..`"),
            ("org/name@", "empty"),
            ("org/name@../x", "not a branch"),
            ("org/name@a//b", "not a branch"),
        ] {
            match RepoId::parse(text) {
                Err(HubError::NotRepoId { text: got, reason: why }) => {
                    assert_eq!(got, text);
                    assert!(why.contains(reason), "{text}: {why}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        let long = format!("org/{}", "n".repeat(97));
        assert!(RepoId::parse(&long).is_err());
        let id = RepoId::parse("zai-org/GLM-5.2-FP8@refs/pr/3").unwrap();
        assert_eq!((id.org.as_str(), id.name.as_str(), id.revision()), ("zai-org", "GLM-5.2-FP8", "refs/pr/3"));
        assert_eq!(id.folder_name(), "models--zai-org--GLM-5.2-FP8");
        assert_eq!(id.to_string(), "zai-org/GLM-5.2-FP8@refs/pr/3");
        assert_eq!(RepoId::parse("moonshotai/Kimi_K2").unwrap().revision(), "main");
    }
}

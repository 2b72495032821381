//! Fault injection into a pool's block tables and tags, for tests and demos: the mapping bugs a serving engine can
//! have (use after free, crossed tables, wild page ids, corrupted metadata, aliasing within a request), and the
//! same bugs on the KDA state slots of a hybrid model (crossed, freed, corrupted, mis-sized slots), and the page
//! faults on the pages of one DeepSeek-V4 cache kind ([`super::CachePages`]).

use super::states::LayerState;
use super::{CacheKind, KvPool, Mapping, RequestId};

/// A kind of mapping fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// A page of the victim is freed while still mapped (and handed to the next request that allocates).
    StalePage,
    /// One entry of the victim's table exchanged with one entry of another request's table (both are hit).
    Swap,
    /// An entry of the victim points past the end of the pool.
    OutOfRange,
    /// One bit of the tag of one of the victim's pages flipped.
    TagCorrupt,
    /// One page mapped twice within the victim's table.
    DoubleMap,
    /// A page the victim took for a speculative draft is rolled back onto the free list but left in its table (a
    /// rollback that forgets to unmap; the page goes to the next request that allocates).
    RollbackStale,
    /// The victim's KDA state slot exchanged with another request's (both are hit).
    StateSwap,
    /// The victim's KDA state slot freed while still mapped (and handed to the next request that arrives).
    StateStale,
    /// One bit of the generation in the tag of the victim's KDA state slot flipped.
    StateCorrupt,
    /// One KDA layer's recurrent state of the victim's slot cut short (a slot laid out for other sizes).
    StateSize,
}

impl FaultKind {
    /// The faults of the page tables (every model).
    pub const ALL: [FaultKind; 6] = [
        FaultKind::StalePage,
        FaultKind::Swap,
        FaultKind::OutOfRange,
        FaultKind::TagCorrupt,
        FaultKind::DoubleMap,
        FaultKind::RollbackStale,
    ];
    /// The faults of the KDA state slots (models with KDA layers).
    pub const STATE: [FaultKind; 4] =
        [FaultKind::StateSwap, FaultKind::StateStale, FaultKind::StateCorrupt, FaultKind::StateSize];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::StalePage => "stale-page",
            FaultKind::Swap => "swap",
            FaultKind::OutOfRange => "out-of-range",
            FaultKind::TagCorrupt => "tag-corrupt",
            FaultKind::DoubleMap => "double-map",
            FaultKind::RollbackStale => "rollback-stale",
            FaultKind::StateSwap => "state-swap",
            FaultKind::StateStale => "state-stale",
            FaultKind::StateCorrupt => "state-corrupt",
            FaultKind::StateSize => "state-size",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().chain(Self::STATE).find(|kind| kind.name() == text)
    }

    /// Whether the fault hits a KDA state slot (and so needs a model with KDA layers).
    pub fn on_state(self) -> bool {
        Self::STATE.contains(&self)
    }

    /// Whether the fault involves a second request decoded beside the victim.
    pub fn needs_two(self) -> bool {
        matches!(self, FaultKind::Swap | FaultKind::StateSwap)
    }
}

/// A fault and where it lands: the token pages' block tables (or the state slots), or with `cache` the page
/// tables of one DeepSeek-V4 cache kind. Written `KIND` or `KIND:CACHE` (`tag-corrupt:window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub cache: Option<CacheKind>,
}

impl From<FaultKind> for Fault {
    fn from(kind: FaultKind) -> Self {
        Self { kind, cache: None }
    }
}

impl Fault {
    /// The page faults that apply to a DeepSeek-V4 cache kind's pages.
    pub const ON_CACHE_PAGES: [FaultKind; 5] =
        [FaultKind::StalePage, FaultKind::Swap, FaultKind::OutOfRange, FaultKind::TagCorrupt, FaultKind::DoubleMap];

    pub fn name(self) -> String {
        match self.cache {
            Some(cache) => format!("{}:{}", self.kind.name(), cache.name()),
            None => self.kind.name().into(),
        }
    }

    /// `KIND` or `KIND:CACHE`; the error lists what is known.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (kind, cache) = match text.split_once(':') {
            Some((kind, cache)) => (kind, Some(cache)),
            None => (text, None),
        };
        let Some(kind) = FaultKind::parse(kind) else {
            let known: Vec<&str> = FaultKind::ALL.into_iter().chain(FaultKind::STATE).map(FaultKind::name).collect();
            return Err(format!("unknown kind {kind}; known: {}", known.join(", ")));
        };
        let Some(cache) = cache else { return Ok(kind.into()) };
        let Some(cache) = CacheKind::parse(cache) else {
            let known: Vec<&str> = CacheKind::ALL.into_iter().map(CacheKind::name).collect();
            return Err(format!("unknown DeepSeek-V4 cache kind {cache}; known: {}", known.join(", ")));
        };
        if !Self::ON_CACHE_PAGES.contains(&kind) {
            let known: Vec<&str> = Self::ON_CACHE_PAGES.into_iter().map(FaultKind::name).collect();
            return Err(format!(
                "{} does not apply to a cache kind's pages; these do: {}",
                kind.name(),
                known.join(", ")
            ));
        }
        Ok(Self { kind, cache: Some(cache) })
    }
}

/// What an injection did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InjectedFault {
    pub kind: FaultKind,
    /// The DeepSeek-V4 cache kind whose pages it hit (absent for the token pages and the state slots).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheKind>,
    pub victim: RequestId,
    /// Requests whose mappings are now wrong (the victim; for `swap` also the other party).
    pub affected: Vec<RequestId>,
    pub description: String,
}

/// Injects `fault` into `victim`'s mappings; `active` lists the requests that hold pages (for `swap`'s other party).
/// Returns `None` when the victim has no page (of that cache kind; or `swap` finds no other request with one).
pub fn inject(
    pool: &mut KvPool,
    fault: impl Into<Fault>,
    victim: RequestId,
    active: &[RequestId],
) -> Option<InjectedFault> {
    let Fault { kind, cache } = fault.into();
    if let Some(cache) = cache {
        return cache_fault(pool, kind, cache, victim, active);
    }
    if kind == FaultKind::RollbackStale {
        return rollback_stale(pool, victim);
    }
    if kind.on_state() {
        return state_fault(pool, kind, victim, active);
    }
    let pages = pool.shape.pages;
    let parts = pool.parts();
    let entries = parts.tables.get(&victim)?.entries.len();
    if entries == 0 {
        return None;
    }
    let last = entries - 1;
    let mut affected = vec![victim];
    let description = match kind {
        FaultKind::StalePage => {
            let mapping = parts.tables[&victim].entries[last];
            let page = mapping.page as usize;
            parts.tags[page] = None;
            parts.on_free[page] = true;
            parts.free.push(mapping.page);
            format!("freed physical page {} while request {victim} still maps it as logical page {last}", mapping.page)
        }
        FaultKind::Swap => {
            let other = active
                .iter()
                .copied()
                .filter(|&r| r != victim)
                .find(|r| parts.tables.get(r).is_some_and(|t| !t.entries.is_empty()))?;
            let theirs = parts.tables[&other].entries[0];
            let mine = std::mem::replace(&mut parts.tables.get_mut(&victim)?.entries[last], theirs);
            parts.tables.get_mut(&other)?.entries[0] = mine;
            affected.push(other);
            affected.sort_unstable();
            format!(
                "exchanged request {victim}'s logical page {last} (physical {}) with request {other}'s logical page 0 (physical {})",
                mine.page, theirs.page
            )
        }
        FaultKind::OutOfRange => {
            let entry = &mut parts.tables.get_mut(&victim)?.entries[last];
            let old = entry.page;
            entry.page = (pages + 3) as u32;
            format!("pointed request {victim}'s logical page {last} (physical {old}) at page {}", entry.page)
        }
        FaultKind::TagCorrupt => {
            let page = parts.tables[&victim].entries[last].page as usize;
            let tag = parts.tags[page].as_mut()?;
            tag.generation ^= 1 << 5;
            format!("flipped bit 5 of the generation in the tag of physical page {page}")
        }
        // Injected above, before the tables are borrowed.
        FaultKind::RollbackStale
        | FaultKind::StateSwap
        | FaultKind::StateStale
        | FaultKind::StateCorrupt
        | FaultKind::StateSize => return None,
        FaultKind::DoubleMap => {
            let table = parts.tables.get_mut(&victim)?;
            let first: Mapping = table.entries[0];
            if entries >= 2 {
                table.entries[last] = first;
            } else {
                table.entries.push(first);
            }
            format!("mapped physical page {} a second time in request {victim}'s table", first.page)
        }
    };
    Some(InjectedFault { kind, cache: None, victim, affected, description })
}

/// The victim takes one more page, as a draft past its last page does, and the rollback of that draft frees the page
/// through the pool's own rollback but leaves it mapped. `None` when the victim has no page or the pool no free page.
fn rollback_stale(pool: &mut KvPool, victim: RequestId) -> Option<InjectedFault> {
    let table = pool.table(victim)?;
    let (tokens, index) = (table.tokens, table.entries.len());
    if index == 0 {
        return None;
    }
    pool.reserve(victim, (index + 1) * pool.shape.page_size).ok()?;
    let page = pool.table(victim)?.entries[index].page;
    pool.roll_back(victim, tokens, false).ok()?;
    pool.tag_version += 1;
    Some(InjectedFault {
        kind: FaultKind::RollbackStale,
        cache: None,
        victim,
        affected: vec![victim],
        description: format!(
            "rolled back request {victim}'s draft page (logical page {index}, physical {page}) onto the free list \
             but left it mapped"
        ),
    })
}

/// A fault on the victim's KDA state slot; `None` when the pool keeps no states (or `state-swap` finds no other
/// request with a slot).
fn state_fault(pool: &mut KvPool, kind: FaultKind, victim: RequestId, active: &[RequestId]) -> Option<InjectedFault> {
    let mine = pool.tables.get(&victim)?.state?;
    let slot = mine.page as usize;
    let mut affected = vec![victim];
    let description = match kind {
        FaultKind::StateSwap => {
            let (other, theirs) = active
                .iter()
                .copied()
                .filter(|&r| r != victim)
                .find_map(|r| pool.tables.get(&r).and_then(|t| t.state).map(|state| (r, state)))?;
            pool.tables.get_mut(&victim)?.state = Some(theirs);
            pool.tables.get_mut(&other)?.state = Some(mine);
            affected.push(other);
            affected.sort_unstable();
            format!("exchanged request {victim}'s state slot {slot} with request {other}'s slot {}", theirs.page)
        }
        FaultKind::StateStale => {
            let entry = pool.states.slots.get_mut(slot)?;
            *entry = Default::default();
            pool.states.free.push(slot);
            format!("freed state slot {slot} while request {victim} still maps it")
        }
        FaultKind::StateCorrupt => {
            let tag = pool.states.slots.get_mut(slot)?.tag.as_mut()?;
            tag.generation ^= 1 << 5;
            format!("flipped bit 5 of the generation in the tag of state slot {slot}")
        }
        FaultKind::StateSize => {
            let states = &mut pool.states.slots.get_mut(slot)?.states;
            if let Some(LayerState::Kda(state)) = states.first_mut() {
                let cut = state.recurrent.len() / 2;
                state.recurrent.truncate(cut);
                format!("cut the first KDA layer's recurrent state in slot {slot} (request {victim}) to {cut} values")
            } else {
                let (layer, entries) = states.iter_mut().enumerate().find_map(|(layer, state)| match state {
                    LayerState::Compressed(cache) => cache.entries.as_mut().map(|entries| (layer, entries)),
                    _ => None,
                })?;
                entries.pending[0].push(0.0);
                format!("added a value to layer {layer}'s pending compressor values in slot {slot} (request {victim})")
            }
        }
        _ => return None,
    };
    pool.tag_version += 1;
    Some(InjectedFault { kind, cache: None, victim, affected, description })
}

/// A page fault on the pages of `cache` that `victim` maps in its first layer with such pages; `None` when the pool
/// keeps no DeepSeek-V4 caches, the victim has no such page yet (or `swap` finds no other request with one there).
fn cache_fault(
    pool: &mut KvPool,
    kind: FaultKind,
    cache: CacheKind,
    victim: RequestId,
    active: &[RequestId],
) -> Option<InjectedFault> {
    let pages = pool.cache_pages.as_mut()?;
    let slot = cache.slot();
    let layer = pages.tables.get(&victim)?.iter().position(|kinds| !kinds[slot].pages.is_empty())?;
    let table = &pages.tables[&victim][layer][slot];
    let (last, index) = (table.pages.len() - 1, table.first + table.pages.len() - 1);
    let mapping = table.pages[last];
    let what = format!("request {victim}'s {} page (layer {layer}, logical page {index}", cache.name());
    let mut affected = vec![victim];
    let description = match kind {
        FaultKind::StalePage => {
            pages.groups[slot].release(mapping.page);
            format!("freed {what}, physical {}) while it is still mapped", mapping.page)
        }
        FaultKind::Swap => {
            let other = active.iter().copied().filter(|&r| r != victim).find(|r| {
                pages.tables.get(r).and_then(|layers| layers.get(layer)).is_some_and(|k| !k[slot].pages.is_empty())
            })?;
            let theirs = pages.tables[&other][layer][slot].pages[0];
            pages.tables.get_mut(&victim)?[layer][slot].pages[last] = theirs;
            pages.tables.get_mut(&other)?[layer][slot].pages[0] = mapping;
            affected.push(other);
            affected.sort_unstable();
            format!(
                "exchanged {what}, physical {}) with request {other}'s first one there (physical {})",
                mapping.page, theirs.page
            )
        }
        FaultKind::OutOfRange => {
            let wild = (pages.groups[slot].capacity + 3) as u32;
            pages.tables.get_mut(&victim)?[layer][slot].pages[last].page = wild;
            format!("pointed {what}, physical {}) at page {wild}", mapping.page)
        }
        FaultKind::TagCorrupt => {
            pages.groups[slot].tags.get_mut(mapping.page as usize)?.as_mut()?.generation ^= 1 << 5;
            format!("flipped bit 5 of the generation in the tag of {what}, physical {})", mapping.page)
        }
        FaultKind::DoubleMap => {
            let table = &mut pages.tables.get_mut(&victim)?[layer][slot];
            let first = table.pages[0];
            if last > 0 {
                table.pages[last] = first;
            } else {
                table.pages.push(first);
            }
            format!(
                "mapped physical {} page {} a second time in request {victim}'s layer {layer} table",
                cache.name(),
                first.page
            )
        }
        _ => return None,
    };
    pool.tag_version += 1;
    Some(InjectedFault { kind, cache: Some(cache), victim, affected, description })
}

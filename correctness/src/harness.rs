//! What every model's CI check does the same way, whatever the model: an
//! exhaustive single-threaded breadth-first search, the shortest counterexample
//! by iterative deepening (what TLC's breadth-first search reports), a printable
//! trace, and reading the `.tla` / `.cfg` files the twin is held to.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::path::PathBuf;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path};

/// What an exhaustive search found.
pub struct Outcome<S, A> {
    pub distinct: usize,
    pub generated: usize,
    pub max_depth: usize,
    pub done: bool,
    /// A path to each property that was discovered (a violated invariant or a
    /// reached witness), by its name.
    pub discoveries: HashMap<&'static str, Path<S, A>>,
    pub seconds: f64,
}

impl<S, A: Debug + Clone> Outcome<S, A> {
    /// Assert what a search of the correct protocol must show: it finished, found none of
    /// `invariants` violated (nor a deadlock, when that is among them), reached every one of
    /// `witnesses` (so the invariants do not pass vacuously), and saw exactly `distinct`
    /// states (the number the `.cfg` of `module` states and TLC must report).
    pub fn assert_correct<'a>(
        &self,
        module: &str,
        invariants: impl IntoIterator<Item = &'a str>,
        witnesses: impl IntoIterator<Item = &'a str>,
        distinct: usize,
    ) where
        S: Clone,
    {
        for name in invariants {
            if let Some(path) = self.discoveries.get(name) {
                panic!("Correct violates {name}:\n{}", render(path));
            }
        }
        assert!(self.done, "the search did not finish");
        for name in witnesses {
            assert!(
                self.discoveries.contains_key(name),
                "Correct never reaches {name}: the invariants may pass vacuously"
            );
        }
        assert_eq!(
            self.distinct, distinct,
            "the correct protocol's state space changed; update the pinned count, {module}.cfg \
             and correctness/README.md, and keep {module}.tla in step"
        );
    }
}

impl<S, A> Outcome<S, A> {
    /// Which of `invariants` the search found violated.
    pub fn violated(&self, invariants: &[&'static str]) -> BTreeSet<&'static str> {
        invariants
            .iter()
            .copied()
            .filter(|name| self.discoveries.contains_key(name))
            .collect()
    }
}

/// Search `model` exhaustively, breadth first, on one thread (so the counts are
/// the same on every run).
pub fn check_exhaustively<M>(model: M) -> Outcome<M::State, M::Action>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Eq + Hash + Send + Sync + 'static,
    M::Action: Clone + Debug + Eq + Send + Sync + 'static,
{
    let start = Instant::now();
    let checker = model.checker().threads(1).spawn_bfs().join();
    Outcome {
        distinct: checker.unique_state_count(),
        generated: checker.state_count(),
        max_depth: checker.max_depth(),
        done: checker.is_done(),
        discoveries: checker.discoveries(),
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// The shortest path to a state violating `invariant`, by breadth-first
/// searches of `model()` bounded at increasing depths (up to 64 actions).
pub fn shortest_counterexample<M>(
    model: impl Fn() -> M,
    invariant: &'static str,
) -> Option<Path<M::State, M::Action>>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Eq + Hash + Send + Sync + 'static,
    M::Action: Clone + Debug + Eq + Send + Sync + 'static,
{
    (2..=64).find_map(|depth| {
        model()
            .checker()
            .threads(1)
            .target_max_depth(depth)
            .finish_when(HasDiscoveries::AnyOf([invariant].into_iter().collect()))
            .spawn_bfs()
            .join()
            .discovery(invariant)
    })
}

/// A seeded bug's shortest counterexample ([`shortest_counterexample`]): found, printed,
/// ending in a state where `holds` is false, and of the length the twin records (`steps`,
/// which its `.cfg` states for TLC).
pub fn assert_shortest_counterexample<M>(
    name: &str,
    model: impl Fn() -> M,
    invariant: &'static str,
    holds: impl Fn(&M::State) -> bool,
    steps: usize,
) where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Eq + Hash + Send + Sync + 'static,
    M::Action: Clone + Debug + Eq + Send + Sync + 'static,
{
    let path = shortest_counterexample(model, invariant)
        .unwrap_or_else(|| panic!("{name}: no counterexample within 64 steps"));
    println!(
        "{name} violates {invariant}; shortest counterexample:\n{}",
        render(&path)
    );
    assert!(
        !holds(path.last_state()),
        "{name}: {invariant} holds at the end"
    );
    assert_eq!(
        path.into_actions().len(),
        steps,
        "{name}: the shortest counterexample changed length"
    );
}

/// A path as a numbered list of its actions (TLA+ action instances).
pub fn render<S: Clone, A: Clone + Debug>(path: &Path<S, A>) -> String {
    path.clone()
        .into_actions()
        .iter()
        .enumerate()
        .map(|(i, a)| format!("  {:>2}. {a:?}\n", i + 1))
        .collect()
}

/// The text of `correctness/storage/<name>`.
pub fn storage_file(name: &str) -> String {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "storage", name]
        .iter()
        .collect();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The definitions of a TLA+ module (`Name ==` or `Name(args) ==` at the start
/// of a line).
pub fn tla_definitions(tla: &str) -> BTreeSet<String> {
    tla.lines()
        .filter(|line| line.contains("=="))
        .filter_map(|line| {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// The comment text of a `.cfg` file (every `\*` line, joined by spaces): where
/// a configuration states the numbers `correctness/tlc.py` holds TLC to.
pub fn cfg_comments(cfg: &str) -> String {
    cfg.lines()
        .filter_map(|line| line.trim().strip_prefix("\\*"))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether some action of `model` is enabled in `s` (with the stuttering
/// `Quiescent`, the twins' deadlock check).
pub fn can_step<M: Model>(model: &M, s: &M::State) -> bool {
    let mut actions = Vec::new();
    model.actions(s, &mut actions);
    actions
        .into_iter()
        .any(|action| model.next_state(s, action).is_some())
}

/// Assert that `correctness/storage/<module>.tla` is that module, defines every
/// name in `names` and lists every variant in `variants` (as a string).
pub fn assert_tla_names<'a>(
    module: &str,
    names: impl IntoIterator<Item = &'a str>,
    variants: impl IntoIterator<Item = &'a str>,
) {
    let tla = storage_file(&format!("{module}.tla"));
    let defined = tla_definitions(&tla);
    for name in names {
        assert!(
            defined.contains(name),
            "{module}.tla does not define {name}"
        );
    }
    for variant in variants {
        assert!(
            tla.contains(&format!("\"{variant}\"")),
            "{module}.tla does not list variant {variant}"
        );
    }
    assert!(tla.contains(&format!("MODULE {module}")));
}

/// What a configuration's comments must state (what `correctness/tlc.py` holds TLC to).
pub enum Expect<'a> {
    /// A positive configuration: no invariant violated, this many distinct states.
    Positive { distinct: usize },
    /// A negative one: this invariant violated, in a shortest counterexample of this many steps.
    Negative { invariant: &'a str, steps: usize },
}

/// Assert that `cfg` (the text of `file`) checks `TypeOK` and `invariants` under
/// `SPECIFICATION Spec`, and that its comments state `expect`, so that TLC is held to the
/// twin's numbers.
pub fn assert_cfg_states(file: &str, cfg: &str, invariants: &[&str], expect: &Expect<'_>) {
    let has = |needle: &str| cfg.lines().any(|line| line.trim() == needle);
    assert!(has("SPECIFICATION Spec"), "{file}: SPECIFICATION");
    for name in invariants.iter().chain(&["TypeOK"]) {
        assert!(has(name), "{file}: does not check {name}");
    }
    let (line, claim) = match expect {
        Expect::Positive { distinct } => (
            "\\* Expected: no invariant is violated.".to_string(),
            format!("finds {distinct} distinct states"),
        ),
        Expect::Negative { invariant, steps } => (
            format!("\\* Expected to violate: {invariant}"),
            format!("Shortest counterexample ({steps} steps)"),
        ),
    };
    assert!(has(&line), "{file}: missing `{line}`");
    assert!(
        cfg_comments(cfg).contains(&claim),
        "{file}: its comments must say `{claim}` (correctness/tlc.py checks TLC against it)"
    );
}

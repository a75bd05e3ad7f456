//! CEL rules of an external callback: how `resolve_callback` turns a payload into an outcome.
//!
//! A handler registers up to four [CEL](https://cel.dev) expressions with its callback, each
//! seeing one variable, `payload` (the JSON the external system sends, `null` when none):
//! `filter` (bool: false ignores the payload), `on_fail` (bool, evaluated before
//! `on_complete`: true fails the job), `on_complete` (bool: true completes it) and
//! `transform` (any value: what completion returns instead of the raw payload). When none
//! matches, or none is registered, the resolver's [`DefaultAction`] decides. This is
//! awa-pg 0.6.9's contract, including its fail-open rule: an expression that errors when
//! evaluated (a missing key, a type mismatch) counts as "no match", except `filter`, whose
//! error lets the payload through, so a payload of an unexpected shape is never silently
//! dropped. Every expression is compiled at registration, so syntax errors and unknown
//! variables surface there as `awa.ValidationError`, not at resolve time.
//!
//! Pure: no database access; `storage::callbacks` stores the rules with the callback id and
//! applies the decision.

use crate::error::AwaError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The one variable an expression may reference.
pub const PAYLOAD_VARIABLE: &str = "payload";

/// The expressions registered with one callback (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackRules {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_complete: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_fail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<String>,
}

impl CallbackRules {
    /// True when no expression is registered (resolution is the default action alone).
    pub fn is_empty(&self) -> bool {
        self.named().iter().all(|(_, e)| e.is_none())
    }

    fn named(&self) -> [(&'static str, Option<&str>); 4] {
        [
            ("filter", self.filter.as_deref()),
            ("on_complete", self.on_complete.as_deref()),
            ("on_fail", self.on_fail.as_deref()),
            ("transform", self.transform.as_deref()),
        ]
    }

    /// Compile every expression and check it references no variable but `payload`.
    pub fn validate(&self) -> Result<(), AwaError> {
        for (name, source) in self.named() {
            if let Some(source) = source {
                compile(name, source)?;
            }
        }
        Ok(())
    }
}

/// Limit on one expression's source, so a stored rule stays small.
pub const MAX_EXPRESSION_BYTES: usize = 4096;

fn compile(name: &str, source: &str) -> Result<cel::Program, AwaError> {
    if source.len() > MAX_EXPRESSION_BYTES {
        return Err(AwaError::Config(format!(
            "the CEL expression for {name} is {} bytes; the limit is {MAX_EXPRESSION_BYTES}",
            source.len()
        )));
    }
    if source.contains('\0') {
        return Err(AwaError::Config(format!(
            "the CEL expression for {name} contains a NUL byte"
        )));
    }
    let program = cel::Program::compile(source)
        .map_err(|e| AwaError::Config(format!("invalid CEL expression for {name}: {e}")))?;
    let references = program.references();
    let mut bound = Vec::new();
    bound_names(program.expression(), &mut bound);
    let unknown: Vec<&str> = references
        .variables()
        .into_iter()
        .filter(|v| *v != PAYLOAD_VARIABLE && !bound.contains(v))
        .collect();
    if !unknown.is_empty() {
        return Err(AwaError::Config(format!(
            "the CEL expression for {name} references {}; only `{PAYLOAD_VARIABLE}` is available",
            unknown.join(", ")
        )));
    }
    Ok(program)
}

/// The names macros bind (`exists(x, ...)`'s `x` and the accumulator): references to them
/// are not free variables. Collected over the whole expression, so a name bound anywhere is
/// accepted everywhere; a stray use outside its macro then errors at evaluation (no match).
fn bound_names<'a>(e: &'a cel::IdedExpr, out: &mut Vec<&'a str>) {
    use cel::common::ast::{EntryExpr, Expr};
    let entry = |x: &'a cel::common::ast::IdedEntryExpr, out: &mut Vec<&'a str>| match &x.expr {
        EntryExpr::StructField(f) => bound_names(&f.value, out),
        EntryExpr::MapEntry(m) => {
            bound_names(&m.key, out);
            bound_names(&m.value, out);
        }
    };
    match &e.expr {
        Expr::Comprehension(c) => {
            out.push(&c.iter_var);
            if let Some(v) = &c.iter_var2 {
                out.push(v);
            }
            out.push(&c.accu_var);
            for sub in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                bound_names(sub, out);
            }
        }
        Expr::Call(call) => {
            if let Some(t) = &call.target {
                bound_names(t, out);
            }
            for a in &call.args {
                bound_names(a, out);
            }
        }
        Expr::List(l) => l.elements.iter().for_each(|x| bound_names(x, out)),
        Expr::Map(m) => m.entries.iter().for_each(|x| entry(x, out)),
        Expr::Struct(st) => st.entries.iter().for_each(|x| entry(x, out)),
        Expr::Select(sel) => bound_names(&sel.operand, out),
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => {}
    }
}

/// What to do when no expression decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultAction {
    Complete,
    Fail,
    Ignore,
}

impl std::str::FromStr for DefaultAction {
    type Err = AwaError;

    fn from_str(s: &str) -> Result<Self, AwaError> {
        match s {
            "complete" => Ok(DefaultAction::Complete),
            "fail" => Ok(DefaultAction::Fail),
            "ignore" => Ok(DefaultAction::Ignore),
            other => Err(AwaError::Config(format!(
                "default_action must be 'complete', 'fail' or 'ignore', got {other:?}"
            ))),
        }
    }
}

/// The outcome the rules chose for one payload.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Complete the job; the payload to record and return (transformed when a transform ran).
    Complete(Option<Value>),
    /// Fail the job with this error text.
    Fail(String),
    /// Leave the job waiting; why.
    Ignore(String),
}

/// Decide what `payload` means under `rules` (None: no rules registered).
pub fn decide(
    rules: Option<&CallbackRules>,
    payload: Option<&Value>,
    default: DefaultAction,
) -> Decision {
    let Some(rules) = rules.filter(|r| !r.is_empty()) else {
        return default_decision(default, payload, "no expressions are registered");
    };
    let value = payload.cloned().unwrap_or(Value::Null);
    if let Some(filter) = &rules.filter {
        // Fail-open: an error lets the payload through.
        if let Ok(false) = eval_bool("filter", filter, &value) {
            return Decision::Ignore("the filter expression returned false".into());
        }
    }
    if let Some(on_fail) = &rules.on_fail {
        if let Ok(true) = eval_bool("on_fail", on_fail, &value) {
            return Decision::Fail(format!(
                "callback failed: the on_fail expression matched ({on_fail})"
            ));
        }
    }
    if let Some(on_complete) = &rules.on_complete {
        if let Ok(true) = eval_bool("on_complete", on_complete, &value) {
            return Decision::Complete(Some(transformed(rules, &value)));
        }
    }
    default_decision(default, payload, "no expression matched")
}

fn default_decision(default: DefaultAction, payload: Option<&Value>, why: &str) -> Decision {
    match default {
        DefaultAction::Complete => Decision::Complete(payload.cloned()),
        DefaultAction::Fail => Decision::Fail(format!(
            "callback failed: {why} and the default action is fail"
        )),
        DefaultAction::Ignore => {
            Decision::Ignore(format!("{why} and the default action is ignore"))
        }
    }
}

/// The payload after `transform`; the payload itself when there is none or it errors.
fn transformed(rules: &CallbackRules, value: &Value) -> Value {
    let Some(transform) = &rules.transform else {
        return value.clone();
    };
    match evaluate("transform", transform, value).and_then(|v| {
        v.json()
            .map_err(|e| format!("the transform result is not JSON: {e:?}"))
    }) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "callback transform failed; completing with the payload as sent");
            value.clone()
        }
    }
}

/// JSON as CEL sees it. Integers are CEL `int` (serde would make positive ones `uint`, and
/// CEL has no arithmetic across the two, so `payload.n * 2` would fail); only integers past
/// `i64::MAX` are `uint`, other numbers `double`.
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::from(s.as_str()),
        Value::Array(items) => cel::Value::from(items.iter().map(to_cel).collect::<Vec<_>>()),
        Value::Object(map) => cel::Value::from(
            map.iter()
                .map(|(k, v)| (k.clone(), to_cel(v)))
                .collect::<std::collections::HashMap<String, cel::Value>>(),
        ),
    }
}

fn eval_bool(name: &str, source: &str, payload: &Value) -> Result<bool, String> {
    match evaluate(name, source, payload)? {
        cel::Value::Bool(b) => Ok(b),
        other => {
            let message = format!("the {name} expression returned {other:?}, not a bool");
            tracing::warn!(error = %message, "callback expression ignored");
            Err(message)
        }
    }
}

fn evaluate(name: &str, source: &str, payload: &Value) -> Result<cel::Value, String> {
    let program = compile(name, source).map_err(|e| e.to_string())?;
    let mut context = cel::Context::default();
    context.add_variable_from_value(PAYLOAD_VARIABLE, to_cel(payload));
    program.execute(&context).map_err(|e| {
        let message = format!("the {name} expression failed: {e}");
        tracing::warn!(error = %message, "callback expression counts as not matching");
        message
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(
        filter: Option<&str>,
        on_complete: Option<&str>,
        on_fail: Option<&str>,
        transform: Option<&str>,
    ) -> CallbackRules {
        CallbackRules {
            filter: filter.map(String::from),
            on_complete: on_complete.map(String::from),
            on_fail: on_fail.map(String::from),
            transform: transform.map(String::from),
        }
    }

    #[test]
    fn the_probe_rules_complete_fail_and_ignore() {
        let r = rules(
            Some(r#"payload.status != """#),
            Some(r#"payload.status == "ok""#),
            Some(r#"payload.status == "bad""#),
            None,
        );
        assert!(r.validate().is_ok());
        let ok = json!({"status": "ok"});
        assert_eq!(
            decide(Some(&r), Some(&ok), DefaultAction::Ignore),
            Decision::Complete(Some(ok.clone()))
        );
        assert!(matches!(
            decide(
                Some(&r),
                Some(&json!({"status": "bad"})),
                DefaultAction::Ignore
            ),
            Decision::Fail(_)
        ));
        assert!(matches!(
            decide(
                Some(&r),
                Some(&json!({"status": "pending"})),
                DefaultAction::Ignore
            ),
            Decision::Ignore(_)
        ));
        assert!(matches!(
            decide(
                Some(&r),
                Some(&json!({"status": ""})),
                DefaultAction::Complete
            ),
            Decision::Ignore(_)
        ));
        assert_eq!(
            decide(
                Some(&r),
                Some(&json!({"status": "pending"})),
                DefaultAction::Complete
            ),
            Decision::Complete(Some(json!({"status": "pending"})))
        );
    }

    #[test]
    fn on_fail_wins_over_on_complete_and_transform_reshapes() {
        let r = rules(
            None,
            Some("payload.n > 0"),
            Some("payload.n > 10"),
            Some(r#"{"doubled": payload.n * 2}"#),
        );
        assert!(matches!(
            decide(Some(&r), Some(&json!({"n": 11})), DefaultAction::Ignore),
            Decision::Fail(_)
        ));
        assert_eq!(
            decide(Some(&r), Some(&json!({"n": 3})), DefaultAction::Ignore),
            Decision::Complete(Some(json!({"doubled": 6})))
        );
    }

    #[test]
    fn runtime_errors_fail_open() {
        // A missing key: the filter lets it through, on_complete does not match, the default decides.
        let r = rules(
            Some("payload.missing == 1"),
            Some("payload.other == 2"),
            None,
            None,
        );
        assert!(matches!(
            decide(Some(&r), Some(&json!({})), DefaultAction::Ignore),
            Decision::Ignore(_)
        ));
        assert_eq!(
            decide(Some(&r), None, DefaultAction::Complete),
            Decision::Complete(None)
        );
        // A non-bool result is no match either.
        let r = rules(None, Some("payload.n"), None, None);
        assert!(matches!(
            decide(Some(&r), Some(&json!({"n": 1})), DefaultAction::Fail),
            Decision::Fail(_)
        ));
        // A failing transform completes with the payload as sent.
        let r = rules(None, Some("true"), None, Some("payload.nope.deeper"));
        assert_eq!(
            decide(Some(&r), Some(&json!({"a": 1})), DefaultAction::Ignore),
            Decision::Complete(Some(json!({"a": 1})))
        );
    }

    #[test]
    fn no_rules_take_the_default() {
        let p = json!({"x": 1});
        assert_eq!(
            decide(None, Some(&p), DefaultAction::Complete),
            Decision::Complete(Some(p.clone()))
        );
        assert!(matches!(
            decide(None, Some(&p), DefaultAction::Fail),
            Decision::Fail(_)
        ));
        assert!(matches!(
            decide(
                Some(&CallbackRules::default()),
                Some(&p),
                DefaultAction::Ignore
            ),
            Decision::Ignore(_)
        ));
    }

    #[test]
    fn bad_expressions_are_refused_at_registration() {
        for (r, needle) in [
            (
                rules(Some("payload.status =="), None, None, None),
                "invalid CEL expression for filter",
            ),
            (
                rules(None, Some("other == 1"), None, None),
                "references other",
            ),
            (
                rules(None, None, None, Some(&"1 + ".repeat(2000))),
                "the limit is 4096",
            ),
            (rules(None, None, Some("a\0"), None), "NUL byte"),
        ] {
            let e = r.validate().expect_err("refused").to_string();
            assert!(e.contains(needle), "{e}");
        }
        // Comprehension variables are not free variables.
        let r = rules(None, Some("payload.items.exists(x, x == 1)"), None, None);
        assert!(r.validate().is_ok(), "{:?}", r.validate());
        assert_eq!(
            decide(
                Some(&r),
                Some(&json!({"items": [3, 1]})),
                DefaultAction::Ignore
            ),
            Decision::Complete(Some(json!({"items": [3, 1]})))
        );
        assert!("nope".parse::<DefaultAction>().is_err());
        assert_eq!(
            "fail".parse::<DefaultAction>().ok(),
            Some(DefaultAction::Fail)
        );
    }
}

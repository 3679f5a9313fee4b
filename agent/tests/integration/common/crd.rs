//! A CustomResourceDefinition's schema enforced on a create as the API server enforces it
//! (k8s.io/apiextensions-apiserver `pkg/apiserver/schema` and `.../cel`): types, required fields,
//! enums, lengths and item counts of the structural schema; unknown fields refused, as kubectl's
//! default `--validate=strict` has the server do; and every `x-kubernetes-validations` rule with
//! `self` bound to the value where the rule sits. Transition rules (those naming `oldSelf`) run only
//! on updates, so a create skips them, as the API server does.

use std::sync::Arc;

use cel_interpreter::extractors::This;
use cel_interpreter::{Context, Program, Value as Cel};
use serde_json::Value;

/// The schema of `version` in `crd`.
pub fn schema<'a>(crd: &'a Value, version: &str) -> &'a Value {
    crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == version)
        .unwrap_or_else(|| panic!("the CRD serves no version {version}"))
        .pointer("/schema/openAPIV3Schema")
        .unwrap()
}

/// Every way `object` fails `schema` on a create, each with its field path.
pub fn violations(schema: &Value, object: &Value) -> Vec<String> {
    let mut found = Vec::new();
    check(schema, object, "", &mut found);
    found
}

fn check(schema: &Value, value: &Value, path: &str, found: &mut Vec<String>) {
    let mut fail = |why: String| {
        found.push(format!(
            "{}: {why}",
            if path.is_empty() { "<root>" } else { path }
        ))
    };
    let type_ok = match schema["type"].as_str() {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("boolean") => value.is_boolean(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        _ => true,
    };
    if !type_ok {
        return fail(format!("must be of type {}", schema["type"]));
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(value) {
            fail(format!("{value} is not one of {}", schema["enum"]));
        }
    }
    let bound = |key: &str| schema[key].as_u64().map(|n| n as usize);
    let length = value
        .as_str()
        .map(|s| s.chars().count())
        .or(value.as_array().map(Vec::len));
    if let Some(length) = length {
        for (key, too) in [
            ("minLength", true),
            ("minItems", true),
            ("maxLength", false),
            ("maxItems", false),
        ] {
            if let Some(limit) = bound(key) {
                if (too && length < limit) || (!too && length > limit) {
                    fail(format!("{key} is {limit}, it has {length}"));
                }
            }
        }
    }
    if let (Some(pattern), Some(text)) = (schema["pattern"].as_str(), value.as_str()) {
        if eval(
            &format!("self.matches({})", Value::from(pattern)),
            &Value::from(text),
        ) != Cel::Bool(true)
        {
            fail(format!("does not match {pattern}"));
        }
    }
    if let Some(object) = value.as_object() {
        for required in schema["required"].as_array().into_iter().flatten() {
            if !object.contains_key(required.as_str().unwrap()) {
                fail(format!("{required} is required"));
            }
        }
        let properties = schema["properties"].as_object();
        for (key, field) in object {
            let at = format!("{path}.{key}");
            match (
                properties.and_then(|p| p.get(key)),
                schema.get("additionalProperties"),
            ) {
                (Some(sub), _) => check(sub, field, &at, found),
                (None, Some(sub)) if sub.is_object() => check(sub, field, &at, found),
                // metadata is the API server's ObjectMeta, validated apart from the CRD's schema.
                (None, _) if properties.is_none() || path.is_empty() && key == "metadata" => {}
                (None, _) => found.push(format!("{at}: unknown field")),
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array()) {
        for (i, item) in list.iter().enumerate() {
            check(items, item, &format!("{path}[{i}]"), found);
        }
    }
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let expression = rule["rule"].as_str().unwrap();
        if expression.contains("oldSelf") {
            continue;
        }
        if eval(expression, value) != Cel::Bool(true) {
            let message = rule["message"].as_str().unwrap_or(expression);
            found.push(format!(
                "{}: {message}",
                if path.is_empty() { "<root>" } else { path }
            ));
        }
    }
}

/// A rule over `self`, with the CEL libraries Kubernetes adds that cel-interpreter lacks:
/// `split` from the strings extension (cel-go `ext/strings.go`).
fn eval(expression: &str, value: &Value) -> Cel {
    let mut ctx = Context::default();
    ctx.add_variable("self", cel_interpreter::to_value(value).unwrap())
        .unwrap();
    ctx.add_function(
        "split",
        |This(this): This<Arc<String>>, separator: Arc<String>| -> cel_interpreter::ResolveResult {
            let parts: Vec<Cel> = this
                .split(separator.as_str())
                .map(|part| Cel::String(Arc::new(part.to_string())))
                .collect();
            Ok(parts.into())
        },
    );
    Program::compile(expression)
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
        .execute(&ctx)
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
}

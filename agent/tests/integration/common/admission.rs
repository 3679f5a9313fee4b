//! A ValidatingAdmissionPolicy evaluated as the API server evaluates it: matchConditions, then
//! variables in order, then validations, with a CEL engine over the admission request, `object`
//! and `oldObject` (k8s.io/apiserver `pkg/admission/plugin/policy/validating`).

use cel_interpreter::{Context, Program, Value as Cel};
use serde_json::Value;

/// Ok: admitted (or not this policy's business); Err: the failing validation's message.
pub fn admit(policy: &Value, request: Value, old: &Value, new: &Value) -> Result<(), String> {
    let spec = &policy["spec"];
    let mut ctx = Context::default();
    ctx.add_variable("request", cel_interpreter::to_value(&request).unwrap())
        .unwrap();
    ctx.add_variable("object", cel_interpreter::to_value(new).unwrap())
        .unwrap();
    ctx.add_variable("oldObject", cel_interpreter::to_value(old).unwrap())
        .unwrap();
    let eval = |ctx: &Context, expression: &str| -> Cel {
        Program::compile(expression)
            .unwrap_or_else(|e| panic!("{expression}: {e}"))
            .execute(ctx)
            .unwrap_or_else(|e| panic!("{expression}: {e}"))
    };
    for condition in spec["matchConditions"].as_array().into_iter().flatten() {
        if eval(&ctx, condition["expression"].as_str().unwrap()) != Cel::Bool(true) {
            return Ok(());
        }
    }
    let mut variables = std::collections::HashMap::new();
    for variable in spec["variables"].as_array().into_iter().flatten() {
        let mut scope = Context::default();
        for name in ["request", "object", "oldObject"] {
            scope.add_variable_from_value(name, ctx.get_variable(name).unwrap());
        }
        scope.add_variable_from_value("variables", variables.clone());
        let value = eval(&scope, variable["expression"].as_str().unwrap());
        variables.insert(variable["name"].as_str().unwrap().to_string(), value);
    }
    ctx.add_variable_from_value("variables", variables);
    for validation in spec["validations"].as_array().into_iter().flatten() {
        if eval(&ctx, validation["expression"].as_str().unwrap()) != Cel::Bool(true) {
            return Err(validation["message"].as_str().unwrap().to_string());
        }
    }
    Ok(())
}

/// Whether the policy's matchConstraints select a request (only the resourceRules form the
/// policies here use).
pub fn matches(policy: &Value, operation: &str, resource: &str) -> bool {
    policy["spec"]["matchConstraints"]["resourceRules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| {
            let has = |field: &str, value: &str| {
                rule[field]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|v| v == value || v == "*"))
            };
            has("operations", operation) && has("resources", resource)
        })
}

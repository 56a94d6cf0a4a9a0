//! The schema of Kubernetes quantities in our CRDs (`resource.Quantity`), as controller-gen
//! writes it: used by every CRD that holds quantities (a queue's quotas, a pool's status, a
//! local job's resources).

use serde_json::{Value, json};

/// Kubernetes' quantity grammar, as controller-gen writes it into CRDs for `resource.Quantity`.
pub const QUANTITY_PATTERN: &str = "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$";

/// Gives every int-or-string schema under `schema` the shape controller-gen writes for a
/// `resource.Quantity`: an integer or a string of [`QUANTITY_PATTERN`] (so the API refuses what
/// is not a quantity), without k8s-openapi's long description of the format (so the CRD stays
/// small). For schemas whose int-or-strings are all quantities (the queue's and the pool's).
pub fn compact_quantities(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
                if map
                    .get("description")
                    .and_then(Value::as_str)
                    .is_some_and(|d| d.starts_with("Quantity is a fixed-point"))
                {
                    map.remove("description");
                }
                map.insert(
                    "anyOf".into(),
                    json!([{"type": "integer"}, {"type": "string"}]),
                );
                map.insert("pattern".into(), json!(QUANTITY_PATTERN));
                // Quantities are short; a bound keeps the cost of CEL rules over them low.
                map.insert("maxLength".into(), json!(64));
                return;
            }
            for v in map.values_mut() {
                compact_quantities(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(compact_quantities),
        _ => {}
    }
}

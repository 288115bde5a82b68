//! Numbers as the JSON a JavaScript program writes them: which ones are counts.

use serde_json::Value;

/// Largest integer a JavaScript number holds exactly.
pub const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// Whether `v` is a non-negative safe integer.
pub fn is_count(v: &Value) -> bool {
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(u) => u as f64 <= MAX_SAFE_INTEGER,
            None => n
                .as_f64()
                .is_some_and(|f| f >= 0.0 && f.fract() == 0.0 && f <= MAX_SAFE_INTEGER),
        },
        _ => false,
    }
}

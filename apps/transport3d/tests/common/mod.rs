//! Helpers shared by the `transport3d` command-line tests.

use serde_json::Value;

/// Every sampled concentration of a run's `--json` summary, in order.
pub(crate) fn samples(j: &Value) -> Vec<f64> {
    j["result"]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("no samples: {j}"))
        .iter()
        .flat_map(|s| {
            s["c"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

//! The scenario's `dcgm:` section: the baselines of the DCGM-only signals and the simulated exporter's
//! settings. A child of `scenario` so that the exporter (`crate::dcgm`) reads a validated spec without the
//! scenario parser depending back on it.

use serde::Deserialize;

use super::ScenarioError;

/// The scenario's `dcgm:` section as written (every key optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDcgm {
    #[serde(default)]
    ecc_dbe_per_gpu_hour: Option<f64>,
    #[serde(default)]
    nvlink_crc_per_gpu_hour: Option<f64>,
    #[serde(default)]
    remapped_rows_per_gpu_hour: Option<f64>,
    #[serde(default)]
    row_remap_spares: Option<u64>,
    #[serde(default)]
    xid_count_window: Option<String>,
    #[serde(default)]
    model_name: Option<String>,
}

/// Validated `dcgm:` section: baselines of the DCGM-only signals and the exporter's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DcgmSpec {
    /// Volatile double-bit ECC errors per GPU-hour.
    pub ecc_dbe_per_gpu_hour: f64,
    /// NVLink flow-control CRC errors per GPU-hour.
    pub nvlink_crc_per_gpu_hour: f64,
    /// Rows remapped for uncorrectable errors per GPU-hour.
    pub remapped_rows_per_gpu_hour: f64,
    /// Remapped rows a GPU absorbs before `DCGM_FI_DEV_ROW_REMAP_FAILURE` turns 1.
    pub row_remap_spares: u64,
    /// The exporter's `--xid-count-window-size`.
    pub xid_count_window: std::time::Duration,
    /// `modelName` label.
    pub model_name: String,
}

impl DcgmSpec {
    pub(crate) fn from_raw(raw: &RawDcgm) -> Result<Self, ScenarioError> {
        let rate = |path: &str, v: Option<f64>, default: f64| -> Result<f64, ScenarioError> {
            let v = v.unwrap_or(default);
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(ScenarioError::Invalid {
                    path: format!("dcgm.{path}"),
                    reason: format!("must be a non-negative number, got {v}"),
                })
            }
        };
        let window = match &raw.xid_count_window {
            None => std::time::Duration::from_secs(300),
            Some(w) => super::parse_duration(w).map_err(|reason| ScenarioError::Invalid {
                path: "dcgm.xid_count_window".into(),
                reason: reason.to_string(),
            })?,
        };
        if window.is_zero() {
            return Err(ScenarioError::Invalid {
                path: "dcgm.xid_count_window".into(),
                reason: "must be longer than zero".into(),
            });
        }
        Ok(Self {
            ecc_dbe_per_gpu_hour: rate("ecc_dbe_per_gpu_hour", raw.ecc_dbe_per_gpu_hour, 0.0)?,
            nvlink_crc_per_gpu_hour: rate("nvlink_crc_per_gpu_hour", raw.nvlink_crc_per_gpu_hour, 0.0)?,
            remapped_rows_per_gpu_hour: rate("remapped_rows_per_gpu_hour", raw.remapped_rows_per_gpu_hour, 0.0)?,
            row_remap_spares: raw.row_remap_spares.unwrap_or(8).max(1),
            xid_count_window: window,
            model_name: raw
                .model_name
                .clone()
                .unwrap_or_else(|| "NVIDIA H100 80GB HBM3".to_owned()),
        })
    }
}

impl Default for DcgmSpec {
    fn default() -> Self {
        Self::from_raw(&RawDcgm::default()).unwrap_or(Self {
            ecc_dbe_per_gpu_hour: 0.0,
            nvlink_crc_per_gpu_hour: 0.0,
            remapped_rows_per_gpu_hour: 0.0,
            row_remap_spares: 8,
            xid_count_window: std::time::Duration::from_secs(300),
            model_name: "NVIDIA H100 80GB HBM3".to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_defaults_and_validation() {
        let d = DcgmSpec::default();
        assert_eq!(d.xid_count_window, std::time::Duration::from_secs(300));
        assert_eq!(d.row_remap_spares, 8);
        let bad = RawDcgm {
            ecc_dbe_per_gpu_hour: Some(-1.0),
            ..RawDcgm::default()
        };
        assert!(DcgmSpec::from_raw(&bad).is_err());
    }
}

//! A synthetic GPU's day of observations, as the collector would hand them
//! over, for `waveguard bench --only rma`. Here rather than in the command so
//! the workload is defined beside the rules it exercises; it is pure (the
//! caller seeds the generator).

use chrono::{DateTime, TimeDelta, Utc};
use rand::Rng;

use crate::{HealthFlag, Observation, ObservationKind};

/// One GPU's day from `start`: a DCGM scrape every 30 minutes (series present
/// or not), a row-remap flag reading every 3 hours, scattered XID 79s. 0.5% of
/// GPUs fail: three XID 79s within hours and a failed field diagnostic, a set
/// row-remap flag and a failed diagnostic, or a vanished series.
pub fn day_of_observations(rng: &mut impl Rng, start: DateTime<Utc>, serial: &str) -> Vec<Observation> {
    let mut out = Vec::with_capacity(64);
    let failing = rng.random::<f64>() < 0.005;
    let mode = rng.random_range(0..3);
    let vanish_from = if failing && mode == 2 { 20 } else { usize::MAX };
    for i in 0..48 {
        out.push(Observation {
            at: start + TimeDelta::minutes(30 * i as i64),
            source_id: format!("dcgm/{serial}/{i}"),
            kind: ObservationKind::SeriesScrape {
                present: i < vanish_from,
            },
        });
    }
    for i in 0..8 {
        out.push(Observation {
            at: start + TimeDelta::hours(3 * i),
            source_id: format!("dcgm/{serial}/remap/{i}"),
            kind: ObservationKind::Flag {
                flag: HealthFlag::RowRemapFailure,
                set: failing && mode == 1 && i >= 4,
            },
        });
    }
    let xids = if failing && mode == 0 {
        3
    } else {
        usize::from(rng.random::<f64>() < 0.02)
    };
    for i in 0..xids {
        out.push(Observation {
            at: start + TimeDelta::hours(10) + TimeDelta::minutes(40 * i as i64),
            source_id: format!("sel/{serial}/{i}"),
            kind: ObservationKind::Xid { code: 79 },
        });
    }
    if failing {
        out.push(Observation {
            at: start + TimeDelta::hours(20),
            source_id: format!("upload/{serial}.log"),
            kind: ObservationKind::FieldDiagnostic { passed: false },
        });
    }
    out
}

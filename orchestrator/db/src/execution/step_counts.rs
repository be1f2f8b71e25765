//! Counts of a rollout's steps for the pages and the API: a rollout of
//! 100,000 nodes has 100,000 steps, so counts are one grouped query, kept
//! until a step changes, never a read of every step. (The node table's page
//! of steps with names is `Db::step_page`.)

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use orchestrator_types::{RolloutId, WaveId};
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QuerySelect};

use super::step::filtered;
use super::{StepCounts, StepFilter, parse};
use crate::cache::Mark;
use crate::entity::update_steps;
use crate::{Db, DbError};

impl Db {
    /// How many steps match the filter: from the rollout's counts per wave
    /// when the filter is by rollout, wave and state only, else counted by
    /// the database.
    pub async fn count_steps(&self, filter: &StepFilter) -> Result<u64, DbError> {
        if let (Some(rollout), None, None) = (filter.rollout_id, filter.node_id, filter.purpose) {
            let by_wave = self.step_counts_by_wave(rollout).await?;
            return Ok(by_wave
                .iter()
                .filter(|(wave, _)| filter.wave_id.is_none_or(|w| w == **wave))
                .flat_map(|(_, counts)| counts.iter())
                .filter(|(state, _)| filter.state.is_none_or(|s| s == **state))
                .map(|(_, n)| n)
                .sum());
        }
        Ok(filtered(filter).count(&self.reader).await?)
    }

    /// Step counts by state of every wave of a rollout, in one grouped
    /// query (a page showing each wave's progress would otherwise count the
    /// rollout's steps once per wave), kept until a step of the rollout
    /// changes (`cache`): counting a 100,000-step rollout reads 100,000
    /// index entries, and its pages ask on every request.
    pub async fn step_counts_by_wave(&self, rollout: RolloutId) -> Result<BTreeMap<WaveId, StepCounts>, DbError> {
        let cache = &self.caches.step_counts;
        let generation = cache.generation();
        let last_update: Option<Option<DateTime<Utc>>> = update_steps::Entity::find()
            .select_only()
            .column_as(update_steps::Column::UpdatedAt.max(), "m")
            .filter(update_steps::Column::RolloutId.eq(rollout.0))
            .into_tuple()
            .one(&self.reader)
            .await?;
        let mark = Mark {
            generation,
            stamps: [last_update.flatten(), None],
            max_id: None,
        };
        cache
            .get_or_read(rollout, mark, || self.read_step_counts_by_wave(rollout))
            .await
    }

    /// Says steps were written, so counts kept by [`Db::step_counts_by_wave`]
    /// are read again. Every writer of steps calls it after committing.
    pub(crate) fn steps_changed(&self) {
        self.caches.step_counts.changed();
        self.caches.finished_by_day.changed();
    }

    async fn read_step_counts_by_wave(&self, rollout: RolloutId) -> Result<BTreeMap<WaveId, StepCounts>, DbError> {
        let rows: Vec<(i64, String, i64)> = update_steps::Entity::find()
            .select_only()
            .column(update_steps::Column::WaveId)
            .column(update_steps::Column::State)
            .column_as(update_steps::Column::Id.count(), "n")
            .filter(update_steps::Column::RolloutId.eq(rollout.0))
            .group_by(update_steps::Column::WaveId)
            .group_by(update_steps::Column::State)
            .into_tuple()
            .all(&self.reader)
            .await?;
        let mut out: BTreeMap<WaveId, StepCounts> = BTreeMap::new();
        for (wave, state, n) in rows {
            out.entry(WaveId(wave))
                .or_default()
                .insert(parse("step state", &state)?, u64::try_from(n).unwrap_or(0));
        }
        Ok(out)
    }
}

/// The rollout's counts are the sum of its waves'.
pub fn total_counts(by_wave: &BTreeMap<WaveId, StepCounts>) -> StepCounts {
    let mut total = StepCounts::new();
    for counts in by_wave.values() {
        for (state, n) in counts {
            *total.entry(*state).or_default() += n;
        }
    }
    total
}
